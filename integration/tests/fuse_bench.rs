//! Micro-benchmark (prints numbers, asserts only correctness): warm sequential and random
//! read throughput through weenv (with and without passthrough) vs the same files on local
//! disk. "Warm" = every frame in the node cache (after the fill). Two page-cache states:
//! "dropped" (POSIX_FADV_DONTNEED on the file and the passthrough backing files before each
//! run) and "hot" (file read once before each run). Medians of 5 runs.
//! Run: `cargo test -p weenv-integration --test fuse_bench -- --ignored --nocapture`

mod fuse_common;

use anyhow::{ensure, Result};
use fuse_common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use weenv_snapshotter::fetch::FillConfig;

const BIG: usize = 64 << 20;
const RUNS: usize = 5;
const RANDOM_READS: usize = 4000;

fn drop_cache(p: &Path) -> Result<()> {
    let f = std::fs::File::open(p)?;
    // Only drops clean page cache; a failure just leaves it warm.
    let _ = nix::fcntl::posix_fadvise(
        &f,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    Ok(())
}

fn drop_dir_cache(d: &Path) -> Result<()> {
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                drop_dir_cache(&p)?;
            } else {
                drop_cache(&p)?;
            }
        }
    }
    Ok(())
}

fn seq(p: &Path) -> Result<f64> {
    let f = std::fs::File::open(p)?;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    ensure!(off as usize == BIG);
    Ok(BIG as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn random(p: &Path) -> Result<f64> {
    let f = std::fs::File::open(p)?;
    let mut buf = vec![0u8; 4096];
    let mut x = 88172645463325252u64;
    let t = Instant::now();
    for _ in 0..RANDOM_READS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % (BIG as u64 / 4096)) * 4096;
        f.read_exact_at(&mut buf, off)?;
    }
    Ok(RANDOM_READS as f64 / t.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn measure(
    p: &Path,
    extra: &[&Path],
    f: fn(&Path) -> Result<f64>,
    cold_page_cache: bool,
) -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..RUNS {
        if cold_page_cache {
            drop_cache(p)?;
            for d in extra {
                drop_dir_cache(d)?;
            }
        } else {
            f(p)?; // make sure the page cache is hot
        }
        v.push(f(p)?);
    }
    Ok(median(v))
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn warm_read_throughput() -> Result<()> {
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "big.bin", &noise(11, BIG), 0o644, 0, 0)?;
    let tar = b.into_inner()?;
    let mut rows = Vec::new();
    for passthrough in [true, false] {
        let fill = FillConfig::default();
        let fx = Fixture::new(fill, passthrough)?;
        let layer = TestLayer::new(fx.dir.path(), "bench", &tar)?;
        let dir = fx.add(&layer)?;
        fx.wait_fill(Duration::from_secs(300))?;
        let local = fx.dir.path().join("local.bin");
        std::fs::write(&local, noise(11, BIG))?;
        std::fs::File::open(&local)?.sync_all()?; // dirty pages would survive FADV_DONTNEED
        let cache_files = fx.dir.path().join("cache/files");
        let weenv = dir.join("big.bin");
        ensure!(
            std::fs::read(&weenv)? == std::fs::read(&local)?,
            "same content"
        );
        for cold in [true, false] {
            let s_w = measure(&weenv, &[&cache_files], seq, cold)?;
            let s_l = measure(&local, &[], seq, cold)?;
            let r_w = measure(&weenv, &[&cache_files], random, cold)?;
            let r_l = measure(&local, &[], random, cold)?;
            rows.push(format!(
                "passthrough={passthrough:<5} (active={}) page cache {}: sequential weenv {s_w:.0} MB/s vs local {s_l:.0} MB/s (ratio {:.2}); random 4K weenv {r_w:.0} reads/s vs local {r_l:.0} reads/s (ratio {:.2})",
                fx.store.passthrough_active(), if cold { "dropped" } else { "hot" }, s_w / s_l, r_w / r_l
            ));
        }
    }
    for r in rows {
        println!("BENCH {r}");
    }
    Ok(())
}

/// Justifies one FUSE session for all layers: the cost of exposing one more layer as a new
/// session (mount(2) + INIT + worker threads, and its unmount) vs as a directory of the
/// existing session (`add_layer`).
#[test]
#[ignore = "needs root and /dev/fuse"]
fn one_session_vs_session_per_layer() -> Result<()> {
    const SESSIONS: usize = 10;
    const LAYERS: usize = 200;
    let fx = Fixture::new(Fixture::strict(), false)?;
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "etc/hello", b"hello\n", 0o644, 0, 0)?;
    let layer = TestLayer::new(fx.dir.path(), "tiny", &b.into_inner()?)?;
    let t = Instant::now();
    for i in 0..SESSIONS {
        let cfg = weenv_snapshotter::layers::LayerStoreConfig {
            mountpoint: fx.dir.path().join(format!("m{i}")),
            plain_mountpoint: None,
            cache_dir: fx.dir.path().join(format!("c{i}")),
            memory_cache_bytes: 1 << 20,
            disk_cache_bytes: 1 << 20,
            fill: Fixture::strict(),
            fuse_threads: 2,
            passthrough: false,
        };
        let s = weenv_snapshotter::layers::LayerStore::start(
            cfg,
            fx.rt.handle().clone(),
            fx.metrics.clone(),
        )?;
        let p = s.add_layer(&layer.digest, (*layer.toc).clone(), layer.dyn_source())?;
        ensure!(std::fs::read(p.join("etc/hello"))? == b"hello\n");
        s.shutdown();
    }
    let per_session = t.elapsed() / SESSIONS as u32;
    let t = Instant::now();
    for i in 0..LAYERS {
        let d = weenv_format::Digest::sha256(format!("layer{i}").as_bytes());
        let p = fx
            .store
            .add_layer(&d, (*layer.toc).clone(), layer.dyn_source())?;
        ensure!(std::fs::read(p.join("etc/hello"))? == b"hello\n");
    }
    let per_layer = t.elapsed() / LAYERS as u32;
    println!(
        "BENCH new FUSE session per layer (mount+INIT+2 threads+first read+unmount): {per_session:?}; \
         layer in the shared session (add_layer+first read): {per_layer:?}"
    );
    Ok(())
}

/// Cold reads (nothing cached) from a local blob: the cost of fetch + decompress + verify +
/// cache per frame, without network. Read-ahead on (default) vs off.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn cold_read_throughput_local_source() -> Result<()> {
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "big.bin", &noise(5, BIG), 0o644, 0, 0)?;
    let tar = b.into_inner()?;
    for ra in [8u64 << 20, 0] {
        let fill = FillConfig {
            enabled: false,
            read_ahead_bytes: ra,
            ..FillConfig::default()
        };
        let fx = Fixture::new(fill, false)?;
        let layer = TestLayer::new(fx.dir.path(), "cold", &tar)?;
        let dir = fx.add(&layer)?;
        let mbs = seq(&dir.join("big.bin"))?;
        println!(
            "BENCH cold sequential read, local blob, read_ahead={ra}: {mbs:.0} MB/s in {} range requests",
            layer.source.requests().len()
        );
    }
    Ok(())
}
