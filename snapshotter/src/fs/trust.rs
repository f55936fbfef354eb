//! Trust state of a lazily served layer: quarantine, the diff_id its image claims, and the
//! completion check.
//!
//! What is verified when (see the snapshotter README, "Trust model"):
//! - the manifest names the blob and its TOC digest; the TOC is checked against it and every
//!   frame against its TOC digest when fetched (`fetch::frames`);
//! - once every frame is in the cache, [`check_complete`] feeds the whole uncompressed stream,
//!   in order, to `weenv_format::tarcheck::StreamChecker` — every tar entry equals its TOC
//!   entry (type, mode, owner, devices, size, link, xattrs, header offset, content mapping),
//!   none missing, none extra — and compares the stream's sha256 with the claimed diff_id;
//! - before any byte of a regular file is served ([`check_header`], from the read path) and
//!   before an entry that can raise privilege is exposed ([`check_exposure`]: setuid/setgid,
//!   devices, `security.capability`), the entry's tar header — fetched through the normal
//!   cached frame path — is compared with its TOC entry (`tarcheck::check_entry`), once per
//!   entry (a bitset). This proves the bytes at the entry's header offset are a tar header
//!   equal to the TOC entry, not that a walk of the stream reaches that offset (a header
//!   forged inside another file's payload passes); the completion walk proves that;
//! - any disagreement quarantines the layer ([`LayerTrust::quarantine`]): from then on every
//!   read of its files fails with EIO, the reason is logged with the layer digest, counted in
//!   `weenv_layer_quarantined_total`, persisted through the [`QuarantineHook`] (the metadata
//!   store) and shown by `/status` and `weenv status`.

use super::inode::{Node, NodeKind};
use super::layer::Layer;
use super::ops::FsState;
use crate::fetch::{FetchError, FrameStore, Priority, RangeSource};
use crate::metrics::Metrics;
use fuser::Errno;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use weenv_format::tarcheck::{check_entry, StreamChecker, StreamReport, MAX_HEADER_SPAN};
use weenv_format::{Digest, Entry, EntryKind, FormatError, FrameIdx, Toc};

/// A trust outcome to persist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrustEvent<'a> {
    /// Quarantined, with the reason.
    Quarantined(&'a str),
    /// The completion check passed.
    Verified,
}

/// Persists a trust outcome of a layer.
pub type PersistFn = Box<dyn Fn(&Digest, TrustEvent<'_>) + Send + Sync>;

/// Node-wide: where quarantines are counted and persisted.
#[derive(Default)]
pub struct QuarantineHook {
    metrics: Arc<Metrics>,
    persist: RwLock<Option<PersistFn>>,
}

impl QuarantineHook {
    fn persist(&self, digest: &Digest, ev: TrustEvent<'_>) {
        if let Some(p) = self.persist.read().as_ref() {
            p(digest, ev);
        }
    }

    /// A hook counting into `metrics` (persisting nothing until [`Self::set_persist`]).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        QuarantineHook {
            metrics,
            persist: RwLock::new(None),
        }
    }

    /// Persist trust outcomes with `f` from now on.
    pub fn set_persist(&self, f: PersistFn) {
        *self.persist.write() = Some(f);
    }
}

/// Trust state of one layer.
#[derive(Default)]
pub struct LayerTrust {
    quarantined: AtomicBool,
    reason: Mutex<Option<String>>,
    claim: Mutex<Option<Digest>>,
    verified: AtomicBool,
    /// The completion walk proved the TOC is the tar (diff_id compared or not).
    walked: AtomicBool,
    hook: Mutex<Option<Arc<QuarantineHook>>>,
    /// One bit per node: its entry's header was checked against the tar.
    checked: Box<[AtomicU64]>,
    /// Stream offset of each frame and the stream length last (computed on first use).
    starts: OnceLock<Vec<u64>>,
    /// Held by a completion check (the fill's, or a verification on request): one at a time.
    pub check_lock: tokio::sync::Mutex<()>,
}

