//! Blob sources: random read access to one layer blob through [`weenv_registry::RangeSource`]
//! (named [`RangeSource`] in the fetch path): the network sits behind it, and its provided
//! `read` owns the one retry budget per read. Here: [`FileBlobSource`] (a local file: tests,
//! benches) and [`CountingSource`] (records every attempt). Registry blobs are
//! [`weenv_registry::RegistryRangeSource`].

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weenv_registry::{Attempt, ByteRange, ErrorKind, RangeSource, RetryPolicy, SourceError};

/// A layer blob in a local file. Read errors are terminal (a local file does not heal).
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
impl RangeSource for FileBlobSource {
    async fn try_read(&self, range: ByteRange, _: Attempt) -> Result<Bytes, SourceError> {
        let file = self.file.clone();
        let n = usize::try_from(range.len).map_err(|e| SourceError::new(ErrorKind::Terminal, e))?;
        let res = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, range.offset).map(|()| buf)
        })
        .await;
        match res {
            Ok(Ok(buf)) => Ok(Bytes::from(buf)),
            Ok(Err(e)) => Err(SourceError::new(ErrorKind::Terminal, e)),
            Err(e) => Err(SourceError::new(ErrorKind::Terminal, e)),
        }
    }

    fn size(&self) -> Option<u64> {
        Some(self.size)
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// Wraps a source and records every attempt's range (tests, benchmarks, accounting).
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
impl<S: RangeSource> RangeSource for CountingSource<S> {
    async fn try_read(&self, range: ByteRange, attempt: Attempt) -> Result<Bytes, SourceError> {
        self.log.lock().push((range.offset, range.len));
        self.inner.try_read(range, attempt).await
    }

    fn size(&self) -> Option<u64> {
        self.inner.size()
    }

    async fn resolve_size(&self) -> Result<u64, SourceError> {
        self.inner.resolve_size().await
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn policy(&self) -> RetryPolicy {
        self.inner.policy()
    }

    fn locator(&self) -> Option<weenv_registry::BlobLocator> {
        self.inner.locator()
    }

    async fn refresh_auth(&self) -> bool {
        self.inner.refresh_auth().await
    }

    fn note_retry(&self, kind: ErrorKind) {
        self.inner.note_retry(kind)
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
        assert_eq!(s.size(), Some(10));
        assert_eq!(&s.read(ByteRange::new(2, 3)).await.unwrap()[..], b"234");
        let e = s.read(ByteRange::new(8, 3)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Terminal);
        assert_eq!(
            s.requests(),
            vec![(2, 3), (8, 3)],
            "a local error is not retried"
        );
    }
}
