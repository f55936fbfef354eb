//! The conversion pipeline: source image -> weenv image.
//!
//! For every image manifest (every platform of an index, or the one `--platform` names):
//! the config blob is copied untouched (diff_ids and chain IDs stay what they were), every
//! layer is fetched to a local file (registry) or read in place (layout, archive), converted
//! on a blocking thread (at most `jobs` layers at a time, streaming; the frames of each layer
//! compressed on `workers` threads), checked against its
//! diff_id, and put into the destination; layers that are already weenv layers pass through
//! unchanged. Then the manifest is rewritten (OCI media types, weenv layer descriptors with
//! their annotations) and pushed, and finally the index or the manifest is tagged.
//! The output is a pure function of the input image and the writer options (deterministic).

use crate::layer::{classify, convert_blob, existing_weenv};
use crate::location::ImageLocation;
use crate::sink::Sink;
use crate::source::{is_index_type, LocalBlob, Source};
use crate::summary::{ImageReport, LayerAction, LayerReport, ManifestReport};
use crate::ConvertError;
use futures::stream::{self, StreamExt, TryStreamExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use weenv_format::writer::{descriptor_annotations, WriterOptions};
use weenv_format::{Digest, MEDIA_TYPE_LAYER_ZSTD};
use weenv_registry::manifest::{OCI_CONFIG, OCI_INDEX, OCI_MANIFEST};
use weenv_registry::{
    select_platform, Client, Descriptor, ImageIndex, ImageManifest, Manifest, Platform,
};

/// Parse a `--platform os/arch[/variant]` option (the registry's [`Platform`] parser; the error
/// names the option).
pub fn parse_platform(s: &str) -> Result<Platform, ConvertError> {
    s.parse().map_err(
        |e: weenv_registry::manifest::PlatformParseError| ConvertError::BadOption {
            field: "--platform",
            reason: e.to_string(),
        },
    )
}

/// zstd level the converter uses by default (the format writer's own default is 3): frames
/// are compressed independently, which costs ~7% of size against one `zstd -3` stream on a
/// Debian rootfs with 1 MiB frames; level 6 recovers it (1.024x of `zstd -3`,
/// integration/bench/convert_bench.sh). Since issue 15 it is the level of chunk frames (large
/// files); shared frames use [`DEFAULT_SHARED_LEVEL`].
pub const DEFAULT_LEVEL: i32 = 6;

/// zstd level the converter uses by default for shared frames (headers + small files): 256 KiB
/// frames each start without context and lose more against one stream than 1 MiB chunks do
/// (1.095x `zstd -3` on the Debian + python3 image at level 6); level 14 (zstd's optimal
/// parser for inputs of at most 256 KiB) brings the image to 1.046x (level 9: 1.080x, 13:
/// 1.063x, 15: 1.045x, 19: 1.039x), and makes the frames a cold start fetches smaller too. It
/// costs CPU at conversion only (decompression is as fast); the frame pool spreads it over the
/// cores.
pub const DEFAULT_SHARED_LEVEL: i32 = 14;

/// Options of [`convert_image`].
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// Format writer options (chunk size, zstd level, ...).
    pub writer: WriterOptions,
    /// Convert only this platform of an index (the output is then a plain manifest).
    pub platform: Option<Platform>,
    /// Layers converted at the same time. Default: available cores.
    pub jobs: usize,
    /// Threads compressing the frames of one layer (the layer's own thread cuts the tar stream
    /// into frames and writes them in order; 1 = it compresses them itself). The output does not
    /// depend on it. Default: available cores, so a single big layer uses every core.
    pub workers: usize,
    /// Chunk size of chunked blob uploads. Default 16 MiB.
    pub upload_chunk: usize,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            writer: WriterOptions {
                level: DEFAULT_LEVEL,
                shared_level: Some(DEFAULT_SHARED_LEVEL),
                ..WriterOptions::default()
            },
            platform: None,
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            upload_chunk: 16 << 20,
        }
    }
}

/// Progress callbacks (the CLI draws bars; tests pass [`NoProgress`]).
pub trait Progress: Send + Sync {
    /// A layer starts (fetch + convert).
    fn layer_started(&self, _platform: &str, _index: usize, _total: usize, _size: u64) {}
    /// A layer is done.
    fn layer_done(&self, _platform: &str, _report: &LayerReport) {}
}

