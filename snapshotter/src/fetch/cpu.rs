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
//!   `max_pause_ms` at a time; a pause that reached it opens a window in which the fill runs
//!   unpaused (`min_share`, [`busy_step`]), so on a node that stays busy the fill still gets
//!   that share of the time and completes its layers within a bounded time.
//! - **Busy CPUs**: containers on a warm node read from the page cache or native trees, so no
//!   FUSE read says they run. [`watch_cpu`] samples `/proc/stat` and `/proc/self/stat` every
//!   250 ms; an interval in which other processes used at least `busy_cpu_percent` of the
//!   node's CPU time counts as a read (SCHED_IDLE alone left warm tasks 4% slower while a
//!   fill ran: network receive, cache and native-tree writes, memory bandwidth). Only the
//!   share of *other* processes counts: the daemon's own work must not hold the fill back.
//! - **No inversion**: a reader waiting for a frame a background call is fetching or decoding
//!   raises the call (see `frames.rs`): the frames still to decode are decoded at normal
//!   priority, and so is the one being decoded ([`Raisable`]: its thread is raised at once;
//!   under `SCHED_IDLE` on busy CPUs it would finish only when a CPU goes idle).
//! - **The share is CPU time too**: inside the fill's unpaused window, unless a container
//!   reads through weenv, the fill's decodes and its post-fill work run at normal priority
//!   ([`background_priority`]); at `SCHED_IDLE` a
//!   node whose CPUs stay busy gives them almost nothing, so the window's bytes arrived and
//!   waited undecoded and the layer never completed (no native tree, no passthrough).
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
    /// Percent of the time the fill runs while the node stays busy: a pause that lasted
    /// `max_pause` is followed by `max_pause * min_share / (100 - min_share)` without pauses.
    pub min_share: u32,
}

impl Default for CpuPolicy {
    fn default() -> Self {
        CpuPolicy {
            priority: CpuPriority::Idle,
            busy: Duration::from_millis(500),
            max_pause: Duration::from_millis(5000),
            min_share: 25,
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

/// The unpaused window a full pause (`max_pause`) earns: `max_pause * min_share /
/// (100 - min_share)` (the fill then has `min_share` percent of a node that stays busy;
/// zero for a share of 0, at most 9 × `max_pause` for shares of 90 and above). Pure.
pub fn busy_window(p: &CpuPolicy) -> Duration {
    let share = p.min_share.min(90);
    p.max_pause * share / (100 - share)
}

/// What a fill request does before it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyStep {
    /// Go now.
    Go,
    /// Go now: the pause reached `max_pause`; requests go unpaused until this time (since
    /// the store's start).
    GoOpening(Duration),
    /// Wait this long, then ask again.
    Wait(Duration),
}

/// The fill's next step at `now` (the last sign of busy containers at `last_busy`, `waited`
/// so far for this request, unpaused until `open_until`): inside an open window it goes;
/// else it waits as [`busy_wait`] says, and a wait that reached `max_pause` opens a window of
/// [`busy_window`]. Pure.
pub fn busy_step(
    now: Duration,
    last_busy: Duration,
    waited: Duration,
    open_until: Duration,
    p: &CpuPolicy,
) -> BusyStep {
    if now < open_until {
        return BusyStep::Go;
    }
    let w = busy_wait(now, last_busy, waited, p);
    if !w.is_zero() {
        return BusyStep::Wait(w);
    }
    let still_busy = last_busy + p.busy > now;
    match busy_window(p) {
        win if still_busy && !win.is_zero() => BusyStep::GoOpening(now + win),
        _ => BusyStep::Go,
    }
}

/// CPU time counters, in clock ticks: the node's (every CPU) and this process's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// All CPU time: user, nice, system, idle, iowait, irq, softirq, steal.
    pub total: u64,
    /// Idle and iowait time.
    pub idle: u64,
    /// This process's user and system time.
    pub own: u64,
}

impl CpuTimes {
    /// From the texts of `/proc/stat` (its aggregate `cpu` line) and `/proc/self/stat`
    /// (utime, stime: fields 14 and 15); `None` if either is malformed. Pure.
    pub fn parse(stat: &str, self_stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 5 {
            return None;
        }
        // After the command name (in parentheses, may hold spaces and parentheses) come
        // fields 3.. : utime and stime are the 12th and 13th of those.
        let rest = &self_stat[self_stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
        Some(CpuTimes {
            total: v.iter().sum(),
            idle: v[3] + v[4],
            own: tick(11)? + tick(12)?,
        })
    }

    /// Percent of the node's CPU time that other processes used from `earlier` to `self`
    /// (0 if no time passed or the counters went back). Pure.
    pub fn others_percent(&self, earlier: &CpuTimes) -> u32 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0;
        }
        let busy = total.saturating_sub(self.idle.saturating_sub(earlier.idle));
        let others = busy.saturating_sub(self.own.saturating_sub(earlier.own));
        u32::try_from(others.saturating_mul(100) / total).unwrap_or(100)
    }
}

