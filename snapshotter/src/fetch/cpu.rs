//! Background CPU and disk work below the node's containers: the fill's frame decompression,
//! verification and disk-cache writes, and the post-fill work (completion check, native tree,
//! complete-file copies) run on threads lowered to [`CpuPriority`] for their duration, and
//! the fill pauses while the node's containers read through weenv.
//!
//! Choices (documented in the snapshotter README, "Background work yields"):
//! - **CPU**: the kernel decides best when the CPUs are busy, so the work is not throttled by
//!   sampling load: it runs under `SCHED_IDLE` (default, [`CpuPriority::Idle`]: a CPU runs it
//!   only when no normal task wants that CPU) or nice 19 ([`CpuPriority::Low`]). Pressure
//!   sampling (`/proc/pressure/cpu`) would count the fill's own waiting and, on a shared node,
//!   is rarely low (95% `some` on the 2-core build machine): the fill would never run.
//! - **Disk**: the same threads get I/O priority class idle (`Idle`) or best-effort level 7
//!   (`Low`) with `ioprio_set`; the kernel honours it only with the BFQ I/O scheduler, and
//!   buffered writes are written back by the kernel's flusher threads at their own priority.
//! - **Busy pause**: before each fill request, the fill waits until no FUSE read came for
//!   `busy_ms` ([`busy_wait`], pure; the daemon sees every read of a lazy layer), at most
//!   `max_pause_ms` at a time (then one request goes: throttled, not starved).
//! - **No inversion**: a reader waiting for a frame a background call is fetching or decoding
//!   raises the call (see `frames.rs`): the frames still to decode are decoded at normal
//!   priority.
//!
//! The kernel calls are [`set_current_thread`] (one narrow function); [`Lowered`] applies a
//! priority for a scope and restores normal priority on drop.

use std::time::Duration;
pub use weenv_snapshotter_api::config::CpuPriority;

/// How the fill yields the node's CPUs and disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPolicy {
    /// Priority of background decode/verify/disk work.
    pub priority: CpuPriority,
    /// The fill waits until no FUSE read came for this long.
    pub busy: Duration,
    /// Longest single pause of the fill while reads keep coming.
    pub max_pause: Duration,
}

impl Default for CpuPolicy {
    fn default() -> Self {
        CpuPolicy {
            priority: CpuPriority::Idle,
            busy: Duration::from_millis(500),
            max_pause: Duration::from_millis(5000),
        }
    }
}

/// How long the fill still waits at `now`, the last FUSE read at `last_read`, having waited
/// `waited` so far: until `busy` passed without a read, but no longer than `max_pause` in
/// all (zero: go now). Pure.
pub fn busy_wait(now: Duration, last_read: Duration, waited: Duration, p: &CpuPolicy) -> Duration {
    let quiet_left = (last_read + p.busy).saturating_sub(now);
    quiet_left.min(p.max_pause.saturating_sub(waited))
}

/// Sets the calling thread's CPU scheduling and I/O priority (Linux: both are per thread).
pub fn set_current_thread(p: CpuPriority) -> std::io::Result<()> {
    // ioprio: class << 13 | level; class 0 = none (follow the CPU nice level), 2 = best
    // effort, 3 = idle. IOPRIO_WHO_PROCESS = 1 with id 0 = the calling thread.
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    let (policy, nice, ioprio): (libc::c_int, libc::c_int, libc::c_long) = match p {
        CpuPriority::Normal => (libc::SCHED_OTHER, 0, 0),
        CpuPriority::Low => (libc::SCHED_OTHER, 19, (2 << 13) | 7),
        CpuPriority::Idle => (libc::SCHED_IDLE, 19, 3 << 13),
    };
    let param = libc::sched_param { sched_priority: 0 };
    let tid = nix::unistd::gettid().as_raw();
    // Raw libc: nix does not wrap sched_setscheduler, per-thread setpriority or ioprio_set.
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is the
    // calling thread; the other calls take plain integers.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: plain integers; PRIO_PROCESS with a thread id sets that thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: plain integers.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, ioprio) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread at a priority for a scope; normal again on drop. A failure is logged
/// once per thread and the work runs at the thread's priority.
pub struct Lowered(bool);

impl Lowered {
    /// Lowers the calling thread to `p` (nothing for [`CpuPriority::Normal`]).
    pub fn enter(p: CpuPriority) -> Self {
        if p == CpuPriority::Normal {
            return Lowered(false);
        }
        match set_current_thread(p) {
            Ok(()) => Lowered(true),
            Err(e) => {
                warn_once(&e);
                Lowered(false)
            }
        }
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        if self.0 {
            if let Err(e) = set_current_thread(CpuPriority::Normal) {
                warn_once(&e);
            }
        }
    }
}

fn warn_once(e: &std::io::Error) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(error = %e, "cannot change a background thread's CPU/I/O priority (needs CAP_SYS_NICE to restore it); background work runs at normal priority");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn busy_wait_waits_for_quiet_reads_but_not_forever() {
        let p = CpuPolicy {
            priority: CpuPriority::Idle,
            busy: MS(500),
            max_pause: MS(5000),
        };
        assert_eq!(busy_wait(MS(10_000), MS(1000), MS(0), &p), MS(0), "quiet");
        assert_eq!(busy_wait(MS(10_000), MS(9800), MS(0), &p), MS(300));
        assert_eq!(busy_wait(MS(10_000), MS(9800), MS(4900), &p), MS(100));
        assert_eq!(
            busy_wait(MS(10_000), MS(10_000), MS(5000), &p),
            MS(0),
            "paused max_pause: one request goes"
        );
    }

    #[test]
    fn a_thread_is_lowered_for_a_scope() {
        let root = nix::unistd::geteuid().is_root();
        std::thread::spawn(move || {
            let sched = || {
                // SAFETY: pid 0 = the calling thread.
                unsafe { libc::sched_getscheduler(0) }
            };
            {
                let _l = Lowered::enter(CpuPriority::Idle);
                assert_eq!(sched(), libc::SCHED_IDLE);
            }
            // Back to SCHED_OTHER needs CAP_SYS_NICE (the daemon runs as root).
            if root {
                assert_eq!(sched(), libc::SCHED_OTHER);
                let _l = Lowered::enter(CpuPriority::Low);
                assert_eq!(sched(), libc::SCHED_OTHER);
                let tid = nix::unistd::gettid().as_raw() as libc::id_t;
                // SAFETY: plain integers.
                let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
                assert_eq!(nice, 19);
            }
        })
        .join()
        .unwrap();
    }
}
