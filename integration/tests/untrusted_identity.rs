//! Untrusted images against layer identity (issue 9, hole 1: snapshot poisoning).
//!
//! EVIL is the busybox test image with another `/etc/weenv`, converted to weenv, whose image
//! config is GOOD's: it claims GOOD's diff_ids, so its chain ids are GOOD's. Tenant A pulls
//! EVIL with `weenv pull`; the victim pulls GOOD in namespace B and `ctr run` must print GOOD's
//! content, never EVIL's. Then, with the background fill on, EVIL's layer completes, its
//! stream hashes to another diff_id than claimed, and it is quarantined: reads of its files
//! fail, `weenv status` and `/metrics` say so, the quarantine survives a daemon restart, and a
//! later pull of EVIL gets no lazy layer (the ordinary path refuses the wrong diff_id, as
//! containerd's unpacker does).
//!
//! LIAR is busybox's own tar whose TOC marks `/etc/weenv` setuid: the daemon's lazy header
//! check catches it before exposing the entry (fill off), and quarantines the layer.

mod snapshotter_common;
mod untrusted_common;

use anyhow::{bail, ensure, Context, Result};
use snapshotter_common::*;
use std::process::Command;
use std::time::{Duration, Instant};
use untrusted_common::*;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::images::OciImage;
use weenv_registry::Client;

