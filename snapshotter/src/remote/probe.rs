//! Is a blob a weenv layer? Pure decisions over the bytes at its tail.
//!
//! containerd does not pass descriptor annotations to snapshotters, so the layer is detected
//! from the blob itself: a HEAD for the size, then one tail read of [`PROBE_TAIL`] bytes. A
//! weenv blob ends with the fixed-size footer (skippable frame + `WEENVTOC` magic) locating the
//! TOC frame; any other blob (gzip, plain zstd, tar) fails the magic check.

use weenv_format::footer::{Footer, FOOTER_SIZE};
use weenv_format::FormatError;

/// Bytes read from the tail in the first probe request (covers most TOCs at once).
pub const PROBE_TAIL: u64 = 64 << 10;

/// What the first tail read tells us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TailVerdict {
    /// Not a weenv layer: take the ordinary path (cache this negative result).
    NotWeenv { reason: String },
    /// The TOC frame and footer are the last `len` bytes of the tail read.
    Complete { len: u64 },
    /// The TOC is larger than the tail: read `len` bytes at `offset` (TOC frame + footer).
    Need { offset: u64, len: u64 },
}

/// The range of the first probe read for a blob of `size` bytes: `(offset, len)`.
pub fn probe_range(size: u64) -> (u64, u64) {
    let len = size.min(PROBE_TAIL);
    (size - len, len)
}

/// Classify the first tail read of a blob of `size` bytes. Errors are weenv blobs whose footer
/// is damaged or of an unsupported version (not silently treated as ordinary layers).
pub fn classify_tail(tail: &[u8], size: u64) -> Result<TailVerdict, FormatError> {
    if (tail.len() as u64) < FOOTER_SIZE as u64 {
        return Ok(TailVerdict::NotWeenv {
            reason: format!("blob of {size} bytes is smaller than a weenv footer"),
        });
    }
    let f = match Footer::parse(tail) {
        Ok(f) => f,
        Err(FormatError::BadMagic { what, .. }) => {
            return Ok(TailVerdict::NotWeenv {
                reason: format!("{what} magic does not match"),
            })
        }
        Err(e) => return Err(e),
    };
    let len = f
        .toc_len
        .checked_add(FOOTER_SIZE as u64)
        .filter(|_| f.toc_offset.checked_add(f.toc_len).is_some());
    let Some(len) = len else {
        return Err(FormatError::TocLocation {
            reason: "TOC offset/length overflow".into(),
        });
    };
    if f.toc_offset + len != size {
        return Err(FormatError::TocLocation {
            reason: format!(
                "footer puts the TOC at {}+{} but the blob is {size} bytes",
                f.toc_offset, f.toc_len
            ),
        });
    }
    if len <= tail.len() as u64 {
        Ok(TailVerdict::Complete { len })
    } else {
        Ok(TailVerdict::Need {
            offset: f.toc_offset,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::testutil::{build_layer, tar_of, T};
    use weenv_format::reader::parse_tail;

    #[test]
    fn weenv_blob_small_and_large_tail() {
        let tar = tar_of(&[T::File("a/b.txt", b"hello".to_vec())]);
        let (_d, toc, blob) = build_layer(&tar, 1 << 20);
        let size = blob.len() as u64;
        let (off, len) = probe_range(size);
        let tail = &blob[off as usize..(off + len) as usize];
        let TailVerdict::Complete { len } = classify_tail(tail, size).unwrap() else {
            panic!("expected complete")
        };
        let t = &tail[tail.len() - len as usize..];
        assert_eq!(parse_tail(t, size, None).unwrap().1, toc);
        // A tail shorter than the TOC asks for the exact remaining range.
        let short = &blob[blob.len() - FOOTER_SIZE..];
        match classify_tail(short, size).unwrap() {
            TailVerdict::Need { offset, len } => {
                assert_eq!(offset + len, size);
                let t = &blob[offset as usize..];
                assert_eq!(parse_tail(t, size, None).unwrap().1, toc);
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn other_blobs_are_not_weenv() {
        let gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        assert!(matches!(
            classify_tail(&gz, 10),
            Ok(TailVerdict::NotWeenv { .. })
        ));
        let junk = vec![7u8; 4096];
        assert!(matches!(
            classify_tail(&junk, 4096),
            Ok(TailVerdict::NotWeenv { .. })
        ));
        assert_eq!(probe_range(10), (0, 10));
        assert_eq!(probe_range(1 << 20), ((1 << 20) - PROBE_TAIL, PROBE_TAIL));
    }

    #[test]
    fn damaged_weenv_footer_is_an_error() {
        let tar = tar_of(&[T::File("x", b"y".to_vec())]);
        let (_d, _toc, blob) = build_layer(&tar, 1 << 20);
        // blob size disagrees with the footer
        assert!(classify_tail(&blob, blob.len() as u64 + 1).is_err());
    }
}
