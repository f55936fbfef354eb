//! `prefetch`: attach a start-up prefetch profile to a weenv image.
//!
//! A profile (paths a container reads at start-up, as `weenv profile` records them) is
//! resolved against the TOCs of the image's layers through the overlayfs merged view
//! ([`weenv_format::prefetch::resolve_profile`]), and each weenv layer descriptor of the image
//! manifest gets the frames it must prefetch in the annotation
//! [`ANNOTATION_PREFETCH`] (removed from a layer with nothing to prefetch). Only manifests
//! (and the index) are rewritten: layer and config blobs stay as they are and are never
//! re-uploaded (same repository or layout: already there; another repository of the same
//! registry: cross-repository mount; elsewhere: copied once, as `image` would).
//!
//! For an index every runnable platform is profiled (or the one `--platform` names; the other
//! platforms keep their entries when the index is rewritten in place, and are left out of an
//! index written elsewhere, where `--platform` then writes a plain manifest as `image` does).
//!
//! Policy (decided before anything is written): an image without any weenv layer is an error
//! ([`ConvertError::NotWeenv`]); a non-empty profile of which no path resolves in any profiled
//! manifest is an error ([`ConvertError::ProfileUnresolved`]: wrong image or wrong profile);
//! some unresolved paths are reported and the rest is written; an empty profile removes the
//! image's profile. The output is deterministic: applying the same profile twice gives the
//! same manifest digest.

use crate::convert::{platform_label, with_snapshot_annotations};
use crate::inspect::layer_toc;
use crate::location::ImageLocation;
use crate::sink::{Put, Sink};
use crate::source::Source;
pub use crate::summary::profile_table;
use crate::verify::{index_children, runnable};
use crate::ConvertError;
use bytes::Bytes;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use weenv_format::prefetch::{
    encode_frames, parse_profile, resolve_profile, Resolved, ANNOTATION_PREFETCH,
};
use weenv_format::{Digest, Toc};
use weenv_registry::Platform;
use weenv_registry::{Client, Descriptor, ImageIndex, ImageManifest, Manifest};

/// One layer of a profiled manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrefetchLayer {
    pub index: usize,
    pub digest: String,
    /// A weenv layer (others cannot be prefetched; they count as empty in the merged view).
    pub weenv: bool,
    /// Profile files this layer provides (topmost layer holding the path).
    pub files: usize,
    /// Frames to prefetch.
    pub frames: usize,
    /// Frames in the layer.
    pub layer_frames: usize,
    /// Compressed bytes of the frames to prefetch.
    pub bytes: u64,
    /// Size of the layer blob.
    pub size: u64,
    /// The annotation value written (`None`: no annotation on this layer).
    pub annotation: Option<String>,
}

/// How the blobs of a manifest got to the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlobCopies {
    /// Already there (same repository or layout).
    pub existing: usize,
    /// Mounted from the source repository (same registry).
    pub mounted: usize,
    /// Bytes sent (a destination on another registry or layout).
    pub written: usize,
}

impl BlobCopies {
    fn add(&mut self, p: Put) {
        match p {
            Put::Existing => self.existing += 1,
            Put::Mounted => self.mounted += 1,
            Put::Written => self.written += 1,
        }
    }
}

/// One profiled image manifest (one platform).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrefetchManifest {
    /// `os/arch[/variant]`, or `None` for a single-manifest image.
    pub platform: Option<String>,
    pub source_digest: String,
    /// Digest of the rewritten manifest (equal to `source_digest` when nothing changed).
    pub digest: String,
    pub layers: Vec<PrefetchLayer>,
    /// Uncompressed bytes of the resolved profile files.
    pub file_bytes: u64,
    /// Profile paths naming no regular file in this manifest's merged view.
    pub unresolved: Vec<String>,
    pub blobs: BlobCopies,
}

impl PrefetchManifest {
    /// Compressed bytes to prefetch, all layers.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes).sum()
    }
}

/// What [`apply_profile`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProfileReport {
    pub source: String,
    pub destination: String,
    /// Digest of what was written under the destination tag (manifest or index).
    pub digest: String,
    pub media_type: String,
    /// Paths in the profile.
    pub paths: usize,
    pub manifests: Vec<PrefetchManifest>,
}

