//! Lazy → native: a complete, verified layer written out as a plain directory tree, used as
//! the overlayfs lowerdir of new mounts instead of the layer's FUSE directory (kernel speed:
//! no FUSE round trip per lookup, getxattr or read).
//!
//! When: right after the layer's background fill, once the completion check passed (every
//! frame on disk and verified, the tar stream walked against the TOC, sha256 = the claimed
//! diff_id; see [`super::trust`]). A quarantined or unverified layer never gets a tree. The
//! tree is written from the verified frames in the disk cache only.
//!
//! What: exactly what the FUSE view shows (which is what containerd's overlayfs snapshotter
//! unpacks from the same tar): directories, regular files, symlinks, hardlinks (one inode,
//! every name), device nodes and fifos, whiteouts as character devices 0:0, opaque
//! directories with `trusted.overlay.opaque=y`, owners, modes (setuid/setgid/sticky), xattrs,
//! mtimes (atime = mtime, as FUSE shows them).
//!
//! Untrusted TOC: the tree is walked from the layer root through the inode table, one name
//! at a time; a name that is not one plain path component (empty, `.`, `..`, a `/` or NUL)
//! fails the build. Directories are created by the build itself (never followed through a
//! symlink: the table only puts children under directory nodes) and files with `O_EXCL |
//! O_NOFOLLOW`, so nothing is written outside the tree. The tree lives under the cache
//! directory (0700, root): its setuid files and device nodes are reachable only through
//! overlay mounts, as with containerd's own snapshot directories.
//!
//! Atomic: built in a temp directory of the disk cache (space reserved against
//! `cache.disk_bytes` first), made durable with one `syncfs`, renamed into place (see
//! [`crate::cache::disk::NativeReservation`]). The layer's cached frames and complete-file
//! copies are then dropped (the FUSE view of the layer reads the tree's files from then on),
//! so its bytes are counted once.

use super::inode::NodeKind;
use super::layer::Layer;
use crate::cache::disk::on_disk;
use crate::cache::DiskCache;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use weenv_format::FrameIdx;

/// True if `name` is one plain path component (pure).
pub fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Bytes the tree of `layer` should take on disk (files in 4 KiB blocks, each inode once,
/// 4 KiB per directory and per long symlink). Pure.
pub fn estimate(layer: &Layer) -> u64 {
    let mut total = 0;
    for id in layer.table.ids() {
        let Some(n) = layer.table.node(id) else {
            break;
        };
        total += match n.kind() {
            NodeKind::File => on_disk(n.size()),
            NodeKind::Dir => 4096,
            NodeKind::Symlink if n.size() >= 60 => 4096,
            _ => 0,
        };
    }
    total
}

fn other(msg: String) -> std::io::Error {
    std::io::Error::other(msg)
}

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| other(format!("NUL in {}", p.display())))
}

fn lsetxattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (p, n) = (
        cpath(p)?,
        CString::new(name).map_err(|_| other(format!("NUL in xattr name {name:?}")))?,
    );
    // SAFETY: valid NUL-terminated strings and a live buffer of `value.len()` bytes.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Owner, mode, xattrs and mtime of node `id` onto `path` (in that order: chown clears
/// setuid bits and `security.capability`).
fn apply_meta(layer: &Layer, id: u32, path: &Path) -> std::io::Result<()> {
    let n = layer
        .table
        .node(id)
        .ok_or_else(|| other(format!("node {id} vanished")))?;
    std::os::unix::fs::lchown(path, Some(n.uid()), Some(n.gid()))?;
    if n.kind() != NodeKind::Symlink {
        fs::set_permissions(path, fs::Permissions::from_mode(n.perm() & 0o7777))?;
    }
    for name in n.xattr_names() {
        if let Some(v) = n.xattr(name) {
            lsetxattr(path, name, v)
                .map_err(|e| other(format!("xattr {name} on {}: {e}", path.display())))?;
        }
    }
    let t = nix::sys::time::TimeSpec::new(n.mtime(), i64::from(n.mtime_nsec()));
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &t,
        &t,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}

