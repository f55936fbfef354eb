//! Untrusted images inside ONE containerd namespace (issue 24, item 1): image poisoning where
//! containerd itself reuses a chain.
//!
//! EVIL (see `untrusted_common`) claims GOOD's diff_ids, so its chain id is GOOD's. Pulled
//! lazily first in a namespace, its layer is committed under that chain; containerd's unpacker
//! (nerdctl, the Go client, CRI) then asks `Stat(chainID)` for GOOD and reuses the chain
//! without a Prepare. Every test asserts on the text of `/etc/weenv` that GOOD's container
//! prints (or on GOOD failing loudly), never EVIL's, through each client path:
//! - `weenv pull` (namespace `default`): the CLI sees the chain is a lazy layer bound to
//!   another blob (`weenv.io/bound-layer` on the Stat answer), has the daemon verify it
//!   (quarantined) and replaces the chain; `ctr run GOOD` prints GOOD's text.
//! - the Go client making nerdctl's calls (`stockrun`, namespace `default`) and CRI's
//!   PullImage (namespace `k8s.io`): GOOD's unpack `Stat` reaches the daemon, which finds
//!   GOOD's manifest in containerd's content store claiming the chain with another layer,
//!   verifies EVIL's layer on the spot (full fetch + diff_id check), quarantines it and fails
//!   the Stat: GOOD's pull fails with the reason. With `trust.check_contested = false` the same
//!   steps show EVIL's text in GOOD's container: the attack the gate stops.
//! - `trust.lazy_sources` without EVIL's repository: EVIL is never lazy (containerd unpacks it
//!   and refuses its diff_id), GOOD is lazy and right.
//!
//! The exposure window (EVIL's commit → quarantine, with and without a contest) is printed.

mod snapshotter_common;
mod untrusted_common;

use anyhow::{bail, ensure, Context, Result};
use snapshotter_common::*;
use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use untrusted_common::*;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::cri::{api, Cri, CriOptions};
use weenv_integration::stockrun;
use weenv_snapshotter_api::config::TrustSection;

const QUARANTINED: &str = "QUARANTINED (reads fail with EIO): diff_id mismatch";

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `stockrun IMAGE cat /etc/weenv` in `ns` (pull with unpack, container, task): its output,
/// whatever the exit.
fn stockrun_cat(bin: &std::path::Path, ctd: &Containerd, ns: &str, image: &str) -> Result<Output> {
    Command::new(bin)
        .arg("-address")
        .arg(ctd.address())
        .args([
            "-namespace",
            ns,
            "-snapshotter",
            "weenv",
            "-plain-http",
            image,
        ])
        .args(CAT)
        .output()
        .context("running stockrun")
}

