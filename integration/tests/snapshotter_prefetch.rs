//! Start-up profiles end to end, with the Debian+python3 image: record what `python3 -c
//! 'import json'` reads through weenv (`weenv profile`), attach it to the image manifest
//! (`weenv-convert prefetch`, no layer byte re-pushed), then on a fresh node `weenv pull` the
//! profiled image: the daemon prefetches the profile's frames right after the layers mount,
//! and the same command then needs (almost) nothing more from the registry. Every byte is
//! counted at a proxy in front of the registry.

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::*;
use std::process::Command;
use std::time::{Duration, Instant};
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::util::workspace_bin;

const CMD: &str = "import json, sys; print(json.dumps({'ok': sys.version_info[0]}))";

fn run_python(ctd: &Containerd, ns: &str, image: &str, id: &str) -> Result<()> {
    let out = ctr_run(ctd, ns, "weenv", image, id, &["python3", "-c", CMD])?;
    ensure!(out.contains("{\"ok\": 3}"), "ctr run {id}: {out}");
    Ok(())
}

/// (frames named by profiles, of which cached) over all layers, from `weenv status --json`.
fn prefetch_progress(d: &Daemon) -> Result<(u64, u64)> {
    let s: serde_json::Value = serde_json::from_str(&d.weenv(&["status", "--json"])?)?;
    let layers = s["layers"].as_array().context("status has no layers")?;
    Ok(layers.iter().fold((0, 0), |(t, done), l| {
        (
            t + l["prefetch_frames"].as_u64().unwrap_or(0),
            done + l["prefetch_done"].as_u64().unwrap_or(0),
        )
    }))
}

fn metric(d: &Daemon, name: &str) -> Result<u64> {
    let m = d.weenv(&["metrics"])?;
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .with_context(|| format!("no metric {name}"))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, debootstrap"]
async fn recorded_profile_is_prefetched_at_mount() -> Result<()> {
    let py = PythonImage::start().await?;
    let (proxy, tmp, direct) = (&py.proxy, &py.tmp, &py.direct);

    // 1. Record: cold node, no fill, run the command once, read the profile.
    let plain = format!("{}/python:weenv", proxy.host());
    let (profile, cold_served) = py.record_profile(&tmp.path().join("snap-a"), &plain, |ctd| {
        proxy.stats().clear();
        run_python(ctd, "a", &plain, "rec")?;
        Ok(proxy.stats().bytes_served())
    })?;
    let paths: Vec<&str> = profile.lines().collect();
    println!(
        "profile: {} files ({} read in part); the cold run without a profile fetched \
         {cold_served} bytes\n{profile}",
        paths.len(),
        paths.iter().filter(|p| p.contains('\t')).count()
    );
    ensure!(
        paths.iter().any(|p| p.starts_with("/usr/bin/python3"))
            && paths
                .iter()
                .any(|p| p.ends_with("/json/__init__.py")
                    || p.contains("/json/__pycache__/__init__")),
        "profile misses python3 or the json module:\n{profile}"
    );
    ensure!(
        paths
            .iter()
            .all(|p| p.starts_with('/') && !p.contains("/proc/")),
        "{profile}"
    );

    // 2. Attach it to the manifest under a new tag: layer blobs are not sent again.
    let file = tmp.path().join("startup.profile");
    std::fs::write(&file, &profile)?;
    let profiled_direct = format!("{}/python:weenv-profiled", py.reg.host());
    let o = Command::new(workspace_bin("weenv-convert")?)
        .args([
            "--plain-http",
            &py.reg.host(),
            "prefetch",
            direct,
            "--profile",
        ])
        .arg(&file)
        .args(["--to", &profiled_direct])
        .output()?;
    ensure!(
        o.status.success(),
        "weenv-convert prefetch: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{}", String::from_utf8_lossy(&o.stdout));

    // 3. Fresh node: pull the profiled image; the prefetch runs right after the mounts.
    let profiled = format!("{}/python:weenv-profiled", proxy.host());
    let d = Daemon::start(&tmp.path().join("snap-b"), &py.daemon_options())?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(d.socket.clone()),
        ..Default::default()
    })?;
    proxy.stats().clear();
    d.pull(ctd.address(), "b", &profiled)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let (total, done) = loop {
        let (t, done) = prefetch_progress(&d)?;
        if (t > 0 && done == t) || Instant::now() > deadline {
            break (t, done);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    ensure!(
        total > 0 && done == total,
        "prefetch did not complete: {done}/{total} frames\n{}",
        d.log()
    );
    let prefetched = proxy.stats().bytes_served();
    let prefetch_metric = metric(&d, "weenv_fetch_bytes_prefetch_total")?;
    proxy.stats().clear();
    run_python(&ctd, "b", &profiled, "run")?;
    let on_demand = proxy.stats().bytes_served();
    println!(
        "profiled image: {total} frames prefetched ({prefetched} bytes at the proxy, incl. \
         manifest/TOCs; daemon counted {prefetch_metric}); the command then fetched {on_demand} \
         bytes (vs {cold_served} without a profile)"
    );
    ensure!(prefetch_metric > 0, "daemon counted no prefetch bytes");
    ensure!(
        on_demand * 10 < cold_served,
        "with the profile prefetched the command still fetched {on_demand} bytes \
         (without: {cold_served}): {:#?}",
        proxy
            .stats()
            .requests()
            .iter()
            .map(|r| format!("{} {} {:?} {}", r.method, r.path, r.range, r.response_bytes))
            .collect::<Vec<_>>()
    );
    ensure!(
        prefetched * 2 < cold_served * 3,
        "prefetch fetched {prefetched} bytes, over 1.5x the {cold_served} the cold run needed"
    );
    Ok(())
}
