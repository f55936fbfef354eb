//! Proof that a TOC tells the truth about the tar stream in the same blob.
//!
//! The TOC is what the lazy mount serves; the tar stream (the frames, decompressed in order) is
//! what stock containerd and every image scanner see. Both checks here parse the tar with the
//! one parser of this crate ([`crate::tar::TarParser`]) and compare field by field:
//!
//! - [`check_entry_header`]: one entry, from the bytes at its `header` offset. Proves that the
//!   tar has, at that offset, an entry with this path, type, mode (setuid/setgid/sticky
//!   included), uid/gid, device numbers, size, link target, xattrs and mtime, and returns the
//!   length of its header blocks (so `header + span` is where a file's payload starts; compare
//!   it with [`Toc::data_start`], or call [`check_entry`] which does both). It cannot see what
//!   lies between entries (an entry the TOC leaves out); that is the stream check's job.
//!   Hardlinks name an earlier regular file (chains are refused), so the link compares literally.
//! - [`StreamChecker`]: the whole stream. Proves every TOC entry equals the tar entry at its
//!   position (all fields above, header offsets, and content mapping: every chunk names exactly
//!   the stream bytes of the file's payload), that no tar entry is missing from the TOC and
//!   none is extra, that the stream length is the TOC's, and computes the diff_id.
//!
//! Any difference is `FormatError::TocMismatch` (entry, field, both values) or
//! `FormatError::StreamMismatch`; tar parse errors are returned as they are.

use crate::tar::{TarParser, TarSink, BLOCK, MAX_EXTENSION_SIZE};
use crate::toc::{Entry, EntryKind, Toc};
use crate::{Digest, FormatError};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;

/// Longest run of header blocks one entry can have: a PAX `x`, a GNU `L` and a GNU `K` header
/// (one of each at most, each at most [`MAX_EXTENSION_SIZE`] plus its header block), then the
/// entry's own header block.
pub const MAX_HEADER_SPAN: u64 = 3 * (BLOCK as u64 + MAX_EXTENSION_SIZE) + BLOCK as u64;

/// What a successful [`StreamChecker::finish`] proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReport {
    /// sha256 of the uncompressed stream.
    pub diff_id: Digest,
    /// Stream length.
    pub bytes: u64,
    /// Entries compared.
    pub entries: u64,
}

fn mismatch(path: &str, field: &'static str, toc: String, tar: String) -> FormatError {
    FormatError::TocMismatch {
        path: path.to_string(),
        field,
        toc,
        tar,
    }
}

