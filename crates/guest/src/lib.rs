//! vtism guest agent: a DAMON-based hot-page tracker that publishes through the ivshmem channel,
//! for guests where loading the vtism_guest module is not allowed.

pub mod cli;
