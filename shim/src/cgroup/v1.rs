//! cgroup v1: `cpu` (`cpu.cfs_quota_us`, `cpu.cfs_period_us`, `cpu.stat`), `cpuacct`
//! (`cpuacct.usage`) and `memory` (`memory.usage_in_bytes`, `memory.stat`,
//! `memory.failcnt`, `memory.oom_control`, `memory.limit_in_bytes`,
//! `memory.memsw.limit_in_bytes`) in separate directories.

use std::path::PathBuf;
use std::time::Duration;

use super::{
    count_lines, keyed, limit_or_none, parse_u64, read, read_u64, read_u64_opt, write_file,
    CgroupError, CgroupIo, CgroupVersion, CgroupWrite, CpuMax, Files, Limits, StatsExtra,
};
use crate::policy::Sample;

/// A container's v1 cgroup directories (one per controller).
#[derive(Debug)]
pub struct V1 {
    pub cpu: PathBuf,
    pub cpuacct: PathBuf,
    pub memory: PathBuf,
    files: Files,
}

// Slots of the sampled files.
const USAGE: usize = 0;
const CPU_STAT: usize = 1;
const MEM_USAGE: usize = 2;
const MEM_STAT: usize = 3;
const FAILCNT: usize = 4;
const OOM_CONTROL: usize = 5;

impl V1 {
    pub fn new(cpu: PathBuf, cpuacct: PathBuf, memory: PathBuf) -> V1 {
        let files = Files::new(vec![
            cpuacct.join("cpuacct.usage"),
            cpu.join("cpu.stat"),
            memory.join("memory.usage_in_bytes"),
            memory.join("memory.stat"),
            memory.join("memory.failcnt"),
            memory.join("memory.oom_control"),
        ]);
        V1 {
            cpu,
            cpuacct,
            memory,
            files,
        }
    }
}

impl CgroupIo for V1 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn sample(&self, at: Duration) -> Result<Sample, CgroupError> {
        let f = &self.files;
        let cpu_usage_ns = f.read_u64(USAGE)?;
        let (cpu_periods, cpu_throttled) = f.with(CPU_STAT, |_, t| {
            Ok((
                keyed(t, "nr_periods").unwrap_or(0),
                keyed(t, "nr_throttled").unwrap_or(0),
            ))
        })?;
        let mem_usage = f.read_u64(MEM_USAGE)?;
        let inactive = f.with(MEM_STAT, |_, t| {
            Ok(keyed(t, "total_inactive_file").unwrap_or(0))
        })?;
        let failcnt = f.read_u64(FAILCNT)?;
        let (oom_kill, under_oom) = f.with(OOM_CONTROL, |_, t| {
            Ok((
                keyed(t, "oom_kill").unwrap_or(0),
                keyed(t, "under_oom").unwrap_or(0) != 0,
            ))
        })?;
        Ok(Sample {
            at,
            cpu_usage_ns,
            cpu_periods,
            cpu_throttled,
            mem_usage,
            mem_working_set: mem_usage.saturating_sub(inactive),
            mem_pressure_events: failcnt,
            oom_events: oom_kill,
            under_oom,
            mem_psi_some_avg10: None,
        })
    }

    fn limits(&self) -> Result<Limits, CgroupError> {
        let qpath = self.cpu.join("cpu.cfs_quota_us");
        let quota = read(&qpath)?;
        let quota: i64 = quota.trim().parse().map_err(|_| CgroupError::Parse {
            path: qpath.clone(),
            content: quota.clone(),
        })?;
        let period_us = read_u64(&self.cpu.join("cpu.cfs_period_us"))?;
        let memory = limit_or_none(read_u64(&self.memory.join("memory.limit_in_bytes"))?);
        let sw = self.memory.join("memory.memsw.limit_in_bytes");
        let memsw = match std::fs::read_to_string(&sw) {
            Ok(s) => limit_or_none(parse_u64(&sw, &s)?),
            Err(_) => None, // no swap accounting in this kernel
        };
        Ok(Limits {
            cpu: CpuMax {
                quota_us: (quota > 0).then_some(quota as u64),
                period_us,
            },
            memory,
            memsw,
            memory_high: None,
        })
    }

    fn write(&self, w: &CgroupWrite) -> Result<(), CgroupError> {
        match w {
            CgroupWrite::CpuMax(c) => {
                let ppath = self.cpu.join("cpu.cfs_period_us");
                if read_u64(&ppath)? != c.period_us {
                    write_file(&ppath, &c.period_us.to_string())?;
                }
                let q = c.quota_us.map(|q| q.to_string()).unwrap_or("-1".into());
                write_file(&self.cpu.join("cpu.cfs_quota_us"), &q)
            }
            CgroupWrite::MemoryLimit(v) => {
                write_file(&self.memory.join("memory.limit_in_bytes"), &v.to_string())
            }
            CgroupWrite::MemswLimit(v) => write_file(
                &self.memory.join("memory.memsw.limit_in_bytes"),
                &v.to_string(),
            ),
            CgroupWrite::OomKillDisable(b) => write_file(
                &self.memory.join("memory.oom_control"),
                if *b { "1" } else { "0" },
            ),
            CgroupWrite::MemoryHigh(_) => Err(CgroupError::Unsupported {
                write: w.clone(),
                version: "v1",
            }),
        }
    }

    fn stats_extra(&self) -> StatsExtra {
        let m = &self.memory;
        let usage = read_u64_opt(&m.join("memory.usage_in_bytes"));
        let memsw = read_u64_opt(&m.join("memory.memsw.usage_in_bytes"));
        StatsExtra {
            kernel_bytes: read_u64_opt(&m.join("memory.kmem.usage_in_bytes")),
            swap_bytes: memsw.zip(usage).map(|(sw, u)| sw.saturating_sub(u)),
            oom_kills: std::fs::read_to_string(m.join("memory.oom_control"))
                .ok()
                .and_then(|c| keyed(&c, "oom_kill")),
            processes: count_lines(&m.join("cgroup.procs")),
            threads: count_lines(&m.join("tasks")),
        }
    }
}
