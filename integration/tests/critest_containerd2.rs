//! critest (the CRI validation suite, cri-tools v1.37.0) against containerd 2.x with
//! `snapshotter = "weenv"` and the weenv runtime handler, next to the same run with overlayfs +
//! runc as the control: every spec the control passes must pass with weenv. Pods get real CNI
//! networks (bridge, host-local, portmap, loopback) inside a network namespace of the test's
//! own (see `weenv_integration::critest`). critest's default container image is busybox from
//! the test registry (converted to weenv for the weenv run, the gzip original for the control).
//!
//! In CI a subset runs ([`CI_FOCUS`]: containers, pod sandboxes, exec/log streaming, volumes,
//! multiple containers, idempotence); `WEENV_CRITEST_FOCUS=''` runs the full suite (the table in
//! docs/kubernetes.md). Both tables are printed.

mod snapshotter_common;

use anyhow::{ensure, Result};
use snapshotter_common::*;
use std::time::Duration;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::cri::{CniNetwork, CriOptions, WEENV_HANDLER};
use weenv_integration::critest::{table, CritestRun, Netns, Outcome};
use weenv_integration::gotools;

/// The specs CI runs (critest's `--ginkgo.focus`).
pub const CI_FOCUS: &str = "runtime should support basic operations on container|\
runtime should support basic operations on PodSandbox|runtime should support log|\
runtime should support exec|runtime should support execSync|\
runtime should support adding volume and device|when running multiple containers in a pod|\
Idempotence";

/// critest's web server image (multi-container and networking specs), mirrored to the test
/// registry as a busybox httpd stand-in.
const HTTPD: &str = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4";

