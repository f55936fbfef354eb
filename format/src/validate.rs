//! Semantic validation of a decoded TOC, so that everything downstream (FUSE, fetch planning,
//! `read_file`) can trust indices and sizes without re-checking.
//!
//! Rules: the version is current; frames tile `0..toc_offset` exactly, in order, each non-empty
//! and within [`MAX_FRAME_CLEN`]/[`MAX_FRAME_ULEN`]; entry paths are normal, unique, never below
//! a non-directory; hardlinks name an earlier regular file; only regular files have a size and
//! chunks, and their chunks cover `0..size` exactly, in order, each inside its frame; links only
//! on symlinks/hardlinks; `mode <= 0o7777`; `mtime_nsec < 1e9`; no path component over 255
//! bytes.
//!
//! Stream placement (version 2), so every entry names where the tar says what it is: `header`
//! offsets are block aligned and strictly increasing, each header block lies inside the stream;
//! a file's chunks are contiguous in the uncompressed stream from a data start that lies after
//! its header (at most [`MAX_HEADER_SPAN`] bytes after it): `stream(chunk_i) = data_start +
//! file_offset_i`; an entry ends (header block, or data end for files) at or before the next
//! entry's header. What the tar really holds at those offsets is proven by
//! [`crate::tarcheck`].

use crate::frame::{MAX_FRAME_CLEN, MAX_FRAME_ULEN};
use crate::paths::{check_normal, check_symlink_target, check_xattr, Admit, Namespace};
use crate::tar::BLOCK;
use crate::tarcheck::MAX_HEADER_SPAN;
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
        let starts = self.stream_offsets();
        let stream_len = starts.last().copied().unwrap_or(0);
        let mut names = Namespace::new();
        // End of the previous entry (header block or data) and its path.
        let mut prev: Option<(u64, &str)> = None;
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
            let end = self.placement(e, &starts, stream_len, prev)?;
            prev = Some((end, &e.path));
        }
        Ok(())
    }

    /// Check where `e` lies in the stream; returns where it ends.
    fn placement(
        &self,
        e: &Entry,
        starts: &[u64],
        stream_len: u64,
        prev: Option<(u64, &str)>,
    ) -> Result<u64, FormatError> {
        let block = BLOCK as u64;
        if !e.header.is_multiple_of(block) {
            return Err(bad_entry(
                e,
                format!("header offset {} is not on a 512-byte block", e.header),
            ));
        }
        if let Some((prev_end, prev_path)) = prev {
            if e.header < prev_end {
                return Err(bad_entry(
                    e,
                    format!(
                        "header offset {} lies before the end ({prev_end}) of the previous entry {prev_path:?}",
                        e.header
                    ),
                ));
            }
        }
        let header_end = e.header.checked_add(block).filter(|end| *end <= stream_len);
        let Some(header_end) = header_end else {
            return Err(bad_entry(
                e,
                format!(
                    "header offset {} lies past the stream end {stream_len}",
                    e.header
                ),
            ));
        };
        let Some(first) = e.chunks.first() else {
            return Ok(header_end);
        };
        // Chunks are checked against their frames in validate_entry; here only placement.
        let stream = |c: &crate::toc::ChunkRef| {
            starts
                .get(c.frame.0 as usize)
                .filter(|_| (c.frame.0 as usize) < self.frames.len())
                .and_then(|s| s.checked_add(c.frame_offset))
        };
        let data_start = stream(first)
            .and_then(|s| s.checked_sub(first.file_offset))
            .ok_or_else(|| bad_entry(e, "first chunk lies outside the stream"))?;
        if data_start < header_end || data_start - e.header > MAX_HEADER_SPAN {
            return Err(bad_entry(
                e,
                format!(
                    "data starts at stream offset {data_start}, not within {}..={} after its header at {}",
                    block,
                    MAX_HEADER_SPAN,
                    e.header
                ),
            ));
        }
        for c in &e.chunks {
            let expect = data_start.checked_add(c.file_offset);
            if stream(c) != expect {
                return Err(bad_entry(
                    e,
                    format!(
                        "chunk at file offset {} is not where the file's data continues in the stream (stream offset {:?}, expected {:?})",
                        c.file_offset,
                        stream(c),
                        expect
                    ),
                ));
            }
        }
        let data_end = data_start
            .checked_add(e.size)
            .filter(|end| *end <= stream_len)
            .ok_or_else(|| bad_entry(e, format!("data runs past the stream end {stream_len}")))?;
        Ok(data_end)
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
