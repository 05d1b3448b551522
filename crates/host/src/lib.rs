//! vtismd, the vtism host daemon: discovers VMs over QMP, reads their guests' hint channels,
//! runs the engine every round and moves pages between NUMA nodes.
//!
//! Pure logic (config, topology parsing, memory-map parsing, batching, rate limiting, status
//! handling) is kept apart from the system calls (`sys`) so it is tested without privileges.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod mover;
pub mod mtree;
pub mod qmp;
pub mod serve;
pub mod sys;
pub mod topology;
pub mod vm;
