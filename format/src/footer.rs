//! The fixed-size footer: the last [`FOOTER_SIZE`] bytes of every weenv blob.
//!
//! It is a zstd skippable frame (so `zstd -d` ignores it) with this little-endian layout:
//!
//! ```text
//! 0   u32  0x184D2A5F          zstd skippable-frame magic (variant 0xF)
//! 4   u32  64                  skippable payload length
//! 8   [8]  "WEENVTOC"          weenv magic
//! 16  u32  version             FORMAT_VERSION
//! 20  u32  flags               0 (reserved)
//! 24  u64  toc_offset          blob offset of the TOC skippable frame
//! 32  u64  toc_len             length of the whole TOC skippable frame (header included)
//! 40  [32] toc_digest          sha256 of the TOC payload (compressed TOC bytes, as stored)
//! ```
//!
//! `toc_offset + toc_len + FOOTER_SIZE` is always the blob size.

use crate::{Digest, FormatError, FORMAT_VERSION};

/// Size of the footer in bytes.
pub const FOOTER_SIZE: usize = 72;
/// zstd skippable-frame magic used by the footer.
pub const FOOTER_SKIPPABLE_MAGIC: u32 = 0x184D_2A5F;
/// zstd skippable-frame magic used by the TOC frame.
pub const TOC_SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// Size of a skippable-frame header (magic + length).
pub const SKIPPABLE_HEADER: usize = 8;
/// weenv magic inside the footer.
pub const WEENV_MAGIC: &[u8; 8] = b"WEENVTOC";

/// Decoded footer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footer {
    pub version: u32,
    /// Blob offset of the TOC skippable frame.
    pub toc_offset: u64,
    /// Length of the TOC skippable frame (8-byte header + compressed TOC).
    pub toc_len: u64,
    /// sha256 of the compressed TOC bytes (the skippable frame's payload).
    pub toc_digest: Digest,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Footer {
    /// Parse the footer from exactly [`FOOTER_SIZE`] bytes (or the last bytes of a longer tail).
    pub fn parse(bytes: &[u8]) -> Result<Footer, FormatError> {
        if bytes.len() < FOOTER_SIZE {
            return Err(FormatError::Truncated {
                what: "footer",
                needed: FOOTER_SIZE as u64,
                available: bytes.len() as u64,
            });
        }
        let b = &bytes[bytes.len() - FOOTER_SIZE..];
        let magic = u32_at(b, 0);
        if magic != FOOTER_SKIPPABLE_MAGIC {
            return Err(FormatError::BadMagic {
                what: "footer skippable frame",
                found: magic.into(),
                expected: FOOTER_SKIPPABLE_MAGIC.into(),
            });
        }
        let len = u32_at(b, 4);
        if len as usize != FOOTER_SIZE - SKIPPABLE_HEADER {
            return Err(FormatError::BadMagic {
                what: "footer length",
                found: len.into(),
                expected: (FOOTER_SIZE - SKIPPABLE_HEADER) as u64,
            });
        }
        if &b[8..16] != WEENV_MAGIC {
            return Err(FormatError::BadMagic {
                what: "footer weenv magic",
                found: u64_at(b, 8),
                expected: u64::from_le_bytes(*WEENV_MAGIC),
            });
        }
        let version = u32_at(b, 16);
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                version,
                supported: FORMAT_VERSION,
            });
        }
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&b[40..72]);
        Ok(Footer {
            version,
            toc_offset: u64_at(b, 24),
            toc_len: u64_at(b, 32),
            toc_digest: Digest::from_sha256_bytes(&hash),
        })
    }

    /// Encode to exactly [`FOOTER_SIZE`] bytes.
    pub fn encode(&self) -> [u8; FOOTER_SIZE] {
        let mut b = [0u8; FOOTER_SIZE];
        b[0..4].copy_from_slice(&FOOTER_SKIPPABLE_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&((FOOTER_SIZE - SKIPPABLE_HEADER) as u32).to_le_bytes());
        b[8..16].copy_from_slice(WEENV_MAGIC);
        b[16..20].copy_from_slice(&self.version.to_le_bytes());
        b[24..32].copy_from_slice(&self.toc_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.toc_len.to_le_bytes());
        // Digest::hex() is validated lowercase hex, so decoding cannot fail.
        if let Ok(raw) = hex::decode(self.toc_digest.hex()) {
            b[40..72].copy_from_slice(&raw);
        }
        b
    }
}

/// Header of a skippable frame carrying `payload_len` bytes.
pub fn skippable_header(magic: u32, payload_len: u32) -> [u8; SKIPPABLE_HEADER] {
    let mut h = [0u8; SKIPPABLE_HEADER];
    h[0..4].copy_from_slice(&magic.to_le_bytes());
    h[4..8].copy_from_slice(&payload_len.to_le_bytes());
    h
}

/// Split a TOC skippable frame into its payload, checking magic and length.
pub fn toc_payload(frame: &[u8]) -> Result<&[u8], FormatError> {
    if frame.len() < SKIPPABLE_HEADER {
        return Err(FormatError::Truncated {
            what: "TOC frame header",
            needed: SKIPPABLE_HEADER as u64,
            available: frame.len() as u64,
        });
    }
    let magic = u32_at(frame, 0);
    if magic != TOC_SKIPPABLE_MAGIC {
        return Err(FormatError::BadMagic {
            what: "TOC skippable frame",
            found: magic.into(),
            expected: TOC_SKIPPABLE_MAGIC.into(),
        });
    }
    let len = u64::from(u32_at(frame, 4));
    if len != (frame.len() - SKIPPABLE_HEADER) as u64 {
        return Err(FormatError::TocLocation {
            reason: format!(
                "TOC frame header says {len} payload bytes, footer says {}",
                frame.len() - SKIPPABLE_HEADER
            ),
        });
    }
    Ok(&frame[SKIPPABLE_HEADER..])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_magic() {
        let f = Footer {
            version: FORMAT_VERSION,
            toc_offset: 1234,
            toc_len: 99,
            toc_digest: Digest::sha256(b"toc"),
        };
        let b = f.encode();
        assert_eq!(Footer::parse(&b).unwrap(), f);
        let mut bad = b;
        bad[9] ^= 1;
        assert!(matches!(
            Footer::parse(&bad),
            Err(FormatError::BadMagic { .. })
        ));
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(
            Footer::parse(&bad),
            Err(FormatError::BadMagic { .. })
        ));
        let mut bad = b;
        bad[16] = 7;
        assert!(matches!(
            Footer::parse(&bad),
            Err(FormatError::UnsupportedVersion { version: 7, .. })
        ));
        assert!(matches!(
            Footer::parse(&b[1..]),
            Err(FormatError::Truncated { .. })
        ));
    }
}
