//! Entry path rules, shared by the tar parser (which normalises) and the TOC validator (which
//! checks that paths are already normal).
//!
//! A normal path is relative, UTF-8, without NUL, without empty, `.` or `..` components and
//! without a trailing `/`. The layer root (`.`, `./`) normalises to the empty string `""`, which
//! only a directory may use.
//!
//! [`Namespace`] tracks the entries seen so far and enforces the namespace rules in tar order:
//! no duplicate paths (a directory repeated with identical metadata is tolerated and dropped),
//! no entry below a non-directory (in either order: `a` then `a/b`, or `a/b` then file `a`), hardlinks only to an earlier regular file (not to another hardlink: a TOC entry must say
//! literally what its tar header says, so a chain cannot be resolved; tar writers link every
//! name of an inode to the first one, so chains do not occur in practice).

use crate::toc::{Entry, EntryKind};
use crate::FormatError;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Longest path component (Linux NAME_MAX). Stock containerd fails to unpack longer names, so
/// weenv neither converts nor serves them.
pub const MAX_NAME: usize = 255;

fn check_component(path: &str, comp: &str) -> Result<(), FormatError> {
    if comp.len() > MAX_NAME {
        return Err(FormatError::InvalidPath {
            path: path.into(),
            reason: "a path component is longer than 255 bytes (NAME_MAX); containerd cannot unpack it either",
        });
    }
    Ok(())
}

/// Normalise a raw tar path: `./a//b/` -> `a/b`; `.`/`./` -> `""`.
/// Rejects absolute paths, `..` components, components over [`MAX_NAME`] bytes, NUL bytes and
/// non-UTF-8.
pub fn normalise(raw: &[u8]) -> Result<String, FormatError> {
    let s = std::str::from_utf8(raw).map_err(|_| FormatError::InvalidPath {
        path: String::from_utf8_lossy(raw).into_owned(),
        reason: "not UTF-8",
    })?;
    if s.contains('\0') {
        return Err(FormatError::InvalidPath {
            path: s.replace('\0', "\\0"),
            reason: "contains NUL",
        });
    }
    if s.starts_with('/') {
        return Err(FormatError::AbsolutePath { path: s.into() });
    }
    if s.is_empty() {
        return Err(FormatError::InvalidPath {
            path: String::new(),
            reason: "empty path",
        });
    }
    let mut out = String::with_capacity(s.len());
    for comp in s.split('/') {
        match comp {
            "" | "." => continue,
            ".." => return Err(FormatError::DotDotPath { path: s.into() }),
            c => {
                check_component(s, c)?;
                if !out.is_empty() {
                    out.push('/');
                }
                out.push_str(c);
            }
        }
    }
    Ok(out)
}

/// Normalise a path used for a lookup (not from a tar): like [`normalise`], but a leading `/`
/// means the layer root, and `""`, `.` and `/` name the root itself (`""`).
pub fn lookup_key(path: &str) -> Option<String> {
    let p = path.trim_start_matches('/');
    if p.is_empty() {
        return Some(String::new());
    }
    normalise(p.as_bytes()).ok()
}

/// Check that `path` is already in normal form (as stored in a TOC).
pub fn check_normal(path: &str) -> Result<(), FormatError> {
    if path.is_empty() {
        return Ok(());
    }
    if path.starts_with('/') {
        return Err(FormatError::AbsolutePath { path: path.into() });
    }
    if path.contains('\0') {
        return Err(FormatError::InvalidPath {
            path: path.replace('\0', "\\0"),
            reason: "contains NUL",
        });
    }
    for comp in path.split('/') {
        match comp {
            ".." => return Err(FormatError::DotDotPath { path: path.into() }),
            "" | "." => {
                return Err(FormatError::InvalidPath {
                    path: path.into(),
                    reason: "not normalised (empty or '.' component, or trailing '/')",
                })
            }
            c => check_component(path, c)?,
        }
    }
    Ok(())
}

/// Linux limits: symlink targets < PATH_MAX, xattr names <= XATTR_NAME_MAX, values <=
/// XATTR_SIZE_MAX. Entries beyond them cannot be unpacked by containerd either.
pub const MAX_SYMLINK_TARGET: usize = 4095;
pub const MAX_XATTR_NAME: usize = 255;
pub const MAX_XATTR_VALUE: usize = 65536;

/// Check a symlink target (kept verbatim; may be absolute or contain `..`: it is resolved by
/// the kernel inside the container's root, never by us).
pub fn check_symlink_target(target: &str) -> Result<(), &'static str> {
    if target.is_empty() {
        return Err("symlink with an empty target");
    }
    if target.contains('\0') {
        return Err("symlink target contains NUL");
    }
    if target.len() > MAX_SYMLINK_TARGET {
        return Err("symlink target longer than 4095 bytes");
    }
    Ok(())
}

/// Check one extended attribute.
pub fn check_xattr(name: &str, value: &[u8]) -> Result<(), &'static str> {
    if name.is_empty() || name.contains('\0') {
        return Err("xattr name empty or containing NUL");
    }
    if name.len() > MAX_XATTR_NAME {
        return Err("xattr name longer than 255 bytes");
    }
    if value.len() > MAX_XATTR_VALUE {
        return Err("xattr value larger than 64 KiB");
    }
    Ok(())
}

