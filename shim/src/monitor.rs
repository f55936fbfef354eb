//! The per-container elastic loop: every interval read a sample, notice preemption by the
//! node ledger, [`decide`], ask the ledger for growth, plan and apply the cgroup writes,
//! record every change. A decision to terminate is handed back to the caller (the task
//! service kills the task and reports the reason).
//!
//! Resources without a limit in the OCI spec (no CFS quota / no memory limit) are not
//! scaled: there is nothing to raise. The initial request is the limit runc applied from
//! the spec; the quota never goes below it.

use std::collections::VecDeque;
use std::time::Duration;

use tracing::{info, warn};

use crate::apply::{check_plan, execute, plan};
use crate::cgroup::{CgroupError, CgroupIo, CgroupVersion, CgroupWrite, CpuMax, Limits};
use crate::config::ShimConfig;
use crate::ledger::{Capacity, Ledger, LedgerError, LedgerFile, Res};
use crate::policy::{decide, Change, Current, Policy, Reason, Sample, Tracked};
use crate::status::{boot_ms, unix_ms, ChangeRecord, StatusDir};

/// Errors of the elastic monitor.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("cgroup plan {plan:?} violates an ordering rule: {rule}")]
    Plan {
        plan: Vec<CgroupWrite>,
        rule: String,
    },
    #[error("cgroup write {index} of {plan:?} failed: {source}")]
    Apply {
        plan: Vec<CgroupWrite>,
        index: usize,
        source: CgroupError,
    },
}

/// What one round ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Continue,
    Terminate(String),
}

/// Node capacity from the config (0 = detect).
pub fn node_capacity(cfg: &ShimConfig) -> Capacity {
    let cpu = if cfg.node.cpu_millicores > 0 {
        cfg.node.cpu_millicores
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get() as u64 * 1000)
            .unwrap_or(1000)
    };
    let mem = if cfg.node.memory_bytes > 0 {
        cfg.node.memory_bytes
    } else {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| crate::cgroup::keyed(&m.replace(':', ""), "MemTotal"))
            .map(|kb| kb * 1024)
            .unwrap_or(u64::MAX / 2)
    };
    let f = cfg.node.reserve_fraction;
    Capacity {
        total: Res { cpu_m: cpu, mem },
        reserve: Res {
            cpu_m: (cpu as f64 * f) as u64,
            mem: (mem as f64 * f) as u64,
        },
    }
}

/// One container's elastic state.
pub struct Monitor {
    key: String,
    io: Box<dyn CgroupIo>,
    policy: Policy,
    cfg: ShimConfig,
    ledger: Ledger,
    capacity: Capacity,
    status: StatusDir,
    period_us: u64,
    current: Current,
    samples: VecDeque<Sample>,
    keep: Duration,
    ledger_stamp: Option<(std::time::SystemTime, u64)>,
    ledger_cache: LedgerFile,
    started: Duration,
    /// OOM events seen so far / not yet reported.
    oom_seen: Option<u64>,
    oom_new: bool,
    oom_total: u64,
    /// OOM events the kernel reported while the memory limit was at its ceiling.
    oom_at_ceiling: u64,
}

