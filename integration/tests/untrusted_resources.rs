//! Images that try to exhaust the node (issue 9, holes 3 and 4).
//!
//! - `disk_cache_stays_within_its_cap`: four images of ~44 MB of incompressible data against a
//!   64 MiB `cache.disk_bytes`, background fill and passthrough copies on, every file read
//!   twice (through FUSE, then from the complete copies); `du` of the cache dir, sampled every
//!   100 ms, never exceeds the cap by more than one fill batch (4 MiB), `/status` reports what
//!   `du` sees, and evicted content is served correctly again.
//! - `huge_toc_is_refused_with_bounded_memory`: a hand-made 3 MB-ish layer whose TOC lists
//!   3,000,000 entries; its lazy pull fails with the limit error (layer digest, limit, config
//!   key), the daemon's peak RSS (`VmHWM`) stays under 300 MB and it goes on serving another
//!   image.
//! - `a_300k_entry_layer_costs_under_100_bytes_per_entry`: a writer-made layer of 300,000
//!   entries mounted lazily (fill off): `/status` TOC bytes per entry ≤ 100 and the daemon's
//!   RSS growth per entry (the real resident cost) ≤ 120 (measured: 98).
//! - `mounted_python_layers_cost_under_100_bytes_per_entry`: the Debian+python3 image's layers
//!   mounted lazily; `/status` TOC bytes per entry ≤ 100, and the daemon's RSS growth per
//!   entry is printed.

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::registry::LocalRegistry;
use weenv_integration::untrusted_resources::{
    data_image, huge_toc_blob, many_entries_layer, noise, push_one_layer_image,
};
use weenv_integration::util::{require_root_and_bins, E2E_FUSE_BINS};

const CAP: u64 = 64 << 20;
/// The fill's batch (`FillConfig::batch_bytes` default).
const BATCH: u64 = 4 << 20;
const BIG_FILES: usize = 24;
const BIG_BYTES: usize = 1_800_000;
const SMALL_FILES: usize = 200;

/// `du -s -B1 dir` in bytes.
fn du(dir: &Path) -> Result<u64> {
    let o = std::process::Command::new("du")
        .args(["-s", "-B1"])
        .arg(dir)
        .output()?;
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("du output")
}

/// Reads every regular file under `dir`; returns (files, bytes).
fn read_all(dir: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                bytes += std::fs::read(e.path())
                    .with_context(|| format!("reading {}", e.path().display()))?
                    .len() as u64;
                files += 1;
            }
        }
    }
    Ok((files, bytes))
}

fn layer_dirs(mnt: &Path) -> Result<BTreeSet<PathBuf>> {
    Ok(std::fs::read_dir(mnt)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect())
}

/// Value of metric `name` (without labels).
fn metric(daemon: &Daemon, name: &str) -> Result<u64> {
    let m = daemon.weenv(&["metrics"])?;
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .with_context(|| format!("metric {name}"))
}

/// Regular files under `dir` (recursive).
fn count_files(dir: &Path) -> u64 {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => n += 1,
                _ => {}
            }
        }
    }
    n
}

fn status(daemon: &Daemon) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(&daemon.weenv(&["status", "--json"])?)?)
}

