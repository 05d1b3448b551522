//! vtism simulator (issue: vtism sim).
