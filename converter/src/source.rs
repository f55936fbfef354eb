//! Reading images: [`Source`] opens a registry reference, an OCI layout or a docker-archive
//! tarball and hands out its top-level manifest/index, child manifests, small blobs (configs)
//! in memory and layer blobs as [`LocalBlob`]s: a byte range of a local file (the layout's blob
//! file, the archive member in place, or a registry blob streamed to the scratch dir).

use crate::archive::{read_member, DockerArchive, Member};
use crate::location::ImageLocation;
use crate::ConvertError;
use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use weenv_format::Digest;
use weenv_registry::manifest::{OCI_CONFIG, OCI_INDEX, OCI_MANIFEST};
use weenv_registry::{Client, Descriptor, ImageIndex, ImageManifest, ManifestBlob, Reference};

/// Annotation naming an image inside an OCI layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Largest config / manifest blob read into memory.
pub const MAX_SMALL_BLOB: u64 = 16 << 20;

/// A blob available locally: `len` bytes at `offset` of `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalBlob {
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
    /// The file is a scratch copy owned by the conversion (delete when done).
    pub temporary: bool,
}

impl LocalBlob {
    /// A reader over exactly this blob's bytes.
    pub fn open(&self) -> Result<std::io::Take<File>, ConvertError> {
        let mut f = File::open(&self.path)
            .map_err(|e| ConvertError::io(format!("opening {}", self.path.display()), e))?;
        f.seek(SeekFrom::Start(self.offset))
            .map_err(|e| ConvertError::io(format!("seeking in {}", self.path.display()), e))?;
        Ok(f.take(self.len))
    }

    /// Random access over this blob (see [`FileSlice`]).
    pub fn range_reader(&self) -> Result<FileSlice, ConvertError> {
        let file = File::open(&self.path)
            .map_err(|e| ConvertError::io(format!("opening {}", self.path.display()), e))?;
        Ok(FileSlice {
            file,
            offset: self.offset,
            len: self.len,
        })
    }

    /// Remove the scratch copy, if this is one.
    pub fn discard(&self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `RangeRead` over a byte range of a file.
pub struct FileSlice {
    file: File,
    offset: u64,
    len: u64,
}

impl weenv_format::RangeRead for FileSlice {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.len)
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "range past end of blob",
                ))
            }
        }
        let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
        self.file.read_exact_at(&mut buf, self.offset + offset)?;
        Ok(buf)
    }
}

/// sha256 of a reader, streamed.
pub fn sha256_reader(mut r: impl Read) -> std::io::Result<(Digest, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n_total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        n_total += n as u64;
        h.update(&buf[..n]);
    }
    Ok((Digest::from_sha256_bytes(&h.finalize().into()), n_total))
}

/// An opened image source.
pub enum Source {
    Registry {
        client: Client,
        reference: Reference,
    },
    Layout {
        dir: PathBuf,
        tag: Option<String>,
    },
    Archive {
        path: PathBuf,
        /// Synthesized OCI manifest of the archive's first image.
        manifest: ManifestBlob,
        /// Blob digest -> member.
        blobs: BTreeMap<Digest, Member>,
    },
}

impl Source {
    /// Open `loc` for reading. Docker archives are indexed and their layers hashed now.
    pub fn open(loc: &ImageLocation, client: &Client) -> Result<Source, ConvertError> {
        Ok(match loc {
            ImageLocation::Registry(r) => Source::Registry {
                client: client.clone(),
                reference: r.clone(),
            },
            ImageLocation::Layout { dir, tag } => {
                if !dir.join("index.json").is_file() {
                    return Err(ConvertError::BadImage {
                        location: loc.to_string(),
                        reason: "no index.json: not an OCI image layout".into(),
                    });
                }
                Source::Layout {
                    dir: dir.clone(),
                    tag: tag.clone(),
                }
            }
            ImageLocation::Archive { path } => open_archive(path)?,
        })
    }

