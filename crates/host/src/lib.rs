//! vtismd, the vtism host daemon. The host gathers facts and carries out moves; the decisions
//! are the engine's tiering round (`vtism_engine::Tiering`), the same one the simulator runs.
//!
//! Each part owns its state: `discovery` (finding QMP sockets, `greeter` waiting for their
//! greetings), `registry` (the managed VMs as
//! QEMU shows them), `channels` (where hints enter), `reconcile` (where pages really are),
//! `host_tracking` (DAMON on the host, for VMs without a tracker), `mover` and `batch` (where
//! pages move), `rate` (move rate limits), `config` (each VM's
//! settings resolved once), `metrics` (status and Prometheus from typed structs), `serve` (the
//! metrics endpoint and control socket), and `daemon`, the loop that wires them. System calls
//! live in `sys`; QEMU's monitor in `qmp`, `vm` and `mtree`, its process in `process`; sysfs in
//! `topology`.

pub mod admission;
pub mod backing;
pub mod batch;
pub mod channel_file;
pub mod channels;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod discovery;
pub mod greeter;
pub mod host_tracking;
pub mod kernel_tiering;
pub mod metrics;
pub mod metrics_endpoint;
pub mod mover;
pub mod mtree;
pub mod process;
pub mod qmp;
pub mod rate;
pub mod reconcile;
pub mod registry;
pub mod serve;
pub mod sigbus;
pub mod sys;
pub mod topology;
pub mod vm;
