//! A converted image is an ordinary image for stock containerd: busybox is pushed to a private
//! registry, converted registry-to-registry by `weenv-convert` (config blob mounted across
//! repositories, the layer uploaded in chunks), pulled by a private stock containerd with the default overlayfs snapshotter
//! (`ctr images pull --plain-http`) and run with `ctr run`. Then `inspect` through a counting
//! proxy reads each weenv layer's TOC with exactly one ranged GET and no full blob GET, and a
//! re-conversion into another repository mounts every blob instead of uploading it.

mod convert_common;

use anyhow::{ensure, Context, Result};
use convert_common::*;
use weenv_converter::inspect_image;
use weenv_converter::ImageLocation;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::images;
use weenv_integration::registry::{CountingProxy, LocalRegistry};
use weenv_integration::util::{require_root_and_bins, E2E_BINS};

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, docker-registry, skopeo, umoci"]
async fn stock_containerd_pulls_and_runs_converted_image() -> Result<()> {
    require_root_and_bins(E2E_BINS)?;
    let tmp = tempfile::tempdir()?;
    let reg = LocalRegistry::start(tmp.path())?;
    let host = reg.host();
    let src = reg.push(&images::busybox()?, "busybox:1")?;

    let client = client(std::slice::from_ref(&host))?;
    let dst = format!("{host}/busybox-weenv:1");
    // Through a counting proxy, with 256 KiB upload chunks: the ~1 MiB layer goes up in
    // several PATCHes (chunked upload) and the config is mounted from the source repository.
    let proxy = CountingProxy::start(reg.addr())?;
    let pclient = client_for(&proxy.host())?;
    let opts = weenv_converter::ConvertOptions {
        upload_chunk: 256 << 10,
        ..Default::default()
    };
    let report = convert_with(
        &pclient,
        &format!("{}/busybox:1", proxy.host()),
        &format!("{}/busybox-weenv:1", proxy.host()),
        &opts,
    )
    .await?;
    ensure!(report.manifests.len() == 1 && !report.manifests[0].layers.is_empty());
    let layer_size = report.manifests[0].layers[0].size;
    let reqs = proxy.stats().requests();
    let patches = reqs.iter().filter(|r| r.method == "PATCH").count() as u64;
    ensure!(
        patches == layer_size.div_ceil(256 << 10),
        "{patches} PATCHes for a {layer_size}-byte layer: {reqs:#?}"
    );
    ensure!(
        reqs.iter()
            .any(|r| r.method == "POST" && r.path.contains("mount=") && r.status == 201),
        "config not mounted: {reqs:#?}"
    );

    // Converting again into the same repository pushes nothing new and gives the same digest.
    let again = convert(&client, &src, &dst).await?;
    ensure!(again.digest == report.digest, "second conversion differs");

    let ctd = Containerd::start(ContainerdOptions::default())?;
    let pulled = ctd.ctr_ok(&["images", "pull", "--plain-http", &dst])?;
    println!("{pulled}");
    let out = ctd.ctr_ok(&[
        "run",
        "--rm",
        &dst,
        "convert-e2e",
        "/bin/sh",
        "-c",
        "cat /etc/weenv; echo ran-ok",
    ])?;
    ensure!(
        out.contains("hello from weenv test image") && out.contains("ran-ok"),
        "unexpected container output: {out:?}"
    );
    let info = ctd.ctr_ok(&["images", "ls"])?;
    ensure!(info.contains(&dst), "image not listed: {info}");

    // TOC of every layer through a counting proxy: one ranged GET each, no full blob GET.
    let pref = format!("{}/busybox-weenv:1", proxy.host());
    proxy.stats().clear();
    let layers = inspect_image(&pclient, &ImageLocation::parse(&pref)?, None).await?;
    ensure!(
        layers.iter().all(|l| l.weenv && l.entries > 0),
        "{layers:?}"
    );
    let reqs = proxy.stats().requests();
    let blob_gets: Vec<_> = reqs
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/blobs/"))
        .collect();
    // inspect reads manifests and TOCs only: one ranged GET per layer, nothing else.
    let ranged = blob_gets.iter().filter(|r| r.range.is_some()).count();
    let full = blob_gets.iter().filter(|r| r.range.is_none()).count();
    ensure!(
        ranged == layers.len(),
        "ranged GETs {ranged} for {} layers: {reqs:#?}",
        layers.len()
    );
    ensure!(full == 0, "full blob GETs during inspect: {reqs:#?}");

    // Re-converting the weenv image into another repository of the same registry passes every
    // layer through and mounts every blob across repositories: no blob bytes are uploaded.
    proxy.stats().clear();
    let copy = format!("{}/busybox-copy:1", proxy.host());
    let r = convert(&pclient, &pref, &copy).await?;
    ensure!(
        r.digest == report.digest,
        "pass-through changed the manifest"
    );
    let reqs = proxy.stats().requests();
    let mounts = reqs
        .iter()
        .filter(|r| r.method == "POST" && r.path.contains("mount=") && r.status == 201)
        .count();
    let uploads: Vec<_> = reqs
        .iter()
        .filter(|r| r.method == "PATCH" || (r.method == "PUT" && r.path.contains("/blobs/")))
        .collect();
    ensure!(
        mounts == 1 + layers.len(),
        "expected config + layers mounted: {reqs:#?}"
    );
    ensure!(uploads.is_empty(), "blob bytes uploaded: {uploads:#?}");
    Ok(())
}

fn client_for(host: &str) -> Result<weenv_registry::Client> {
    client(&[host.to_string()]).context("client")
}