/// Progress that reports nothing.
pub struct NoProgress;
impl Progress for NoProgress {}

/// Platform label of an index entry.
pub fn platform_label(d: &Descriptor) -> Option<String> {
    d.platform.as_ref().map(Platform::to_string)
}

/// `rootfs.diff_ids` of an image config.
pub fn diff_ids(config: &[u8], location: &str) -> Result<Vec<Digest>, ConvertError> {
    #[derive(serde::Deserialize)]
    struct RootFs {
        #[serde(default)]
        diff_ids: Vec<Digest>,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        rootfs: RootFs,
    }
    let c: Config = serde_json::from_slice(config).map_err(|e| ConvertError::BadImage {
        location: location.to_string(),
        reason: format!("image config has no valid rootfs.diff_ids: {e}"),
    })?;
    Ok(c.rootfs.diff_ids)
}

/// Convert the image at `src` and write it to `dst`.
pub async fn convert_image(
    client: &Client,
    src: &ImageLocation,
    dst: &ImageLocation,
    opts: &ConvertOptions,
    progress: Arc<dyn Progress>,
) -> Result<ImageReport, ConvertError> {
    opts.writer
        .validate()
        .map_err(|e| ConvertError::format("options", e))?;
    for (field, v) in [("--jobs", opts.jobs), ("--workers", opts.workers)] {
        if v == 0 {
            return Err(ConvertError::BadOption {
                field,
                reason: "must be at least 1".into(),
            });
        }
    }
    let started = Instant::now();
    let source = {
        let (client, src) = (client.clone(), src.clone());
        tokio::task::spawn_blocking(move || Source::open(&src, &client))
            .await
            .map_err(|e| ConvertError::Task(e.to_string()))??
    };
    let sink = Sink::open(dst, client, source.registry_repo(), opts.upload_chunk)?;
    let ctx = Ctx {
        source: &source,
        sink: &sink,
        scratch: sink.scratch(),
        opts,
        progress,
    };
    let root = source.root().await?;
    let parsed = Manifest::parse(&root.media_type, &root.bytes)?;
    let (digest, media_type, manifests) = match parsed {
        Manifest::Image(m) => {
            let (bytes, report) = ctx.convert_manifest(&m, &root.digest, None).await?;
            let d = sink.put_top(bytes.into(), OCI_MANIFEST).await?;
            (d, OCI_MANIFEST, vec![report])
        }
        Manifest::Index(ix) => {
            if let Some(p) = &opts.platform {
                let d = select_platform(&ix, &p.os, &p.architecture, p.variant.as_deref())
                    .ok_or_else(|| ConvertError::BadImage {
                        location: source.describe(),
                        reason: format!("index has no manifest for {}/{}", p.os, p.architecture),
                    })?
                    .clone();
                let (m, mdigest) = ctx.child(&d).await?;
                let (bytes, report) = ctx
                    .convert_manifest(&m, &mdigest, platform_label(&d))
                    .await?;
                let dg = sink.put_top(bytes.into(), OCI_MANIFEST).await?;
                (dg, OCI_MANIFEST, vec![report])
            } else {
                let (bytes, reports) = ctx.convert_index(&ix).await?;
                let d = sink.put_top(bytes.into(), OCI_INDEX).await?;
                (d, OCI_INDEX, reports)
            }
        }
    };
    Ok(ImageReport {
        source: source.describe(),
        destination: sink.describe(),
        digest: digest.to_string(),
        media_type: media_type.to_string(),
        manifests,
        seconds: started.elapsed().as_secs_f64(),
    })
}

struct Ctx<'a> {
    source: &'a Source,
    sink: &'a Sink,
    scratch: &'a Path,
    opts: &'a ConvertOptions,
    progress: Arc<dyn Progress>,
}

