//! Directory modes, set explicitly: nothing the daemon creates depends on its umask.
//!
//! The daemon's state is private to root, as containerd's overlayfs snapshotter keeps its own
//! (its root and `snapshots/` are 0700): `root_dir`, `snapshots/`, `tocs/`, the cache dir and
//! the FUSE mountpoints are [`PRIVATE`]; a dir that exists with a wider mode (an install made
//! before this rule, or under another umask) is narrowed at start. A snapshot's own
//! directories get overlayfs's modes: `<id>` [`PRIVATE`], `<id>/fs` [`SNAPSHOT_FS`] (the
//! container's root when it has no parent), `<id>/work` [`SNAPSHOT_WORK`]. Every directory is
//! made with `mkdir` and then `chmod`ed to its mode, so a umask of 000 or 077 changes nothing.

use std::fs::{self, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// State only root may enter.
pub const PRIVATE: u32 = 0o700;
/// A new snapshot's root (`<id>/fs`), as overlayfs's snapshotter makes it.
pub const SNAPSHOT_FS: u32 = 0o755;
/// A new snapshot's overlayfs work dir (`<id>/work`), as overlayfs's snapshotter makes it.
pub const SNAPSHOT_WORK: u32 = 0o711;

/// What [`ensure`] did to a directory that existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// Created now (and its missing ancestors, with the same mode).
    Created,
    /// Existed with this mode.
    Kept,
    /// Existed with the wider mode it carries; now has the mode asked for.
    Narrowed(u32),
}

/// Makes `dir` a directory with permission bits `mode`: creates it (missing ancestors too,
/// with `mode`, as Go's `os.MkdirAll` does) or, if it exists with any bit outside `mode`,
/// narrows it to `mode`. Bits `mode` has that an existing dir lacks are left alone (an
/// operator may have made it stricter).
pub fn ensure(dir: &Path, mode: u32) -> std::io::Result<Ensured> {
    match fs::metadata(dir) {
        Ok(md) if md.is_dir() => {
            let old = md.mode() & 0o7777;
            if old & !mode == 0 {
                return Ok(Ensured::Kept);
            }
            fs::set_permissions(dir, Permissions::from_mode(old & mode))?;
            Ok(Ensured::Narrowed(old))
        }
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !parent.exists() {
                    ensure(parent, mode)?;
                }
            }
            create(dir, mode)?;
            Ok(Ensured::Created)
        }
        Err(e) => Err(e),
    }
}

/// [`ensure`] for daemon state, logging a narrowed directory once.
pub fn ensure_private(dir: &Path) -> std::io::Result<()> {
    if let Ensured::Narrowed(old) = ensure(dir, PRIVATE)? {
        tracing::info!(dir = %dir.display(), old = format!("{old:04o}"),
            new = format!("{PRIVATE:04o}"), "state directory was readable by other users; narrowed");
    }
    Ok(())
}

/// Creates the directory `dir` (its parent must exist) with permission bits `mode` exactly.
pub fn create(dir: &Path, mode: u32) -> std::io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(dir)?;
    fs::set_permissions(dir, Permissions::from_mode(mode))
}

/// Sets the owner (not following a symlink) and permission bits of `dir` to those of
/// `from` (a parent snapshot's top directory), as overlayfs's snapshotter gives a new
/// snapshot's `fs` its parent's owner.
pub fn copy_owner_and_mode(from: &Path, dir: &Path) -> std::io::Result<(u32, u32, u32)> {
    let md = fs::metadata(from)?;
    let mode = md.mode() & 0o7777;
    std::os::unix::fs::lchown(dir, Some(md.uid()), Some(md.gid()))?;
    // After the chown: chown clears setuid/setgid bits, which the copy keeps.
    fs::set_permissions(dir, Permissions::from_mode(mode))?;
    Ok((md.uid(), md.gid(), mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o7777
    }

    /// Runs `f` under `umask` (the process umask; the tests of this module that change it
    /// hold one lock so they never see each other's).
    fn under_umask<T>(umask: u32, f: impl FnOnce() -> T) -> T {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _g = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(umask));
        let r = f();
        nix::sys::stat::umask(old);
        r
    }

    #[test]
    fn modes_do_not_depend_on_the_umask() {
        for umask in [0o000, 0o022, 0o077] {
            under_umask(umask, || {
                let t = tempfile::tempdir().unwrap();
                let root = t.path().join("a/b/root");
                assert_eq!(ensure(&root, PRIVATE).unwrap(), Ensured::Created);
                assert_eq!(mode_of(&root), 0o700, "umask {umask:o}");
                assert_eq!(mode_of(&t.path().join("a")), 0o700, "ancestors too");
                let fs_dir = root.join("fs");
                create(&fs_dir, SNAPSHOT_FS).unwrap();
                assert_eq!(mode_of(&fs_dir), 0o755, "umask {umask:o}");
                let work = root.join("work");
                create(&work, SNAPSHOT_WORK).unwrap();
                assert_eq!(mode_of(&work), 0o711, "umask {umask:o}");
            });
        }
    }

    #[test]
    fn a_wider_existing_dir_is_narrowed_a_stricter_one_kept() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        assert_eq!(ensure(&d, PRIVATE).unwrap(), Ensured::Narrowed(0o755));
        assert_eq!(mode_of(&d), 0o700);
        fs::set_permissions(&d, Permissions::from_mode(0o500)).unwrap();
        assert_eq!(ensure(&d, PRIVATE).unwrap(), Ensured::Kept);
        assert_eq!(mode_of(&d), 0o500);
        let f = t.path().join("file");
        fs::write(&f, b"").unwrap();
        assert!(ensure(&f, PRIVATE).is_err());
    }

    #[test]
    fn owner_and_mode_are_copied() {
        let t = tempfile::tempdir().unwrap();
        let (from, to) = (t.path().join("from"), t.path().join("to"));
        create(&from, 0o750).unwrap();
        create(&to, SNAPSHOT_FS).unwrap();
        let me = nix::unistd::getuid().as_raw();
        if me == 0 {
            std::os::unix::fs::lchown(&from, Some(1000), Some(1001)).unwrap();
        }
        let got = copy_owner_and_mode(&from, &to).unwrap();
        let md = fs::metadata(&to).unwrap();
        assert_eq!((md.uid(), md.gid(), mode_of(&to)), got);
        assert_eq!(mode_of(&to), 0o750);
        if me == 0 {
            assert_eq!((md.uid(), md.gid()), (1000, 1001));
        }
    }
}
