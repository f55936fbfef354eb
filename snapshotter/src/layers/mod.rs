//! [`LayerStore`]: the node's weenv layers, exposed read-only through one FUSE session for
//! all layers, plus a second, "plain" one for the layers without xattrs.
//!
//! `<mountpoint>/<layer digest hex>` is the root of each added layer and can be used directly
//! as an overlayfs lowerdir; a layer without xattrs is also at `<plain mountpoint>/<hex>`,
//! where the kernel stops asking for xattrs and opens (see [`SessionKind`]), and that is the
//! directory [`LayerStore::layer_path`] names. Both sessions share one state and one inode
//! numbering; the reasons below for one session rather than one per layer hold for both.
//! Frames are cached once per node (L1 memory, L2 disk, content addressed), shared by every
//! layer that holds them.
//!
//! One session for all layers, not one per layer, because:
//! - mounting is per-layer work on the container start path: a per-layer session costs a
//!   mount(2), a /dev/fuse fd, an INIT handshake and `fuse_threads` threads per layer (an
//!   image of 30 layers would mean 30 mounts and, at 4 threads each, 120 mostly idle
//!   threads); with one session `add_layer` is an in-memory table insert (no syscall);
//! - one set of FUSE worker threads serves whichever layers are hot, instead of idle threads
//!   pinned to cold layers;
//! - caches, single flight and the fill's priority are node-wide anyway;
//! - the kernel cost is the same: overlayfs addresses each lowerdir by its dentry, and FUSE
//!   requests carry the inode number, which encodes the layer (see [`crate::fs::layer`]).
//!
//! Measured here (`integration/tests/fuse_bench.rs`, `one_session_vs_session_per_layer`, debug
//! build on a loaded 2-core VM): a new session per layer (mount + INIT + 2 threads + first
//! read + unmount) took ~50 ms; a layer added to the shared session plus its first read took
//! ~1.4 ms (~0.06 ms without the read).
//!
//! The price: a daemon crash takes every layer down at once (it would with per-layer sessions
//! too, since they live in the same process), and a layer cannot be unmounted by itself
//! (`remove_layer` forgets it; the kernel drops its dentries).
//!
//! Parts:
//! - this file: [`LayerStore`] itself — start (caches, frame store, sessions), the lifecycle
//!   (serve taken-over sessions, hand over, shut down) and cache/memory figures;
//! - [`session`]: the FUSE sessions and their handover to a keeper ([`Keepers`]);
//! - [`registry`]: adding, looking up, removing and reporting layers ([`LayerStatus`]);
//! - [`post_fill`]: the completion check and file copies after a layer's fill;
//! - [`native`]: native trees of complete, verified layers;
//! - [`quarantine`]: quarantine, verdicts and on-request verification;
//! - [`alloc`]: allocator tuning for large decoded TOCs.

mod alloc;
mod native;
mod post_fill;
mod quarantine;
mod registry;
mod session;

pub use alloc::tune_allocator;
pub use registry::LayerStatus;
pub use session::{fuse_mounted_at, Keepers};

use crate::cache::{CacheError, DiskCache, MemoryCache};
use crate::fetch::plan::PlanLimits;
use crate::fetch::{FillConfig, FillShared, FrameStore};
use crate::fs::ops::{FsState, Layers};
use crate::fs::passthrough::Passthrough;
use crate::fs::trust::QuarantineHook;
pub use crate::fs::verify::Verdict;
use crate::fs::SessionKind;
use crate::metrics::Metrics;
use parking_lot::{Mutex, RwLock};
use session::{open_mount, restore_slots, start_open_log, usable_takeover, FuseMount};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use thiserror::Error;
use tokio::task::JoinHandle;
use weenv_format::{Digest, Toc};

/// Reads a layer's full TOC again when a check needs every entry (the in-memory table keeps
/// only what the filesystem serves). The daemon's reads the verified TOC cache on disk.
pub type TocReload = Arc<dyn Fn() -> Result<Toc, String> + Send + Sync>;

/// Configuration of the layer store.
#[derive(Clone, Debug)]
pub struct LayerStoreConfig {
    /// Where the FUSE session is mounted (created if missing).
    pub mountpoint: PathBuf,
    /// Where the plain session is mounted (None: no plain session; every layer is served by
    /// the session at `mountpoint`). See [`SessionKind::Plain`].
    pub plain_mountpoint: Option<PathBuf>,
    /// Cache root: `frames/` (L2) and `files/` (complete files for passthrough). Must be on
    /// a non-stacked local fs (ext4, xfs), not on overlayfs.
    pub cache_dir: PathBuf,
    /// L1 capacity in bytes.
    pub memory_cache_bytes: u64,
    /// Cap in bytes of everything under `cache_dir` (frames, complete files, directories).
    pub disk_cache_bytes: u64,
    /// Background fill, read-ahead and coalescing.
    pub fill: FillConfig,
    /// FUSE worker threads (sharing one /dev/fuse fd).
    pub fuse_threads: usize,
    /// Use FUSE passthrough for complete files when the kernel supports it.
    pub passthrough: bool,
}

