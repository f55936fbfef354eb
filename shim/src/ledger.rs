//! The node ledger shared by all weenv shims on a node: one JSON file under a directory
//! (default `/run/weenv/ledger/ledger.json`), every transaction under an exclusive
//! `flock` on `ledger.lock`, written to a temp file and renamed (a crash never leaves a
//! torn file). Entries are keyed by container (`<ns>/<id>`) and carry the owning shim's
//! pid and its start time; entries of dead shims are reaped by every transaction, so a
//! shim crash never leaks quota and a restarted shim never double counts.
//!
//! Accounting (CPU in millicores, memory in bytes; unlimited resources count 0):
//! - `base` is a container's request; `granted` ≥ `base` is what it may use now.
//! - scale-up may only use `capacity − reserve − Σ granted` ([`LedgerFile::headroom`]).
//! - admission may use the reserve too; when even that is short it preempts others'
//!   gains (`granted − base`, largest first). The owners see `granted` below their applied
//!   quota on their next sample and shrink at once.
//!
//! The accounting is pure ([`LedgerFile`] methods, unit-tested); [`Ledger`] adds the file.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Errors of the node ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("node ledger {path}: {source}; check that the ledger dir is writable by the shim")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("node ledger {path} is corrupt ({source}); remove it, shims rebuild it")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// CPU millicores and memory bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Res {
    pub cpu_m: u64,
    pub mem: u64,
}

impl Res {
    fn add(self, o: Res) -> Res {
        Res {
            cpu_m: self.cpu_m.saturating_add(o.cpu_m),
            mem: self.mem.saturating_add(o.mem),
        }
    }
}

/// Node capacity and the share reserved for admissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub total: Res,
    pub reserve: Res,
}

/// One container's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub shim_pid: u32,
    /// Start time of the shim process (`/proc/<pid>/stat` field 22), against pid reuse.
    pub shim_start: u64,
    pub base: Res,
    pub granted: Res,
    /// Set when an admission took quota back (unix ms), for logs.
    #[serde(default)]
    pub preempted_at_ms: Option<u64>,
}

/// The ledger's content.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LedgerFile {
    pub version: u32,
    pub entries: BTreeMap<String, Entry>,
}

/// Result of an admission.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Admission {
    /// (container, amount taken back).
    pub preempted: Vec<(String, Res)>,
    /// The base requests exceed the whole capacity even after preemption (admitted anyway).
    pub oversubscribed: bool,
}

impl LedgerFile {
    fn total_granted_except(&self, key: &str) -> Res {
        self.entries
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .fold(Res::default(), |a, (_, e)| a.add(e.granted))
    }

    /// What `key` may grow to by scale-up: capacity − reserve − others' grants (≥ own base).
    pub fn ceiling(&self, key: &str, cap: &Capacity) -> Res {
        let others = self.total_granted_except(key);
        let base = self.entries.get(key).map(|e| e.base).unwrap_or_default();
        let f = |t: u64, r: u64, o: u64, b: u64| t.saturating_sub(r).saturating_sub(o).max(b);
        Res {
            cpu_m: f(cap.total.cpu_m, cap.reserve.cpu_m, others.cpu_m, base.cpu_m),
            mem: f(cap.total.mem, cap.reserve.mem, others.mem, base.mem),
        }
    }

    /// Admits `key` with request `base`, preempting others' gains if the capacity is short.
    pub fn admit(
        &mut self,
        key: &str,
        pid: u32,
        start: u64,
        base: Res,
        cap: &Capacity,
        now_ms: u64,
    ) -> Admission {
        let mut adm = Admission::default();
        let others = self.total_granted_except(key);
        let mut need_cpu = others
            .cpu_m
            .saturating_add(base.cpu_m)
            .saturating_sub(cap.total.cpu_m);
        let mut need_mem = others
            .mem
            .saturating_add(base.mem)
            .saturating_sub(cap.total.mem);
        if need_cpu > 0 || need_mem > 0 {
            // Largest gains first.
            let mut keys: Vec<(String, u64)> = self
                .entries
                .iter()
                .filter(|(k, _)| k.as_str() != key)
                .map(|(k, e)| {
                    let g = e.granted.cpu_m.saturating_sub(e.base.cpu_m)
                        + e.granted.mem.saturating_sub(e.base.mem) / (1 << 20);
                    (k.clone(), g)
                })
                .collect();
            keys.sort_by_key(|k| std::cmp::Reverse(k.1));
            for (k, _) in keys {
                let Some(e) = self.entries.get_mut(&k) else {
                    continue;
                };
                let take_cpu = need_cpu.min(e.granted.cpu_m.saturating_sub(e.base.cpu_m));
                let take_mem = need_mem.min(e.granted.mem.saturating_sub(e.base.mem));
                if take_cpu == 0 && take_mem == 0 {
                    continue;
                }
                e.granted.cpu_m -= take_cpu;
                e.granted.mem -= take_mem;
                e.preempted_at_ms = Some(now_ms);
                need_cpu -= take_cpu;
                need_mem -= take_mem;
                adm.preempted.push((
                    k,
                    Res {
                        cpu_m: take_cpu,
                        mem: take_mem,
                    },
                ));
            }
            adm.oversubscribed = need_cpu > 0 || need_mem > 0;
        }
        self.entries.insert(
            key.to_string(),
            Entry {
                shim_pid: pid,
                shim_start: start,
                base,
                granted: base,
                preempted_at_ms: None,
            },
        );
        adm
    }

