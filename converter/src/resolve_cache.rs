//! Persisted resolution cache for layer-group references.
//!
//! Maps a group reference (as written in a plan) to the manifest digest it resolved to and
//! when; stores group manifests and configs by digest (content-addressed, immutable). So a
//! warm `plan compose` needs no registry round trip at all:
//! - a digest reference (`repo@sha256:..`) is never re-resolved;
//! - a tag is re-resolved when its entry is older than the TTL, or always with `refresh`.
//!
//! The decision ([`ResolveCache::lookup`]) is pure; time is passed in. The file is one JSON
//! document (`resolve-cache.json` under `~/.cache/weenv` or `--cache-dir`), written atomically
//! (temp file + rename); a corrupt file is discarded with a warning, never fatal.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;
use weenv_format::Digest;

/// File name of the cache inside its directory.
pub const CACHE_FILE: &str = "resolve-cache.json";
/// Cache schema version.
pub const CACHE_VERSION: u32 = 1;
/// Default tag TTL (5 minutes).
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// Errors saving the cache.
#[derive(Debug, Error)]
pub enum ResolveCacheError {
    #[error("writing resolution cache {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// How tags are re-resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvePolicy {
    /// A tag resolved less than `ttl` ago is used without asking the registry.
    pub ttl: Duration,
    /// Re-resolve every tag now (digest references stay cached).
    pub refresh: bool,
}

impl Default for ResolvePolicy {
    fn default() -> Self {
        ResolvePolicy {
            ttl: DEFAULT_TTL,
            refresh: false,
        }
    }
}

/// One resolved reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    pub digest: Digest,
    /// Seconds since the epoch when it was resolved.
    pub resolved_at: u64,
}

/// Outcome of a cache lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Use this manifest digest without asking the registry.
    Fresh(Digest),
    /// Ask the registry (missing, expired, refresh requested, or content not cached).
    Resolve,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    refs: BTreeMap<String, Resolution>,
    /// Group manifest and config bytes (UTF-8 JSON) by digest.
    blobs: BTreeMap<Digest, String>,
}

/// The resolution cache. Load, look up / record, save.
#[derive(Clone, Debug)]
pub struct ResolveCache {
    path: Option<PathBuf>,
    file: CacheFile,
    dirty: bool,
}

/// `$XDG_CACHE_HOME/weenv`, else `$HOME/.cache/weenv`, else `/var/cache/weenv`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("weenv");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache").join("weenv");
    }
    PathBuf::from("/var/cache/weenv")
}

/// Seconds since the epoch of `t`.
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether `reference` pins a digest (`...@sha256:...`).
pub fn is_digest_ref(reference: &str) -> bool {
    reference.contains("@sha256:")
}

impl ResolveCache {
    /// An empty cache that is never persisted.
    pub fn in_memory() -> Self {
        ResolveCache {
            path: None,
            file: CacheFile {
                version: CACHE_VERSION,
                ..Default::default()
            },
            dirty: false,
        }
    }

