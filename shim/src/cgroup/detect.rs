//! Finding a process's cgroup: parse `/proc/<pid>/cgroup` and `/proc/self/mountinfo`.
//! A process whose `memory` controller is on a v1 hierarchy is managed through v1 (this
//! machine kind mounts v1 controllers with an empty cgroup2 tree beside them); otherwise
//! the unified (`0::`) path on the cgroup2 mount is used.

use std::path::{Path, PathBuf};

use super::{v1::V1, v2::V2, CgroupError, CgroupIo};

/// The directories of one process's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupPaths {
    V1 {
        cpu: PathBuf,
        cpuacct: PathBuf,
        memory: PathBuf,
    },
    V2 {
        dir: PathBuf,
    },
}

struct Mount<'a> {
    root: &'a str,
    point: &'a str,
    fstype: &'a str,
    superopts: &'a str,
}

fn mounts(mountinfo: &str) -> Vec<Mount<'_>> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let _source = post.next()?;
            let superopts = post.next().unwrap_or("");
            Some(Mount {
                root: pre.get(3)?,
                point: pre.get(4)?,
                fstype,
                superopts,
            })
        })
        .collect()
}

fn join(m: &Mount<'_>, path: &str) -> PathBuf {
    let rel = if m.root != "/" {
        path.strip_prefix(m.root).unwrap_or(path)
    } else {
        path
    };
    Path::new(m.point).join(rel.trim_start_matches('/'))
}

/// Pure: the cgroup directories of a process from its `/proc/<pid>/cgroup` text and
/// the `mountinfo` text. `pid` is only used in errors.
pub fn detect(pid: i32, proc_cgroup: &str, mountinfo: &str) -> Result<CgroupPaths, CgroupError> {
    let ms = mounts(mountinfo);
    let v1_dir = |ctrl: &str| -> Option<PathBuf> {
        let line = proc_cgroup.lines().find(|l| {
            let mut it = l.splitn(3, ':');
            let _ = it.next();
            it.next()
                .map(|c| c.split(',').any(|x| x == ctrl))
                .unwrap_or(false)
        })?;
        let path = line.splitn(3, ':').nth(2)?;
        let m = ms
            .iter()
            .find(|m| m.fstype == "cgroup" && m.superopts.split(',').any(|o| o == ctrl))?;
        Some(join(m, path))
    };
    if let Some(memory) = v1_dir("memory") {
        let cpu = v1_dir("cpu").ok_or_else(|| CgroupError::NotFound {
            pid,
            detail: "v1 memory controller but no v1 cpu controller".into(),
        })?;
        let cpuacct = v1_dir("cpuacct").ok_or_else(|| CgroupError::NotFound {
            pid,
            detail: "v1 memory controller but no v1 cpuacct controller".into(),
        })?;
        return Ok(CgroupPaths::V1 {
            cpu,
            cpuacct,
            memory,
        });
    }
    let path = proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| CgroupError::NotFound {
            pid,
            detail: "no v1 memory controller and no unified (0::) entry".into(),
        })?;
    let m = ms
        .iter()
        .find(|m| m.fstype == "cgroup2")
        .ok_or_else(|| CgroupError::NotFound {
            pid,
            detail: "no cgroup2 mount in mountinfo".into(),
        })?;
    Ok(CgroupPaths::V2 { dir: join(m, path) })
}

/// Reads `/proc/<pid>/cgroup` and `/proc/self/mountinfo` and opens the matching
/// [`CgroupIo`].
pub fn open(pid: i32) -> Result<Box<dyn CgroupIo>, CgroupError> {
    let p = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let pc = super::read(&p)?;
    let mi = super::read(Path::new("/proc/self/mountinfo"))?;
    Ok(from_paths(detect(pid, &pc, &mi)?))
}

/// The [`CgroupIo`] for known directories (tests pass tempdirs).
pub fn from_paths(p: CgroupPaths) -> Box<dyn CgroupIo> {
    match p {
        CgroupPaths::V1 {
            cpu,
            cpuacct,
            memory,
        } => Box::new(V1::new(cpu, cpuacct, memory)),
        CgroupPaths::V2 { dir } => Box::new(V2::new(dir)),
    }
}
