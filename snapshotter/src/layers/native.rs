//! Native trees of [`LayerStore`]'s layers: a complete, verified layer unpacked on the local
//! disk (see [`crate::fs::native`]), used by new mounts as their lowerdir instead of the FUSE
//! directory. A tree is used only while its layer is exposed, verified and not quarantined,
//! and is never evicted while a snapshot's mount names it (pinned).

use super::LayerStore;
use crate::fs::layer::Layer;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use weenv_format::Digest;

impl LayerStore {
    /// A quarantined layer never stays native: the tree is unused from now on and deleted
    /// once no snapshot's mount names it.
    pub(super) fn drop_native(&self, l: &Layer) {
        l.native.store(false, Ordering::Release);
        self.st.store.l2().remove_native(&l.digest);
    }

    /// The native tree of layer `digest`, if new mounts may use it as their lowerdir: it
    /// exists, and the layer is exposed, verified and not quarantined.
    pub fn native_dir(&self, digest: &Digest) -> Option<PathBuf> {
        let l = self.layer(digest)?;
        let l2 = self.st.store.l2();
        (l.native_ok() && l2.has_native(digest)).then(|| l2.native_path(digest))
    }

    /// Where layer `digest`'s native tree lives (whether or not it exists).
    pub fn native_path(&self, digest: &Digest) -> PathBuf {
        self.st.store.l2().native_path(digest)
    }

    /// Pins (`hold`) or releases the native tree of `digest` for one snapshot whose mount
    /// names it: a pinned tree is never evicted. False if there is no tree to pin.
    pub fn hold_native(&self, digest: &Digest, hold: bool) -> bool {
        let l2 = self.st.store.l2();
        if hold {
            l2.pin_native(digest)
        } else {
            l2.unpin_native(digest);
            true
        }
    }

    /// The live snapshots have pinned their trees again after a restart: trees no snapshot
    /// names become evictable.
    pub fn native_restored(&self) {
        self.st.store.l2().native_restored();
    }
}