/// Reads a profile: a file, or stdin for `-` (see [`parse_profile`] for the format).
pub fn read_profile(arg: &str) -> Result<Vec<String>, ConvertError> {
    let mut text = String::new();
    let res = if arg == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(Path::new(arg)).map(|t| text = t)
    };
    res.map_err(|e| {
        ConvertError::io(
            format!(
                "reading the prefetch profile {arg} (one path per line; record one with `weenv profile > FILE`)"
            ),
            e,
        )
    })?;
    Ok(parse_profile(&text))
}

/// Sets (or, for a layer with no frames, removes) the prefetch annotation of every weenv layer
/// of `m` (`tocs[i]` is `None` for a non-weenv layer) for the profile `paths`. Pure.
pub fn profile_manifest(
    m: &ImageManifest,
    tocs: &[Option<&Toc>],
    paths: &[String],
) -> (ImageManifest, Vec<PrefetchLayer>, Resolved) {
    let empty = Toc::new();
    let all: Vec<&Toc> = tocs.iter().map(|t| t.unwrap_or(&empty)).collect();
    let resolved = resolve_profile(&all, paths);
    let mut out = m.clone();
    let mut layers = Vec::with_capacity(m.layers.len());
    for (i, d) in out.layers.iter_mut().enumerate() {
        let frames = resolved.frames.get(i).map(Vec::as_slice).unwrap_or(&[]);
        let toc = tocs.get(i).copied().flatten();
        let annotation = match toc {
            Some(_) if !frames.is_empty() => Some(encode_frames(frames)),
            _ => None,
        };
        if toc.is_some() {
            match &annotation {
                Some(v) => d
                    .annotations
                    .insert(ANNOTATION_PREFETCH.to_string(), v.clone()),
                None => d.annotations.remove(ANNOTATION_PREFETCH),
            };
        }
        *d = with_snapshot_annotations(d);
        layers.push(PrefetchLayer {
            index: i,
            digest: d.digest.to_string(),
            weenv: toc.is_some(),
            files: resolved.files.get(i).copied().unwrap_or(0),
            frames: frames.len(),
            layer_frames: toc.map_or(0, |t| t.frames.len()),
            bytes: toc.map_or(0, |t| {
                frames
                    .iter()
                    .filter_map(|f| t.frame(*f))
                    .map(|f| f.clen)
                    .sum()
            }),
            size: d.size,
            annotation,
        });
    }
    (out, layers, resolved)
}

/// `m` with its profile kept as it is and the stock-client annotations (re)written on every
/// layer (see [`with_snapshot_annotations`]); the report lists each layer's current profile.
/// Pure.
pub fn keep_profile(
    m: &ImageManifest,
    tocs: &[Option<&Toc>],
) -> (ImageManifest, Vec<PrefetchLayer>, Resolved) {
    let (_, mut layers, resolved) = profile_manifest(m, tocs, &[]);
    let mut out = m.clone();
    for (d, l) in out.layers.iter_mut().zip(&mut layers) {
        *d = with_snapshot_annotations(d);
        l.annotation = d.annotations.get(ANNOTATION_PREFETCH).cloned();
        if let (Some(v), Some(toc)) = (&l.annotation, tocs.get(l.index).copied().flatten()) {
            let frames =
                weenv_format::prefetch::decode_frames(v, toc.frames.len()).unwrap_or_default();
            l.frames = frames.len();
            l.bytes = frames
                .iter()
                .filter_map(|f| toc.frame(*f))
                .map(|f| f.clen)
                .sum();
        }
    }
    (out, layers, resolved)
}