/// Reads the node's and this process's CPU times (the kernel side of [`watch_cpu`]).
pub fn read_cpu_times() -> std::io::Result<CpuTimes> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let own = std::fs::read_to_string("/proc/self/stat")?;
    CpuTimes::parse(&stat, &own).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "unexpected /proc/stat or /proc/self/stat format",
        )
    })
}

/// Samples the CPU times every `every` and calls `note(busy)` after each interval, `busy`
/// when other processes used at least `percent` of the node's CPU time in it; stops when
/// `note` returns false (its owner is gone) or the counters cannot be read.
pub async fn watch_cpu(percent: u32, every: Duration, mut note: impl FnMut(bool) -> bool) {
    let read = || {
        read_cpu_times()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "cannot read CPU times; the fill pauses only for FUSE reads");
            })
            .ok()
    };
    let Some(mut last) = read() else { return };
    loop {
        tokio::time::sleep(every).await;
        let Some(now) = read() else { return };
        if !note(now.others_percent(&last) >= percent) {
            return;
        }
        last = now;
    }
}

/// Sets the calling thread's CPU scheduling and I/O priority (Linux: both are per thread).
pub fn set_current_thread(p: CpuPriority) -> std::io::Result<()> {
    set_thread(nix::unistd::gettid().as_raw(), p)
}