impl Monitor {
    /// Reads the initial limits, admits the container into the node ledger (preempting
    /// others' gains if needed) and, on v1 with `v1_freeze_on_oom`, makes the memory
    /// cgroup freeze instead of OOM-kill at the limit.
    pub fn new(
        key: String,
        io: Box<dyn CgroupIo>,
        cfg: ShimConfig,
        status: StatusDir,
        now: Duration,
    ) -> Result<Monitor, MonitorError> {
        let limits = io.limits()?;
        let capacity = node_capacity(&cfg);
        let ledger = Ledger::new(&cfg.node.ledger_dir);
        let cpu_m = limits.cpu.millicores();
        let base = Res {
            cpu_m: cpu_m.unwrap_or(0),
            mem: limits.memory.unwrap_or(0),
        };
        let adm = ledger.admit(&key, base, &capacity)?;
        for (k, r) in &adm.preempted {
            info!(container = %key, preempted = %k, cpu_m = r.cpu_m, mem = r.mem, "admission preempted scale-up gains");
        }
        if adm.oversubscribed {
            warn!(container = %key, "node capacity is oversubscribed by base requests; admitted anyway");
        }
        let elastic = cfg.monitor.elastic;
        let track = |v: Option<u64>, on: bool, max: u64| {
            v.filter(|_| elastic && on).map(|v| Tracked {
                value: v,
                initial: v,
                ceiling: max.max(v),
                changed_at: now,
            })
        };
        let current = Current {
            cpu: track(cpu_m, cfg.cpu.elastic, cfg.cpu_max_millicores()),
            mem: track(limits.memory, cfg.memory.elastic, cfg.memory.max_bytes),
            oom_at_ceiling_since: None,
        };
        if current.mem.is_some() && io.version() == CgroupVersion::V1 && cfg.memory.v1_freeze_on_oom
        {
            io.write(&CgroupWrite::OomKillDisable(true))?;
        }
        // v2 has no freeze: throttle with memory.high below memory.max so pressure shows
        // (memory.events high, PSI) before the OOM killer acts.
        if let (Some(t), CgroupVersion::V2) = (current.mem, io.version()) {
            if cfg.memory.v2_high_ratio < 1.0 {
                let high = (t.value as f64 * cfg.memory.v2_high_ratio) as u64;
                io.write(&CgroupWrite::MemoryHigh(high))?;
            }
        }
        let keep = cfg
            .policy()
            .cpu
            .scale_down_window
            .max(cfg.policy().mem.scale_down_window)
            + Duration::from_millis(cfg.monitor.interval_ms * 2);
        Ok(Monitor {
            key,
            io,
            policy: cfg.policy(),
            ledger,
            capacity,
            status,
            period_us: limits.cpu.period_us,
            current,
            samples: VecDeque::new(),
            keep,
            ledger_stamp: None,
            ledger_cache: LedgerFile::default(),
            started: now,
            oom_seen: None,
            oom_new: false,
            oom_total: 0,
            oom_at_ceiling: 0,
            cfg,
        })
    }

    pub fn current(&self) -> &Current {
        &self.current
    }
    pub fn io(&self) -> &dyn CgroupIo {
        self.io.as_ref()
    }
    pub fn is_elastic(&self) -> bool {
        self.current.cpu.is_some() || self.current.mem.is_some()
    }

    /// Samples once more (at exit) and reports whether new OOM events appeared.
    pub fn final_oom_check(&mut self, now: Duration) -> bool {
        if let Ok(s) = self.io.sample(now) {
            self.note_oom(s.oom_events);
        }
        self.take_new_oom()
    }

    fn note_oom(&mut self, events: u64) {
        if let Some(n) = self.oom_seen.filter(|n| events > *n) {
            self.oom_new = true;
            self.oom_total += events - n;
            if self
                .current
                .mem
                .is_some_and(|t| t.value >= t.ceiling.max(t.initial))
            {
                self.oom_at_ceiling += events - n;
            }
        }
        self.oom_seen = Some(events);
    }

    /// The readable reason when the kernel's OOM killer acted while the elastic memory
    /// limit was at its ceiling (the top tier): on cgroup v2, which has no freeze at the
    /// limit, the kernel can end the task before the shim's grace ends. Same cause as a
    /// shim termination, so it is reported the same way (the caller sets the exit status).
    pub fn oom_at_max_reason(&self) -> Option<String> {
        let t = self.current.mem?;
        (self.oom_at_ceiling > 0).then(|| {
            format!(
                "out of memory at the maximum memory tier: limit {} bytes reached its ceiling \
                 and the kernel OOM-killed {} process(es) there (cgroup {}: no freeze at the \
                 limit); raise io.weenv.memory.max or the node capacity",
                t.value,
                self.oom_at_ceiling,
                self.io.version().as_str()
            )
        })
    }

