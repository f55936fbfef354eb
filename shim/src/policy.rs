//! The elastic scaling policy: a pure function from cgroup samples, the current quota and
//! the thresholds to a [`Decision`]. No file reads, no clock: time is passed in.
//!
//! Rules (defaults from DESIGN.md, all in [`Policy`]):
//! - CPU: utilisation of the quota ≥ 85% or ≥ 10% of periods throttled doubles the quota;
//!   more than 80% of periods throttled quadruples it. After < 30% utilisation with < 1% throttled
//!   for a whole 10 s window (all of it after the last change) the quota halves.
//! - Memory: working set ≥ 60% of the limit, new reclaim/limit events, or PSI pressure
//!   doubles the limit; an OOM emergency (v1 `under_oom`, new OOM events, or at the
//!   ceiling a working set at the throttle line under new pressure) quadruples it.
//!   After a working set < 20% of the limit for 60 s the limit halves.
//! - Bounds: never below the initial request, never above `ceiling` (per-environment max,
//!   capped by what the node ledger can give). An OOM emergency that persists for
//!   `oom_grace` while the limit is at its ceiling yields [`Decision::terminate`].
//!
//! Only intervals that start at or after the last change of a resource are judged, so a
//! change never feeds back into the next decision through a straddling interval.

use std::time::Duration;

use serde::Serialize;

/// One reading of a container's cgroup counters (cumulative counters are raw totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Monotonic time of the reading.
    pub at: Duration,
    /// Total CPU time used, nanoseconds (v1 `cpuacct.usage`, v2 `cpu.stat usage_usec`).
    pub cpu_usage_ns: u64,
    /// CFS periods elapsed (`cpu.stat nr_periods`).
    pub cpu_periods: u64,
    /// CFS periods throttled (`cpu.stat nr_throttled`).
    pub cpu_throttled: u64,
    /// Memory charged, bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub mem_usage: u64,
    /// Usage minus inactive file cache, bytes.
    pub mem_working_set: u64,
    /// Cumulative limit-hit/reclaim events (v1 `memory.failcnt`, v2 `memory.events` high+max).
    pub mem_pressure_events: u64,
    /// Cumulative OOM events (v1 `oom_control oom_kill`, v2 `memory.events` max(oom, oom_kill)).
    pub oom_events: u64,
    /// v1 with `oom_kill_disable`: tasks are frozen at the limit right now.
    pub under_oom: bool,
    /// v2 PSI `memory.pressure` `some avg10` (percent), when present.
    pub mem_psi_some_avg10: Option<f64>,
}

/// Thresholds for CPU scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuPolicy {
    pub scale_up_utilisation: f64,
    pub scale_up_throttled: f64,
    pub severe_throttled: f64,
    pub scale_down_utilisation: f64,
    pub scale_down_throttled: f64,
    pub scale_down_window: Duration,
}

/// Thresholds for memory scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct MemPolicy {
    pub scale_up_working_set: f64,
    /// PSI `some avg10` percentage counted as pressure (v2 only).
    pub psi_some_avg10: f64,
    pub scale_down_working_set: f64,
    pub scale_down_window: Duration,
    /// How long an OOM emergency may persist at the ceiling before the task is terminated.
    pub oom_grace: Duration,
    /// At the ceiling, a working set at or above this fraction of the limit with new
    /// pressure (limit-hit/reclaim events or PSI) is an OOM emergency: nothing more can be
    /// given, and on cgroup v2 (no freeze at the limit) `memory.high` would otherwise
    /// throttle the task for as long as it takes to creep to `memory.max` and the OOM
    /// killer. The shim sets it to `memory.v2_high_ratio`, the throttle line.
    pub ceiling_working_set: f64,
}

/// All thresholds of the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub cpu: CpuPolicy,
    pub mem: MemPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            cpu: CpuPolicy {
                scale_up_utilisation: 0.85,
                scale_up_throttled: 0.10,
                severe_throttled: 0.80,
                scale_down_utilisation: 0.30,
                scale_down_throttled: 0.01,
                scale_down_window: Duration::from_secs(10),
            },
            mem: MemPolicy {
                scale_up_working_set: 0.60,
                psi_some_avg10: 10.0,
                scale_down_working_set: 0.20,
                scale_down_window: Duration::from_secs(60),
                oom_grace: Duration::from_secs(1),
                ceiling_working_set: 0.9,
            },
        }
    }
}

