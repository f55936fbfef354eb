//! TOC types (contract shared with snapshotter/ and converter/), their wire encoding and lookups.
//!
//! Wire encoding (version 2): the [`Toc`] serialised as JSON (serde, field names as below; empty
//! and zero-valued optional fields omitted; xattr values base64) and compressed as one zstd
//! frame. The decoder bounds the decompressed size and the entry count ([`TocLimits`]) while it
//! decodes; readers then run [`Toc::validate`] (see `validate.rs`).

use crate::{Digest, FormatError, FORMAT_VERSION};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;

/// Largest compressed TOC a reader accepts (bytes).
pub const MAX_TOC_COMPRESSED: u64 = 64 << 20;
/// Largest decompressed TOC a reader accepts (bytes).
pub const MAX_TOC_DECODED: u64 = 256 << 20;
/// Largest number of entries a TOC may list by default ([`TocLimits::default`]); the writer
/// refuses to produce more.
pub const DEFAULT_MAX_ENTRIES: u64 = 1 << 20;
/// zstd level used for the TOC itself.
pub const TOC_ZSTD_LEVEL: i32 = 9;

/// Bounds applied while decoding a TOC ([`Toc::decode_with_limits`]), so a hostile TOC is
/// refused before it is allocated: the entry count is enforced while the JSON is parsed, the
/// decoded size while it is decompressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TocLimits {
    /// Most entries accepted.
    pub max_entries: u64,
    /// Most decompressed (JSON) bytes accepted.
    pub max_decoded_bytes: u64,
}

impl Default for TocLimits {
    fn default() -> Self {
        TocLimits {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_decoded_bytes: MAX_TOC_DECODED,
        }
    }
}

/// Index of a frame in [`Toc::frames`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FrameIdx(pub u32);

/// One independent zstd frame of the blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Offset of the compressed frame in the blob.
    pub offset: u64,
    /// Compressed length in the blob.
    pub clen: u64,
    /// Uncompressed length.
    pub ulen: u64,
    /// sha256 of the uncompressed frame content.
    pub digest: Digest,
}

/// Type of a TOC entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Char,
    Block,
    Fifo,
}

/// A slice of a file's payload held in a frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// Offset of this chunk in the file.
    pub file_offset: u64,
    /// Frame holding it.
    pub frame: FrameIdx,
    /// Offset of the chunk inside the uncompressed frame.
    pub frame_offset: u64,
    /// Uncompressed length.
    pub len: u64,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// One tar entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Normalised relative path: no leading `/` or `./`, no `..`, no empty components, no
    /// trailing `/`. The layer root directory (`./` in the tar) is `""`.
    pub path: String,
    /// Offset in the uncompressed tar stream of this entry's first header block (its PAX/GNU
    /// extension headers included). Required since format version 2.
    pub header: u64,
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky (no file-type bits).
    pub mode: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub uid: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Sub-second part of the modification time (PAX `mtime`), 0..1e9.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub mtime_nsec: u32,
    /// Payload size (regular files only; 0 for every other kind, hardlinks included).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub size: u64,
    /// Symlink target (verbatim), or for hardlinks the normalised path of the earlier regular
    /// file entry it names (never another hardlink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub devmajor: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub devminor: u32,
    /// Extended attributes (from PAX `SCHILY.xattr.*`), values as raw bytes (base64 on the wire).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        with = "xattr_b64"
    )]
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// Payload chunks in file order, covering `0..size` exactly (regular files only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<ChunkRef>,
}

/// The table of contents of a weenv layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toc {
    pub version: u32,
    pub frames: Vec<Frame>,
    /// Entries in tar order.
    pub entries: Vec<Entry>,
}

impl Entry {
    /// The chunks of this entry that intersect `offset..offset+len`, each clipped to the range
    /// (so `frame_offset`/`len` name exactly the bytes to copy). Empty past EOF.
    pub fn chunks_in(&self, offset: u64, len: u64) -> impl Iterator<Item = ChunkRef> + '_ {
        let end = offset.saturating_add(len).min(self.size);
        let start_idx = self
            .chunks
            .partition_point(|c| c.file_offset.saturating_add(c.len) <= offset);
        self.chunks[start_idx..]
            .iter()
            .take_while(move |c| c.file_offset < end)
            .filter_map(move |c| {
                let s = c.file_offset.max(offset);
                let e = c.file_offset.saturating_add(c.len).min(end);
                (s < e).then(|| ChunkRef {
                    file_offset: s,
                    frame: c.frame,
                    frame_offset: c.frame_offset.saturating_add(s - c.file_offset),
                    len: e - s,
                })
            })
    }
}