    /// OOM events the kernel reported since the monitor started.
    pub fn oom_total(&self) -> u64 {
        self.oom_total
    }

    /// True once after the kernel reported new OOM events (for a `/tasks/oom` event).
    pub fn take_new_oom(&mut self) -> bool {
        std::mem::take(&mut self.oom_new)
    }

    /// Removes this container from the node ledger.
    pub fn release(&self) {
        if let Err(e) = self.ledger.release(&self.key) {
            warn!(container = %self.key, error = %e, "release from node ledger");
        }
    }

    /// Re-reads the limits after an `update` from containerd: they become the new request.
    pub fn rebase(&mut self, now: Duration) -> Result<(), MonitorError> {
        let l = self.io.limits()?;
        self.period_us = l.cpu.period_us;
        let r = |t: &mut Option<Tracked>, v: Option<u64>| match (t.as_mut(), v) {
            (Some(t), Some(v)) => {
                t.value = v;
                t.initial = v;
                t.changed_at = now;
            }
            _ => *t = None,
        };
        r(&mut self.current.cpu, l.cpu.millicores());
        r(&mut self.current.mem, l.memory);
        let want = self.want();
        self.ledger.transact(|f| {
            if let Some(e) = f.entries.get_mut(&self.key) {
                e.base = want;
                e.granted = want;
            }
        })?;
        Ok(())
    }

    fn want(&self) -> Res {
        Res {
            cpu_m: self.current.cpu.map(|t| t.value).unwrap_or(0),
            mem: self.current.mem.map(|t| t.value).unwrap_or(0),
        }
    }

    fn refresh_ledger(&mut self) -> Result<(), MonitorError> {
        let stamp = self.ledger.stamp();
        if stamp != self.ledger_stamp || stamp.is_none() {
            self.ledger_cache = self.ledger.read()?;
            self.ledger_stamp = stamp;
        }
        Ok(())
    }

