//! The trust gate of the snapshot service: what a `Stat`, `Prepare` or `View` may reach.
//!
//! containerd reuses a committed chain of a namespace without a Prepare (its unpacker asks
//! `Stat(chainID)` first), so the snapshotter cannot refuse the reuse itself; it can refuse or
//! hold the calls that reach the snapshot afterwards. For the snapshot a call names and every
//! ancestor of it:
//! - a remote snapshot whose layer is quarantined: a Prepare or View on it fails
//!   (`Quarantined`, gRPC FailedPrecondition): no container is created on it; a Stat of it
//!   answers NotFound (see [`SnapshotService::stat_checked`]);
//! - an unverified remote snapshot whose chain another image in containerd's content store
//!   claims with another layer ([`crate::remote::contest`]): the call waits until the layer
//!   is fetched in full and checked (ahead of the background fill); verified, it proceeds (the
//!   layer is what both images claim); else the layer is quarantined and the call fails.
//!
//! The first unpack `Stat` of the victim image comes after its manifest and config are in the
//! content store, so a victim never gets an unverified contested layer through this path.

use super::{SnapshotError, SnapshotService};
use crate::remote::contest::contest;
use crate::remote::{Verdict, LABEL_TARGET};
use crate::store::{SnapshotRecord, StoreError};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{info, warn};
use weenv_format::Digest;

impl SnapshotService {
    /// Snapshot `key` (Stat), after the gate passed it and its ancestors.
    ///
    /// A quarantined remote snapshot is NotFound to `Stat`: containerd's metadata Stats every
    /// snapshot of a namespace to list it (`ctr snapshots ls`, CRI's usage sync) and skips
    /// NotFound ones, where any other error would fail the whole listing. An unpack of it then
    /// fails (containerd finds the chain in its own metadata: "already exists"), and a Prepare
    /// or View on it fails with the reason. The Stat whose contest check quarantines the layer
    /// fails with the reason itself.
    pub async fn stat_checked(&self, key: &str) -> Result<super::Info, SnapshotError> {
        let rec = self.store.get(key)?;
        if let Some(reason) = self.quarantine_of(&rec) {
            tracing::debug!(
                key,
                reason,
                "Stat of a quarantined remote snapshot: NotFound"
            );
            return Err(StoreError::NotFound(format!("{key} (quarantined lazy layer)")).into());
        }
        // Ancestors: held while contested; a quarantined one does not hide this snapshot
        // (its Prepares and Views fail).
        let mut recs: Vec<SnapshotRecord> = self
            .chain(&rec.parent)?
            .into_iter()
            .filter(|r| self.quarantine_of(r).is_none())
            .collect();
        recs.insert(0, rec.clone());
        self.gate(&recs).await?;
        Ok(rec)
    }

    /// Why remote snapshot `r`'s layer is quarantined, if it is one and is.
    fn quarantine_of(&self, r: &SnapshotRecord) -> Option<String> {
        let d = r.remote.as_ref()?.digest.parse::<Digest>().ok()?;
        match self.layers.as_ref()?.verdict(&d)? {
            Verdict::Quarantined(reason) => Some(reason),
            _ => None,
        }
    }

    /// Starts the verification of layer `d` now (`trust.verify_on_commit`): its frames at
    /// on-demand priority, then the diff_id check; the outcome is logged and persisted.
    pub(super) fn verify_in_background(&self, d: &Digest) {
        let Some(layers) = self.layers.clone() else {
            return;
        };
        let d = d.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            match layers.verify(&d).await {
                Ok(v) => info!(layer = %d, verdict = ?v, secs = t0.elapsed().as_secs_f64(),
                    "layer verified after its commit (trust.verify_on_commit)"),
                Err(e) => warn!(layer = %d, error = %e,
                    "verification after commit failed; the background fill checks the layer later"),
            }
        });
    }

    /// The gate for a new snapshot on `parent` (Prepare, View).
    pub async fn check_parent(&self, parent: &str) -> Result<(), SnapshotError> {
        if parent.is_empty() {
            return Ok(());
        }
        self.gate(&self.chain(parent)?).await
    }

    /// Refuses quarantined remote snapshots among `recs` and holds contested unverified ones
    /// until their layer is verified (see the module doc).
    async fn gate(&self, recs: &[SnapshotRecord]) -> Result<(), SnapshotError> {
        let Some(layers) = &self.layers else {
            return Ok(());
        };
        let mut pending = Vec::new();
        for r in recs {
            let Some(rl) = &r.remote else { continue };
            let Ok(d) = rl.digest.parse::<Digest>() else {
                continue;
            };
            match layers.verdict(&d) {
                Some(Verdict::Quarantined(reason)) => {
                    return Err(SnapshotError::Quarantined {
                        key: r.key.clone(),
                        digest: rl.digest.clone(),
                        reason,
                    })
                }
                Some(Verdict::Verified) => {}
                _ => pending.push((r, d)),
            }
        }
        if pending.is_empty() || !self.trust.check_contested {
            return Ok(());
        }
        let Some(claims) = &self.claims else {
            return Ok(());
        };
        let images = match claims.claims().await {
            Ok(i) => i,
            Err(e) => {
                self.counters
                    .contest_unchecked
                    .fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "cannot read the image claims of containerd's content store: \
                    unverified remote snapshots are used unchecked (limit lazy pulls with \
                    trust.lazy_sources, or make registry.containerd_socket reachable)");
                return Ok(());
            }
        };
        for (r, d) in pending {
            let chain = r.labels.get(LABEL_TARGET).map(String::as_str).unwrap_or("");
            let Some(c) = contest(&images, chain, d.as_str()) else {
                continue;
            };
            self.counters.contested.fetch_add(1, Ordering::Relaxed);
            warn!(key = %r.key, chain, layer = %d, other_manifest = %c.manifest, other_layer = %c.layer,
                "remote snapshot contested: another image claims its chain with another layer; \
                 verifying its layer before it is used");
            let t0 = Instant::now();
            let (l, dd) = (layers.clone(), d.clone());
            let task = tokio::spawn(async move { l.verify(&dd).await });
            let limit = Duration::from_secs(self.trust.verify_timeout_secs);
            let unverified = |reason: String| SnapshotError::Unverified {
                key: r.key.clone(),
                digest: d.to_string(),
                manifest: c.manifest.clone(),
                other: c.layer.clone(),
                reason,
            };
            match tokio::time::timeout(limit, task).await {
                Ok(Ok(Ok(Verdict::Verified))) => {
                    info!(key = %r.key, layer = %d, secs = t0.elapsed().as_secs_f64(),
                        "contested layer verified: it is the layer both images claim");
                }
                Ok(Ok(Ok(Verdict::Quarantined(reason)))) => {
                    warn!(key = %r.key, layer = %d, secs = t0.elapsed().as_secs_f64(), reason,
                        "contested layer failed verification");
                    return Err(SnapshotError::Quarantined {
                        key: r.key.clone(),
                        digest: d.to_string(),
                        reason,
                    });
                }
                Ok(Ok(Ok(Verdict::Unclaimed))) => {
                    return Err(unverified("no diff_id was claimed for it".into()))
                }
                Ok(Ok(Err(e))) => return Err(unverified(e.to_string())),
                Ok(Err(e)) => return Err(unverified(format!("verification task failed: {e}"))),
                Err(_) => {
                    return Err(unverified(format!(
                        "not done within trust.verify_timeout_secs = {} s (it goes on; retry)",
                        self.trust.verify_timeout_secs
                    )))
                }
            }
        }
        Ok(())
    }
}
