//! A pure-Rust unified-diff parser and applier (no git, no `patch` binary needed).
//!
//! Parses plain unified diffs and git diffs: `diff --git` headers, `---`/`+++`, hunks with
//! context, `\ No newline at end of file`, new files (`/dev/null`, `new file mode`),
//! deletions (`deleted file mode`), mode changes (`old mode`/`new mode`), renames
//! (`rename from`/`rename to`), symlinks (mode 120000). Binary patches and copies are
//! rejected as unsupported.
//!
//! Matching is exact (no fuzz): each hunk's old lines must match byte for byte; like
//! `patch -F0`, the hunk may be found at an offset from its stated line, searched outwards,
//! never before the end of the previous hunk. Applying is all-or-nothing: every hunk of every
//! file is checked in memory first; only then are files written, through the small
//! [`PatchTarget`] trait ([`MemTree`] in memory, [`DirTarget`] on a directory).

use std::collections::BTreeMap;
use std::io;
use thiserror::Error;

mod parse;
mod target;

pub use parse::parse_patch;
pub use target::{DirTarget, MemTree};

/// git mode of a regular file.
pub const MODE_FILE: u32 = 0o100644;
/// git mode of an executable file.
pub const MODE_EXEC: u32 = 0o100755;
/// git mode of a symlink (content = link target).
pub const MODE_SYMLINK: u32 = 0o120000;

/// Errors from parsing or applying a patch.
#[derive(Debug, Error)]
pub enum PatchError {
    #[error("patch line {line}: {reason}")]
    Parse { line: usize, reason: String },
    #[error("{file}: hunk #{hunk} (at line {line}) rejected: {reason}")]
    Rejected {
        file: String,
        hunk: usize,
        line: usize,
        reason: String,
    },
    #[error("{file}: file to patch does not exist")]
    Missing { file: String },
    #[error("{file}: file to create already exists")]
    Exists { file: String },
    #[error("{file}: unsupported patch feature: {what}")]
    Unsupported { file: String, what: String },
    #[error("unsafe path {path:?} in patch: {reason}")]
    UnsafePath { path: String, reason: String },
    #[error("{op} {path}: {source}")]
    Io {
        path: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

/// A parsed patch: file sections in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    pub files: Vec<FilePatch>,
}

/// The change to one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilePatch {
    /// Path before (None: the file is created).
    pub old_path: Option<String>,
    /// Path after (None: the file is deleted).
    pub new_path: Option<String>,
    pub old_mode: Option<u32>,
    pub new_mode: Option<u32>,
    pub hunks: Vec<Hunk>,
}

impl FilePatch {
    /// The path to name in messages.
    pub fn display_path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or("<unknown>")
    }
}

/// Kind of a hunk line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    Context,
    Remove,
    Add,
}

/// One hunk. Line bytes include their `\n` unless marked "No newline at end of file".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hunk {
    pub old_start: usize,
    pub old_len: usize,
    pub new_start: usize,
    pub new_len: usize,
    pub lines: Vec<(LineKind, Vec<u8>)>,
}

/// A file as seen by the applier. `mode` is a git-style mode ([`MODE_FILE`], [`MODE_EXEC`],
/// [`MODE_SYMLINK`], or `0o100000 | perms`); for symlinks `data` is the link target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileState {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Where a patch is applied. Paths are relative, `/`-separated, already validated.
pub trait PatchTarget {
    /// The file at `path`, or None if it does not exist.
    fn read(&self, path: &str) -> io::Result<Option<FileState>>;
    /// Create or replace the file at `path` (creating parent directories).
    fn write(&mut self, path: &str, file: &FileState) -> io::Result<()>;
    /// Remove the file at `path`.
    fn delete(&mut self, path: &str) -> io::Result<()>;
    /// Change only the mode of the file at `path`.
    fn set_mode(&mut self, path: &str, mode: u32) -> io::Result<()>;
}

/// What an apply changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Final state of every written (created, modified, renamed-to, mode-changed) path.
    pub written: BTreeMap<String, FileState>,
    /// Paths removed (deleted or renamed away).
    pub deleted: Vec<String>,
}

#[derive(Clone, Debug)]
enum Staged {
    Write {
        file: FileState,
        content_changed: bool,
    },
    Delete,
}

/// Parse `text` (stripping `strip` leading components) and apply it to `target`.
pub fn apply_bytes(
    text: &[u8],
    strip: u32,
    target: &mut dyn PatchTarget,
) -> Result<ApplyReport, PatchError> {
    let patch = parse_patch(text, strip)?;
    apply(&patch, target)
}

/// Apply `patch` to `target`, all-or-nothing with respect to hunks: nothing is written unless
/// every hunk of every file applies.
pub fn apply(patch: &Patch, target: &mut dyn PatchTarget) -> Result<ApplyReport, PatchError> {
    // Phase 1: compute every final state in memory.
    let mut staged: Vec<(String, Staged)> = Vec::new();
    for fp in &patch.files {
        stage_file(fp, &*target, &mut staged)?;
    }
    // Phase 2: write.
    let mut report = ApplyReport::default();
    for (path, s) in staged {
        let io_err = |op: &'static str| {
            let path = path.clone();
            move |source| PatchError::Io { path, op, source }
        };
        match s {
            Staged::Delete => {
                target.delete(&path).map_err(io_err("delete"))?;
                report.written.remove(&path);
                report.deleted.push(path);
            }
            Staged::Write {
                file,
                content_changed,
            } => {
                if content_changed {
                    target.write(&path, &file).map_err(io_err("write"))?;
                } else {
                    target.set_mode(&path, file.mode).map_err(io_err("chmod"))?;
                }
                report.deleted.retain(|d| d != &path);
                report.written.insert(path, file);
            }
        }
    }
    Ok(report)
}

