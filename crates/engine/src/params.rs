//! Tunables of the vtism policy, with the defaults and their sources.

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineParams {
    /// Weight of a read access in the page degree (HMM-V: 1).
    pub read_weight: u32,
    /// Weight of a write (HMM-V: 3; writes to slow memory cost more, Optane 94 ns vs 310 ns read).
    pub write_weight: u32,
    /// Guest access counts above this are clipped before weighting: the guest's history window
    /// (HMM-V counts over 8 windows).
    pub count_cap: u32,
    /// Per-round decay of a frame's score, in (0, 1): a frame seen every round with degree d
    /// settles at d / (1 - decay). 0.75 keeps about four rounds of memory.
    pub decay: f64,
    /// Minimum decayed score for a frame to count as hot at all.
    pub min_hot_score: u32,
    /// Minimum decayed score for a frame to count in the hot-set size the pool balances
    /// (`VtismPolicy::hot_set_bytes`): HMM-V counts pages whose degree is above its base of 3; a
    /// frame with degree 4 every round settles at 4 / (1 - decay) = 16 at the default decay.
    pub hot_set_min_score: u32,
    /// For guests whose counts are access rates (channel v1.1): the rate, in accesses per second,
    /// a frame needs to count in the hot-set size. HMM-V's hot pages have a degree above 3 over 8
    /// windows of 600 ms: read in at least 4 of 8 such windows, about once a second.
    pub hot_set_min_rate_hz: f64,
    /// A slow frame displaces a fast one only when its decayed score is at least this many times
    /// higher (AutoTiering OPM's "less accessed than the faulting page", with a margin against
    /// noise).
    pub hysteresis: f64,
    /// Free fast-quota reserve kept by background demotion so promotions never wait, as a fraction
    /// of the quota (AutoTiering OPM-BD keeps a pool of free pages).
    pub reserve_fraction: f64,
    /// Lower bound of the reserve in bytes (one 2 MiB unit by default).
    pub reserve_min_bytes: u64,
    /// Bytes the plan of one round may move, promotions plus demotions: enough for a hot set of
    /// a few GiB that jumps to move in a round or two, as the move limits' burst allows; the
    /// limits, not this, bound what a VM moves over time.
    pub round_budget_bytes: u64,
    /// Each VM's first claim on a round's budget, as a share of it: a guest that flips its hot
    /// set every round cannot take the moves the others need. What they leave goes to the VMs
    /// that want more, in the round's order, so a VM alone still gets the whole budget.
    pub vm_round_share: f64,
    /// Locality within the slow tier (AutoTiering's CPMX): frames accessed lately on a slow node
    /// farther from the VM's home than the nearest one move there once it has room, in the
    /// background (`MoveKind::NearSlow`). Off where guest RAM is spread over slow nodes on
    /// purpose (interleaved for their bandwidth).
    pub near_slow: bool,
}

impl Default for EngineParams {
    fn default() -> Self {
        EngineParams {
            read_weight: 1,
            write_weight: 3,
            count_cap: 8,
            decay: 0.75,
            min_hot_score: 2,
            hot_set_min_score: 16,
            hot_set_min_rate_hz: 1.0,
            hysteresis: 1.07,
            reserve_fraction: 0.0,
            reserve_min_bytes: 2 << 20,
            round_budget_bytes: 2 << 30,
            vm_round_share: 0.25,
            near_slow: true,
        }
    }
}

/// A parameter out of range; names the field as it appears in the configuration.
#[derive(Debug, Error, PartialEq)]
#[error("engine.{field}: {problem}")]
pub struct ParamError {
    pub field: &'static str,
    pub problem: String,
}

impl EngineParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        let err = |field, problem: &str| {
            Err(ParamError {
                field,
                problem: problem.to_string(),
            })
        };
        if self.read_weight == 0 && self.write_weight == 0 {
            return err(
                "read_weight",
                "read_weight and write_weight cannot both be 0",
            );
        }
        if self.read_weight > 16 {
            return err("read_weight", "must be at most 16");
        }
        if self.write_weight > 16 {
            return err("write_weight", "must be at most 16");
        }
        if !(1..=255).contains(&self.count_cap) {
            return err("count_cap", "must be between 1 and 255");
        }
        if !(self.decay > 0.0 && self.decay <= 0.93) {
            return err("decay", "must be above 0 and at most 0.93");
        }
        if self.min_hot_score > 255 {
            return err("min_hot_score", "must be at most 255");
        }
        if self.hot_set_min_score > 255 {
            return err("hot_set_min_score", "must be at most 255");
        }
        if !(self.hot_set_min_rate_hz >= 1.0 / 64.0 && self.hot_set_min_rate_hz <= 1000.0) {
            return err(
                "hot_set_min_rate_hz",
                "must be between 1/64 and 1000 (accesses per second)",
            );
        }
        if !(1.0..=100.0).contains(&self.hysteresis) {
            return err(
                "hysteresis",
                "must be between 1 and 100 (a ratio of scores)",
            );
        }
        if !(0.0..=0.5).contains(&self.reserve_fraction) {
            return err("reserve_fraction", "must be between 0 and 0.5");
        }
        if self.round_budget_bytes < 4096 {
            return err("round_budget_bytes", "must be at least one 4 KiB frame");
        }
        if !(self.vm_round_share > 0.0 && self.vm_round_share <= 1.0) {
            return err("vm_round_share", "must be above 0 and at most 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_fields_are_named() {
        EngineParams::default().validate().unwrap();
        let p = EngineParams {
            decay: 1.0,
            ..Default::default()
        };
        let e = p.validate().unwrap_err();
        assert_eq!(e.field, "decay");
        assert!(e.to_string().starts_with("engine.decay:"));
        let p = EngineParams {
            round_budget_bytes: 0,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "round_budget_bytes");
    }
}
