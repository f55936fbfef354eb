//! Plan, then apply: a quota change becomes a `Vec<CgroupWrite>` in a safe order, and one
//! executor performs it.
//!
//! Ordering rules (checked by [`check_plan`], asserted in tests and before every apply):
//! - v1: `memory.memsw.limit_in_bytes` ≥ `memory.limit_in_bytes` at every step (the kernel
//!   rejects a limit above memsw with EINVAL): raise memsw first, lower it last. The swap
//!   headroom (memsw − limit) is kept.
//! - v2: `memory.high` ≤ `memory.max` at every step: raise max first, lower high first.

use crate::cgroup::{CgroupError, CgroupIo, CgroupVersion, CgroupWrite, CpuMax, Limits};

/// The writes that move `current` to the new CPU quota and/or memory limit.
/// `v2_high_ratio` < 1 also sets v2 `memory.high` to that fraction of `memory.max`.
pub fn plan(
    version: CgroupVersion,
    current: &Limits,
    cpu: Option<CpuMax>,
    memory: Option<u64>,
    v2_high_ratio: f64,
) -> Vec<CgroupWrite> {
    let mut out = Vec::new();
    if let Some(c) = cpu {
        if c != current.cpu {
            out.push(CgroupWrite::CpuMax(c));
        }
    }
    let Some(new) = memory else {
        return out;
    };
    let old = current.memory.unwrap_or(u64::MAX);
    if new == old {
        return out;
    }
    let raising = new > old;
    match version {
        CgroupVersion::V1 => match current.memsw {
            Some(sw) => {
                let headroom = sw.saturating_sub(current.memory.unwrap_or(sw));
                let new_sw = new.saturating_add(headroom);
                if raising {
                    out.push(CgroupWrite::MemswLimit(new_sw));
                    out.push(CgroupWrite::MemoryLimit(new));
                } else {
                    out.push(CgroupWrite::MemoryLimit(new));
                    out.push(CgroupWrite::MemswLimit(new_sw));
                }
            }
            None => out.push(CgroupWrite::MemoryLimit(new)),
        },
        CgroupVersion::V2 => {
            let high = (v2_high_ratio < 1.0).then_some((new as f64 * v2_high_ratio) as u64);
            match (high, raising) {
                (Some(h), true) => {
                    out.push(CgroupWrite::MemoryLimit(new));
                    out.push(CgroupWrite::MemoryHigh(h));
                }
                (Some(h), false) => {
                    out.push(CgroupWrite::MemoryHigh(h));
                    out.push(CgroupWrite::MemoryLimit(new));
                }
                (None, _) => out.push(CgroupWrite::MemoryLimit(new)),
            }
        }
    }
    out
}

/// Simulates `plan` from `current` and checks the ordering rules after every write.
pub fn check_plan(
    version: CgroupVersion,
    current: &Limits,
    plan: &[CgroupWrite],
) -> Result<(), String> {
    let mut l = *current;
    for (i, w) in plan.iter().enumerate() {
        match w {
            CgroupWrite::CpuMax(c) => l.cpu = *c,
            CgroupWrite::MemoryLimit(v) => l.memory = Some(*v),
            CgroupWrite::MemswLimit(v) => l.memsw = Some(*v),
            CgroupWrite::MemoryHigh(v) => l.memory_high = Some(*v),
            CgroupWrite::OomKillDisable(_) => {}
        }
        let mem = l.memory.unwrap_or(u64::MAX);
        if version == CgroupVersion::V1 {
            if let Some(sw) = l.memsw {
                if sw < mem {
                    return Err(format!("step {i} {w:?}: memsw {sw} < limit {mem}"));
                }
            }
        }
        if let Some(h) = l.memory_high {
            if h > mem {
                return Err(format!(
                    "step {i} {w:?}: memory.high {h} > memory.max {mem}"
                ));
            }
        }
    }
    Ok(())
}

/// Performs the writes in order; stops at the first failure (index and error).
pub fn execute(io: &dyn CgroupIo, plan: &[CgroupWrite]) -> Result<(), (usize, CgroupError)> {
    for (i, w) in plan.iter().enumerate() {
        io.write(w).map_err(|e| (i, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(mem: u64, memsw: Option<u64>) -> Limits {
        Limits {
            cpu: CpuMax {
                quota_us: Some(50_000),
                period_us: 100_000,
            },
            memory: Some(mem),
            memsw,
            memory_high: None,
        }
    }

    #[test]
    fn v1_raise_writes_memsw_first_and_lower_writes_it_last() {
        let cur = limits(64 << 20, Some(64 << 20));
        let up = plan(CgroupVersion::V1, &cur, None, Some(256 << 20), 1.0);
        assert_eq!(
            up,
            vec![
                CgroupWrite::MemswLimit(256 << 20),
                CgroupWrite::MemoryLimit(256 << 20)
            ]
        );
        let cur = limits(256 << 20, Some(256 << 20));
        let down = plan(CgroupVersion::V1, &cur, None, Some(128 << 20), 1.0);
        assert_eq!(
            down,
            vec![
                CgroupWrite::MemoryLimit(128 << 20),
                CgroupWrite::MemswLimit(128 << 20)
            ]
        );
    }

    #[test]
    fn unchanged_values_plan_nothing() {
        let cur = limits(64 << 20, None);
        assert!(plan(CgroupVersion::V1, &cur, Some(cur.cpu), Some(64 << 20), 1.0).is_empty());
    }

    proptest! {
        #[test]
        fn every_plan_keeps_ordering_rules(
            old in 1u64..(1 << 40), new in 1u64..(1 << 40),
            headroom in proptest::option::of(0u64..(1 << 30)), v2 in any::<bool>(),
            ratio in 0.5f64..1.2,
        ) {
            let version = if v2 { CgroupVersion::V2 } else { CgroupVersion::V1 };
            let mut cur = limits(old, if v2 { None } else { headroom.map(|h| old + h) });
            if v2 && ratio < 1.0 {
                cur.memory_high = Some((old as f64 * ratio) as u64);
            }
            let p = plan(version, &cur, None, Some(new), ratio);
            prop_assert!(check_plan(version, &cur, &p).is_ok(), "{:?}", p);
            let mut end = cur;
            for w in &p {
                if let CgroupWrite::MemoryLimit(v) = w { end.memory = Some(*v) }
            }
            prop_assert_eq!(end.memory, Some(new));
        }
    }
}