fn show_xattrs(x: &BTreeMap<String, Vec<u8>>) -> String {
    let items: Vec<String> = x
        .iter()
        .map(|(k, v)| format!("{k}={:?}", String::from_utf8_lossy(v)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

/// Compare every field a tar header determines (not chunks). `tar` is what the parser made
/// of the header blocks at `toc.header`.
fn compare(toc: &Entry, tar: &Entry) -> Result<(), FormatError> {
    type Show = fn(&Entry) -> String;
    // (field, differs, how a side is shown), in the order the first difference is reported.
    let fields: [(&'static str, bool, Show); 13] = [
        ("path", toc.path != tar.path, |e| format!("{:?}", e.path)),
        ("header offset", toc.header != tar.header, |e| {
            e.header.to_string()
        }),
        ("type", toc.kind != tar.kind, |e| format!("{:?}", e.kind)),
        ("mode", toc.mode != tar.mode, |e| format!("{:#o}", e.mode)),
        ("uid", toc.uid != tar.uid, |e| e.uid.to_string()),
        ("gid", toc.gid != tar.gid, |e| e.gid.to_string()),
        ("devmajor", toc.devmajor != tar.devmajor, |e| {
            e.devmajor.to_string()
        }),
        ("devminor", toc.devminor != tar.devminor, |e| {
            e.devminor.to_string()
        }),
        ("size", toc.size != tar.size, |e| e.size.to_string()),
        ("mtime_nsec", toc.mtime_nsec != tar.mtime_nsec, |e| {
            e.mtime_nsec.to_string()
        }),
        ("mtime", toc.mtime != tar.mtime, |e| e.mtime.to_string()),
        ("link target", toc.link != tar.link, |e| {
            format!("{:?}", e.link)
        }),
        ("xattrs", toc.xattrs != tar.xattrs, |e| {
            show_xattrs(&e.xattrs)
        }),
    ];
    match fields.into_iter().find(|(_, differs, _)| *differs) {
        Some((field, _, show)) => Err(mismatch(&toc.path, field, show(toc), show(tar))),
        None => Ok(()),
    }
}

/// A sink that keeps the first entry reported.
#[derive(Default)]
struct First {
    entry: Option<Entry>,
}

impl TarSink for First {
    fn meta(&mut self, _: &[u8]) -> Result<(), FormatError> {
        Ok(())
    }
    fn entry(&mut self, entry: Entry) -> Result<(), FormatError> {
        self.entry.get_or_insert(entry);
        Ok(())
    }
    fn payload(&mut self, _: &[u8]) -> Result<(), FormatError> {
        Ok(())
    }
}

/// Check `entry` against the tar header blocks in `bytes`, which must be the uncompressed
/// stream starting at `entry.header` (at least up to the entry's data start for files; up to
/// [`MAX_HEADER_SPAN`] bytes or the stream end otherwise). Returns the length of the entry's
/// header blocks. Too few bytes give `TruncatedTar` (read more and retry); any difference gives
/// `TocMismatch`. For files the caller must also check that `entry.header + span` is where
/// chunk 0 says the payload starts ([`check_entry`] does).
pub fn check_entry_header(entry: &Entry, bytes: &[u8]) -> Result<u64, FormatError> {
    if entry.header.checked_add(bytes.len() as u64).is_none() {
        return Err(mismatch(
            &entry.path,
            "header offset",
            entry.header.to_string(),
            "beyond any stream".into(),
        ));
    }
    let mut parser = TarParser::isolated_at(entry.header);
    let mut first = First::default();
    let mut used = 0;
    while used < bytes.len() && first.entry.is_none() && !parser.at_end() {
        let (n, _) = parser.push_until_entry(&bytes[used..], &mut first)?;
        used += n;
    }
    let Some(tar) = first.entry else {
        if parser.at_end() {
            return Err(mismatch(
                &entry.path,
                "header",
                format!("an entry at stream offset {}", entry.header),
                "the end-of-archive block".into(),
            ));
        }
        return Err(FormatError::TruncatedTar {
            offset: parser.offset(),
            what: "the entry's header blocks (pass more bytes)",
        });
    };
    compare(entry, &tar)?;
    Ok(used as u64)
}

/// [`check_entry_header`] plus, for files with data, that the payload starts where the TOC's
/// chunk 0 says it does.
pub fn check_entry(toc: &Toc, entry: &Entry, bytes: &[u8]) -> Result<u64, FormatError> {
    let span = check_entry_header(entry, bytes)?;
    if entry.kind == EntryKind::File && !entry.chunks.is_empty() {
        let tar = entry.header.saturating_add(span);
        let toc_start = toc.data_start(entry);
        if toc_start != Some(tar) {
            return Err(mismatch(
                &entry.path,
                "data start",
                toc_start.map_or_else(|| "missing".into(), |s| s.to_string()),
                tar.to_string(),
            ));
        }
    }
    Ok(span)
}

/// The sink of [`StreamChecker`]: compares each reported tar entry with the next TOC entry.
struct CheckSink<'t> {
    toc: &'t Toc,
    /// Stream offset of each frame, and the stream length last.
    starts: Vec<u64>,
    next: usize,
    offset: u64,
    hash: Sha256,
}

impl CheckSink<'_> {
    fn content(&self, e: &Entry) -> Result<(), FormatError> {
        let data_start = self.offset;
        let mut at = 0u64;
        for c in &e.chunks {
            let frame = self.toc.frame(c.frame);
            let stream = frame
                .filter(|f| {
                    c.frame_offset
                        .checked_add(c.len)
                        .is_some_and(|end| end <= f.ulen)
                })
                .and_then(|_| self.starts.get(c.frame.0 as usize))
                .and_then(|s| s.checked_add(c.frame_offset));
            let expect = data_start + at;
            if c.file_offset != at || stream != Some(expect) {
                return Err(mismatch(
                    &e.path,
                    "content mapping",
                    format!(
                        "file bytes {}..+{} at stream offset {}",
                        c.file_offset,
                        c.len,
                        stream.map_or_else(|| "outside the stream".into(), |s| s.to_string())
                    ),
                    format!("file bytes {at}.. at stream offset {expect}"),
                ));
            }
            at = at.saturating_add(c.len);
        }
        if at != e.size {
            return Err(mismatch(
                &e.path,
                "content mapping",
                format!("chunks covering {at} bytes"),
                format!("{} bytes of payload", e.size),
            ));
        }
        Ok(())
    }
}

impl TarSink for CheckSink<'_> {
    fn meta(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        self.hash.update(bytes);
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn entry(&mut self, tar: Entry) -> Result<(), FormatError> {
        let Some(toc) = self.toc.entries.get(self.next) else {
            return Err(mismatch(
                &tar.path,
                "presence",
                "no entry".into(),
                format!("an entry ({:?}) at stream offset {}", tar.kind, tar.header),
            ));
        };
        if toc.path != tar.path {
            // Name the side that has an entry the other lacks when the paths disagree.
            let in_toc_later = self.toc.entries[self.next..]
                .iter()
                .any(|e| e.path == tar.path);
            return Err(if in_toc_later {
                mismatch(
                    &toc.path,
                    "presence",
                    format!("an entry ({:?}) at stream offset {}", toc.kind, toc.header),
                    format!("no entry (the tar has {:?} there)", tar.path),
                )
            } else {
                mismatch(
                    &tar.path,
                    "presence",
                    format!("no entry (the TOC has {:?} there)", toc.path),
                    format!("an entry ({:?}) at stream offset {}", tar.kind, tar.header),
                )
            });
        }
        compare(toc, &tar)?;
        if toc.kind == EntryKind::File {
            self.content(toc)?;
        }
        self.next += 1;
        Ok(())
    }

    fn payload(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        self.meta(bytes)
    }
}

/// Checks a whole tar stream against a TOC; see the module docs. Feed the uncompressed stream
/// in order with [`StreamChecker::update`] (pieces of any size), then call
/// [`StreamChecker::finish`]. Memory: one header/extension block plus the hash state.
pub struct StreamChecker<'t> {
    parser: TarParser,
    sink: CheckSink<'t>,
    error: Option<FormatError>,
}

impl<'t> StreamChecker<'t> {
    pub fn new(toc: &'t Toc) -> Self {
        StreamChecker {
            parser: TarParser::new(),
            sink: CheckSink {
                toc,
                starts: toc.stream_offsets(),
                next: 0,
                offset: 0,
                hash: Sha256::new(),
            },
            error: None,
        }
    }

    /// Feed the next bytes of the stream. After the first difference further input is ignored
    /// (see [`StreamChecker::error`]); [`StreamChecker::finish`] returns it.
    pub fn update(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.parser.push(bytes, &mut self.sink) {
                self.error = Some(e);
            }
        }
    }

    /// The first difference found so far, if any (to stop feeding early).
    pub fn error(&self) -> Option<&FormatError> {
        self.error.as_ref()
    }

    /// Bytes fed so far.
    pub fn position(&self) -> u64 {
        self.sink.offset
    }

    /// End of the stream: the remaining checks (no TOC entry left over, stream length).
    pub fn finish(mut self) -> Result<StreamReport, FormatError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.parser.finish(&mut self.sink)?;
        let s = self.sink;
        if let Some(e) = s.toc.entries.get(s.next) {
            return Err(mismatch(
                &e.path,
                "presence",
                format!("an entry ({:?}) at stream offset {}", e.kind, e.header),
                "no entry".into(),
            ));
        }
        let toc_len = s.starts.last().copied().unwrap_or(0);
        if s.offset != toc_len {
            return Err(FormatError::StreamMismatch {
                what: "stream length",
                toc: toc_len.to_string(),
                tar: s.offset.to_string(),
            });
        }
        Ok(StreamReport {
            diff_id: Digest::from_sha256_bytes(&s.hash.finalize().into()),
            bytes: s.offset,
            entries: s.next as u64,
        })
    }
}
