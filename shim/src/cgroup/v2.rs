//! cgroup v2: one directory with `cpu.stat` (`usage_usec`, `nr_periods`, `nr_throttled`),
//! `cpu.max` (`"<quota|max> <period>"`; the kernel default is `max 100000`),
//! `memory.current`, `memory.stat` (`inactive_file`), `memory.events` (`high`, `max`,
//! `oom`, `oom_kill`), `memory.pressure` (PSI), `memory.max`, `memory.high`.

use std::path::PathBuf;
use std::time::Duration;

use super::{
    count_lines, keyed, read, read_u64_opt, write_file, CgroupError, CgroupIo, CgroupVersion,
    CgroupWrite, CpuMax, Files, Limits, StatsExtra,
};
use crate::policy::Sample;

/// A container's v2 cgroup directory.
#[derive(Debug)]
pub struct V2 {
    pub dir: PathBuf,
    files: Files,
}

const CPU_STAT: usize = 0;
const MEM_CURRENT: usize = 1;
const MEM_STAT: usize = 2;
const MEM_EVENTS: usize = 3;
const MEM_PRESSURE: usize = 4;

impl V2 {
    pub fn new(dir: PathBuf) -> V2 {
        let files = Files::new(
            [
                "cpu.stat",
                "memory.current",
                "memory.stat",
                "memory.events",
                "memory.pressure",
            ]
            .iter()
            .map(|n| dir.join(n))
            .collect(),
        );
        V2 { dir, files }
    }
}

fn max_or(path: &std::path::Path, s: &str) -> Result<Option<u64>, CgroupError> {
    let s = s.trim();
    if s == "max" {
        return Ok(None);
    }
    super::parse_u64(path, s).map(Some)
}

/// `some avg10=` of a PSI file.
fn psi_some_avg10(content: &str) -> Option<f64> {
    let line = content.lines().find(|l| l.starts_with("some "))?;
    let v = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))?;
    v.parse().ok()
}

impl CgroupIo for V2 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn sample(&self, at: Duration) -> Result<Sample, CgroupError> {
        let f = &self.files;
        let (usage_usec, cpu_periods, cpu_throttled) = f.with(CPU_STAT, |_, t| {
            Ok((
                keyed(t, "usage_usec").unwrap_or(0),
                keyed(t, "nr_periods").unwrap_or(0),
                keyed(t, "nr_throttled").unwrap_or(0),
            ))
        })?;
        let mem_usage = f.read_u64(MEM_CURRENT)?;
        let inactive = f.with(MEM_STAT, |_, t| Ok(keyed(t, "inactive_file").unwrap_or(0)))?;
        let (high, max, oom) = f.with(MEM_EVENTS, |_, t| {
            let ev = |k| keyed(t, k).unwrap_or(0);
            // One kernel OOM kill counts in both `oom` (the charge failed) and `oom_kill`
            // (a process was killed): their sum would count it twice.
            Ok((ev("high"), ev("max"), ev("oom").max(ev("oom_kill"))))
        })?;
        // PSI is optional (kernel without CONFIG_PSI or psi=0).
        let psi = f
            .with(MEM_PRESSURE, |_, t| Ok(psi_some_avg10(t)))
            .ok()
            .flatten();
        Ok(Sample {
            at,
            cpu_usage_ns: usage_usec.saturating_mul(1000),
            cpu_periods,
            cpu_throttled,
            mem_usage,
            mem_working_set: mem_usage.saturating_sub(inactive),
            mem_pressure_events: high + max,
            oom_events: oom,
            under_oom: false,
            mem_psi_some_avg10: psi,
        })
    }

    fn limits(&self) -> Result<Limits, CgroupError> {
        let cpath = self.dir.join("cpu.max");
        let cmax = read(&cpath)?;
        let mut it = cmax.split_whitespace();
        let quota_us = max_or(&cpath, it.next().unwrap_or("max"))?;
        let period_us = match it.next() {
            Some(p) => super::parse_u64(&cpath, p)?,
            None => 100_000,
        };
        let mpath = self.dir.join("memory.max");
        let memory = max_or(&mpath, &read(&mpath)?)?;
        let hpath = self.dir.join("memory.high");
        let memory_high = max_or(&hpath, &read(&hpath)?)?;
        Ok(Limits {
            cpu: CpuMax {
                quota_us,
                period_us,
            },
            memory,
            memsw: None,
            memory_high,
        })
    }

    fn write(&self, w: &CgroupWrite) -> Result<(), CgroupError> {
        match w {
            CgroupWrite::CpuMax(c) => {
                let q = c.quota_us.map(|q| q.to_string()).unwrap_or("max".into());
                write_file(&self.dir.join("cpu.max"), &format!("{q} {}", c.period_us))
            }
            CgroupWrite::MemoryLimit(v) => write_file(&self.dir.join("memory.max"), &v.to_string()),
            CgroupWrite::MemoryHigh(v) => write_file(&self.dir.join("memory.high"), &v.to_string()),
            CgroupWrite::MemswLimit(_) | CgroupWrite::OomKillDisable(_) => {
                Err(CgroupError::Unsupported {
                    write: w.clone(),
                    version: "v2",
                })
            }
        }
    }

    fn stats_extra(&self) -> StatsExtra {
        let d = &self.dir;
        let stat = std::fs::read_to_string(d.join("memory.stat")).ok();
        StatsExtra {
            kernel_bytes: stat
                .as_deref()
                .and_then(|c| keyed(c, "kernel").or_else(|| keyed(c, "kernel_stack"))),
            swap_bytes: read_u64_opt(&d.join("memory.swap.current")),
            oom_kills: std::fs::read_to_string(d.join("memory.events"))
                .ok()
                .and_then(|c| keyed(&c, "oom_kill")),
            processes: count_lines(&d.join("cgroup.procs")),
            threads: count_lines(&d.join("cgroup.threads")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn psi_parses_some_avg10() {
        let c = "some avg10=12.50 avg60=1.00 avg300=0.00 total=1\nfull avg10=3.00 avg60=0 avg300=0 total=0\n";
        assert_eq!(super::psi_some_avg10(c), Some(12.5));
    }
}
