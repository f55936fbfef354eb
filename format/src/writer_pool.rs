//! Where the writer's frames go once they are cut: compressed (zstd) and hashed (sha256 of the
//! uncompressed bytes), then appended to the blob in the order they were cut, with their TOC
//! [`Frame`] records. Either inline on the calling thread, or on a bounded pool of worker
//! threads while the caller keeps walking the tar stream.
//!
//! Output is the same byte for byte whatever the number of workers: frame boundaries are
//! decided by the caller before a frame is handed over, every frame is compressed on its own
//! with the same parameters (a zstd frame does not depend on the frames before it), and frames
//! are written strictly in hand-over order.
//!
//! Memory: at most `2 * workers + 6` frames are handed over and not yet written (each an
//! uncompressed buffer, plus its compressed copy once done); the caller blocks on the oldest
//! frame when that bound is reached.

use crate::toc::{Frame, FrameIdx};
use crate::{Digest, FormatError};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::Scope;

/// Counts and hashes what is written.
pub(crate) struct HashingWriter<W> {
    pub(crate) inner: W,
    pub(crate) written: u64,
    pub(crate) hash: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            written: 0,
            hash: Sha256::new(),
        }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        self.inner
            .write_all(bytes)
            .map_err(|e| FormatError::io("writing the layer blob", e))?;
        self.written += bytes.len() as u64;
        self.hash.update(bytes);
        Ok(())
    }
}

/// A zstd compressor with the format's frame parameters (content size recorded, no checksum,
/// no dictionary id).
pub(crate) fn compressor(level: i32) -> Result<zstd::bulk::Compressor<'static>, FormatError> {
    let mut comp = zstd::bulk::Compressor::new(level)
        .map_err(|e| FormatError::io("creating a zstd compressor", e))?;
    for p in [
        zstd::zstd_safe::CParameter::ContentSizeFlag(true),
        zstd::zstd_safe::CParameter::ChecksumFlag(false),
        zstd::zstd_safe::CParameter::DictIdFlag(false),
    ] {
        comp.set_parameter(p)
            .map_err(|e| FormatError::io("configuring the zstd compressor", e))?;
    }
    Ok(comp)
}

/// A compressed frame and the digest of its uncompressed bytes.
type Encoded = (Vec<u8>, Digest);

/// One compressor per zstd level in use (a layer uses one or two levels), created on first use.
#[derive(Default)]
struct Compressors(BTreeMap<i32, zstd::bulk::Compressor<'static>>);

impl Compressors {
    fn encode(&mut self, level: i32, data: &[u8]) -> Result<Encoded, FormatError> {
        let comp = match self.0.entry(level) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(compressor(level)?),
        };
        let c = comp
            .compress(data)
            .map_err(|e| FormatError::io("compressing a frame", e))?;
        Ok((c, Digest::sha256(data)))
    }
}

/// A frame handed to a worker: its sequence number, zstd level and uncompressed bytes.
type Job = (u32, i32, Vec<u8>);
/// A worker's answer: sequence number, the uncompressed bytes (returned for reuse), result.
type Done = (u32, Vec<u8>, Result<Encoded, FormatError>);

/// What the writer thread hands back: the blob writer and the records of the frames written.
type Written<W> = (HashingWriter<W>, Vec<Frame>);

enum Mode<'scope, W> {
    Inline {
        comps: Compressors,
        out: HashingWriter<W>,
        frames: Vec<Frame>,
    },
    Pool {
        jobs: Option<SyncSender<Job>>,
        /// Buffers of written frames, one message per frame written.
        written: Receiver<Vec<u8>>,
        /// Taken when it is joined.
        writer: Option<std::thread::ScopedJoinHandle<'scope, Result<Written<W>, FormatError>>>,
        /// Frames handed over and not yet reported written.
        in_flight: usize,
        max_in_flight: usize,
    },
}

/// Frames in flight beyond two per worker. Frames differ in cost (a 256 KiB shared frame at a
/// high level takes several times as long as a 1 MiB chunk at a low one) and are written in
/// order, so a slow frame at the head would stall the cutting thread with a tight bound.
const IN_FLIGHT_SLACK: usize = 6;

/// Frames in, blob bytes + TOC frame records out.
pub(crate) struct FrameOut<'scope, W> {
    /// Frames handed over so far (written or not): the index of the next one.
    handed: u32,
    mode: Mode<'scope, W>,
    /// Emptied frame buffers for reuse.
    spare: Vec<Vec<u8>>,
}

