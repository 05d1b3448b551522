//! The memory model: two tiers with idle and loaded latency and bandwidth, the cost of moving a
//! page, and the cost of each tracking mechanism. Presets carry the published figures from
//! peers.md; `custom` models come from TOML (`MemoryModel::from_toml`).

use serde::{Deserialize, Serialize};

/// One memory tier as the CPU sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierModel {
    /// Idle (unloaded) latency of a read, ns.
    pub read_ns: f64,
    /// Idle latency of a write as it stalls the core, ns (writes are mostly posted).
    pub write_ns: f64,
    /// Peak read and write bandwidth, GB/s (10^9 bytes).
    pub read_gbps: f64,
    pub write_gbps: f64,
    /// Latency when the tier's bandwidth is saturated, ns. Loaded latency follows
    /// `idle / (1 - u)` (an M/M/1 queue in the bandwidth utilisation `u`), capped here.
    pub loaded_max_ns: f64,
}

impl TierModel {
    /// Latency of a read and a write at bandwidth utilisation `u` (0..).
    pub fn loaded(&self, u: f64) -> (f64, f64) {
        let u = u.clamp(0.0, 0.999);
        let f = |idle: f64| (idle / (1.0 - u)).min(self.loaded_max_ns.max(idle));
        (f(self.read_ns), f(self.write_ns))
    }
    /// Seconds of the tier's bandwidth that `rb` bytes read and `wb` bytes written use.
    pub fn busy_secs(&self, rb: f64, wb: f64) -> f64 {
        rb / (self.read_gbps * 1e9) + wb / (self.write_gbps * 1e9)
    }
}

/// What moving a page costs (Linux `move_pages(2)` unless a policy brings its own mover).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationModel {
    /// Copy bandwidth of one mover thread, GB/s (move_pages with 2 MiB folios: 11 GB/s).
    pub copy_gbps: f64,
    /// Per-page unmap, TLB shootdown and remap cost, µs of wall time, paid by every vCPU of the VM
    /// (the shootdown IPIs reach them all). Per 4 KiB page; a 2 MiB mapping pays it once.
    pub per_page_us: f64,
}

/// What tracking costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackingModel {
    /// Wall time the VM loses per scan is `scan_slowdown_per_ms * Ts^2` ms for a scan of `Ts` ms
    /// (the seed found the slowdown grows about quadratically with scan time).
    pub scan_slowdown_per_ms: f64,
    /// Cost of one NUMA hint fault (4 KiB), µs of the faulting thread.
    pub hint_fault_us: f64,
    /// CPU cost of taking and processing one PEBS sample, ns.
    pub pebs_sample_ns: f64,
    /// Slowdown while HMM-V's PML-based scanner runs (published: <= 2% at MWS >= 600 ms).
    pub pml_scan_slowdown: f64,
    /// Reading one present page-table entry that is not young (load and bit tests, tables far
    /// larger than the caches), ns. Measured: `cargo bench -p vtism-sim --bench tracker_costs`.
    #[serde(default = "default_pte_read_ns")]
    pub pte_read_ns: f64,
    /// Clearing the Accessed bit of one young entry with an atomic and-not, ns, read included.
    /// Measured, same bench.
    #[serde(default = "default_pte_clear_ns")]
    pub pte_clear_ns: f64,
    /// What a full TLB flush costs each vCPU, µs: the L2 data TLB's entries walked again, each
    /// a two-dimensional page walk. Measured, same bench.
    #[serde(default = "default_tlb_refill_us")]
    pub tlb_refill_us: f64,
    /// The guest module's rate arithmetic, ns per call (guest/module/vtism_rate.c, measured by
    /// guest/tests/bench_rate.c, docs/performance.md): a region's coarse window seen young; one
    /// not seen young that computes its step; a code moved by a step already computed (an idle
    /// region whose chunk shares the step, a frame whose burst saw nothing); a frame's burst
    /// with young windows (the long one and 4 short).
    #[serde(default = "default_coarse_young_ns")]
    pub coarse_young_ns: f64,
    #[serde(default = "default_coarse_idle_ns")]
    pub coarse_idle_ns: f64,
    #[serde(default = "default_code_move_ns")]
    pub code_move_ns: f64,
    #[serde(default = "default_burst_young_ns")]
    pub burst_young_ns: f64,
    /// Change detection's step for a short coarse window (vt_change_step), young and idle, ns.
    /// Measured, same program.
    #[serde(default = "default_change_young_ns")]
    pub change_young_ns: f64,
    #[serde(default = "default_change_idle_ns")]
    pub change_idle_ns: f64,
    /// Publication (vt_pub_frames), ns: the first pass per frame slot (its word read, its
    /// published code and level computed and kept, the histogram counted); the second pass per
    /// frame slot of a measured region (its level read back) and per entry written (the word
    /// read, the entry stored). Measured, same program.
    #[serde(default = "default_pub_count_ns")]
    pub pub_count_ns: f64,
    #[serde(default = "default_pub_check_ns")]
    pub pub_check_ns: f64,
    #[serde(default = "default_pub_write_ns")]
    pub pub_write_ns: f64,
}

