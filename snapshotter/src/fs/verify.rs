//! Verification on request: a layer whose snapshot is contested (another image claims its chain
//! with another layer) or that `weenv pull` found bound to another blob than its manifest names
//! is fetched in full and checked now, ahead of the background fill, instead of whenever the
//! fill gets to it.
//!
//! Every missing frame is fetched at on-demand priority (the fill pauses for it, as for a
//! container's read), then the completion check runs (`trust::check_complete`: the stream
//! walked against the TOC, sha256 = the claimed diff_id; a mismatch quarantines the layer).
//! One check per layer at a time (`LayerTrust::check_lock`, shared with the fill's), and a
//! concluded layer is never checked again.

use super::layer::Layer;
use super::ops::FsState;
use super::trust::{check_complete, Completion};
use crate::fetch::fill::batches;
use crate::fetch::{FetchError, Priority};
use crate::layers::TocReload;
use futures::StreamExt;
use std::sync::Arc;
use thiserror::Error;
use weenv_format::Digest;

/// Why a verification concluded nothing (the caller may retry).
#[derive(Debug, Error)]
pub enum VerifyError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("layer {digest}: its TOC could not be read again for the check: {message}")]
    Toc { digest: Digest, message: String },
    #[error("verification of layer {digest} stopped: {message}")]
    Stopped { digest: Digest, message: String },
}

/// Compressed bytes per request of a verification.
const VERIFY_BATCH_BYTES: u64 = 4 << 20;
/// Requests of one verification in flight.
const VERIFY_CONCURRENCY: usize = 4;

/// What a verification concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Complete, the TOC is the tar and the stream is the claimed diff_id.
    Verified,
    /// Quarantined (now or before), with the reason: reads of its files fail with EIO.
    Quarantined(String),
    /// Complete and consistent, but no diff_id was claimed for it: nothing to compare with.
    Unclaimed,
}

impl Verdict {
    /// The verdict already known for `layer`, if any.
    pub fn known(layer: &Layer) -> Option<Verdict> {
        if let Some(r) = layer.trust.reason() {
            return Some(Verdict::Quarantined(r));
        }
        if layer.trust.verified() {
            return Some(Verdict::Verified);
        }
        layer.trust.walked().then_some(Verdict::Unclaimed)
    }
}

/// Fetches every frame of `layer` not cached yet and runs its completion check (see the module
/// doc). `Err`: a frame or the TOC could not be read (nothing concluded; the caller may retry).
pub async fn verify_now(
    st: &Arc<FsState>,
    layer: &Arc<Layer>,
    reload: &TocReload,
) -> Result<Verdict, VerifyError> {
    if let Some(v) = Verdict::known(layer) {
        return Ok(v);
    }
    let _one = layer.trust.check_lock.lock().await;
    if let Some(v) = Verdict::known(layer) {
        return Ok(v);
    }
    let toc = &layer.frames;
    let missing: Vec<_> = (0..toc.frames.len() as u32)
        .map(weenv_format::FrameIdx)
        .filter(|i| !st.store.l2().contains(&toc.frames[i.0 as usize].digest))
        .collect();
    tracing::info!(layer = %layer.digest, frames = toc.frames.len(), missing = missing.len(), "verifying the layer now (full fetch + diff_id check)");
    let failed = futures::stream::iter(batches(toc, &missing, VERIFY_BATCH_BYTES))
        .map(|b| {
            let (st, layer) = (st.clone(), layer.clone());
            async move {
                st.store
                    .get_frames(&layer.frames.frames, &layer.source, &b, Priority::OnDemand)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(VERIFY_CONCURRENCY)
        .filter_map(|r| std::future::ready(r.err()))
        .boxed()
        .next()
        .await;
    if let Some(e) = failed {
        return Err(e.into());
    }
    // Decompressing and hashing the whole layer: off the async workers.
    let (st2, layer2, reload) = (st.clone(), layer.clone(), reload.clone());
    let checked = tokio::task::spawn_blocking(move || {
        let full = reload().map_err(|message| VerifyError::Toc {
            digest: layer2.digest.clone(),
            message,
        })?;
        Ok::<_, VerifyError>(st2.rt.block_on(check_complete(
            &st2.store,
            &full,
            &layer2.source,
            &layer2.digest,
            &layer2.trust,
            &st2.metrics,
        ))?)
    })
    .await
    .map_err(|e| VerifyError::Stopped {
        digest: layer.digest.clone(),
        message: e.to_string(),
    })??;
    Ok(match checked {
        Completion::Verified(_) => Verdict::Verified,
        Completion::Unclaimed(_) => Verdict::Unclaimed,
        Completion::Mismatch(r) => Verdict::Quarantined(r),
    })
}