/// Waits until no layer's fill is pending or running.
fn wait_fills(daemon: &Daemon, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let s = status(daemon)?;
        let busy = s["layers"]
            .as_array()
            .context("layers")?
            .iter()
            .any(|l| matches!(l["fill"].as_str(), Some("pending" | "running")));
        if !busy {
            return Ok(());
        }
        ensure!(t0.elapsed() < timeout, "fills still running: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Checks the content of the data layer at `dir` (image `seed`).
fn check_content(dir: &Path, seed: u64) -> Result<()> {
    for i in [0, BIG_FILES / 2, BIG_FILES - 1] {
        let got = std::fs::read(dir.join(format!("data/big{i:03}")))?;
        ensure!(
            got == noise(seed * 1_000_003 + i as u64, BIG_BYTES),
            "{}: big{i:03} differs",
            dir.display()
        );
    }
    let got = std::fs::read(dir.join("data/small/0007"))?;
    ensure!(
        got == noise(seed * 7_000_001 + 500_007, 4096),
        "small/0007 differs"
    );
    Ok(())
}

/// A private registry (under `tmp`) and a client for it.
fn registry(tmp: &Path) -> Result<(LocalRegistry, String, weenv_registry::Client)> {
    require_root_and_bins(E2E_FUSE_BINS)?;
    let reg = LocalRegistry::start(tmp)?;
    let host = reg.host();
    let client = client(std::slice::from_ref(&host))?;
    Ok((reg, host, client))
}

/// A daemon under `root` for registry `host` (background fill `fill`, `fill_extra` in
/// `[fill]`, the disk cache capped at `disk_bytes`), and a containerd using it.
fn daemon_and_containerd(
    root: &Path,
    host: &str,
    (fill, fill_extra): (bool, &str),
    disk_bytes: Option<u64>,
) -> Result<(Daemon, Containerd)> {
    let daemon = Daemon::start_with(
        root,
        &DaemonOptions {
            plain_http: vec![host.to_string()],
            fill,
            fill_extra: fill_extra.into(),
        },
        &[],
        |c| {
            if let Some(cap) = disk_bytes {
                c.cache.disk_bytes = cap;
            }
        },
    )?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;
    Ok((daemon, ctd))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn disk_cache_stays_within_its_cap() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (reg, host, client) = registry(tmp.path())?;
    let mut refs = Vec::new();
    let t0 = Instant::now();
    for seed in 1..=4u64 {
        let dir = tmp.path().join(format!("img{seed}"));
        std::fs::create_dir_all(&dir)?;
        let img = data_image(&dir, seed, BIG_FILES, BIG_BYTES, SMALL_FILES)?;
        let gz = reg.push(&img, &format!("data{seed}:gz"))?;
        let weenv = format!("{host}/data{seed}:weenv");
        convert(&client, &gz, &weenv).await?;
        refs.push((seed, weenv));
    }
    println!("4 images built and converted in {:?}", t0.elapsed());

    let (daemon, ctd) = daemon_and_containerd(
        &tmp.path().join("snap"),
        &host,
        (true, "quiet_ms = 0"),
        Some(CAP),
    )?;
    let state = daemon.root.join("state");
    let (cache, mnt) = (state.join("cache"), state.join("mnt"));

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, cache) = (stop.clone(), cache.clone());
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(b) = du(&cache) {
                    samples.push(b);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
    };
    let mut seen = layer_dirs(&mnt)?;
    let mut data_dirs = Vec::new();
    let run = async {
        for (seed, r) in &refs {
            daemon.pull(ctd.address(), "t", r)?;
            let now = layer_dirs(&mnt)?;
            let new: Vec<PathBuf> = now.difference(&seen).cloned().collect();
            ensure!(new.len() == 1, "one new layer per image: {new:?}");
            data_dirs.push((*seed, new[0].clone()));
            seen = now;
            let (files, bytes) = read_all(&mnt)?;
            wait_fills(&daemon, Duration::from_secs(180))?;
            read_all(&mnt)?;
            println!(
                "image {seed}: read {files} files, {} MiB; du {} MiB; {} complete copies on disk",
                bytes >> 20,
                du(&cache)? >> 20,
                count_files(&cache.join("files"))
            );
        }
        // Evicted frames and copies are fetched again, correctly.
        for (seed, dir) in &data_dirs {
            check_content(dir, *seed)?;
        }
        Ok::<(), anyhow::Error>(())
    };
    let res = run.await;
    let pt_opens = metric(&daemon, "weenv_passthrough_opens_total");
    let evictions = metric(&daemon, "weenv_cache_l2_evictions_total");
    stop.store(true, Ordering::Relaxed);
    let samples = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    res?;
    let (pt_opens, evictions) = (pt_opens?, evictions?);
    println!("passthrough opens {pt_opens}, evictions {evictions}");
    ensure!(
        status(&daemon)?["passthrough"] == true,
        "passthrough must be active"
    );
    ensure!(pt_opens > 0, "no open was served by a complete copy");
    let max = samples.iter().copied().max().unwrap_or(0);
    let over = samples.iter().filter(|s| **s > CAP).count();
    let final_du = du(&cache)?;
    let reported = status(&daemon)?["cache"]["disk_used"]
        .as_u64()
        .context("disk_used")?;
    println!(
        "du of the cache dir: max {max} B ({:.1} MiB) over {} samples, {over} above the cap; \
         cap {CAP} B (64 MiB) + batch {BATCH} B; at the end du {final_du} B, /status {reported} B",
        max as f64 / (1 << 20) as f64,
        samples.len()
    );
    ensure!(
        max <= CAP + BATCH,
        "du reached {max} B, more than cap {CAP} + batch {BATCH}"
    );
    ensure!(
        final_du.abs_diff(reported) <= 1 << 20,
        "/status says {reported} B, du says {final_du} B"
    );
    Ok(())
}

/// Pid of the daemon started with `config` (from `/proc/*/cmdline`).
fn daemon_pid(config: &Path) -> Result<u32> {
    let want = config.display().to_string();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args
            .first()
            .is_some_and(|a| a.ends_with(b"weenv-snapshotter"))
            && args.contains(&want.as_bytes())
        {
            return Ok(pid);
        }
    }
    anyhow::bail!("no weenv-snapshotter running with {want}")
}