fn default_pte_read_ns() -> f64 {
    // tracker_costs pte_read: 0.94 ns per entry (median of 10, 64 Mi entries).
    0.94
}
fn default_pte_clear_ns() -> f64 {
    // tracker_costs pte_clear: 4.66 ns per entry.
    4.66
}
// bench_rate.c by the thread's CPU clock, the median of three runs' medians of 11 runs of 4 Mi
// calls, idle machine (docs/performance.md, 2026-11-25).
fn default_coarse_young_ns() -> f64 {
    25.1
}
fn default_coarse_idle_ns() -> f64 {
    7.6
}
fn default_code_move_ns() -> f64 {
    1.6
}
fn default_burst_young_ns() -> f64 {
    93.9
}
// bench_rate.c by the thread's CPU clock, the middle of three runs at load 1.3 (about 1.1x the
// idle figures above for the same program's older items; not scaled: docs/performance.md,
// 2026-11-27).
fn default_change_young_ns() -> f64 {
    21.2
}
fn default_change_idle_ns() -> f64 {
    6.8
}
fn default_pub_count_ns() -> f64 {
    4.8
}
fn default_pub_check_ns() -> f64 {
    1.5
}
fn default_pub_write_ns() -> f64 {
    2.1
}
fn default_tlb_refill_us() -> f64 {
    // tracker_costs: 512 L2 DTLB entries (cpuid 0x80000006) x 120 ns per walk (4 KiB against
    // 2 MiB pages, random loads over 256 MiB: 340 vs 220 ns per load).
    61.4
}

/// What host huge pages change (`--host-pages`, `crate::host_folios`): the cost of an access to a
/// block the host maps with 4 KiB pages instead of one 2 MiB page, and khugepaged's pace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPagesModel {
    /// Extra latency of an access through 4 KiB pages rather than a 2 MiB page (the TLB reach a
    /// split block loses), ns.
    #[serde(default = "default_split_access_ns")]
    pub split_access_ns: f64,
    /// khugepaged wakes every `scan_sleep_ms` and walks `pages_to_scan` 4 KiB pages of progress
    /// (a 2 MiB range counts 512, huge or not).
    #[serde(default = "default_khugepaged_sleep_ms")]
    pub khugepaged_scan_sleep_ms: f64,
    #[serde(default = "default_khugepaged_pages")]
    pub khugepaged_pages_to_scan: u64,
}

impl Default for HostPagesModel {
    fn default() -> Self {
        HostPagesModel {
            split_access_ns: default_split_access_ns(),
            khugepaged_scan_sleep_ms: default_khugepaged_sleep_ms(),
            khugepaged_pages_to_scan: default_khugepaged_pages(),
        }
    }
}

