//! A real image (Debian bookworm + python3, three layers, from the integration image cache)
//! through the FUSE layer store: every layer equals its GNU tar extraction, and python3 starts
//! from an overlay of the lazy layers while fetching a fraction of the image.

mod fuse_common;

use anyhow::{bail, ensure, Context, Result};
use fuse_common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use weenv_snapshotter::fetch::FillConfig;

/// Uncompressed layer tars of the python test image, bottom first.
fn python_layer_tars(dir: &Path) -> Result<Vec<PathBuf>> {
    let img = weenv_integration::images::python()?;
    let blobs = img.layout.join("blobs/sha256");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(img.layout.join("index.json"))?)?;
    let mdig = index["manifests"][0]["digest"]
        .as_str()
        .context("index digest")?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blobs.join(&mdig["sha256:".len()..]))?)?;
    let mut out = Vec::new();
    for (i, l) in manifest["layers"]
        .as_array()
        .context("layers")?
        .iter()
        .enumerate()
    {
        let d = l["digest"].as_str().context("layer digest")?;
        let tar = dir.join(format!("layer{i}.tar"));
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "gzip -dc '{}' > '{}'",
                blobs.join(&d["sha256:".len()..]).display(),
                tar.display()
            ))
            .status()?;
        if !st.success() {
            bail!("gunzip of layer {d} failed");
        }
        out.push(tar);
    }
    Ok(out)
}

#[test]
#[ignore = "needs root, /dev/fuse and the python test image (debootstrap)"]
fn python_image_layers_match_tar_extraction() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let tars = python_layer_tars(fx.dir.path())?;
    for (i, tar) in tars.iter().enumerate() {
        let layer = TestLayer::from_tar_file(fx.dir.path(), &format!("l{i}"), tar)?;
        let dir = fx.add(&layer)?;
        let reference = fx.dir.path().join(format!("ref{i}"));
        extract_reference(tar, &reference)?;
        let want = snapshot(&reference)?;
        let got = snapshot(&dir)?;
        let (wp, gp): (BTreeSet<_>, BTreeSet<_>) = (want.keys().collect(), got.keys().collect());
        ensure!(
            wp == gp,
            "layer {i}: paths differ: {:?} / {:?}",
            wp.difference(&gp).take(10).collect::<Vec<_>>(),
            gp.difference(&wp).take(10).collect::<Vec<_>>()
        );
        let diffs: Vec<String> = want
            .iter()
            .filter(|(p, (w, _))| &got[*p].0 != w)
            .take(10)
            .map(|(p, (w, _))| format!("{p}:\n  tar   {w:?}\n  weenv {:?}", got[p].0))
            .collect();
        ensure!(diffs.is_empty(), "layer {i} differs:\n{}", diffs.join("\n"));
        ensure!(
            hardlink_groups(&want) == hardlink_groups(&got),
            "layer {i}: hardlink groups differ"
        );
        println!(
            "layer {i}: {} entries identical, {} hardlink groups",
            want.len(),
            hardlink_groups(&got).len()
        );
        std::fs::remove_dir_all(&reference)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs root, /dev/fuse and the python test image (debootstrap)"]
fn python_starts_lazily_from_an_overlay_of_fuse_layers() -> Result<()> {
    let var = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let d = FillConfig::default();
    let fill = FillConfig {
        enabled: false,
        read_ahead_bytes: var("WEENV_READ_AHEAD", d.read_ahead_bytes),
        dir_prefetch_frames: var("WEENV_DIR_PREFETCH", d.dir_prefetch_frames as u64) as usize,
        ..d
    };
    let fx = Fixture::new(fill, true)?;
    let tars = python_layer_tars(fx.dir.path())?;
    let mut layers = Vec::new();
    for (i, tar) in tars.iter().enumerate() {
        layers.push(TestLayer::from_tar_file(
            fx.dir.path(),
            &format!("l{i}"),
            tar,
        )?);
    }
    let mut dirs = Vec::new();
    for l in &layers {
        dirs.push(fx.add(l)?);
    }
    dirs.reverse(); // overlay wants the top layer first
    let merged = fx.dir.path().join("merged");
    let _ov = mount_overlay(&dirs, &fx.dir.path().join("ovl"), &merged)?;
    let out = Command::new("chroot")
        .arg(&merged)
        .args([
            "python3",
            "-c",
            "import json, email.message, http.client; print(json.dumps({'ok': 1}))",
        ])
        .output()?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("{\"ok\": 1}"),
        "python3 in chroot: {out:?}"
    );
    let fetched: u64 = layers.iter().map(|l| l.source.bytes()).sum();
    let total: u64 = layers
        .iter()
        .map(|l| std::fs::metadata(&l.blob).map(|m| m.len()).unwrap_or(0))
        .sum();
    let reqs: usize = layers.iter().map(|l| l.source.requests().len()).sum();
    let served = fx
        .metrics
        .read_bytes_served
        .load(std::sync::atomic::Ordering::Relaxed);
    println!("FUSE read handler served {:.1} MB", served as f64 / 1e6);
    println!(
        "python3 started: fetched {:.1} MB of {:.1} MB ({:.1}%) in {reqs} range requests",
        fetched as f64 / 1e6,
        total as f64 / 1e6,
        100.0 * fetched as f64 / total as f64
    );
    ensure!(
        fetched * 4 < total,
        "lazy start fetched {fetched} of {total} bytes"
    );
    Ok(())
}
