//! The monitoring-intervals loop the agent runs for DAMON (Linux 6.12 has no auto-tuning).
//!
//! After every aggregation, as DAMON's `intervals_goal` does in Linux 6.15 (mm/damon/core.c,
//! `kdamond_tune_intervals`): the score is the share of access events DAMON saw (region bytes
//! times `nr_accesses`, over all monitored bytes times the samples per aggregation) against the
//! goal; below the goal the sampling interval grows by `2 - score` (at most doubling), above it
//! it shrinks by `1 - (score - 1) / 2` (at most halving), within bounds. The goal is the share
//! of memory the host's fast quota holds, so the hot threshold falls near the quota boundary.
//!
//! Two floors come on top, from the CPU budget: the kdamond's cost grows as the sampling
//! interval shrinks (one check per region per sample), so the interval stays at least what
//! keeps it within three quarters of the budget; and a round (one read of DAMON's regions,
//! published) comes no more often than keeps the agent's own work within a quarter of it.
//!
//! Committing a new layout of confirmed frames to DAMON is the agent's most expensive step
//! (thousands of sysfs region files: 0.7-1.5 s of CPU each under TCG, more than half of the
//! agent's CPU while the DAMON e2e's frames were being confirmed), and it comes when frames cross
//! 1 Hz, not on a clock. So it is paid from
//! what the kdamond and the rest of the agent leave of the whole budget ([`CommitAllowance`]).
//!
//! A round spans [`AGGREGATIONS_PER_ROUND`] aggregations: in 6.12 `update_schemes_tried_regions`
//! starts collecting at the end of one aggregation and returns at the end of the next (measured:
//! 1.1 s per read with 0.5 s aggregations). An aggregation holds at least `aggr_samples_min`
//! samples and lasts at least its share of a round.

/// Bounds and targets of the loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopParams {
    /// Sampling interval bounds, µs (DAMON's recommendation: 5 ms to 10 s).
    pub sample_min_us: u64,
    pub sample_max_us: u64,
    /// At least this many samples per aggregation.
    pub aggr_samples_min: u64,
    /// Rounds (aggregations) last at least this long, µs.
    pub round_min_us: u64,
    /// CPU the kdamond and the agent may use together, as a share of one CPU.
    pub cpu_budget: f64,
    /// A fixed access goal (share of access events), or `None` for the host's quota.
    pub goal_override: Option<f64>,
}

/// Sampling and aggregation intervals, µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intervals {
    pub sample_us: u64,
    pub aggr_us: u64,
}

impl Intervals {
    /// Samples per aggregation.
    pub fn samples(&self) -> u64 {
        (self.aggr_us / self.sample_us.max(1)).max(1)
    }
}

/// Aggregations per round: one to start DAMON's collection of tried regions, one to fill them.
pub const AGGREGATIONS_PER_ROUND: u64 = 2;

/// DAMON's recommended access goal when the host gives no quota: 4% (`access_bp` 400).
pub const DEFAULT_GOAL: f64 = 0.04;
/// The goal stays within these shares (tracker-spec: 1% to 50%).
pub const GOAL_MIN: f64 = 0.01;
pub const GOAL_MAX: f64 = 0.5;

/// The share of access events to aim for: the host's quota over the monitored memory.
pub fn access_goal(quota_bytes: u64, monitored_bytes: u64, fixed: Option<f64>) -> f64 {
    if let Some(g) = fixed {
        return g.clamp(1e-4, 1.0);
    }
    if quota_bytes == 0 || monitored_bytes == 0 {
        return DEFAULT_GOAL;
    }
    (quota_bytes as f64 / monitored_bytes as f64).clamp(GOAL_MIN, GOAL_MAX)
}

/// DAMON's step for a score (achieved / goal): `damon_feed_loop_next_input` around a fixed
/// input, then reductions rescaled to [0.5, 1).
pub fn damon_step(score: f64) -> f64 {
    if score.is_nan() || score < 0.0 {
        return 1.0;
    }
    if score < 1.0 {
        2.0 - score
    } else {
        // the feed loop gives 2 - score (at least nearly 0); DAMON maps [0, 1) onto [0.5, 1)
        let f = (2.0 - score).max(0.0);
        0.5 + f / 2.0
    }
}

