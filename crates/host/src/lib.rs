//! vtismd, the host daemon (issue: vtismd).