    /// [`Source::open`] on a blocking thread (a docker archive is hashed while opening).
    pub async fn open_async(loc: &ImageLocation, client: &Client) -> Result<Source, ConvertError> {
        let (client, loc) = (client.clone(), loc.clone());
        tokio::task::spawn_blocking(move || Source::open(&loc, &client))
            .await
            .map_err(|e| ConvertError::Task(e.to_string()))?
    }

    /// The registry and repository of a registry source (for cross-repository mounts).
    pub fn registry_repo(&self) -> Option<(&str, &str)> {
        match self {
            Source::Registry { reference, .. } => {
                Some((reference.registry(), reference.repository()))
            }
            _ => None,
        }
    }

    /// A name for messages.
    pub fn describe(&self) -> String {
        match self {
            Source::Registry { reference, .. } => reference.to_string(),
            Source::Layout { dir, tag } => ImageLocation::Layout {
                dir: dir.clone(),
                tag: tag.clone(),
            }
            .to_string(),
            Source::Archive { path, .. } => format!("docker-archive:{}", path.display()),
        }
    }

    /// The top-level manifest or index.
    pub async fn root(&self) -> Result<ManifestBlob, ConvertError> {
        match self {
            Source::Registry { client, reference } => Ok(client.get_manifest(reference).await?),
            Source::Layout { dir, tag } => {
                let d = layout_lookup(dir, tag.as_deref())?;
                let bytes = read_layout_blob(dir, &d.digest, MAX_SMALL_BLOB)?;
                Ok(ManifestBlob {
                    digest: d.digest,
                    media_type: d.media_type,
                    bytes: bytes.into(),
                })
            }
            Source::Archive { manifest, .. } => Ok(manifest.clone()),
        }
    }

    /// A manifest named by an index entry.
    pub async fn manifest(&self, d: &Descriptor) -> Result<ManifestBlob, ConvertError> {
        match self {
            Source::Registry { client, reference } => Ok(client
                .get_manifest(&reference.with_digest(d.digest.clone()))
                .await?),
            _ => Ok(ManifestBlob {
                digest: d.digest.clone(),
                media_type: d.media_type.clone(),
                bytes: self.blob_bytes(d).await?,
            }),
        }
    }

    /// A small blob (config, manifest) in memory, digest-checked.
    pub async fn blob_bytes(&self, d: &Descriptor) -> Result<Bytes, ConvertError> {
        if d.size > MAX_SMALL_BLOB {
            return Err(ConvertError::CorruptBlob {
                digest: d.digest.to_string(),
                reason: format!("{} bytes is too large for a config/manifest", d.size),
            });
        }
        let bytes: Bytes = match self {
            Source::Registry { client, reference } => client.get_blob(reference, &d.digest).await?,
            Source::Layout { dir, .. } => read_layout_blob(dir, &d.digest, MAX_SMALL_BLOB)?.into(),
            Source::Archive { path, blobs, .. } => {
                let m = blobs.get(&d.digest).ok_or_else(|| missing_blob(d, path))?;
                read_member(path, *m, MAX_SMALL_BLOB)?.into()
            }
        };
        let actual = Digest::sha256(&bytes);
        if actual != d.digest {
            return Err(ConvertError::CorruptBlob {
                digest: d.digest.to_string(),
                reason: format!("content hashes to {actual}"),
            });
        }
        Ok(bytes)
    }

