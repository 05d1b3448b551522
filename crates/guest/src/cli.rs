//! `vtism guest`.

use clap::Args;

/// Options of `vtism guest`.
#[derive(Args, Debug)]
pub struct GuestArgs {
    /// The ivshmem device's BAR2 (`/sys/bus/pci/devices/<bdf>/resource2`); found automatically
    /// when omitted.
    #[arg(long)]
    pub channel: Option<std::path::PathBuf>,
}

pub fn guest_main(_args: GuestArgs) -> anyhow::Result<()> {
    anyhow::bail!("`vtism guest` (the DAMON agent) is not part of this build yet")
}
