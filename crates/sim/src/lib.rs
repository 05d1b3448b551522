//! vtism simulator: runs placement policies (vtism's engine and its peers') against memory and
//! workload models.

pub mod cli;