impl Toc {
    /// An empty TOC of the current version.
    pub fn new() -> Self {
        Toc {
            version: FORMAT_VERSION,
            frames: Vec::new(),
            entries: Vec::new(),
        }
    }

    /// Find an entry by path (normalised first: `./a/b/` and `/a/b` find `a/b`; `""`, `.`, `/`
    /// find the root entry if the tar has one). Linear scan; build
    /// an index (e.g. [`Toc::index`]) for repeated lookups.
    pub fn lookup(&self, path: &str) -> Option<&Entry> {
        let norm = crate::paths::lookup_key(path)?;
        self.entries.iter().find(|e| e.path == norm)
    }

    /// path -> index into `entries`.
    pub fn index(&self) -> std::collections::HashMap<&str, usize> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.path.as_str(), i))
            .collect()
    }

    /// Chunks of `entry` covering `offset..offset+len` (clipped; see [`Entry::chunks_in`]).
    pub fn chunks_for<'a>(
        &self,
        entry: &'a Entry,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = ChunkRef> + 'a {
        entry.chunks_in(offset, len)
    }

    /// The frame at `idx`, if any.
    pub fn frame(&self, idx: FrameIdx) -> Option<&Frame> {
        self.frames.get(idx.0 as usize)
    }

    /// Offset in the uncompressed tar stream where frame `idx` starts (frames tile the
    /// stream in order). O(frames); use [`Toc::stream_offsets`] for many lookups.
    pub fn stream_offset(&self, idx: FrameIdx) -> Option<u64> {
        let i = idx.0 as usize;
        (i < self.frames.len()).then(|| {
            self.frames[..i]
                .iter()
                .fold(0u64, |a, f| a.saturating_add(f.ulen))
        })
    }

    /// Stream offset of every frame (index = frame index), plus the stream length at the end.
    pub fn stream_offsets(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.frames.len() + 1);
        let mut at = 0u64;
        out.push(0);
        for f in &self.frames {
            at = at.saturating_add(f.ulen);
            out.push(at);
        }
        out
    }

    /// Stream offset where `entry`'s payload starts, from its first chunk (`None` for
    /// entries without chunks or a chunk naming a missing frame).
    pub fn data_start(&self, entry: &Entry) -> Option<u64> {
        let c = entry.chunks.first()?;
        self.stream_offset(c.frame)?
            .checked_add(c.frame_offset)?
            .checked_sub(c.file_offset)
    }

    /// Total uncompressed size (the tar stream length).
    pub fn uncompressed_size(&self) -> u64 {
        self.frames.iter().map(|f| f.ulen).sum()
    }

    /// Wire encoding: zstd-compressed JSON (deterministic).
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        if self.entries.len() as u64 > DEFAULT_MAX_ENTRIES {
            // Readers with default limits would refuse it; fail at write time instead.
            return Err(FormatError::TocLimit {
                what: "entry count",
                value: self.entries.len() as u64,
                limit: DEFAULT_MAX_ENTRIES,
            });
        }
        let json = serde_json::to_vec(self).map_err(|e| FormatError::TocDecode {
            reason: format!("serialising TOC: {e}"),
        })?;
        if json.len() as u64 > MAX_TOC_DECODED {
            // Readers would refuse it; fail at write time instead.
            return Err(FormatError::AbsurdSize {
                what: "TOC size (JSON)",
                value: json.len() as u64,
                limit: MAX_TOC_DECODED,
            });
        }
        zstd::bulk::compress(&json, TOC_ZSTD_LEVEL)
            .map_err(|e| FormatError::io("compressing the TOC", e))
    }

    /// Decode the wire encoding with the default [`TocLimits`]. Does NOT validate; readers
    /// call [`Toc::validate`] next.
    pub fn decode(bytes: &[u8]) -> Result<Toc, FormatError> {
        Self::decode_with_limits(bytes, &TocLimits::default())
    }

    /// Decode the wire encoding within `limits`: decompression stops one byte past
    /// `max_decoded_bytes`, and the entry list stops one entry past `max_entries` (a TOC
    /// listing millions of entries is refused after `max_entries + 1` of them were parsed).
    /// A TOC of another format version is refused before its entries are parsed. Does NOT
    /// validate; readers call [`Toc::validate`] next.
    pub fn decode_with_limits(bytes: &[u8], limits: &TocLimits) -> Result<Toc, FormatError> {
        let mut dec = zstd::stream::read::Decoder::new(bytes)
            .map_err(|e| FormatError::io("initialising the TOC decoder", e))?
            .single_frame();
        let mut json = Vec::new();
        (&mut dec)
            .take(limits.max_decoded_bytes.saturating_add(1))
            .read_to_end(&mut json)
            .map_err(|e| FormatError::TocDecode {
                reason: format!("zstd: {e}"),
            })?;
        if json.len() as u64 > limits.max_decoded_bytes {
            return Err(FormatError::TocLimit {
                what: "decoded size (bytes)",
                value: json.len() as u64,
                limit: limits.max_decoded_bytes,
            });
        }
        let stop = std::cell::Cell::new(None);
        let seed = limited::TocSeed {
            max_entries: limits.max_entries,
            stop: &stop,
        };
        let mut de = serde_json::Deserializer::from_slice(&json);
        let parsed = serde::de::DeserializeSeed::deserialize(seed, &mut de).and_then(|toc| {
            de.end()?;
            Ok(toc)
        });
        match (parsed, stop.get()) {
            (_, Some(limited::Stop::Version(version))) => Err(FormatError::UnsupportedVersion {
                version,
                supported: FORMAT_VERSION,
            }),
            (_, Some(limited::Stop::Entries(value))) => Err(FormatError::TocLimit {
                what: "entry count",
                value,
                limit: limits.max_entries,
            }),
            (Ok(toc), None) => Ok(toc),
            (Err(e), None) => {
                // An old TOC whose version comes after its entries fails on a missing field;
                // name the version instead.
                #[derive(Deserialize)]
                struct VersionOnly {
                    version: u32,
                }
                match serde_json::from_slice::<VersionOnly>(&json) {
                    Ok(v) if v.version != FORMAT_VERSION => Err(FormatError::UnsupportedVersion {
                        version: v.version,
                        supported: FORMAT_VERSION,
                    }),
                    _ => Err(FormatError::TocDecode {
                        reason: format!("JSON: {e}"),
                    }),
                }
            }
        }
    }
}

