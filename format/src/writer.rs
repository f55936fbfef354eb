//! tar stream -> weenv layer blob, streaming and memory bounded (O(frame/chunk size) + TOC).
//!
//! Framing policy (pure, deterministic):
//! - Non-payload bytes (headers, extension data, padding, end-of-archive, trailer) and payloads
//!   of regular files of at most `small_file_threshold` bytes are packed, in tar order, into a
//!   shared frame that is flushed when it reaches `frame_size`. A small file's payload never
//!   straddles two frames (the frame is flushed first if it would not fit); header bytes may.
//! - A file larger than `small_file_threshold` flushes the shared frame, and its payload is cut
//!   into frames of `chunk_size` bytes (the last one shorter), one chunk per frame.
//! - So regions of small files get frames of `frame_size` (default 256 KiB: a cold read of one
//!   small file fetches and decompresses at most that), large files frames of `chunk_size`
//!   (default 1 MiB). [`frame_lengths`] is this policy as a pure function.
//! - Every frame is an independent zstd frame (level `level`, content size recorded, no dict id,
//!   no checksum: integrity is the sha256 in the TOC). Empty frames are never written.
//!
//! Then the TOC skippable frame and the footer (see `footer.rs`). Decompressing the blob with
//! `zstd -d` yields the input tar byte for byte.

use crate::footer::{skippable_header, Footer, FOOTER_SIZE, SKIPPABLE_HEADER, TOC_SKIPPABLE_MAGIC};
use crate::frame::MAX_FRAME_ULEN;
use crate::tar::{walk, TarSink};
use crate::toc::{ChunkRef, Entry, EntryKind, Toc, MAX_TOC_COMPRESSED};
use crate::writer_pool::{FrameOut, TeeHash};
use crate::{
    Digest, FormatError, ANNOTATION_FORMAT_VERSION, ANNOTATION_TOC_DIGEST, ANNOTATION_TOC_LENGTH,
    ANNOTATION_TOC_OFFSET, FORMAT_VERSION,
};
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// Writer knobs. Defaults: 256 KiB shared frames, files up to 256 KiB packed, 1 MiB chunks,
/// zstd level 3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterOptions {
    /// Target uncompressed size of shared (header + small file) frames. Default 256 KiB: one
    /// small file read cold costs its frame, so smaller shared frames fetch fewer bytes a
    /// program does not read (python3 start-up on the Debian benchmark image: 6.0 MB fetched
    /// instead of 8.7 MB with 1 MiB frames), for about 7% more blob (frames compress
    /// independently); large files keep `chunk_size` frames.
    pub frame_size: u64,
    /// Files up to this size are packed into shared frames; larger ones get their own chunk
    /// frames. Must be <= `frame_size`. Default 256 KiB: files that are typically read whole
    /// (sources, modules, small libraries) share one fetch with their directory neighbours.
    pub small_file_threshold: u64,
    /// Chunk size for large files. Default 1 MiB.
    pub chunk_size: u64,
    /// zstd compression level (1..=22) of chunk frames, and of shared frames unless
    /// `shared_level` says otherwise. Default 3.
    pub level: i32,
    /// zstd level (1..=22) of shared frames; `None`: `level`. Small shared frames lose more
    /// against one zstd stream than 1 MiB chunks do (each starts without context), and a higher
    /// level wins part of that back; decompression does not depend on the level.
    pub shared_level: Option<i32>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            frame_size: 256 << 10,
            small_file_threshold: 256 << 10,
            chunk_size: 1 << 20,
            level: 3,
            shared_level: None,
        }
    }
}

/// A piece of a tar stream, as the framing policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Non-payload bytes: headers, extension data, padding, end-of-archive, trailer.
    Meta(u64),
    /// The payload of a regular file of this many bytes.
    File(u64),
}

