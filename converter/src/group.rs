//! `weenv-convert group create`: publish a layer group (see `weenv_env::group`).
//!
//! Sources: a directory (tarred deterministically: sorted, owner 0:0), a tarball (plain,
//! gzip or zstd), or a range of an existing image's layers (`--from REF --layers 0..3`; weenv
//! layers are reused as they are and mounted across repositories, other layers are
//! converted). Every layer is written as a weenv layer, pushed (skipped when the registry has
//! it, so groups sharing layers share blobs), then the group config and manifest are pushed.

use bytes::Bytes;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use thiserror::Error;
use weenv_env::fragment::{merge_fragment, source_config};
use weenv_env::group::{
    build_group, BuiltGroup, ConfigFragment, GroupConfig, GroupKind, GROUP_CONFIG_VERSION,
    MEDIA_TYPE_OCI_MANIFEST,
};
use weenv_format::reader::TocHint;
use weenv_format::writer::{descriptor_annotations, write_layer, LayerSummary, WriterOptions};
use weenv_format::{Digest, FormatError, MEDIA_TYPE_LAYER_ZSTD};
use weenv_registry::manifest::Descriptor;
use weenv_registry::{BlobPush, Client, Platform, Reference, RegistryError};

/// Upload chunk size for layer blobs.
const UPLOAD_CHUNK: usize = 8 << 20;

/// Errors of group creation.
#[derive(Debug, Error)]
pub enum GroupCmdError {
    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },
    #[error("converting {what} to a weenv layer: {error}")]
    Format { what: String, error: FormatError },
    #[error("{context}: {error}")]
    Registry {
        context: String,
        error: Box<RegistryError>,
    },
    #[error("{reference}: {reason}")]
    BadImage { reference: String, reason: String },
    #[error("invalid group: {0}")]
    Invalid(String),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> GroupCmdError {
    let context = context.into();
    move |source| GroupCmdError::Io {
        context,
        error: source,
    }
}

fn reg_err(context: impl Into<String>) -> impl FnOnce(RegistryError) -> GroupCmdError {
    let context = context.into();
    move |source| GroupCmdError::Registry {
        context,
        error: Box::new(source),
    }
}

/// Where the group's content comes from.
#[derive(Clone, Debug)]
pub enum GroupSource {
    Dir(PathBuf),
    Tar(PathBuf),
    Image {
        reference: String,
        layers: Range<usize>,
    },
}

/// What the group is and contributes.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    pub kind: GroupKind,
    pub name: String,
    /// Config fragment given on the command line (merged over an image source's config).
    pub fragment: ConfigFragment,
    /// Default: the source image's platform, else this host's.
    pub platform: Option<Platform>,
    /// Directory sources: clamp file mtimes to this (seconds since the epoch), so rebuilding
    /// the same content gives the same layer digest (`SOURCE_DATE_EPOCH` convention).
    pub mtime_clamp: Option<u64>,
}

/// One layer ready to publish.
#[derive(Clone, Debug)]
struct PreparedLayer {
    desc: Descriptor,
    diff_id: Digest,
    /// Local blob file to upload, or None to mount from `mount_from`.
    file: Option<PathBuf>,
    mount_from: Option<Reference>,
}

/// What `create_group` published.
#[derive(Clone, Debug)]
pub struct GroupReport {
    pub built: BuiltGroup,
    /// (layer digest, size, how it reached the registry).
    pub layers: Vec<(Digest, u64, BlobPush)>,
    /// Bytes uploaded (layers actually sent + config + manifest).
    pub bytes_uploaded: u64,
}

/// Parse `A..B` (or `N` for one layer).
pub fn parse_layer_range(s: &str) -> Result<Range<usize>, GroupCmdError> {
    let bad = || GroupCmdError::Invalid(format!("--layers {s:?}: expected A..B or N"));
    match s.split_once("..") {
        Some((a, b)) => {
            let a: usize = if a.is_empty() {
                0
            } else {
                a.parse().map_err(|_| bad())?
            };
            let b: usize = b.parse().map_err(|_| bad())?;
            if a >= b {
                return Err(bad());
            }
            Ok(a..b)
        }
        None => {
            let n: usize = s.parse().map_err(|_| bad())?;
            Ok(n..n + 1)
        }
    }
}

/// Write a deterministic tar of `dir` (depth-first in sorted name order, owner 0:0, modes kept,
/// mtimes kept or clamped to `mtime_clamp`; sockets and devices skipped).
pub fn tar_dir(dir: &Path, out: impl Write, mtime_clamp: Option<u64>) -> Result<(), GroupCmdError> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    add_dir(&mut b, dir, Path::new(""), mtime_clamp)?;
    b.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(io_err("finishing the tar"))
}

