//! weenv-snapshotter with the Debian+python3 image (≈175 MB of tar, 3 layers), converted to
//! weenv: `weenv pull` + `ctr run --snapshotter weenv python3 -c ...` succeeds while the
//! registry (counted at a proxy in front of it, every byte of every response) serves < 10% of
//! the image's bytes (its uncompressed size; background fill off, so only the workload's
//! reads count; the share of the compressed layer bytes is printed too); then
//! conformance: every file seen through weenv equals the same image unpacked by containerd's
//! stock overlayfs snapshotter (path, type, mode, uid/gid, size, content hash, symlink target,
//! device numbers, xattrs, hardlink groups; deletions/opaque dirs across the 3 layers show up
//! as missing/extra paths).

mod snapshotter_common;

use anyhow::{ensure, Result};
use snapshotter_common::*;
use weenv_integration::containerd::{Containerd, ContainerdOptions};

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, debootstrap"]
async fn python_lazy_start_and_conformance_with_overlayfs() -> Result<()> {
    let py = PythonImage::start().await?;
    let (proxy, c, report) = (&py.proxy, &py.client, &py.report);
    let weenv_direct = py.direct.clone();
    let tmp = &py.tmp;
    let weenv = format!("{}/python:weenv", proxy.host());
    // The image's bytes: its uncompressed size (the ≥150 MB rootfs); the compressed layer bytes
    // are printed for reference.
    let image_bytes: u64 = report.manifests[0].layers.iter().map(|l| l.tar_size).sum();
    let layer_bytes = image_layer_bytes(c, &weenv_direct).await?;
    ensure!(
        image_bytes > 150_000_000,
        "python image is only {image_bytes} bytes"
    );

    let daemon = Daemon::start(&tmp.path().join("snap"), &py.daemon_options())?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;

    proxy.stats().clear();
    let rep = daemon.pull(ctd.address(), "lazy", &weenv)?;
    ensure!(rep.contains("3 lazy, 0 applied"), "{rep}");
    let out = ctr_run(
        &ctd,
        "lazy",
        "weenv",
        &weenv,
        "py1",
        &[
            "python3",
            "-c",
            "import json, sys; print(json.dumps({'ok': sys.version_info[0]}))",
        ],
    )?;
    ensure!(out.contains("{\"ok\": 3}"), "{out}\n{}", daemon.log());
    let served = proxy.stats().bytes_served();
    println!(
        "python3 start: registry served {served} bytes = {:.2}% of the image's {image_bytes} bytes \
         ({:.2}% of its {layer_bytes} compressed layer bytes)",
        100.0 * served as f64 / image_bytes as f64,
        100.0 * served as f64 / layer_bytes as f64
    );
    ensure!(
        served * 10 < image_bytes,
        "registry served {served} bytes, not < 10% of {image_bytes}: {:#?}",
        proxy
            .stats()
            .requests()
            .iter()
            .map(|r| format!("{} {} {:?} {}", r.method, r.path, r.range, r.response_bytes))
            .collect::<Vec<_>>()
    );

    // Conformance: the whole tree through weenv vs the stock overlayfs unpack.
    let o = ctd.ctr_ns("native", &["images", "pull", "--plain-http", &weenv_direct])?;
    ensure!(
        o.status.success(),
        "stock pull: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let native = ctr_run(
        &ctd,
        "native",
        "overlayfs",
        &weenv_direct,
        "tree-native",
        &["python3", "-c", TREE_SCRIPT],
    )?;
    let lazy = ctr_run(
        &ctd,
        "lazy",
        "weenv",
        &weenv,
        "tree-weenv",
        &["python3", "-c", TREE_SCRIPT],
    )?;
    let (n, l): (Vec<&str>, Vec<&str>) = (native.lines().collect(), lazy.lines().collect());
    ensure!(n.len() > 1000, "native tree has only {} entries", n.len());
    let ns: std::collections::BTreeSet<&str> = n.iter().copied().collect();
    let ls: std::collections::BTreeSet<&str> = l.iter().copied().collect();
    let only_native: Vec<_> = ns.difference(&ls).take(20).collect();
    let only_weenv: Vec<_> = ls.difference(&ns).take(20).collect();
    ensure!(
        only_native.is_empty() && only_weenv.is_empty(),
        "trees differ ({} vs {} entries)\nonly native: {only_native:#?}\nonly weenv: {only_weenv:#?}",
        n.len(),
        l.len()
    );
    println!("conformance: {} entries identical", n.len());
    Ok(())
}
