//! A tampered frame in the registry is never served: reading the file fails (EIO) and the
//! daemon counts a verification failure; after the blob is repaired the next read works
//! (nothing bad was cached). Background fill is off so the bad frame is fetched on demand.

use anyhow::{ensure, Context, Result};
use std::os::unix::fs::FileExt;
use weenv_integration::images;
use weenv_integration::stack::Stack;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn tampered_frame_is_never_served() -> Result<()> {
    let stack = Stack::builder()
        .fill_extra(&std::env::var("WEENV_TEST_FILL_EXTRA").unwrap_or_default())
        .start()?;
    let (reg, daemon, ctd) = (&stack.reg, &stack.daemon, &stack.ctd);
    let image = stack.push_converted(&images::busybox()?, "busybox").await?;
    let (weenv, rep) = (image.weenv, image.report);
    let layer = rep.manifests[0].layers[0].clone();
    let digest = layer.digest.clone();
    let hex = digest.trim_start_matches("sha256:");
    let blob = reg
        .root()
        .join("data/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    // Locate the frame holding /etc/weenv and flip one byte in the middle of it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&blob)?;
    let reader = weenv_format::reader::LayerReader::open(&f, None)?;
    let entry = reader.entry("etc/weenv").context("etc/weenv in TOC")?;
    let frame = &reader.toc().frames[entry.chunks[0].frame.0 as usize];
    let at = frame.offset + frame.clen / 2;
    let mut orig = [0u8; 1];
    f.read_exact_at(&mut orig, at)?;
    f.write_all_at(&[orig[0] ^ 0xff], at)?;
    f.sync_all()?;

    daemon.pull(ctd.address(), "t", &weenv)?;
    let run = |id: &str| {
        ctd.ctr_ns(
            "t",
            &[
                "run",
                "--rm",
                "--snapshotter",
                "weenv",
                &weenv,
                id,
                "/bin/sh",
                "-c",
                "cat /etc/weenv",
            ],
        )
    };
    let bad = run("tamper1")?;
    let bad_out = format!(
        "{}{}",
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr)
    );
    ensure!(!bad.status.success(), "tampered read succeeded: {bad_out}");
    ensure!(
        !bad_out.contains("hello from weenv test image"),
        "tampered content served: {bad_out}"
    );
    let metrics = daemon.weenv(&["metrics"])?;
    let failures: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("weenv_verification_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .context("verification metric")?;
    ensure!(failures >= 1, "no verification failure counted:\n{metrics}");

    // Repair the blob: the next read refetches and works.
    f.write_all_at(&orig, at)?;
    f.sync_all()?;
    let good = run("tamper2")?;
    let out = String::from_utf8_lossy(&good.stdout);
    ensure!(
        good.status.success() && out.contains("hello from weenv test image"),
        "after repair: {out}"
    );
    Ok(())
}