fn add_dir<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    mtime_clamp: Option<u64>,
) -> Result<(), GroupCmdError> {
    let abs = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&abs)
        .map_err(io_err(format!("reading {}", abs.display())))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    for n in names {
        let r = rel.join(&n);
        let p = root.join(&r);
        let m = std::fs::symlink_metadata(&p).map_err(io_err(format!("stat {}", p.display())))?;
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(&m, tar::HeaderMode::Complete);
        if let Some(c) = mtime_clamp {
            h.set_mtime(h.mtime().unwrap_or(0).min(c));
        }
        h.set_uid(0);
        h.set_gid(0);
        let ctx = format!("adding {} to the tar", p.display());
        if m.file_type().is_symlink() {
            let t = std::fs::read_link(&p).map_err(io_err(ctx.clone()))?;
            h.set_size(0);
            b.append_link(&mut h, &r, &t).map_err(io_err(ctx))?;
        } else if m.is_dir() {
            h.set_size(0);
            b.append_data(&mut h, &r, std::io::empty())
                .map_err(io_err(ctx))?;
            add_dir(b, root, &r, mtime_clamp)?;
        } else if m.is_file() {
            let f = File::open(&p).map_err(io_err(ctx.clone()))?;
            b.append_data(&mut h, &r, f).map_err(io_err(ctx))?;
        } else {
            tracing::warn!(path = %p.display(), "skipping special file");
        }
    }
    Ok(())
}

/// Open a tarball, transparently decompressing gzip or zstd.
pub fn open_tar(path: &Path) -> Result<Box<dyn Read + Send>, GroupCmdError> {
    let mut f = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let mut magic = [0u8; 4];
    let n = f
        .read(&mut magic)
        .map_err(io_err(format!("reading {}", path.display())))?;
    let f = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let r = BufReader::with_capacity(1 << 20, f);
    Ok(match &magic[..n] {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(r)),
        [0x28, 0xb5, 0x2f, 0xfd] => {
            Box::new(zstd::stream::read::Decoder::new(r).map_err(io_err("starting zstd decoder"))?)
        }
        _ => Box::new(r),
    })
}

/// Convert a (possibly compressed) tarball into a weenv layer file in `scratch`.
pub fn convert_tar(
    input: &Path,
    scratch: &Path,
    opts: &WriterOptions,
) -> Result<(PathBuf, LayerSummary), GroupCmdError> {
    let reader = open_tar(input)?;
    let out = scratch_file(scratch, "layer-", ".weenv")?;
    let f = File::create(&out).map_err(io_err(format!("creating {}", out.display())))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let s = write_layer(reader, &mut w, opts).map_err(|source| GroupCmdError::Format {
        what: input.display().to_string(),
        error: source,
    })?;
    w.flush()
        .map_err(io_err(format!("writing {}", out.display())))?;
    Ok((out, s))
}

/// A new, uniquely named file in `scratch` (kept; the caller removes it).
pub fn scratch_file(scratch: &Path, prefix: &str, suffix: &str) -> Result<PathBuf, GroupCmdError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .tempfile_in(scratch)
        .map_err(io_err(format!(
            "creating a scratch file in {}",
            scratch.display()
        )))?
        .into_temp_path()
        .keep()
        .map_err(|e| GroupCmdError::Io {
            context: "keeping a scratch file".into(),
            error: e.error,
        })
}

fn weenv_descriptor(s: &LayerSummary) -> Descriptor {
    Descriptor {
        annotations: descriptor_annotations(s),
        ..Descriptor::new(MEDIA_TYPE_LAYER_ZSTD, s.blob_digest.clone(), s.blob_size)
    }
}

fn prepared_from_file(path: PathBuf, s: &LayerSummary) -> PreparedLayer {
    PreparedLayer {
        desc: weenv_descriptor(s),
        diff_id: s.diff_id.clone(),
        file: Some(path),
        mount_from: None,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, GroupCmdError> + Send + 'static,
) -> Result<T, GroupCmdError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GroupCmdError::Io {
            context: "conversion task".into(),
            error: std::io::Error::other(e),
        })?
}

