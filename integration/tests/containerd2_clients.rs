//! Real clients on containerd 2.x (built by `scripts/go-tools.sh`, config version 3) with the
//! weenv snapshotter and runtime shim:
//!
//! - **nerdctl**: `pull`, `run --rm` (time to first output), `run -d`, `exec`, `logs`, `rm -f`,
//!   all with `--snapshotter weenv --runtime io.containerd.weenv.v1` on the Debian+python3 weenv
//!   image, lazily: the daemon commits remote snapshots and the registry (counted at a proxy)
//!   serves at most a quarter of the image's layer bytes.
//! - **crictl** on the CRI plugin (`snapshotter = "weenv"`, the runtime handler `weenv`):
//!   `pull`, `runp`, `create`, `start`, `exec`, `logs`, `stop`, `rm`, `stopp`, `rmp`, the pull
//!   lazy as well.
//!
//! For comparison it prints the same nerdctl flow with overlayfs + runc on the gzip image.

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::*;
use std::time::{Duration, Instant};
use weenv_integration::clients::{Crictl, Nerdctl, PodFlow};
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::cri::{CriOptions, WEENV_HANDLER};
use weenv_integration::gotools;

const SCRIPT: &str = "import json, sys; print(json.dumps({'ok': sys.version_info[0]}))";
const EXPECTED: &str = "{\"ok\": 3}";