impl<'scope, W: Write> FrameOut<'scope, W> {
    /// Compress, hash and write on the calling thread.
    pub(crate) fn inline(out: W) -> Self {
        FrameOut {
            handed: 0,
            mode: Mode::Inline {
                comps: Compressors::default(),
                out: HashingWriter::new(out),
                frames: Vec::new(),
            },
            spare: Vec::new(),
        }
    }

    /// Compress (and hash each frame) on `workers` threads spawned in `scope`, and write the
    /// frames in order (hashing the blob) on one more thread, so that the calling thread only
    /// cuts frames. The threads end when [`FrameOut::finish`] is called or this value is
    /// dropped.
    pub(crate) fn pool(
        out: W,
        workers: usize,
        scope: &'scope Scope<'scope, '_>,
    ) -> Result<Self, FormatError>
    where
        W: Send + 'scope,
    {
        let workers = workers.max(1);
        let max_in_flight = 2 * workers + IN_FLIGHT_SLACK;
        let (jobs_tx, jobs_rx) = sync_channel::<Job>(max_in_flight);
        let (done_tx, done_rx) = channel::<Done>();
        let (written_tx, written_rx) = channel::<Vec<u8>>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for _ in 0..workers {
            let (rx, tx) = (Arc::clone(&jobs_rx), done_tx.clone());
            std::thread::Builder::new()
                .name("weenv-zstd".into())
                .spawn_scoped(scope, move || worker(&rx, &tx))
                .map_err(|e| FormatError::io("starting a compression thread", e))?;
        }
        drop(done_tx);
        let writer = std::thread::Builder::new()
            .name("weenv-blob".into())
            .spawn_scoped(scope, move || {
                write_in_order(HashingWriter::new(out), &done_rx, &written_tx)
            })
            .map_err(|e| FormatError::io("starting the blob writer thread", e))?;
        Ok(FrameOut {
            handed: 0,
            mode: Mode::Pool {
                jobs: Some(jobs_tx),
                written: written_rx,
                writer: Some(writer),
                in_flight: 0,
                max_in_flight,
            },
            spare: Vec::new(),
        })
    }

    /// Index the next frame handed over will get.
    pub(crate) fn next_idx(&self) -> FrameIdx {
        FrameIdx(self.handed)
    }

