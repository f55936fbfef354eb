//! Decompress and verify one frame. A chunk is a slice of a verified frame, so verifying the
//! frame (sha256 of its uncompressed bytes, recorded in the TOC) verifies every chunk in it.

use crate::toc::Frame;
use crate::{Digest, FormatError};

/// Largest uncompressed frame a reader accepts.
pub const MAX_FRAME_ULEN: u64 = 64 << 20;
/// Largest compressed frame a reader accepts (zstd worst-case expansion of MAX_FRAME_ULEN).
pub const MAX_FRAME_CLEN: u64 = MAX_FRAME_ULEN + (MAX_FRAME_ULEN >> 7) + (1 << 16);

/// Decompress `compressed` (exactly `frame.clen` bytes) into exactly `frame.ulen` bytes and
/// verify their sha256 against `frame.digest`. Output is bounded by `frame.ulen`.
pub fn decode_frame(frame: &Frame, compressed: &[u8]) -> Result<Vec<u8>, FormatError> {
    let at = frame.offset;
    if compressed.len() as u64 != frame.clen {
        return Err(FormatError::FrameLengthMismatch {
            frame: at,
            expected: frame.clen,
            actual: compressed.len() as u64,
        });
    }
    if frame.ulen > MAX_FRAME_ULEN {
        return Err(FormatError::AbsurdSize {
            what: "uncompressed frame length",
            value: frame.ulen,
            limit: MAX_FRAME_ULEN,
        });
    }
    let mut dec = zstd::bulk::Decompressor::new()
        .map_err(|e| FormatError::io("creating a zstd decompressor", e))?;
    let out = dec
        .decompress(compressed, frame.ulen as usize)
        .map_err(|e| FormatError::FrameDecompress {
            frame: at,
            reason: e.to_string(),
        })?;
    if out.len() as u64 != frame.ulen {
        return Err(FormatError::FrameDecompress {
            frame: at,
            reason: format!("{} bytes decompressed, TOC says {}", out.len(), frame.ulen),
        });
    }
    let actual = Digest::sha256(&out);
    if actual != frame.digest {
        return Err(FormatError::FrameDigestMismatch {
            frame: at,
            expected: frame.digest.clone(),
            actual,
        });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frame_of(data: &[u8]) -> (Frame, Vec<u8>) {
        let c = zstd::bulk::compress(data, 3).unwrap();
        (
            Frame {
                offset: 0,
                clen: c.len() as u64,
                ulen: data.len() as u64,
                digest: Digest::sha256(data),
            },
            c,
        )
    }

    #[test]
    fn verifies() {
        let (f, c) = frame_of(b"hello hello hello");
        assert_eq!(decode_frame(&f, &c).unwrap(), b"hello hello hello");
        let mut bad = f.clone();
        bad.digest = Digest::sha256(b"other");
        assert!(matches!(
            decode_frame(&bad, &c),
            Err(FormatError::FrameDigestMismatch { .. })
        ));
        let mut short = f.clone();
        short.ulen -= 1;
        assert!(decode_frame(&short, &c).is_err());
        let mut long = f.clone();
        long.ulen += 1;
        assert!(decode_frame(&long, &c).is_err());
        assert!(matches!(
            decode_frame(&f, &c[1..]),
            Err(FormatError::FrameLengthMismatch { .. })
        ));
        let mut huge = f.clone();
        huge.ulen = u64::MAX;
        assert!(matches!(
            decode_frame(&huge, &c),
            Err(FormatError::AbsurdSize { .. })
        ));
        let mut garbage = c.clone();
        garbage[0] ^= 0xff;
        assert!(matches!(
            decode_frame(&f, &garbage),
            Err(FormatError::FrameDecompress { .. })
        ));
    }
}