/// Writes regular file `id` to `path` from its frames in `l2` (pinned while read).
fn write_file(l2: &DiskCache, layer: &Layer, id: u32, path: &Path) -> std::io::Result<()> {
    let n = layer
        .table
        .node(id)
        .ok_or_else(|| other(format!("node {id} vanished")))?;
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)?;
    let mut cur: Option<(FrameIdx, Vec<u8>)> = None;
    for c in &n.chunks() {
        if cur.as_ref().map(|(i, _)| *i) != Some(c.frame) {
            let f = layer
                .frames
                .frames
                .get(c.frame.0 as usize)
                .ok_or_else(|| other(format!("frame {} not in the TOC", c.frame.0)))?;
            let pin = l2
                .pin(&f.digest)
                .ok_or_else(|| other(format!("frame {} is not on disk", c.frame.0)))?;
            let data = fs::read(pin.path())?;
            if data.len() as u64 != f.ulen {
                return Err(other(format!("frame {} has the wrong length", c.frame.0)));
            }
            cur = Some((c.frame, data));
        }
        let data = &cur.as_ref().ok_or_else(|| other("no frame".into()))?.1;
        let s = usize::try_from(c.frame_offset).map_err(|_| other("offset".into()))?;
        let e = s.saturating_add(usize::try_from(c.len).map_err(|_| other("len".into()))?);
        out.write_all(
            data.get(s..e)
                .ok_or_else(|| other("chunk outside its frame".into()))?,
        )?;
    }
    let written = out.metadata()?.len();
    if written != n.size() {
        return Err(other(format!(
            "{}: {written} bytes written, the entry has {}",
            path.display(),
            n.size()
        )));
    }
    Ok(())
}

/// Builds the tree of `layer` under `root` (an empty directory). Returns the number of nodes
/// written. Fails (and the caller drops the partial tree) on any entry it cannot write
/// exactly, so a tree exists only if it equals the FUSE view.
pub fn build(l2: &DiskCache, layer: &Layer, root: &Path) -> std::io::Result<usize> {
    fs::create_dir_all(root)?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o700))?;
    // Directories in creation order; their metadata is applied children first, at the end.
    let mut dirs: Vec<(u32, PathBuf)> = vec![(0, root.to_path_buf())];
    let mut first_name: HashMap<u32, PathBuf> = HashMap::new();
    let mut stack: Vec<(u32, PathBuf)> = vec![(0, root.to_path_buf())];
    let mut count = 1;
    while let Some((dir, dpath)) = stack.pop() {
        let dn = layer
            .table
            .node(dir)
            .ok_or_else(|| other(format!("node {dir} vanished")))?;
        for (name, child) in dn.children() {
            if !safe_name(name) {
                return Err(other(format!("unsafe name {name:?} in the TOC")));
            }
            let path = dpath.join(name);
            let n = layer
                .table
                .node(child)
                .ok_or_else(|| other(format!("node {child} vanished")))?;
            if let Some(first) = first_name.get(&child) {
                fs::hard_link(first, &path)?;
                continue;
            }
            count += 1;
            match n.kind() {
                NodeKind::Dir => {
                    fs::DirBuilder::new().mode(0o700).create(&path)?;
                    dirs.push((child, path.clone()));
                    stack.push((child, path));
                    continue;
                }
                NodeKind::File => write_file(l2, layer, child, &path)?,
                NodeKind::Symlink => {
                    let target = n
                        .link()
                        .ok_or_else(|| other(format!("symlink {name:?} has no target")))?;
                    std::os::unix::fs::symlink(target, &path)?;
                }
                kind @ (NodeKind::Char | NodeKind::Block | NodeKind::Fifo) => {
                    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
                    let t = match kind {
                        NodeKind::Char => SFlag::S_IFCHR,
                        NodeKind::Block => SFlag::S_IFBLK,
                        _ => SFlag::S_IFIFO,
                    };
                    let (major, minor) = n.rdev();
                    mknod(
                        &path,
                        t,
                        Mode::from_bits_truncate(0o600),
                        makedev(major.into(), minor.into()),
                    )
                    .map_err(|e| other(format!("mknod {}: {e}", path.display())))?;
                }
            }
            apply_meta(layer, child, &path)?;
            if n.nlink() > 1 {
                first_name.insert(child, path);
            }
        }
    }
    for (id, path) in dirs.iter().rev() {
        apply_meta(layer, *id, path)?;
    }
    Ok(count)
}

