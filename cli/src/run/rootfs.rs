//! A container's rootfs (the mounts containerd's Snapshots service gives) mounted on a temp
//! dir with `nix::mount` (no `mount`/`umount` processes), for reading the image's users and
//! applying an at-init mutation before the task starts. Options are translated to mount
//! flags with containerd's table (`mount/mount_linux.go`); the rest is filesystem data.

use containerd_client::types::Mount;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Errors mounting or unmounting a rootfs.
#[derive(Debug, Error)]
pub enum RootfsError {
    #[error("creating a mount point: {0}")]
    TempDir(std::io::Error),
    #[error("expected one rootfs mount, got {0}")]
    Count(usize),
    #[error("mount -t {kind} {src} {target}: {errno}")]
    Mount {
        kind: String,
        src: String,
        target: String,
        errno: nix::errno::Errno,
    },
    #[error("umount {target}: {errno}")]
    Umount {
        target: String,
        errno: nix::errno::Errno,
    },
}

/// Flags and filesystem data of containerd mount options (pure).
pub fn mount_flags(options: &[String]) -> (MsFlags, String) {
    let mut flags = MsFlags::empty();
    let mut data: Vec<&str> = Vec::new();
    for o in options {
        // (clear, flag): containerd's `flagsMap`.
        let (clear, f) = match o.as_str() {
            "async" => (true, MsFlags::MS_SYNCHRONOUS),
            "atime" => (true, MsFlags::MS_NOATIME),
            "bind" => (false, MsFlags::MS_BIND),
            "defaults" => (false, MsFlags::empty()),
            "dev" => (true, MsFlags::MS_NODEV),
            "diratime" => (true, MsFlags::MS_NODIRATIME),
            "dirsync" => (false, MsFlags::MS_DIRSYNC),
            "exec" => (true, MsFlags::MS_NOEXEC),
            "mand" => (false, MsFlags::MS_MANDLOCK),
            "noatime" => (false, MsFlags::MS_NOATIME),
            "nodev" => (false, MsFlags::MS_NODEV),
            "nodiratime" => (false, MsFlags::MS_NODIRATIME),
            "noexec" => (false, MsFlags::MS_NOEXEC),
            "nomand" => (true, MsFlags::MS_MANDLOCK),
            "norelatime" => (true, MsFlags::MS_RELATIME),
            "nostrictatime" => (true, MsFlags::MS_STRICTATIME),
            "nosuid" => (false, MsFlags::MS_NOSUID),
            "rbind" => (false, MsFlags::MS_BIND | MsFlags::MS_REC),
            "relatime" => (false, MsFlags::MS_RELATIME),
            "remount" => (false, MsFlags::MS_REMOUNT),
            "ro" => (false, MsFlags::MS_RDONLY),
            "rw" => (true, MsFlags::MS_RDONLY),
            "strictatime" => (false, MsFlags::MS_STRICTATIME),
            "suid" => (true, MsFlags::MS_NOSUID),
            "sync" => (false, MsFlags::MS_SYNCHRONOUS),
            other => {
                data.push(other);
                continue;
            }
        };
        if clear {
            flags.remove(f);
        } else {
            flags.insert(f);
        }
    }
    (flags, data.join(","))
}

/// A rootfs mounted on a temp dir; unmounted by [`MountedRootfs::unmount`] or on drop. If
/// unmounting fails the mount point is left in place (never removed recursively through a
/// mount).
pub struct MountedRootfs {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl MountedRootfs {
    /// Mount the one rootfs mount of a container snapshot (read-only if `readonly`).
    pub fn mount(mounts: &[Mount], readonly: bool) -> Result<MountedRootfs, RootfsError> {
        let [m] = mounts else {
            return Err(RootfsError::Count(mounts.len()));
        };
        let dir = tempfile::Builder::new()
            .prefix("weenv-rootfs-")
            .tempdir()
            .map_err(RootfsError::TempDir)?;
        let path = dir.path().to_path_buf();
        let mut opts = m.options.clone();
        if readonly {
            opts.push("ro".into());
        }
        let (flags, data) = mount_flags(&opts);
        let m_target = path.display().to_string();
        let err = |errno| RootfsError::Mount {
            kind: m.r#type.clone(),
            src: m.source.clone(),
            target: m_target.clone(),
            errno,
        };
        let fstype = (m.r#type != "bind").then_some(m.r#type.as_str());
        let data_opt = (!data.is_empty()).then_some(data.as_str());
        mount(Some(m.source.as_str()), &path, fstype, flags, data_opt).map_err(err)?;
        let out = MountedRootfs {
            dir: Some(dir),
            path,
        };
        // A bind mount ignores MS_RDONLY until remounted.
        if flags.contains(MsFlags::MS_BIND | MsFlags::MS_RDONLY) {
            mount(
                None::<&str>,
                &out.path,
                None::<&str>,
                flags | MsFlags::MS_REMOUNT,
                None::<&str>,
            )
            .map_err(err)?;
        }
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn release(&mut self) -> Result<(), nix::errno::Errno> {
        let Some(dir) = self.dir.take() else {
            return Ok(());
        };
        match umount2(&self.path, MntFlags::empty())
            .or_else(|_| umount2(&self.path, MntFlags::MNT_DETACH))
        {
            Ok(()) => Ok(()), // `dir` (now empty) is removed here
            Err(e) => {
                let _ = dir.keep();
                Err(e)
            }
        }
    }

    /// Unmount and remove the mount point.
    pub fn unmount(mut self) -> Result<(), RootfsError> {
        self.release().map_err(|errno| RootfsError::Umount {
            target: self.path.display().to_string(),
            errno,
        })
    }
}

impl Drop for MountedRootfs {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(path = %self.path.display(), error = %e, "could not unmount a rootfs");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn options_split_into_flags_and_data() {
        let (f, d) = mount_flags(&s(&[
            "index=off",
            "lowerdir=/x:/y",
            "upperdir=/u",
            "workdir=/w",
        ]));
        assert_eq!(f, MsFlags::empty());
        assert_eq!(d, "index=off,lowerdir=/x:/y,upperdir=/u,workdir=/w");
        let (f, d) = mount_flags(&s(&["rbind", "rw"]));
        assert_eq!(f, MsFlags::MS_BIND | MsFlags::MS_REC);
        assert_eq!(d, "");
        let (f, _) = mount_flags(&s(&["bind", "ro", "nosuid", "nodev"]));
        assert_eq!(
            f,
            MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV
        );
        // Later options win, like containerd's parser.
        let (f, _) = mount_flags(&s(&["ro", "rw"]));
        assert_eq!(f, MsFlags::empty());
    }

    #[test]
    fn only_one_rootfs_mount_is_accepted() {
        assert!(matches!(
            MountedRootfs::mount(&[], false),
            Err(RootfsError::Count(0))
        ));
    }
}
