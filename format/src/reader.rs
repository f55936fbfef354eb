//! Locate, verify and decode the TOC of a weenv blob over a [`RangeRead`], and read files.
//!
//! With a [`TocHint`] (from the layer descriptor's annotations) opening costs exactly one
//! `read_at` (TOC frame + footer) and no `size()`; the TOC is verified against the hint's
//! digest (which the signed manifest covers) and against the footer. Without a hint: one
//! `size()` and one speculative tail read of [`SPECULATIVE_TAIL`] bytes (or the whole blob if
//! smaller), plus one more read only if the TOC frame is larger than that.

use crate::footer::{toc_payload, Footer, FOOTER_SIZE, SKIPPABLE_HEADER};
use crate::frame::decode_frame;
use crate::toc::{Entry, EntryKind, FrameIdx, Toc, MAX_TOC_COMPRESSED};
use crate::writer::LayerSummary;
use crate::{
    Digest, FormatError, RangeRead, ANNOTATION_FORMAT_VERSION, ANNOTATION_TOC_DIGEST,
    ANNOTATION_TOC_LENGTH, ANNOTATION_TOC_OFFSET, FORMAT_VERSION,
};
use std::collections::HashMap;

/// Bytes read from the tail when no hint is given.
/// 512 KiB: a rootfs-sized layer (~11k entries, 1.2 GB) has a ~260 KiB TOC.
pub const SPECULATIVE_TAIL: u64 = 512 << 10;
/// Largest TOC frame + footer a reader accepts.
pub const MAX_TOC_RANGE: u64 = MAX_TOC_COMPRESSED + (SKIPPABLE_HEADER + FOOTER_SIZE) as u64;

/// Where the TOC is, from descriptor annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TocHint {
    /// Blob offset of the TOC skippable frame (`io.weenv.toc.offset`).
    pub offset: u64,
    /// TOC frame + footer length (`io.weenv.toc.length`), i.e. blob size - offset.
    pub length: u64,
    /// sha256 of the compressed TOC bytes (`io.weenv.toc.digest`).
    pub digest: Digest,
}

impl TocHint {
    /// Read the hint from annotations/labels (works with `&HashMap` and `&BTreeMap`).
    /// `Ok(None)` when the weenv annotations are absent (not a weenv layer); an error when they
    /// are present but malformed or of another format version.
    pub fn from_annotations<I, K, V>(annotations: I) -> Result<Option<TocHint>, FormatError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let (mut digest, mut offset, mut length, mut version) = (None, None, None, None);
        for (k, v) in annotations {
            let v = v.as_ref().to_string();
            match k.as_ref() {
                ANNOTATION_TOC_DIGEST => digest = Some(v),
                ANNOTATION_TOC_OFFSET => offset = Some(v),
                ANNOTATION_TOC_LENGTH => length = Some(v),
                ANNOTATION_FORMAT_VERSION => version = Some(v),
                _ => {}
            }
        }
        if digest.is_none() && offset.is_none() && length.is_none() {
            return Ok(None);
        }
        let missing = |what: &str| FormatError::TocLocation {
            reason: format!("annotation {what} missing or not a number"),
        };
        if let Some(v) = version {
            let v: u32 = v.parse().map_err(|_| missing(ANNOTATION_FORMAT_VERSION))?;
            if v != FORMAT_VERSION {
                return Err(FormatError::UnsupportedVersion {
                    version: v,
                    supported: FORMAT_VERSION,
                });
            }
        }
        Ok(Some(TocHint {
            offset: offset
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| missing(ANNOTATION_TOC_OFFSET))?,
            length: length
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| missing(ANNOTATION_TOC_LENGTH))?,
            digest: digest
                .ok_or_else(|| missing(ANNOTATION_TOC_DIGEST))?
                .parse()?,
        }))
    }
}

impl From<&LayerSummary> for TocHint {
    fn from(s: &LayerSummary) -> Self {
        TocHint {
            offset: s.toc_offset,
            length: s.toc_length,
            digest: s.toc_digest.clone(),
        }
    }
}

