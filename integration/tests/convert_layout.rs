//! Converter behaviour on OCI layouts and docker archives (no daemons): determinism,
//! pass-through of weenv layers, multi-platform indexes, tamper detection by `verify`, and
//! docker-archive input.

mod convert_common;

use anyhow::{ensure, Context, Result};
use convert_common::*;
use std::path::Path;
use weenv_converter::{verify_image, ImageLocation, LayerAction, LayerVerdict};
use weenv_integration::images;

async fn verify(layout: &Path, tag: &str) -> Result<Vec<LayerVerdict>> {
    let loc = ImageLocation::parse(&format!("oci:{}:{tag}", layout.display()))?;
    Ok(verify_image(&client(&[])?, &loc, None).await?)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs umoci, busybox-static and python3 on the host"]
async fn conversion_is_deterministic_and_idempotent() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let c = client(&[])?;
    for img in [images::busybox()?, images::python_fast()?] {
        let a = tmp.path().join(format!("a-{}", img.tag));
        let b = tmp.path().join(format!("b-{}", img.tag));
        let ra = convert(&c, &img.oci_ref(), &format!("oci:{}:x", a.display())).await?;
        let rb = convert(&c, &img.oci_ref(), &format!("oci:{}:x", b.display())).await?;
        ensure!(
            ra.digest == rb.digest,
            "{}: {} != {}",
            img.tag,
            ra.digest,
            rb.digest
        );
        ensure!(std::fs::read(a.join("index.json"))? == std::fs::read(b.join("index.json"))?);
        // Converting a weenv image passes every layer through and changes nothing.
        let rc = convert(
            &c,
            &format!("oci:{}:x", a.display()),
            &format!("oci:{}:y", a.display()),
        )
        .await?;
        ensure!(rc.digest == ra.digest, "re-conversion changed the image");
        ensure!(rc.manifests[0]
            .layers
            .iter()
            .all(|l| l.action == LayerAction::Passthrough));
        let v = verify(&a, "x").await?;
        ensure!(v.iter().all(|l| l.weenv && l.problems.is_empty()), "{v:#?}");
        ensure!(v.len() == ra.manifests[0].layers.len());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs umoci and busybox-static"]
async fn verify_detects_tampering() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let img = images::busybox()?;
    let out = tmp.path().join("out");
    convert(
        &client(&[])?,
        &img.oci_ref(),
        &format!("oci:{}:x", out.display()),
    )
    .await?;
    let m = layout_manifest(&out, "x")?;
    let blob = blob_path(&out, m.layers[0].digest.as_str());
    let mut bytes = std::fs::read(&blob)?;
    // Flip one byte inside the first data frame (frames start at offset 0).
    bytes[100] ^= 0x55;
    std::fs::write(&blob, &bytes)?;
    let v = verify(&out, "x").await?;
    let problems = v[0].problems.join("\n");
    ensure!(!v[0].problems.is_empty(), "tampered layer verified clean");
    ensure!(
        problems.contains("hashes to"),
        "blob digest mismatch not reported: {problems}"
    );
    ensure!(
        problems.contains("frame 0"),
        "bad frame not reported: {problems}"
    );
    // Tampering with the TOC is reported as a TOC problem.
    bytes[100] ^= 0x55;
    let toc_at: usize = m.layers[0].annotations["io.weenv.toc.offset"].parse()?;
    bytes[toc_at + 20] ^= 0x55;
    std::fs::write(&blob, &bytes)?;
    let v = verify(&out, "x").await?;
    let problems = v[0].problems.join("\n");
    ensure!(
        problems.contains("TOC"),
        "TOC tampering not reported: {problems}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs umoci, busybox-static and skopeo"]
async fn converts_docker_archive_input() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let img = images::busybox()?;
    let archive = tmp.path().join("busybox.tar");
    images::to_docker_archive(&img, &archive, "busybox:1")?;
    let out = tmp.path().join("out");
    let r = convert(
        &client(&[])?,
        &format!("docker-archive:{}", archive.display()),
        &format!("oci:{}:x", out.display()),
    )
    .await?;
    ensure!(r.manifests[0]
        .layers
        .iter()
        .all(|l| l.action == LayerAction::Converted));
    let src = layout_manifest(&img.layout, &img.tag)?;
    let dst = layout_manifest(&out, "x")?;
    ensure!(
        layout_diff_ids(&img.layout, &src)? == layout_diff_ids(&out, &dst)?,
        "diff_ids changed"
    );
    let v = verify(&out, "x").await?;
    ensure!(v.iter().all(|l| l.weenv && l.problems.is_empty()), "{v:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs umoci and busybox-static"]
async fn converts_multi_platform_index() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let img = images::busybox()?;
    // A copy of the busybox layout whose tag names an index with two platforms.
    let layout = tmp.path().join("multi");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&img.layout)
        .arg(&layout)
        .status()?;
    ensure!(status.success());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let m = index["manifests"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == img.tag.as_str())
        })
        .context("busybox entry")?
        .clone();
    let entry = |arch: &str| {
        serde_json::json!({"mediaType": m["mediaType"], "digest": m["digest"], "size": m["size"],
            "platform": {"os": "linux", "architecture": arch}})
    };
    let attestation = serde_json::json!({"mediaType": m["mediaType"], "digest": m["digest"],
        "size": m["size"], "platform": {"os": "unknown", "architecture": "unknown"}});
    let child = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry("amd64"), entry("arm64"), attestation]}))?;
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&child))
    );
    std::fs::write(blob_path(&layout, &digest), &child)?;
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest, "size": child.len(),
        "annotations": {"org.opencontainers.image.ref.name": "multi"}}]});
    std::fs::write(layout.join("index.json"), serde_json::to_vec(&top)?)?;

    let c = client(&[])?;
    let out = tmp.path().join("out");
    let r = convert(
        &c,
        &format!("oci:{}:multi", layout.display()),
        &format!("oci:{}:all", out.display()),
    )
    .await?;
    ensure!(r.media_type.contains("index"), "{}", r.media_type);
    let platforms: Vec<_> = r
        .manifests
        .iter()
        .filter_map(|m| m.platform.clone())
        .collect();
    ensure!(platforms == ["linux/amd64", "linux/arm64"], "{platforms:?}");
    let v = verify(&out, "all").await?;
    ensure!(
        v.len() == 2 && v.iter().all(|l| l.problems.is_empty()),
        "{v:#?}"
    );

    let one = weenv_converter::convert_image(
        &c,
        &ImageLocation::parse(&format!("oci:{}:multi", layout.display()))?,
        &ImageLocation::parse(&format!("oci:{}:arm", out.display()))?,
        &weenv_converter::ConvertOptions {
            platform: Some("linux/arm64".parse()?),
            ..Default::default()
        },
        std::sync::Arc::new(weenv_converter::NoProgress),
    )
    .await?;
    ensure!(one.media_type.ends_with("manifest.v1+json") && one.manifests.len() == 1);
    Ok(())
}
