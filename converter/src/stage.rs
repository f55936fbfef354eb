//! Atomic writes into an OCI layout destination.
//!
//! Nothing the conversion writes is visible in the layout until the conversion has finished:
//! every blob (layers, configs, manifests) is first written to the run's scratch directory
//! (inside the layout, so the same filesystem), `fsync`ed and checked against its digest;
//! [`LayoutStage::commit`] then renames the staged blobs into `blobs/sha256`, `fsync`s that
//! directory, and replaces `index.json` by rename last. A failure before the commit leaves the
//! layout as it was (the scratch directory is removed, or by the next run if the process was
//! killed: see [`crate::scratch`]). A SIGKILL inside the commit (renames only, no data copy)
//! can leave blobs that no index names; a rerun of the same conversion names them.

use crate::sink::Put;
use crate::source::{layout_blob_path, read_layout_index, LocalBlob};
use crate::ConvertError;
use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use weenv_format::Digest;
use weenv_registry::ImageIndex;

/// The layout marker written when the destination has none.
const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// Blobs written to scratch and not yet committed to a layout.
#[derive(Debug)]
pub struct LayoutStage {
    dir: PathBuf,
    scratch: PathBuf,
    staged: Mutex<BTreeMap<Digest, PathBuf>>,
}

impl LayoutStage {
    /// Stage for the layout `dir`, with files in `scratch` (a directory inside `dir`).
    pub fn new(dir: &Path, scratch: &Path) -> LayoutStage {
        LayoutStage {
            dir: dir.to_path_buf(),
            scratch: scratch.to_path_buf(),
            staged: Mutex::new(BTreeMap::new()),
        }
    }

    /// True when blob `d` of `size` bytes is in the layout or staged.
    pub fn has(&self, d: &Digest, size: u64) -> bool {
        if self.staged.lock().contains_key(d) {
            return true;
        }
        std::fs::metadata(layout_blob_path(&self.dir, d)).is_ok_and(|m| m.len() == size)
    }

    fn staged_path(&self, d: &Digest) -> PathBuf {
        self.scratch.join(format!("staged-{}", d.hex()))
    }

    /// Stage an in-memory blob.
    pub fn put_bytes(&self, d: &Digest, bytes: &[u8]) -> Result<Put, ConvertError> {
        if self.has(d, bytes.len() as u64) {
            return Ok(Put::Existing);
        }
        if Digest::sha256(bytes) != *d {
            return Err(corrupt(d, "in-memory bytes"));
        }
        let tmp = self.unique_tmp(d);
        write_synced(&tmp, bytes)?;
        self.finish(d, &tmp)
    }

    /// A file name no other writer in this run uses (two layers may stage one blob at once).
    fn unique_tmp(&self, d: &Digest) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        self.scratch.join(format!("writing-{n}-{}", d.hex()))
    }

    /// Move a complete, synced, verified file to its staged name and record it.
    fn finish(&self, d: &Digest, tmp: &Path) -> Result<Put, ConvertError> {
        let path = self.staged_path(d);
        std::fs::rename(tmp, &path)
            .map_err(|e| ConvertError::io(format!("renaming {}", tmp.display()), e))?;
        self.staged.lock().insert(d.clone(), path);
        Ok(Put::Written)
    }

    /// Stage a local blob. A temporary file (in scratch) is moved, its digest is the one the
    /// converter computed while writing it; any other range is copied and hashed.
    pub fn put_local(&self, d: &Digest, blob: &LocalBlob) -> Result<Put, ConvertError> {
        if self.has(d, blob.len) {
            return Ok(Put::Existing);
        }
        let tmp = self.unique_tmp(d);
        if blob.temporary && blob.offset == 0 && std::fs::rename(&blob.path, &tmp).is_ok() {
            sync_file(&tmp)?;
        } else {
            let mut r = blob.open()?;
            let mut w = std::fs::File::create(&tmp)
                .map_err(|e| ConvertError::io(format!("creating {}", tmp.display()), e))?;
            let mut h = HashingWriter {
                inner: &mut w,
                hash: Sha256::new(),
            };
            std::io::copy(&mut r, &mut h)
                .map_err(|e| ConvertError::io(format!("writing {}", tmp.display()), e))?;
            let actual = Digest::from_sha256_bytes(&h.hash.finalize().into());
            if actual != *d {
                let _ = std::fs::remove_file(&tmp);
                return Err(corrupt(
                    d,
                    &format!("{} hashes to {actual}", blob.path.display()),
                ));
            }
            w.sync_all()
                .map_err(|e| ConvertError::io(format!("syncing {}", tmp.display()), e))?;
        }
        self.finish(d, &tmp)
    }

    /// Make the staged blobs part of the layout, then update `index.json` with `update`.
    pub fn commit(&self, update: impl FnOnce(&mut ImageIndex)) -> Result<(), ConvertError> {
        let staged = std::mem::take(&mut *self.staged.lock());
        let blobs = self.dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs)
            .map_err(|e| ConvertError::io(format!("creating {}", blobs.display()), e))?;
        for (d, tmp) in &staged {
            let path = layout_blob_path(&self.dir, d);
            std::fs::rename(tmp, &path)
                .map_err(|e| ConvertError::io(format!("renaming {}", tmp.display()), e))?;
        }
        sync_dir(&blobs)?;
        let marker = self.dir.join("oci-layout");
        if !marker.exists() {
            self.replace(&marker, OCI_LAYOUT)?;
        }
        let mut index = if self.dir.join("index.json").exists() {
            read_layout_index(&self.dir)?
        } else {
            empty_index()
        };
        update(&mut index);
        let bytes = serde_json::to_vec(&index).map_err(|e| ConvertError::BadImage {
            location: self.dir.display().to_string(),
            reason: e.to_string(),
        })?;
        self.replace(&self.dir.join("index.json"), &bytes)?;
        sync_dir(&self.dir)
    }

    /// Replace `path` (in the layout) by a file with `bytes`, written in scratch first.
    fn replace(&self, path: &Path, bytes: &[u8]) -> Result<(), ConvertError> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let tmp = self
            .scratch
            .join(format!("new-{}", name.unwrap_or_default()));
        write_synced(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
            .map_err(|e| ConvertError::io(format!("renaming {}", tmp.display()), e))
    }
}