/// What [`Namespace::admit`] decided for an entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// A new entry; keep it.
    New,
    /// A directory repeated with identical metadata; drop it from the TOC.
    RepeatedDir,
}

#[derive(Debug, PartialEq, Eq)]
struct DirMeta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    mtime_nsec: u32,
    xattrs: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug)]
enum Slot {
    Dir(Box<DirMeta>),
    File,
    Other,
}

/// The set of entries seen so far, in tar order.
#[derive(Default, Debug)]
pub struct Namespace {
    slots: HashMap<String, Slot>,
    /// Every proper ancestor of an admitted path (implicit or explicit directories).
    ancestors: HashSet<String>,
}

impl Namespace {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of admitted paths.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True if nothing was admitted yet.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Admit `entry` (path already normal). For hardlinks, returns the regular file it names
    /// (the value `entry.link` must hold in a TOC); a hardlink to anything but an earlier
    /// regular file (another hardlink included) is `HardlinkTarget`.
    pub fn admit(&mut self, entry: &Entry) -> Result<(Admit, Option<String>), FormatError> {
        let path = &entry.path;
        if path.is_empty() && entry.kind != EntryKind::Dir {
            return Err(FormatError::InvalidPath {
                path: ".".into(),
                reason: "the layer root must be a directory",
            });
        }
        if let Some(slot) = self.slots.get(path.as_str()) {
            if let Slot::Dir(meta) = slot {
                if entry.kind == EntryKind::Dir && **meta == dir_meta(entry) {
                    return Ok((Admit::RepeatedDir, None));
                }
            }
            return Err(FormatError::DuplicatePath { path: path.clone() });
        }
        // Every ancestor that exists must be a directory.
        let mut idx = 0;
        while let Some(pos) = path[idx..].find('/') {
            let parent = &path[..idx + pos];
            match self.slots.get(parent) {
                None | Some(Slot::Dir(_)) => {}
                Some(_) => {
                    return Err(FormatError::ParentNotDirectory {
                        path: path.clone(),
                        parent: parent.to_string(),
                    })
                }
            }
            idx += pos + 1;
        }
        // A non-directory may not replace a directory that already has entries below it.
        if entry.kind != EntryKind::Dir && self.ancestors.contains(path.as_str()) {
            return Err(FormatError::ParentNotDirectory {
                path: format!("{path}/..."),
                parent: path.clone(),
            });
        }
        let mut resolved = None;
        let slot = match entry.kind {
            EntryKind::Dir => Slot::Dir(Box::new(dir_meta(entry))),
            EntryKind::File => Slot::File,
            EntryKind::Hardlink => {
                let target = entry.link.clone().unwrap_or_default();
                let file = match self.slots.get(target.as_str()) {
                    Some(Slot::File) => target,
                    _ => {
                        return Err(FormatError::HardlinkTarget {
                            path: path.clone(),
                            target,
                        })
                    }
                };
                resolved = Some(file);
                Slot::Other
            }
            _ => Slot::Other,
        };
        self.slots.insert(entry.path.clone(), slot);
        let mut p = entry.path.as_str();
        while let Some(pos) = p.rfind('/') {
            p = &p[..pos];
            if !self.ancestors.insert(p.to_string()) {
                break; // its ancestors are in the set already
            }
        }
        Ok((Admit::New, resolved))
    }
}

fn dir_meta(e: &Entry) -> DirMeta {
    DirMeta {
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        mtime: e.mtime,
        mtime_nsec: e.mtime_nsec,
        xattrs: e.xattrs.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn normalises() {
        assert_eq!(normalise(b"./a//b/").unwrap(), "a/b");
        assert_eq!(normalise(b"a/./b").unwrap(), "a/b");
        assert_eq!(normalise(b"./").unwrap(), "");
        assert_eq!(normalise(b".").unwrap(), "");
        assert!(matches!(
            normalise(b"/etc/passwd"),
            Err(FormatError::AbsolutePath { .. })
        ));
        assert!(matches!(
            normalise(b"a/../../b"),
            Err(FormatError::DotDotPath { .. })
        ));
        assert!(matches!(
            normalise(b"a/.."),
            Err(FormatError::DotDotPath { .. })
        ));
        assert!(matches!(
            normalise(b""),
            Err(FormatError::InvalidPath { .. })
        ));
        assert!(matches!(
            normalise(b"\xff"),
            Err(FormatError::InvalidPath { .. })
        ));
        assert!(matches!(
            normalise(b"a\0b"),
            Err(FormatError::InvalidPath { .. })
        ));
    }

    #[test]
    fn checks_normal_form() {
        assert!(check_normal("").is_ok());
        assert!(check_normal("a/b").is_ok());
        assert!(check_normal("a/").is_err());
        assert!(check_normal("./a").is_err());
        assert!(check_normal("a//b").is_err());
        let long = "x".repeat(256);
        assert!(check_normal(&"x".repeat(255)).is_ok());
        assert!(check_normal(&format!("a/{long}/b")).is_err());
        assert!(normalise(format!("./{long}").as_bytes()).is_err());
        assert!(matches!(
            check_normal("/a"),
            Err(FormatError::AbsolutePath { .. })
        ));
        assert!(matches!(
            check_normal("a/../b"),
            Err(FormatError::DotDotPath { .. })
        ));
    }
}
