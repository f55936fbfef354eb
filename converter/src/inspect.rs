//! `inspect`: per layer of an image, its media type, size, and for weenv layers the TOC
//! summary (entries, files, uncompressed size, frames, compression ratio). A weenv layer in a
//! registry costs one ranged GET (the TOC location is in the descriptor annotations); layers
//! in a layout or archive are read in place.

use crate::location::ImageLocation;
use crate::source::Source;
use crate::summary::human;
use crate::verify::image_manifests;
use crate::ConvertError;
use serde::Serialize;
use std::sync::Arc;
use weenv_format::prefetch::{decode_frames, ANNOTATION_PREFETCH};
use weenv_format::reader::{LayerReader, TocHint};
use weenv_format::{EntryKind, RangeRead, Toc};
use weenv_registry::Platform;
use weenv_registry::{BlobRangeReader, Client, Descriptor};

/// One layer as seen by `inspect`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerInfo {
    pub platform: Option<String>,
    pub index: usize,
    pub digest: String,
    pub media_type: String,
    pub size: u64,
    pub weenv: bool,
    pub entries: u64,
    pub files: u64,
    /// Uncompressed tar size (weenv layers).
    pub tar_size: u64,
    pub frames: u64,
    pub toc_size: u64,
    /// Frames listed in the layer's `io.weenv.prefetch.frames` annotation (`None`: no
    /// start-up prefetch profile for this layer).
    pub prefetch_frames: Option<u64>,
    /// Compressed bytes of those frames.
    pub prefetch_bytes: u64,
    /// The annotation is present but invalid (the snapshotter ignores it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_error: Option<String>,
}

fn toc_info(toc: &Toc, info: &mut LayerInfo, toc_size: u64) {
    info.weenv = true;
    info.entries = toc.entries.len() as u64;
    info.files = toc
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .count() as u64;
    info.tar_size = toc.uncompressed_size();
    info.frames = toc.frames.len() as u64;
    info.toc_size = toc_size;
}

fn open_toc<R: RangeRead>(r: R, hint: Option<TocHint>) -> Result<(Toc, u64), String> {
    let reader = LayerReader::open(r, hint).map_err(|e| e.to_string())?;
    let len = reader.footer().toc_len;
    Ok((reader.into_toc(), len))
}

/// The TOC (and its encoded size) of layer `l` of `source`, or `None` for a layer that is not
/// a weenv layer. In a registry that costs one ranged GET and needs the descriptor's
/// `io.weenv.toc.*` annotations (without them the layer counts as not weenv); in a layout or
/// archive the blob is read in place, located by the annotations or else by its footer.
pub async fn layer_toc(
    source: &Arc<Source>,
    l: &Descriptor,
) -> Result<Option<(Toc, u64)>, ConvertError> {
    let hint = TocHint::from_annotations(&l.annotations)
        .map_err(|e| ConvertError::format(&l.digest, e))?;
    let local = match &**source {
        Source::Registry { .. } => None,
        _ => Some(source.blob(l, std::path::Path::new("/nonexistent")).await?),
    };
    let src = source.clone();
    let desc = l.clone();
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || -> Result<Option<(Toc, u64)>, String> {
        match (&*src, local) {
            (Source::Registry { client, reference }, _) => {
                let Some(hint) = hint else { return Ok(None) };
                let r = BlobRangeReader::new(
                    client.clone(),
                    handle,
                    reference.clone(),
                    desc.digest.clone(),
                )
                .with_size(desc.size);
                open_toc(r, Some(hint)).map(Some)
            }
            (_, None) => Ok(None),
            (_, Some(blob)) => {
                let r = blob.range_reader().map_err(|e| e.to_string())?;
                match open_toc(r, hint.clone()) {
                    Ok(t) => Ok(Some(t)),
                    Err(e) if hint.is_some() => Err(e),
                    Err(_) => Ok(None),
                }
            }
        }
    })
    .await
    .map_err(|e| ConvertError::Task(e.to_string()))?;
    result.map_err(|e| ConvertError::CorruptBlob {
        digest: l.digest.to_string(),
        reason: format!("weenv TOC: {e}"),
    })
}