/// The index written after profiling: entries whose manifest was rewritten (`rewritten`, by
/// old digest) point at the new manifest; other runnable entries stay when `keep_others` (an
/// index rewritten in place), everything else (attestations, other platforms elsewhere) is
/// left out. Pure.
pub fn rewrite_index(
    ix: &ImageIndex,
    rewritten: &BTreeMap<Digest, (Digest, u64, String)>,
    keep_others: bool,
) -> ImageIndex {
    let mut out = ix.clone();
    out.manifests = ix
        .manifests
        .iter()
        .filter_map(|d| match rewritten.get(&d.digest) {
            Some((digest, size, media_type)) => {
                let mut nd = Descriptor::new(media_type, digest.clone(), *size);
                nd.platform = d.platform.clone();
                nd.annotations = d.annotations.clone();
                Some(nd)
            }
            None => (keep_others && runnable(d)).then(|| d.clone()),
        })
        .collect();
    out
}

/// Whether `a` and `b` are the same repository / layout directory (manifests by digest and
/// blobs of one are in the other).
pub fn same_repository(a: &ImageLocation, b: &ImageLocation) -> bool {
    match (a, b) {
        (ImageLocation::Registry(x), ImageLocation::Registry(y)) => {
            x.registry() == y.registry() && x.repository() == y.repository()
        }
        (ImageLocation::Layout { dir: x, .. }, ImageLocation::Layout { dir: y, .. }) => {
            x == y || matches!((x.canonicalize(), y.canonicalize()), (Ok(p), Ok(q)) if p == q)
        }
        _ => false,
    }
}

/// One manifest, resolved but not yet written.
struct Planned {
    source_digest: Digest,
    manifest: ImageManifest,
    media_type: String,
    bytes: Vec<u8>,
    report: PrefetchManifest,
}

/// Resolve `paths` against the image at `image` and write the annotated manifest(s) to `dst`
/// (default: the same place and tag). See the module docs for the policy.
pub async fn apply_profile(
    client: &Client,
    image: &ImageLocation,
    dst: Option<&ImageLocation>,
    paths: &[String],
    platform: Option<&Platform>,
) -> Result<ProfileReport, ConvertError> {
    rewrite(client, image, dst, Some(paths), platform).await
}

/// Rewrite the manifest(s) of the weenv image at `image` (to `dst`, as [`apply_profile`]
/// does) keeping their profile and (re)writing only the annotations stock containerd clients
/// need for lazy pulls (see [`with_snapshot_annotations`]): images converted before those
/// annotations existed get them without any layer being re-uploaded.
pub async fn apply_annotations(
    client: &Client,
    image: &ImageLocation,
    dst: Option<&ImageLocation>,
    platform: Option<&Platform>,
) -> Result<ProfileReport, ConvertError> {
    rewrite(client, image, dst, None, platform).await
}

