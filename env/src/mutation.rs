//! Pre-applied per-task mutation (pure): read only the files a patch touches from a base
//! group's weenv layers (range reads through the TOC, a union view with whiteouts, opaque
//! directories and non-directories shadowing a path's ancestors), apply the patch in memory
//! ([`MemTree`]), and emit a tiny tar holding only the changed/new files and `.wh.` whiteouts
//! for deletions (renames = whiteout + new file).
//!
//! The same patch applied at init into a container rootfs (`weenv_converter::mutate`) gives
//! the identical tree; the converter's tests check both ways against each other.
//! Paths of the patch are relative to the mutation root (default `/`).

use crate::patch::{
    apply, is_symlink, ApplyReport, FileState, MemTree, Patch, PatchError, MODE_SYMLINK,
};
use std::collections::BTreeSet;
use thiserror::Error;
use weenv_format::reader::LayerReader;
use weenv_format::{Entry, EntryKind, FormatError, RangeRead};

/// Errors of building a mutation layer.
#[derive(Debug, Error)]
pub enum MutationError {
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error("reading {path} from the base group: {error}")]
    Layer { path: String, error: FormatError },
    #[error("{path} in the base group is a {kind:?}, not a file the patch can change")]
    NotAFile { path: String, kind: EntryKind },
    #[error("building the mutation layer: {0}")]
    Tar(std::io::Error),
}

/// Join the mutation root and a patch path into a layer path (`src/repo/x.py`).
fn layer_path(root: &str, p: &str) -> String {
    let r = root.trim_matches('/');
    if r.is_empty() {
        p.to_string()
    } else {
        format!("{r}/{p}")
    }
}

/// Union lookup over layers (bottom→top) honouring whiteouts, opaque dirs and
/// non-directories shadowing a path's ancestors. Returns the layer index and entry.
pub fn union_lookup<'a, R: RangeRead>(
    layers: &'a [LayerReader<R>],
    path: &str,
) -> Option<(usize, &'a Entry)> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, l) in layers.iter().enumerate().rev() {
        if let Some(e) = l.entry(path) {
            return Some((i, e));
        }
        for k in 1..=comps.len() {
            let parent = comps[..k - 1].join("/");
            let wh = if parent.is_empty() {
                format!(".wh.{}", comps[k - 1])
            } else {
                format!("{parent}/.wh.{}", comps[k - 1])
            };
            if l.entry(&wh).is_some() {
                return None;
            }
            if k < comps.len() {
                let dir = comps[..k].join("/");
                if l.entry(&format!("{dir}/.wh..wh..opq")).is_some() {
                    return None;
                }
                if l.entry(&dir).is_some_and(|e| e.kind != EntryKind::Dir) {
                    return None;
                }
            }
        }
    }
    None
}

fn read_union<R: RangeRead>(
    layers: &[LayerReader<R>],
    lp: &str,
) -> Result<Option<(FileState, Entry)>, MutationError> {
    let Some((i, e)) = union_lookup(layers, lp) else {
        return Ok(None);
    };
    let state = match e.kind {
        EntryKind::File | EntryKind::Hardlink => {
            let data =
                layers[i]
                    .read_file(lp, 0, u64::MAX)
                    .map_err(|source| MutationError::Layer {
                        path: lp.to_string(),
                        error: source,
                    })?;
            FileState {
                data,
                mode: 0o100000 | (e.mode & 0o7777),
            }
        }
        EntryKind::Symlink => FileState {
            data: e.link.clone().unwrap_or_default().into_bytes(),
            mode: MODE_SYMLINK,
        },
        kind => {
            return Err(MutationError::NotAFile {
                path: lp.to_string(),
                kind,
            })
        }
    };
    Ok(Some((state, e.clone())))
}

/// Build the tree the patch needs: every file it reads, from the base group.
fn base_tree<R: RangeRead>(
    layers: &[LayerReader<R>],
    root: &str,
    patch: &Patch,
) -> Result<MemTree, MutationError> {
    let mut tree = MemTree::default();
    for fp in &patch.files {
        for p in [&fp.old_path, &fp.new_path].into_iter().flatten() {
            if let Some((s, _)) = read_union(layers, &layer_path(root, p))? {
                tree.files.insert(p.clone(), s);
            }
        }
    }
    Ok(tree)
}

/// What a mutation layer holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MutationSummary {
    /// Layer paths written (changed, new, renamed-to, mode-changed).
    pub written: Vec<String>,
    /// Layer paths whited out.
    pub deleted: Vec<String>,
}

/// Apply `patch` to the base group's files (read through `layers`, bottom→top) and return an
/// uncompressed tar holding only the changes: files with their final content and mode (owner
/// kept from the base; mtime = base mtime + 1 so compiled-bytecode caches notice), parent
/// directories that the base lacks, and `.wh.` whiteouts for removed paths.
pub fn build_mutation_tar<R: RangeRead>(
    layers: &[LayerReader<R>],
    patch: &Patch,
    root: &str,
) -> Result<(Vec<u8>, MutationSummary), MutationError> {
    let mut tree = base_tree(layers, root, patch)?;
    let report: ApplyReport = apply(patch, &mut tree)?;
    let mut b = tar::Builder::new(Vec::new());
    let mut summary = MutationSummary::default();
    let mut dirs_added = BTreeSet::new();
    let tar_err = MutationError::Tar;
    let mut add_parents = |b: &mut tar::Builder<Vec<u8>>, lp: &str| -> Result<(), MutationError> {
        let comps: Vec<&str> = lp.split('/').collect();
        for k in 1..comps.len() {
            let dir = comps[..k].join("/");
            if dirs_added.contains(&dir) || union_lookup(layers, &dir).is_some() {
                continue;
            }
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, format!("{dir}/"), std::io::empty())
                .map_err(tar_err)?;
            dirs_added.insert(dir);
        }
        Ok(())
    };
    for p in &report.deleted {
        let lp = layer_path(root, p);
        let (parent, name) = match lp.rsplit_once('/') {
            Some((d, n)) => (format!("{d}/"), n.to_string()),
            None => (String::new(), lp.clone()),
        };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        b.append_data(&mut h, format!("{parent}.wh.{name}"), std::io::empty())
            .map_err(tar_err)?;
        summary.deleted.push(lp);
    }
    for (p, f) in &report.written {
        let lp = layer_path(root, p);
        add_parents(&mut b, &lp)?;
        let base = union_lookup(layers, &lp).map(|(_, e)| e);
        let mut h = tar::Header::new_gnu();
        h.set_uid(base.map(|e| u64::from(e.uid)).unwrap_or(0));
        h.set_gid(base.map(|e| u64::from(e.gid)).unwrap_or(0));
        h.set_mtime(base.map(|e| e.mtime.max(0) as u64 + 1).unwrap_or(0));
        if is_symlink(f.mode) {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            let target = String::from_utf8_lossy(&f.data).into_owned();
            b.append_link(&mut h, &lp, target).map_err(tar_err)?;
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(f.mode & 0o7777);
            h.set_size(f.data.len() as u64);
            b.append_data(&mut h, &lp, &f.data[..]).map_err(tar_err)?;
        }
        summary.written.push(lp);
    }
    let tar = b.into_inner().map_err(MutationError::Tar)?;
    Ok((tar, summary))
}
