//! Scratch directories of a conversion, and cleanup of the ones a killed run left behind.
//!
//! A [`Scratch`] is a directory `PREFIX*` created next to the destination (an OCI layout's own
//! directory, so finished blobs are renamed into place on the same filesystem) or in the
//! system temp dir. It holds a lock file ([`LOCK_FILE`]) that its process keeps `flock`ed for
//! its whole life; the lock appears already held (it is taken on a temporary name, then
//! renamed). The kernel drops a `flock` when its holder exits, SIGKILL included, so a scratch
//! directory whose lock file can be locked by someone else belongs to a dead run:
//! [`clean_stale`] removes exactly those. A directory without a lock file is being created
//! right now (or was made by an older version) and is never touched.
//!
//! Dropping a [`Scratch`] removes it (a failed run leaves nothing).

use crate::ConvertError;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Prefix of scratch directories inside an OCI layout destination.
pub const LAYOUT_PREFIX: &str = ".weenv-convert";
/// Prefix of scratch directories in the system temp dir.
pub const TEMP_PREFIX: &str = "weenv-convert";
/// The lock file inside a scratch directory, `flock`ed by the owning process.
pub const LOCK_FILE: &str = "owner.lock";

/// A locked scratch directory, removed on drop.
#[derive(Debug)]
pub struct Scratch {
    // Field order: the directory is removed before the lock is released.
    dir: tempfile::TempDir,
    _lock: Flock<File>,
}

impl Scratch {
    /// Removes stale scratch directories `prefix*` in `parent`, then creates a new one there.
    pub fn create(parent: &Path, prefix: &str) -> Result<Scratch, ConvertError> {
        for removed in clean_stale(parent, prefix) {
            tracing::info!(dir = %removed.display(), "removed the scratch directory of a conversion that was killed");
        }
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(parent)
            .map_err(|e| {
                ConvertError::io(
                    format!("creating a scratch directory in {}", parent.display()),
                    e,
                )
            })?;
        let tmp = dir.path().join(format!("{LOCK_FILE}.new"));
        let f = File::create(&tmp)
            .map_err(|e| ConvertError::io(format!("creating {}", tmp.display()), e))?;
        let lock = Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            ConvertError::io(format!("locking {}", tmp.display()), errno.into())
        })?;
        let path = dir.path().join(LOCK_FILE);
        std::fs::rename(&tmp, &path)
            .map_err(|e| ConvertError::io(format!("renaming {}", tmp.display()), e))?;
        Ok(Scratch { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes every directory `prefix*` directly in `parent` whose [`LOCK_FILE`] exists and is
/// not locked (its owner is dead); returns the removed paths. Errors are skipped: cleanup is
/// best effort and never fails a conversion.
pub fn clean_stale(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in rd.flatten() {
        let starts = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(prefix));
        // `file_type` does not follow symlinks: a symlink named like scratch is left alone.
        if !starts || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = e.path();
        let Ok(f) = File::open(dir.join(LOCK_FILE)) else {
            continue;
        };
        // Held while removing, so a second cleaner skips this directory.
        let Ok(_held) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn live_scratch_is_kept_dead_scratch_is_removed_unlocked_unknown_is_kept() {
        let parent = tempfile::tempdir().unwrap();
        let live = Scratch::create(parent.path(), LAYOUT_PREFIX).unwrap();
        assert!(live.path().join(LOCK_FILE).exists());
        // A dead run's scratch: lock file present, nobody holds it.
        let dead = parent.path().join(format!("{LAYOUT_PREFIX}dead"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(LOCK_FILE), b"").unwrap();
        std::fs::write(dead.join("blob"), vec![0u8; 1000]).unwrap();
        // No lock file: not provably stale.
        let unknown = parent.path().join(format!("{LAYOUT_PREFIX}old"));
        std::fs::create_dir(&unknown).unwrap();
        // Another prefix: not ours.
        let other = parent.path().join("blobs");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(LOCK_FILE), b"").unwrap();

        let removed = clean_stale(parent.path(), LAYOUT_PREFIX);
        assert_eq!(removed, vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(unknown.exists() && other.exists() && live.path().exists());

        // A second run's create cleans too, and never the live one.
        let second = Scratch::create(parent.path(), LAYOUT_PREFIX).unwrap();
        assert!(live.path().exists() && second.path().exists());
        let p = live.path().to_path_buf();
        drop(live);
        assert!(!p.exists(), "dropping a scratch removes it");
    }
}