async fn prepare_image_layers(
    client: &Client,
    reference: &str,
    range: &Range<usize>,
    scratch: &Path,
    opts: &WriterOptions,
) -> Result<(Vec<PreparedLayer>, ConfigFragment, Platform), GroupCmdError> {
    let r: Reference = reference
        .parse()
        .map_err(reg_err(format!("parsing {reference}")))?;
    let host = weenv_registry::manifest::host_platform();
    let (m, _) = client
        .get_image_manifest(&r, &host.os, &host.architecture, None)
        .await
        .map_err(reg_err(format!("fetching the manifest of {reference}")))?;
    let bad = |reason: String| GroupCmdError::BadImage {
        reference: reference.to_string(),
        reason,
    };
    if range.end > m.layers.len() {
        return Err(bad(format!(
            "has {} layers; --layers {}..{} is out of range",
            m.layers.len(),
            range.start,
            range.end
        )));
    }
    let cfg_bytes = client
        .get_blob(&r, &m.config.digest)
        .await
        .map_err(reg_err(format!("fetching the config of {reference}")))?;
    let (diff_ids, fragment, platform) = source_config(&m.config.media_type, &cfg_bytes, &host)
        .map_err(|reason| bad(format!("config {}: {reason}", m.config.digest)))?;
    if diff_ids.len() != m.layers.len() {
        return Err(bad(format!(
            "{} diff_ids for {} layers",
            diff_ids.len(),
            m.layers.len()
        )));
    }
    let mut out = Vec::new();
    for i in range.clone() {
        let l = &m.layers[i];
        let hint =
            TocHint::from_annotations(&l.annotations).map_err(|source| GroupCmdError::Format {
                what: format!("{reference} layer {i}"),
                error: source,
            })?;
        if hint.is_some() {
            out.push(PreparedLayer {
                desc: Descriptor {
                    annotations: l.annotations.clone(),
                    ..Descriptor::new(&l.media_type, l.digest.clone(), l.size)
                },
                diff_id: diff_ids[i].clone(),
                file: None,
                mount_from: Some(r.clone()),
            });
            continue;
        }
        let src = scratch.join(format!("src-{}", l.digest.hex()));
        let mut f = tokio::fs::File::create(&src)
            .await
            .map_err(io_err(format!("creating {}", src.display())))?;
        client
            .get_blob_stream(&r, &l.digest, &mut f)
            .await
            .map_err(reg_err(format!(
                "downloading layer {i} ({}) of {reference}",
                l.digest
            )))?;
        drop(f);
        let (scratch2, opts2, src2) = (scratch.to_path_buf(), opts.clone(), src.clone());
        let (path, s) = blocking(move || convert_tar(&src2, &scratch2, &opts2)).await?;
        let _ = std::fs::remove_file(&src);
        if s.diff_id != diff_ids[i] {
            return Err(bad(format!(
                "layer {i}: uncompressed digest {} does not match the config's diff_id {}",
                s.diff_id, diff_ids[i]
            )));
        }
        out.push(prepared_from_file(path, &s));
    }
    Ok((out, fragment, platform))
}

/// Build, convert and publish a group under `target`.
pub async fn create_group(
    client: &Client,
    source: &GroupSource,
    spec: &GroupSpec,
    target: &Reference,
    scratch: &Path,
    opts: &WriterOptions,
) -> Result<GroupReport, GroupCmdError> {
    let (layers, inherited, src_platform) = match source {
        GroupSource::Dir(dir) => {
            let (dir, scratch, opts) = (dir.clone(), scratch.to_path_buf(), opts.clone());
            let clamp = spec.mtime_clamp;
            let l = blocking(move || {
                let tarpath = scratch_file(&scratch, "group-dir-", ".tar")?;
                let f = File::create(&tarpath)
                    .map_err(io_err(format!("creating {}", tarpath.display())))?;
                tar_dir(&dir, BufWriter::new(f), clamp)?;
                let (p, s) = convert_tar(&tarpath, &scratch, &opts)?;
                let _ = std::fs::remove_file(&tarpath);
                Ok(prepared_from_file(p, &s))
            })
            .await?;
            (vec![l], ConfigFragment::default(), None)
        }
        GroupSource::Tar(t) => {
            let (t, scratch, opts) = (t.clone(), scratch.to_path_buf(), opts.clone());
            let l = blocking(move || {
                let (p, s) = convert_tar(&t, &scratch, &opts)?;
                Ok(prepared_from_file(p, &s))
            })
            .await?;
            (vec![l], ConfigFragment::default(), None)
        }
        GroupSource::Image { reference, layers } => {
            let (l, f, p) = prepare_image_layers(client, reference, layers, scratch, opts).await?;
            (l, f, Some(p))
        }
    };
    let fragment = merge_fragment(inherited, &spec.fragment);
    let config = GroupConfig {
        version: GROUP_CONFIG_VERSION,
        kind: spec.kind.clone(),
        name: spec.name.clone(),
        platform: spec
            .platform
            .clone()
            .or(src_platform)
            .unwrap_or_else(weenv_registry::manifest::host_platform),
        config: fragment,
        diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
    };
    let built = build_group(config, layers.iter().map(|l| l.desc.clone()).collect())
        .map_err(|e| GroupCmdError::Invalid(e.to_string()))?;
    publish_group(client, built, &layers, target).await
}