/// The framing policy as a pure function: the uncompressed length of each frame, in order, that
/// the writer cuts for a tar stream made of `pieces` (the rules in the module documentation;
/// the streaming writer applies the same rules, and the round-trip tests check that both agree
/// on generated archives).
pub fn frame_lengths(pieces: &[Piece], opts: &WriterOptions) -> Vec<u64> {
    fn flush(shared: &mut u64, out: &mut Vec<u64>) {
        if *shared > 0 {
            out.push(std::mem::take(shared));
        }
    }
    let mut out = Vec::new();
    let mut shared = 0u64;
    for piece in pieces {
        match *piece {
            Piece::Meta(mut len) => {
                while len > 0 {
                    let take = opts.frame_size.saturating_sub(shared).min(len);
                    shared += take;
                    len -= take;
                    if shared >= opts.frame_size {
                        flush(&mut shared, &mut out);
                    }
                }
            }
            Piece::File(0) => {}
            Piece::File(size) if size > opts.small_file_threshold => {
                flush(&mut shared, &mut out);
                let mut left = size;
                while left > 0 {
                    let chunk = left.min(opts.chunk_size);
                    out.push(chunk);
                    left -= chunk;
                }
            }
            Piece::File(size) => {
                if shared + size > opts.frame_size {
                    flush(&mut shared, &mut out);
                }
                shared += size;
            }
        }
    }
    flush(&mut shared, &mut out);
    out
}

/// Smallest frame/chunk size accepted.
pub const MIN_FRAME_SIZE: u64 = 512;

impl WriterOptions {
    /// Check the options; the error names the field.
    pub fn validate(&self) -> Result<(), FormatError> {
        let range = |field: &'static str, v: u64| {
            if !(MIN_FRAME_SIZE..=MAX_FRAME_ULEN).contains(&v) {
                return Err(FormatError::InvalidOption {
                    field,
                    reason: format!("{v} is outside {MIN_FRAME_SIZE}..={MAX_FRAME_ULEN}"),
                });
            }
            Ok(())
        };
        range("frame_size", self.frame_size)?;
        range("chunk_size", self.chunk_size)?;
        if self.small_file_threshold > self.frame_size {
            return Err(FormatError::InvalidOption {
                field: "small_file_threshold",
                reason: format!(
                    "{} is larger than frame_size {}",
                    self.small_file_threshold, self.frame_size
                ),
            });
        }
        for (field, level) in [
            ("level", Some(self.level)),
            ("shared_level", self.shared_level),
        ] {
            if let Some(level) = level.filter(|l| !(1..=22).contains(l)) {
                return Err(FormatError::InvalidOption {
                    field,
                    reason: format!("zstd level {level} is outside 1..=22"),
                });
            }
        }
        Ok(())
    }

    /// zstd level of shared frames.
    pub fn shared_level(&self) -> i32 {
        self.shared_level.unwrap_or(self.level)
    }
}

/// What [`write_layer`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSummary {
    /// sha256 of the whole output blob (the layer descriptor digest).
    pub blob_digest: Digest,
    /// Size of the output blob.
    pub blob_size: u64,
    /// sha256 of the input tar (unchanged diff_id).
    pub diff_id: Digest,
    /// sha256 of the compressed TOC bytes (payload of the TOC skippable frame).
    pub toc_digest: Digest,
    /// Blob offset of the TOC skippable frame.
    pub toc_offset: u64,
    /// TOC skippable frame + footer: `blob_size - toc_offset`, so one range read gets both.
    pub toc_length: u64,
    /// Entries in the TOC.
    pub entry_count: u64,
    /// zstd data frames (TOC and footer not counted).
    pub frame_count: u64,
    /// Length of the input tar.
    pub uncompressed_size: u64,
}

/// Layer-descriptor annotations for a written layer.
pub fn descriptor_annotations(s: &LayerSummary) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANNOTATION_TOC_DIGEST.to_string(), s.toc_digest.to_string()),
        (ANNOTATION_TOC_OFFSET.to_string(), s.toc_offset.to_string()),
        (ANNOTATION_TOC_LENGTH.to_string(), s.toc_length.to_string()),
        (
            ANNOTATION_FORMAT_VERSION.to_string(),
            FORMAT_VERSION.to_string(),
        ),
    ])
}

#[derive(Clone, Copy)]
enum Payload {
    None,
    /// Small file: payload goes into the shared frame.
    Small,
    /// Large file: entry index, bytes still expected, next file offset.
    Large {
        entry: usize,
        left: u64,
        next: u64,
    },
}