/// Errors of the layer store.
#[derive(Debug, Error)]
pub enum LayerError {
    #[error(
        "mounting FUSE at {mountpoint}: {error} (needs root, /dev/fuse and an existing directory)"
    )]
    Mount {
        mountpoint: PathBuf,
        error: std::io::Error,
    },
    #[error("preparing {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("layer {digest}: TOC frame {index} ends at {end}, past the blob size {size}; the TOC does not belong to this blob")]
    TocMismatch {
        digest: Digest,
        index: usize,
        end: u64,
        size: u64,
    },
    #[error("layer {digest}: {error}")]
    Table {
        digest: Digest,
        error: crate::fs::inode::TableError,
    },
    #[error("layer {0} is not mounted")]
    NotFound(Digest),
    #[error("layer {digest}: the FUSE session has numbered {max} layers, all its inode numbers overlayfs can map; restart the daemon without fuse.handover (a new session) to add more")]
    TooManyLayers { digest: Digest, max: u32 },
    #[error("the layer store is shut down")]
    ShutDown,
    #[error(transparent)]
    Verify(#[from] crate::fs::verify::VerifyError),
}

/// The node's layers behind two FUSE sessions: every layer at `<mountpoint>/<hex>`, and
/// layers without xattrs also at `<plain mountpoint>/<hex>`, where the kernel asks less (see
/// [`SessionKind`]); [`LayerStore::layer_path`] names the plain one when there is one.
pub struct LayerStore {
    cfg: LayerStoreConfig,
    st: Arc<FsState>,
    /// The session of every layer.
    full: FuseMount,
    /// The session of the layers without xattrs, if mounted.
    plain: Option<FuseMount>,
    /// The sessions were left to their keepers: never unmount them.
    handed_over: AtomicBool,
    /// The thread sending live opens (full session: the only one with opens) to the keeper.
    open_log: Mutex<Option<std::thread::JoinHandle<()>>>,
    fills: Mutex<HashMap<Digest, JoinHandle<()>>>,
    fill_budget: Arc<FillShared>,
    /// Per exposed layer: reads its full TOC again (completion checks on request).
    reloads: Mutex<HashMap<Digest, TocReload>>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LayerError + '_ {
    move |source| LayerError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

impl LayerStore {
    /// Mounts the FUSE session at `cfg.mountpoint` and opens the caches.
    pub fn start(
        cfg: LayerStoreConfig,
        rt: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<LayerStore>, LayerError> {
        Self::start_with(cfg, rt, metrics, Keepers::default())
    }

    /// [`Self::start`] with keepers: takes over the sessions they hold (served only from [`Self::serve`] on, once
    /// the layers are added again), else mounts new sessions and gives each keeper a copy of
    /// its fd. With a keeper for the full session but none for the plain one, no plain
    /// session is mounted (its containers would not survive a restart).
    pub fn start_with(
        cfg: LayerStoreConfig,
        rt: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
        keepers: Keepers,
    ) -> Result<Arc<LayerStore>, LayerError> {
        let (keeper, plain_keeper) = (keepers.full.map(Arc::new), keepers.plain.map(Arc::new));
        let mut plain_at = cfg.plain_mountpoint.clone();
        if keeper.is_some() && plain_keeper.is_none() && plain_at.is_some() {
            tracing::warn!("no keeper for the plain FUSE session: every layer is served by the full session (overlayfs asks it for xattrs on every lookup)");
            plain_at = None;
        }
        let takeover = keeper
            .as_ref()
            .and_then(|k| usable_takeover(k, &cfg.mountpoint));
        let plain_takeover = match (&plain_keeper, &plain_at) {
            (Some(k), Some(mp)) => usable_takeover(k, mp),
            _ => None,
        };
        let l2 = DiskCache::open(&cfg.cache_dir, cfg.disk_cache_bytes, metrics.clone())?;
        let limits = PlanLimits {
            max_gap: cfg.fill.max_gap_bytes,
            max_request: cfg.fill.max_request_bytes,
        };
        let store = Arc::new(
            FrameStore::new(
                MemoryCache::new(cfg.memory_cache_bytes),
                l2,
                metrics.clone(),
                limits,
            )
            .with_link_policy((&cfg.fill).into())
            .with_cpu_policy((&cfg.fill).into()),
        );
        if cfg.fill.enabled && cfg.fill.busy_cpu_percent > 0 {
            // Busy CPUs pause the fill like reads do; the watch ends with the store.
            let weak = Arc::downgrade(&store);
            rt.spawn(crate::fetch::cpu::watch_cpu(
                cfg.fill.busy_cpu_percent,
                Duration::from_millis(250),
                move |busy| {
                    let Some(s) = weak.upgrade() else {
                        return false;
                    };
                    if busy {
                        s.note_cpu_busy();
                    }
                    true
                },
            ));
        }
        let st = Arc::new(FsState {
            layers: RwLock::new(Layers::default()),
            store,
            rt,
            fill: cfg.fill.clone(),
            passthrough: Passthrough::new(cfg.passthrough),
            quarantine: Arc::new(QuarantineHook::new(metrics.clone())),
            metrics,
            ttl: Duration::from_secs(24 * 3600),
            root_ttl: Duration::from_secs(1),
            mounted_at: SystemTime::now(),
        });
        // Every digest keeps its slot, so the kernel's inode numbers stay valid (both
        // sessions number inodes alike: both keepers record every slot).
        for (_, meta) in takeover.iter().chain(plain_takeover.iter()) {
            restore_slots(&st, meta);
        }
        if let Some((_, meta)) = &takeover {
            st.passthrough.set_fh_base(meta.takeovers << 40);
            st.passthrough.restore_opens(&meta.opens);
        }
        let full = open_mount(
            &st,
            SessionKind::Full,
            &cfg.mountpoint,
            cfg.fuse_threads,
            keeper,
            takeover,
        )?;
        let open_log = full
            .keeper
            .as_ref()
            .and_then(|k| start_open_log(&st, k.clone()));
        let mut plain = None;
        if let Some(mp) = plain_at {
            match open_mount(
                &st,
                SessionKind::Plain,
                &mp,
                cfg.fuse_threads,
                plain_keeper,
                plain_takeover,
            ) {
                Ok(m) => plain = Some(m),
                Err(e) => {
                    tracing::warn!(error = %e, "the plain FUSE session could not be mounted: every layer is served by the full session")
                }
            }
        }
        Ok(Arc::new(LayerStore {
            st,
            full,
            plain,
            handed_over: AtomicBool::new(false),
            open_log: Mutex::new(open_log),
            fills: Mutex::new(HashMap::new()),
            reloads: Mutex::new(HashMap::new()),
            fill_budget: Arc::new(FillShared::default()),
            cfg,
        }))
    }

    /// The frame store every layer reads through (the peer tier serves it and hooks into it).
    pub fn frames(&self) -> &Arc<FrameStore> {
        &self.st.store
    }

    /// (used, capacity) bytes of L1 and L2.
    pub fn cache_usage(&self) -> ((u64, u64), (u64, u64)) {
        let s = &self.st.store;
        (
            (s.l1().used(), self.cfg.memory_cache_bytes),
            (s.l2().used(), s.l2().capacity()),
        )
    }

    /// Daemon memory held for layers: (TOC bytes of all layers, L1 bytes, bytes in flight).
    pub fn memory_usage(&self) -> (u64, u64, u64) {
        let tocs = self.all_layers().iter().map(|l| l.toc_bytes()).sum();
        let s = &self.st.store;
        (tocs, s.l1().used(), s.in_flight_bytes())
    }

    /// True if the kernel accepted FUSE passthrough and it is configured on.
    pub fn passthrough_active(&self) -> bool {
        self.st.passthrough.active()
    }

    /// The mountpoint of the full session.
    pub fn mountpoint(&self) -> &Path {
        &self.cfg.mountpoint
    }

    /// The sessions: the full one, then the plain one if mounted.
    fn mounts(&self) -> impl Iterator<Item = &FuseMount> {
        std::iter::once(&self.full).chain(self.plain.as_ref())
    }

    /// Starts serving taken-over sessions (after the layers were added again): the FUSE
    /// workers start reading, and the kernel queues again what the previous daemon read
    /// but never answered. No-op for a session this store mounted.
    pub fn serve(&self) -> Result<(), LayerError> {
        let layers = self.all_layers().len();
        for m in self.mounts() {
            m.serve(layers)?;
        }
        Ok(())
    }

    /// True if a keeper holds the full session (the plain one is mounted only with a keeper
    /// of its own when the full one has one).
    pub fn can_hand_over(&self) -> bool {
        self.full.keeper.is_some()
    }

    /// Leaves the sessions to the keepers for the next daemon (planned restart or upgrade):
    /// stops fills, never unmounts. The FUSE workers keep answering until the process
    /// exits; what they read and did not answer, the successor gets again.
    pub fn hand_over(&self) {
        for (_, h) in self.fills.lock().drain() {
            h.abort();
        }
        self.handed_over.store(true, Ordering::Release);
        self.st.passthrough.leak_backing_ids();
        // The keeper gets every open recorded so far (opens answered from now until the
        // process exits are not recorded).
        self.st.passthrough.close_open_log();
        if let Some(h) = self.open_log.lock().take() {
            let _ = h.join();
        }
        for m in self.mounts() {
            m.hand_over();
        }
    }

    /// Stops fills and unmounts the sessions (lazily if still in use); the keepers, if any,
    /// forget them. No-op after [`Self::hand_over`].
    pub fn shutdown(&self) {
        if self.handed_over.load(Ordering::Acquire) {
            return;
        }
        for (_, h) in self.fills.lock().drain() {
            h.abort();
        }
        for m in self.mounts() {
            m.shutdown();
        }
    }
}

impl Drop for LayerStore {
    fn drop(&mut self) {
        self.shutdown();
    }
}