async fn publish_group(
    client: &Client,
    built: BuiltGroup,
    layers: &[PreparedLayer],
    target: &Reference,
) -> Result<GroupReport, GroupCmdError> {
    let mut report = GroupReport {
        built,
        layers: Vec::new(),
        bytes_uploaded: 0,
    };
    for l in layers {
        let d = &l.desc.digest;
        let ctx = format!("pushing layer {d} to {target}");
        let outcome = match (&l.file, &l.mount_from) {
            (Some(path), _) => {
                let f = tokio::fs::File::open(path)
                    .await
                    .map_err(io_err(ctx.clone()))?;
                let o = client
                    .push_blob_chunked(target, d, f, UPLOAD_CHUNK)
                    .await
                    .map_err(reg_err(ctx))?;
                let _ = std::fs::remove_file(path);
                o
            }
            (None, Some(src)) => {
                let from = (src.registry() == target.registry()
                    && src.repository() != target.repository())
                .then(|| src.repository());
                let exists = client
                    .head_blob(target, d)
                    .await
                    .map_err(reg_err(ctx.clone()))?
                    .is_some();
                let mounted = match from {
                    Some(from) if !exists => client
                        .mount_blob(target, from, d)
                        .await
                        .map_err(reg_err(ctx.clone()))?,
                    _ => false,
                };
                if exists {
                    BlobPush::AlreadyExists
                } else if mounted {
                    BlobPush::Mounted
                } else {
                    let data = client
                        .get_blob(src, d)
                        .await
                        .map_err(reg_err(ctx.clone()))?;
                    client
                        .push_blob(target, d, data)
                        .await
                        .map_err(reg_err(ctx))?
                }
            }
            (None, None) => return Err(GroupCmdError::Invalid(format!("layer {d} has no source"))),
        };
        if outcome == BlobPush::Uploaded {
            report.bytes_uploaded += l.desc.size;
        }
        report.layers.push((d.clone(), l.desc.size, outcome));
    }
    let b = &report.built;
    let ctx = format!("pushing group config to {target}");
    if client
        .push_blob(
            target,
            &b.manifest.config.digest,
            Bytes::from(b.config_json.clone()),
        )
        .await
        .map_err(reg_err(ctx))?
        == BlobPush::Uploaded
    {
        report.bytes_uploaded += b.config_json.len() as u64;
    }
    client
        .push_manifest(
            target,
            Bytes::from(b.manifest_json.clone()),
            MEDIA_TYPE_OCI_MANIFEST,
        )
        .await
        .map_err(reg_err(format!("pushing group manifest to {target}")))?;
    report.bytes_uploaded += b.manifest_json.len() as u64;
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn layer_ranges() {
        assert_eq!(parse_layer_range("0..3").unwrap(), 0..3);
        assert_eq!(parse_layer_range("..2").unwrap(), 0..2);
        assert_eq!(parse_layer_range("4").unwrap(), 4..5);
        assert!(parse_layer_range("3..3").is_err());
        assert!(parse_layer_range("x").is_err());
    }

    #[test]
    fn dir_tar_is_deterministic_and_converts() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("b/c")).unwrap();
        std::fs::write(d.path().join("b/c/f.py"), "print(1)\n").unwrap();
        std::fs::write(d.path().join("a.txt"), "a\n").unwrap();
        std::os::unix::fs::symlink("a.txt", d.path().join("z-link")).unwrap();
        let mut t1 = Vec::new();
        tar_dir(d.path(), &mut t1, None).unwrap();
        let mut t2 = Vec::new();
        tar_dir(d.path(), &mut t2, None).unwrap();
        assert_eq!(t1, t2);
        // clamped mtimes: touching a file changes nothing
        let mut c1 = Vec::new();
        tar_dir(d.path(), &mut c1, Some(1000)).unwrap();
        std::fs::write(d.path().join("a.txt"), "a\n").unwrap();
        let mut c2 = Vec::new();
        tar_dir(d.path(), &mut c2, Some(1000)).unwrap();
        assert_eq!(c1, c2);
        let mut ar = tar::Archive::new(&t1[..]);
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["a.txt", "b", "b/c", "b/c/f.py", "z-link"]);
        let s = tempfile::tempdir().unwrap();
        let tp = s.path().join("x.tar");
        std::fs::write(&tp, &t1).unwrap();
        let (p, sum) = convert_tar(&tp, s.path(), &WriterOptions::default()).unwrap();
        assert_eq!(sum.diff_id, Digest::sha256(&t1));
        assert!(std::fs::metadata(p).unwrap().len() > 0);
    }
}
