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
//! - any disagreement quarantines the layer ([`LayerTrust::quarantine`]): from then on every
//!   read of its files fails with EIO, the reason is logged with the layer digest, counted in
//!   `weenv_layer_quarantined_total`, persisted through the [`QuarantineHook`] (the metadata
//!   store) and shown by `/status` and `weenv status`.

use crate::fetch::{BlobSource, FetchError, FrameStore, Priority};
use crate::metrics::Metrics;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use weenv_format::tarcheck::{StreamChecker, StreamReport};
use weenv_format::{Digest, FormatError, FrameIdx, Toc};

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
    hook: Mutex<Option<Arc<QuarantineHook>>>,
}

impl LayerTrust {
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

    /// True once the completion check passed.
    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
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
    source: &Arc<dyn BlobSource>,
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
    source: &Arc<dyn BlobSource>,
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
            tracing::info!(layer = %digest, diff_id = %d, "layer complete (no claimed diff_id to compare with)");
        }
        Completion::Mismatch(reason) => trust.quarantine(digest, reason.clone()),
    }
    Ok(v)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fetch::testutil::{noise, six_file_store, tar_of, MemSource, T};

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
        let src: Arc<dyn BlobSource> = MemSource::new(blob);
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
