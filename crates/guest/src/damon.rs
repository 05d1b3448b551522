//! The agent's kdamond: DAMON's sysfs interface with its ownership rules lives in
//! `vtism-damon-sysfs`, shared with vtismd's host-side tracking.

pub use vtism_damon_sysfs::*;