impl LayerTrust {
    /// The state of a layer with `nodes` nodes.
    pub fn new(nodes: usize) -> Self {
        LayerTrust {
            checked: (0..nodes.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        }
    }

    /// True once node `i`'s header was checked.
    pub fn header_checked(&self, i: usize) -> bool {
        self.checked
            .get(i / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (i % 64)) != 0)
    }

    fn mark_header_checked(&self, i: usize) {
        if let Some(w) = self.checked.get(i / 64) {
            w.fetch_or(1 << (i % 64), Ordering::AcqRel);
        }
    }

    fn stream_starts(&self, toc: &Toc) -> &[u64] {
        self.starts.get_or_init(|| toc.stream_offsets())
    }

    /// Connects the layer to the node's hook and records the diff_id its image claims.
    pub fn bind(&self, hook: Arc<QuarantineHook>, claim: Option<Digest>) {
        *self.hook.lock() = Some(hook);
        if claim.is_some() {
            *self.claim.lock() = claim;
        }
    }

    /// Records the diff_id the image claims (a layer exposed before its claim was known).
    pub fn set_claim(&self, claim: Digest) {
        *self.claim.lock() = Some(claim);
    }

    /// The claimed diff_id.
    pub fn claim(&self) -> Option<Digest> {
        self.claim.lock().clone()
    }

    /// True once quarantined.
    pub fn quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Acquire)
    }

    /// Why the layer is quarantined.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// True once the completion check passed (TOC = tar, stream = claimed diff_id).
    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// True once the completion walk proved the TOC is the tar (every header checked).
    pub fn walked(&self) -> bool {
        self.walked.load(Ordering::Acquire)
    }

    /// Quarantines the layer (first reason wins): logged, counted, persisted.
    pub fn quarantine(&self, digest: &Digest, reason: String) {
        if !self.set(reason.clone()) {
            return;
        }
        tracing::error!(layer = %digest, reason = %reason,
            "layer quarantined: every read of its files fails with EIO from now on");
        let hook = self.hook.lock().clone();
        if let Some(h) = hook {
            h.metrics.layers_quarantined.fetch_add(1, Ordering::Relaxed);
            h.persist(digest, TrustEvent::Quarantined(&reason));
        }
    }

    /// Restores a passed completion check read back from the store.
    pub fn restore_verified(&self) {
        self.walked.store(true, Ordering::Release);
        self.verified.store(true, Ordering::Release);
    }

    /// Restores a quarantine read back from the store (not logged or counted again).
    pub fn restore(&self, reason: String) {
        self.set(reason);
    }

    fn set(&self, reason: String) -> bool {
        let mut r = self.reason.lock();
        if r.is_some() {
            return false;
        }
        *r = Some(reason);
        self.quarantined.store(true, Ordering::Release);
        true
    }

    fn mark_verified(&self, digest: &Digest) {
        self.walked.store(true, Ordering::Release);
        self.verified.store(true, Ordering::Release);
        let hook = self.hook.lock().clone();
        if let Some(h) = hook {
            h.persist(digest, TrustEvent::Verified);
        }
    }
}

/// Outcome of [`check_complete`].
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// The stream hashes to the claimed diff_id.
    Verified(Digest),
    /// No claim to compare with (the stream hashed to this).
    Unclaimed(Digest),
    /// The layer disagrees with what it claims: quarantine with this reason.
    Mismatch(String),
}

/// The completion verdict for a stream whose check gave `walk` under claim `claim`. Pure.
pub fn completion_verdict(
    walk: Result<StreamReport, FormatError>,
    claim: Option<&Digest>,
) -> Completion {
    match (walk, claim) {
        (Err(e), _) => Completion::Mismatch(format!("the TOC does not match the tar stream: {e}")),
        (Ok(r), None) => Completion::Unclaimed(r.diff_id),
        (Ok(r), Some(c)) if *c == r.diff_id => Completion::Verified(r.diff_id),
        (Ok(r), Some(c)) => Completion::Mismatch(format!(
            "diff_id mismatch: the image claims {c}, the layer's tar stream is {}",
            r.diff_id
        )),
    }
}

