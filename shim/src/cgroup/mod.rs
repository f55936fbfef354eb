//! Cgroup I/O behind the narrow [`CgroupIo`] trait: read a [`Sample`](crate::policy::Sample)
//! and the current limits, perform one [`CgroupWrite`]. Two implementations with injected
//! directories: [`v1::V1`] (separate `cpu`, `cpuacct`, `memory` hierarchies) and
//! [`v2::V2`] (one unified directory). [`detect`] finds which one a process is in from
//! `/proc/<pid>/cgroup` and `/proc/self/mountinfo` text (pure parsing).

pub mod detect;
pub mod v1;
pub mod v2;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::policy::Sample;

pub use detect::{detect, from_paths, open, CgroupPaths};

/// Errors of cgroup I/O.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("read cgroup file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write {value:?} to cgroup file {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error("parse cgroup file {path}: unexpected content {content:?}")]
    Parse { path: PathBuf, content: String },
    #[error("{write:?} is not supported on cgroup {version}")]
    Unsupported {
        write: CgroupWrite,
        version: &'static str,
    },
    #[error("cannot find the cgroup of pid {pid}: {detail}")]
    NotFound { pid: i32, detail: String },
}

/// Cgroup version of a container's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// CFS bandwidth: `quota_us` per `period_us`; `None` quota = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CpuMax {
    pub quota_us: Option<u64>,
    pub period_us: u64,
}

impl CpuMax {
    /// Quota in millicores (`None` when unlimited).
    pub fn millicores(&self) -> Option<u64> {
        self.quota_us
            .map(|q| q.saturating_mul(1000) / self.period_us.max(1))
    }
}

/// Limits read from the cgroup. `None` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub cpu: CpuMax,
    pub memory: Option<u64>,
    /// v1 `memory.memsw.limit_in_bytes` (None: unlimited or no swap accounting; v2: None).
    pub memsw: Option<u64>,
    /// v2 `memory.high` (None: max or v1).
    pub memory_high: Option<u64>,
}

/// One write to a cgroup file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum CgroupWrite {
    /// v1 `cpu.cfs_quota_us` (+ `cpu.cfs_period_us` first if it differs), v2 `cpu.max`.
    CpuMax(CpuMax),
    /// v1 `memory.limit_in_bytes`, v2 `memory.max`.
    MemoryLimit(u64),
    /// v1 `memory.memsw.limit_in_bytes` (must stay ≥ the memory limit).
    MemswLimit(u64),
    /// v2 `memory.high`.
    MemoryHigh(u64),
    /// v1 `memory.oom_control`: freeze instead of OOM-kill at the limit.
    OomKillDisable(bool),
}

/// Counters reported to containerd's `Stats` only (not sampled by the monitor); each `None`
/// when the kernel does not offer it here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsExtra {
    /// Kernel memory charged to the cgroup (v1 `memory.kmem.usage_in_bytes`, v2
    /// `memory.stat` `kernel`, else `kernel_stack`).
    pub kernel_bytes: Option<u64>,
    /// Swap in use (v1 `memsw` usage minus memory usage, v2 `memory.swap.current`).
    pub swap_bytes: Option<u64>,
    /// OOM kills in the cgroup (v1 `memory.oom_control` `oom_kill`, v2 `memory.events`).
    pub oom_kills: Option<u64>,
    /// Processes and threads (`cgroup.procs`, v1 `tasks` / v2 `cgroup.threads` lines).
    pub processes: Option<u64>,
    pub threads: Option<u64>,
}

/// Lines of a cgroup list file (`cgroup.procs`, `tasks`); `None` if it cannot be read.
pub(crate) fn count_lines(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.lines().filter(|l| !l.trim().is_empty()).count() as u64)
}

/// A `u64` file; `None` if it is missing or not a number.
pub(crate) fn read_u64_opt(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Reads and writes one container's cgroup.
pub trait CgroupIo: Send + Sync {
    fn version(&self) -> CgroupVersion;
    /// Reads all counters; `at` is stamped into the sample.
    fn sample(&self, at: Duration) -> Result<Sample, CgroupError>;
    fn limits(&self) -> Result<Limits, CgroupError>;
    fn write(&self, write: &CgroupWrite) -> Result<(), CgroupError>;
    /// The counters only `Stats` reports (read on demand, not per sample).
    fn stats_extra(&self) -> StatsExtra {
        StatsExtra::default()
    }
}

/// A fixed set of cgroup files kept open and re-read with `pread(0)` into one reused
/// buffer (saves the path walk, open/close and allocation of every sample; cgroup seq
/// files restart at offset 0).
#[derive(Debug)]
pub(crate) struct Files {
    paths: Vec<PathBuf>,
    state: std::sync::Mutex<(Vec<Option<std::fs::File>>, Vec<u8>)>,
}

impl Files {
    pub(crate) fn new(paths: Vec<PathBuf>) -> Files {
        let n = paths.len();
        Files {
            paths,
            state: std::sync::Mutex::new(((0..n).map(|_| None).collect(), Vec::new())),
        }
    }

    /// Reads file `i` and hands its text to `f`.
    pub(crate) fn with<T>(
        &self,
        i: usize,
        f: impl FnOnce(&Path, &str) -> Result<T, CgroupError>,
    ) -> Result<T, CgroupError> {
        use std::os::unix::fs::FileExt;
        let path = &self.paths[i];
        let err = |source| CgroupError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (files, buf) = &mut *guard;
        if files[i].is_none() {
            files[i] = Some(std::fs::File::open(path).map_err(err)?);
        }
        let Some(file) = files[i].as_ref() else {
            return f(path, &read(path)?);
        };
        // Kernel fact: cgroup files are single-record seq files; one read with room to
        // spare returns the whole text, so a short read ends the loop (no extra syscall).
        if buf.is_empty() {
            buf.extend(std::iter::repeat_n(0u8, 8192));
        }
        let mut len = 0;
        loop {
            let n = file.read_at(&mut buf[len..], len as u64).map_err(err)?;
            len += n;
            if n == 0 || len < buf.len() {
                break;
            }
            let grow = buf.len();
            buf.extend(std::iter::repeat_n(0u8, grow));
        }
        let buf = &buf[..len];
        let text = std::str::from_utf8(buf).map_err(|_| CgroupError::Parse {
            path: path.to_path_buf(),
            content: "<not utf-8>".into(),
        })?;
        f(path, text)
    }

    pub(crate) fn read_u64(&self, i: usize) -> Result<u64, CgroupError> {
        self.with(i, parse_u64)
    }
}

pub(crate) fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

pub(crate) fn parse_u64(path: &Path, s: &str) -> Result<u64, CgroupError> {
    s.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        content: s.chars().take(64).collect(),
    })
}

pub(crate) fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    parse_u64(path, &read(path)?)
}

/// Value of `key` in a flat-keyed file (`key value` per line).
pub(crate) fn keyed(content: &str, key: &str) -> Option<u64> {
    content.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == key).then(|| it.next()?.parse().ok())?
    })
}

/// Unlimited values: v1 reports a huge page-aligned number for "no limit".
pub(crate) fn limit_or_none(v: u64) -> Option<u64> {
    (v < (1u64 << 62)).then_some(v)
}

mod tests;