/// Parse and verify footer + TOC from `tail`, the last bytes of a blob of `blob_size` bytes
/// (`tail` must contain the whole TOC frame and the footer). Pure; used by [`LayerReader`].
pub fn parse_tail(
    tail: &[u8],
    blob_size: u64,
    expected: Option<&Digest>,
) -> Result<(Footer, Toc), FormatError> {
    parse_tail_with_limits(tail, blob_size, expected, &crate::TocLimits::default())
}

/// [`parse_tail`] with the TOC decoded within `limits` ([`Toc::decode_with_limits`]).
pub fn parse_tail_with_limits(
    tail: &[u8],
    blob_size: u64,
    expected: Option<&Digest>,
    limits: &crate::TocLimits,
) -> Result<(Footer, Toc), FormatError> {
    let footer = Footer::parse(tail)?;
    let (frame, _) = locate(&footer, tail, blob_size)?;
    let payload = toc_payload(frame)?;
    let actual = Digest::sha256(payload);
    if let Some(exp) = expected {
        if *exp != actual {
            return Err(FormatError::TocDigestMismatch {
                source_of_expected: "descriptor annotation",
                expected: exp.clone(),
                actual,
            });
        }
    }
    if footer.toc_digest != actual {
        return Err(FormatError::TocDigestMismatch {
            source_of_expected: "footer",
            expected: footer.toc_digest.clone(),
            actual,
        });
    }
    let toc = Toc::decode_with_limits(payload, limits)?;
    toc.validate(footer.toc_offset)?;
    Ok((footer, toc))
}

/// Check the footer's TOC location against the blob size; return the TOC frame within `tail`
/// if `tail` holds it, else `Err(Truncated)` naming how many bytes are needed.
fn locate<'t>(
    footer: &Footer,
    tail: &'t [u8],
    blob_size: u64,
) -> Result<(&'t [u8], u64), FormatError> {
    if footer.toc_len < SKIPPABLE_HEADER as u64 {
        return Err(FormatError::TocLocation {
            reason: format!(
                "TOC length {} is shorter than a frame header",
                footer.toc_len
            ),
        });
    }
    if footer.toc_len.saturating_add(FOOTER_SIZE as u64) > MAX_TOC_RANGE {
        return Err(FormatError::AbsurdSize {
            what: "TOC length",
            value: footer.toc_len,
            limit: MAX_TOC_COMPRESSED,
        });
    }
    let end = footer
        .toc_offset
        .checked_add(footer.toc_len)
        .and_then(|e| e.checked_add(FOOTER_SIZE as u64));
    if end != Some(blob_size) {
        return Err(FormatError::TocLocation {
            reason: format!(
                "footer puts the TOC at {}+{} but the blob is {blob_size} bytes",
                footer.toc_offset, footer.toc_len
            ),
        });
    }
    let need = footer.toc_len + FOOTER_SIZE as u64;
    if (tail.len() as u64) < need {
        return Err(FormatError::Truncated {
            what: "TOC frame in the tail read",
            needed: need,
            available: tail.len() as u64,
        });
    }
    let start = tail.len() - need as usize;
    Ok((&tail[start..start + footer.toc_len as usize], need))
}

fn read(r: &impl RangeRead, offset: u64, len: u64, what: &str) -> Result<Vec<u8>, FormatError> {
    let b = r
        .read_at(offset, len)
        .map_err(|e| FormatError::io(format!("reading {what} at {offset}+{len}"), e))?;
    if b.len() as u64 != len {
        return Err(FormatError::Truncated {
            what: "range read",
            needed: len,
            available: b.len() as u64,
        });
    }
    Ok(b)
}

/// Result of [`LayerReader::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    /// sha256 of the concatenated uncompressed frames: must equal the layer's diff_id.
    pub diff_id: Digest,
    /// Frames read and verified.
    pub frames: u64,
    /// Total uncompressed bytes (the tar length).
    pub uncompressed_size: u64,
}