/// Deserialisation of a [`Toc`] that stops early (entry count, version).
mod limited {
    use super::{Entry, Frame, Toc, FORMAT_VERSION};
    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::cell::Cell;
    use std::fmt;

    #[derive(Clone, Copy, Debug)]
    pub(super) enum Stop {
        Version(u32),
        /// Entries parsed when the limit was crossed.
        Entries(u64),
    }

    pub(super) struct TocSeed<'a> {
        pub max_entries: u64,
        pub stop: &'a Cell<Option<Stop>>,
    }

    struct EntriesSeed<'a> {
        max_entries: u64,
        stop: &'a Cell<Option<Stop>>,
    }

    impl<'de> DeserializeSeed<'de> for TocSeed<'_> {
        type Value = Toc;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Toc, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for TocSeed<'_> {
        type Value = Toc;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a weenv TOC object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Toc, A::Error> {
            let (mut version, mut frames, mut entries) = (None, None, None);
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "version" => {
                        let v: u32 = map.next_value()?;
                        if v != FORMAT_VERSION {
                            self.stop.set(Some(Stop::Version(v)));
                            return Err(de::Error::custom("unsupported version"));
                        }
                        version = Some(v);
                    }
                    "frames" => frames = Some(map.next_value::<Vec<Frame>>()?),
                    "entries" => {
                        entries = Some(map.next_value_seed(EntriesSeed {
                            max_entries: self.max_entries,
                            stop: self.stop,
                        })?)
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(Toc {
                version: version.ok_or_else(|| de::Error::missing_field("version"))?,
                frames: frames.ok_or_else(|| de::Error::missing_field("frames"))?,
                entries: entries.ok_or_else(|| de::Error::missing_field("entries"))?,
            })
        }
    }

    impl<'de> DeserializeSeed<'de> for EntriesSeed<'_> {
        type Value = Vec<Entry>;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<Entry>, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for EntriesSeed<'_> {
        type Value = Vec<Entry>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of TOC entries")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Entry>, A::Error> {
            let mut out = Vec::new();
            while let Some(e) = seq.next_element::<Entry>()? {
                if out.len() as u64 >= self.max_entries {
                    self.stop.set(Some(Stop::Entries(out.len() as u64 + 1)));
                    return Err(de::Error::custom("too many entries"));
                }
                out.push(e);
            }
            Ok(out)
        }
    }
}