    /// One sample-decide-apply round at monotonic time `now`.
    pub fn round(&mut self, now: Duration) -> Result<Outcome, MonitorError> {
        let s = self.io.sample(now)?;
        self.note_oom(s.oom_events);
        self.samples.push_back(s);
        while self.samples.len() > 2 && now.saturating_sub(self.samples[0].at) > self.keep {
            self.samples.pop_front();
        }
        if !self.is_elastic() {
            return Ok(Outcome::Continue);
        }
        self.refresh_ledger()?;
        // Preemption: the ledger granted less than we hold; shrink now.
        if let Some(e) = self.ledger_cache.entries.get(&self.key).cloned() {
            let mut changes = (None, None);
            if let Some(t) = self.current.cpu {
                if e.granted.cpu_m < t.value {
                    changes.0 = Some(Change {
                        old: t.value,
                        new: e.granted.cpu_m.max(t.initial),
                        reason: Reason::Preempted,
                    });
                }
            }
            let mut hold_mem = None;
            if let Some(t) = self.current.mem {
                if e.granted.mem < t.value {
                    // Memory in use cannot be taken back (v1 refuses a limit below usage
                    // with EBUSY after reclaiming): shrink only down to what keeps the
                    // working set under the scale-up threshold, and tell the ledger.
                    let ws = self.samples.back().map(|s| s.mem_working_set).unwrap_or(0);
                    let needed = (ws as f64 / self.policy.mem.scale_up_working_set) as u64;
                    let new = e.granted.mem.max(t.initial).max(needed.min(t.value));
                    if new < t.value {
                        changes.1 = Some(Change {
                            old: t.value,
                            new,
                            reason: Reason::Preempted,
                        });
                    }
                    if new > e.granted.mem {
                        hold_mem = Some(new);
                    }
                }
            }
            if changes.0.is_some() || changes.1.is_some() {
                self.apply(now, changes.0, changes.1)?;
            }
            if let Some(held) = hold_mem {
                warn!(container = %self.key, held, granted = e.granted.mem, "memory in use exceeds the preempted grant; holding it");
                self.ledger.transact(|f| {
                    if let Some(e) = f.entries.get_mut(&self.key) {
                        e.granted.mem = held;
                    }
                })?;
            }
        }
        let ceiling = self.ledger_cache.ceiling(&self.key, &self.capacity);
        if let Some(t) = self.current.cpu.as_mut() {
            t.ceiling = self
                .cfg
                .cpu_max_millicores()
                .min(ceiling.cpu_m)
                .max(t.initial);
        }
        if let Some(t) = self.current.mem.as_mut() {
            t.ceiling = self.cfg.memory.max_bytes.min(ceiling.mem).max(t.initial);
        }
        let d = decide(
            self.samples.make_contiguous(),
            now,
            &self.current,
            &self.policy,
        );
        self.current.oom_at_ceiling_since = d.oom_at_ceiling_since;
        if d.cpu.is_some() || d.mem.is_some() {
            let want = Res {
                cpu_m: d.cpu.as_ref().map(|c| c.new).unwrap_or(self.want().cpu_m),
                mem: d.mem.as_ref().map(|c| c.new).unwrap_or(self.want().mem),
            };
            let granted = self
                .ledger
                .request(&self.key, want, &self.capacity)?
                .unwrap_or(want);
            let fix = |c: Option<Change>, g: u64| {
                c.map(|mut c| {
                    c.new = g;
                    c
                })
                .filter(|c| c.new != c.old)
            };
            let cpu = fix(d.cpu, granted.cpu_m);
            let mem = fix(d.mem, granted.mem);
            self.apply(now, cpu, mem)?;
        }
        Ok(match d.terminate {
            Some(r) => Outcome::Terminate(r),
            None => Outcome::Continue,
        })
    }

    fn apply(
        &mut self,
        now: Duration,
        cpu: Option<Change>,
        mem: Option<Change>,
    ) -> Result<(), MonitorError> {
        if cpu.is_none() && mem.is_none() {
            return Ok(());
        }
        let limits: Limits = self.io.limits()?;
        let cpu_max = cpu.as_ref().map(|c| CpuMax {
            quota_us: Some((c.new.saturating_mul(self.period_us) / 1000).max(1000)),
            period_us: self.period_us,
        });
        let p = plan(
            self.io.version(),
            &limits,
            cpu_max,
            mem.as_ref().map(|c| c.new),
            self.cfg.memory.v2_high_ratio,
        );
        check_plan(self.io.version(), &limits, &p).map_err(|rule| MonitorError::Plan {
            plan: p.clone(),
            rule,
        })?;
        execute(self.io.as_ref(), &p).map_err(|(index, source)| MonitorError::Apply {
            plan: p.clone(),
            index,
            source,
        })?;
        let t0 = self.started;
        for (res, ch, tracked) in [
            ("cpu", &cpu, &mut self.current.cpu),
            ("memory", &mem, &mut self.current.mem),
        ] {
            let (Some(c), Some(t)) = (ch, tracked.as_mut()) else {
                continue;
            };
            t.value = c.new;
            t.changed_at = now;
            info!(container = %self.key, resource = res, old = c.old, new = c.new, reason = ?c.reason, "quota changed");
            let rec = ChangeRecord {
                t_ms: now.saturating_sub(t0).as_millis() as u64,
                unix_ms: unix_ms(),
                boot_ms: boot_ms(),
                resource: res,
                old: c.old,
                new: c.new,
                reason: &c.reason,
            };
            if let Err(e) = self.status.record(&rec) {
                warn!(error = %e, "record quota change");
            }
        }
        Ok(())
    }
}

mod tests;
