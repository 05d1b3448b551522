//! `vtism package-assets`: the man pages and shell completions the Debian package ships,
//! generated from the clap definitions this binary parses, so they cannot drift from `--help`.

use clap::Parser;
use clap_complete::Shell;
use std::path::PathBuf;

/// Write vtism's man pages and shell completions (what `make deb` packages).
#[derive(Parser, Debug)]
#[command(name = "vtism package-assets")]
pub struct AssetsArgs {
    /// Directory that gets man/ (vtism.1 and one page per subcommand) and completions/ (bash,
    /// zsh, fish).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(cmd: clap::Command, a: AssetsArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let man = a.out.join("man");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    clap_mangen::generate_to(cmd.clone(), &man)
        .with_context(|| format!("writing man pages to {}", man.display()))?;
    let completions = a.out.join("completions");
    std::fs::create_dir_all(&completions)
        .with_context(|| format!("creating {}", completions.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        let name = cmd.get_name().to_string();
        clap_complete::generate_to(shell, &mut cmd, name, &completions)
            .with_context(|| format!("writing the {shell} completion"))?;
    }
    Ok(())
}