/// Largest single range request [`LayerReader::verify`] makes.
pub const VERIFY_REQUEST: u64 = 16 << 20;

/// An opened, verified weenv layer.
pub struct LayerReader<R> {
    r: R,
    footer: Footer,
    toc: Toc,
    blob_size: u64,
    index: HashMap<String, usize>,
}

impl<R: RangeRead> LayerReader<R> {
    /// Open a layer: locate, verify and validate its TOC (see module docs for the reads made).
    pub fn open(r: R, hint: Option<TocHint>) -> Result<Self, FormatError> {
        Self::open_with_tail(r, hint, SPECULATIVE_TAIL)
    }

    /// [`LayerReader::open`] with a different speculative tail length (used without a hint;
    /// at least the footer is always read).
    pub fn open_with_tail(
        r: R,
        hint: Option<TocHint>,
        speculative_tail: u64,
    ) -> Result<Self, FormatError> {
        let (footer, toc, blob_size) = match hint {
            Some(h) => {
                if h.length < (SKIPPABLE_HEADER + FOOTER_SIZE) as u64 || h.length > MAX_TOC_RANGE {
                    return Err(FormatError::AbsurdSize {
                        what: "TOC length annotation",
                        value: h.length,
                        limit: MAX_TOC_RANGE,
                    });
                }
                let blob_size =
                    h.offset
                        .checked_add(h.length)
                        .ok_or_else(|| FormatError::TocLocation {
                            reason: "TOC offset + length overflows".into(),
                        })?;
                let tail = read(&r, h.offset, h.length, "TOC and footer")?;
                let (footer, toc) = parse_tail(&tail, blob_size, Some(&h.digest))?;
                if footer.toc_offset != h.offset {
                    return Err(FormatError::TocLocation {
                        reason: format!(
                            "annotation says TOC at {}, footer says {}",
                            h.offset, footer.toc_offset
                        ),
                    });
                }
                (footer, toc, blob_size)
            }
            None => {
                let size = r
                    .size()
                    .map_err(|e| FormatError::io("getting the blob size", e))?;
                if size < FOOTER_SIZE as u64 {
                    return Err(FormatError::Truncated {
                        what: "blob (footer)",
                        needed: FOOTER_SIZE as u64,
                        available: size,
                    });
                }
                let tail_len = size.min(speculative_tail.max(FOOTER_SIZE as u64));
                let tail = read(&r, size - tail_len, tail_len, "blob tail")?;
                let footer = Footer::parse(&tail)?;
                let tail = match locate(&footer, &tail, size) {
                    Ok(_) => tail,
                    Err(FormatError::Truncated { .. }) => {
                        let need = footer.toc_len + FOOTER_SIZE as u64;
                        let mut full = read(&r, footer.toc_offset, footer.toc_len, "TOC")?;
                        full.extend_from_slice(&tail[tail.len() - FOOTER_SIZE..]);
                        debug_assert_eq!(full.len() as u64, need);
                        full
                    }
                    Err(e) => return Err(e),
                };
                let (footer, toc) = parse_tail(&tail, size, None)?;
                (footer, toc, size)
            }
        };
        let index = toc
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.path.clone(), i))
            .collect();
        Ok(LayerReader {
            r,
            footer,
            toc,
            blob_size,
            index,
        })
    }

    pub fn toc(&self) -> &Toc {
        &self.toc
    }

    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// Blob size (from `size()`, or offset + length of the hint).
    pub fn blob_size(&self) -> u64 {
        self.blob_size
    }

    /// The underlying reader.
    pub fn inner(&self) -> &R {
        &self.r
    }

    /// Consume the reader, keeping the verified TOC.
    pub fn into_toc(self) -> Toc {
        self.toc
    }

    /// Entry by path (normalised first), via an index.
    pub fn entry(&self, path: &str) -> Option<&Entry> {
        let norm = crate::paths::lookup_key(path)?;
        self.index.get(&norm).map(|i| &self.toc.entries[*i])
    }

    /// Fetch, decompress and verify one frame.
    pub fn read_frame(&self, idx: FrameIdx) -> Result<Vec<u8>, FormatError> {
        let f = self
            .toc
            .frame(idx)
            .ok_or_else(|| FormatError::FrameLayout {
                frame: idx.0.into(),
                reason: "no such frame".into(),
            })?;
        let c = read(&self.r, f.offset, f.clen, "frame")?;
        decode_frame(f, &c)
    }

    /// Read and verify every frame (coalesced range reads of up to [`VERIFY_REQUEST`] bytes)
    /// and hash the uncompressed stream; compare `diff_id` with the image config.
    pub fn verify(&self) -> Result<VerifyReport, FormatError> {
        use sha2::{Digest as _, Sha256};
        let all: Vec<FrameIdx> = (0..self.toc.frames.len() as u32).map(FrameIdx).collect();
        let mut hash = Sha256::new();
        let mut report = VerifyReport {
            diff_id: Digest::sha256(b""),
            frames: 0,
            uncompressed_size: 0,
        };
        for range in crate::fetch::plan_fetch(&self.toc, &all, 0, VERIFY_REQUEST) {
            let bytes = read(&self.r, range.offset, range.len, "frames")?;
            for idx in range.frames {
                let f = &self.toc.frames[idx.0 as usize];
                let start = f.offset.saturating_sub(range.offset);
                let slice = usize::try_from(start)
                    .ok()
                    .and_then(|s| Some(s..s.checked_add(usize::try_from(f.clen).ok()?)?))
                    .and_then(|r| bytes.get(r))
                    .ok_or_else(|| FormatError::FrameLayout {
                        frame: idx.0.into(),
                        reason: "frame outside its fetched range".into(),
                    })?;
                let data = decode_frame(f, slice)?;
                hash.update(&data);
                report.frames += 1;
                report.uncompressed_size += data.len() as u64;
            }
        }
        report.diff_id = Digest::from_sha256_bytes(&hash.finalize().into());
        Ok(report)
    }

    /// Read `offset..offset+len` of the file at `path` (hardlinks followed), clipped at EOF.
    pub fn read_file(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>, FormatError> {
        let mut e = self.entry(path).ok_or_else(|| FormatError::NoSuchEntry {
            path: path.to_string(),
        })?;
        if e.kind == EntryKind::Hardlink {
            let target = e.link.as_deref().unwrap_or_default();
            e = self.entry(target).ok_or_else(|| FormatError::NoSuchEntry {
                path: target.to_string(),
            })?;
        }
        self.read_entry(e, offset, len)
    }

    /// Read `offset..offset+len` of a regular-file entry, clipped at EOF. Each frame touched is
    /// fetched once and verified.
    pub fn read_entry(&self, e: &Entry, offset: u64, len: u64) -> Result<Vec<u8>, FormatError> {
        if e.kind != EntryKind::File {
            return Err(FormatError::NotAFile {
                path: e.path.clone(),
            });
        }
        let mut out = Vec::new();
        let mut cached: Option<(FrameIdx, Vec<u8>)> = None;
        for c in e.chunks_in(offset, len) {
            if cached.as_ref().map(|(i, _)| *i) != Some(c.frame) {
                cached = Some((c.frame, self.read_frame(c.frame)?));
            }
            if let Some((_, data)) = &cached {
                let range = usize::try_from(c.frame_offset).ok().and_then(|s| {
                    usize::try_from(c.len)
                        .ok()
                        .and_then(|l| s.checked_add(l))
                        .map(|e| s..e)
                });
                let slice =
                    range
                        .and_then(|r| data.get(r))
                        .ok_or_else(|| FormatError::EntryLayout {
                            path: e.path.clone(),
                            reason: "chunk outside its frame".into(),
                        })?;
                out.extend_from_slice(slice);
            }
        }
        Ok(out)
    }
}