/// A daemon (background fill off unless `fill`, `[trust]` set by `trust`) and a containerd
/// using it, with the daemon reading that containerd's content store.
fn stack(
    g: &Good,
    name: &str,
    fill: bool,
    trust: impl FnOnce(&mut TrustSection),
) -> Result<(Daemon, Containerd)> {
    let daemon = Daemon::start_with(
        &g.tmp.path().join(name),
        &DaemonOptions {
            plain_http: vec![g.host.clone()],
            fill,
            fill_extra: "quiet_ms = 0".into(),
        },
        &[],
        |c| trust(&mut c.trust),
    )?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;
    daemon.use_containerd(&ctd)?;
    Ok((daemon, ctd))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn weenv_pull_never_reuses_a_chain_bound_to_another_blob() -> Result<()> {
    let g = good_image().await?;
    let evil = format!("{}/app:evil", g.host);
    let evil_layer = push_evil(&g.cl, &g.img, &g.good, &evil).await?;
    // Fill off: nothing verifies EVIL's layer in the background. The content store is not
    // shown to the daemon either (no contest check): the CLI's own check is what is tested.
    let daemon = Daemon::start(
        &g.tmp.path().join("snap"),
        &DaemonOptions {
            plain_http: vec![g.host.clone()],
            fill: false,
            fill_extra: String::new(),
        },
    )?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;
    let out = daemon.pull(ctd.address(), "default", &evil)?;
    ensure!(out.contains("(1 lazy"), "EVIL pulled lazily: {out}");
    let t0 = Instant::now();
    let out = daemon.pull(ctd.address(), "default", &g.good)?;
    let pulled = t0.elapsed().as_secs_f64();
    // Replaced: applied the ordinary way (the daemon refuses a second remote snapshot of the
    // chain while EVIL's is there), or lazily once containerd collected EVIL's.
    ensure!(
        out.contains("(0 lazy, 1 applied") || out.contains("(1 lazy"),
        "GOOD not pulled by replacing EVIL's chain:\n{out}\ndaemon log:\n{}",
        daemon.log()
    );
    let out = ctr_run(&ctd, "default", "weenv", &g.good, "good1", CAT)?;
    ensure!(
        out.contains(GOOD_TEXT) && !out.contains("EVIL"),
        "GOOD's container printed: {out}"
    );
    // EVIL's layer was verified on the CLI's request and quarantined (containerd may have
    // collected its snapshot since: it was replaced).
    ensure!(daemon.metric("weenv_layer_quarantined_total")? == 1);
    ensure!(
        daemon.log().contains("layer quarantined") && daemon.log().contains(&evil_layer),
        "EVIL's layer not quarantined by the verification:\n{}",
        daemon.log()
    );
    println!(
        "weenv pull GOOD over EVIL's chain (verify EVIL's layer, replace the chain): {pulled:.2} s"
    );
    // A later pull of GOOD reuses its own (now ordinary) chain.
    let again = daemon.pull(ctd.address(), "default", &g.good)?;
    ensure!(again.contains("1 present"), "{again}");
    Ok(())
}

/// The Go client's unpacker (nerdctl's calls) in `default`: with the contest check GOOD's pull
/// fails loudly; without it GOOD runs EVIL's files (the attack). Prints the exposure window.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, go + golang-github-containerd-containerd-dev"]
async fn go_client_unpack_of_a_contested_chain_fails_loudly() -> Result<()> {
    let g = good_image().await?;
    let bin = stockrun::build(&g.tmp.path().join("go"))?;
    let evil = format!("{}/app:evil", g.host);
    let evil_layer = push_evil(&g.cl, &g.img, &g.good, &evil).await?;

    // Without the gate: the attack as issue 24 found it.
    {
        let (daemon, ctd) = stack(&g, "open", false, |t| t.check_contested = false)?;
        let o = stockrun_cat(&bin, &ctd, "default", &evil)?;
        ensure!(text(&o).contains(EVIL_TEXT), "EVIL's own run: {}", text(&o));
        let o = stockrun_cat(&bin, &ctd, "default", &g.good)?;
        ensure!(
            o.status.success() && text(&o).contains(EVIL_TEXT),
            "without the contest check GOOD was expected to run EVIL's files (the attack); got:\n{}\n{}",
            text(&o),
            daemon.log()
        );
        println!("check_contested = false: GOOD's container printed EVIL's /etc/weenv (attack reproduced)");
    }

    // With the gate (the default).
    let (daemon, ctd) = stack(&g, "gated", false, |_| {})?;
    let o = stockrun_cat(&bin, &ctd, "default", &evil)?;
    ensure!(text(&o).contains(EVIL_TEXT), "EVIL's own run: {}", text(&o));
    ensure!(daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")? >= 1);
    let t0 = Instant::now();
    let o = stockrun_cat(&bin, &ctd, "default", &g.good)?;
    let held = t0.elapsed().as_secs_f64();
    let out = text(&o);
    ensure!(
        !out.contains(EVIL_TEXT),
        "GOOD's container printed EVIL's files:\n{out}"
    );
    ensure!(
        !o.status.success() && out.contains("quarantined") && out.contains(&evil_layer),
        "GOOD's pull did not fail loudly naming EVIL's layer:\n{out}\ndaemon log:\n{}",
        daemon.log()
    );
    ensure!(daemon.metric("weenv_contested_snapshots_total")? >= 1);
    ensure!(daemon.metric("weenv_layer_quarantined_total")? == 1);
    // EVIL itself is refused from now on too (loudly, not EIO at run time).
    let o = stockrun_cat(&bin, &ctd, "default", &evil)?;
    ensure!(
        !o.status.success() && !text(&o).contains(EVIL_TEXT),
        "quarantined EVIL still runs:\n{}",
        text(&o)
    );
    println!(
        "Go client, default namespace: GOOD's pull held {held:.2} s (EVIL's layer fetched in \
         full and checked), then failed: {}",
        out.lines()
            .find(|l| l.contains("quarantined"))
            .unwrap_or("")
            .trim()
    );
    drop(ctd);
    drop(daemon);

    // The window without a contest: EVIL's commit -> quarantine by the background fill.
    let (daemon, ctd) = stack(&g, "fill", true, |_| {})?;
    let t0 = Instant::now();
    let o = stockrun_cat(&bin, &ctd, "default", &evil)?;
    let pulled = t0.elapsed().as_secs_f64();
    // EVIL's own run may already fail: the fill may quarantine it first.
    println!("EVIL's run with the fill on: {}", text(&o).trim());
    let deadline = Instant::now() + Duration::from_secs(120);
    while !daemon.weenv(&["status"])?.contains(QUARANTINED) {
        if Instant::now() > deadline {
            bail!("EVIL not quarantined by the fill:\n{}", daemon.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "exposure window without a contest (fill on, quiet_ms = 0): EVIL quarantined {:.2} s \
         after its pull started ({pulled:.2} s pull + run)",
        t0.elapsed().as_secs_f64()
    );
    let o = stockrun_cat(&bin, &ctd, "default", &g.good)?;
    ensure!(
        !o.status.success() && !text(&o).contains(EVIL_TEXT),
        "GOOD after EVIL's quarantine:\n{}",
        text(&o)
    );
    drop(ctd);
    drop(daemon);

    // The same with trust.verify_on_commit: the layer is verified right after its commit.
    let (daemon, ctd) = stack(&g, "eager", false, |t| t.verify_on_commit = true)?;
    let t0 = Instant::now();
    let o = stockrun_cat(&bin, &ctd, "default", &evil)?;
    println!("EVIL's run with verify_on_commit: {}", text(&o).trim());
    let deadline = Instant::now() + Duration::from_secs(120);
    while daemon.metric("weenv_layer_quarantined_total")? == 0 {
        if Instant::now() > deadline {
            bail!("EVIL not quarantined after its commit:\n{}", daemon.log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "exposure window without a contest, trust.verify_on_commit = true (fill off): EVIL \
         quarantined {:.2} s after its pull started",
        t0.elapsed().as_secs_f64()
    );
    ensure!(
        daemon.log().contains("layer verified after its commit"),
        "{}",
        daemon.log()
    );
    Ok(())
}

/// CRI PullImage of `image` (the kubelet's call); the error message on failure.
async fn cri_pull(cri: &mut Cri, image: &str) -> std::result::Result<(), String> {
    let fut = cri.image.pull_image(api::PullImageRequest {
        image: Some(api::ImageSpec {
            image: image.to_string(),
            annotations: HashMap::new(),
        }),
        sandbox_config: None,
    });
    match tokio::time::timeout(Duration::from_secs(300), fut).await {
        Ok(r) => r.map(|_| ()).map_err(|s| s.message().to_string()),
        Err(_) => Err("PullImage did not answer in 300 s".to_string()),
    }
}

/// CRI's PullImage in `k8s.io` (the namespace every pod of a node shares).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn cri_pull_of_a_contested_chain_fails_loudly_in_k8s_io() -> Result<()> {
    let g = good_image().await?;
    let evil = format!("{}/app:evil", g.host);
    let evil_layer = push_evil(&g.cl, &g.img, &g.good, &evil).await?;
    for gated in [false, true] {
        let daemon = Daemon::start_with(
            &g.tmp.path().join(format!("cri-{gated}")),
            &DaemonOptions {
                plain_http: vec![g.host.clone()],
                fill: false,
                fill_extra: String::new(),
            },
            &[],
            |c| c.trust.check_contested = gated,
        )?;
        let ctd = Containerd::start(ContainerdOptions {
            proxy_snapshotter: Some(daemon.socket.clone()),
            cri: Some(CriOptions {
                snapshotter: "weenv".into(),
                disable_snapshot_annotations: true,
                sandbox_image: format!("{}/pause:none", g.host),
                plain_http: vec![g.host.clone()],
                cni: None,
                mirrors: vec![],
            }),
            ..Default::default()
        })?;
        daemon.use_containerd(&ctd)?;
        let mut cri = Cri::connect(&ctd).await?;
        cri_pull(&mut cri, &evil)
            .await
            .map_err(|e| anyhow::anyhow!("CRI PullImage EVIL: {e}\n{}", daemon.log()))?;
        ensure!(daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")? >= 1);
        let t0 = Instant::now();
        let good_pull = cri_pull(&mut cri, &g.good).await;
        let held = t0.elapsed().as_secs_f64();
        // What a pod of GOOD would run: GOOD's image in k8s.io, as CRI left it.
        let run = ctr_run(
            &ctd,
            "k8s.io",
            "weenv",
            &g.good,
            &format!("good-{gated}"),
            CAT,
        );
        if gated {
            let e = good_pull
                .err()
                .context("GOOD's PullImage succeeded over EVIL's chain")?;
            ensure!(e.contains("quarantined") && e.contains(&evil_layer), "{e}");
            if let Ok(out) = &run {
                ensure!(!out.contains("EVIL"), "GOOD's container printed: {out}");
            }
            println!("CRI k8s.io: GOOD's PullImage held {held:.2} s, then failed: {e}");
        } else {
            good_pull.map_err(|e| anyhow::anyhow!("ungated GOOD pull: {e}"))?;
            let out = run?;
            ensure!(
                out.contains(EVIL_TEXT),
                "without the contest check GOOD was expected to run EVIL's files; got {out}"
            );
            println!("CRI k8s.io, check_contested = false: GOOD's container printed EVIL's /etc/weenv (attack reproduced)");
        }
    }
    Ok(())
}

/// `trust.lazy_sources` naming GOOD's repository only: EVIL (another repository) never becomes
/// a remote snapshot — containerd unpacks it the ordinary way and refuses its diff_id — and
/// GOOD stays lazy.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, go + golang-github-containerd-containerd-dev"]
async fn lazy_sources_keep_untrusted_repositories_on_the_verified_path() -> Result<()> {
    let g = good_image().await?;
    let bin = stockrun::build(&g.tmp.path().join("go"))?;
    let evil = format!("{}/tenant/evil:1", g.host);
    push_evil(&g.cl, &g.img, &g.good, &evil).await?;
    let (daemon, ctd) = stack(&g, "policy", false, |t| {
        t.lazy_sources = vec![format!("{}/app", g.host)]
    })?;
    let o = stockrun_cat(&bin, &ctd, "default", &evil)?;
    ensure!(
        !o.status.success() && text(&o).contains("wrong diff id"),
        "EVIL from an untrusted repository was not refused:\n{}\n{}",
        text(&o),
        daemon.log()
    );
    ensure!(daemon.metric("weenv_remote_prepares_total{outcome=\"untrusted_source\"}")? >= 1);
    ensure!(daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")? == 0);
    let o = stockrun_cat(&bin, &ctd, "default", &g.good)?;
    ensure!(
        o.status.success() && text(&o).contains(GOOD_TEXT),
        "GOOD: {}",
        text(&o)
    );
    ensure!(daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")? >= 1);
    Ok(())
}
