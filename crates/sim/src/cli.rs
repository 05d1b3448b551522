//! `vtism sim`.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Run one policy on one workload.
    Run,
    /// Run every policy on one workload and compare.
    Compare,
}

pub fn sim_main(_cmd: SimCommand) -> anyhow::Result<()> {
    anyhow::bail!("`vtism sim` is not part of this build yet")
}
