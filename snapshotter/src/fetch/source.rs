//! Blob sources: random read access to one layer blob. The network sits behind
//! [`BlobSource`]; the fetch path only sees ranges and bytes.

use super::FetchError;
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Random read access to one immutable layer blob.
#[async_trait]
pub trait BlobSource: Send + Sync {
    /// Exactly `len` bytes at `offset` (an error if the blob is shorter).
    async fn read_range(&self, offset: u64, len: u64) -> Result<Bytes, FetchError>;
    /// [`BlobSource::read_range`], bypassing any cache the source has on the way (used once
    /// after bytes failed verification). Default: `read_range`.
    async fn read_range_fresh(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        self.read_range(offset, len).await
    }
    /// Blob size in bytes.
    fn size(&self) -> u64;
    /// Human-readable name for errors and logs (e.g. `registry/repo@sha256:..`).
    fn name(&self) -> String {
        "blob".to_string()
    }
}

/// A layer blob in a local file.
#[derive(Debug)]
pub struct FileBlobSource {
    path: PathBuf,
    file: Arc<File>,
    size: u64,
}

impl FileBlobSource {
    /// Opens `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        Ok(FileBlobSource {
            path: path.to_path_buf(),
            file: Arc::new(file),
            size,
        })
    }
}

#[async_trait]
impl BlobSource for FileBlobSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        let file = self.file.clone();
        let name = self.name();
        let err = |reason: String| FetchError::Source {
            source_name: name.clone(),
            offset,
            len,
            reason,
        };
        let n = usize::try_from(len).map_err(|e| err(e.to_string()))?;
        let res = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, offset).map(|()| buf)
        })
        .await;
        match res {
            Ok(Ok(buf)) => Ok(Bytes::from(buf)),
            Ok(Err(e)) => Err(err(e.to_string())),
            Err(e) => Err(err(e.to_string())),
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// A layer blob in an OCI registry, read with ranged GETs through `weenv_registry`
/// (auth, mirrors and retries are the client's business). Bytes are not verified here:
/// the fetch path verifies every frame against the TOC.
pub struct RegistryBlobSource {
    client: weenv_registry::Client,
    reference: weenv_registry::Reference,
    digest: weenv_format::Digest,
    size: u64,
}

impl RegistryBlobSource {
    /// Blob `digest` (of `size` bytes, from the manifest descriptor) in `reference`'s
    /// repository.
    pub fn new(
        client: weenv_registry::Client,
        reference: weenv_registry::Reference,
        digest: weenv_format::Digest,
        size: u64,
    ) -> Self {
        RegistryBlobSource {
            client,
            reference,
            digest,
            size,
        }
    }

    fn error(&self, offset: u64, len: u64, e: weenv_registry::RegistryError) -> FetchError {
        FetchError::Source {
            source_name: self.name(),
            offset,
            len,
            reason: e.to_string(),
        }
    }
}

#[async_trait]
impl BlobSource for RegistryBlobSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        self.client
            .get_blob_range(&self.reference, &self.digest, offset, len)
            .await
            .map_err(|e| self.error(offset, len, e))
    }

    /// With `Cache-Control: no-cache`: HTTP caches on the way revalidate.
    async fn read_range_fresh(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        self.client
            .get_blob_range_no_cache(&self.reference, &self.digest, offset, len)
            .await
            .map_err(|e| self.error(offset, len, e))
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        format!("{}@{}", self.reference, self.digest)
    }
}

/// Wraps a source and records every range request (tests, benchmarks, accounting).
pub struct CountingSource<S> {
    inner: S,
    log: Mutex<Vec<(u64, u64)>>,
}

impl<S> CountingSource<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        CountingSource {
            inner,
            log: Mutex::new(Vec::new()),
        }
    }

    /// (offset, len) of every request so far, in order.
    pub fn requests(&self) -> Vec<(u64, u64)> {
        self.log.lock().clone()
    }

    /// Total bytes requested so far.
    pub fn bytes(&self) -> u64 {
        self.log.lock().iter().map(|(_, l)| l).sum()
    }

    /// Forgets the recorded requests.
    pub fn reset(&self) {
        self.log.lock().clear();
    }
}

#[async_trait]
impl<S: BlobSource> BlobSource for CountingSource<S> {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        self.log.lock().push((offset, len));
        self.inner.read_range(offset, len).await
    }

    async fn read_range_fresh(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        self.log.lock().push((offset, len));
        self.inner.read_range_fresh(offset, len).await
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_source_reads_ranges() {
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), b"0123456789").unwrap();
        let s = CountingSource::new(FileBlobSource::open(t.path()).unwrap());
        assert_eq!(s.size(), 10);
        assert_eq!(&s.read_range(2, 3).await.unwrap()[..], b"234");
        assert!(s.read_range(8, 3).await.is_err());
        assert_eq!(s.requests(), vec![(2, 3), (8, 3)]);
    }
}
