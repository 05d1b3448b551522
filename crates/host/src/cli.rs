//! `vtism host` and `vtism ctl`.

use clap::Args;

/// Options of `vtism host`.
#[derive(Args, Debug)]
pub struct HostArgs {
    /// Configuration file (TOML).
    #[arg(long, short, default_value = "/etc/vtism/vtismd.toml")]
    pub config: std::path::PathBuf,
    /// Validate the configuration and exit.
    #[arg(long)]
    pub check_config: bool,
}

/// Options of `vtism ctl`.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The daemon's control socket.
    #[arg(long, default_value = "/run/vtism/vtismd.sock")]
    pub socket: std::path::PathBuf,
}

pub fn host_main(_args: HostArgs) -> anyhow::Result<()> {
    anyhow::bail!("`vtism host` (the vtismd daemon) is not part of this build yet")
}

pub fn ctl_main(_args: CtlArgs) -> anyhow::Result<()> {
    anyhow::bail!("`vtism ctl` needs the vtismd daemon, which is not part of this build yet")
}