/// What one aggregation showed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observation {
    /// Access events seen over the events possible (bytes × nr_accesses over monitored bytes ×
    /// samples).
    pub access_share: f64,
    /// The goal for that share.
    pub goal: f64,
    /// Kdamond CPU per sampling interval, µs (its cost scales with regions, not the interval).
    pub kdamond_us_per_sample: f64,
    /// The agent's CPU for one round, µs.
    pub agent_us_per_round: f64,
    /// The host's floor on the round period, µs (`min_interval_ms`).
    pub host_floor_us: u64,
}

/// Why the sampling interval is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Toward the access goal.
    Goal,
    /// Held up by the CPU budget.
    Budget,
    /// At a bound.
    Bound,
}

/// The next intervals after an aggregation under `cur`.
pub fn next(p: &LoopParams, cur: Intervals, o: &Observation) -> (Intervals, Limit) {
    let score = if o.goal > 0.0 {
        o.access_share / o.goal
    } else {
        1.0
    };
    let want = cur.sample_us as f64 * damon_step(score);
    let budget = p.cpu_budget.max(1e-6);
    let floor = o.kdamond_us_per_sample / (0.75 * budget);
    let min = p.sample_min_us.max(1) as f64;
    let max = (p.sample_max_us as f64).max(min);
    let (mut s, mut limit) = if want < floor {
        (floor, Limit::Budget)
    } else {
        (want, Limit::Goal)
    };
    if s <= min {
        s = min;
        limit = if floor > min {
            Limit::Budget
        } else {
            Limit::Bound
        };
    } else if s >= max {
        s = max;
        limit = Limit::Bound;
    }
    let sample_us = s.round() as u64;
    let round_us = (p.round_min_us as f64)
        .max(o.host_floor_us as f64)
        .max(o.agent_us_per_round / (0.25 * budget));
    let aggr = (round_us / AGGREGATIONS_PER_ROUND as f64)
        .max((p.aggr_samples_min.max(1) * sample_us) as f64);
    // a whole number of samples
    let n = (aggr / sample_us as f64).ceil().max(1.0) as u64;
    (
        Intervals {
            sample_us,
            aggr_us: n * sample_us,
        },
        limit,
    )
}

/// Moves within this factor, and scores within it of the goal, are not committed on their own.
/// A band on the move alone is asymmetric: DAMON's step is half the error above the goal, so a
/// band of 1/8 on the move left the loop anywhere from 0.89 to 1.22 times the goal (e2e run 4:
/// 1.13 under one quota, 0.91 under the next). On the score, 1/16 leaves it within 0.94 to 1.06.
pub const DEAD_BAND: f64 = 1.0 / 16.0;

/// Whether a score (achieved over goal) is far enough from the goal to move toward it.
pub fn off_goal(score: f64) -> bool {
    score == 0.0 || (score > 0.0 && score.is_finite() && score.ln().abs() > DEAD_BAND.ln_1p())
}

/// Whether `next` differs enough from `cur` to be worth a commit (each delays the agent's next
/// read by up to an aggregation: DAMON applies it at the end of the current one).
pub fn worth_commit(cur: Intervals, next: Intervals) -> bool {
    let moved = |a: u64, b: u64| {
        let (a, b) = (a.max(1) as f64, b.max(1) as f64);
        (a / b).ln().abs() > DEAD_BAND.ln_1p()
    };
    moved(cur.sample_us, next.sample_us) || moved(cur.aggr_us, next.aggr_us)
}

/// What the budget leaves for committing confirmed frames: a balance, in µs of CPU, that each
/// round credits with the budget's share of the time it took and debits with what the kdamond
/// and the agent spent in it (commits included). A commit may start while the balance is not
/// negative; the rounds after it repay it. The balance is capped at two commits' cost, so a quiet
/// spell does not buy a burst of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommitAllowance {
    balance_us: f64,
    /// A commit's CPU, smoothed.
    commit_us: f64,
}

/// The least cap on the balance, µs, before a commit has been measured.
const ALLOWANCE_CAP_MIN_US: f64 = 100_000.0;

impl CommitAllowance {
    /// After a round of `elapsed_us` in which the kdamond and the agent spent `spent_us`.
    pub fn round(&mut self, budget: f64, elapsed_us: u64, spent_us: u64) {
        let cap = (2.0 * self.commit_us).max(ALLOWANCE_CAP_MIN_US);
        self.balance_us = (self.balance_us + budget * elapsed_us as f64 - spent_us as f64).min(cap);
    }

