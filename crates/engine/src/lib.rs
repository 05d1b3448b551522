//! vtism tiering engine.