    /// An empty buffer for the next frame (reused when one is free).
    pub(crate) fn buffer(&mut self, capacity: usize) -> Vec<u8> {
        self.spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// Hand over a frame (non-empty) to be compressed at zstd `level`; returns its index. The
    /// frame is written before any frame handed over after it.
    pub(crate) fn emit(&mut self, mut data: Vec<u8>, level: i32) -> Result<FrameIdx, FormatError> {
        let idx = self.handed;
        self.handed = idx.checked_add(1).ok_or(FormatError::AbsurdSize {
            what: "frame count",
            value: u64::from(idx) + 1,
            limit: u32::MAX.into(),
        })?;
        match &mut self.mode {
            Mode::Inline { comps, out, frames } => {
                let encoded = comps.encode(level, &data)?;
                write_frame(out, frames, &data, encoded)?;
                data.clear();
                self.spare.push(data);
            }
            Mode::Pool {
                jobs,
                written,
                writer,
                in_flight,
                max_in_flight,
            } => {
                while *in_flight >= *max_in_flight {
                    // Blocks until the writer thread wrote the oldest frame (or ended).
                    let Ok(buf) = written.recv() else { break };
                    *in_flight -= 1;
                    self.spare.push(buf);
                }
                let sent = jobs.as_ref().map(|tx| tx.send((idx, level, data)));
                if !matches!(sent, Some(Ok(()))) {
                    // A thread ended early: the writer's error says why.
                    jobs.take();
                    return Err(match join(writer) {
                        Err(e) => e,
                        Ok(_) => closed(),
                    });
                }
                *in_flight += 1;
            }
        }
        Ok(FrameIdx(idx))
    }

    /// Write every frame handed over; returns the blob writer (positioned after the last frame)
    /// and the records of all frames, in order.
    pub(crate) fn finish(self) -> Result<Written<W>, FormatError> {
        let handed = self.handed;
        let (out, frames) = self.stop()?;
        if frames.len() as u64 != u64::from(handed) {
            return Err(closed());
        }
        Ok((out, frames))
    }

    /// Close the pool (idle workers end once the queue is drained) and wait for the writer.
    fn stop(self) -> Result<Written<W>, FormatError> {
        match self.mode {
            Mode::Inline { out, frames, .. } => Ok((out, frames)),
            Mode::Pool {
                jobs, mut writer, ..
            } => {
                drop(jobs);
                join(&mut writer)
            }
        }
    }
}

/// Wait for the writer thread (once; later calls report a closed pool).
fn join<W>(
    writer: &mut Option<std::thread::ScopedJoinHandle<'_, Result<Written<W>, FormatError>>>,
) -> Result<Written<W>, FormatError> {
    match writer.take() {
        Some(handle) => handle.join().unwrap_or_else(|_| Err(closed())),
        None => Err(closed()),
    }
}

/// Append one compressed frame to the blob and record it.
fn write_frame<W: Write>(
    out: &mut HashingWriter<W>,
    frames: &mut Vec<Frame>,
    data: &[u8],
    (c, digest): Encoded,
) -> Result<(), FormatError> {
    let offset = out.written;
    out.put(&c)?;
    frames.push(Frame {
        offset,
        clen: c.len() as u64,
        ulen: data.len() as u64,
        digest,
    });
    Ok(())
}

/// The writer thread: receives compressed frames in any order, writes them in sequence order,
/// hands each written frame's buffer back (that is what bounds the frames in flight), until
/// every worker has ended.
fn write_in_order<W: Write>(
    mut out: HashingWriter<W>,
    done: &Receiver<Done>,
    written: &Sender<Vec<u8>>,
) -> Result<Written<W>, FormatError> {
    let mut frames = Vec::new();
    // Finished frames waiting for an earlier one.
    let mut ready: BTreeMap<u32, (Vec<u8>, Encoded)> = BTreeMap::new();
    while let Ok((seq, data, result)) = done.recv() {
        ready.insert(seq, (data, result?));
        while let Some((mut data, encoded)) = ready.remove(&(frames.len() as u32)) {
            write_frame(&mut out, &mut frames, &data, encoded)?;
            data.clear();
            // The cutting thread may have stopped listening (it failed): nothing to do.
            let _ = written.send(data);
        }
    }
    Ok((out, frames))
}

/// Bytes the input hasher thread gets at a time.
const HASH_BATCH: usize = 1 << 20;

/// A reader that hashes (sha256) and counts what is read through it: the diff_id of the tar
/// stream. The hashing runs on the calling thread, or on a thread of its own fed with 1 MiB
/// copies (at most two in flight), which takes it off the thread that walks the tar stream.
pub(crate) struct TeeHash<'scope, R> {
    inner: R,
    len: u64,
    hash: HashOn<'scope>,
}

enum HashOn<'scope> {
    Inline(Sha256),
    Thread {
        batch: Vec<u8>,
        tx: Option<SyncSender<Vec<u8>>>,
        /// Hashed batches, back for reuse.
        back: Receiver<Vec<u8>>,
        handle: Option<std::thread::ScopedJoinHandle<'scope, Digest>>,
    },
}

impl<'scope, R: Read> TeeHash<'scope, R> {
    pub(crate) fn inline(inner: R) -> Self {
        TeeHash {
            inner,
            len: 0,
            hash: HashOn::Inline(Sha256::new()),
        }
    }

    pub(crate) fn thread(inner: R, scope: &'scope Scope<'scope, '_>) -> Result<Self, FormatError> {
        let (tx, rx) = sync_channel::<Vec<u8>>(2);
        let (back_tx, back) = channel::<Vec<u8>>();
        let handle = std::thread::Builder::new()
            .name("weenv-diffid".into())
            .spawn_scoped(scope, move || {
                let mut h = Sha256::new();
                while let Ok(mut batch) = rx.recv() {
                    h.update(&batch);
                    batch.clear();
                    let _ = back_tx.send(batch);
                }
                Digest::from_sha256_bytes(&h.finalize().into())
            })
            .map_err(|e| FormatError::io("starting the input hasher thread", e))?;
        Ok(TeeHash {
            inner,
            len: 0,
            hash: HashOn::Thread {
                batch: Vec::with_capacity(HASH_BATCH),
                tx: Some(tx),
                back,
                handle: Some(handle),
            },
        })
    }