/// The scaled state of one resource (CPU in millicores, memory in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracked {
    pub value: u64,
    /// The container's request (OCI spec); the floor.
    pub initial: u64,
    /// The highest value allowed now (per-environment max, capped by the node ledger).
    pub ceiling: u64,
    /// When `value` last changed (or when tracking began).
    pub changed_at: Duration,
}

/// Current quota of a container; `None` for a resource that is not scaled.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Current {
    pub cpu: Option<Tracked>,
    pub mem: Option<Tracked>,
    /// Since when an OOM emergency has persisted at the ceiling.
    pub oom_at_ceiling_since: Option<Duration>,
}

/// Why a quota changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Reason {
    CpuUtilisation {
        utilisation: f64,
    },
    CpuThrottled {
        throttled: f64,
    },
    CpuSevereThrottled {
        throttled: f64,
    },
    CpuIdle,
    MemWorkingSet {
        ratio: f64,
    },
    MemPressureEvents {
        events: u64,
    },
    MemPsi {
        some_avg10: f64,
    },
    OomEmergency,
    MemIdle,
    /// The node ledger took back quota gained by scale-up for an admission.
    Preempted,
}

/// One resource change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub old: u64,
    pub new: u64,
    pub reason: Reason,
}

/// What the monitor should do after one sample.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    pub cpu: Option<Change>,
    pub mem: Option<Change>,
    /// Updated `Current::oom_at_ceiling_since`.
    pub oom_at_ceiling_since: Option<Duration>,
    /// Terminate the task: readable reason.
    pub terminate: Option<String>,
}

fn delta(a: u64, b: u64) -> u64 {
    b.saturating_sub(a)
}

fn scaled(value: u64, factor: u64, t: &Tracked) -> u64 {
    let ceiling = t.ceiling.max(t.initial);
    value.saturating_mul(factor).clamp(t.initial, ceiling)
}

/// CPU utilisation of the quota and throttled fraction over one interval.
fn cpu_interval(a: &Sample, b: &Sample, millicores: u64) -> Option<(f64, f64)> {
    let dt = b.at.checked_sub(a.at)?.as_nanos() as f64;
    if dt <= 0.0 || millicores == 0 {
        return None;
    }
    let used = delta(a.cpu_usage_ns, b.cpu_usage_ns) as f64;
    let util = used / (dt * millicores as f64 / 1000.0);
    let periods = delta(a.cpu_periods, b.cpu_periods);
    let thr = if periods == 0 {
        0.0
    } else {
        delta(a.cpu_throttled, b.cpu_throttled) as f64 / periods as f64
    };
    Some((util, thr))
}

/// Intervals (consecutive pairs) that start at or after `since`.
fn intervals_since(
    samples: &[Sample],
    since: Duration,
) -> impl Iterator<Item = (&Sample, &Sample)> {
    samples
        .windows(2)
        .filter(move |w| w[0].at >= since)
        .map(|w| (&w[0], &w[1]))
}

fn decide_cpu(samples: &[Sample], now: Duration, t: &Tracked, p: &CpuPolicy) -> Option<Change> {
    let n = samples.len();
    if n < 2 {
        return None;
    }
    let (a, b) = (&samples[n - 2], &samples[n - 1]);
    if a.at >= t.changed_at {
        let (util, thr) = cpu_interval(a, b, t.value)?;
        let up = if thr > p.severe_throttled {
            Some((4, Reason::CpuSevereThrottled { throttled: thr }))
        } else if thr >= p.scale_up_throttled {
            Some((2, Reason::CpuThrottled { throttled: thr }))
        } else if util >= p.scale_up_utilisation {
            Some((2, Reason::CpuUtilisation { utilisation: util }))
        } else {
            None
        };
        if let Some((factor, reason)) = up {
            let new = scaled(t.value, factor, t);
            if new > t.value {
                return Some(Change {
                    old: t.value,
                    new,
                    reason,
                });
            }
            return None;
        }
    }
    // Scale-down: the whole window lies after the last change and is quiet.
    let start = now.checked_sub(p.scale_down_window)?;
    if t.changed_at > start || samples[0].at > start || t.value <= t.initial {
        return None;
    }
    let quiet = intervals_since(samples, start).all(|(a, b)| {
        cpu_interval(a, b, t.value)
            .map(|(u, thr)| u < p.scale_down_utilisation && thr < p.scale_down_throttled)
            .unwrap_or(true)
    });
    if !quiet {
        return None;
    }
    let new = (t.value / 2).max(t.initial);
    (new < t.value).then_some(Change {
        old: t.value,
        new,
        reason: Reason::CpuIdle,
    })
}

