//! Files of a running environment, read and written from the host through the init's
//! `/proc/<pid>/root`, every path resolved inside the container's root
//! (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: a symlink in the container cannot
//! lead out of it), so a file costs no process in the container. Trees (tar) go through the
//! container's own `tar` (see the service's Upload / Download).

use crate::error::EnvdError;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// Largest file ReadFile / WriteFile move in one message.
pub const MAX_FILE: u64 = 64 << 20;

fn how(flags: OFlag, mode: Mode) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

/// The container's root as seen from the host.
fn root_of(pid: u32) -> Result<std::fs::File, EnvdError> {
    std::fs::File::open(format!("/proc/{pid}/root")).map_err(EnvdError::io(format!(
        "opening the root of the environment's init (pid {pid})"
    )))
}

/// `path` as a relative path inside the root (absolute or relative to `/`), `..` refused.
pub fn inner_path(path: &str) -> Result<PathBuf, EnvdError> {
    if path.is_empty() {
        return Err(EnvdError::InvalidArgument("empty path".into()));
    }
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                return Err(EnvdError::InvalidArgument(format!(
                    "path {path:?} has a `..` component; give the path without it"
                )))
            }
            Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

fn open_in(root: &std::fs::File, rel: &Path, h: OpenHow, what: &str) -> Result<OwnedFd, EnvdError> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    openat2(root, rel, h).map_err(|e| EnvdError::Io {
        what: format!("{what} /{}", rel.display()),
        error: std::io::Error::from(e),
    })
}

/// Read the file at `path` (at most `limit` bytes: a larger file is an error).
pub fn read(pid: u32, path: &str, limit: u64) -> Result<Vec<u8>, EnvdError> {
    let rel = inner_path(path)?;
    let root = root_of(pid)?;
    let fd = open_in(&root, &rel, how(OFlag::O_RDONLY, Mode::empty()), "opening")?;
    let mut f = std::fs::File::from(fd);
    let mut data = Vec::new();
    (&mut f)
        .take(limit + 1)
        .read_to_end(&mut data)
        .map_err(EnvdError::io(format!("reading {path}")))?;
    if data.len() as u64 > limit {
        return Err(EnvdError::TooLarge(format!(
            "{path} is larger than {limit} bytes; download it as a tar (Download) instead"
        )));
    }
    Ok(data)
}

/// Write `data` to `path` (created with `mode`, truncated if it exists); missing parent
/// directories are created (0755) when `parents`.
pub fn write(pid: u32, path: &str, data: &[u8], mode: u32, parents: bool) -> Result<(), EnvdError> {
    let rel = inner_path(path)?;
    let name = rel
        .file_name()
        .ok_or_else(|| EnvdError::InvalidArgument(format!("{path:?} names no file")))?
        .to_owned();
    let root = root_of(pid)?;
    let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
    let dir_how = || how(OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty());
    let dir = match open_in(&root, &parent, dir_how(), "opening directory") {
        Ok(d) => d,
        Err(EnvdError::Io { error, .. })
            if parents && error.kind() == std::io::ErrorKind::NotFound =>
        {
            // Create the missing components one by one, each resolved inside the root.
            let mut cur = PathBuf::new();
            for c in parent.components() {
                let next = cur.join(c);
                if open_in(&root, &next, dir_how(), "opening directory").is_err() {
                    let d = open_in(&root, &cur, dir_how(), "opening directory")?;
                    match nix::sys::stat::mkdirat(
                        &d,
                        c.as_os_str(),
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                        Err(e) => {
                            return Err(EnvdError::Io {
                                what: format!("creating directory /{}", next.display()),
                                error: e.into(),
                            })
                        }
                    }
                }
                cur = next;
            }
            open_in(&root, &parent, dir_how(), "opening directory")?
        }
        Err(e) => return Err(e),
    };
    let m = Mode::from_bits_truncate(if mode == 0 { 0o644 } else { mode & 0o7777 });
    let fd = openat2(
        &dir,
        Path::new(&name),
        how(
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW,
            m,
        ),
    )
    .map_err(|e| EnvdError::Io {
        what: format!("creating {path}"),
        error: e.into(),
    })?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data)
        .map_err(EnvdError::io(format!("writing {path}")))?;
    // The mode asked for, not the one the umask left.
    nix::sys::stat::fchmod(&f, m).map_err(|e| EnvdError::Io {
        what: format!("setting the mode of {path}"),
        error: e.into(),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        assert_eq!(inner_path("/a/b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(inner_path("a/./b").unwrap(), PathBuf::from("a/b"));
        assert!(inner_path("/a/../b").is_err());
        assert!(inner_path("").is_err());
    }

    #[test]
    fn write_and_read_in_own_root_with_parents_and_mode() {
        // Our own /proc/self/root is "/": exercise the openat2 paths on a temp dir.
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = format!("{}/x/y/z.txt", d.path().display());
        let pid = std::process::id();
        write(pid, &p, b"hi", 0o600, true).unwrap();
        assert_eq!(read(pid, &p, 10).unwrap(), b"hi");
        let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o600);
        assert!(matches!(read(pid, &p, 1), Err(EnvdError::TooLarge(_))));
        let missing = format!("{}/nope/f", d.path().display());
        assert!(write(pid, &missing, b"", 0, false).is_err());
    }

    #[test]
    fn a_symlink_cannot_lead_out_of_the_root() {
        // A "container root" dir with an absolute symlink to /etc: resolved inside the root,
        // /etc/hostname is looked up under the root and is not found.
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("etc")).unwrap();
        let root = std::fs::File::open(d.path()).unwrap();
        let r = open_in(
            &root,
            Path::new("etc/hostname"),
            how(OFlag::O_RDONLY, Mode::empty()),
            "opening",
        );
        assert!(r.is_err());
    }
}
