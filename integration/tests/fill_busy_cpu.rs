//! The background fill pauses while other processes keep the node's CPUs busy
//! (`fill.busy_cpu_percent`): containers on a warm node read from the page cache or native
//! trees, so no FUSE read tells the daemon they run. It resumes once the CPUs are free.

mod fuse_common;

use anyhow::{ensure, Context, Result};
use fuse_common::*;
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::time::Duration;
use weenv_snapshotter::fetch::{CpuPriority, FillConfig, FillState};
use weenv_snapshotter::metrics::FuseOp;

/// The tests load every CPU: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Busy loops in other processes, one per CPU; killed on drop.
struct Burners(Vec<Child>);

impl Burners {
    fn start() -> Result<Self> {
        let n = std::thread::available_parallelism()?.get();
        let mut b = Burners(Vec::new());
        for _ in 0..n {
            b.0.push(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .context("starting a busy loop")?,
            );
        }
        Ok(b)
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The fill of these tests: at once (no quiet time), one pause for the whole busy period
/// (the default lets a request go every 5 s), at normal priority (under SCHED_IDLE the fill's
/// decoding would starve on fully busy CPUs whatever the pause does).
fn fill(busy_cpu_percent: u32) -> FillConfig {
    FillConfig {
        quiet_ms: 0,
        busy_max_pause_ms: 120_000,
        busy_cpu_percent,
        native: false,
        cpu_priority: CpuPriority::Normal,
        read_ahead_bytes: 0,
        dir_prefetch_frames: 0,
        ..FillConfig::default()
    }
}

/// Every CPU busy in other processes, then a layer added with [`fill`]`(busy_cpu_percent)`.
fn fill_under_load(busy_cpu_percent: u32) -> Result<(Fixture, Burners)> {
    let burners = Burners::start()?;
    let fx = Fixture::new(fill(busy_cpu_percent), false)?;
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    fx.add(&layer)?;
    Ok((fx, burners))
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn the_fill_waits_while_other_processes_keep_the_cpus_busy() -> Result<()> {
    ensure!(
        FillConfig::default().busy_cpu_percent == 50,
        "default busy_cpu_percent"
    );
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fx, burners) = fill_under_load(50)?;
    std::thread::sleep(Duration::from_secs(3));
    let st = fx.store.status();
    let busy = fx.metrics.cpu_busy_intervals.load(Ordering::Relaxed);
    ensure!(busy >= 4, "busy CPU intervals seen: {busy}");
    ensure!(
        st[0].fill != FillState::Done && st[0].frames_cached == 0,
        "the fill went on while the CPUs were busy: {st:?}"
    );
    drop(burners);
    fx.wait_fill(Duration::from_secs(60))?;
    let st = fx.store.status();
    ensure!(st[0].frames_cached == st[0].frames_total, "{st:?}");
    Ok(())
}

/// `busy_cpu_percent = 0`: the CPU signal is off, the fill runs whatever the load.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn with_the_cpu_signal_off_the_fill_runs_under_load() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fx, _burners) = fill_under_load(0)?;
    fx.wait_fill(Duration::from_secs(60))?;
    ensure!(fx.metrics.cpu_busy_intervals.load(Ordering::Relaxed) == 0);
    Ok(())
}

/// Reads every file under `dir` (recursively); returns how many.
fn read_tree(dir: &std::path::Path) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        let md = std::fs::symlink_metadata(&p)?;
        if md.is_dir() {
            n += read_tree(&p)?;
        } else if md.is_file() {
            std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Drops the kernel's cached pages of every file under `dir`, so that the next read reaches
/// the daemon (as a new container's first read of a file the page cache no longer holds).
fn drop_pages(dir: &std::path::Path) -> Result<()> {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let md = std::fs::symlink_metadata(&p)?;
        if md.is_dir() {
            drop_pages(&p)?;
        } else if md.is_file() {
            let f = std::fs::File::open(&p)?;
            posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
                .with_context(|| format!("fadvise {}", p.display()))?;
        }
    }
    Ok(())
}

/// The next task on a node right after the first, while the fill is paused by busy CPUs:
/// every byte the first task read is served from the node (the daemon's disk cache), none is
/// fetched again; a file the first did not read is fetched (the count works).
#[test]
#[ignore = "needs root and /dev/fuse"]
fn a_task_right_after_fetches_nothing_the_first_task_read() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let burners = Burners::start()?;
    let fx = Fixture::new(fill(50), false)?;
    let layer = TestLayer::with_frames(fx.dir.path(), "rich", &rich_tar()?, 64 << 10)?;
    let root = fx.add(&layer)?;
    let json = root.join("usr/lib/python3/json");
    let reads = |fx: &Fixture| fx.metrics.fuse_op_count(FuseOp::Read);

    // Task 1: reads the json package; what it read crosses the link once.
    let n = read_tree(&json)?;
    let first = layer.source.bytes();
    ensure!(n > 3 && first > 0, "task 1 read {n} files, {first} bytes");

    // Task 2, right after (the fill still paused): the same files, their pages gone.
    drop_pages(&json)?;
    let (bytes0, reads0) = (layer.source.bytes(), reads(&fx));
    let demand0 = fx.metrics.bytes_fetched_on_demand.load(Ordering::Relaxed);
    read_tree(&json)?;
    ensure!(
        reads(&fx) > reads0,
        "task 2's reads did not reach the daemon (the test would not see a refetch)"
    );
    let refetched = layer.source.bytes() - bytes0;
    let demand = fx.metrics.bytes_fetched_on_demand.load(Ordering::Relaxed) - demand0;
    ensure!(
        refetched == 0 && demand == 0,
        "task 2 fetched {refetched} bytes ({demand} on demand) that task 1 had read"
    );
    let st = fx.store.status();
    ensure!(
        st[0].fill != FillState::Done && st[0].bytes_filled == 0,
        "the fill was not paused, so the case is not the one tested: {st:?}"
    );

    // A package task 1 did not read is fetched: the counters see fetches.
    read_tree(&root.join("usr/lib/python3/email"))?;
    ensure!(
        layer.source.bytes() > bytes0,
        "the email package came from nowhere"
    );
    drop(burners);
    Ok(())
}

/// On a node whose CPUs stay busy, the fill still gets its minimum share
/// (`fill.busy_min_share_percent`): after each full pause a window without pauses, so the
/// layer completes; with the share at 0 no window opens.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn a_busy_node_still_completes_its_fill() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let with_share = |share: u32| FillConfig {
        busy_max_pause_ms: 500,
        busy_min_share_percent: share,
        batch_bytes: 64 << 10,
        ..fill(50)
    };
    let _burners = Burners::start()?;
    let fx = Fixture::new(with_share(50), false)?;
    let layer = TestLayer::with_frames(fx.dir.path(), "rich", &rich_tar()?, 64 << 10)?;
    fx.add(&layer)?;
    fx.wait_fill(Duration::from_secs(120))?;
    let windows = fx.metrics.fill_share_windows.load(Ordering::Relaxed);
    let busy = fx.metrics.cpu_busy_intervals.load(Ordering::Relaxed);
    ensure!(
        windows > 0 && busy > 0,
        "the fill completed without a share window ({windows}) under load ({busy} busy intervals)"
    );
    drop(fx);

    let fx = Fixture::new(with_share(0), false)?;
    let layer = TestLayer::with_frames(fx.dir.path(), "rich", &rich_tar()?, 64 << 10)?;
    fx.add(&layer)?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(
        fx.metrics.fill_share_windows.load(Ordering::Relaxed) == 0,
        "a share of 0 opened a window"
    );
    Ok(())
}