/// `(emergency, change)` for memory.
fn decide_mem(
    samples: &[Sample],
    now: Duration,
    t: &Tracked,
    p: &MemPolicy,
) -> (bool, Option<Change>) {
    let Some(b) = samples.last() else {
        return (false, None);
    };
    let prev = samples.len().checked_sub(2).map(|i| &samples[i]);
    let fresh_prev = prev.filter(|a| a.at >= t.changed_at);
    let oom_new = prev.map(|a| delta(a.oom_events, b.oom_events)).unwrap_or(0);
    let limit = t.value.max(1) as f64;
    let ratio = b.mem_working_set as f64 / limit;
    let events = fresh_prev
        .map(|a| delta(a.mem_pressure_events, b.mem_pressure_events))
        .unwrap_or(0);
    let psi = b.mem_psi_some_avg10.is_some_and(|v| v >= p.psi_some_avg10);
    let at_ceiling = t.value >= t.ceiling.max(t.initial);
    let pressed_at_ceiling = at_ceiling && ratio >= p.ceiling_working_set && (events > 0 || psi);
    let emergency = b.under_oom || oom_new > 0 || pressed_at_ceiling;
    let up = if emergency {
        Some((4, Reason::OomEmergency))
    } else if ratio >= p.scale_up_working_set {
        Some((2, Reason::MemWorkingSet { ratio }))
    } else if events > 0 {
        Some((2, Reason::MemPressureEvents { events }))
    } else {
        match b.mem_psi_some_avg10 {
            Some(psi) if psi >= p.psi_some_avg10 => Some((2, Reason::MemPsi { some_avg10: psi })),
            _ => None,
        }
    };
    if let Some((factor, reason)) = up {
        let new = scaled(t.value, factor, t);
        let change = (new > t.value).then_some(Change {
            old: t.value,
            new,
            reason,
        });
        return (emergency, change);
    }
    let Some(start) = now.checked_sub(p.scale_down_window) else {
        return (false, None);
    };
    if t.changed_at > start || samples[0].at > start || t.value <= t.initial {
        return (false, None);
    }
    let quiet = samples
        .iter()
        .filter(|s| s.at >= start)
        .all(|s| (s.mem_working_set as f64) < p.scale_down_working_set * limit);
    let new = (t.value / 2).max(t.initial);
    let change = (quiet && new < t.value).then_some(Change {
        old: t.value,
        new,
        reason: Reason::MemIdle,
    });
    (false, change)
}

/// Decides the next quota from the samples (oldest first; the last is the newest), the
/// current state and the thresholds. Pure: `now` is the time of the decision.
pub fn decide(samples: &[Sample], now: Duration, current: &Current, policy: &Policy) -> Decision {
    let mut d = Decision::default();
    if let Some(t) = &current.cpu {
        d.cpu = decide_cpu(samples, now, t, &policy.cpu);
    }
    if let Some(t) = &current.mem {
        let (emergency, change) = decide_mem(samples, now, t, &policy.mem);
        d.mem = change;
        let at_ceiling = d.mem.is_none() && t.value >= t.ceiling.max(t.initial);
        if emergency && at_ceiling {
            let since = current.oom_at_ceiling_since.unwrap_or(now);
            d.oom_at_ceiling_since = Some(since);
            if now.saturating_sub(since) >= policy.mem.oom_grace {
                d.terminate = Some(format!(
                    "out of memory at the maximum memory tier: limit {} bytes reached its \
                     ceiling and the OOM emergency persisted for {} ms; raise io.weenv.memory.max \
                     or the node capacity",
                    t.value,
                    now.saturating_sub(since).as_millis()
                ));
            }
        }
    }
    d
}

mod tests;
