//! `Stats` for containerd: the cgroup counters as `io.containerd.cgroups.v1.Metrics`
//! (v1) or `io.containerd.cgroups.v2.Metrics` (v2).

use containerd_shim::protos::cgroups::metrics as m1;
use containerd_shim::protos::cgroups_v2::metrics as m2;
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::util::convert_to_any;

use crate::cgroup::{CgroupError, CgroupIo, CgroupVersion};

/// Errors building metrics.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("encode metrics: {0}")]
    Encode(String),
}

/// Reads the cgroup and encodes containerd's metrics message.
pub fn metrics_any(io: &dyn CgroupIo) -> Result<Any, StatsError> {
    let s = io.sample(std::time::Duration::ZERO)?;
    let l = io.limits()?;
    let x = io.stats_extra();
    let any = match io.version() {
        CgroupVersion::V1 => {
            let mut usage = m1::CPUUsage::new();
            usage.total = s.cpu_usage_ns;
            let mut thr = m1::Throttle::new();
            thr.periods = s.cpu_periods;
            thr.throttled_periods = s.cpu_throttled;
            let mut cpu = m1::CPUStat::new();
            cpu.usage = Some(usage).into();
            cpu.throttling = Some(thr).into();
            let mut entry = m1::MemoryEntry::new();
            entry.usage = s.mem_usage;
            entry.limit = l.memory.unwrap_or(u64::MAX);
            entry.failcnt = s.mem_pressure_events;
            let mut mem = m1::MemoryStat::new();
            mem.usage = Some(entry).into();
            let usage_entry = |u: u64| {
                let mut e = m1::MemoryEntry::new();
                e.usage = u;
                e
            };
            mem.kernel = x.kernel_bytes.map(usage_entry).into();
            mem.swap = x.swap_bytes.map(usage_entry).into();
            let mut met = m1::Metrics::new();
            met.cpu = Some(cpu).into();
            met.memory = Some(mem).into();
            met.memory_oom_control = x
                .oom_kills
                .map(|n| {
                    let mut o = m1::MemoryOomControl::new();
                    o.oom_kill = n;
                    o
                })
                .into();
            met.pids = x
                .processes
                .map(|n| {
                    let mut p = m1::PidsStat::new();
                    p.current = x.threads.unwrap_or(n);
                    p
                })
                .into();
            convert_to_any(Box::new(met))
        }
        CgroupVersion::V2 => {
            let mut cpu = m2::CPUStat::new();
            cpu.usage_usec = s.cpu_usage_ns / 1000;
            cpu.nr_periods = s.cpu_periods;
            cpu.nr_throttled = s.cpu_throttled;
            let mut mem = m2::MemoryStat::new();
            mem.usage = s.mem_usage;
            mem.usage_limit = l.memory.unwrap_or(u64::MAX);
            mem.kernel_stack = x.kernel_bytes.unwrap_or(0);
            mem.swap_usage = x.swap_bytes.unwrap_or(0);
            let mut met = m2::Metrics::new();
            met.cpu = Some(cpu).into();
            met.memory = Some(mem).into();
            met.memory_events = x
                .oom_kills
                .map(|n| {
                    let mut e = m2::MemoryEvents::new();
                    e.oom_kill = n;
                    e
                })
                .into();
            met.pids = x
                .processes
                .map(|n| {
                    let mut p = m2::PidsStat::new();
                    p.current = x.threads.unwrap_or(n);
                    p
                })
                .into();
            convert_to_any(Box::new(met))
        }
    };
    any.map_err(|e| StatsError::Encode(e.to_string()))
}
