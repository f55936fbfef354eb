//! Writing images: [`Sink`] puts blobs and manifests into a registry repository (skipping
//! blobs the registry has, mounting them across repositories of the same registry, uploading
//! small blobs in one PUT and large ones in chunks streamed from local files) or into an OCI
//! layout directory (staged in scratch and committed by renames when the top manifest is
//! put, `index.json` last: [`crate::stage`]). A registry gets blobs first, then child
//! manifests (by digest), and the tagged manifest or index last: a failed run pushes no tag,
//! and what it did upload is unreferenced (the registry's garbage collection removes it).
//!
//! A sink owns the run's [`Scratch`] directory (inside the layout, or in the system temp dir
//! for a registry), where source blobs are fetched and layers are converted.

use crate::location::ImageLocation;
use crate::scratch::{Scratch, LAYOUT_PREFIX, TEMP_PREFIX};
use crate::source::{LocalBlob, REF_NAME};
use crate::stage::LayoutStage;
use crate::ConvertError;
use bytes::Bytes;
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

/// An opened image destination and the run's scratch directory.
pub struct Sink {
    target: Target,
    scratch: Scratch,
}

enum Target {
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
        stage: LayoutStage,
    },
}

impl Sink {
    /// Open `loc` for writing. `source_repo` is (registry, repository) of a registry source.
    /// Stale scratch directories of killed runs are removed first ([`crate::scratch`]).
    pub fn open(
        loc: &ImageLocation,
        client: &Client,
        source_repo: Option<(&str, &str)>,
        upload_chunk: usize,
    ) -> Result<Sink, ConvertError> {
        match loc {
            ImageLocation::Registry(r) => Ok(Sink {
                target: Target::Registry {
                    client: client.clone(),
                    reference: r.clone(),
                    mount_from: source_repo
                        .filter(|(reg, repo)| *reg == r.registry() && *repo != r.repository())
                        .map(|(_, repo)| repo.to_string()),
                    upload_chunk,
                },
                scratch: Scratch::create(&std::env::temp_dir(), TEMP_PREFIX)?,
            }),
            ImageLocation::Layout { dir, tag } => {
                // The layout's own files appear at commit; the directory hosts the scratch.
                std::fs::create_dir_all(dir)
                    .map_err(|e| ConvertError::io(format!("creating {}", dir.display()), e))?;
                let scratch = Scratch::create(dir, LAYOUT_PREFIX)?;
                Ok(Sink {
                    target: Target::Layout {
                        dir: dir.clone(),
                        tag: tag.clone().unwrap_or_else(|| DEFAULT_LAYOUT_TAG.to_string()),
                        stage: LayoutStage::new(dir, scratch.path()),
                    },
                    scratch,
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
        match &self.target {
            Target::Registry { reference, .. } => reference.to_string(),
            Target::Layout { dir, tag, .. } => format!("oci:{}:{tag}", dir.display()),
        }
    }

    /// The run's scratch directory (same filesystem as a layout destination, so finished
    /// layers are renamed into place).
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Put a small in-memory blob (a config).
    pub async fn put_bytes(&self, d: &Digest, bytes: Bytes) -> Result<Put, ConvertError> {
        match &self.target {
            Target::Registry {
                client,
                reference,
                mount_from,
                ..
            } => Ok(client
                .push_blob_or_mount(reference, mount_from.as_deref(), d, bytes)
                .await?
                .into()),
            Target::Layout { stage, .. } => stage.put_bytes(d, &bytes),
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
        match &self.target {
            Target::Registry {
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
            Target::Layout { stage, .. } => Ok(stage.has(d, size).then_some(Put::Existing)),
        }
    }

    /// Send the bytes of a local blob (the caller checked [`Sink::has_or_mount`]): one PUT
    /// for a small blob, chunks for a large one; staged for a layout.
    pub async fn upload_local(&self, d: &Digest, blob: &LocalBlob) -> Result<Put, ConvertError> {
        match &self.target {
            Target::Registry {
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
            Target::Layout { stage, .. } => stage.put_local(d, blob),
        }
    }

    /// Put a child manifest of an index (by digest, untagged).
    pub async fn put_child_manifest(
        &self,
        bytes: Bytes,
        media_type: &str,
    ) -> Result<Digest, ConvertError> {
        let d = Digest::sha256(&bytes);
        match &self.target {
            Target::Registry {
                client, reference, ..
            } => Ok(client
                .push_manifest(&reference.with_digest(d), bytes, media_type)
                .await?),
            Target::Layout { .. } => {
                self.put_bytes(&d, bytes).await?;
                Ok(d)
            }
        }
    }

    /// Put the top-level manifest or index under the destination's tag (a registry reference
    /// with only a digest is pushed by digest). For a layout this commits the run.
    pub async fn put_top(&self, bytes: Bytes, media_type: &str) -> Result<Digest, ConvertError> {
        let d = Digest::sha256(&bytes);
        let size = bytes.len() as u64;
        match &self.target {
            Target::Registry {
                client, reference, ..
            } => Ok(client.push_manifest(reference, bytes, media_type).await?),
            Target::Layout { tag, stage, .. } => {
                self.put_bytes(&d, bytes).await?;
                let mut desc = Descriptor::new(media_type, d.clone(), size);
                desc.annotations
                    .insert(REF_NAME.to_string(), tag.to_string());
                stage.commit(|index| set_tag(index, desc, tag))?;
                Ok(d)
            }
        }
    }
}

/// Replace the entries tagged `tag` with `desc` (appended last). Pure.
pub fn set_tag(index: &mut ImageIndex, desc: Descriptor, tag: &str) {
    index
        .manifests
        .retain(|m| m.annotations.get(REF_NAME).map(String::as_str) != Some(tag));
    index.manifests.push(desc);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn set_tag_replaces_only_that_tag() {
        let mut ix = crate::stage::empty_index();
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
