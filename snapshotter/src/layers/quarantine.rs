//! Trust state of [`LayerStore`]'s layers: quarantine (every read of a quarantined layer's
//! files fails with EIO; first reason wins, persisted through [`PersistFn`]), the completion
//! check's verdict, its on-request run ([`LayerStore::verify_now`]) and the claimed diff_id it
//! compares with. The checks themselves live in [`crate::fs::trust`] and [`crate::fs::verify`].

use super::{LayerError, LayerStore};
use crate::fs::trust::PersistFn;
use crate::fs::verify::Verdict;
use weenv_format::Digest;

impl LayerStore {
    /// Persist quarantines with `f` (the daemon's metadata store) from now on.
    pub fn set_quarantine_persist(&self, f: PersistFn) {
        self.st.quarantine.set_persist(f);
    }

    /// Quarantines exposed layer `digest`: every read of its files fails with EIO from now
    /// on; the reason is logged with the digest, counted and persisted (first reason wins).
    pub fn quarantine(&self, digest: &Digest, reason: String) {
        if let Some(l) = self.layer(digest) {
            l.quarantine(reason);
            self.drop_native(&l);
        }
    }

    /// Re-applies a quarantine read from the store (after a restart; not counted again).
    pub fn restore_quarantine(&self, digest: &Digest, reason: String) {
        if let Some(l) = self.layer(digest) {
            l.trust.restore(reason);
            self.drop_native(&l);
        }
    }

    /// Re-applies a passed completion check read from the store (after a restart, the same
    /// TOC: no per-entry header checks needed).
    pub fn restore_verified(&self, digest: &Digest) {
        if let Some(l) = self.layer(digest) {
            l.trust.restore_verified();
        }
    }

    /// Fetches exposed layer `digest` in full now and checks it (see `fs::verify`), unless it
    /// was concluded before.
    pub async fn verify_now(&self, digest: &Digest) -> Result<Verdict, LayerError> {
        let layer = self
            .layer(digest)
            .ok_or_else(|| LayerError::NotFound(digest.clone()))?;
        let reload = self
            .reloads
            .lock()
            .get(digest)
            .cloned()
            .ok_or_else(|| LayerError::NotFound(digest.clone()))?;
        Ok(crate::fs::verify::verify_now(&self.st, &layer, &reload).await?)
    }

    /// The verdict of exposed layer `digest` if one is known (no check is started).
    pub fn verdict(&self, digest: &Digest) -> Option<Verdict> {
        Verdict::known(self.layer(digest)?.as_ref())
    }

    /// Why exposed layer `digest` is quarantined, if it is.
    pub fn quarantine_reason(&self, digest: &Digest) -> Option<String> {
        self.layer(digest).and_then(|l| l.trust.reason())
    }

    /// Records the diff_id claimed for exposed layer `digest` (a layer exposed before its
    /// claim was known: records of older daemons).
    pub fn set_claim(&self, digest: &Digest, claim: &Digest) {
        if let Some(l) = self.layer(digest) {
            l.trust.set_claim(claim.clone());
        }
    }
}
