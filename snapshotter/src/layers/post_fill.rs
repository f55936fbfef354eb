//! [`PostFill`]: what runs after a layer's background fill, before the fill reports Done —
//! the completion check (stream sha256 = claimed diff_id, see [`crate::fs::trust`]), then, if
//! the layer passed, either its native tree (see [`crate::fs::native`]) or the complete-file
//! copies passthrough serves.
//!
//! Runs on the fill's blocking thread; every failure is logged and leaves the layer served
//! from frames (the check runs again after the next fill, copies are made at first open).

use super::alloc::release_free_heap;
use super::TocReload;
use crate::fetch::fill::AfterFill;
use crate::fs::layer::Layer;
use crate::fs::ops::FsState;
use crate::fs::trust::check_complete;
use crate::fs::verify::Verdict;
use std::sync::Arc;

/// The post-fill work of one layer.
pub(super) struct PostFill {
    pub(super) st: Arc<FsState>,
    pub(super) layer: Arc<Layer>,
    /// Reads the layer's full TOC again, for the check only.
    pub(super) reload: TocReload,
    /// Copy complete files of at least this many bytes for passthrough (None: no copies).
    pub(super) materialise_min: Option<u64>,
    /// A complete, verified layer switches to its native tree (no copies then).
    pub(super) native: bool,
}

impl PostFill {
    /// The work as the fill's `after` hook.
    pub(super) fn into_after_fill(self) -> AfterFill {
        Box::new(move || self.run())
    }

    fn run(self) {
        self.check();
        if self.native && crate::fs::native::switch(&self.st, &self.layer) {
            return;
        }
        self.materialise();
    }

    /// The completion check, unless a verdict is known (one concluded on request is final).
    fn check(&self) {
        let (st, layer) = (&self.st, &self.layer);
        // The full TOC, for this check only (dropped right after).
        let full = match (self.reload)() {
            Ok(full) => full,
            Err(e) => {
                tracing::warn!(error = %e, layer = %layer.digest, "completion check skipped: the layer's TOC could not be read again");
                return;
            }
        };
        let checked = st.rt.block_on(async {
            // One check at a time.
            let _one = layer.trust.check_lock.lock().await;
            if Verdict::known(layer).is_some() {
                return Ok(None);
            }
            check_complete(
                &st.store,
                &full,
                &layer.source,
                &layer.digest,
                &layer.trust,
                &st.metrics,
            )
            .await
            .map(Some)
        });
        drop(full);
        release_free_heap();
        if let Err(e) = checked {
            tracing::warn!(error = %e, layer = %layer.digest, "completion check could not read every frame; it runs again after the next fill");
        }
    }

    /// Copies the layer's complete files for passthrough (active, layer not quarantined).
    fn materialise(&self) {
        let (st, layer) = (&self.st, &self.layer);
        let Some(min) = self.materialise_min else {
            return;
        };
        if !st.passthrough.active() || layer.quarantined() {
            return;
        }
        match st.passthrough.materialise_layer(st.store.l2(), layer, min) {
            Ok(n) => {
                tracing::debug!(layer = %layer.digest, files = n, "complete files materialised")
            }
            Err(e) => {
                tracing::warn!(error = %e, layer = %layer.digest, "materialising complete files failed; they are copied on first open")
            }
        }
    }
}