    /// Load `dir/resolve-cache.json` (missing or unreadable: start empty).
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(CACHE_FILE);
        let file = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<CacheFile>(&bytes) {
                Ok(f) if f.version == CACHE_VERSION => f,
                Ok(f) => {
                    tracing::warn!(path = %path.display(), version = f.version, "ignoring resolution cache of another version");
                    CacheFile::default()
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring corrupt resolution cache");
                    CacheFile::default()
                }
            },
            Err(_) => CacheFile::default(),
        };
        ResolveCache {
            path: Some(path),
            file: CacheFile {
                version: CACHE_VERSION,
                ..file
            },
            dirty: false,
        }
    }

    /// Decide whether `reference` can be served from the cache at `now` (seconds).
    pub fn lookup(&self, reference: &str, now: u64, policy: ResolvePolicy) -> Lookup {
        let Some(r) = self.file.refs.get(reference) else {
            return Lookup::Resolve;
        };
        if !self.file.blobs.contains_key(&r.digest) {
            return Lookup::Resolve;
        }
        if is_digest_ref(reference) {
            return Lookup::Fresh(r.digest.clone());
        }
        if policy.refresh || now.saturating_sub(r.resolved_at) >= policy.ttl.as_secs() {
            return Lookup::Resolve;
        }
        Lookup::Fresh(r.digest.clone())
    }

    /// Record that `reference` resolved to `digest` at `now`.
    pub fn record(&mut self, reference: &str, digest: &Digest, now: u64) {
        self.file.refs.insert(
            reference.to_string(),
            Resolution {
                digest: digest.clone(),
                resolved_at: now,
            },
        );
        self.dirty = true;
    }

    /// Content by digest (group manifest or config JSON).
    pub fn blob(&self, digest: &Digest) -> Option<&[u8]> {
        self.file.blobs.get(digest).map(|s| s.as_bytes())
    }

    /// Store content (must be UTF-8 JSON; the digest is checked).
    pub fn put_blob(&mut self, digest: &Digest, bytes: &[u8]) {
        if Digest::sha256(bytes) != *digest {
            return;
        }
        if let Ok(s) = std::str::from_utf8(bytes) {
            if !self.file.blobs.contains_key(digest) {
                self.file.blobs.insert(digest.clone(), s.to_string());
                self.dirty = true;
            }
        }
    }

    /// The cached references, sorted.
    pub fn references(&self) -> Vec<String> {
        self.file.refs.keys().cloned().collect()
    }

    /// Number of cached references.
    pub fn len(&self) -> usize {
        self.file.refs.len()
    }

    /// Whether no reference is cached.
    pub fn is_empty(&self) -> bool {
        self.file.refs.is_empty()
    }

    /// Write the cache back if it changed (atomically).
    pub fn save(&mut self) -> Result<(), ResolveCacheError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if !self.dirty {
            return Ok(());
        }
        let io_err = |source| ResolveCacheError::Io {
            path: path.clone(),
            error: source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        // Unique per save: concurrent saves (several plans composed at once in one process)
        // must not write into one temp file; the last rename wins whole.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("json.tmp.{}.{n}", std::process::id()));
        let bytes = serde_json::to_vec(&self.file).map_err(|e| io_err(std::io::Error::other(e)))?;
        std::fs::write(&tmp, bytes).map_err(io_err)?;
        std::fs::rename(&tmp, path).map_err(io_err)?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lookup_policy() {
        let mut c = ResolveCache::in_memory();
        let m = br#"{"m":1}"#;
        let d = Digest::sha256(m);
        let pol = ResolvePolicy {
            ttl: Duration::from_secs(60),
            refresh: false,
        };
        assert_eq!(c.lookup("r/a:1", 100, pol), Lookup::Resolve);
        c.record("r/a:1", &d, 100);
        // recorded but content missing: resolve
        assert_eq!(c.lookup("r/a:1", 100, pol), Lookup::Resolve);
        c.put_blob(&d, m);
        assert_eq!(c.lookup("r/a:1", 159, pol), Lookup::Fresh(d.clone()));
        assert_eq!(c.lookup("r/a:1", 160, pol), Lookup::Resolve);
        let refresh = ResolvePolicy {
            refresh: true,
            ..pol
        };
        assert_eq!(c.lookup("r/a:1", 100, refresh), Lookup::Resolve);
        let dref = format!("r/a@{d}");
        c.record(&dref, &d, 0);
        assert_eq!(c.lookup(&dref, 1 << 40, refresh), Lookup::Fresh(d.clone()));
        // wrong content is not stored
        c.put_blob(&Digest::sha256(b"other"), b"not it");
        assert!(c.blob(&Digest::sha256(b"other")).is_none());
    }

    #[test]
    fn persists_and_survives_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let m = br#"{"m":2}"#;
        let d = Digest::sha256(m);
        let mut c = ResolveCache::load(dir.path());
        c.record("r/b:1", &d, 5);
        c.put_blob(&d, m);
        c.save().unwrap();
        let c2 = ResolveCache::load(dir.path());
        assert_eq!(c2.len(), 1);
        assert_eq!(c2.blob(&d), Some(&m[..]));
        std::fs::write(dir.path().join(CACHE_FILE), b"{garbage").unwrap();
        assert!(ResolveCache::load(dir.path()).is_empty());
    }
}
