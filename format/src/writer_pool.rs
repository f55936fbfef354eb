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
//! Memory: at most `2 * workers` frames are handed over and not yet written (each an
//! uncompressed buffer, plus its compressed copy once done); the caller blocks on the oldest
//! frame when that bound is reached.

use crate::toc::{Frame, FrameIdx};
use crate::{Digest, FormatError};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
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

fn encode(comp: &mut zstd::bulk::Compressor<'static>, data: &[u8]) -> Result<Encoded, FormatError> {
    let c = comp
        .compress(data)
        .map_err(|e| FormatError::io("compressing a frame", e))?;
    Ok((c, Digest::sha256(data)))
}

/// A frame handed to a worker: its sequence number and uncompressed bytes.
type Job = (u32, Vec<u8>);
/// A worker's answer: sequence number, the uncompressed bytes (returned for reuse), result.
type Done = (u32, Vec<u8>, Result<Encoded, FormatError>);

enum Mode {
    Inline(Box<zstd::bulk::Compressor<'static>>),
    Pool {
        jobs: Option<SyncSender<Job>>,
        done: Receiver<Done>,
        /// Finished frames waiting for an earlier one.
        ready: BTreeMap<u32, (Vec<u8>, Encoded)>,
        max_in_flight: usize,
    },
}

/// Frames in, blob bytes + TOC frame records out.
pub(crate) struct FrameOut<W> {
    pub(crate) out: HashingWriter<W>,
    /// Records of the frames written so far (in order).
    pub(crate) frames: Vec<Frame>,
    /// Frames handed over so far (written or not): the index of the next one.
    handed: u32,
    mode: Mode,
    /// Emptied frame buffers for reuse.
    spare: Vec<Vec<u8>>,
}

impl<W: Write> FrameOut<W> {
    /// Compress on the calling thread.
    pub(crate) fn inline(out: W, level: i32) -> Result<Self, FormatError> {
        Ok(Self::with_mode(
            out,
            Mode::Inline(Box::new(compressor(level)?)),
        ))
    }

    /// Compress on `workers` threads spawned in `scope` (they end when this value is dropped).
    pub(crate) fn pool<'scope>(
        out: W,
        level: i32,
        workers: usize,
        scope: &'scope Scope<'scope, '_>,
    ) -> Result<Self, FormatError> {
        let workers = workers.max(1);
        let max_in_flight = 2 * workers;
        let (jobs_tx, jobs_rx) = sync_channel::<Job>(max_in_flight);
        let (done_tx, done_rx) = channel::<Done>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for _ in 0..workers {
            let comp = compressor(level)?;
            let (rx, tx) = (Arc::clone(&jobs_rx), done_tx.clone());
            std::thread::Builder::new()
                .name("weenv-zstd".into())
                .spawn_scoped(scope, move || worker(comp, &rx, &tx))
                .map_err(|e| FormatError::io("starting a compression thread", e))?;
        }
        Ok(Self::with_mode(
            out,
            Mode::Pool {
                jobs: Some(jobs_tx),
                done: done_rx,
                ready: BTreeMap::new(),
                max_in_flight,
            },
        ))
    }

    fn with_mode(out: W, mode: Mode) -> Self {
        FrameOut {
            out: HashingWriter::new(out),
            frames: Vec::new(),
            handed: 0,
            mode,
            spare: Vec::new(),
        }
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

    /// Hand over a frame (non-empty); returns its index. The frame is written before any frame
    /// handed over after it.
    pub(crate) fn emit(&mut self, data: Vec<u8>) -> Result<FrameIdx, FormatError> {
        let idx = self.handed;
        self.handed = idx.checked_add(1).ok_or(FormatError::AbsurdSize {
            what: "frame count",
            value: u64::from(idx) + 1,
            limit: u32::MAX.into(),
        })?;
        if let Mode::Inline(comp) = &mut self.mode {
            let encoded = encode(comp, &data)?;
            self.write(data, encoded)?;
            return Ok(FrameIdx(idx));
        }
        while let Mode::Pool { max_in_flight, .. } = &self.mode {
            if u64::from(idx) - (self.frames.len() as u64) < *max_in_flight as u64 {
                break;
            }
            self.wait_one()?;
        }
        let Mode::Pool { jobs: Some(tx), .. } = &self.mode else {
            return Err(closed());
        };
        tx.send((idx, data)).map_err(|_| closed())?;
        Ok(FrameIdx(idx))
    }

    /// Write every frame handed over; afterwards `frames` holds them all.
    pub(crate) fn finish(&mut self) -> Result<(), FormatError> {
        if let Mode::Pool { jobs, .. } = &mut self.mode {
            // No more jobs: idle workers end.
            jobs.take();
        }
        while (self.frames.len() as u64) < u64::from(self.handed) {
            self.wait_one()?;
        }
        Ok(())
    }

    /// Receive one finished frame from the pool and write every frame now in order.
    fn wait_one(&mut self) -> Result<(), FormatError> {
        let Mode::Pool { done, ready, .. } = &mut self.mode else {
            return Ok(());
        };
        let (seq, data, result) = done.recv().map_err(|_| closed())?;
        ready.insert(seq, (data, result?));
        loop {
            let next = self.frames.len() as u32;
            let Mode::Pool { ready, .. } = &mut self.mode else {
                return Ok(());
            };
            let Some((data, encoded)) = ready.remove(&next) else {
                return Ok(());
            };
            self.write(data, encoded)?;
        }
    }

    fn write(&mut self, mut data: Vec<u8>, (c, digest): Encoded) -> Result<(), FormatError> {
        let offset = self.out.written;
        self.out.put(&c)?;
        self.frames.push(Frame {
            offset,
            clen: c.len() as u64,
            ulen: data.len() as u64,
            digest,
        });
        data.clear();
        self.spare.push(data);
        Ok(())
    }
}

fn closed() -> FormatError {
    FormatError::io(
        "compressing frames",
        std::io::Error::other("a compression thread ended unexpectedly"),
    )
}

fn worker(
    mut comp: zstd::bulk::Compressor<'static>,
    jobs: &Mutex<Receiver<Job>>,
    done: &Sender<Done>,
) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((seq, data)) = job else { return };
        // A panic would leave the writer waiting for this frame forever: make it an error.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode(&mut comp, &data)))
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
        let mut inline = FrameOut::inline(Vec::new(), 3).unwrap();
        for f in frames(40) {
            inline.emit(f).unwrap();
        }
        inline.finish().unwrap();
        std::thread::scope(|s| {
            let mut pool = FrameOut::pool(Vec::new(), 3, 3, s).unwrap();
            for (i, f) in frames(40).into_iter().enumerate() {
                assert_eq!(pool.next_idx(), FrameIdx(i as u32));
                assert_eq!(pool.emit(f).unwrap(), FrameIdx(i as u32));
                let in_flight = u64::from(pool.handed) - pool.frames.len() as u64;
                assert!(in_flight <= 6, "{in_flight} frames in flight");
            }
            pool.finish().unwrap();
            assert_eq!(pool.frames, inline.frames);
            assert_eq!(pool.out.inner, inline.out.inner);
            assert!(pool.spare.len() <= 40);
        });
    }
}