async fn rewrite(
    client: &Client,
    image: &ImageLocation,
    dst: Option<&ImageLocation>,
    paths: Option<&[String]>,
    platform: Option<&Platform>,
) -> Result<ProfileReport, ConvertError> {
    if dst.is_none() && matches!(image, ImageLocation::Archive { .. }) {
        return Err(ConvertError::BadOption {
            field: "--to",
            reason: "a docker-archive cannot be rewritten in place; pass --to oci:DIR[:tag] or a registry reference".into(),
        });
    }
    let dst = dst.unwrap_or(image);
    let in_place = same_repository(image, dst);
    let source = Arc::new(Source::open_async(image, client).await?);
    let root = source.root().await?;
    let mut plans = Vec::new();
    let index = match Manifest::parse(&root.media_type, &root.bytes)? {
        Manifest::Image(m) => {
            plans.push(plan(&source, m, &root.digest, &root.media_type, None, paths).await?);
            None
        }
        Manifest::Index(ix) => {
            let children = index_children(&ix, platform, &source.describe())?;
            for d in &children {
                let blob = source.manifest(d).await?;
                let Manifest::Image(m) = Manifest::parse(&blob.media_type, &blob.bytes)? else {
                    return Err(ConvertError::BadImage {
                        location: source.describe(),
                        reason: format!("index entry {} is itself an index", d.digest),
                    });
                };
                let label = platform_label(d);
                plans.push(plan(&source, m, &blob.digest, &blob.media_type, label, paths).await?);
            }
            Some(ix)
        }
    };
    check_policy(&plans, paths.map_or(0, <[String]>::len), &source.describe())?;

    let sink = Sink::open(dst, client, source.registry_repo(), 16 << 20)?;
    for p in &mut plans {
        for d in std::iter::once(&p.manifest.config).chain(&p.manifest.layers) {
            let put = match sink.has_or_mount(&d.digest, d.size).await? {
                Some(put) => put,
                None => {
                    let blob = source.blob(d, sink.scratch()).await?;
                    let put = sink.upload_local(&d.digest, &blob).await;
                    blob.discard();
                    put?
                }
            };
            p.report.blobs.add(put);
        }
    }

    let top_is_plain = index.is_none() || (platform.is_some() && !in_place);
    let (digest, media_type) = if top_is_plain {
        let p = plans.first().ok_or_else(|| ConvertError::BadImage {
            location: source.describe(),
            reason: "no image manifest to profile".into(),
        })?;
        (
            put_top(&sink, dst, &p.bytes, &p.media_type).await?,
            p.media_type.clone(),
        )
    } else {
        let mut rewritten = BTreeMap::new();
        for p in &plans {
            let d = sink
                .put_child_manifest(Bytes::from(p.bytes.clone()), &p.media_type)
                .await?;
            rewritten.insert(
                p.source_digest.clone(),
                (d, p.bytes.len() as u64, p.media_type.clone()),
            );
        }
        let ix = index
            .as_ref()
            .map(|ix| rewrite_index(ix, &rewritten, in_place));
        let mt = root.media_type.clone();
        let bytes = serde_json::to_vec(&ix).map_err(|e| ConvertError::Task(e.to_string()))?;
        (put_top(&sink, dst, &bytes, &mt).await?, mt)
    };
    Ok(ProfileReport {
        source: source.describe(),
        destination: sink.describe(),
        digest: digest.to_string(),
        media_type,
        paths: paths.map_or(0, <[String]>::len),
        manifests: plans.into_iter().map(|p| p.report).collect(),
    })
}

/// Put the top-level manifest/index under the destination's tag, or by digest when the
/// destination is a digest reference (a rewritten manifest cannot keep the old digest).
async fn put_top(
    sink: &Sink,
    dst: &ImageLocation,
    bytes: &[u8],
    media_type: &str,
) -> Result<Digest, ConvertError> {
    let bytes = Bytes::from(bytes.to_vec());
    match dst {
        ImageLocation::Registry(r) if r.tag().is_none() => {
            sink.put_child_manifest(bytes, media_type).await
        }
        _ => sink.put_top(bytes, media_type).await,
    }
}

/// The policy checks of the module docs, before anything is written.
fn check_policy(plans: &[Planned], paths: usize, location: &str) -> Result<(), ConvertError> {
    if !plans.iter().flat_map(|p| &p.report.layers).any(|l| l.weenv) {
        return Err(ConvertError::NotWeenv {
            location: location.to_string(),
        });
    }
    if paths > 0 && plans.iter().all(|p| p.report.unresolved.len() == paths) {
        return Err(ConvertError::ProfileUnresolved {
            location: location.to_string(),
            paths,
            first: plans
                .first()
                .and_then(|p| p.report.unresolved.first())
                .cloned()
                .unwrap_or_default(),
        });
    }
    Ok(())
}