    /// A layer blob as a local byte range; registry blobs are streamed (digest-verified) into
    /// `scratch`.
    pub async fn blob(&self, d: &Descriptor, scratch: &Path) -> Result<LocalBlob, ConvertError> {
        match self {
            Source::Registry { client, reference } => {
                // Unique per fetch: an image may list the same layer twice (e.g. empty layers).
                static FETCHES: AtomicU64 = AtomicU64::new(0);
                let n = FETCHES.fetch_add(1, Ordering::Relaxed);
                let path = scratch.join(format!("src-{n}-{}", d.digest.hex()));
                let mut f = tokio::fs::File::create(&path)
                    .await
                    .map_err(|e| ConvertError::io(format!("creating {}", path.display()), e))?;
                let n = client.get_blob_stream(reference, &d.digest, &mut f).await;
                let n = match n {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tokio::fs::remove_file(&path).await;
                        return Err(e.into());
                    }
                };
                Ok(LocalBlob {
                    path,
                    offset: 0,
                    len: n,
                    temporary: true,
                })
            }
            Source::Layout { dir, .. } => {
                let path = layout_blob_path(dir, &d.digest);
                let len = std::fs::metadata(&path)
                    .map_err(|_| missing_blob(d, dir))?
                    .len();
                if len != d.size {
                    return Err(ConvertError::CorruptBlob {
                        digest: d.digest.to_string(),
                        reason: format!(
                            "{} is {len} bytes, descriptor says {}",
                            path.display(),
                            d.size
                        ),
                    });
                }
                Ok(LocalBlob {
                    path,
                    offset: 0,
                    len,
                    temporary: false,
                })
            }
            Source::Archive { path, blobs, .. } => {
                let m = blobs.get(&d.digest).ok_or_else(|| missing_blob(d, path))?;
                Ok(LocalBlob {
                    path: path.clone(),
                    offset: m.offset,
                    len: m.size,
                    temporary: false,
                })
            }
        }
    }
}

fn missing_blob(d: &Descriptor, where_: &Path) -> ConvertError {
    ConvertError::CorruptBlob {
        digest: d.digest.to_string(),
        reason: format!("blob missing from {}", where_.display()),
    }
}

/// `DIR/blobs/sha256/<hex>`.
pub fn layout_blob_path(dir: &Path, d: &Digest) -> PathBuf {
    dir.join("blobs/sha256").join(d.hex())
}

fn read_layout_blob(dir: &Path, d: &Digest, limit: u64) -> Result<Vec<u8>, ConvertError> {
    let path = layout_blob_path(dir, d);
    let meta = std::fs::metadata(&path).map_err(|e| ConvertError::CorruptBlob {
        digest: d.to_string(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    if meta.len() > limit {
        return Err(ConvertError::CorruptBlob {
            digest: d.to_string(),
            reason: format!("{} bytes is too large for a manifest or config", meta.len()),
        });
    }
    std::fs::read(&path).map_err(|e| ConvertError::io(format!("reading {}", path.display()), e))
}

/// Read an OCI layout's `index.json`.
pub fn read_layout_index(dir: &Path) -> Result<ImageIndex, ConvertError> {
    let p = dir.join("index.json");
    let bytes =
        std::fs::read(&p).map_err(|e| ConvertError::io(format!("reading {}", p.display()), e))?;
    serde_json::from_slice(&bytes).map_err(|e| ConvertError::BadImage {
        location: format!("oci:{}", dir.display()),
        reason: format!("index.json is not valid: {e}"),
    })
}

/// The `index.json` entry for `tag` (or the only entry when `tag` is `None`).
pub fn layout_lookup(dir: &Path, tag: Option<&str>) -> Result<Descriptor, ConvertError> {
    let index = read_layout_index(dir)?;
    let tags: Vec<&str> = index
        .manifests
        .iter()
        .filter_map(|m| m.annotations.get(REF_NAME).map(String::as_str))
        .collect();
    let found = match tag {
        Some(t) => index
            .manifests
            .iter()
            .find(|m| m.annotations.get(REF_NAME).map(String::as_str) == Some(t)),
        None if index.manifests.len() == 1 => index.manifests.first(),
        None => None,
    };
    found
        .cloned()
        .ok_or_else(|| ConvertError::MissingReference {
            location: format!("oci:{}", dir.display()),
            tag: tag
                .unwrap_or("<none: the layout holds several images, name one>")
                .to_string(),
            available: if tags.is_empty() {
                "none".into()
            } else {
                tags.join(", ")
            },
        })
}

/// Media type of a layer from its first bytes (gzip, zstd or plain tar).
pub fn sniff_layer_media_type(head: &[u8]) -> &'static str {
    if head.starts_with(&[0x1f, 0x8b]) {
        "application/vnd.oci.image.layer.v1.tar+gzip"
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "application/vnd.oci.image.layer.v1.tar+zstd"
    } else {
        "application/vnd.oci.image.layer.v1.tar"
    }
}

fn open_archive(path: &Path) -> Result<Source, ConvertError> {
    let archive = DockerArchive::open(path)?;
    let image = &archive.images[0];
    let bad = |reason: String| ConvertError::BadImage {
        location: format!("docker-archive:{}", path.display()),
        reason,
    };
    let mut blobs = BTreeMap::new();
    let mut describe = |name: &str, media_type: Option<&str>| -> Result<Descriptor, ConvertError> {
        let m = archive.member(name).ok_or_else(|| {
            bad(format!(
                "manifest.json names {name:?}, which is not in the archive"
            ))
        })?;
        let blob = LocalBlob {
            path: path.to_path_buf(),
            offset: m.offset,
            len: m.size,
            temporary: false,
        };
        let mut head = Vec::new();
        blob.open()?
            .take(4)
            .read_to_end(&mut head)
            .map_err(|e| ConvertError::io("reading docker-archive", e))?;
        let (digest, _) = sha256_reader(blob.open()?)
            .map_err(|e| ConvertError::io("hashing docker-archive member", e))?;
        blobs.insert(digest.clone(), m);
        let mt = media_type.unwrap_or_else(|| sniff_layer_media_type(&head));
        Ok(Descriptor::new(mt, digest, m.size))
    };
    let config = describe(&image.config, Some(OCI_CONFIG))?;
    let layers = image
        .layers
        .iter()
        .map(|l| describe(l, None))
        .collect::<Result<Vec<_>, _>>()?;
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.to_string()),
        artifact_type: None,
        config,
        layers,
        subject: None,
        annotations: BTreeMap::new(),
    };
    let bytes = serde_json::to_vec(&manifest).map_err(|e| bad(e.to_string()))?;
    Ok(Source::Archive {
        path: path.to_path_buf(),
        manifest: ManifestBlob {
            digest: Digest::sha256(&bytes),
            media_type: OCI_MANIFEST.to_string(),
            bytes: bytes.into(),
        },
        blobs,
    })
}

