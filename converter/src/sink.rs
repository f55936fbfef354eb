//! Writing images: [`Sink`] puts blobs and manifests into a registry repository (skipping
//! blobs the registry has, mounting them across repositories of the same registry, uploading
//! small blobs in one PUT and large ones in chunks streamed from local files) or into an OCI
//! layout directory (blobs moved or copied in, `index.json` updated under the tag, replacing
//! an earlier image of that tag).

use crate::location::ImageLocation;
use crate::source::{layout_blob_path, read_layout_index, LocalBlob, REF_NAME};
use crate::ConvertError;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use weenv_format::Digest;
use weenv_registry::{BlobPush, Client, Descriptor, ImageIndex, Reference};

/// Tag written to an OCI layout destination given without one.
pub const DEFAULT_LAYOUT_TAG: &str = "latest";

/// How a blob got to the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// The destination had it.
    Existing,
    /// Mounted from the source repository (same registry).
    Mounted,
    /// Bytes were sent / written.
    Written,
}

impl From<BlobPush> for Put {
    fn from(p: BlobPush) -> Put {
        match p {
            BlobPush::AlreadyExists => Put::Existing,
            BlobPush::Mounted => Put::Mounted,
            BlobPush::Uploaded => Put::Written,
        }
    }
}

/// An opened image destination.
pub enum Sink {
    Registry {
        client: Client,
        reference: Reference,
        /// Source repository on the same registry, for cross-repository mounts.
        mount_from: Option<String>,
        upload_chunk: usize,
    },
    Layout {
        dir: PathBuf,
        tag: String,
    },
}

impl Sink {
    /// Open `loc` for writing. `source_repo` is (registry, repository) of a registry source.
    pub fn open(
        loc: &ImageLocation,
        client: &Client,
        source_repo: Option<(&str, &str)>,
        upload_chunk: usize,
    ) -> Result<Sink, ConvertError> {
        match loc {
            ImageLocation::Registry(r) => Ok(Sink::Registry {
                client: client.clone(),
                reference: r.clone(),
                mount_from: source_repo
                    .filter(|(reg, repo)| *reg == r.registry() && *repo != r.repository())
                    .map(|(_, repo)| repo.to_string()),
                upload_chunk,
            }),
            ImageLocation::Layout { dir, tag } => {
                let blobs = dir.join("blobs/sha256");
                std::fs::create_dir_all(&blobs)
                    .map_err(|e| ConvertError::io(format!("creating {}", blobs.display()), e))?;
                let marker = dir.join("oci-layout");
                if !marker.exists() {
                    std::fs::write(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)
                        .map_err(|e| ConvertError::io(format!("writing {}", marker.display()), e))?;
                }
                if !dir.join("index.json").exists() {
                    write_index(dir, &empty_index())?;
                }
                Ok(Sink::Layout {
                    dir: dir.clone(),
                    tag: tag.clone().unwrap_or_else(|| DEFAULT_LAYOUT_TAG.to_string()),
                })
            }
            ImageLocation::Archive { .. } => Err(ConvertError::BadOption {
                field: "DST",
                reason: "writing docker-archive tarballs is not supported; use oci:DIR[:tag] or a registry reference".into(),
            }),
        }
    }

    /// A name for messages.
    pub fn describe(&self) -> String {
        match self {
            Sink::Registry { reference, .. } => reference.to_string(),
            Sink::Layout { dir, tag } => format!("oci:{}:{tag}", dir.display()),
        }
    }

    /// Scratch space near the destination (an OCI layout's own directory, so finished layers
    /// are renamed into place), or `None` for the system temp dir.
    pub fn scratch_parent(&self) -> Option<&Path> {
        match self {
            Sink::Layout { dir, .. } => Some(dir.as_path()),
            Sink::Registry { .. } => None,
        }
    }

    /// Put a small in-memory blob (a config).
    pub async fn put_bytes(&self, d: &Digest, bytes: Bytes) -> Result<Put, ConvertError> {
        match self {
            Sink::Registry {
                client,
                reference,
                mount_from,
                ..
            } => Ok(client
                .push_blob_or_mount(reference, mount_from.as_deref(), d, bytes)
                .await?
                .into()),
            Sink::Layout { dir, .. } => {
                let path = layout_blob_path(dir, d);
                if path.exists() {
                    return Ok(Put::Existing);
                }
                write_atomic(&path, &bytes)?;
                Ok(Put::Written)
            }
        }
    }

    /// Put a blob that exists as a local byte range. A temporary blob may be moved.
    pub async fn put_local(&self, d: &Digest, blob: &LocalBlob) -> Result<Put, ConvertError> {
        match self.has_or_mount(d, blob.len).await? {
            Some(p) => Ok(p),
            None => self.upload_local(d, blob).await,
        }
    }

    /// `Some` when the destination has blob `d` (`size` bytes) already, or just got it by a
    /// cross-repository mount from the source repository (registry); `None` when its bytes
    /// must be sent ([`Sink::upload_local`]).
    pub async fn has_or_mount(&self, d: &Digest, size: u64) -> Result<Option<Put>, ConvertError> {
        match self {
            Sink::Registry {
                client,
                reference,
                mount_from,
                ..
            } => {
                if client.head_blob(reference, d).await?.is_some() {
                    return Ok(Some(Put::Existing));
                }
                if let Some(from) = mount_from {
                    if client.mount_blob(reference, from, d).await? {
                        return Ok(Some(Put::Mounted));
                    }
                }
                Ok(None)
            }
            Sink::Layout { dir, .. } => Ok(std::fs::metadata(layout_blob_path(dir, d))
                .ok()
                .filter(|m| m.len() == size)
                .map(|_| Put::Existing)),
        }
    }

