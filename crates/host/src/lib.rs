//! vtismd, the vtism host daemon: discovers VMs over QMP, reads their guests' hint channels,
//! runs the engine every round and moves pages between NUMA nodes.

pub mod cli;