    pub fn allows(&self) -> bool {
        self.balance_us >= 0.0
    }

    /// A commit ran and took `cost_us` of the agent's CPU (which the next round debits).
    pub fn committed(&mut self, cost_us: u64) {
        let c = cost_us as f64;
        self.commit_us = if self.commit_us == 0.0 {
            c
        } else {
            0.5 * (self.commit_us + c)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits paid from what is left: with the kdamond and the rounds at 14% of a 20% budget
    /// and commits of 1.5 s, the whole stays within the budget over a long run, and commits come
    /// as often as the remaining 6% pays for (one every 25 s of 10 s rounds).
    #[test]
    fn commits_are_paid_from_what_the_budget_leaves() {
        let (budget, round_us, base_us, commit_us) = (0.2, 10_000_000u64, 1_400_000u64, 1_500_000);
        let mut a = CommitAllowance::default();
        let (mut spent, mut commits, mut owed) = (0u64, 0u64, 0u64);
        let rounds = 1000;
        for _ in 0..rounds {
            // the last round's commit is spent in this one
            let s = base_us + std::mem::take(&mut owed);
            spent += s;
            a.round(budget, round_us, s);
            if a.allows() {
                a.committed(commit_us);
                owed = commit_us;
                commits += 1;
            }
        }
        let share = spent as f64 / (rounds * round_us) as f64;
        assert!(share <= budget * 1.01, "{share}");
        let every_s = (rounds * round_us) as f64 / 1e6 / commits as f64;
        assert!(
            (20.0..=30.0).contains(&every_s),
            "a commit every {every_s} s"
        );
        // nothing left when the rest spends the budget: no commits after the first
        let mut a = CommitAllowance::default();
        a.round(budget, round_us, 2_000_000);
        assert!(a.allows());
        a.committed(commit_us);
        a.round(budget, round_us, 2_000_000 + commit_us);
        for _ in 0..100 {
            assert!(!a.allows());
            a.round(budget, round_us, 2_000_000);
        }
    }

    fn params() -> LoopParams {
        LoopParams {
            sample_min_us: 5_000,
            sample_max_us: 10_000_000,
            aggr_samples_min: 10,
            round_min_us: 1_000_000,
            cpu_budget: 0.01,
            goal_override: None,
        }
    }

    fn obs(share: f64, goal: f64) -> Observation {
        Observation {
            access_share: share,
            goal,
            ..Observation::default()
        }
    }

    #[test]
    fn damons_step_rule() {
        // no access at all: double; at the goal: stay; twice the goal or more: halve
        assert_eq!(damon_step(0.0), 2.0);
        assert_eq!(damon_step(1.0), 1.0);
        assert_eq!(damon_step(2.0), 0.5);
        assert_eq!(damon_step(50.0), 0.5);
        assert!((damon_step(0.5) - 1.5).abs() < 1e-12);
        assert!((damon_step(1.5) - 0.75).abs() < 1e-12);
        assert_eq!(damon_step(f64::NAN), 1.0);
        // monotone: more accesses, shorter intervals
        let mut last = f64::INFINITY;
        for i in 0..40 {
            let f = damon_step(i as f64 * 0.1);
            assert!(f <= last);
            last = f;
        }
    }

    #[test]
    fn goal_from_the_quota() {
        assert_eq!(access_goal(0, 1 << 30, None), DEFAULT_GOAL);
        assert!((access_goal(64 << 20, 1 << 30, None) - 0.0625).abs() < 1e-12);
        assert_eq!(access_goal(1 << 20, 1 << 30, None), GOAL_MIN);
        assert_eq!(access_goal(1 << 30, 1 << 30, None), GOAL_MAX);
        assert_eq!(access_goal(64 << 20, 1 << 30, Some(0.02)), 0.02);
    }

    #[test]
    fn steps_toward_the_goal_within_bounds() {
        let p = params();
        let cur = Intervals {
            sample_us: 100_000,
            aggr_us: 1_000_000,
        };
        // too few accesses: longer windows, at most twice as long
        let (n, l) = next(&p, cur, &obs(0.0, 0.04));
        assert_eq!((n.sample_us, l), (200_000, Limit::Goal));
        // 10 samples of 200 ms are longer than half a round of 1 s: the aggregation grows
        assert_eq!(n.aggr_us, 2_000_000);
        // too many: shorter, at most halved; 10 samples of 50 ms are half a round
        let (n, _) = next(&p, cur, &obs(0.5, 0.04));
        assert_eq!(n.sample_us, 50_000);
        assert_eq!(n.aggr_us, 500_000);
        // at the goal: unchanged
        let (n, _) = next(&p, cur, &obs(0.04, 0.04));
        assert_eq!(n, cur);
        // bounds
        let low = Intervals {
            sample_us: 6_000,
            aggr_us: 1_002_000,
        };
        let (n, l) = next(&p, low, &obs(1.0, 0.04));
        assert_eq!((n.sample_us, l), (5_000, Limit::Bound));
        assert_eq!(n.aggr_us, 500_000);
        let high = Intervals {
            sample_us: 8_000_000,
            aggr_us: 80_000_000,
        };
        let (n, l) = next(&p, high, &obs(0.0, 0.04));
        assert_eq!((n.sample_us, l), (10_000_000, Limit::Bound));
        assert_eq!(n.aggr_us, 100_000_000);
    }

    #[test]
    fn converges_on_a_poisson_population() {
        // 1% of the frames at 50 Hz, 2% at 0.5 Hz, the rest idle; goal 2%: the interval settles
        // where the warm frames make up the difference (their share young about 1/2)
        let p = params();
        let share = |s_us: u64| {
            let s = s_us as f64 / 1e6;
            0.01 * (1.0 - (-50.0 * s).exp()) + 0.02 * (1.0 - (-0.5 * s).exp())
        };
        let mut cur = Intervals {
            sample_us: 5_000,
            aggr_us: 1_000_000,
        };
        for _ in 0..60 {
            cur = next(&p, cur, &obs(share(cur.sample_us), 0.02)).0;
        }
        let s = cur.sample_us as f64 / 1e6;
        assert!((share(cur.sample_us) / 0.02 - 1.0).abs() < 0.05, "{cur:?}");
        assert!((1.0..1.8).contains(&s), "{s}");
    }

    #[test]
    fn the_budget_holds_the_interval_up() {
        let p = params();
        let cur = Intervals {
            sample_us: 100_000,
            aggr_us: 1_000_000,
        };
        // 600 µs per sample: at 1% (three quarters for the kdamond) no shorter than 80 ms
        let o = Observation {
            access_share: 0.5,
            goal: 0.04,
            kdamond_us_per_sample: 600.0,
            ..Observation::default()
        };
        let (n, l) = next(&p, cur, &o);
        assert_eq!((n.sample_us, l), (80_000, Limit::Budget));
        // the agent's 5 ms per round: rounds of at least 2 s, aggregations of 1 s
        let o = Observation {
            agent_us_per_round: 5_000.0,
            ..obs(0.04, 0.04)
        };
        assert_eq!(next(&p, cur, &o).0.aggr_us, 1_000_000);
        // and the host's floor
        let o = Observation {
            host_floor_us: 5_000_000,
            ..obs(0.04, 0.04)
        };
        assert_eq!(next(&p, cur, &o).0.aggr_us, 2_500_000);
    }

    #[test]
    fn the_goal_band_is_symmetric() {
        // 1.13 times the goal is a move of only 6.5% (DAMON halves the step above the goal),
        // but the score is off: move
        assert!(off_goal(1.13) && off_goal(0.91));
        assert!(!off_goal(1.05) && !off_goal(0.95) && !off_goal(1.0));
        assert!(off_goal(0.0) && !off_goal(f64::NAN));
    }

    #[test]
    fn small_moves_need_no_commit() {
        let a = Intervals {
            sample_us: 100_000,
            aggr_us: 1_000_000,
        };
        assert!(!worth_commit(
            a,
            Intervals {
                sample_us: 106_000,
                aggr_us: 1_060_000
            }
        ));
        assert!(worth_commit(
            a,
            Intervals {
                sample_us: 107_000,
                aggr_us: 1_070_000
            }
        ));
        assert!(worth_commit(
            a,
            Intervals {
                sample_us: 93_000,
                aggr_us: 930_000
            }
        ));
        assert!(worth_commit(
            a,
            Intervals {
                sample_us: 100_000,
                aggr_us: 2_000_000
            }
        ));
    }
}
