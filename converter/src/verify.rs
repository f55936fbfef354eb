//! `verify`: re-read every layer of an image and check it end to end.
//!
//! For a weenv layer: the blob's sha256 and size match its descriptor; the TOC is located and
//! verified (against the descriptor annotation and the footer); the data frames tile the blob
//! from offset 0 up to the TOC without gaps; every frame decompresses to its recorded length
//! and sha256; the concatenated frames (= `zstd -d` of the blob) hash to the layer's
//! diff_id from the image config; and the TOC tells the truth about that tar stream
//! ([`weenv_format::StreamChecker`]: every tar entry is in the TOC and vice versa, in order,
//! with the same type, mode, ids, device numbers, size, link target, xattrs, mtime and header
//! offset, and every file's chunks name exactly its payload bytes). Other layers get the blob
//! and diff_id checks and are reported as "not weenv".

use crate::convert::{diff_ids, platform_label};
use crate::layer::{existing_weenv, tar_reader};
use crate::location::ImageLocation;
use crate::source::{is_index_type, sha256_reader, LocalBlob, Source};
use crate::ConvertError;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::path::Path;
use weenv_format::reader::{LayerReader, TocHint};
use weenv_format::Digest;
use weenv_registry::Platform;
use weenv_registry::{select_platform, Client, Descriptor, ImageIndex, ImageManifest, Manifest};

/// Result for one layer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerVerdict {
    pub platform: Option<String>,
    pub index: usize,
    pub digest: String,
    pub weenv: bool,
    pub entries: u64,
    pub frames: u64,
    /// Empty when the layer is good.
    pub problems: Vec<String>,
}

/// Whether an index entry is a runnable image (not a nested index, not an attestation or
/// other `unknown` platform).
pub fn runnable(d: &Descriptor) -> bool {
    !is_index_type(&d.media_type)
        && d.platform
            .as_ref()
            .is_some_and(|p| p.os != "unknown" && p.architecture != "unknown")
}

/// The entries of index `ix` to work on: the one for `platform`, or every runnable one.
pub fn index_children(
    ix: &ImageIndex,
    platform: Option<&Platform>,
    location: &str,
) -> Result<Vec<Descriptor>, ConvertError> {
    Ok(match platform {
        Some(p) => vec![
            select_platform(ix, &p.os, &p.architecture, p.variant.as_deref())
                .ok_or_else(|| ConvertError::BadImage {
                    location: location.to_string(),
                    reason: format!("index has no manifest for {}/{}", p.os, p.architecture),
                })?
                .clone(),
        ],
        None => ix
            .manifests
            .iter()
            .filter(|d| runnable(d))
            .cloned()
            .collect(),
    })
}

/// The image manifests of a source: every runnable platform of an index (or the one asked
/// for), with their platform label and digest.
pub async fn image_manifests(
    source: &Source,
    platform: Option<&Platform>,
) -> Result<Vec<(Option<String>, ImageManifest, Digest)>, ConvertError> {
    let root = source.root().await?;
    let children = match Manifest::parse(&root.media_type, &root.bytes)? {
        Manifest::Image(m) => return Ok(vec![(None, m, root.digest)]),
        Manifest::Index(ix) => index_children(&ix, platform, &source.describe())?,
    };
    let mut out = Vec::new();
    for d in children {
        let blob = source.manifest(&d).await?;
        if let Manifest::Image(m) = Manifest::parse(&blob.media_type, &blob.bytes)? {
            out.push((platform_label(&d), m, blob.digest));
        }
    }
    Ok(out)
}

/// Verify every layer of the image at `loc`.
pub async fn verify_image(
    client: &Client,
    loc: &ImageLocation,
    platform: Option<&Platform>,
) -> Result<Vec<LayerVerdict>, ConvertError> {
    let source = {
        let (client, loc) = (client.clone(), loc.clone());
        tokio::task::spawn_blocking(move || Source::open(&loc, &client))
            .await
            .map_err(|e| ConvertError::Task(e.to_string()))??
    };
    let scratch = tempfile::Builder::new()
        .prefix("weenv-verify")
        .tempdir()
        .map_err(|e| ConvertError::io("creating a scratch directory", e))?;
    let mut verdicts = Vec::new();
    for (label, m, _) in image_manifests(&source, platform).await? {
        let config = source.blob_bytes(&m.config).await?;
        let ids = diff_ids(&config, &source.describe())?;
        for (i, l) in m.layers.iter().enumerate() {
            let mut v = LayerVerdict {
                platform: label.clone(),
                index: i,
                digest: l.digest.to_string(),
                weenv: false,
                entries: 0,
                frames: 0,
                problems: Vec::new(),
            };
            match source.blob(l, scratch.path()).await {
                Err(e) => v.problems.push(format!("cannot fetch the blob: {e}")),
                Ok(blob) => {
                    let (desc, id, b) = (l.clone(), ids.get(i).cloned(), blob.clone());
                    v = tokio::task::spawn_blocking(move || {
                        verify_layer(&desc, id.as_ref(), &b, v)
                    })
                    .await
                    .map_err(|e| ConvertError::Task(e.to_string()))?;
                    blob.discard();
                }
            }
            verdicts.push(v);
        }
    }
    Ok(verdicts)
}