/// Fills the prefetch fields of `info` from the descriptor's prefetch annotation, if any.
fn prefetch_info(l: &Descriptor, toc: &Toc, info: &mut LayerInfo) {
    let Some(v) = l.annotations.get(ANNOTATION_PREFETCH) else {
        return;
    };
    match decode_frames(v, toc.frames.len()) {
        Ok(frames) => {
            info.prefetch_frames = Some(frames.len() as u64);
            info.prefetch_bytes = frames
                .iter()
                .filter_map(|f| toc.frame(*f))
                .map(|f| f.clen)
                .sum();
        }
        Err(e) => info.prefetch_error = Some(e.to_string()),
    }
}

/// Inspect the image at `loc`.
pub async fn inspect_image(
    client: &Client,
    loc: &ImageLocation,
    platform: Option<&Platform>,
) -> Result<Vec<LayerInfo>, ConvertError> {
    let source = Arc::new(Source::open_async(loc, client).await?);
    let mut out = Vec::new();
    for (label, m, _) in image_manifests(&source, platform).await? {
        for (i, l) in m.layers.iter().enumerate() {
            let mut info = LayerInfo {
                platform: label.clone(),
                index: i,
                digest: l.digest.to_string(),
                media_type: l.media_type.clone(),
                size: l.size,
                weenv: false,
                entries: 0,
                files: 0,
                tar_size: 0,
                frames: 0,
                toc_size: 0,
                prefetch_frames: None,
                prefetch_bytes: 0,
                prefetch_error: None,
            };
            if let Some((toc, toc_size)) = layer_toc(&source, l).await? {
                toc_info(&toc, &mut info, toc_size);
                prefetch_info(l, &toc, &mut info);
            }
            out.push(info);
        }
    }
    Ok(out)
}

/// `N (size)` frames of the layer's start-up prefetch profile, `-` without one.
fn prefetch_cell(l: &LayerInfo) -> String {
    match (&l.prefetch_error, l.prefetch_frames) {
        (Some(_), _) => "invalid".into(),
        (None, Some(n)) => format!("{n} ({})", human(l.prefetch_bytes)),
        (None, None) => "-".into(),
    }
}

/// Plain-text table of `inspect`.
pub fn info_table(layers: &[LayerInfo]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>3}  {:<19}  {:<10}  {:>10}  {:>10}  {:>7}  {:>8}  {:>8}  {:>7}  {:>9}  {:>18}",
        "#",
        "digest",
        "kind",
        "size",
        "tar",
        "ratio",
        "entries",
        "files",
        "frames",
        "toc",
        "prefetch"
    );
    let (mut size, mut tar) = (0u64, 0u64);
    for l in layers {
        size += l.size;
        tar += l.tar_size;
        let _ = writeln!(
            s,
            "{:>3}  {:<19}  {:<10}  {:>10}  {:>10}  {:>7}  {:>8}  {:>8}  {:>7}  {:>9}  {:>18}",
            l.index,
            &l.digest[..l.digest.len().min(19)],
            if l.weenv { "weenv" } else { "other" },
            human(l.size),
            if l.weenv {
                human(l.tar_size)
            } else {
                "-".into()
            },
            if l.tar_size > 0 {
                format!("{:.3}", l.size as f64 / l.tar_size as f64)
            } else {
                "-".into()
            },
            l.entries,
            l.files,
            l.frames,
            if l.weenv {
                human(l.toc_size)
            } else {
                "-".into()
            },
            prefetch_cell(l),
        );
    }
    let _ = writeln!(
        s,
        "total {} compressed, {} uncompressed (weenv layers)",
        human(size),
        human(tar)
    );
    s
}