impl Ctx<'_> {
    async fn child(&self, d: &Descriptor) -> Result<(ImageManifest, Digest), ConvertError> {
        let blob = self.source.manifest(d).await?;
        match Manifest::parse(&blob.media_type, &blob.bytes)? {
            Manifest::Image(m) => Ok((m, blob.digest)),
            Manifest::Index(_) => Err(ConvertError::BadImage {
                location: self.source.describe(),
                reason: format!(
                    "index entry {} is itself an index (nested indexes are not supported)",
                    d.digest
                ),
            }),
        }
    }

    async fn convert_index(
        &self,
        ix: &ImageIndex,
    ) -> Result<(Vec<u8>, Vec<ManifestReport>), ConvertError> {
        let mut out = ix.clone();
        out.media_type = Some(OCI_INDEX.to_string());
        out.manifests.clear();
        let mut reports = Vec::new();
        for d in &ix.manifests {
            // Attestations and other artifacts carry no runnable platform; leave them out.
            let runnable = d
                .platform
                .as_ref()
                .is_some_and(|p| p.os != "unknown" && p.architecture != "unknown");
            if is_index_type(&d.media_type) || !runnable {
                continue;
            }
            let (m, mdigest) = self.child(d).await?;
            let (bytes, report) = self
                .convert_manifest(&m, &mdigest, platform_label(d))
                .await?;
            let size = bytes.len() as u64;
            let digest = self
                .sink
                .put_child_manifest(bytes.into(), OCI_MANIFEST)
                .await?;
            let mut nd = Descriptor::new(OCI_MANIFEST, digest, size);
            nd.platform = d.platform.clone();
            nd.annotations = d.annotations.clone();
            out.manifests.push(nd);
            reports.push(report);
        }
        if out.manifests.is_empty() {
            return Err(ConvertError::BadImage {
                location: self.source.describe(),
                reason: "index lists no image manifest with a platform".into(),
            });
        }
        let bytes = serde_json::to_vec(&out).map_err(|e| ConvertError::Task(e.to_string()))?;
        Ok((bytes, reports))
    }

    /// Convert one image manifest; returns the new manifest's bytes (not yet put).
    async fn convert_manifest(
        &self,
        m: &ImageManifest,
        source_digest: &Digest,
        platform: Option<String>,
    ) -> Result<(Vec<u8>, ManifestReport), ConvertError> {
        let label = platform.clone().unwrap_or_default();
        let config = self.source.blob_bytes(&m.config).await?;
        let ids = diff_ids(&config, &self.source.describe())?;
        if ids.len() != m.layers.len() {
            return Err(ConvertError::BadImage {
                location: self.source.describe(),
                reason: format!(
                    "manifest has {} layers but the config lists {} diff_ids",
                    m.layers.len(),
                    ids.len()
                ),
            });
        }
        for (i, l) in m.layers.iter().enumerate() {
            if classify(&l.media_type).is_none()
                && !l
                    .annotations
                    .contains_key(weenv_format::ANNOTATION_TOC_DIGEST)
            {
                return Err(ConvertError::UnsupportedMediaType {
                    index: i,
                    digest: l.digest.to_string(),
                    media_type: l.media_type.clone(),
                });
            }
        }
        self.sink.put_bytes(&m.config.digest, config).await?;
        let total = m.layers.len();
        let results: Vec<(Descriptor, LayerReport)> = stream::iter(m.layers.iter().enumerate())
            .map(|(i, l)| self.convert_layer(i, total, l, &ids[i], &label))
            .buffered(self.opts.jobs)
            .try_collect()
            .await?;
        let mut config_desc = m.config.clone();
        config_desc.media_type = OCI_CONFIG.to_string();
        let out = ImageManifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_string()),
            artifact_type: m.artifact_type.clone(),
            config: config_desc,
            layers: results
                .iter()
                .map(|(d, _)| with_snapshot_annotations(d))
                .collect(),
            subject: m.subject.clone(),
            annotations: m.annotations.clone(),
        };
        let bytes = serde_json::to_vec(&out).map_err(|e| ConvertError::Task(e.to_string()))?;
        let report = ManifestReport {
            platform,
            source_digest: source_digest.to_string(),
            digest: Digest::sha256(&bytes).to_string(),
            layers: results.into_iter().map(|(_, r)| r).collect(),
        };
        Ok((bytes, report))
    }

    async fn convert_layer(
        &self,
        index: usize,
        total: usize,
        l: &Descriptor,
        diff_id: &Digest,
        label: &str,
    ) -> Result<(Descriptor, LayerReport), ConvertError> {
        self.progress.layer_started(label, index, total, l.size);
        let started = Instant::now();
        let blob = self.source.blob(l, self.scratch).await?;
        let result = self
            .convert_fetched(index, l, diff_id, &blob, started)
            .await;
        blob.discard();
        if let Ok((_, r)) = &result {
            self.progress.layer_done(label, r);
        }
        result
    }

    async fn convert_fetched(
        &self,
        index: usize,
        l: &Descriptor,
        diff_id: &Digest,
        blob: &LocalBlob,
        started: Instant,
    ) -> Result<(Descriptor, LayerReport), ConvertError> {
        let existing = {
            let (a, b) = (l.annotations.clone(), blob.clone());
            tokio::task::spawn_blocking(move || existing_weenv(&a, &b))
                .await
                .map_err(|e| ConvertError::Task(e.to_string()))??
        };
        if let Some(annotations) = existing {
            self.sink.put_local(&l.digest, blob).await?;
            let mut d = Descriptor::new(MEDIA_TYPE_LAYER_ZSTD, l.digest.clone(), l.size);
            d.annotations = annotations;
            let report = unchanged(index, l, LayerAction::Passthrough, started, None);
            return Ok((d, report));
        }
        let out = self.scratch.join(format!("out-{index}-{}", l.digest.hex()));
        let summary = {
            let (b, o, w, dg, n) = (
                blob.clone(),
                out.clone(),
                self.opts.writer.clone(),
                l.digest.to_string(),
                self.opts.workers,
            );
            tokio::task::spawn_blocking(move || convert_blob(&b, &dg, &o, &w, n))
                .await
                .map_err(|e| ConvertError::Task(e.to_string()))?
        };
        let summary = match summary {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&out);
                if let ConvertError::Format { error: source, .. } = &e {
                    if let Some(why) = unrepresentable(source) {
                        return self.keep_plain(index, l, blob, why, started).await;
                    }
                }
                return Err(e);
            }
        };
        if summary.diff_id != *diff_id {
            let _ = std::fs::remove_file(&out);
            return Err(ConvertError::DiffIdMismatch {
                index,
                digest: l.digest.to_string(),
                expected: diff_id.to_string(),
                actual: summary.diff_id.to_string(),
            });
        }
        let converted = LocalBlob {
            path: out,
            offset: 0,
            len: summary.blob_size,
            temporary: true,
        };
        let put = self.sink.put_local(&summary.blob_digest, &converted).await;
        converted.discard();
        put?;
        let mut d = Descriptor::new(
            MEDIA_TYPE_LAYER_ZSTD,
            summary.blob_digest.clone(),
            summary.blob_size,
        );
        d.annotations = descriptor_annotations(&summary);
        let report = LayerReport {
            index,
            action: LayerAction::Converted,
            source_digest: l.digest.to_string(),
            source_media_type: l.media_type.clone(),
            source_size: l.size,
            tar_size: summary.uncompressed_size,
            digest: summary.blob_digest.to_string(),
            size: summary.blob_size,
            entries: summary.entry_count,
            frames: summary.frame_count,
            seconds: started.elapsed().as_secs_f64(),
            note: None,
        };
        Ok((d, report))
    }

    /// Keep layer `l` as an ordinary layer (its blob unchanged) because the weenv format
    /// cannot represent it; `why` names the entry.
    async fn keep_plain(
        &self,
        index: usize,
        l: &Descriptor,
        blob: &LocalBlob,
        why: String,
        started: Instant,
    ) -> Result<(Descriptor, LayerReport), ConvertError> {
        let note = format!(
            "layer {index} ({}) kept as an ordinary layer, unpacked the ordinary way (not lazily): {why}",
            l.digest
        );
        tracing::warn!("{note}");
        let media_type = {
            let b = blob.clone();
            tokio::task::spawn_blocking(move || plain_media_type(&b))
                .await
                .map_err(|e| ConvertError::Task(e.to_string()))??
        };
        self.sink.put_local(&l.digest, blob).await?;
        let mut d = Descriptor::new(media_type, l.digest.clone(), l.size);
        d.annotations = l
            .annotations
            .iter()
            .filter(|(k, _)| !k.starts_with("io.weenv."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let report = unchanged(index, l, LayerAction::Plain, started, Some(note));
        Ok((d, report))
    }
}

/// `d` with the annotations containerd's unpacker passes to the snapshotter (see
/// [`weenv_format::snapshot_labels`]): stock clients then mount weenv layers lazily.
pub fn with_snapshot_annotations(d: &Descriptor) -> Descriptor {
    let mut d = d.clone();
    weenv_format::snapshot_labels::add_snapshot_annotations(&d.digest, &mut d.annotations);
    d
}

/// Report of a layer written unchanged (its blob is the source blob).
fn unchanged(
    index: usize,
    l: &Descriptor,
    action: LayerAction,
    started: Instant,
    note: Option<String>,
) -> LayerReport {
    LayerReport {
        index,
        action,
        source_digest: l.digest.to_string(),
        source_media_type: l.media_type.clone(),
        source_size: l.size,
        tar_size: 0,
        digest: l.digest.to_string(),
        size: l.size,
        entries: 0,
        frames: 0,
        seconds: started.elapsed().as_secs_f64(),
        note,
    }
}

/// Why a tar that stock containerd unpacks cannot be a weenv layer, if that is what `e` says
/// (the layer is then kept as an ordinary layer). Every other error fails the conversion:
/// containerd would refuse those tars too (or the input is corrupt), e.g. a name longer than
/// 255 bytes.
///
/// - duplicate entries: containerd lets the later one win; a weenv TOC lists each path once
///   and the tar check would have to prove which copy is served;
/// - a hardlink whose target is not an earlier regular file of the same layer (a file in a
///   lower layer: the TOC can only point at bytes in its own blob; or another hardlink: a TOC
///   entry must say literally what its tar header says, so chains cannot be resolved);
/// - GNU sparse files: their payload is not the file's bytes, so chunks cannot map them.
pub fn unrepresentable(e: &weenv_format::FormatError) -> Option<String> {
    use weenv_format::FormatError as F;
    match e {
        F::DuplicatePath { path } => Some(format!(
            "entry {path:?} appears more than once in the tar (containerd keeps the last copy)"
        )),
        F::HardlinkTarget { path, target } => Some(format!(
            "hardlink {path:?} -> {target:?} names no earlier regular file of this layer (a lower layer's file, or another hardlink)"
        )),
        F::GnuSparse { path } => Some(format!("entry {path:?} is a GNU sparse file")),
        _ => None,
    }
}

/// OCI media type of an ordinary layer blob, from its content (docker archives may lie).
fn plain_media_type(blob: &LocalBlob) -> Result<&'static str, ConvertError> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4);
    blob.open()?
        .take(4)
        .read_to_end(&mut head)
        .map_err(|e| ConvertError::io(format!("reading {}", blob.path.display()), e))?;
    Ok(match crate::layer::sniff(&head) {
        crate::layer::Compression::None => "application/vnd.oci.image.layer.v1.tar",
        crate::layer::Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
        crate::layer::Compression::Zstd => MEDIA_TYPE_LAYER_ZSTD,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn platform_option_errors_name_the_option() {
        assert_eq!(
            parse_platform("linux/arm64/v8").unwrap().to_string(),
            "linux/arm64/v8"
        );
        let e = parse_platform("linux").unwrap_err().to_string();
        assert!(
            e.contains("--platform") && e.contains("os/arch[/variant]"),
            "{e}"
        );
    }

    #[test]
    fn unrepresentable_layers_are_named() {
        use weenv_format::FormatError as F;
        let dup = unrepresentable(&F::DuplicatePath { path: "a/b".into() }).unwrap();
        assert!(dup.contains("\"a/b\""), "{dup}");
        let hl = unrepresentable(&F::HardlinkTarget {
            path: "x".into(),
            target: "usr/lib/y".into(),
        })
        .unwrap();
        assert!(hl.contains("usr/lib/y"), "{hl}");
        assert!(unrepresentable(&F::GnuSparse { path: "s".into() }).is_some());
        // Names containerd cannot unpack either fail the conversion.
        assert!(unrepresentable(&F::InvalidPath {
            path: "n".repeat(300),
            reason: "a path component is longer than 255 bytes (NAME_MAX)",
        })
        .is_none());
        assert!(unrepresentable(&F::DotDotPath {
            path: "../x".into()
        })
        .is_none());
    }

    #[test]
    fn reads_diff_ids() {
        let d = Digest::sha256(b"x");
        let c = format!(r#"{{"rootfs":{{"type":"layers","diff_ids":["{d}"]}}}}"#);
        assert_eq!(diff_ids(c.as_bytes(), "t").unwrap(), vec![d]);
        assert!(diff_ids(b"{}", "t").is_err());
    }
}