/// Builds the native tree of `layer` in the disk cache: reserve, build, `syncfs`, rename.
/// `Ok(None)` if it does not fit beside the pinned entries (or exists).
pub fn materialise(l2: &DiskCache, layer: &Layer) -> std::io::Result<Option<(PathBuf, usize)>> {
    let Some(r) = l2
        .reserve_native(&layer.digest, estimate(layer))
        .map_err(std::io::Error::other)?
    else {
        return Ok(None);
    };
    let n = build(l2, layer, r.tmp_path())?;
    let dir = File::open(r.tmp_path())?;
    nix::unistd::syncfs(&dir).map_err(std::io::Error::from)?;
    let path = r.commit()?;
    Ok(Some((path, n)))
}

/// Makes `layer` native (after its fill and completion check): builds the tree unless it
/// exists, marks the layer, then drops its complete-file copies and the frames no other
/// lazily served layer uses (its FUSE view now reads the tree). Returns true if the layer is
/// native. Never for a layer that is unverified or quarantined.
pub fn switch(st: &super::ops::FsState, layer: &Layer) -> bool {
    use std::sync::atomic::Ordering;
    if !layer.trust.verified() || layer.quarantined() {
        return false;
    }
    let l2 = st.store.l2();
    if !l2.has_native(&layer.digest) {
        let t = std::time::Instant::now();
        match materialise(l2, layer) {
            Ok(Some((path, n))) => tracing::info!(layer = %layer.digest, nodes = n,
                path = %path.display(), ms = t.elapsed().as_millis() as u64,
                "native tree built; new mounts use it"),
            Ok(None) => {
                tracing::info!(layer = %layer.digest, "no room for a native tree in the disk cache; the layer stays on FUSE");
                return false;
            }
            Err(e) => {
                tracing::warn!(layer = %layer.digest, error = %e, "building the native tree failed; the layer stays on FUSE");
                return false;
            }
        }
    }
    layer.native.store(true, Ordering::Release);
    if layer.quarantined() {
        // Quarantined while it was built: never served from the tree.
        layer.native.store(false, Ordering::Release);
        l2.remove_native(&layer.digest);
        return false;
    }
    st.metrics.native_layers.fetch_add(1, Ordering::Relaxed);
    // Counted once: the tree holds the bytes now.
    l2.remove_layer_files(&layer.digest);
    let keep: std::collections::HashSet<weenv_format::Digest> = st
        .layers
        .read()
        .by_slot
        .iter()
        .flatten()
        .filter(|l| l.digest != layer.digest && !l.native_ok())
        .flat_map(|l| l.frames.frames.iter().map(|f| f.digest.clone()))
        .collect();
    let mut dropped = 0;
    for f in &layer.frames.frames {
        if !keep.contains(&f.digest) && l2.contains(&f.digest) {
            l2.remove(&f.digest);
            dropped += 1;
        }
    }
    tracing::debug!(layer = %layer.digest, frames = dropped, "frames of a native layer dropped from the disk cache");
    true
}

/// The path of node `id` in the native tree at `root` (its first name; pure). `None` for a
/// node without a safe path.
pub fn node_path(layer: &Layer, root: &Path, id: u32) -> Option<PathBuf> {
    let rel = layer.table.path_of(id)?;
    if !rel.split('/').filter(|c| !c.is_empty()).all(safe_name) {
        return None;
    }
    Some(root.join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_components() {
        for ok in ["a", ".a", "..a", "a b", ".wh.x"] {
            assert!(safe_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(!safe_name(bad), "{bad:?}");
        }
    }
}