/// Sets thread `tid`'s CPU scheduling and I/O priority (a thread of this process: raising
/// another thread back to normal needs CAP_SYS_NICE, which the daemon has as root).
pub fn set_thread(tid: libc::pid_t, p: CpuPriority) -> std::io::Result<()> {
    // ioprio: class << 13 | level; class 0 = none (follow the CPU nice level), 2 = best
    // effort, 3 = idle. IOPRIO_WHO_PROCESS = 1 with a thread id = that thread.
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    let (policy, nice, ioprio): (libc::c_int, libc::c_int, libc::c_long) = match p {
        CpuPriority::Normal => (libc::SCHED_OTHER, 0, 0),
        CpuPriority::Low => (libc::SCHED_OTHER, 19, (2 << 13) | 7),
        CpuPriority::Idle => (libc::SCHED_IDLE, 19, 3 << 13),
    };
    let param = libc::sched_param { sched_priority: 0 };
    // Raw libc: nix does not wrap sched_setscheduler, per-thread setpriority or ioprio_set.
    // SAFETY: `param` is a valid sched_param for the duration of the call; a thread id is a
    // pid to these calls; the other calls take plain integers.
    let rc = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: plain integers; PRIO_PROCESS with a thread id sets that thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: plain integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            libc::c_long::from(tid),
            ioprio,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The priority of a background call's decode, verification and cache writes at `now`:
/// normal inside the fill's unpaused window (`open_until`, see [`busy_step`]: the minimum
/// share of a busy node is CPU time too, and under `SCHED_IDLE` a node whose CPUs stay busy
/// gives the fill's decode almost none of it, so the window's bytes would arrive and wait
/// undecoded) unless a FUSE read came within `busy` (`last_read`: a container is starting
/// on lazy layers and needs the CPUs more than the fill), else the policy's. Pure.
pub fn background_priority(
    now: Duration,
    open_until: Duration,
    last_read: Duration,
    p: &CpuPolicy,
) -> CpuPriority {
    let reading = last_read + p.busy > now;
    if now < open_until && !reading {
        CpuPriority::Normal
    } else {
        p.priority
    }
}

/// Threads doing one background call's CPU work at a lowered priority, which a reader that
/// starts waiting for that call raises back to normal at once — the frame being decoded too,
/// not only the ones after it (under `SCHED_IDLE` on a node whose CPUs are busy, a decode
/// already started would otherwise finish only when a CPU goes idle, and the reader with it).
#[derive(Debug, Default)]
pub struct Raisable {
    state: parking_lot::Mutex<RaiseState>,
}

#[derive(Debug, Default)]
struct RaiseState {
    raised: bool,
    threads: Vec<libc::pid_t>,
}

impl Raisable {
    /// True once [`Self::raise`] was called.
    pub fn raised(&self) -> bool {
        self.state.lock().raised
    }

    /// Runs `f` on the calling thread at `p` (normal once raised, also while `f` runs).
    pub fn run<T>(&self, p: CpuPriority, f: impl FnOnce() -> T) -> T {
        let tid = nix::unistd::gettid().as_raw();
        let low = {
            // Lowered under the lock: a raise either sees this thread or came before.
            let mut st = self.state.lock();
            if st.raised || p == CpuPriority::Normal {
                None
            } else {
                st.threads.push(tid);
                Some(Lowered::enter(p))
            }
        };
        let out = f();
        if low.is_some() {
            self.state.lock().threads.retain(|t| *t != tid);
        }
        drop(low); // normal again (a no-op if raised meanwhile)
        out
    }

    /// From now on this call's work runs at normal priority, the threads doing it now too.
    pub fn raise(&self) {
        let mut st = self.state.lock();
        st.raised = true;
        for tid in &st.threads {
            if let Err(e) = set_thread(*tid, CpuPriority::Normal) {
                warn_once(&e);
            }
        }
    }
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

    const STAT: &str = "cpu  100 5 50 800 20 3 2 0 7 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n";

    #[test]
    fn cpu_times_parse_the_proc_files() {
        // The command name may hold spaces and parentheses.
        let own = "4242 (weenv snap (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 30 12 0 0 20 0 9";
        let t = CpuTimes::parse(STAT, own).unwrap();
        assert_eq!(
            t,
            CpuTimes {
                total: 980,
                idle: 820,
                own: 42
            }
        );
        assert_eq!(CpuTimes::parse("intr 1 2\n", own), None);
        assert_eq!(CpuTimes::parse(STAT, "4242 (x) S 1"), None);
        assert_eq!(CpuTimes::parse("cpu  1 x 3 4 5\n", own), None);
    }

    #[test]
    fn only_other_processes_count_as_busy() {
        let a = CpuTimes {
            total: 1000,
            idle: 800,
            own: 10,
        };
        // 200 ticks passed: 50 idle, 150 busy, 30 of them this process's.
        let b = CpuTimes {
            total: 1200,
            idle: 850,
            own: 40,
        };
        assert_eq!(b.others_percent(&a), 60);
        // Only the daemon worked: not busy.
        let c = CpuTimes {
            total: 1200,
            idle: 850,
            own: 160,
        };
        assert_eq!(c.others_percent(&a), 0);
        // No time passed, or counters that went back (a new process): 0.
        assert_eq!(a.others_percent(&a), 0);
        assert_eq!(a.others_percent(&b), 0);
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn busy_wait_waits_for_quiet_reads_but_not_forever() {
        let p = CpuPolicy {
            priority: CpuPriority::Idle,
            busy: MS(500),
            max_pause: MS(5000),
            min_share: 25,
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
    fn a_full_pause_opens_a_window_that_gives_the_fill_its_share() {
        let mut p = CpuPolicy {
            priority: CpuPriority::Idle,
            busy: MS(500),
            max_pause: MS(6000),
            min_share: 25,
        };
        assert_eq!(busy_window(&p), MS(2000), "25% of 6 + 2 s");
        // Busy (a read 100 ms ago), waited 1 s: wait for quiet.
        assert_eq!(
            busy_step(MS(10_000), MS(9900), MS(1000), MS(0), &p),
            BusyStep::Wait(MS(400))
        );
        // Waited the whole pause and still busy: go, and stay unpaused for 2 s.
        assert_eq!(
            busy_step(MS(10_000), MS(9900), MS(6000), MS(0), &p),
            BusyStep::GoOpening(MS(12_000))
        );
        // Inside the window every request goes at once, however busy.
        assert_eq!(
            busy_step(MS(11_000), MS(11_000), MS(0), MS(12_000), &p),
            BusyStep::Go
        );
        // After it, pauses again.
        assert_eq!(
            busy_step(MS(12_000), MS(12_000), MS(0), MS(12_000), &p),
            BusyStep::Wait(MS(500))
        );
        // Quiet: go, no window needed.
        assert_eq!(
            busy_step(MS(20_000), MS(1000), MS(0), MS(0), &p),
            BusyStep::Go
        );
        // Share 0: the old behaviour (one request per full pause).
        p.min_share = 0;
        assert_eq!(
            busy_step(MS(10_000), MS(9900), MS(6000), MS(0), &p),
            BusyStep::Go
        );
        // Shares are capped at 90%: the fill still pauses a tenth of the time.
        p.min_share = 100;
        assert_eq!(busy_window(&p), MS(54_000));
    }

    #[test]
    fn the_fill_window_decodes_at_normal_priority() {
        let p = CpuPolicy::default();
        assert_eq!(p.priority, CpuPriority::Idle);
        // In the window, the last read long ago (busy CPUs only): normal.
        assert_eq!(
            background_priority(MS(10_000), MS(11_000), MS(1000), &p),
            CpuPriority::Normal
        );
        // In the window while a container reads through weenv (a cold start): the policy's.
        assert_eq!(
            background_priority(MS(10_000), MS(11_000), MS(9800), &p),
            CpuPriority::Idle
        );
        // Exactly `busy` after the last read: not reading any more.
        assert_eq!(
            background_priority(MS(10_000), MS(11_000), MS(9500), &p),
            CpuPriority::Normal
        );
        // Outside the window: the policy's.
        assert_eq!(
            background_priority(MS(11_000), MS(11_000), MS(0), &p),
            CpuPriority::Idle
        );
        let low = CpuPolicy {
            priority: CpuPriority::Low,
            ..p
        };
        assert_eq!(
            background_priority(MS(5000), MS(0), MS(0), &low),
            CpuPriority::Low
        );
    }

    #[test]
    fn a_raise_returns_a_running_decode_to_normal_priority() {
        let root = nix::unistd::geteuid().is_root();
        let r = std::sync::Arc::new(Raisable::default());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            r2.run(CpuPriority::Idle, || {
                // SAFETY: pid 0 = the calling thread.
                let before = unsafe { libc::sched_getscheduler(0) };
                started_tx.send(before).unwrap(); // ok: test code
                go_rx.recv().unwrap(); // ok: test code
                                       // SAFETY: as above.
                unsafe { libc::sched_getscheduler(0) }
            })
        });
        assert_eq!(started_rx.recv().unwrap(), libc::SCHED_IDLE); // ok: test code
        r.raise();
        go_tx.send(()).unwrap(); // ok: test code
        let after = t.join().unwrap(); // ok: test code
        if root {
            assert_eq!(after, libc::SCHED_OTHER, "raised while it ran");
        }
        assert!(r.raised());
        // After a raise, new work runs at normal priority from the start.
        let now = std::thread::spawn(move || {
            r.run(CpuPriority::Idle, || {
                // SAFETY: pid 0 = the calling thread.
                unsafe { libc::sched_getscheduler(0) }
            })
        })
        .join()
        .unwrap(); // ok: test code
        assert_eq!(now, libc::SCHED_OTHER);
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
