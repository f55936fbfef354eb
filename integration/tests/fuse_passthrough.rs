//! After the background fill, complete files are opened with FUSE passthrough: reads no
//! longer reach the FUSE read handler. Also covers concurrent opens of one inode (one shared
//! BackingId) and overlay copy-up from a passthrough file.

mod fuse_common;

use anyhow::{ensure, Context, Result};
use fuse_common::*;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weenv_snapshotter::fetch::FillConfig;
use weenv_snapshotter::metrics::FuseOp;

#[test]
#[ignore = "needs root and /dev/fuse"]
fn filled_files_are_passed_through() -> Result<()> {
    let fill = FillConfig {
        dir_prefetch_frames: 0,
        read_ahead_bytes: 0,
        ..FillConfig::default()
    };
    let fx = Fixture::new(fill, true)?;
    ensure!(
        fx.store.passthrough_active(),
        "kernel 6.9+ with FUSE passthrough expected here"
    );
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let dir = fx.add(&layer)?;
    fx.wait_fill(Duration::from_secs(120))?;
    let st = fx.store.status();
    ensure!(st[0].frames_cached == st[0].frames_total, "{st:?}");
    let reads_before = fx.metrics.fuse_op_count(FuseOp::Read);
    let want = std::fs::read("/bin/busybox")?;
    // Two opens at once share one backing id; both read the whole file.
    let (a, b) = std::thread::scope(|s| {
        let h1 = s.spawn(|| std::fs::read(dir.join("usr/bin/busybox")));
        let h2 = s.spawn(|| std::fs::read(dir.join("usr/bin/sh")));
        (h1.join(), h2.join())
    });
    let a = a
        .map_err(|_| anyhow::anyhow!("panic"))?
        .context("reading busybox")?;
    let b = b
        .map_err(|_| anyhow::anyhow!("panic"))?
        .context("reading sh")?;
    ensure!(a == want && b == want, "content through passthrough");
    let big = std::fs::read(dir.join("opt/deep/nested/big.bin")).context("reading big.bin")?;
    ensure!(big == noise(7, 5 << 20));
    let reads_after = fx.metrics.fuse_op_count(FuseOp::Read);
    let pt = fx.metrics.passthrough_opens.load(Ordering::Relaxed);
    println!(
        "passthrough opens {pt}; FUSE read requests during the reads: {}",
        reads_after - reads_before
    );
    ensure!(pt >= 2, "passthrough opens: {pt}");
    ensure!(
        reads_after == reads_before,
        "FUSE read handler was called {} times",
        reads_after - reads_before
    );

    // Overlay copy-up from a passthrough lower.
    let merged = fx.dir.path().join("merged");
    let _ov = mount_overlay(
        std::slice::from_ref(&dir),
        &fx.dir.path().join("ovl"),
        &merged,
    )?;
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(merged.join("usr/bin/busybox"))?;
        f.write_all(b"x")?;
    }
    let mut w2 = want.clone();
    w2.push(b'x');
    ensure!(
        std::fs::read(merged.join("usr/bin/busybox"))? == w2,
        "copy-up from passthrough file"
    );
    Ok(())
}

/// The kernel fixes an inode's io mode while it is open: a file opened (cached) before it was
/// complete must keep being opened cached until that open is released, then passthrough.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn open_modes_never_conflict() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), true)?;
    ensure!(fx.store.passthrough_active());
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let dir = fx.add(&layer)?;
    let p = dir.join("opt/deep/nested/big.bin");
    let want = noise(7, 5 << 20);
    let first = std::fs::File::open(&p).context("first open (incomplete: cached)")?;
    let mut v = Vec::new();
    {
        use std::io::Read;
        (&first).read_to_end(&mut v)?;
    }
    ensure!(v == want);
    // All frames are on disk now, but a cached open is live: the second open must be cached.
    let second = std::fs::read(&p).context("second open while a cached open is live")?;
    ensure!(second == want);
    ensure!(fx.metrics.passthrough_opens.load(Ordering::Relaxed) == 0);
    drop(first);
    // FUSE_RELEASE reaches the daemon asynchronously after close(); until it does, opens are
    // (correctly) still answered cached. Retry until one passes through.
    for _ in 0..200 {
        let again = std::fs::read(&p).context("open after the cached one is released")?;
        ensure!(again == want);
        if fx.metrics.passthrough_opens.load(Ordering::Relaxed) > 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("no open passed through after the cached open was released")
}