/// Reads every frame of the layer in order (from the cache, refetching what was evicted) and
/// walks the uncompressed stream against the TOC (stopping at the first difference). `Err`:
/// a frame could not be read (nothing is concluded).
pub async fn walk_stream(
    store: &FrameStore,
    toc: &Toc,
    source: &Arc<dyn RangeSource>,
) -> Result<Result<StreamReport, FormatError>, FetchError> {
    let mut checker = StreamChecker::new(toc);
    for i in 0..toc.frames.len() as u32 {
        let f = store
            .get_frames(&toc.frames, source, &[FrameIdx(i)], Priority::Fill)
            .await?;
        for b in &f {
            checker.update(b);
        }
        if checker.error().is_some() {
            break;
        }
    }
    Ok(checker.finish())
}

/// The completion check of a layer whose frames are all cached: walk the stream against the
/// TOC, compare its sha256 with the claim, quarantine on any difference. Returns the verdict (`Err` when a frame could not be
/// read: nothing is concluded).
pub async fn check_complete(
    store: &FrameStore,
    toc: &Toc,
    source: &Arc<dyn RangeSource>,
    digest: &Digest,
    trust: &LayerTrust,
    metrics: &Metrics,
) -> Result<Completion, FetchError> {
    let walk = walk_stream(store, toc, source).await?;
    let v = completion_verdict(walk, trust.claim().as_ref());
    match &v {
        Completion::Verified(d) => {
            trust.mark_verified(digest);
            metrics.layers_verified.fetch_add(1, Ordering::Relaxed);
            tracing::info!(layer = %digest, diff_id = %d, "layer complete and verified");
        }
        Completion::Unclaimed(d) => {
            trust.walked.store(true, Ordering::Release);
            tracing::info!(layer = %digest, diff_id = %d, "layer complete (no claimed diff_id to compare with)");
        }
        Completion::Mismatch(reason) => trust.quarantine(digest, reason.clone()),
    }
    Ok(v)
}

/// True for a node that can raise privilege: setuid/setgid bits, a device (a char device
/// 0/0 is an overlay whiteout and is not one), or file capabilities. Such a node is exposed
/// only after its header was checked. Pure.
pub fn privileged(n: &Node<'_>) -> bool {
    n.perm() & 0o6000 != 0
        || n.kind() == NodeKind::Block
        || (n.kind() == NodeKind::Char && n.rdev() != (0, 0))
        || n.xattr(CAPABILITY_XATTR).is_some()
}

/// The xattr holding file capabilities.
pub const CAPABILITY_XATTR: &str = "security.capability";

/// Frames covering stream bytes `[from, to)`, given each frame's stream start and the stream
/// length last (`Toc::stream_offsets`); empty when `from` is past the stream. Pure.
pub fn frames_covering(starts: &[u64], from: u64, to: u64) -> std::ops::Range<usize> {
    let n = starts.len().saturating_sub(1);
    let len = starts.last().copied().unwrap_or(0);
    if from >= len {
        return n..n;
    }
    let first = starts[..n]
        .partition_point(|&s| s <= from)
        .saturating_sub(1);
    let last = starts[..n].partition_point(|&s| s < to.max(from + 1));
    first..last.max(first + 1)
}