    /// Send the bytes of a local blob (the caller checked [`Sink::has_or_mount`]): one PUT
    /// for a small blob, chunks for a large one; moved or copied into a layout.
    pub async fn upload_local(&self, d: &Digest, blob: &LocalBlob) -> Result<Put, ConvertError> {
        match self {
            Sink::Registry {
                client,
                reference,
                upload_chunk,
                ..
            } => {
                if blob.len <= *upload_chunk as u64 {
                    // Small blob: one monolithic PUT (POST + PUT) from memory.
                    let mut bytes = Vec::with_capacity(blob.len as usize);
                    blob.open()?.read_to_end(&mut bytes).map_err(|e| {
                        ConvertError::io(format!("reading {}", blob.path.display()), e)
                    })?;
                    return Ok(client.push_blob(reference, d, bytes.into()).await?.into());
                }
                let mut f = tokio::fs::File::open(&blob.path)
                    .await
                    .map_err(|e| ConvertError::io(format!("opening {}", blob.path.display()), e))?;
                f.seek(std::io::SeekFrom::Start(blob.offset))
                    .await
                    .map_err(|e| ConvertError::io("seeking in a local blob", e))?;
                let r = f.take(blob.len);
                Ok(client
                    .push_blob_chunked(reference, d, r, *upload_chunk)
                    .await?
                    .into())
            }
            Sink::Layout { dir, .. } => {
                let path = layout_blob_path(dir, d);
                if blob.temporary && blob.offset == 0 && std::fs::rename(&blob.path, &path).is_ok()
                {
                    return Ok(Put::Written);
                }
                let tmp = partial_path(&path);
                {
                    let mut r = blob.open()?;
                    let mut w = std::fs::File::create(&tmp)
                        .map_err(|e| ConvertError::io(format!("creating {}", tmp.display()), e))?;
                    std::io::copy(&mut r, &mut w)
                        .map_err(|e| ConvertError::io(format!("writing {}", tmp.display()), e))?;
                }
                std::fs::rename(&tmp, &path)
                    .map_err(|e| ConvertError::io(format!("renaming {}", tmp.display()), e))?;
                Ok(Put::Written)
            }
        }
    }

    /// Put a child manifest of an index (by digest, untagged).
    pub async fn put_child_manifest(
        &self,
        bytes: Bytes,
        media_type: &str,
    ) -> Result<Digest, ConvertError> {
        let d = Digest::sha256(&bytes);
        match self {
            Sink::Registry {
                client, reference, ..
            } => Ok(client
                .push_manifest(&reference.with_digest(d), bytes, media_type)
                .await?),
            Sink::Layout { .. } => {
                self.put_bytes(&d, bytes).await?;
                Ok(d)
            }
        }
    }

    /// Put the top-level manifest or index under the destination's tag (a registry reference
    /// with only a digest is pushed by digest).
    pub async fn put_top(&self, bytes: Bytes, media_type: &str) -> Result<Digest, ConvertError> {
        let d = Digest::sha256(&bytes);
        let size = bytes.len() as u64;
        match self {
            Sink::Registry {
                client, reference, ..
            } => Ok(client.push_manifest(reference, bytes, media_type).await?),
            Sink::Layout { dir, tag } => {
                self.put_bytes(&d, bytes).await?;
                let mut index = read_layout_index(dir)?;
                let mut desc = Descriptor::new(media_type, d.clone(), size);
                desc.annotations
                    .insert(REF_NAME.to_string(), tag.to_string());
                set_tag(&mut index, desc, tag);
                write_index(dir, &index)?;
                Ok(d)
            }
        }
    }
}

/// A unique temp name next to `path` (concurrent writers of one blob never share it).
fn partial_path(path: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_extension(format!("partial-{}-{n}", std::process::id()))
}

fn empty_index() -> ImageIndex {
    ImageIndex {
        schema_version: 2,
        media_type: Some(weenv_registry::manifest::OCI_INDEX.to_string()),
        artifact_type: None,
        manifests: Vec::new(),
        subject: None,
        annotations: BTreeMap::new(),
    }
}

/// Replace the entries tagged `tag` with `desc` (appended last). Pure.
pub fn set_tag(index: &mut ImageIndex, desc: Descriptor, tag: &str) {
    index
        .manifests
        .retain(|m| m.annotations.get(REF_NAME).map(String::as_str) != Some(tag));
    index.manifests.push(desc);
}

fn write_index(dir: &Path, index: &ImageIndex) -> Result<(), ConvertError> {
    let bytes = serde_json::to_vec(index).map_err(|e| ConvertError::BadImage {
        location: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    write_atomic(&dir.join("index.json"), &bytes)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ConvertError> {
    let tmp = partial_path(path);
    std::fs::write(&tmp, bytes)
        .map_err(|e| ConvertError::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| ConvertError::io(format!("renaming {}", tmp.display()), e))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn set_tag_replaces_only_that_tag() {
        let mut ix = empty_index();
        let tagged = |t: &str, data: &[u8]| {
            let mut d = Descriptor::new("m", Digest::sha256(data), 1);
            d.annotations.insert(REF_NAME.into(), t.into());
            d
        };
        set_tag(&mut ix, tagged("a", b"1"), "a");
        set_tag(&mut ix, tagged("b", b"2"), "b");
        set_tag(&mut ix, tagged("a", b"3"), "a");
        assert_eq!(ix.manifests.len(), 2);
        assert_eq!(ix.manifests[0].digest, Digest::sha256(b"2"));
        assert_eq!(ix.manifests[1].digest, Digest::sha256(b"3"));
    }
}