    /// Records `key`'s new quota; growth is capped at [`LedgerFile::ceiling`]. Returns
    /// what was granted (≥ base), or `None` when `key` has no entry.
    pub fn request(&mut self, key: &str, want: Res, cap: &Capacity) -> Option<Res> {
        let ceiling = self.ceiling(key, cap);
        let e = self.entries.get_mut(key)?;
        // Growth is capped at the ceiling (never below what is already granted: taking
        // back is the admission's job); shrinking is always accepted; never below base.
        let pick = |want: u64, granted: u64, base: u64, ceil: u64| {
            let v = if want > granted {
                want.min(ceil.max(granted))
            } else {
                want
            };
            v.max(base)
        };
        let g = Res {
            cpu_m: pick(want.cpu_m, e.granted.cpu_m, e.base.cpu_m, ceiling.cpu_m),
            mem: pick(want.mem, e.granted.mem, e.base.mem, ceiling.mem),
        };
        e.granted = g;
        Some(g)
    }

    /// Removes entries whose shim is gone (`alive(pid, start)` false).
    pub fn reap(&mut self, alive: impl Fn(u32, u64) -> bool) -> Vec<String> {
        let dead: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| !alive(e.shim_pid, e.shim_start))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &dead {
            self.entries.remove(k);
        }
        dead
    }
}

/// Start time of a process (`/proc/<pid>/stat` field 22), `None` if it does not exist.
pub fn process_start(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    // Fields after the comm start at field 3; starttime is field 22.
    after.split(' ').nth(19)?.parse().ok()
}

/// The ledger file under a directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Ledger {
    pub fn new(dir: impl Into<PathBuf>) -> Ledger {
        Ledger { dir: dir.into() }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("ledger.json")
    }

    fn io(&self, path: &Path) -> impl Fn(std::io::Error) -> LedgerError + '_ {
        let path = path.to_path_buf();
        move |source| LedgerError::Io {
            path: path.clone(),
            source,
        }
    }

    fn lock(&self, exclusive: bool) -> Result<Flock<File>, LedgerError> {
        std::fs::create_dir_all(&self.dir).map_err(self.io(&self.dir))?;
        let lp = self.dir.join("ledger.lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lp)
            .map_err(self.io(&lp))?;
        let op = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        // Released when the returned guard is dropped (and the file closed).
        Flock::lock(f, op).map_err(|(_, errno)| self.io(&lp)(std::io::Error::from(errno)))
    }

    fn load(&self) -> Result<LedgerFile, LedgerError> {
        let p = self.path();
        match std::fs::read(&p) {
            Ok(b) if b.is_empty() => Ok(LedgerFile {
                version: 1,
                ..Default::default()
            }),
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|source| LedgerError::Corrupt { path: p, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LedgerFile {
                version: 1,
                ..Default::default()
            }),
            Err(e) => Err(self.io(&p)(e)),
        }
    }

    fn store(&self, f: &LedgerFile) -> Result<(), LedgerError> {
        let p = self.path();
        let tmp = self
            .dir
            .join(format!("ledger.json.{}.tmp", std::process::id()));
        let body = serde_json::to_vec_pretty(f).map_err(|source| LedgerError::Corrupt {
            path: p.clone(),
            source,
        })?;
        let mut t = File::create(&tmp).map_err(self.io(&tmp))?;
        t.write_all(&body).map_err(self.io(&tmp))?;
        t.sync_all().map_err(self.io(&tmp))?;
        std::fs::rename(&tmp, &p).map_err(self.io(&p))
    }

    /// Runs `f` on the ledger under the exclusive lock (dead shims reaped first) and
    /// stores the result.
    pub fn transact<R>(&self, f: impl FnOnce(&mut LedgerFile) -> R) -> Result<R, LedgerError> {
        let _lock = self.lock(true)?;
        let mut file = self.load()?;
        file.reap(|pid, start| process_start(pid) == Some(start));
        let r = f(&mut file);
        self.store(&file)?;
        Ok(r)
    }

    /// Reads the ledger under a shared lock; entries of dead shims are left out (the next
    /// transaction removes them from the file).
    pub fn read(&self) -> Result<LedgerFile, LedgerError> {
        let _lock = self.lock(false)?;
        let mut f = self.load()?;
        f.reap(|pid, start| process_start(pid) == Some(start));
        Ok(f)
    }

    /// Admits a container owned by this shim process.
    pub fn admit(&self, key: &str, base: Res, cap: &Capacity) -> Result<Admission, LedgerError> {
        let pid = std::process::id();
        let start = process_start(pid).unwrap_or(0);
        self.transact(|f| f.admit(key, pid, start, base, cap, now_ms()))
    }

    /// Records a new quota; returns what was granted.
    pub fn request(
        &self,
        key: &str,
        want: Res,
        cap: &Capacity,
    ) -> Result<Option<Res>, LedgerError> {
        self.transact(|f| f.request(key, want, cap))
    }

    /// Removes a container's entry.
    pub fn release(&self, key: &str) -> Result<(), LedgerError> {
        self.transact(|f| {
            f.entries.remove(key);
        })
    }

    /// Modification stamp of the ledger file (cheap change detection).
    pub fn stamp(&self) -> Option<(SystemTime, u64)> {
        let m = std::fs::metadata(self.path()).ok()?;
        Some((m.modified().ok()?, m.len()))
    }
}

mod tests;