/// `frames` (a start-up profile) plus the frames holding the headers of the files whose data
/// starts in them: a file whose data starts at a frame boundary has its header blocks at the
/// end of the frame before, which its header check will need. The profile's order (the order
/// its command first read them) is kept; each header frame goes just before the first frame
/// that needs it.
pub fn with_header_frames(layer: &Layer, frames: Vec<FrameIdx>) -> Vec<FrameIdx> {
    let wanted: std::collections::HashSet<FrameIdx> = frames.iter().copied().collect();
    let mut extra = std::collections::BTreeSet::new();
    for n in layer.table.ids() {
        let Some(node) = layer.table.node(n) else {
            continue;
        };
        if node.kind() != NodeKind::File || node.chunk_count() == 0 {
            continue;
        }
        if let Some(c) = node.chunks().first() {
            if c.frame_offset == 0 && c.frame.0 > 0 && wanted.contains(&c.frame) {
                let before = FrameIdx(c.frame.0 - 1);
                if !wanted.contains(&before) {
                    extra.insert(before);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(frames.len() + extra.len());
    for f in frames {
        if f.0 > 0 && extra.remove(&FrameIdx(f.0 - 1)) {
            out.push(FrameIdx(f.0 - 1));
        }
        out.push(f);
    }
    out
}

/// Whether `node`'s header must still be checked before it is served or exposed.
pub fn header_pending(st: &FsState, layer: &Layer, node: u32) -> bool {
    st.fill.check_headers && !layer.trust.walked() && !layer.trust.header_checked(node as usize)
}

/// Checks `node`'s tar header against its TOC entry (once per entry). A mismatch quarantines
/// the layer; it and a fetch failure are EIO. `along`: frames the caller is about to read,
/// fetched in the same request as the header's (one round trip, not two: a large file's
/// header sits in the frame before its first chunk).
pub async fn check_header(
    st: &FsState,
    layer: &Layer,
    node: u32,
    along: &[FrameIdx],
) -> Result<(), Errno> {
    if !header_pending(st, layer, node) {
        return Ok(());
    }
    let Some(entry) = layer.toc_entry(node) else {
        return Ok(());
    };
    match header_check(st, layer, &entry, along).await {
        Ok(()) => conclude(st, layer, node, &entry, Ok(())),
        Err(HeaderFail::Fetch(e)) => {
            tracing::debug!(layer = %layer.digest, path = %entry.path, error = %e, "header check could not fetch its frames: EIO");
            Err(e.errno())
        }
        Err(HeaderFail::Mismatch(e)) => conclude(st, layer, node, &entry, Err(e)),
    }
}

/// [`check_header`] when every frame it needs is cached (no network, no await: fine on a FUSE
/// thread); `None` when one is not.
pub fn check_header_cached(st: &FsState, layer: &Layer, node: u32) -> Option<Result<(), Errno>> {
    if !header_pending(st, layer, node) {
        return Some(Ok(()));
    }
    let Some(entry) = layer.toc_entry(node) else {
        return Some(Ok(()));
    };
    let res = header_check_cached(st, layer, &entry)?;
    Some(conclude(st, layer, node, &entry, res))
}

fn conclude(
    st: &FsState,
    layer: &Layer,
    node: u32,
    entry: &Entry,
    res: Result<(), FormatError>,
) -> Result<(), Errno> {
    match res {
        Ok(()) => {
            layer.trust.mark_header_checked(node as usize);
            st.metrics.header_checks.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => {
            tracing::debug!(layer = %layer.digest, path = %entry.path, "header check failed");
            layer.quarantine(format!("the TOC does not match the tar stream: {e}"));
            Err(Errno::EIO)
        }
    }
}

/// Before `node` is exposed (lookup, getattr, readdirplus): a privileged node is checked
/// first, on this FUSE thread (rare: setuid binaries, devices, capabilities). Plain metadata
/// is served from the TOC; the completion check covers it.
pub fn check_exposure(st: &FsState, layer: &Layer, node: u32) -> Result<(), Errno> {
    let Some(n) = layer.table.node(node) else {
        return Ok(());
    };
    if !privileged(&n) || !header_pending(st, layer, node) {
        return Ok(());
    }
    if let Some(done) = check_header_cached(st, layer, node) {
        return done;
    }
    let fut = check_header(st, layer, node, &[]);
    match tokio::runtime::Handle::try_current() {
        // A FUSE worker thread: no runtime of its own.
        Err(_) => st.rt.block_on(fut),
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| st.rt.block_on(fut))
        }
        Ok(_) => {
            tracing::warn!(layer = %layer.digest, node, "privileged entry looked up from a single-threaded runtime: cannot check its header here; EIO");
            Err(Errno::EIO)
        }
    }
}

enum HeaderFail {
    Fetch(FetchError),
    Mismatch(FormatError),
}

/// Where a header check starts: the frames from `entry.header` to its data start (files) or
/// one header block, and how far the header blocks may go (`MAX_HEADER_SPAN`).
fn header_start(
    toc: &Toc,
    starts: &[u64],
    entry: &Entry,
) -> Result<(std::ops::Range<usize>, u64), FormatError> {
    let len = starts.last().copied().unwrap_or(0);
    let span_end = entry.header.saturating_add(MAX_HEADER_SPAN).min(len);
    let need_end = match toc.data_start(entry) {
        Some(d) if entry.kind == EntryKind::File => d,
        _ => entry.header.saturating_add(512),
    }
    .min(len);
    let range = frames_covering(starts, entry.header, need_end);
    if range.is_empty() {
        return Err(FormatError::TocMismatch {
            path: entry.path.clone(),
            field: "header offset",
            toc: entry.header.to_string(),
            tar: format!("past the stream end ({len})"),
        });
    }
    Ok((range, span_end))
}

/// One step of a header check.
enum Step {
    Pass,
    /// The header blocks go on: check again over these frames.
    More(std::ops::Range<usize>),
    Fail(FormatError),
}

/// Checks `entry` against the frames of `range` (`frames`, in order), copying only the bytes
/// from its header to its data start (files) or to `span_end`.
fn header_step(
    toc: &Toc,
    starts: &[u64],
    entry: &Entry,
    range: &std::ops::Range<usize>,
    frames: &[bytes::Bytes],
    span_end: u64,
) -> Step {
    let file_start = match toc.data_start(entry) {
        Some(d) if entry.kind == EntryKind::File => Some(d),
        _ => None,
    };
    let end = file_start.unwrap_or(span_end);
    let mut buf = Vec::new();
    let mut pos = starts.get(range.start).copied().unwrap_or(0);
    for f in frames {
        let next = pos.saturating_add(f.len() as u64);
        let (lo, hi) = (entry.header.max(pos), end.min(next));
        if lo < hi {
            let (a, b) = ((lo - pos) as usize, (hi - pos) as usize);
            buf.extend_from_slice(f.get(a..b).unwrap_or(&[]));
        }
        pos = next;
    }
    match check_entry(toc, entry, &buf) {
        Ok(_) => Step::Pass,
        // A file's header blocks must end where its data starts: no need to read on.
        Err(FormatError::TruncatedTar { .. })
            if file_start.is_none() && starts.get(range.end).is_some_and(|&e| e < span_end) =>
        {
            Step::More(range.start..range.end + 1)
        }
        Err(e) => Step::Fail(e),
    }
}

/// The header check, fetching what is not cached (`along`: frames fetched in the same request).
async fn header_check(
    st: &FsState,
    layer: &Layer,
    entry: &Entry,
    along: &[FrameIdx],
) -> Result<(), HeaderFail> {
    let toc = &layer.frames;
    let starts = layer.trust.stream_starts(toc);
    let (mut range, span_end) = header_start(toc, starts, entry).map_err(HeaderFail::Mismatch)?;
    let mut extra: &[FrameIdx] = along;
    loop {
        let header: Vec<FrameIdx> = range.clone().map(|i| FrameIdx(i as u32)).collect();
        let mut idxs = header.clone();
        idxs.extend(extra.iter().filter(|f| !header.contains(f)));
        extra = &[];
        let frames = st
            .store
            .get_frames(&toc.frames, &layer.source, &idxs, Priority::OnDemand)
            .await
            .map_err(HeaderFail::Fetch)?;
        let got = frames.get(..header.len()).unwrap_or(&[]);
        match header_step(toc, starts, entry, &range, got, span_end) {
            Step::Pass => return Ok(()),
            Step::More(r) => range = r,
            Step::Fail(e) => return Err(HeaderFail::Mismatch(e)),
        }
    }
}

/// The header check from cached frames only; `None` when a frame it needs is not cached.
fn header_check_cached(
    st: &FsState,
    layer: &Layer,
    entry: &Entry,
) -> Option<Result<(), FormatError>> {
    let toc = &layer.frames;
    let starts = layer.trust.stream_starts(toc);
    let (mut range, span_end) = match header_start(toc, starts, entry) {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    loop {
        let frames: Option<Vec<bytes::Bytes>> = range
            .clone()
            .map(|i| toc.frames.get(i).and_then(|f| st.store.cached(f)))
            .collect();
        match header_step(toc, starts, entry, &range, &frames?, span_end) {
            Step::Pass => return Some(Ok(())),
            Step::More(r) => range = r,
            Step::Fail(e) => return Some(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::testutil::{noise, six_file_store, tar_of, MemSource, T};

    #[test]
    fn frames_covering_tiles_the_stream() {
        let starts = [0, 100, 200, 300]; // three frames, stream of 300 bytes
        assert_eq!(frames_covering(&starts, 0, 1), 0..1);
        assert_eq!(frames_covering(&starts, 99, 100), 0..1);
        assert_eq!(frames_covering(&starts, 99, 101), 0..2);
        assert_eq!(frames_covering(&starts, 100, 100), 1..2);
        assert_eq!(frames_covering(&starts, 150, 300), 1..3);
        assert_eq!(frames_covering(&starts, 250, 900), 2..3);
        assert!(frames_covering(&starts, 300, 400).is_empty());
        assert!(frames_covering(&[0], 0, 10).is_empty());
    }

    #[test]
    fn a_profile_brings_the_header_frames_of_its_files() {
        let (_, toc, blob) = crate::fetch::testutil::build_layer(
            &tar_of(&[
                T::File("small", b"x".to_vec()),
                T::File("big", noise(3, 20_000)),
            ]),
            4096,
        );
        let src: Arc<dyn RangeSource> = MemSource::new(blob);
        let l = Layer::new(Digest::sha256(b"l"), 0, toc, src).unwrap();
        let big = l.table.resolve("big").unwrap();
        let c0 = l.table.node(big).unwrap().chunks()[0].clone();
        assert_eq!(c0.frame_offset, 0, "a large file's data starts a frame");
        let got = with_header_frames(&l, vec![c0.frame]);
        assert_eq!(got, vec![FrameIdx(c0.frame.0 - 1), c0.frame]);
        // in the profile's order, not the blob's
        let last = FrameIdx(l.frames.frames.len() as u32 - 1);
        assert_ne!(last, c0.frame);
        let got = with_header_frames(&l, vec![last, c0.frame]);
        assert_eq!(got, vec![last, FrameIdx(c0.frame.0 - 1), c0.frame]);
        // the header frame is where the entry's header is
        let e = l.toc_entry(big).unwrap();
        let starts = l.frames.stream_offsets();
        assert_eq!(
            frames_covering(&starts, e.header, e.header + 1).start,
            (c0.frame.0 - 1) as usize
        );
    }

    #[test]
    fn privileged_entries() {
        use crate::fs::inode::LayerTable;
        let (_, mut toc, _) = crate::fetch::testutil::build_layer(
            &tar_of(&[
                T::File("plain", b"x".to_vec()),
                T::File("suid", b"x".to_vec()),
                T::File("sgid", b"x".to_vec()),
                T::File("cap", b"x".to_vec()),
                T::File(".wh.gone", Vec::new()),
            ]),
            4096,
        );
        for e in &mut toc.entries {
            match e.path.as_str() {
                "suid" => e.mode |= 0o4000,
                "sgid" => e.mode |= 0o2000,
                "cap" => {
                    e.xattrs.insert(CAPABILITY_XATTR.into(), vec![1]);
                }
                _ => {}
            }
        }
        let t = LayerTable::build(&toc).unwrap();
        let p = |path: &str| privileged(&t.node(t.resolve(path).unwrap()).unwrap());
        assert!(!p("plain") && p("suid") && p("sgid") && p("cap"));
        assert!(!p("gone"), "a whiteout (char 0/0) is not a device");
        // the entry a node shows, for its header check
        let e = t.toc_entry(t.resolve("suid").unwrap()).unwrap();
        let orig = toc.entries.iter().find(|x| x.path == "suid").unwrap();
        assert_eq!((e.header, e.mode), (orig.header, orig.mode));
    }

    #[test]
    fn verdicts() {
        let (a, b) = (Digest::sha256(b"a"), Digest::sha256(b"b"));
        let ok = |d: &Digest| {
            Ok(StreamReport {
                diff_id: d.clone(),
                bytes: 1,
                entries: 1,
            })
        };
        assert_eq!(
            completion_verdict(ok(&a), Some(&a)),
            Completion::Verified(a.clone())
        );
        assert_eq!(
            completion_verdict(ok(&a), None),
            Completion::Unclaimed(a.clone())
        );
        let Completion::Mismatch(m) = completion_verdict(ok(&a), Some(&b)) else {
            panic!("a mismatch")
        };
        assert!(m.contains(a.as_str()) && m.contains(b.as_str()), "{m}");
        let lie = Err(FormatError::TocMismatch {
            path: "bin/busybox".into(),
            field: "mode",
            toc: "4755".into(),
            tar: "755".into(),
        });
        let Completion::Mismatch(m) = completion_verdict(lie, Some(&a)) else {
            panic!("a mismatch")
        };
        assert!(
            m.contains("does not match the tar") && m.contains("bin/busybox"),
            "{m}"
        );
    }

    #[tokio::test]
    async fn completion_check_hashes_the_stream_and_quarantines_a_false_claim() {
        let (toc, blob, store, metrics, _dir) = six_file_store();
        let files: Vec<(String, Vec<u8>)> =
            (0..6).map(|i| (format!("f{i}"), noise(i, 3000))).collect();
        let entries: Vec<T<'_>> = files.iter().map(|(p, d)| T::File(p, d.clone())).collect();
        let diff_id = Digest::sha256(&tar_of(&entries));
        let src: Arc<dyn RangeSource> = MemSource::new(blob);
        let layer = Digest::sha256(b"layer");
        let hook = Arc::new(QuarantineHook::new(metrics.clone()));
        let persisted = Arc::new(Mutex::new(Vec::new()));
        {
            let p = persisted.clone();
            hook.set_persist(Box::new(move |d, ev| p.lock().push(format!("{d} {ev:?}"))));
        }
        // the true claim: verified
        let good = LayerTrust::default();
        good.bind(hook.clone(), Some(diff_id.clone()));
        let (s, t, m) = (&*store, &*toc, &*metrics);
        let v = check_complete(s, t, &src, &layer, &good, m).await;
        assert_eq!(v.unwrap(), Completion::Verified(diff_id.clone()));
        assert!(good.verified() && !good.quarantined());
        // another image's diff_id: quarantined, counted, persisted, first reason kept
        let evil = LayerTrust::default();
        evil.bind(hook.clone(), Some(Digest::sha256(b"GOOD's diff_id")));
        let v = check_complete(s, t, &src, &layer, &evil, m).await.unwrap();
        assert!(matches!(v, Completion::Mismatch(_)));
        assert!(evil.quarantined() && !evil.verified());
        evil.quarantine(&layer, "second".into());
        assert!(evil.reason().unwrap().starts_with("diff_id mismatch"));
        assert_eq!(metrics.layers_quarantined.load(Ordering::Relaxed), 1);
        let p = persisted.lock().clone();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].ends_with("Verified") && p[1].contains("Quarantined(\"diff_id mismatch"));
        // a TOC that lies about its tar (a file marked setuid): quarantined even with the
        // true diff_id claimed
        let mut lying = (*toc).clone();
        lying.entries[1].mode |= 0o4000;
        let liar = LayerTrust::default();
        liar.bind(hook.clone(), Some(diff_id.clone()));
        let v = check_complete(s, &lying, &src, &layer, &liar, m)
            .await
            .unwrap();
        let Completion::Mismatch(reason) = v else {
            panic!("{v:?}")
        };
        assert!(reason.contains("does not match the tar stream"), "{reason}");
        assert!(liar.quarantined());
    }
}