struct Sink<'o, 's, W: Write> {
    opts: &'o WriterOptions,
    out: FrameOut<'s, W>,
    shared: Vec<u8>,
    chunk: Vec<u8>,
    payload: Payload,
    toc: Toc,
}

impl<W: Write> Sink<'_, '_, W> {
    fn flush_shared(&mut self) -> Result<(), FormatError> {
        if !self.shared.is_empty() {
            let next = self.out.buffer(self.opts.frame_size as usize);
            let data = std::mem::replace(&mut self.shared, next);
            self.out.emit(data, self.opts.shared_level())?;
        }
        Ok(())
    }

    fn flush_chunk(&mut self, entry: usize, file_offset: u64) -> Result<(), FormatError> {
        let next = self.out.buffer(self.opts.chunk_size as usize);
        let data = std::mem::replace(&mut self.chunk, next);
        let len = data.len() as u64;
        let frame = self.out.emit(data, self.opts.level)?;
        self.toc.entries[entry].chunks.push(ChunkRef {
            file_offset,
            frame,
            frame_offset: 0,
            len,
        });
        Ok(())
    }
}

impl<W: Write> TarSink for Sink<'_, '_, W> {
    fn meta(&mut self, mut bytes: &[u8]) -> Result<(), FormatError> {
        while !bytes.is_empty() {
            let room = (self.opts.frame_size as usize).saturating_sub(self.shared.len());
            let take = room.min(bytes.len());
            self.shared.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.shared.len() as u64 >= self.opts.frame_size {
                self.flush_shared()?;
            }
        }
        Ok(())
    }

    fn entry(&mut self, entry: Entry) -> Result<(), FormatError> {
        let size = entry.size;
        let idx = self.toc.entries.len();
        self.toc.entries.push(entry);
        self.payload = Payload::None;
        if self.toc.entries[idx].kind != EntryKind::File || size == 0 {
            return Ok(());
        }
        if size > self.opts.small_file_threshold {
            self.flush_shared()?;
            self.payload = Payload::Large {
                entry: idx,
                left: size,
                next: 0,
            };
        } else {
            if self.shared.len() as u64 + size > self.opts.frame_size {
                self.flush_shared()?;
            }
            let frame = self.out.next_idx();
            self.toc.entries[idx].chunks.push(ChunkRef {
                file_offset: 0,
                frame,
                frame_offset: self.shared.len() as u64,
                len: size,
            });
            self.payload = Payload::Small;
        }
        Ok(())
    }

    fn payload(&mut self, mut bytes: &[u8]) -> Result<(), FormatError> {
        match self.payload {
            Payload::None => Err(FormatError::InvalidOption {
                field: "payload",
                reason: "payload without a regular-file entry (tar walker bug)".into(),
            }),
            Payload::Small => {
                self.shared.extend_from_slice(bytes);
                Ok(())
            }
            Payload::Large { entry, left, next } => {
                let chunk_size = self.opts.chunk_size as usize;
                let left = left.saturating_sub(bytes.len() as u64);
                let mut file_offset = next;
                while !bytes.is_empty() {
                    let take = (chunk_size - self.chunk.len()).min(bytes.len());
                    self.chunk.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.chunk.len() == chunk_size || (left == 0 && bytes.is_empty()) {
                        let len = self.chunk.len() as u64;
                        self.flush_chunk(entry, file_offset)?;
                        file_offset += len;
                    }
                }
                // `next` counts flushed bytes; bytes still buffered in `chunk` follow them.
                self.payload = Payload::Large {
                    entry,
                    left,
                    next: file_offset,
                };
                Ok(())
            }
        }
    }
}