/// Pushes LIAR: busybox's own tar (the diff_id GOOD claims is true) whose TOC says
/// `/etc/weenv` is setuid.
async fn push_liar(cl: &Client, img: &OciImage, good: &str, liar: &str) -> Result<String> {
    let tar = layout_layer_tar(img)?;
    let mut blob = Vec::new();
    let sum = weenv_format::write_layer(&tar[..], &mut blob, &Default::default())?;
    let (_, mut toc) =
        weenv_format::reader::parse_tail(&blob[sum.toc_offset as usize..], sum.blob_size, None)?;
    let e = toc
        .entries
        .iter_mut()
        .find(|e| e.path == "etc/weenv")
        .context("etc/weenv in the TOC")?;
    e.mode |= 0o4000;
    let (blob, hint) = weenv_format::writer::retail(&blob, sum.toc_offset, &toc)?;
    let annotations = [
        (weenv_format::ANNOTATION_TOC_DIGEST, hint.digest.to_string()),
        (weenv_format::ANNOTATION_TOC_OFFSET, hint.offset.to_string()),
        (weenv_format::ANNOTATION_TOC_LENGTH, hint.length.to_string()),
        (
            weenv_format::ANNOTATION_FORMAT_VERSION,
            weenv_format::FORMAT_VERSION.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    push_with_layer(cl, good, liar, blob, annotations).await
}

/// `ctr run` that must fail without showing EVIL's content.
fn run_fails(ctd: &Containerd, ns: &str, image: &str, id: &str) -> Result<()> {
    match ctr_run(ctd, ns, "weenv", image, id, CAT) {
        Ok(out) => bail!("quarantined layer served: {out}"),
        Err(e) => {
            ensure!(!e.to_string().contains("EVIL"), "{e}");
            Ok(())
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn forged_diff_ids_never_poison_another_namespace() -> Result<()> {
    let g = good_image().await?;
    let (cl, img, host, good, tmp) = (&g.cl, &g.img, &g.host, &g.good, &g.tmp);
    let evil = format!("{host}/app:evil");
    let evil_layer = push_evil(cl, img, good, &evil).await?;

    let mut daemon = Daemon::start(
        &tmp.path().join("snap"),
        &DaemonOptions {
            plain_http: vec![host.clone()],
            fill: true,
            fill_extra: "quiet_ms = 0".into(),
        },
    )?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;

    // Tenant A: EVIL, lazily (its claim cannot be checked before the layer is complete).
    let out = daemon.pull(ctd.address(), "tenant-a", &evil)?;
    ensure!(out.contains("(1 lazy"), "EVIL pulled lazily: {out}");
    // Victim B: GOOD under the same chain id gets GOOD's layer.
    daemon.pull(ctd.address(), "victim-b", good)?;
    let out = ctr_run(&ctd, "victim-b", "weenv", good, "victim1", CAT)?;
    ensure!(
        out.contains(GOOD_TEXT) && !out.contains("EVIL"),
        "victim got: {out}\ndaemon log:\n{}",
        daemon.log()
    );
    ensure!(
        daemon.metric("weenv_remote_prepares_total{outcome=\"refused\"}")? >= 1,
        "GOOD's Prepare was not refused EVIL's snapshot"
    );

    // EVIL's layer completes: its diff_id is not GOOD's -> quarantined.
    let hex = &evil_layer["sha256:".len()..];
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        let s = daemon.weenv(&["status"])?;
        if s.contains("QUARANTINED (reads fail with EIO): diff_id mismatch") {
            break s;
        }
        if Instant::now() > deadline {
            bail!(
                "EVIL's layer not quarantined:\n{s}\ndaemon log:\n{}",
                daemon.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(status.contains(&hex[..12]), "{status}");
    ensure!(daemon.metric("weenv_layer_quarantined_total")? == 1);
    ensure!(
        daemon.log().contains("layer quarantined") && daemon.log().contains(&evil_layer),
        "quarantine not logged with the layer digest"
    );
    run_fails(&ctd, "tenant-a", &evil, "evil1")?;
    // GOOD is unaffected.
    let out = ctr_run(&ctd, "victim-b", "weenv", good, "victim2", CAT)?;
    ensure!(out.contains(GOOD_TEXT), "victim after quarantine: {out}");

    // The quarantine survives a restart.
    daemon.restart()?;
    let s = daemon.weenv(&["status"])?;
    ensure!(s.contains("QUARANTINED"), "after restart:\n{s}");
    run_fails(&ctd, "tenant-a", &evil, "evil2")?;

    // A new pull of EVIL gets no lazy layer, and the ordinary path refuses its diff_id.
    let sock = ctd.address().display().to_string();
    let o = Command::new(weenv_integration::util::workspace_bin("weenv")?)
        .args(["--config"])
        .arg(&daemon.config)
        .args(["pull", "-a", &sock, "-n", "tenant-c", "--plain-http", &evil])
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    ensure!(
        !o.status.success() && text.contains("wrong diff_id"),
        "EVIL pulled again: {text}"
    );
    Ok(())
}

/// A TOC that lies about its tar (a file the tar has as 0644 marked setuid) is caught by the
/// lazy header check before the entry is exposed — with the background fill off, so the
/// completion walk plays no part: the lookup fails, the layer is quarantined.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn a_lying_toc_is_caught_before_the_entry_is_exposed() -> Result<()> {
    let g = good_image().await?;
    let (cl, img, host, good, tmp) = (&g.cl, &g.img, &g.host, &g.good, &g.tmp);
    let liar = format!("{host}/app:liar");
    let liar_layer = push_liar(cl, img, good, &liar).await?;
    let (daemon, ctd) = lazy_stack(&tmp.path().join("snap"), host)?;
    let out = daemon.pull(ctd.address(), "t", &liar)?;
    ensure!(out.contains("(1 lazy"), "LIAR pulled lazily: {out}");
    // Plain files are served (their headers check out)...
    let ok = ctr_run(&ctd, "t", "weenv", &liar, "liar1", &["/bin/echo", "plain"])?;
    ensure!(ok.contains("plain"), "{ok}");
    // ...the setuid entry the tar does not have is not.
    match ctr_run(&ctd, "t", "weenv", &liar, "liar2", CAT) {
        Ok(out) => bail!("setuid entry served: {out}"),
        Err(e) => ensure!(!e.to_string().contains(GOOD_TEXT), "{e}"),
    }
    let s = daemon.weenv(&["status"])?;
    ensure!(
        s.contains("QUARANTINED (reads fail with EIO): the TOC does not match the tar stream")
            && s.contains("etc/weenv")
            && s.contains(&liar_layer["sha256:".len()..][..12]),
        "{s}\ndaemon log:\n{}",
        daemon.log()
    );
    ensure!(daemon.metric("weenv_layer_quarantined_total")? == 1);
    ensure!(daemon.metric("weenv_header_checks_total")? >= 1);
    Ok(())
}

/// What the lazy header checks cost at cold start: `python3 -c 'import json'` on the
/// Debian+python3 image, each run on a fresh daemon and containerd (cold caches, fill off so
/// only the workload's reads count), checks on and off alternately. Prints the registry bytes
/// (counted at the proxy), range requests and the `ctr run` wall time; checks on must have
/// checked headers, checks off none.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, debootstrap"]
async fn header_checks_cost_at_cold_start() -> Result<()> {
    let py = PythonImage::start().await?;
    let weenv = format!("{}/python:weenv", py.proxy.host());
    let rounds: usize = std::env::var("WEENV_CHECK_COST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // (checks on, bytes, requests, seconds)
    type Sample = (bool, u64, u64, f64);
    let mut results: Vec<Sample> = Vec::new();
    // WEENV_CHECK_COST_CMD: another python3 workload (must print ok).
    let workload = std::env::var("WEENV_CHECK_COST_CMD")
        .unwrap_or_else(|_| "import json; print('ok')".to_string());
    for round in 0..rounds {
        for checks in [true, false] {
            let mut opts = py.daemon_options();
            opts.fill_extra = format!("check_headers = {checks}");
            let root = py.tmp.path().join(format!("snap-{round}-{checks}"));
            let daemon = Daemon::start(&root, &opts)?;
            let ctd = Containerd::start(ContainerdOptions {
                proxy_snapshotter: Some(daemon.socket.clone()),
                ..Default::default()
            })?;
            daemon.pull(ctd.address(), "m", &weenv)?;
            py.proxy.stats().clear();
            let t0 = Instant::now();
            let out = ctr_run(
                &ctd,
                "m",
                "weenv",
                &weenv,
                &format!("py-{round}-{checks}"),
                &["python3", "-c", &workload],
            )?;
            let secs = t0.elapsed().as_secs_f64();
            ensure!(out.contains("ok"), "{out}");
            let bytes = py.proxy.stats().bytes_served();
            let requests = py.proxy.stats().requests().len() as u64;
            let checked = daemon.metric("weenv_header_checks_total")?;
            ensure!(
                (checked > 0) == checks,
                "checks {checks}: {checked} headers checked"
            );
            ensure!(daemon.metric("weenv_layer_quarantined_total")? == 0);
            println!(
                "round {round} checks={checks}: {bytes} bytes, {requests} requests, {secs:.3} s, {checked} headers checked"
            );
            results.push((checks, bytes, requests, secs));
            drop(ctd);
            drop(daemon);
        }
    }
    let median = |checks: bool, f: &dyn Fn(&Sample) -> f64| {
        let mut v: Vec<f64> = results.iter().filter(|r| r.0 == checks).map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (b1, b0) = (
        median(true, &|r| r.1 as f64),
        median(false, &|r| r.1 as f64),
    );
    let (q1, q0) = (
        median(true, &|r| r.2 as f64),
        median(false, &|r| r.2 as f64),
    );
    let (t1, t0) = (median(true, &|r| r.3), median(false, &|r| r.3));
    println!(
        "header checks cost (median of {rounds}): bytes {b1:.0} vs {b0:.0} ({:+.1}%), requests {q1:.0} vs {q0:.0}, time {t1:.3} s vs {t0:.3} s ({:+.1}%)",
        100.0 * (b1 - b0) / b0,
        100.0 * (t1 - t0) / t0
    );
    Ok(())
}
