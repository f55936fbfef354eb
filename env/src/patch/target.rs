//! [`PatchTarget`] implementations: an in-memory tree and a directory on disk.

use super::{is_symlink, FileState, PatchTarget};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// An in-memory file tree: path -> file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemTree {
    pub files: BTreeMap<String, FileState>,
}

impl PatchTarget for MemTree {
    fn read(&self, path: &str) -> io::Result<Option<FileState>> {
        Ok(self.files.get(path).cloned())
    }
    fn write(&mut self, path: &str, file: &FileState) -> io::Result<()> {
        self.files.insert(path.to_string(), file.clone());
        Ok(())
    }
    fn delete(&mut self, path: &str) -> io::Result<()> {
        self.files
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }
    fn set_mode(&mut self, path: &str, mode: u32) -> io::Result<()> {
        let f = self
            .files
            .get_mut(path)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))?;
        f.mode = mode;
        Ok(())
    }
}

/// A directory on disk (e.g. a mounted container rootfs, or a repository inside it).
///
/// Safety against escaping the root: every intermediate component of a path must be a real
/// directory (a symlink there is refused, since it could point outside the root, e.g. at
/// the host's `/etc` when the rootfs is mounted on the host); a symlink as the final
/// component is read as a link and replaced, never written through.
#[derive(Clone, Debug)]
pub struct DirTarget {
    root: PathBuf,
}

impl DirTarget {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirTarget { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolve `rel` under the root, refusing symlinks in intermediate components.
    fn resolve(&self, rel: &str) -> io::Result<PathBuf> {
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        let mut p = self.root.clone();
        for (i, c) in comps.iter().enumerate() {
            if *c == ".." || *c == "." {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unsafe path {rel:?}"),
                ));
            }
            p.push(c);
            if i + 1 < comps.len() {
                match fs::symlink_metadata(&p) {
                    Ok(m) if m.file_type().is_symlink() => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("{} is a symlink; refusing to patch through it", p.display()),
                        ))
                    }
                    Ok(m) if !m.is_dir() => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("{} is not a directory", p.display()),
                        ))
                    }
                    _ => {}
                }
            }
        }
        Ok(p)
    }
}

impl PatchTarget for DirTarget {
    fn read(&self, path: &str) -> io::Result<Option<FileState>> {
        let p = self.resolve(path)?;
        let m = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if m.file_type().is_symlink() {
            use std::os::unix::ffi::OsStrExt;
            let t = fs::read_link(&p)?;
            return Ok(Some(FileState {
                data: t.as_os_str().as_bytes().to_vec(),
                mode: super::MODE_SYMLINK,
            }));
        }
        if !m.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or symlink",
            ));
        }
        Ok(Some(FileState {
            data: fs::read(&p)?,
            mode: 0o100000 | (m.permissions().mode() & 0o7777),
        }))
    }

    fn write(&mut self, path: &str, file: &FileState) -> io::Result<()> {
        let p = self.resolve(path)?;
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        let existing = fs::symlink_metadata(&p).ok();
        if is_symlink(file.mode) {
            if existing.is_some() {
                fs::remove_file(&p)?;
            }
            use std::os::unix::ffi::OsStrExt;
            return symlink(std::ffi::OsStr::from_bytes(&file.data), &p);
        }
        if existing.as_ref().is_some_and(|m| !m.is_file()) {
            // never write through a symlink; replace it
            fs::remove_file(&p)?;
        }
        // Truncating an existing regular file keeps its owner (and triggers overlay copy-up).
        fs::write(&p, &file.data)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(file.mode & 0o7777))
    }

    fn delete(&mut self, path: &str) -> io::Result<()> {
        fs::remove_file(self.resolve(path)?)
    }

    fn set_mode(&mut self, path: &str, mode: u32) -> io::Result<()> {
        let p = self.resolve(path)?;
        if is_symlink(mode) {
            return Ok(()); // symlink permissions are not meaningful on Linux
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode & 0o7777))
    }
}