fn default_split_access_ns() -> f64 {
    // tracker_costs `tlb` group (issue 26): a random dependent load over 256 MiB took 200.8 ns
    // through 4 KiB pages and 157.4 ns through 2 MiB pages.
    200.8 - 157.4
}
fn default_khugepaged_sleep_ms() -> f64 {
    // Documentation/admin-guide/mm/transhuge.rst and mm/khugepaged.c:
    // khugepaged_scan_sleep_millisecs = 10000.
    10_000.0
}
fn default_khugepaged_pages() -> u64 {
    // mm/khugepaged.c, khugepaged_init: khugepaged_pages_to_scan = HPAGE_PMD_NR * 8 = 4096.
    4096
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryModel {
    pub name: String,
    pub fast: TierModel,
    pub slow: TierModel,
    pub migration: MigrationModel,
    pub tracking: TrackingModel,
    #[serde(default)]
    pub host_pages: HostPagesModel,
}

pub const PRESETS: &[&str] = &["optane", "cxl", "remote-numa"];

fn default_migration() -> MigrationModel {
    // peers.md: move_pages 3.31 GB/s with 4 KiB folios, 11 GB/s with 2 MiB. Copy at 11 GB/s costs
    // 0.37 µs per 4 KiB, so the rest of the 1.24 µs per 4 KiB page (0.87 µs) is unmap/TLB work.
    MigrationModel {
        copy_gbps: 11.0,
        per_page_us: 0.87,
    }
}

fn default_tracking() -> TrackingModel {
    TrackingModel {
        // Calibrated so the adaptive interval with K=8, Kb=0 sits at the seed's 5% limit for large
        // scans (overhead -> k/K) and gives 0.3-2.5% at 1-5 GiB hot, as the seed measured.
        scan_slowdown_per_ms: 0.4,
        // Assumption: a minor fault with the NUMA hinting path, in the guest.
        hint_fault_us: 1.0,
        // Assumption: PEBS assist, drain and record processing per sample.
        pebs_sample_ns: 500.0,
        pml_scan_slowdown: 0.02,
        pte_read_ns: default_pte_read_ns(),
        pte_clear_ns: default_pte_clear_ns(),
        tlb_refill_us: default_tlb_refill_us(),
        coarse_young_ns: default_coarse_young_ns(),
        coarse_idle_ns: default_coarse_idle_ns(),
        code_move_ns: default_code_move_ns(),
        burst_young_ns: default_burst_young_ns(),
        change_young_ns: default_change_young_ns(),
        change_idle_ns: default_change_idle_ns(),
        pub_count_ns: default_pub_count_ns(),
        pub_check_ns: default_pub_check_ns(),
        pub_write_ns: default_pub_write_ns(),
    }
}

impl MemoryModel {
    pub fn preset(name: &str) -> Option<MemoryModel> {
        let m = match name {
            // HMM-V Table 2. Loaded maxima are not published: assumed 5x idle.
            "optane" => MemoryModel {
                name: name.into(),
                fast: TierModel {
                    read_ns: 81.0,
                    write_ns: 82.0,
                    read_gbps: 120.0,
                    write_gbps: 82.0,
                    loaded_max_ns: 405.0,
                },
                slow: TierModel {
                    read_ns: 310.0,
                    write_ns: 94.0,
                    read_gbps: 37.0,
                    write_gbps: 13.0,
                    loaded_max_ns: 1550.0,
                },
                migration: default_migration(),
                tracking: default_tracking(),
                host_pages: HostPagesModel::default(),
            },
            // vtism notes: DDR5 one channel ~80 ns idle, rising to ~600 ns loaded; local CXL-DRAM
            // 288 ns. Bandwidths assumed: DDR5-4800 one channel 38.4 GB/s, a x8 CXL link 25 GB/s.
            "cxl" => MemoryModel {
                name: name.into(),
                fast: TierModel {
                    read_ns: 80.0,
                    write_ns: 80.0,
                    read_gbps: 38.4,
                    write_gbps: 38.4,
                    loaded_max_ns: 600.0,
                },
                slow: TierModel {
                    read_ns: 288.0,
                    write_ns: 288.0,
                    read_gbps: 25.0,
                    write_gbps: 25.0,
                    loaded_max_ns: 1500.0,
                },
                migration: default_migration(),
                tracking: default_tracking(),
                host_pages: HostPagesModel::default(),
            },
            // Xen paper / Pond-style emulation: remote socket ~1.5x local latency. Local DRAM as in
            // the optane preset; the remote link (UPI) assumed 40 GB/s.
            "remote-numa" => MemoryModel {
                name: name.into(),
                fast: TierModel {
                    read_ns: 81.0,
                    write_ns: 82.0,
                    read_gbps: 120.0,
                    write_gbps: 82.0,
                    loaded_max_ns: 405.0,
                },
                slow: TierModel {
                    read_ns: 122.0,
                    write_ns: 123.0,
                    read_gbps: 40.0,
                    write_gbps: 40.0,
                    loaded_max_ns: 610.0,
                },
                migration: default_migration(),
                tracking: default_tracking(),
                host_pages: HostPagesModel::default(),
            },
            _ => return None,
        };
        Some(m)
    }

    /// A model from TOML: `base = "<preset>"` optionally, then any tables to override, e.g.
    /// `[slow] read_ns = 400`. Unknown fields are errors that name the field.
    pub fn from_toml(text: &str) -> anyhow::Result<MemoryModel> {
        let mut v: toml::Value = toml::from_str(text)?;
        let base = v
            .get("base")
            .map(|b| {
                b.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow::anyhow!("base: must be a preset name (string)"))
            })
            .transpose()?;
        let mut merged = match &base {
            Some(b) => toml::Value::try_from(Self::preset(b).ok_or_else(|| {
                anyhow::anyhow!("base: unknown preset {b:?} (one of {})", PRESETS.join(", "))
            })?)?,
            None => toml::Value::Table(Default::default()),
        };
        if let Some(t) = v.as_table_mut() {
            t.remove("base");
            t.entry("name")
                .or_insert_with(|| toml::Value::String("custom".into()));
        }
        merge(&mut merged, v);
        let m: MemoryModel = merged.try_into().map_err(|e: toml::de::Error| {
            anyhow::anyhow!("memory model: {}", e.message().trim())
        })?;
        m.validate()?;
        Ok(m)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        for (tn, t) in [("fast", &self.fast), ("slow", &self.slow)] {
            for (f, v) in [
                ("read_ns", t.read_ns),
                ("write_ns", t.write_ns),
                ("read_gbps", t.read_gbps),
                ("write_gbps", t.write_gbps),
                ("loaded_max_ns", t.loaded_max_ns),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    anyhow::bail!("{tn}.{f}: must be a positive number, got {v}");
                }
            }
        }
        if self.migration.copy_gbps.is_nan() || self.migration.copy_gbps <= 0.0 {
            anyhow::bail!("migration.copy_gbps: must be positive");
        }
        if self.migration.per_page_us.is_nan() || self.migration.per_page_us < 0.0 {
            anyhow::bail!("migration.per_page_us: must not be negative");
        }
        let h = &self.host_pages;
        if !(h.split_access_ns.is_finite() && h.split_access_ns >= 0.0) {
            anyhow::bail!("host_pages.split_access_ns: must be a non-negative number");
        }
        if !(h.khugepaged_scan_sleep_ms.is_finite() && h.khugepaged_scan_sleep_ms > 0.0) {
            anyhow::bail!("host_pages.khugepaged_scan_sleep_ms: must be a positive number");
        }
        let t = &self.tracking;
        for (f, v) in [
            ("scan_slowdown_per_ms", t.scan_slowdown_per_ms),
            ("hint_fault_us", t.hint_fault_us),
            ("pebs_sample_ns", t.pebs_sample_ns),
            ("pml_scan_slowdown", t.pml_scan_slowdown),
            ("pte_read_ns", t.pte_read_ns),
            ("pte_clear_ns", t.pte_clear_ns),
            ("tlb_refill_us", t.tlb_refill_us),
            ("coarse_young_ns", t.coarse_young_ns),
            ("coarse_idle_ns", t.coarse_idle_ns),
            ("code_move_ns", t.code_move_ns),
            ("burst_young_ns", t.burst_young_ns),
            ("change_young_ns", t.change_young_ns),
            ("change_idle_ns", t.change_idle_ns),
            ("pub_count_ns", t.pub_count_ns),
            ("pub_check_ns", t.pub_check_ns),
            ("pub_write_ns", t.pub_write_ns),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                anyhow::bail!("tracking.{f}: must be a non-negative number, got {v}");
            }
        }
        Ok(())
    }

    /// Wall time to migrate `bytes` in pages of `page_bytes` on one mover at `speedup` x copy speed.
    pub fn migration_secs(&self, bytes: f64, page_bytes: f64, speedup: f64) -> f64 {
        let pages = bytes / page_bytes;
        bytes / (self.migration.copy_gbps * 1e9 * speedup) + pages * self.unmap_secs(page_bytes)
    }

    /// Unmap/TLB cost of one page mapping of `page_bytes`: per 4 KiB page, once for a 2 MiB page.
    pub fn unmap_secs(&self, page_bytes: f64) -> f64 {
        let _ = page_bytes;
        self.migration.per_page_us * 1e-6
    }
}

fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(bv) if bv.is_table() && v.is_table() => merge(bv, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_carry_published_figures() {
        for p in PRESETS {
            MemoryModel::preset(p).unwrap().validate().unwrap();
        }
        let o = MemoryModel::preset("optane").unwrap();
        assert_eq!((o.slow.read_ns, o.slow.write_ns), (310.0, 94.0));
        assert_eq!((o.slow.read_gbps, o.slow.write_gbps), (37.0, 13.0));
        let c = MemoryModel::preset("cxl").unwrap();
        assert_eq!((c.fast.loaded_max_ns, c.slow.read_ns), (600.0, 288.0));
    }

    #[test]
    fn loaded_latency_rises_with_use_and_is_capped() {
        let c = MemoryModel::preset("cxl").unwrap();
        let (idle, _) = c.fast.loaded(0.0);
        let (half, _) = c.fast.loaded(0.5);
        let (full, _) = c.fast.loaded(5.0);
        assert_eq!(idle, 80.0);
        assert_eq!(half, 160.0);
        assert_eq!(full, 600.0);
    }

    #[test]
    fn custom_toml_overrides_a_base_and_names_bad_fields() {
        let m = MemoryModel::from_toml("base = \"cxl\"\n[slow]\nread_ns = 400\n").unwrap();
        assert_eq!(m.slow.read_ns, 400.0);
        assert_eq!(m.fast.read_ns, 80.0);
        assert_eq!(m.name, "custom");
        let e = MemoryModel::from_toml("base = \"cxl\"\n[slow]\nread_nz = 4\n").unwrap_err();
        assert!(e.to_string().contains("read_nz"), "{e}");
        let e = MemoryModel::from_toml("base = \"cxl\"\n[fast]\nread_gbps = -1\n").unwrap_err();
        assert!(e.to_string().contains("fast.read_gbps"), "{e}");
        let e = MemoryModel::from_toml("base = \"nope\"").unwrap_err();
        assert!(e.to_string().contains("base"), "{e}");
        // Without a base every field is required, and the missing one is named.
        let e = MemoryModel::from_toml("[fast]\nread_ns = 1\n").unwrap_err();
        assert!(e.to_string().contains("missing field"), "{e}");
    }
}
