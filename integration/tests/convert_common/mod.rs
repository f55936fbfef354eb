//! Helpers shared by the `convert_*` end-to-end tests: run the converter library on images
//! from `weenv_integration::images`, read OCI layouts, stream blobs through `zstd`/`gzip`.

#![allow(dead_code)]

use anyhow::{bail, Context, Result};
use sha2::{Digest as _, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use weenv_registry::ImageManifest;

#[allow(unused_imports)] // each test file uses some of these
pub use weenv_integration::convert::{client, convert, convert_with};

/// `DIR/blobs/sha256/<hex>` of a digest string.
pub fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// The image manifest tagged `tag` in an OCI layout (no index support needed here).
pub fn layout_manifest(layout: &Path, tag: &str) -> Result<ImageManifest> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let entry = index["manifests"]
        .as_array()
        .context("index.json without manifests")?
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .with_context(|| format!("no tag {tag} in {}", layout.display()))?;
    let digest = entry["digest"].as_str().context("digest")?;
    Ok(serde_json::from_slice(&std::fs::read(blob_path(
        layout, digest,
    ))?)?)
}

/// `rootfs.diff_ids` of a layout image.
pub fn layout_diff_ids(layout: &Path, m: &ImageManifest) -> Result<Vec<String>> {
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob_path(layout, m.config.digest.as_str()))?)?;
    Ok(c["rootfs"]["diff_ids"]
        .as_array()
        .context("diff_ids")?
        .iter()
        .filter_map(|d| d.as_str().map(str::to_string))
        .collect())
}

/// sha256 and length of the stdout of `prog args file` (e.g. `zstd -dc`, `gzip -dc`).
pub fn hash_of_command_output(prog: &str, args: &[&str], file: &Path) -> Result<(String, u64)> {
    let mut child = Command::new(prog)
        .args(args)
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {prog}"))?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n_total = 0u64;
    loop {
        let n = out.read(&mut buf)?;
        if n == 0 {
            break;
        }
        n_total += n as u64;
        h.update(&buf[..n]);
    }
    let o = child.wait_with_output()?;
    if !o.status.success() {
        bail!(
            "{prog} {args:?} {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok((format!("sha256:{}", hex::encode(h.finalize())), n_total))
}