/// An empty OCI index.
pub fn empty_index() -> ImageIndex {
    ImageIndex {
        schema_version: 2,
        media_type: Some(weenv_registry::manifest::OCI_INDEX.to_string()),
        artifact_type: None,
        manifests: Vec::new(),
        subject: None,
        annotations: BTreeMap::new(),
    }
}

fn corrupt(d: &Digest, what: &str) -> ConvertError {
    ConvertError::CorruptBlob {
        digest: d.to_string(),
        reason: format!("{what} do not match the digest; nothing was written"),
    }
}

struct HashingWriter<'a> {
    inner: &'a mut std::fs::File,
    hash: Sha256,
}

impl std::io::Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), ConvertError> {
    let mut f = std::fs::File::create(path)
        .map_err(|e| ConvertError::io(format!("creating {}", path.display()), e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| ConvertError::io(format!("writing {}", path.display()), e))
}

fn sync_file(path: &Path) -> Result<(), ConvertError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| ConvertError::io(format!("syncing {}", path.display()), e))
}

/// `fsync` a directory, so the renames into it survive a crash.
fn sync_dir(dir: &Path) -> Result<(), ConvertError> {
    sync_file(dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        v.sort();
        v
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }

    #[test]
    fn nothing_is_visible_before_commit_and_bad_bytes_are_refused() {
        let layout = tempfile::tempdir().unwrap();
        let scratch = layout.path().join(".weenv-convert-x");
        std::fs::create_dir(&scratch).unwrap();
        let stage = LayoutStage::new(layout.path(), &scratch);
        let a = Digest::sha256(b"a");
        assert_eq!(stage.put_bytes(&a, b"a").unwrap(), Put::Written);
        assert_eq!(stage.put_bytes(&a, b"a").unwrap(), Put::Existing);
        assert!(stage.put_bytes(&Digest::sha256(b"b"), b"not b").is_err());
        let src = layout.path().join("src");
        std::fs::write(&src, b"xxbyy").unwrap();
        let range = |len| LocalBlob {
            path: src.clone(),
            offset: 2,
            len,
            temporary: false,
        };
        let b = Digest::sha256(b"b");
        assert!(stage.put_local(&b, &range(2)).is_err(), "wrong bytes");
        assert_eq!(stage.put_local(&b, &range(1)).unwrap(), Put::Written);
        assert!(stage.has(&b, 1));
        assert!(!layout.path().join("blobs").exists());
        assert!(!layout.path().join("index.json").exists());

        stage.commit(|_| {}).unwrap();
        let mut want = vec![format!("sha256/{}", a.hex()), format!("sha256/{}", b.hex())];
        want.sort();
        assert_eq!(files(&layout.path().join("blobs")), want);
        assert!(layout.path().join("index.json").exists());
        assert!(layout.path().join("oci-layout").exists());
        assert_eq!(files(&scratch), Vec::<String>::new(), "scratch emptied");
    }
}