/// The tail of a blob whose data frames end at `toc_offset`: TOC skippable frame + footer.
/// Validates `toc` first. Returns the tail, the TOC digest and the TOC frame length.
fn toc_tail(toc: &Toc, toc_offset: u64) -> Result<(Vec<u8>, Digest, u64), FormatError> {
    toc.validate(toc_offset)?;
    let ztoc = toc.encode()?;
    if ztoc.len() as u64 > MAX_TOC_COMPRESSED {
        return Err(FormatError::AbsurdSize {
            what: "compressed TOC size",
            value: ztoc.len() as u64,
            limit: MAX_TOC_COMPRESSED,
        });
    }
    let toc_digest = Digest::sha256(&ztoc);
    let toc_len = (SKIPPABLE_HEADER + ztoc.len()) as u64;
    let footer = Footer {
        version: FORMAT_VERSION,
        toc_offset,
        toc_len,
        toc_digest: toc_digest.clone(),
    };
    let mut tail = Vec::with_capacity(toc_len as usize + FOOTER_SIZE);
    tail.extend_from_slice(&skippable_header(TOC_SKIPPABLE_MAGIC, ztoc.len() as u32));
    tail.extend_from_slice(&ztoc);
    tail.extend_from_slice(&footer.encode());
    Ok((tail, toc_digest, toc_len))
}

/// Re-tail a blob: keep its data frames (`blob[..toc_offset]`) and append `toc` (validated)
/// with a matching footer. For tools and adversarial tests that craft layers, e.g. a TOC that
/// passes validation but lies about the tar (which [`crate::StreamChecker`] catches). Returns
/// the blob and the hint a descriptor would carry.
pub fn retail(
    blob: &[u8],
    toc_offset: u64,
    toc: &Toc,
) -> Result<(Vec<u8>, crate::TocHint), FormatError> {
    let frames = blob
        .get(..toc_offset as usize)
        .ok_or(FormatError::Truncated {
            what: "data frames",
            needed: toc_offset,
            available: blob.len() as u64,
        })?;
    let (tail, digest, toc_len) = toc_tail(toc, toc_offset)?;
    let mut out = Vec::with_capacity(frames.len() + tail.len());
    out.extend_from_slice(frames);
    out.extend_from_slice(&tail);
    Ok((
        out,
        crate::TocHint {
            offset: toc_offset,
            length: toc_len + FOOTER_SIZE as u64,
            digest,
        },
    ))
}

/// Convert the tar stream `input` into a weenv layer written to `output`, everything on the
/// calling thread: compression, hashing, writing. Same output as [`write_layer_parallel`].
pub fn write_layer<R: Read, W: Write>(
    input: R,
    output: W,
    opts: &WriterOptions,
) -> Result<LayerSummary, FormatError> {
    opts.validate()?;
    write_frames(TeeHash::inline(input), FrameOut::inline(output), opts)
}

/// Convert the tar stream `input` into a weenv layer written to `output`, with the work spread
/// over threads: the calling thread reads and walks the tar stream and cuts frames; `workers`
/// threads compress (and hash) frames; one thread writes the frames in order and hashes the
/// blob; one hashes the input (the diff_id). `workers <= 1`: everything on the calling thread
/// ([`write_layer`]). The output is the same byte for byte whatever `workers` is; at most
/// `2 * workers + 6` frames are in flight.
pub fn write_layer_parallel<R: Read, W: Write + Send>(
    input: R,
    output: W,
    opts: &WriterOptions,
    workers: usize,
) -> Result<LayerSummary, FormatError> {
    if workers <= 1 {
        return write_layer(input, output, opts);
    }
    opts.validate()?;
    std::thread::scope(|scope| {
        let out = FrameOut::pool(output, workers, scope)?;
        let input = TeeHash::thread(input, scope)?;
        write_frames(input, out, opts)
    })
}

