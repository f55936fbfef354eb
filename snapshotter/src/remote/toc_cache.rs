//! Verified TOC tails on disk, by layer digest: `<dir>/<hex>.toc` holds the TOC skippable frame
//! followed by the footer, exactly as read from the blob. Loading re-verifies them
//! (footer digest over the TOC bytes, TOC validation), so a damaged file is detected and the
//! TOC refetched; writes are atomic (temp file + rename).

use std::path::{Path, PathBuf};
use weenv_format::reader::parse_tail_with_limits;
use weenv_format::{Digest, FormatError, Toc, TocLimits};

/// The cache directory and the limits every TOC is decoded within.
#[derive(Clone, Debug)]
pub struct TocCache {
    dir: PathBuf,
    limits: TocLimits,
}

/// Errors of the TOC cache.
#[derive(Debug, thiserror::Error)]
pub enum TocCacheError {
    #[error("TOC cache file {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cached TOC {path} is invalid: {error}")]
    Invalid { path: PathBuf, error: FormatError },
    #[error("layer {digest}: its TOC {what} is {value}, over the limit of {limit}; the layer is refused (raise `limits.{key}` in the daemon config to accept it)")]
    Limit {
        digest: Digest,
        what: &'static str,
        value: u64,
        limit: u64,
        key: &'static str,
    },
}

impl TocCacheError {
    fn of(digest: &Digest, path: PathBuf, source: FormatError) -> Self {
        match source {
            FormatError::TocLimit { what, value, limit } => TocCacheError::Limit {
                digest: digest.clone(),
                what,
                value,
                limit,
                key: if what.contains("entr") {
                    "max_toc_entries"
                } else {
                    "max_toc_bytes"
                },
            },
            source => TocCacheError::Invalid {
                path,
                error: source,
            },
        }
    }
}

impl TocCache {
    /// A cache in `dir` decoding TOCs within `limits`.
    pub fn new(dir: &Path, limits: TocLimits) -> Self {
        Self {
            dir: dir.to_path_buf(),
            limits,
        }
    }

    /// Path of the cached tail of `digest`.
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.toc", digest.hex()))
    }

    /// Verify `tail` (TOC frame + footer of a blob of `blob_size` bytes; the TOC's digest
    /// must be `expected` when the manifest's hint names it) and store it. Returns the TOC
    /// digest and the TOC.
    pub fn put(
        &self,
        digest: &Digest,
        tail: &[u8],
        blob_size: u64,
        expected: Option<&Digest>,
    ) -> Result<(Digest, Toc), TocCacheError> {
        let path = self.path(digest);
        let (footer, toc) = parse_tail_with_limits(tail, blob_size, expected, &self.limits)
            .map_err(|source| TocCacheError::of(digest, path.clone(), source))?;
        let io = |source| TocCacheError::Io {
            path: path.clone(),
            error: source,
        };
        crate::dirs::ensure_private(&self.dir).map_err(io)?;
        let tmp = self.dir.join(format!(".{}.tmp", digest.hex()));
        std::fs::write(&tmp, tail).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok((footer.toc_digest, toc))
    }

    /// Load and re-verify the cached TOC of `digest` (its digest must be `expected` when the
    /// layer record names it). Returns the TOC digest and the TOC.
    pub fn get(
        &self,
        digest: &Digest,
        blob_size: u64,
        expected: Option<&Digest>,
    ) -> Result<(Digest, Toc), TocCacheError> {
        let path = self.path(digest);
        let tail = std::fs::read(&path).map_err(|source| TocCacheError::Io {
            path: path.clone(),
            error: source,
        })?;
        parse_tail_with_limits(&tail, blob_size, expected, &self.limits)
            .map(|(f, t)| (f.toc_digest, t))
            .map_err(|source| TocCacheError::of(digest, path, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::testutil::{build_layer, tar_of, T};
    use weenv_format::footer::FOOTER_SIZE;

    #[test]
    fn roundtrip_and_damage_detected() {
        let d = tempfile::tempdir().unwrap();
        let c = TocCache::new(&d.path().join("tocs"), TocLimits::default());
        let tar = tar_of(&[T::File("f", vec![3u8; 5000])]);
        let (digest, toc, blob) = build_layer(&tar, 1 << 20);
        let size = blob.len() as u64;
        let f = weenv_format::footer::Footer::parse(&blob).unwrap();
        let tail = &blob[f.toc_offset as usize..];
        assert_eq!(tail.len(), f.toc_len as usize + FOOTER_SIZE);
        let (td, t) = c.put(&digest, tail, size, None).unwrap();
        assert_eq!(t, toc);
        assert_eq!(td, f.toc_digest);
        // the manifest's hint names the TOC digest: another one is refused
        let wrong = Digest::sha256(b"other toc");
        assert!(c.put(&digest, tail, size, Some(&wrong)).is_err());
        assert_eq!(c.get(&digest, size, Some(&td)).unwrap(), (td.clone(), toc));
        assert!(c.get(&digest, size, Some(&wrong)).is_err());
        // flip a byte inside the TOC frame
        let mut bad = tail.to_vec();
        bad[10] ^= 0xff;
        std::fs::write(c.path(&digest), &bad).unwrap();
        assert!(matches!(
            c.get(&digest, size, None),
            Err(TocCacheError::Invalid { .. })
        ));
        assert!(c.put(&digest, &bad, size, None).is_err());
        // a TOC over the limits is refused with the layer, the limit and the key to raise
        std::fs::write(c.path(&digest), tail).unwrap();
        let small = TocCache::new(
            &d.path().join("tocs"),
            TocLimits {
                max_entries: 0,
                ..TocLimits::default()
            },
        );
        let e = small.get(&digest, size, None).unwrap_err().to_string();
        assert!(
            e.contains(digest.as_str())
                && e.contains("limit of 0")
                && e.contains("limits.max_toc_entries"),
            "{e}"
        );
        assert!(small.put(&digest, tail, size, None).is_err());
        let other = Digest::sha256(b"none");
        assert!(matches!(
            c.get(&other, size, None),
            Err(TocCacheError::Io { .. })
        ));
    }
}
