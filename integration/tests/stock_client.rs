//! Lazy pulls through a stock containerd client: `stockrun` (integration/go/stockrun, built
//! here with Debian's Go and containerd 1.6 client library) makes exactly nerdctl's calls —
//! `client.Pull(ref, WithPullUnpack, WithPullSnapshotter("weenv"))`, `NewContainer` with
//! `WithNewSnapshot` + `WithNewSpec(oci.WithImageConfig)`, `NewTask`, `Start`, `Wait` — and
//! sends no snapshot label of its own. containerd's unpacker passes the weenv layers'
//! `containerd.io/snapshot/*` annotations (written by weenv-convert) to Prepare; the daemon
//! finds the image in containerd's content store (distribution-source label) and commits
//! remote snapshots. The container must run correctly while the registry (counted at a proxy)
//! serves at most a quarter of the image's compressed layer bytes.
//!
//! For comparison the test prints, for the same Debian+python3 image, bytes from the registry
//! and time to first output of: the Go client with the weenv snapshotter (lazy), `weenv pull`
//! then `ctr run` (lazy, its own fresh daemon), and the Go client with containerd's overlayfs
//! snapshotter on the original gzip image (a full pull).

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::*;
use std::process::Command;
use std::time::Instant;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::stockrun;

const SCRIPT: &str = "import json, sys; print(json.dumps({'ok': sys.version_info[0]}))";
const EXPECTED: &str = "{\"ok\": 3}";

/// Runs `stockrun` against `ctd`; (stdout, report). Fails on a non-zero exit.
fn stockrun(
    bin: &std::path::Path,
    ctd: &Containerd,
    ns: &str,
    snapshotter: &str,
    image: &str,
) -> Result<(String, stockrun::Report)> {
    let o = Command::new(bin)
        .arg("-address")
        .arg(ctd.address())
        .args(["-namespace", ns, "-snapshotter", snapshotter, "-plain-http"])
        .args([image, "python3", "-c", SCRIPT])
        .output()
        .context("running stockrun")?;
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    ensure!(
        o.status.success(),
        "stockrun {image} failed ({}):\n{out}{err}\ncontainerd log:\n{}",
        o.status,
        ctd.log()
    );
    let r = stockrun::Report::parse(&err).with_context(|| format!("no report in:\n{err}"))?;
    Ok((out, r))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, debootstrap, go + golang-github-containerd-containerd-dev"]
async fn go_client_pull_and_run_is_lazy() -> Result<()> {
    let py = PythonImage::start().await?;
    let bin = stockrun::build(&py.tmp.path().join("go"))?;
    let proxy = &py.proxy;
    let weenv = format!("{}/python:weenv", proxy.host());
    let gz = format!("{}/python:gz", proxy.host());
    let layer_bytes = image_layer_bytes(&py.client, &py.direct).await?;

    // nerdctl's path: the Go client, weenv snapshotter, no labels of its own.
    // Only the proxy is configured: containerd records the registry without its port, and
    // the daemon takes the configured host of that name (the proxy counts every byte).
    let opts = DaemonOptions {
        plain_http: vec![proxy.host()],
        ..py.daemon_options()
    };
    let daemon = Daemon::start(&py.tmp.path().join("snap"), &opts)?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;
    daemon.use_containerd(&ctd)?;
    proxy.stats().clear();
    let (out, r) = stockrun(&bin, &ctd, "stock", "weenv", &weenv)?;
    ensure!(out.contains(EXPECTED), "{out}\n{}", daemon.log());
    ensure!(r.exit_code == 0, "{r:?}");
    let served = proxy.stats().bytes_served();
    let remote = daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
    println!(
        "Go client (nerdctl's calls), weenv snapshotter: registry served {served} bytes = {:.1}% \
         of the {layer_bytes} layer bytes; pull {:.2} s, first output {:.2} s; {remote} remote \
         snapshots",
        100.0 * served as f64 / layer_bytes as f64,
        r.pull_secs,
        r.first_output_secs
    );
    ensure!(
        remote >= 3,
        "layers were not mounted lazily ({remote} remote)\n{}",
        daemon.log()
    );
    ensure!(
        served * 4 <= layer_bytes,
        "registry served {served} of {layer_bytes} layer bytes (more than a quarter)\n{:?}",
        proxy.stats().summary()
    );
    // The same image again in another namespace: its content store names the image too.
    let (out, _) = stockrun(&bin, &ctd, "stock2", "weenv", &weenv)?;
    ensure!(out.contains(EXPECTED), "{out}");

    // A full pull of the original gzip image through the same client (overlayfs).
    proxy.stats().clear();
    let (out, full) = stockrun(&bin, &ctd, "full", "overlayfs", &gz)?;
    ensure!(out.contains(EXPECTED), "{out}");
    println!(
        "Go client, overlayfs, gzip image (full pull): registry served {} bytes; pull {:.2} s, \
         first output {:.2} s",
        proxy.stats().bytes_served(),
        full.pull_secs,
        full.first_output_secs
    );
    drop(ctd);
    drop(daemon);

    // `weenv pull` + `ctr run` on a fresh daemon, for comparison.
    let (daemon, ctd) = lazy_stack(&py.tmp.path().join("snap2"), &proxy.host())?;
    proxy.stats().clear();
    let t = Instant::now();
    daemon.pull(ctd.address(), "wp", &weenv)?;
    let pulled = t.elapsed().as_secs_f64();
    let out = ctr_run(
        &ctd,
        "wp",
        "weenv",
        &weenv,
        "wp1",
        &["python3", "-c", SCRIPT],
    )?;
    ensure!(out.contains(EXPECTED), "{out}");
    println!(
        "weenv pull + ctr run: registry served {} bytes; pull {pulled:.2} s, output after {:.2} s",
        proxy.stats().bytes_served(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
