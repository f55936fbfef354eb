//! One layer: classify its media type, recognise weenv layers, and convert a local blob into a
//! weenv layer file (decompressing gzip/zstd on the fly, streaming into the format writer, so
//! memory stays bounded by the writer's frame size whatever the layer size).

use crate::source::LocalBlob;
use crate::ConvertError;
use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read};
use std::path::Path;
use weenv_format::footer::{Footer, FOOTER_SIZE};
use weenv_format::reader::TocHint;
use weenv_format::writer::{write_layer_parallel, LayerSummary, WriterOptions};
use weenv_format::{RangeRead, ANNOTATION_FORMAT_VERSION, FORMAT_VERSION};

/// Compression of a layer blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// Layer media types the converter reads (OCI and Docker, distributable or not).
pub fn classify(media_type: &str) -> Option<Compression> {
    let mt = media_type.split(';').next().unwrap_or("").trim();
    let base = mt
        .strip_prefix("application/vnd.oci.image.layer.nondistributable.v1.")
        .or_else(|| mt.strip_prefix("application/vnd.oci.image.layer.v1."));
    match base {
        Some("tar") => Some(Compression::None),
        Some("tar+gzip") => Some(Compression::Gzip),
        Some("tar+zstd") => Some(Compression::Zstd),
        _ => match mt {
            "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
            "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => {
                Some(Compression::Gzip)
            }
            "application/vnd.docker.image.rootfs.diff.tar.zstd" => Some(Compression::Zstd),
            _ => None,
        },
    }
}

/// Compression from the first bytes (the media type can lie, e.g. in docker archives).
pub fn sniff(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// The weenv annotations of a layer that is already a weenv layer: from its descriptor
/// annotations, else from a valid footer at the end of the blob. `None` for other layers.
pub fn existing_weenv(
    annotations: &BTreeMap<String, String>,
    blob: &LocalBlob,
) -> Result<Option<BTreeMap<String, String>>, ConvertError> {
    if let Ok(Some(_)) = TocHint::from_annotations(annotations) {
        return Ok(Some(weenv_annotations_of(annotations)));
    }
    if blob.len < FOOTER_SIZE as u64 {
        return Ok(None);
    }
    let tail = blob
        .range_reader()?
        .read_at(blob.len - FOOTER_SIZE as u64, FOOTER_SIZE as u64)
        .map_err(|e| ConvertError::io(format!("reading the tail of {}", blob.path.display()), e))?;
    Ok(Footer::parse(&tail).ok().map(|f| {
        let hint = TocHint {
            offset: f.toc_offset,
            length: f.toc_len + FOOTER_SIZE as u64,
            digest: f.toc_digest,
        };
        hint_annotations(&hint)
    }))
}

fn weenv_annotations_of(a: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    a.iter()
        .filter(|(k, _)| k.starts_with("io.weenv."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Descriptor annotations for a TOC location (same keys as the writer's).
pub fn hint_annotations(h: &TocHint) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            weenv_format::ANNOTATION_TOC_DIGEST.to_string(),
            h.digest.to_string(),
        ),
        (
            weenv_format::ANNOTATION_TOC_OFFSET.to_string(),
            h.offset.to_string(),
        ),
        (
            weenv_format::ANNOTATION_TOC_LENGTH.to_string(),
            h.length.to_string(),
        ),
        (
            ANNOTATION_FORMAT_VERSION.to_string(),
            FORMAT_VERSION.to_string(),
        ),
    ])
}

/// A reader of the uncompressed tar stream of `blob`, whatever its compression.
pub fn tar_reader(blob: &LocalBlob) -> Result<Box<dyn Read + Send>, ConvertError> {
    let mut head = Vec::with_capacity(4);
    blob.open()?
        .take(4)
        .read_to_end(&mut head)
        .map_err(|e| ConvertError::io(format!("reading {}", blob.path.display()), e))?;
    let raw = BufReader::with_capacity(1 << 20, blob.open()?);
    Ok(match sniff(&head) {
        Compression::None => Box::new(raw),
        Compression::Gzip => Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::bufread::MultiGzDecoder::new(raw),
        )),
        Compression::Zstd => Box::new(BufReader::with_capacity(
            1 << 20,
            zstd::stream::read::Decoder::with_buffer(raw)
                .map_err(|e| ConvertError::io("creating a zstd decoder", e))?,
        )),
    })
}

/// Convert `blob` (any supported compression) into a weenv layer at `out`, its frames
/// compressed on `workers` threads (the blob is the same for any number).
pub fn convert_blob(
    blob: &LocalBlob,
    digest: &str,
    out: &Path,
    opts: &WriterOptions,
    workers: usize,
) -> Result<LayerSummary, ConvertError> {
    let input = tar_reader(blob)?;
    // Decompression of the source on its own thread, 4 MiB ahead at most.
    let input = BufReader::with_capacity(
        1 << 20,
        crate::readahead::ReadAhead::spawn(input, 4)
            .map_err(|e| ConvertError::io("starting the read-ahead thread", e))?,
    );
    let file = std::fs::File::create(out)
        .map_err(|e| ConvertError::io(format!("creating {}", out.display()), e))?;
    let w = BufWriter::with_capacity(1 << 20, file);
    write_layer_parallel(input, w, opts, workers).map_err(|e| ConvertError::format(digest, e))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn classifies_media_types() {
        assert_eq!(
            classify("application/vnd.oci.image.layer.v1.tar+gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            classify("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            classify("application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            classify("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(classify("application/vnd.oci.image.config.v1+json"), None);
        assert_eq!(classify("application/vnd.in-toto+json"), None);
    }

    #[test]
    fn sniffs() {
        assert_eq!(sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(sniff(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(sniff(b"usr/"), Compression::None);
    }
}