/// Check one local layer blob (see the module docs). Problems are collected, not returned as
/// errors, so one report lists everything that is wrong.
pub fn verify_layer(
    desc: &Descriptor,
    diff_id: Option<&Digest>,
    blob: &LocalBlob,
    mut v: LayerVerdict,
) -> LayerVerdict {
    let mut problem = |p: String| v.problems.push(p);
    if diff_id.is_none() {
        problem("the image config has no diff_id for this layer".into());
    }
    match blob
        .open()
        .and_then(|r| sha256_reader(r).map_err(|e| ConvertError::io("hashing the blob", e)))
    {
        Ok((d, n)) => {
            if d != desc.digest {
                problem(format!(
                    "blob content hashes to {d}, descriptor says {}",
                    desc.digest
                ));
            }
            if n != desc.size {
                problem(format!("blob is {n} bytes, descriptor says {}", desc.size));
            }
        }
        Err(e) => problem(e.to_string()),
    }
    let weenv = match existing_weenv(&desc.annotations, blob) {
        Ok(w) => w.is_some(),
        Err(e) => {
            problem(e.to_string());
            false
        }
    };
    v.weenv = weenv;
    let stream_digest = if weenv {
        verify_frames(desc, blob, &mut v)
    } else {
        match tar_reader(blob).and_then(|r| {
            sha256_reader(r).map_err(|e| ConvertError::io("decompressing the layer", e))
        }) {
            Ok((d, _)) => Some(d),
            Err(e) => {
                v.problems.push(format!("cannot decompress: {e}"));
                None
            }
        }
    };
    if let (Some(actual), Some(expected)) = (stream_digest, diff_id) {
        if actual != *expected {
            v.problems.push(format!(
                "uncompressed stream hashes to {actual}, config diff_id is {expected}"
            ));
        }
    }
    v
}

/// TOC + frame checks; returns the digest of the concatenated frames.
fn verify_frames(desc: &Descriptor, blob: &LocalBlob, v: &mut LayerVerdict) -> Option<Digest> {
    let hint = match TocHint::from_annotations(&desc.annotations) {
        Ok(h) => h,
        Err(e) => {
            v.problems.push(format!("bad weenv annotations: {e}"));
            None
        }
    };
    let reader = match blob
        .range_reader()
        .map_err(|e| e.to_string())
        .and_then(|r| LayerReader::open(r, hint).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => {
            v.problems.push(format!("TOC: {e}"));
            return None;
        }
    };
    let toc = reader.toc();
    v.entries = toc.entries.len() as u64;
    v.frames = toc.frames.len() as u64;
    let mut h = Sha256::new();
    // The TOC against the tar stream the frames hold (fed in order, as decompressed).
    let mut checker = weenv_format::StreamChecker::new(toc);
    let mut next = 0u64;
    let mut bad_frames = 0usize;
    for (i, f) in toc.frames.iter().enumerate() {
        if f.offset != next {
            v.problems.push(format!(
                "frame {i} starts at {} but the previous one ends at {next}",
                f.offset
            ));
        }
        next = f.offset + f.clen;
        match reader.read_frame(weenv_format::FrameIdx(i as u32)) {
            Ok(data) => {
                h.update(&data);
                if bad_frames == 0 {
                    checker.update(&data);
                }
            }
            Err(e) => {
                bad_frames += 1;
                if bad_frames <= 5 {
                    v.problems.push(format!("frame {i} at {}: {e}", f.offset));
                }
            }
        }
    }
    if bad_frames > 5 {
        v.problems
            .push(format!("... {bad_frames} bad frames in total"));
    }
    if next != reader.footer().toc_offset {
        v.problems.push(format!(
            "frames end at {next} but the TOC starts at {}",
            reader.footer().toc_offset
        ));
    }
    if bad_frames == 0 {
        if let Err(e) = checker.finish() {
            v.problems
                .push(format!("the TOC lies about the tar stream: {e}"));
        }
    } else {
        v.problems
            .push("the TOC was not checked against the tar stream (unreadable frames)".into());
    }
    (bad_frames == 0).then(|| Digest::from_sha256_bytes(&h.finalize().into()))
}

/// Plain-text report of a verification.
pub fn verdict_table(verdicts: &[LayerVerdict]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for v in verdicts {
        let status = if v.problems.is_empty() {
            "ok"
        } else {
            "FAILED"
        };
        let _ = writeln!(
            s,
            "{}layer {:>2} {} {:<8} entries {:>6} frames {:>5}  {status}",
            v.platform
                .as_deref()
                .map(|p| format!("{p} "))
                .unwrap_or_default(),
            v.index,
            &v.digest[..v.digest.len().min(19)],
            if v.weenv { "weenv" } else { "not-weenv" },
            v.entries,
            v.frames,
        );
        for p in &v.problems {
            let _ = writeln!(s, "    - {p}");
        }
    }
    s
}

/// Convenience for tests: verify one weenv layer file against a diff_id.
pub fn verify_layer_file(
    path: &Path,
    desc: &Descriptor,
    diff_id: &Digest,
) -> Result<LayerVerdict, ConvertError> {
    let len = std::fs::metadata(path)
        .map_err(|e| ConvertError::io(format!("reading {}", path.display()), e))?
        .len();
    let blob = LocalBlob {
        path: path.to_path_buf(),
        offset: 0,
        len,
        temporary: false,
    };
    let v = LayerVerdict {
        platform: None,
        index: 0,
        digest: desc.digest.to_string(),
        weenv: false,
        entries: 0,
        frames: 0,
        problems: Vec::new(),
    };
    Ok(verify_layer(desc, Some(diff_id), &blob, v))
}