fn current(
    path: &str,
    target: &dyn PatchTarget,
    staged: &[(String, Staged)],
) -> Result<Option<FileState>, PatchError> {
    if let Some((_, s)) = staged.iter().rev().find(|(p, _)| p == path) {
        return Ok(match s {
            Staged::Write { file, .. } => Some(file.clone()),
            Staged::Delete => None,
        });
    }
    target.read(path).map_err(|source| PatchError::Io {
        path: path.to_string(),
        op: "read",
        source,
    })
}

fn stage_file(
    fp: &FilePatch,
    target: &dyn PatchTarget,
    staged: &mut Vec<(String, Staged)>,
) -> Result<(), PatchError> {
    let file = fp.display_path().to_string();
    let old = match &fp.old_path {
        Some(p) => Some(
            current(p, target, staged)?.ok_or_else(|| PatchError::Missing { file: p.clone() })?,
        ),
        None => None,
    };
    let old_data = old.as_ref().map(|f| f.data.as_slice()).unwrap_or(&[]);
    let new_data = apply_hunks(&file, old_data, &fp.hunks)?;
    match (&fp.old_path, &fp.new_path) {
        (None, None) => Err(PatchError::Parse {
            line: 0,
            reason: format!("{file}: both sides are /dev/null"),
        }),
        (Some(p), None) => {
            if !new_data.is_empty() {
                return Err(PatchError::Rejected {
                    file,
                    hunk: fp.hunks.len(),
                    line: 0,
                    reason: "file to delete has more content than the patch removes".into(),
                });
            }
            staged.push((p.clone(), Staged::Delete));
            Ok(())
        }
        (old_path, Some(np)) => {
            if old_path.as_deref() != Some(np.as_str()) && current(np, target, staged)?.is_some() {
                return Err(PatchError::Exists { file: np.clone() });
            }
            let mode = fp
                .new_mode
                .or(old.as_ref().map(|o| o.mode))
                .unwrap_or(MODE_FILE);
            let content_changed = old.as_ref().map(|o| o.data != new_data).unwrap_or(true)
                || old_path.as_deref() != Some(np.as_str())
                || old
                    .as_ref()
                    .map(|o| is_symlink(o.mode) != is_symlink(mode))
                    .unwrap_or(true);
            if let Some(op) = old_path.as_ref().filter(|op| *op != np) {
                staged.push((op.clone(), Staged::Delete));
            }
            staged.push((
                np.clone(),
                Staged::Write {
                    file: FileState {
                        data: new_data,
                        mode,
                    },
                    content_changed,
                },
            ));
            Ok(())
        }
    }
}

/// Whether a git mode denotes a symlink.
pub fn is_symlink(mode: u32) -> bool {
    mode & 0o170000 == MODE_SYMLINK
}

/// Split into lines, each keeping its `\n` (the last one may lack it).
pub fn split_lines(data: &[u8]) -> Vec<&[u8]> {
    data.split_inclusive(|b| *b == b'\n').collect()
}

/// Apply hunks to one file's content (exact match, offset search, no fuzz).
pub fn apply_hunks(file: &str, content: &[u8], hunks: &[Hunk]) -> Result<Vec<u8>, PatchError> {
    let lines = split_lines(content);
    let mut out: Vec<u8> = Vec::with_capacity(content.len());
    let mut pos = 0usize; // first line not yet copied
    let mut offset: isize = 0;
    for (i, h) in hunks.iter().enumerate() {
        let old: Vec<&[u8]> = h
            .lines
            .iter()
            .filter(|(k, _)| *k != LineKind::Add)
            .map(|(_, l)| l.as_slice())
            .collect();
        let stated = if h.old_len == 0 {
            h.old_start
        } else {
            h.old_start.saturating_sub(1)
        };
        let expected = (stated as isize + offset).max(pos as isize) as usize;
        let at = find_match(&lines, &old, expected, pos).ok_or_else(|| PatchError::Rejected {
            file: file.to_string(),
            hunk: i + 1,
            line: h.old_start,
            reason: if lines.len() < pos + old.len() {
                format!(
                    "file has {} lines, hunk needs {} more after line {pos}",
                    lines.len(),
                    old.len()
                )
            } else {
                "context or removed lines do not match the file (no fuzz is applied)".into()
            },
        })?;
        for l in &lines[pos..at] {
            out.extend_from_slice(l);
        }
        for (k, l) in &h.lines {
            if *k != LineKind::Remove {
                out.extend_from_slice(l);
            }
        }
        pos = at + old.len();
        offset = at as isize - stated as isize;
    }
    for l in &lines[pos..] {
        out.extend_from_slice(l);
    }
    Ok(out)
}

/// First index `at >= min` nearest to `expected` where `old` matches `lines` exactly.
fn find_match(lines: &[&[u8]], old: &[&[u8]], expected: usize, min: usize) -> Option<usize> {
    let last = lines.len().checked_sub(old.len())?;
    if min > last {
        return None;
    }
    let matches = |at: usize| lines[at..at + old.len()] == *old;
    let expected = expected.clamp(min, last);
    for d in 0..=(last - min) {
        if let Some(a) = expected.checked_add(d).filter(|a| *a <= last) {
            if matches(a) {
                return Some(a);
            }
        }
        if let Some(b) = expected.checked_sub(d).filter(|b| *b >= min) {
            if d > 0 && matches(b) {
                return Some(b);
            }
        }
        if expected + d > last && expected.saturating_sub(d) <= min {
            break;
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
