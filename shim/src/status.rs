//! Per-container status for users and tests, under a status dir (default
//! `/run/weenv/status/<namespace>/<id>/`), kept after the container is deleted:
//! - `status.json`: state, cgroup version, current quota, and when the shim ended the task
//!   the readable reason and the exit status it reported;
//! - `changes.jsonl`: one line per quota change (time, resource, old, new, reason).
//!
//! Show it with `containerd-shim-weenv-v1 status <namespace>/<id>` or `cat` the file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;

use crate::policy::Reason;

/// Default status directory.
pub const DEFAULT_STATUS_DIR: &str = "/run/weenv/status";

/// Errors writing status files.
#[derive(Debug, thiserror::Error)]
#[error("write weenv status file {path}: {source}")]
pub struct StatusError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// `status.json`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Status {
    pub namespace: String,
    pub id: String,
    /// `running`, `exited`, `terminated` (the shim killed it; see `reason`).
    pub state: String,
    pub cgroup: Option<String>,
    pub elastic: bool,
    pub cpu_millicores: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub exit_status: Option<u32>,
    pub reason: Option<String>,
    pub updated_unix_ms: u64,
}

/// One line of `changes.jsonl`.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeRecord<'a> {
    /// Milliseconds since the monitor started.
    pub t_ms: u64,
    pub unix_ms: u64,
    /// CLOCK_BOOTTIME in ms: comparable with `/proc/uptime` read inside a container.
    pub boot_ms: u64,
    /// `cpu` (millicores) or `memory` (bytes).
    pub resource: &'a str,
    pub old: u64,
    pub new: u64,
    pub reason: &'a Reason,
}

/// CLOCK_BOOTTIME in milliseconds (what `/proc/uptime` shows).
pub fn boot_ms() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(ts) => ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000,
        Err(_) => 0,
    }
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The status files of one container.
#[derive(Debug, Clone)]
pub struct StatusDir {
    dir: PathBuf,
}

impl StatusDir {
    /// `<root>/<namespace>/<id>`.
    pub fn new(root: &Path, namespace: &str, id: &str) -> StatusDir {
        StatusDir {
            dir: root.join(namespace).join(id),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn status_path(&self) -> PathBuf {
        self.dir.join("status.json")
    }
    pub fn changes_path(&self) -> PathBuf {
        self.dir.join("changes.jsonl")
    }

    fn err(&self, path: PathBuf) -> impl FnOnce(std::io::Error) -> StatusError {
        move |source| StatusError { path, source }
    }

    /// Starts fresh files for a new container of this id.
    pub fn reset(&self) -> Result<(), StatusError> {
        std::fs::create_dir_all(&self.dir).map_err(self.err(self.dir.clone()))?;
        let _ = std::fs::remove_file(self.changes_path());
        let _ = std::fs::remove_file(self.status_path());
        Ok(())
    }

    /// Writes `status.json` atomically.
    pub fn write(&self, s: &Status) -> Result<(), StatusError> {
        let p = self.status_path();
        std::fs::create_dir_all(&self.dir).map_err(self.err(self.dir.clone()))?;
        let tmp = self.dir.join("status.json.tmp");
        let mut s = s.clone();
        s.updated_unix_ms = unix_ms();
        let body = serde_json::to_vec_pretty(&s).unwrap_or_default();
        std::fs::write(&tmp, body).map_err(self.err(tmp.clone()))?;
        std::fs::rename(&tmp, &p).map_err(self.err(p))
    }

    /// Appends one change record.
    pub fn record(&self, r: &ChangeRecord<'_>) -> Result<(), StatusError> {
        let p = self.changes_path();
        std::fs::create_dir_all(&self.dir).map_err(self.err(self.dir.clone()))?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .map_err(self.err(p.clone()))?;
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        f.write_all(&line).map_err(self.err(p))
    }
}

/// `status <ns>/<id> [dir]`: prints status.json and the change log; returns an exit code.
pub fn print_status(args: &[String]) -> i32 {
    let Some(key) = args.first() else {
        eprintln!("usage: containerd-shim-weenv-v1 status <namespace>/<id> [status-dir]");
        return 2;
    };
    let root = args
        .get(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATUS_DIR));
    let dir = root.join(key);
    match std::fs::read_to_string(dir.join("status.json")) {
        Ok(s) => println!("{s}"),
        Err(e) => {
            eprintln!("no weenv status for {key} under {}: {e}", root.display());
            return 1;
        }
    }
    if let Ok(c) = std::fs::read_to_string(dir.join("changes.jsonl")) {
        println!("quota changes:\n{c}");
    }
    0
}
