//! The module's parameters and their defaults (guest/module/vtism_main.c; docs/guest.md,
//! "Parameters", names each default's source).

#[derive(Clone, Debug)]
pub struct WindowParams {
    /// CPU the tracker may use, basis points of one vCPU.
    pub cpu_budget_bp: u64,
    /// Budget the tracker may bank, ms of it.
    pub credit_bank_ms: u64,
    pub coarse_period_ms: u64,
    /// Regions per coarse window at most.
    pub coarse_chunk: usize,
    /// Coarse window W_c: initial, minimum, maximum, µs.
    pub coarse_window_us: [u64; 3],
    /// Fine window W_f: initial, minimum, maximum, µs.
    pub fine_window_us: [u64; 3],
    /// Fine windows per burst (1-6).
    pub burst: usize,
    /// Highest do-not-disturb level (0: off).
    pub dnd_max_level: u8,
    pub round_ms: u64,
    /// A pass yields after this much work (the seed's slowdown is per slice).
    pub pass_max_us: u64,
    /// Share of frames to see young per window, bp; 0: from the host's quota.
    pub access_goal_bp: u64,
    /// The seed's interval between fine sweeps, T = (K*Ts + Kb)*Ts + Tbase ms, capped.
    pub interval_k: u64,
    pub interval_kb: u64,
    pub interval_base_ms: u64,
    pub interval_max_ms: u64,
    /// Skip PTE tables whose PMD entry was not used since the last fine pass.
    pub prune: bool,
    /// Entries a round can hold (a 16 MiB channel), one per 4 KiB frame.
    pub capacity: u64,
}

impl Default for WindowParams {
    fn default() -> Self {
        WindowParams {
            cpu_budget_bp: 100,
            credit_bank_ms: 1000,
            coarse_period_ms: 200,
            coarse_chunk: 2048,
            coarse_window_us: [1000, 50, 100_000],
            fine_window_us: [100_000, 1000, 10_000_000],
            burst: 4,
            dnd_max_level: 7,
            round_ms: 1000,
            pass_max_us: 1000,
            access_goal_bp: 0,
            interval_k: 8,
            interval_kb: 50,
            interval_base_ms: 2500,
            interval_max_ms: 300_000,
            prune: true,
            capacity: 2_096_640,
        }
    }
}