/// `nerdctl run --rm`: (stdout, seconds from the start of the pull to the output).
fn nerdctl_pull_and_run(
    n: &Nerdctl,
    snapshotter: &str,
    runtime: &str,
    image: &str,
) -> Result<(String, f64, f64)> {
    let t = Instant::now();
    n.ok(&["pull", "--snapshotter", snapshotter, "--quiet", image])?;
    let pulled = t.elapsed().as_secs_f64();
    let out = n.ok(&[
        "run",
        "--rm",
        "--net",
        "none",
        "--snapshotter",
        snapshotter,
        "--runtime",
        runtime,
        image,
        "python3",
        "-c",
        SCRIPT,
    ])?;
    Ok((out, pulled, t.elapsed().as_secs_f64()))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, fuse, docker-registry, skopeo, umoci, debootstrap and scripts/go-tools.sh (containerd 2.x, runc, nerdctl, crictl)"]
async fn nerdctl_and_crictl_on_containerd2_run_weenv_images_lazily() -> Result<()> {
    let Some(tools) = gotools::require(
        "nerdctl_and_crictl_on_containerd2_run_weenv_images_lazily",
        &["containerd2", "runc", "nerdctl", "crictl"],
    )?
    else {
        return Ok(());
    };
    let py = PythonImage::start().await?;
    let proxy = &py.proxy;
    let weenv = format!("{}/python:weenv", proxy.host());
    let gz = format!("{}/python:gz", proxy.host());
    let layer_bytes = image_layer_bytes(&py.client, &py.direct).await?;
    let pause = weenv_integration::images::pause()?;
    let sandbox_image = py.reg.push(&pause, "pause:1")?;

    // The daemon knows only the proxy: containerd's content store records a layer's registry
    // without its port, and with two registries on 127.0.0.1 the daemon (rightly) refuses to
    // guess which one a layer came from. The pause image (plain, not weenv) never reaches it.
    let opts = DaemonOptions {
        plain_http: vec![proxy.host()],
        ..py.daemon_options()
    };
    let daemon = Daemon::start(&py.tmp.path().join("snap"), &opts)?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        release: tools.containerd2()?,
        cri: Some(CriOptions {
            snapshotter: "weenv".into(),
            disable_snapshot_annotations: true,
            sandbox_image: sandbox_image.clone(),
            plain_http: vec![proxy.host(), py.reg.host()],
            cni: None,
            mirrors: vec![],
        }),
        ..Default::default()
    })?;
    daemon.use_containerd(&ctd)?;
    let v = ctd.ctr_ok(&["version"])?;
    // `ctr version` prints "Version:  v2.4.2" for release builds and "2.4.2+unknown" for ours.
    let is_v2 = v.lines().any(|l| {
        l.trim()
            .strip_prefix("Version:")
            .is_some_and(|x| x.trim().trim_start_matches('v').starts_with("2."))
    });
    ensure!(is_v2, "not containerd 2.x:\n{v}");

    // nerdctl: pull + run --rm (lazy), then run -d / exec / logs / rm.
    let n = Nerdctl::new(
        &tools.bin("nerdctl", "nerdctl")?,
        &ctd,
        "nerd",
        &py.tmp.path().join("nerdctl"),
        &[proxy.host(), py.reg.host()],
    )?;
    proxy.stats().clear();
    let (out, pulled, first) = nerdctl_pull_and_run(&n, "weenv", "io.containerd.weenv.v1", &weenv)
        .with_context(|| {
            format!(
                "daemon log:\n{}\ncontainerd log:\n{}",
                daemon.log(),
                ctd.log()
            )
        })?;
    ensure!(out.contains(EXPECTED), "{out}");
    let served = proxy.stats().bytes_served();
    let remote = daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
    println!(
        "nerdctl on containerd 2.x, weenv snapshotter + shim: registry served {served} bytes = \
         {:.1}% of the {layer_bytes} layer bytes; pull {pulled:.2} s, first output {first:.2} s; \
         {remote} remote snapshots",
        100.0 * served as f64 / layer_bytes as f64
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
    n.ok(&[
        "run",
        "-d",
        "--name",
        "c1",
        "--net",
        "none",
        "--snapshotter",
        "weenv",
        "--runtime",
        "io.containerd.weenv.v1",
        &weenv,
        "python3",
        "-c",
        "import time; print('started', flush=True); time.sleep(600)",
    ])?;
    let exec = n.ok(&["exec", "c1", "python3", "-c", SCRIPT])?;
    ensure!(exec.contains(EXPECTED), "exec: {exec}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = n.ok(&["logs", "c1"])?;
        if logs.contains("started") {
            break;
        }
        ensure!(Instant::now() < deadline, "nerdctl logs c1: {logs:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    n.ok(&["rm", "-f", "c1"])?;
    let ps = n.ok(&["ps", "-a", "-q"])?;
    ensure!(ps.trim().is_empty(), "containers left: {ps}");

    // crictl on the CRI plugin (namespace k8s.io): the layers are on the node by digest.
    let c = Crictl::new(
        &tools.bin("crictl", "crictl")?,
        &ctd,
        &py.tmp.path().join("crictl"),
        Duration::from_secs(300),
    )?;
    proxy.stats().clear();
    let t = Instant::now();
    c.ok(&["pull", &weenv])?;
    let cri_pulled = t.elapsed().as_secs_f64();
    let first_cri = c.pod_flow(
        &py.tmp.path().join("crictl"),
        &PodFlow {
            name: "py",
            image: &weenv,
            handler: WEENV_HANDLER,
            command: &[
                "python3",
                "-c",
                "import time; print('cri-started', flush=True); time.sleep(600)",
            ],
            log_contains: "cri-started",
            exec: &["python3", "-c", SCRIPT],
            exec_contains: EXPECTED,
        },
    )?;
    println!(
        "crictl on containerd 2.x (layers already on the node): registry served {} bytes; pull \
         {cri_pulled:.2} s, logs showed the output {first_cri:.2} s after runp",
        proxy.stats().bytes_served()
    );

    // Control: the same nerdctl flow with overlayfs + runc on the gzip image (a full pull).
    let n2 = Nerdctl::new(
        &tools.bin("nerdctl", "nerdctl")?,
        &ctd,
        "nerd-overlay",
        &py.tmp.path().join("nerdctl2"),
        &[proxy.host(), py.reg.host()],
    )?;
    proxy.stats().clear();
    let (out, pulled, first) =
        nerdctl_pull_and_run(&n2, "overlayfs", "io.containerd.runc.v2", &gz)?;
    ensure!(out.contains(EXPECTED), "{out}");
    println!(
        "nerdctl on containerd 2.x, overlayfs + runc, gzip image (full pull): registry served {} \
         bytes; pull {pulled:.2} s, first output {first:.2} s",
        proxy.stats().bytes_served()
    );
    Ok(())
}
