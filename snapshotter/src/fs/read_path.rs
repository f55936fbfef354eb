//! The work behind FUSE READ and OPEN of a regular file, as `Result<T, Errno>` helpers the
//! handlers in [`super::WeenvFs`] call between decoding a request and replying.
//!
//! - [`read`]: a read is served from the native tree, from cached frames, or later (a future
//!   the handler runs on the runtime, so no FUSE worker waits on the network); it also starts
//!   read-ahead, the directory prefetch on a small file's first read, and the header check
//!   every file passes before any byte of it is served.
//! - [`open`]: a plain open (page cache kept), or, on the full session, passthrough of a
//!   complete file (its copy or native tree; the reply waits for the backing file on a
//!   blocking thread), and the background copy of a file whose frames are all on disk.
//!
//! Every byte served is counted in `read_bytes_served`.

use super::inode::NodeKind;
use super::layer::Layer;
use super::ops::{FsState, ReadPlan};
use super::passthrough::OpenMode;
use super::{native, trust, SessionKind, SessionState};
use fuser::{Errno, FileHandle, FopenFlags, ReplyOpen};
use futures::future::BoxFuture;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The data of a read: at hand, or once frames arrive.
pub enum ReadData {
    Now(Vec<u8>),
    Later(BoxFuture<'static, Result<Vec<u8>, Errno>>),
}

/// Reads `size` bytes at `offset` of inode `ino`.
pub fn read(st: &Arc<FsState>, ino: u64, offset: u64, size: u32) -> Result<ReadData, Errno> {
    let plan = st.read_plan(ino, offset, size)?;
    if plan.frames.is_empty() {
        return Ok(ReadData::Now(Vec::new()));
    }
    if plan.layer.native_ok() {
        // Complete and verified: the bytes are in the native tree (its frames are gone).
        if let Some(data) = st.read_native(&plan, offset, size) {
            plan.layer.note_read(plan.node, offset, u64::from(size));
            return Ok(ReadData::Now(served(st, data)));
        }
    }
    if st.fill.read_ahead_bytes > 0 {
        let ra = st.read_ahead_frames(&plan);
        st.prefetch(plan.layer.clone(), ra);
        let scan = st.scan_frames(&plan);
        st.prefetch(plan.layer.clone(), scan);
    }
    plan.layer.note_read(plan.node, offset, u64::from(size));
    if plan.layer.first_touch(plan.node) {
        touch_dir_of(st, &plan.layer, plan.node);
    }
    // The file's header is checked against its TOC entry before any byte is served: here
    // when its frames are cached, else in the async read below.
    let unchecked = match trust::check_header_cached(st, &plan.layer, plan.node) {
        Some(Ok(())) => false,
        Some(Err(e)) => return Err(e),
        None => true,
    };
    let st = st.clone();
    if unchecked {
        return Ok(ReadData::Later(Box::pin(async move {
            trust::check_header(&st, &plan.layer, plan.node, &plan.frames).await?;
            let data = st.read(&plan).await.map_err(|e| e.errno())?;
            Ok(served(&st, data))
        })));
    }
    if let Some(data) = st.read_from_cache(&plan) {
        return Ok(ReadData::Now(served(&st, data)));
    }
    Ok(ReadData::Later(Box::pin(async move {
        let data = fetched(&st, &plan).await?;
        Ok(served(&st, data))
    })))
}

/// Reads `plan` through the frame store (after its header was checked).
async fn fetched(st: &FsState, plan: &ReadPlan) -> Result<Vec<u8>, Errno> {
    st.read(plan).await.map_err(|e| {
        tracing::debug!(error = %e, layer = %plan.layer.digest, node = plan.node, "read failed: EIO");
        e.errno()
    })
}

/// Counts `data` as served.
fn served(st: &FsState, data: Vec<u8>) -> Vec<u8> {
    st.metrics
        .read_bytes_served
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    data
}

/// First read of a small file in a directory: prefetch the frames holding the directory's
/// other small files (packed next to each other in tar order). Triggered by reads, not
/// lookups: lookups also come from path walks and module searches that read nothing
/// (measured on python3 start-up: lookup-triggered prefetch fetched 39% more bytes).
fn touch_dir_of(st: &Arc<FsState>, layer: &Arc<Layer>, node: u32) {
    if st.fill.dir_prefetch_frames == 0 {
        return;
    }
    let Some(n) = layer.table.node(node) else {
        return;
    };
    if n.size() > st.fill.small_file_bytes || !layer.first_touch(n.parent()) {
        return;
    }
    let l2 = st.store.l2();
    let frames: Vec<_> = st
        .dir_prefetch_frames(layer, n.parent())
        .into_iter()
        .filter(|i| {
            layer
                .frames
                .frames
                .get(i.0 as usize)
                .is_some_and(|f| !l2.contains(&f.digest))
        })
        .collect();
    st.prefetch(layer.clone(), frames);
}

/// How an OPEN is answered.
pub enum Opened {
    /// This handle, these flags, now.
    Now(FileHandle, FopenFlags),
    /// ENOSYS, once per plain session: the kernel opens every file of it without asking from
    /// now on (not a failure).
    NoOpens,
    /// A plain open through the passthrough bookkeeping (page cache kept).
    Cached,
    /// Passthrough: the reply waits for the backing file, on a blocking thread.
    Passthrough(Box<dyn FnOnce(ReplyOpen) + Send>),
}

/// Opens inode `ino` with `flags` on `session`.
pub fn open(
    st: &Arc<FsState>,
    session: &SessionState,
    ino: u64,
    flags: i32,
) -> Result<Opened, Errno> {
    if session.kind == SessionKind::Plain {
        if session.zero_open() {
            return Ok(Opened::NoOpens);
        }
        // An older kernel: a plain open, page cache kept (no passthrough on this session).
        return Ok(Opened::Now(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE));
    }
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        return Err(Errno::EROFS);
    }
    let (layer, node) = st.resolve(ino)?;
    let n = layer.table.node(node).ok_or(Errno::ENOENT)?;
    if n.kind() != NodeKind::File {
        return Ok(Opened::Now(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE));
    }
    if layer.quarantined() {
        return Err(Errno::EIO);
    }
    // Passthrough only to a complete copy made earlier (after the fill, or in the
    // background after an earlier open): copying a file inside open() put the copy and
    // its fsync on the reader's critical path (start-up, first warm read).
    // (Passthrough hands the bytes to the kernel: only once the header is checked.)
    // A native layer's files are all complete (its tree), whatever their size.
    let native = layer.native_ok();
    let complete = n.size() > 0
        && !trust::header_pending(st, &layer, node)
        && st.passthrough.active()
        && (native || st.passthrough.has_complete(st.store.l2(), &layer, node));
    if !complete && !native && st.passthrough.active() && n.size() >= st.fill.materialise_min_bytes
    {
        materialise_if_on_disk(st, &layer, ino, node);
    }
    if complete {
        layer.note_open(node); // reads will not reach us: record the open
    }
    Ok(match st.passthrough.begin_open(ino, complete) {
        OpenMode::Cached => Opened::Cached,
        OpenMode::Passthrough => {
            let st = st.clone();
            Opened::Passthrough(Box::new(move |reply| {
                passthrough_reply(&st, &layer, ino, node, native, reply)
            }))
        }
    })
}