/// (VmRSS, VmHWM) of `pid` in bytes.
fn rss(pid: u32) -> Result<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| -> Result<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|v| v << 10)
            .with_context(|| format!("{key} in /proc/{pid}/status"))
    };
    Ok((kb("VmRSS:")?, kb("VmHWM:")?))
}

const MIB: f64 = (1 << 20) as f64;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn huge_toc_is_refused_with_bounded_memory() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (reg, host, client) = registry(tmp.path())?;
    let gz = reg.push(&weenv_integration::images::busybox()?, "busybox:gz")?;
    let good = format!("{host}/busybox:weenv");
    convert(&client, &gz, &good).await?;

    const ENTRIES: u64 = 3_000_000;
    let h = huge_toc_blob(ENTRIES)?;
    let layer = weenv_format::Digest::sha256(&h.blob);
    let evil = format!("{host}/huge:toc");
    push_one_layer_image(
        &client,
        &evil,
        &h.blob,
        &h.diff_id,
        &[
            (
                weenv_format::ANNOTATION_TOC_DIGEST,
                h.toc_digest.to_string(),
            ),
            (
                weenv_format::ANNOTATION_TOC_OFFSET,
                h.toc_offset.to_string(),
            ),
            (weenv_format::ANNOTATION_TOC_LENGTH, h.toc_len.to_string()),
            (
                weenv_format::ANNOTATION_FORMAT_VERSION,
                weenv_format::FORMAT_VERSION.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    )
    .await?;
    println!(
        "hand-made layer {layer}: {} bytes, TOC of {ENTRIES} entries",
        h.blob.len()
    );

    let (daemon, ctd) = daemon_and_containerd(&tmp.path().join("snap"), &host, (true, ""), None)?;
    let pid = daemon_pid(&daemon.config)?;
    let (before, _) = rss(pid)?;
    let err = match daemon.pull(ctd.address(), "t", &evil) {
        Ok(out) => anyhow::bail!("the pull of a 3M-entry TOC succeeded: {out}"),
        Err(e) => format!("{e:#}"),
    };
    let (after, peak) = rss(pid)?;
    println!(
        "daemon RSS: before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
        before as f64 / MIB,
        peak as f64 / MIB,
        after as f64 / MIB
    );
    let first = err.lines().next().unwrap_or_default();
    println!("pull error: {first}");
    ensure!(
        err.contains(layer.hex())
            && err.contains("over the limit of")
            && err.contains("limits.max_toc_"),
        "the error must name the layer, the limit and the config key: {err}"
    );
    ensure!(peak < 300 << 20, "peak RSS {peak} B");
    ensure!(after < 100 << 20, "RSS after {after} B");
    // The daemon still serves other images.
    daemon.pull(ctd.address(), "t", &good)?;
    let out = ctr_run(
        &ctd,
        "t",
        "weenv",
        &good,
        "after-huge",
        &["cat", "/etc/weenv"],
    )?;
    ensure!(out.contains("hello from weenv test image"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, debootstrap"]
async fn mounted_python_layers_cost_under_100_bytes_per_entry() -> Result<()> {
    let img = PythonImage::start().await?;
    let daemon = Daemon::start(&img.tmp.path().join("snap"), &img.daemon_options())?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;
    let pid = daemon_pid(&daemon.config)?;
    let (before, _) = rss(pid)?;
    daemon.pull(ctd.address(), "t", &img.direct)?;
    let (after, peak) = rss(pid)?;
    let s = status(&daemon)?;
    let layers = s["layers"].as_array().context("layers")?;
    let entries: u64 = layers.iter().filter_map(|l| l["entries"].as_u64()).sum();
    let toc_bytes: u64 = layers.iter().filter_map(|l| l["toc_bytes"].as_u64()).sum();
    ensure!(entries > 1000, "{s}");
    let per_entry = toc_bytes as f64 / entries as f64;
    println!(
        "python image: {} layers, {entries} entries; /status TOC bytes {toc_bytes} = {per_entry:.1} B/entry; \
         daemon RSS before {:.1} MiB, after {:.1} MiB (peak {:.1} MiB): {:.1} B/entry resident growth",
        layers.len(),
        before as f64 / MIB,
        after as f64 / MIB,
        peak as f64 / MIB,
        after.saturating_sub(before) as f64 / entries as f64
    );
    ensure!(
        s["memory"]["rss"].as_u64().unwrap_or(0) > 0,
        "/status accounts RSS: {s}"
    );
    ensure!(per_entry <= 100.0, "{per_entry:.1} B/entry");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry"]
async fn a_300k_entry_layer_costs_under_100_bytes_per_entry() -> Result<()> {
    const ENTRIES: u64 = 300_000;
    let tmp = tempfile::tempdir()?;
    let (_reg, host, client) = registry(tmp.path())?;
    let t0 = Instant::now();
    let (blob, sum) = many_entries_layer(ENTRIES)?;
    let annotations = weenv_format::descriptor_annotations(&sum);
    let image = format!("{host}/many:entries");
    push_one_layer_image(&client, &image, &blob, &sum.diff_id, &annotations).await?;
    println!(
        "layer of {} entries, {} bytes, built and pushed in {:?}",
        sum.entry_count,
        blob.len(),
        t0.elapsed()
    );
    let (daemon, ctd) = daemon_and_containerd(&tmp.path().join("snap"), &host, (false, ""), None)?;
    let pid = daemon_pid(&daemon.config)?;
    let (before, _) = rss(pid)?;
    daemon.pull(ctd.address(), "t", &image)?;
    let (after, peak) = rss(pid)?;
    let s = status(&daemon)?;
    let l = &s["layers"][0];
    let entries = l["entries"].as_u64().context("entries")?;
    let toc_bytes = l["toc_bytes"].as_u64().context("toc_bytes")?;
    let per_entry = toc_bytes as f64 / entries as f64;
    let resident = after.saturating_sub(before) as f64 / entries as f64;
    println!(
        "{entries} entries: /status TOC bytes {toc_bytes} = {per_entry:.1} B/entry; daemon RSS \
         before {:.1} MiB, after {:.1} MiB (peak {:.1} MiB while the TOC was decoded): \
         {resident:.1} B/entry resident growth",
        before as f64 / MIB,
        after as f64 / MIB,
        peak as f64 / MIB
    );
    println!("{}", daemon.weenv(&["status"])?);
    ensure!(entries == ENTRIES, "{s}");
    ensure!(per_entry <= 100.0, "{per_entry:.1} B/entry");
    ensure!(resident <= 120.0, "{resident:.1} B/entry resident");
    Ok(())
}