/// Read the TOCs of `m`'s layers and resolve the profile.
async fn plan(
    source: &Arc<Source>,
    m: ImageManifest,
    digest: &Digest,
    media_type: &str,
    platform: Option<String>,
    paths: Option<&[String]>,
) -> Result<Planned, ConvertError> {
    let mut tocs: Vec<Option<Toc>> = Vec::with_capacity(m.layers.len());
    let mut read: BTreeMap<Digest, Option<Toc>> = BTreeMap::new();
    for l in &m.layers {
        if !read.contains_key(&l.digest) {
            let toc = layer_toc(source, l).await?.map(|(t, _)| t);
            read.insert(l.digest.clone(), toc);
        }
        tocs.push(read.get(&l.digest).cloned().flatten());
    }
    let refs: Vec<Option<&Toc>> = tocs.iter().map(Option::as_ref).collect();
    let (out, layers, resolved) = match paths {
        Some(paths) => profile_manifest(&m, &refs, paths),
        None => keep_profile(&m, &refs),
    };
    let bytes = serde_json::to_vec(&out).map_err(|e| ConvertError::Task(e.to_string()))?;
    let media_type = out
        .media_type
        .clone()
        .unwrap_or_else(|| media_type.to_string());
    Ok(Planned {
        report: PrefetchManifest {
            platform,
            source_digest: digest.to_string(),
            digest: Digest::sha256(&bytes).to_string(),
            layers,
            file_bytes: resolved.file_bytes,
            unresolved: resolved.unresolved,
            blobs: BlobCopies::default(),
        },
        source_digest: digest.clone(),
        manifest: out,
        media_type,
        bytes,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn toc(files: &[(&str, &[u32])], frames: u32) -> Toc {
        let mut t = Toc::new();
        t.frames = weenv_format::testdata::frames(frames, 100, 1000);
        t.entries = files
            .iter()
            .map(|(p, fs)| weenv_format::testdata::chunked_file(p, fs, 10))
            .collect();
        t
    }

    fn manifest(n: usize) -> ImageManifest {
        let d = |i: usize| Descriptor::new("l", Digest::sha256(&[i as u8]), 1000);
        ImageManifest {
            schema_version: 2,
            media_type: Some(weenv_registry::manifest::OCI_MANIFEST.into()),
            artifact_type: None,
            config: Descriptor::new("c", Digest::sha256(b"c"), 1),
            layers: (0..n).map(d).collect(),
            subject: None,
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn annotates_sets_and_removes() {
        let lower = toc(&[("a", &[0, 1]), ("b", &[3])], 5);
        let upper = toc(&[("c", &[0])], 2);
        let mut m = manifest(3);
        // A stale profile on the top layer is removed; the non-weenv layer is untouched.
        m.layers[2]
            .annotations
            .insert(ANNOTATION_PREFETCH.into(), "1".into());
        m.layers[1]
            .annotations
            .insert(ANNOTATION_PREFETCH.into(), "junk".into());
        let paths: Vec<String> = ["/a", "b", "/nope"].map(String::from).to_vec();
        let (out, layers, res) = profile_manifest(&m, &[Some(&lower), None, Some(&upper)], &paths);
        assert_eq!(
            out.layers[0].annotations.get(ANNOTATION_PREFETCH).unwrap(),
            "0-1,3"
        );
        assert_eq!(
            out.layers[1].annotations.get(ANNOTATION_PREFETCH).unwrap(),
            "junk"
        );
        assert!(!out.layers[2].annotations.contains_key(ANNOTATION_PREFETCH));
        assert_eq!(res.unresolved, vec!["/nope".to_string()]);
        assert_eq!(layers[0].files, 2);
        assert_eq!((layers[0].frames, layers[0].layer_frames), (3, 5));
        assert_eq!(layers[0].bytes, 300);
        assert!(!layers[1].weenv);
        assert_eq!((layers[2].frames, layers[2].annotation.clone()), (0, None));
        // Deterministic: the annotated manifest annotates to itself.
        let (again, _, _) = profile_manifest(&out, &[Some(&lower), None, Some(&upper)], &paths);
        assert_eq!(again, out);
        // An empty profile clears every weenv layer's annotation.
        let (cleared, _, _) = profile_manifest(&out, &[Some(&lower), None, Some(&upper)], &[]);
        assert!(!cleared.layers[0]
            .annotations
            .contains_key(ANNOTATION_PREFETCH));
    }

    #[test]
    fn keeping_the_profile_writes_only_the_stock_client_annotations() {
        use weenv_format::snapshot_labels::ANNOTATION_SNAPSHOT_LAYER_DIGEST;
        let lower = toc(&[("a", &[0, 1])], 5);
        let mut m = manifest(2);
        let hint = weenv_format::TocHint {
            offset: 900,
            length: 100,
            digest: Digest::sha256(b"toc"),
        };
        m.layers[0].annotations = crate::layer::hint_annotations(&hint);
        m.layers[0]
            .annotations
            .insert(ANNOTATION_PREFETCH.into(), "0-1".into());
        let (out, layers, _) = keep_profile(&m, &[Some(&lower), None]);
        let a = &out.layers[0].annotations;
        assert_eq!(a.get(ANNOTATION_PREFETCH).map(String::as_str), Some("0-1"));
        assert_eq!(
            a.get(ANNOTATION_SNAPSHOT_LAYER_DIGEST),
            Some(&m.layers[0].digest.to_string())
        );
        assert_eq!(
            weenv_format::snapshot_labels::layer_from_labels(a).and_then(|l| l.hint),
            Some(hint)
        );
        assert_eq!(out.layers[1], m.layers[1], "a plain layer is left alone");
        assert_eq!((layers[0].frames, layers[0].bytes), (2, 200));
        assert_eq!(layers[0].annotation.as_deref(), Some("0-1"));
        // Profiling writes them too; both are idempotent.
        let (profiled, _, _) = profile_manifest(&m, &[Some(&lower), None], &["/a".into()]);
        assert_eq!(profiled, out);
        assert_eq!(keep_profile(&out, &[Some(&lower), None]).0, out);
    }

    #[test]
    fn rewrites_index_entries() {
        let entry = |os: &str, arch: &str, data: &[u8]| {
            let mut d = Descriptor::new(
                weenv_registry::manifest::OCI_MANIFEST,
                Digest::sha256(data),
                10,
            );
            d.platform = Some(
                serde_json::from_value(serde_json::json!({"os": os, "architecture": arch}))
                    .unwrap(),
            );
            d.annotations.insert("x".into(), "y".into());
            d
        };
        let ix = ImageIndex {
            schema_version: 2,
            media_type: Some(weenv_registry::manifest::OCI_INDEX.into()),
            artifact_type: None,
            manifests: vec![
                entry("linux", "amd64", b"1"),
                entry("linux", "arm64", b"2"),
                entry("unknown", "unknown", b"3"),
            ],
            subject: None,
            annotations: BTreeMap::new(),
        };
        let new = Digest::sha256(b"new");
        let rewritten = BTreeMap::from([(
            Digest::sha256(b"1"),
            (
                new.clone(),
                42,
                "application/vnd.oci.image.manifest.v1+json".to_string(),
            ),
        )]);
        let kept = rewrite_index(&ix, &rewritten, true);
        assert_eq!(kept.manifests.len(), 2);
        assert_eq!(kept.manifests[0].digest, new);
        assert_eq!(kept.manifests[0].size, 42);
        assert_eq!(kept.manifests[0].annotations.get("x").unwrap(), "y");
        assert_eq!(kept.manifests[0].platform, ix.manifests[0].platform);
        assert_eq!(kept.manifests[1], ix.manifests[1]);
        let alone = rewrite_index(&ix, &rewritten, false);
        assert_eq!(alone.manifests.len(), 1);
    }

    #[test]
    fn same_repository_compares_repo_and_dir() {
        let p = |s: &str| ImageLocation::parse(s).unwrap();
        assert!(same_repository(&p("r:1/a/b:x"), &p("r:1/a/b:y")));
        assert!(!same_repository(&p("r:1/a/b:x"), &p("r:1/a/c:x")));
        assert!(!same_repository(&p("r:1/a/b:x"), &p("r:2/a/b:x")));
        assert!(same_repository(&p("oci:/tmp/l:a"), &p("oci:/tmp/l:b")));
        assert!(!same_repository(&p("oci:/tmp/l:a"), &p("oci:/tmp/m:a")));
    }

    #[test]
    fn reads_profiles_and_names_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p");
        std::fs::write(
            &f,
            "# recorded\n/usr/bin/python3\n\n/usr/bin/python3\nlib/x\n",
        )
        .unwrap();
        assert_eq!(
            read_profile(f.to_str().unwrap()).unwrap(),
            vec!["/usr/bin/python3".to_string(), "lib/x".to_string()]
        );
        let e = read_profile(dir.path().join("missing").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("prefetch profile"), "{e}");
    }
}