impl Default for Toc {
    fn default() -> Self {
        Self::new()
    }
}

mod xattr_b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<String, Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(map.iter().map(|(k, v)| (k, STANDARD.encode(v))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Vec<u8>>, D::Error> {
        let raw = BTreeMap::<String, String>::deserialize(d)?;
        raw.into_iter()
            .map(|(k, v)| {
                STANDARD
                    .decode(v.as_bytes())
                    .map(|b| (k, b))
                    .map_err(D::Error::custom)
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(size: u64, chunks: &[(u64, u32, u64, u64)]) -> Entry {
        let chunks = chunks
            .iter()
            .map(|&(fo, fr, fro, len)| ChunkRef {
                file_offset: fo,
                frame: FrameIdx(fr),
                frame_offset: fro,
                len,
            })
            .collect();
        crate::testdata::file_entry("f", size, chunks)
    }

    #[test]
    fn chunks_in_clips() {
        let e = file(250, &[(0, 0, 0, 100), (100, 1, 0, 100), (200, 2, 10, 50)]);
        let got: Vec<_> = e.chunks_in(50, 100).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].file_offset, got[0].frame_offset, got[0].len),
            (50, 50, 50)
        );
        assert_eq!(
            (got[1].file_offset, got[1].frame_offset, got[1].len),
            (100, 0, 50)
        );
        let got: Vec<_> = e.chunks_in(210, 1000).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].frame.0, got[0].frame_offset, got[0].len),
            (2, 20, 40)
        );
        assert_eq!(e.chunks_in(250, 10).count(), 0);
        assert_eq!(e.chunks_in(0, 0).count(), 0);
        assert_eq!(e.chunks_in(u64::MAX, u64::MAX).count(), 0);
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut e = file(3, &[(0, 0, 0, 3)]);
        e.xattrs.insert("user.x".into(), vec![0, 255, 1]);
        let toc = Toc {
            version: FORMAT_VERSION,
            frames: vec![Frame {
                offset: 0,
                clen: 10,
                ulen: 3,
                digest: Digest::sha256(b"abc"),
            }],
            entries: vec![e],
        };
        let bytes = toc.encode().unwrap();
        assert_eq!(Toc::decode(&bytes).unwrap(), toc);
        assert_eq!(toc.lookup("./f/").map(|e| e.size), Some(3));
        assert!(matches!(
            Toc::decode(b"garbage"),
            Err(FormatError::TocDecode { .. })
        ));
    }

    proptest::proptest! {
        /// Clipped chunks tile exactly `offset..min(offset+len, size)`.
        #[test]
        fn chunks_in_tiles_the_range(
            lens in proptest::collection::vec(1u64..100, 0..20),
            offset in 0u64..2500,
            len in 0u64..2500,
        ) {
            let mut chunks = Vec::new();
            let mut at = 0;
            for (i, l) in lens.iter().enumerate() {
                chunks.push((at, i as u32, 7, *l));
                at += l;
            }
            let e = file(at, &chunks);
            let end = offset.saturating_add(len).min(at);
            let mut pos = offset;
            for c in e.chunks_in(offset, len) {
                proptest::prop_assert_eq!(c.file_offset, pos);
                proptest::prop_assert!(c.len > 0);
                let orig = &e.chunks[c.frame.0 as usize];
                proptest::prop_assert_eq!(c.frame_offset - orig.frame_offset, c.file_offset - orig.file_offset);
                pos += c.len;
            }
            // nothing past EOF; otherwise exactly up to `end`
            let expect = if offset >= at { offset } else { end };
            proptest::prop_assert_eq!(pos, expect);
        }
    }
}
