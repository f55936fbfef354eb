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
