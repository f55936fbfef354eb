//! `inspect`: per layer of an image, its media type, size, and for weenv layers the TOC
//! summary (entries, files, uncompressed size, frames, compression ratio). A weenv layer in a
//! registry costs one ranged GET (the TOC location is in the descriptor annotations); layers
//! in a layout or archive are read in place.

use crate::convert::PlatformSpec;
use crate::location::ImageLocation;
use crate::source::Source;
use crate::summary::human;
use crate::verify::image_manifests;
use crate::ConvertError;
use serde::Serialize;
use weenv_format::reader::{LayerReader, TocHint};
use weenv_format::{EntryKind, RangeRead, Toc};
use weenv_registry::{BlobRangeReader, Client};

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

/// Inspect the image at `loc`.
pub async fn inspect_image(
    client: &Client,
    loc: &ImageLocation,
    platform: Option<&PlatformSpec>,
) -> Result<Vec<LayerInfo>, ConvertError> {
    let source = {
        let (client, loc) = (client.clone(), loc.clone());
        tokio::task::spawn_blocking(move || Source::open(&loc, &client))
            .await
            .map_err(|e| ConvertError::Task(e.to_string()))??
    };
    let source = std::sync::Arc::new(source);
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
            };
            let hint = TocHint::from_annotations(&l.annotations)
                .map_err(|e| ConvertError::format(&l.digest, e))?;
            let local = match &*source {
                Source::Registry { .. } => None,
                _ => Some(source.blob(l, std::path::Path::new("/nonexistent")).await?),
            };
            let src = source.clone();
            let desc = l.clone();
            let handle = tokio::runtime::Handle::current();
            let result =
                tokio::task::spawn_blocking(move || -> Result<Option<(Toc, u64)>, String> {
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
            match result {
                Ok(Some((toc, toc_size))) => toc_info(&toc, &mut info, toc_size),
                Ok(None) => {}
                Err(e) => {
                    return Err(ConvertError::CorruptBlob {
                        digest: l.digest.to_string(),
                        reason: format!("weenv TOC: {e}"),
                    })
                }
            }
            out.push(info);
        }
    }
    Ok(out)
}

/// Plain-text table of `inspect`.
pub fn info_table(layers: &[LayerInfo]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>3}  {:<19}  {:<10}  {:>10}  {:>10}  {:>7}  {:>8}  {:>8}  {:>7}  {:>9}",
        "#", "digest", "kind", "size", "tar", "ratio", "entries", "files", "frames", "toc"
    );
    let (mut size, mut tar) = (0u64, 0u64);
    for l in layers {
        size += l.size;
        tar += l.tar_size;
        let _ = writeln!(
            s,
            "{:>3}  {:<19}  {:<10}  {:>10}  {:>10}  {:>7}  {:>8}  {:>8}  {:>7}  {:>9}",
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