    /// The sha256 and length of everything read.
    pub(crate) fn finish(mut self) -> Result<(Digest, u64), FormatError> {
        let digest = match &mut self.hash {
            HashOn::Inline(h) => Digest::from_sha256_bytes(&h.clone().finalize().into()),
            HashOn::Thread {
                batch, tx, handle, ..
            } => {
                if let Some(tx) = tx.take() {
                    if !batch.is_empty() {
                        tx.send(std::mem::take(batch)).map_err(|_| hasher_gone())?;
                    }
                }
                handle
                    .take()
                    .ok_or_else(hasher_gone)?
                    .join()
                    .map_err(|_| hasher_gone())?
            }
        };
        Ok((digest, self.len))
    }
}

impl<R: Read> Read for TeeHash<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let bytes = &buf[..n];
        self.len += n as u64;
        match &mut self.hash {
            HashOn::Inline(h) => h.update(bytes),
            HashOn::Thread {
                batch, tx, back, ..
            } => {
                batch.extend_from_slice(bytes);
                if batch.len() >= HASH_BATCH {
                    let next = back
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(HASH_BATCH));
                    let full = std::mem::replace(batch, next);
                    let sent = tx.as_ref().map(|tx| tx.send(full));
                    if !matches!(sent, Some(Ok(()))) {
                        return Err(std::io::Error::other("the input hasher thread ended"));
                    }
                }
            }
        }
        Ok(n)
    }
}

fn hasher_gone() -> FormatError {
    FormatError::io(
        "hashing the tar stream",
        std::io::Error::other("the hasher thread ended unexpectedly"),
    )
}

fn closed() -> FormatError {
    FormatError::io(
        "compressing frames",
        std::io::Error::other("a compression thread ended unexpectedly"),
    )
}

fn worker(jobs: &Mutex<Receiver<Job>>, done: &Sender<Done>) {
    let mut comps = Compressors::default();
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((seq, level, data)) = job else { return };
        // A panic would leave the writer waiting for this frame forever: make it an error.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| comps.encode(level, &data)))
                .unwrap_or_else(|_| {
                    Err(FormatError::io(
                        "compressing a frame",
                        std::io::Error::other("the compressor panicked"),
                    ))
                });
        if done.send((seq, data, result)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frames(n: u32) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut v = crate::testdata::noise(u64::from(i), 3000 + i as usize * 17);
                v.extend(std::iter::repeat_n(i as u8, 5000));
                v
            })
            .collect()
    }

    #[test]
    fn pool_writes_in_order_within_the_bound_and_like_inline() {
        // Two levels, like shared frames and chunks.
        let level = |i: usize| if i.is_multiple_of(3) { 9 } else { 3 };
        let mut inline = FrameOut::inline(Vec::new());
        for (i, f) in frames(40).into_iter().enumerate() {
            inline.emit(f, level(i)).unwrap();
        }
        let (inline_out, inline_frames) = inline.finish().unwrap();
        std::thread::scope(|s| {
            let mut pool = FrameOut::pool(Vec::new(), 3, s).unwrap();
            for (i, f) in frames(40).into_iter().enumerate() {
                assert_eq!(pool.next_idx(), FrameIdx(i as u32));
                // Like the writer: frames are cut into recycled buffers.
                let mut data = pool.buffer(f.len());
                data.extend_from_slice(&f);
                assert_eq!(pool.emit(data, level(i)).unwrap(), FrameIdx(i as u32));
                let Mode::Pool { in_flight, .. } = &pool.mode else {
                    panic!("not a pool")
                };
                assert!(*in_flight <= 12, "{in_flight} frames in flight");
            }
            assert!(pool.spare.len() <= 13, "{} spare buffers", pool.spare.len());
            let (out, frames) = pool.finish().unwrap();
            assert_eq!(frames, inline_frames);
            assert_eq!(out.inner, inline_out.inner);
            assert_eq!(out.written, inline_out.written);
            assert_eq!(out.hash.finalize(), inline_out.hash.finalize());
        });
    }

    /// Accepts `room` bytes, then fails.
    struct Full {
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::other("disk full"));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_error_on_the_writer_thread_is_returned() {
        std::thread::scope(|s| {
            let mut pool = FrameOut::pool(Full { room: 5000 }, 2, s).unwrap();
            let mut err = None;
            for f in frames(40) {
                if let Err(e) = pool.emit(f, 3) {
                    err = Some(e);
                    break;
                }
            }
            let err = match err {
                Some(e) => e,
                None => pool.finish().err().unwrap(),
            };
            assert!(err.to_string().contains("disk full"), "{err}");
        });
    }
}