fn write_frames<R: Read, W: Write>(
    mut input: TeeHash<'_, R>,
    out: FrameOut<'_, W>,
    opts: &WriterOptions,
) -> Result<LayerSummary, FormatError> {
    let mut sink = Sink {
        opts,
        out,
        shared: Vec::with_capacity(opts.frame_size as usize),
        chunk: Vec::new(),
        payload: Payload::None,
        toc: Toc::new(),
    };
    // The walker reads 64 KiB at a time, so unbuffered inputs cost no syscall per block.
    walk(&mut input, &mut sink)?;
    sink.flush_shared()?;
    let (diff_id, input_len) = input.finish()?;
    let (mut out, frames) = sink.out.finish()?;
    sink.toc.frames = frames;

    let toc_offset = out.written;
    let (tail, toc_digest, toc_len) = toc_tail(&sink.toc, toc_offset)?;
    out.put(&tail)?;
    out.inner
        .flush()
        .map_err(|e| FormatError::io("flushing the layer blob", e))?;
    let blob_digest = Digest::from_sha256_bytes(&out.hash.finalize().into());
    Ok(LayerSummary {
        blob_digest,
        blob_size: out.written,
        diff_id,
        toc_digest,
        toc_offset,
        toc_length: toc_len + FOOTER_SIZE as u64,
        entry_count: sink.toc.entries.len() as u64,
        frame_count: sink.toc.frames.len() as u64,
        uncompressed_size: input_len,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// 100 files of 10 KiB (512-byte headers) then a 2.5 MiB file.
    fn small_then_big() -> Vec<Piece> {
        let mut p = Vec::new();
        for _ in 0..100 {
            p.extend([Piece::Meta(512), Piece::File(10 << 10)]);
        }
        p.extend([Piece::Meta(512), Piece::File(5 << 19), Piece::Meta(1024)]);
        p
    }

    #[test]
    fn framing_policy_small_file_regions_and_big_files() {
        let opts = WriterOptions::default();
        let f = frame_lengths(&small_then_big(), &opts);
        // 100 small files (1,075,200 bytes with headers) + the big file's header: 256 KiB
        // shared frames, each closed before a file that would not fit; a file never straddles.
        let shared: Vec<u64> = f[..f.len() - 4].to_vec();
        assert!(shared.iter().all(|l| *l <= 256 << 10), "{shared:?}");
        assert_eq!(shared.len(), 5);
        assert_eq!(shared.iter().sum::<u64>(), 100 * (512 + (10 << 10)) + 512);
        assert_eq!(shared[0], 24 * (512 + (10 << 10)) + 512); // 25th file's payload does not fit
                                                              // The big file: 1 MiB chunks, the last one shorter; then the end-of-archive blocks.
        assert_eq!(&f[f.len() - 4..], &[1 << 20, 1 << 20, 1 << 19, 1024]);
        // Before issue 15: 1 MiB shared frames, the small files share two frames.
        let old = WriterOptions {
            frame_size: 1 << 20,
            ..WriterOptions::default()
        };
        let f = frame_lengths(&small_then_big(), &old);
        assert_eq!(f.len(), 2 + 3 + 1);
    }

    #[test]
    fn framing_policy_edges() {
        let o = WriterOptions {
            frame_size: 1000,
            small_file_threshold: 600,
            chunk_size: 700,
            level: 3,
            shared_level: None,
        };
        // Meta bytes fill frames exactly and straddle; an empty file cuts nothing.
        assert_eq!(
            frame_lengths(&[Piece::Meta(2500), Piece::File(0)], &o),
            [1000, 1000, 500]
        );
        // A small file that fits exactly, then meta: the full frame closes first.
        assert_eq!(
            frame_lengths(&[Piece::Meta(400), Piece::File(600), Piece::Meta(10)], &o),
            [1000, 10]
        );
        // One byte over the threshold: its own chunk frame, flushing the shared one.
        assert_eq!(
            frame_lengths(&[Piece::Meta(10), Piece::File(601), Piece::Meta(10)], &o),
            [10, 601, 10]
        );
        assert_eq!(frame_lengths(&[Piece::File(1500)], &o), [700, 700, 100]);
        assert!(frame_lengths(&[], &o).is_empty());
    }

    #[test]
    fn options_are_validated() {
        assert!(WriterOptions::default().validate().is_ok());
        let bad = WriterOptions {
            small_file_threshold: 2 << 20,
            ..Default::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(FormatError::InvalidOption {
                field: "small_file_threshold",
                ..
            })
        ));
        let bad = WriterOptions {
            chunk_size: 1,
            ..Default::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(FormatError::InvalidOption {
                field: "chunk_size",
                ..
            })
        ));
        let bad = WriterOptions {
            level: 0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = WriterOptions {
            shared_level: Some(23),
            ..Default::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(FormatError::InvalidOption {
                field: "shared_level",
                ..
            })
        ));
    }
}
