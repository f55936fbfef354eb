//! Round trip on a real Debian rootfs image (debootstrap minbase + python3, 3 gzip layers):
//! `zstd -d` of every converted layer is the original tar byte for byte (same sha256 and
//! length as `gzip -dc` of the source layer, and equal to the config's diff_id), and every
//! entry read through the format's `LayerReader` matches the source tar (metadata and content).

mod convert_common;

use anyhow::{ensure, Context, Result};
use convert_common::*;
use std::io::Read;
use weenv_format::reader::{LayerReader, TocHint};
use weenv_format::EntryKind;
use weenv_integration::images;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, debootstrap and the configured Debian mirror (first run builds the image)"]
async fn debian_python_layers_round_trip() -> Result<()> {
    let img = images::python()?;
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("out");
    let client = client(&[])?;
    let report = convert(
        &client,
        &img.oci_ref(),
        &format!("oci:{}:weenv", out.display()),
    )
    .await?;
    let src = layout_manifest(&img.layout, &img.tag)?;
    let dst = layout_manifest(&out, "weenv")?;
    let ids = layout_diff_ids(&img.layout, &src)?;
    ensure!(dst.config == src.config, "config descriptor changed");
    ensure!(src.layers.len() >= 3 && dst.layers.len() == src.layers.len());
    let total: u64 = report.manifests[0].layers.iter().map(|l| l.tar_size).sum();
    ensure!(
        total >= 150 << 20,
        "test image is only {total} bytes of tar"
    );
    for (i, (s, d)) in src.layers.iter().zip(&dst.layers).enumerate() {
        let sblob = blob_path(&img.layout, s.digest.as_str());
        let dblob = blob_path(&out, d.digest.as_str());
        let (sh, sn) = hash_of_command_output("gzip", &["-dc"], &sblob)?;
        let (dh, dn) = hash_of_command_output("zstd", &["-dcq"], &dblob)?;
        ensure!(
            sh == dh && sn == dn,
            "layer {i}: zstd -d gives {dh} ({dn} B), source tar is {sh} ({sn} B)"
        );
        ensure!(dh == ids[i], "layer {i}: stream {dh} != diff_id {}", ids[i]);
        compare_entries(&sblob, &dblob, &d.annotations).with_context(|| format!("layer {i}"))?;
        println!(
            "layer {i}: {sn} B tar, {} B gzip -> {} B weenv: identical",
            s.size, d.size
        );
    }
    Ok(())
}

/// Every entry of the source tar (gzip) against the weenv layer's TOC and file contents.
fn compare_entries(
    src_gz: &std::path::Path,
    weenv: &std::path::Path,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let hint = TocHint::from_annotations(annotations)?;
    let reader = LayerReader::open(std::fs::File::open(weenv)?, hint)?;
    let gz = flate2_reader(src_gz)?;
    let mut ar = tar::Archive::new(gz);
    let (mut files, mut bytes) = (0u64, 0u64);
    for e in ar.entries()? {
        let mut e = e?;
        let path = e
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        let h = e.header().clone();
        let te = reader
            .entry(&path)
            .with_context(|| format!("{path:?} missing from the TOC"))?;
        ensure!(te.mode & 0o7777 == h.mode()? & 0o7777, "{path}: mode");
        ensure!(
            u64::from(te.uid) == h.uid()? && u64::from(te.gid) == h.gid()?,
            "{path}: owner"
        );
        ensure!(te.mtime as u64 == h.mtime()?, "{path}: mtime");
        match h.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                ensure!(
                    te.kind == EntryKind::File && te.size == h.size()?,
                    "{path}: kind/size"
                );
                let mut want = Vec::new();
                e.read_to_end(&mut want)?;
                let got = reader.read_file(&path, 0, te.size)?;
                ensure!(got == want, "{path}: content differs");
                files += 1;
                bytes += want.len() as u64;
            }
            tar::EntryType::Symlink => {
                let target = h.link_name()?.context("symlink target")?;
                ensure!(te.kind == EntryKind::Symlink, "{path}: kind");
                ensure!(
                    te.link.as_deref() == Some(&*target.to_string_lossy()),
                    "{path}: target"
                );
            }
            tar::EntryType::Directory => ensure!(te.kind == EntryKind::Dir, "{path}: kind"),
            tar::EntryType::Link => ensure!(te.kind == EntryKind::Hardlink, "{path}: kind"),
            _ => {}
        }
    }
    ensure!(files > 0, "no regular files compared");
    println!("  {files} files ({bytes} B) read through LayerReader match the source");
    Ok(())
}

fn flate2_reader(p: &std::path::Path) -> Result<Box<dyn Read>> {
    // The integration crate has no flate2; `gzip -dc` into a pipe is as good.
    let child = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(p)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    Ok(Box::new(child.stdout.context("gzip stdout")?))
}