/// Is `media_type` an index (OCI or Docker list)?
pub fn is_index_type(media_type: &str) -> bool {
    media_type == OCI_INDEX || weenv_registry::manifest::is_index(media_type)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_compression() {
        assert!(sniff_layer_media_type(&[0x1f, 0x8b, 8, 0]).ends_with("gzip"));
        assert!(sniff_layer_media_type(&[0x28, 0xb5, 0x2f, 0xfd]).ends_with("zstd"));
        assert!(sniff_layer_media_type(b"etc/").ends_with(".tar"));
    }

    #[test]
    fn file_slice_reads_inside_its_range() {
        use weenv_format::RangeRead;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let b = LocalBlob {
            path: p,
            offset: 2,
            len: 5,
            temporary: false,
        };
        let s = b.range_reader().unwrap();
        assert_eq!(s.size().unwrap(), 5);
        assert_eq!(s.read_at(1, 3).unwrap(), b"345");
        assert!(s.read_at(3, 3).is_err());
        let mut all = Vec::new();
        b.open().unwrap().read_to_end(&mut all).unwrap();
        assert_eq!(all, b"23456");
    }

    #[test]
    fn layout_lookup_names_available_tags() {
        let dir = tempfile::tempdir().unwrap();
        let d = Digest::sha256(b"x");
        let idx = format!(
            r#"{{"schemaVersion":2,"manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"{d}","size":1,"annotations":{{"{REF_NAME}":"a"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{d}","size":1,"annotations":{{"{REF_NAME}":"b"}}}}]}}"#
        );
        std::fs::write(dir.path().join("index.json"), idx).unwrap();
        assert_eq!(layout_lookup(dir.path(), Some("b")).unwrap().digest, d);
        match layout_lookup(dir.path(), Some("c")) {
            Err(ConvertError::MissingReference { available, .. }) => assert_eq!(available, "a, b"),
            other => panic!("{other:?}"),
        }
        assert!(layout_lookup(dir.path(), None).is_err());
    }
}
