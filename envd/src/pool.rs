//! The warm pool: environments created ahead of demand, so a create on a warm node costs a
//! label update and the task's patch rather than a compose, a snapshot, a container, a shim
//! and `runc create` + `start`.
//!
//! A create request's *pool key* ([`PoolKey`]) is everything that shapes its container except
//! what a claim can still give it (the task's mutation, labels, time to live, environment
//! variables): the composed image (or image reference), snapshotter, runtime, resources,
//! mounts, init and name. Per key the service keeps as many spares as creates of that key
//! asked for in the last [`Demand::WINDOW`] (a rollout's batch), at most `--pool` (0: no
//! pool). A spare is a container whose default init runs; it carries only the
//! [`POOL_LABEL`] (no service state: a restarted service deletes it) and is refilled in the
//! background once creates have been quiet for [`Demand::QUIET`]. Claiming one updates its
//! labels and applies the task's mutation through `/proc/<init>/root` (resolved inside the
//! root) while only the service's own init runs: nothing of the caller's ran on the
//! unpatched tree. A key without demand for [`Demand::IDLE`] loses its spares.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Label of a spare's container: its pool key.
pub const POOL_LABEL: &str = "io.weenv.envd.pool";

/// What a pooled environment shares with the request it serves. Pure.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolKey {
    /// `plan <image record> <groups>` or `image <reference>`.
    pub image: String,
    pub snapshotter: String,
    pub runtime: String,
    /// cpus, memory, cpu_max, memory_max, fixed.
    pub resources: (f64, i64, f64, i64, bool),
    pub mounts: Vec<String>,
    pub init: Vec<String>,
    pub name: String,
}

impl PoolKey {
    /// A short stable digest of the key (the label value and the map key).
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let r = &self.resources;
        let text = serde_json::json!([
            self.image,
            self.snapshotter,
            self.runtime,
            [r.0, r.1, r.2, r.3, r.4],
            self.mounts,
            self.init,
            self.name
        ])
        .to_string();
        hex::encode(&sha2::Sha256::digest(text.as_bytes())[..12])
    }
}

/// Creates of one key over time, and how many spares that asks for. Pure (times passed in).
#[derive(Debug, Default)]
pub struct Demand {
    asks: VecDeque<Instant>,
}

impl Demand {
    /// Creates within this window count as one batch.
    pub const WINDOW: Duration = Duration::from_secs(300);
    /// Refill only after creates of any key were quiet this long (a batch's creates and
    /// first execs go first).
    pub const QUIET: Duration = Duration::from_millis(1500);
    /// Spares of a key without a create this long are removed.
    pub const IDLE: Duration = Duration::from_secs(900);

    pub fn ask(&mut self, now: Instant) {
        self.asks.push_back(now);
        self.expire(now);
    }

    fn expire(&mut self, now: Instant) {
        while self
            .asks
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > Self::WINDOW)
        {
            self.asks.pop_front();
        }
    }

    /// Spares wanted at `now`: the creates within the window, at most `max`; none once idle.
    pub fn want(&mut self, now: Instant, max: usize) -> usize {
        self.expire(now);
        self.asks.len().min(max)
    }

    /// The last create is older than [`Demand::IDLE`] (or there was none).
    pub fn idle(&self, now: Instant) -> bool {
        self.asks
            .back()
            .is_none_or(|t| now.saturating_duration_since(*t) > Self::IDLE)
    }
}

/// How many spares to start now: up to `want`, counting those ready and those being made.
/// Pure.
pub fn to_start(want: usize, ready: usize, filling: usize) -> usize {
    want.saturating_sub(ready + filling)
}

/// The start time (`/proc/<pid>/stat` field 22) of a live (not zombie) process.
pub fn start_time(pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of a `/proc/<pid>/stat` line, `None` for a zombie or dead process. Pure.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    // the command (field 2) is in parentheses and may hold spaces: fields after its `)`
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    if matches!(f.first(), Some(&"Z") | Some(&"X") | None) {
        return None;
    }
    f.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PoolKey {
        PoolKey {
            image: "plan weenv.local/envd/plan:abc".into(),
            snapshotter: "weenv".into(),
            runtime: "io.containerd.weenv.v1".into(),
            resources: (0.5, 1 << 29, 0.0, 0, false),
            mounts: vec![],
            init: vec![],
            name: "env".into(),
        }
    }

    #[test]
    fn keys_differ_by_what_shapes_the_container() {
        let a = key();
        assert_eq!(a.digest(), key().digest());
        assert_eq!(a.digest().len(), 24);
        let mut b = key();
        b.resources.1 = 1 << 30;
        assert_ne!(a.digest(), b.digest());
        let mut c = key();
        c.mounts.push("type=bind,src=/a,dst=/b".into());
        assert_ne!(a.digest(), c.digest());
        let mut d = key();
        d.snapshotter = "overlayfs".into();
        assert_ne!(a.digest(), d.digest());
    }

    #[test]
    fn demand_is_the_batch_within_the_window_capped() {
        let t = Instant::now();
        let mut d = Demand::default();
        assert_eq!(d.want(t, 8), 0);
        assert!(d.idle(t));
        for _ in 0..32 {
            d.ask(t);
        }
        assert_eq!(d.want(t, 64), 32);
        assert_eq!(d.want(t, 8), 8);
        assert_eq!(d.want(t, 0), 0);
        assert!(!d.idle(t + Duration::from_secs(10)));
        // the batch ages out of the window; a later one counts alone
        let later = t + Demand::WINDOW + Duration::from_secs(1);
        d.ask(later);
        assert_eq!(d.want(later, 64), 1);
        assert!(d.idle(later + Demand::IDLE + Duration::from_secs(1)));
    }

    #[test]
    fn start_time_of_live_processes_only() {
        let line = "4242 (sh -c x) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 2000000 100 18446744073709551615";
        assert_eq!(parse_start_time(line), Some(987654));
        let zombie = line.replace(") S ", ") Z ");
        assert_eq!(parse_start_time(&zombie), None);
        assert_eq!(parse_start_time("garbage"), None);
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(0), None);
    }

    #[test]
    fn starts_only_what_is_missing() {
        assert_eq!(to_start(8, 0, 0), 8);
        assert_eq!(to_start(8, 3, 2), 3);
        assert_eq!(to_start(8, 8, 1), 0);
        assert_eq!(to_start(0, 2, 0), 0);
    }
}