/// Specs the weenv run may fail or skip although the control passes, each for a reason that is
/// weenv's by design or not done yet (docs/kubernetes.md, "critest"): (spec substring, reason).
const KNOWN: &[(&str, &str)] = &[(
    "should terminate with exitCode 137 and reason OOMKilled",
    "elastic memory: the weenv shim raises a container's memory limit under pressure instead \
         of letting the kernel OOM-kill it; at its top tier it ends the task with exit 247 and \
         the shim's reason",
)];

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, fuse, docker-registry, skopeo, umoci, ip, nsenter and scripts/go-tools.sh (containerd 2.x, runc, critest, CNI plugins)"]
async fn critest_passes_with_weenv_wherever_overlayfs_and_runc_pass() -> Result<()> {
    let Some(tools) = gotools::require(
        "critest_passes_with_weenv_wherever_overlayfs_and_runc_pass",
        &["containerd2", "runc", "critest", "cni"],
    )?
    else {
        return Ok(());
    };
    weenv_integration::util::require_root_and_bins(&[
        "docker-registry",
        "skopeo",
        "umoci",
        "ip",
        "nsenter",
    ])?;
    let tmp = tempfile::tempdir()?;
    let reg = weenv_integration::registry::LocalRegistry::start(tmp.path())?;
    let gz = reg.push(
        &weenv_integration::images::busybox_all_applets()?,
        "busybox:1",
    )?;
    let weenv = format!("{}/busybox:weenv", reg.host());
    let c = client(&[reg.host()])?;
    convert(&c, &gz, &weenv).await?;
    let pause = reg.push(&weenv_integration::images::pause()?, "pause:1")?;
    // critest's web server image, under the path it asks registry.k8s.io for (containerd
    // reaches registry.k8s.io through a mirror on the test registry: `CriOptions::mirrors`).
    reg.push(
        &weenv_integration::images::busybox_httpd()?,
        HTTPD.trim_start_matches("registry.k8s.io/"),
    )?;

    let mut ns = Netns::new("critest")?;
    ns.serve_registry(
        &reg.root().join("data"),
        reg.addr(),
        &tmp.path().join("reg-netns"),
    )?;
    let daemon = Daemon::start(
        &tmp.path().join("snap"),
        &DaemonOptions {
            plain_http: vec![reg.host()],
            fill: false,
            fill_extra: String::new(),
        },
    )?;
    let focus = std::env::var("WEENV_CRITEST_FOCUS").unwrap_or_else(|_| CI_FOCUS.to_string());
    let skip = std::env::var("WEENV_CRITEST_SKIP").unwrap_or_default();
    let run = |snapshotter: &str, handler: &str, image: &str, name: &str| -> Result<_> {
        let ctd = Containerd::start(ContainerdOptions {
            proxy_snapshotter: Some(daemon.socket.clone()),
            release: tools.containerd2()?,
            netns: Some(ns.name.clone()),
            cri: Some(CriOptions {
                snapshotter: snapshotter.into(),
                disable_snapshot_annotations: true,
                sandbox_image: pause.clone(),
                plain_http: vec![reg.host()],
                cni: Some(CniNetwork {
                    bin_dir: tools.tool("cni")?.dir.clone(),
                    subnet: "10.88.0.0/16".into(),
                }),
                mirrors: vec![("registry.k8s.io".into(), reg.host())],
            }),
            ..Default::default()
        })?;
        daemon.use_containerd(&ctd)?;
        let r = CritestRun {
            critest: tools.bin("critest", "critest")?,
            endpoint: ctd.address().to_path_buf(),
            image: image.into(),
            web_server_image: HTTPD.into(),
            registry_prefix: String::new(),
            runtime_handler: handler.into(),
            focus: focus.clone(),
            skip: skip.clone(),
            dir: tmp.path().join(name),
            timeout: Duration::from_secs(3000),
        };
        let (results, log) = r.run(&ns)?;
        Ok((results, log, ctd))
    };
    let (weenv_r, weenv_log, ctd) = run("weenv", WEENV_HANDLER, &weenv, "weenv")?;
    let remote = daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
    drop(ctd);
    let (ctl_r, _, ctd) = run("overlayfs", "", &gz, "control")?;
    drop(ctd);
    let count = |r: &std::collections::BTreeMap<String, (Outcome, String)>, o| {
        r.values().filter(|(x, _)| *x == o).count()
    };
    println!(
        "critest (containerd 2.x): weenv + weenv handler: {} passed, {} failed, {} skipped; \
         overlayfs + runc: {} passed, {} failed, {} skipped; {remote} remote snapshots",
        count(&weenv_r, Outcome::Passed),
        count(&weenv_r, Outcome::Failed),
        count(&weenv_r, Outcome::Skipped),
        count(&ctl_r, Outcome::Passed),
        count(&ctl_r, Outcome::Failed),
        count(&ctl_r, Outcome::Skipped),
    );
    println!("{}", table("weenv", &weenv_r, "overlayfs + runc", &ctl_r));
    let regressions: Vec<&String> = ctl_r
        .iter()
        .filter(|(name, (o, _))| {
            *o == Outcome::Passed && weenv_r.get(*name).map(|(w, _)| *w) != Some(Outcome::Passed)
        })
        .map(|(n, _)| n)
        .collect();
    let (known, regressions): (Vec<&String>, Vec<&String>) = regressions
        .into_iter()
        .partition(|n| KNOWN.iter().any(|(k, _)| n.contains(k)));
    for n in &known {
        let why = KNOWN.iter().find(|(k, _)| n.contains(k)).map(|(_, w)| *w);
        println!("known difference: {n}: {}", why.unwrap_or_default());
    }
    ensure!(
        regressions.is_empty(),
        "specs passing with overlayfs + runc but not with weenv: {regressions:?}\n{weenv_log}\n{}",
        daemon.log()
    );
    ensure!(
        count(&weenv_r, Outcome::Passed) > 0,
        "no spec passed:\n{weenv_log}"
    );
    ensure!(
        remote >= 1,
        "the weenv image was not mounted lazily ({remote} remote)"
    );
    Ok(())
}