/// Copies a file whose frames are all on disk in the background (once per inode at a time),
/// so a later open can hand it to the kernel.
fn materialise_if_on_disk(st: &Arc<FsState>, layer: &Arc<Layer>, ino: u64, node: u32) {
    let l2 = st.store.l2();
    let on_disk = layer.file_frames(node).iter().all(|i| {
        layer
            .frames
            .frames
            .get(i.0 as usize)
            .is_some_and(|f| l2.contains(&f.digest))
    });
    if on_disk && st.passthrough.claim_materialise(ino) {
        let (st2, layer) = (st.clone(), layer.clone());
        st.rt.spawn_blocking(move || {
            if let Err(e) = st2.passthrough.materialise(st2.store.l2(), &layer, node) {
                tracing::warn!(error = %e, layer = %layer.digest, node, "materialising a complete file failed");
            }
            st2.passthrough.release_materialise(ino);
        });
    }
}

/// Answers a passthrough open with the file's backing file: its native tree's or its copy.
fn passthrough_reply(
    st: &FsState,
    layer: &Layer,
    ino: u64,
    node: u32,
    native: bool,
    reply: ReplyOpen,
) {
    let (path, copy) = if native {
        let root = st.store.l2().native_path(&layer.digest);
        (native::node_path(layer, &root, node), None)
    } else {
        let path = match st.passthrough.materialise(st.store.l2(), layer, node) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, layer = %layer.digest, node, "materialising a complete file failed");
                None
            }
        };
        (path, Some((&layer.digest, node)))
    };
    if st
        .passthrough
        .reply_passthrough(reply, st.store.l2(), copy, ino, path.as_deref())
    {
        st.metrics.passthrough_opens.fetch_add(1, Ordering::Relaxed);
    }
}
