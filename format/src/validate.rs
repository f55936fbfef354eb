//! Semantic validation of a decoded TOC, so that everything downstream (FUSE, fetch planning,
//! `read_file`) can trust indices and sizes without re-checking.
//!
//! Rules: the version is current; frames tile `0..toc_offset` exactly, in order, each non-empty
//! and within [`MAX_FRAME_CLEN`]/[`MAX_FRAME_ULEN`]; entry paths are normal, unique, never below
//! a non-directory; hardlinks name an earlier regular file; only regular files have a size and
//! chunks, and their chunks cover `0..size` exactly, in order, each inside its frame; links only
//! on symlinks/hardlinks; `mode <= 0o7777`; `mtime_nsec < 1e9`.

use crate::frame::{MAX_FRAME_CLEN, MAX_FRAME_ULEN};
use crate::paths::{check_normal, check_symlink_target, check_xattr, Admit, Namespace};
use crate::toc::{Entry, EntryKind, Toc};
use crate::{FormatError, FORMAT_VERSION};

fn bad_entry(e: &Entry, reason: impl Into<String>) -> FormatError {
    FormatError::EntryLayout {
        path: e.path.clone(),
        reason: reason.into(),
    }
}

impl Toc {
    /// Validate this TOC for a blob whose TOC frame starts at `toc_offset`.
    pub fn validate(&self, toc_offset: u64) -> Result<(), FormatError> {
        if self.version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                version: self.version,
                supported: FORMAT_VERSION,
            });
        }
        if self.frames.len() > u32::MAX as usize {
            return Err(FormatError::AbsurdSize {
                what: "frame count",
                value: self.frames.len() as u64,
                limit: u32::MAX.into(),
            });
        }
        let mut at: u64 = 0;
        for (i, f) in self.frames.iter().enumerate() {
            let bad = |reason: String| FormatError::FrameLayout {
                frame: i as u64,
                reason,
            };
            if f.offset != at {
                return Err(bad(format!("starts at {}, expected {at}", f.offset)));
            }
            if f.clen == 0 || f.ulen == 0 {
                return Err(bad("empty frame".into()));
            }
            if f.clen > MAX_FRAME_CLEN {
                return Err(FormatError::AbsurdSize {
                    what: "compressed frame length",
                    value: f.clen,
                    limit: MAX_FRAME_CLEN,
                });
            }
            if f.ulen > MAX_FRAME_ULEN {
                return Err(FormatError::AbsurdSize {
                    what: "uncompressed frame length",
                    value: f.ulen,
                    limit: MAX_FRAME_ULEN,
                });
            }
            at = at
                .checked_add(f.clen)
                .filter(|end| *end <= toc_offset)
                .ok_or_else(|| bad(format!("ends past the TOC at {toc_offset}")))?;
        }
        if at != toc_offset {
            return Err(FormatError::FrameLayout {
                frame: self.frames.len() as u64,
                reason: format!("frames end at {at} but the TOC starts at {toc_offset}"),
            });
        }
        let mut names = Namespace::new();
        for e in &self.entries {
            check_normal(&e.path)?;
            let (admit, resolved) = names.admit(e)?;
            if admit == Admit::RepeatedDir {
                return Err(FormatError::DuplicatePath {
                    path: e.path.clone(),
                });
            }
            if e.kind == EntryKind::Hardlink && resolved != e.link {
                return Err(FormatError::HardlinkTarget {
                    path: e.path.clone(),
                    target: e.link.clone().unwrap_or_default(),
                });
            }
            self.validate_entry(e)?;
        }
        Ok(())
    }

    fn validate_entry(&self, e: &Entry) -> Result<(), FormatError> {
        if e.mode > 0o7777 {
            return Err(bad_entry(
                e,
                format!("mode {:o} has file-type bits", e.mode),
            ));
        }
        if e.mtime_nsec >= 1_000_000_000 {
            return Err(bad_entry(e, "mtime_nsec out of range"));
        }
        for (name, value) in &e.xattrs {
            check_xattr(name, value).map_err(|r| bad_entry(e, r))?;
        }
        match (e.kind, &e.link) {
            (EntryKind::Symlink, Some(l)) => {
                check_symlink_target(l).map_err(|r| bad_entry(e, r))?
            }
            (EntryKind::Symlink, None) => return Err(bad_entry(e, "symlink without a target")),
            (EntryKind::Hardlink, Some(_)) => {}
            (EntryKind::Hardlink, None) => return Err(bad_entry(e, "hardlink without a target")),
            (_, Some(_)) => return Err(bad_entry(e, "link target on a non-link entry")),
            (_, None) => {}
        }
        if e.kind != EntryKind::File {
            if e.size != 0 || !e.chunks.is_empty() {
                return Err(bad_entry(e, "only regular files may have a size or chunks"));
            }
            return Ok(());
        }
        let mut at: u64 = 0;
        for c in &e.chunks {
            if c.file_offset != at {
                return Err(bad_entry(
                    e,
                    format!("chunk at file offset {} expected at {at}", c.file_offset),
                ));
            }
            if c.len == 0 {
                return Err(bad_entry(e, "empty chunk"));
            }
            let frame = self.frame(c.frame).ok_or_else(|| {
                bad_entry(e, format!("chunk refers to missing frame {}", c.frame.0))
            })?;
            let end = c.frame_offset.checked_add(c.len);
            if !matches!(end, Some(end) if end <= frame.ulen) {
                return Err(bad_entry(
                    e,
                    format!(
                        "chunk {}+{} exceeds frame {} of {} bytes",
                        c.frame_offset, c.len, c.frame.0, frame.ulen
                    ),
                ));
            }
            at = at.saturating_add(c.len);
        }
        if at != e.size {
            return Err(bad_entry(
                e,
                format!("chunks cover {at} bytes, size is {}", e.size),
            ));
        }
        Ok(())
    }
}
