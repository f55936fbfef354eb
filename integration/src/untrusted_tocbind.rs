//! Images for the TOC-binding tests (`tests/untrusted_tocbind.rs`): a copy of a converted
//! weenv image whose layer TOC was edited to lie about the tar stream in the same blob (the
//! data frames, config and diff_ids unchanged), written next to the original in its OCI layout.

use crate::images::OciImage;
use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use weenv_format::toc::Toc;
use weenv_format::{LayerReader, TocHint};

fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn put_blob(layout: &Path, data: &[u8]) -> Result<String> {
    let d = format!("sha256:{}", hex::encode(Sha256::digest(data)));
    std::fs::write(blob_path(layout, &d), data).with_context(|| format!("writing blob {d}"))?;
    Ok(d)
}

/// In the OCI layout of `image` (a converted weenv image, single manifest), write a copy
/// tagged `tag` whose first weenv layer has its TOC changed by `lie` (re-tailed with
/// [`weenv_format::writer::retail`], so it passes validation and its digests match; the
/// descriptor annotations follow). Returns the new image.
pub fn lying_copy(image: &OciImage, tag: &str, lie: impl Fn(&mut Toc)) -> Result<OciImage> {
    let layout = &image.layout;
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path)?)?;
    let entry = index["manifests"]
        .as_array()
        .context("index.json without manifests")?
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == image.tag.as_str())
        .with_context(|| format!("no tag {} in {}", image.tag, layout.display()))?
        .clone();
    let mdigest = entry["digest"].as_str().context("manifest digest")?;
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob_path(layout, mdigest))?)?;
    let layer = manifest["layers"]
        .as_array_mut()
        .context("manifest without layers")?
        .iter_mut()
        .find(|l| l["annotations"][weenv_format::ANNOTATION_TOC_DIGEST].is_string())
        .context("no weenv layer in the image")?;
    let ldigest = layer["digest"]
        .as_str()
        .context("layer digest")?
        .to_string();
    let blob = std::fs::read(blob_path(layout, &ldigest))?;
    let reader = LayerReader::open(&blob[..], None)?;
    let toc_offset = reader.footer().toc_offset;
    let mut toc = reader.into_toc();
    lie(&mut toc);
    let (lying, hint): (Vec<u8>, TocHint) = weenv_format::writer::retail(&blob, toc_offset, &toc)?;
    let new_digest = put_blob(layout, &lying)?;
    layer["digest"] = new_digest.into();
    layer["size"] = lying.len().into();
    let a = &mut layer["annotations"];
    a[weenv_format::ANNOTATION_TOC_DIGEST] = hint.digest.to_string().into();
    a[weenv_format::ANNOTATION_TOC_OFFSET] = hint.offset.to_string().into();
    a[weenv_format::ANNOTATION_TOC_LENGTH] = hint.length.to_string().into();
    let mbytes = serde_json::to_vec(&manifest)?;
    let new_mdigest = put_blob(layout, &mbytes)?;
    let mut new_entry = entry;
    new_entry["digest"] = new_mdigest.into();
    new_entry["size"] = mbytes.len().into();
    new_entry["annotations"]["org.opencontainers.image.ref.name"] = tag.into();
    index["manifests"]
        .as_array_mut()
        .context("index.json without manifests")?
        .push(new_entry);
    std::fs::write(&index_path, serde_json::to_vec(&index)?)?;
    Ok(OciImage {
        layout: layout.clone(),
        tag: tag.to_string(),
    })
}
