//! `vtism`: one binary, one subcommand per part of the system.

mod assets;
mod demo;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

const ABOUT: &str = "Tiered memory for virtual machines: keeps each VM's hot pages in fast memory \
(local DRAM) and its cold pages in slow memory (CXL, PMem, remote DRAM), using hot-page hints the \
guests publish through an ivshmem channel.";

#[derive(Parser, Debug)]
#[command(name = "vtism", version, about = ABOUT, propagate_version = true)]
struct Cli {
    /// Log filter (tracing-subscriber syntax, e.g. `info`, `vtism_host=debug`); overrides RUST_LOG.
    #[arg(long, global = true)]
    log: Option<String>,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run vtismd, the host daemon: discover VMs, read their hints, move their pages.
    Host(vtism_host::cli::HostArgs),
    /// Query or steer a running vtismd through its control socket.
    Ctl(vtism_host::cli::CtlArgs),
    /// Run the guest agent: track hot pages with DAMON and publish them to the host.
    Guest(vtism_guest::cli::GuestArgs),
    /// Simulate placement policies (vtism and its peers) on workload and memory models.
    #[command(subcommand)]
    Sim(vtism_sim::cli::SimCommand),
    /// Boot an emulated DRAM+CXL host and run the whole stack in it (what `make demo` runs).
    Testbed(vtism_testbed::cli::TestbedArgs),
    /// Run vtism against the kernel's own tiering and DAMON tiering in the emulated host.
    Bakeoff(vtism_bakeoff::cli::BakeoffArgs),
    /// Run the tiering engine on a built-in synthetic workload and show every decision.
    Demo(demo::DemoArgs),
}

fn init_logging(filter: Option<&str>, json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = match filter {
        Some(f) => EnvFilter::new(f),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    // Colours only on a terminal: a log file or the journal gets plain `key=value` fields.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

fn main() -> ExitCode {
    // `vtism package-assets` (for `make deb`) is kept out of the CLI it documents, so that it does
    // not appear in the man pages and completions it writes.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "package-assets")
    {
        let argv =
            std::iter::once("vtism package-assets".into()).chain(std::env::args_os().skip(2));
        let args = assets::AssetsArgs::parse_from(argv);
        return match assets::run(Cli::command(), args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vtism package-assets: error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse();
    // vtismd sets up its own logging from its configuration (daemon.log_level, log_format) unless
    // the command line says otherwise; a subscriber installed here first would win.
    let host_logs_itself = matches!(cli.cmd, Cmd::Host(_)) && cli.log.is_none() && !cli.log_json;
    if !host_logs_itself {
        init_logging(cli.log.as_deref(), cli.log_json);
    }
    let res = match cli.cmd {
        Cmd::Host(a) => vtism_host::cli::host_main(a),
        Cmd::Ctl(a) => vtism_host::cli::ctl_main(a),
        Cmd::Guest(a) => vtism_guest::cli::guest_main(a),
        Cmd::Sim(c) => vtism_sim::cli::sim_main(c),
        Cmd::Testbed(a) => vtism_testbed::cli::testbed_main(a),
        Cmd::Bakeoff(a) => vtism_bakeoff::cli::bakeoff_main(a),
        Cmd::Demo(a) => demo::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vtism: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
