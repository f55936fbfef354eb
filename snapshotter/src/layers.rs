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

use crate::cache::{CacheError, DiskCache, MemoryCache};
use crate::fetch::fill::{run_fill, AfterFill};
use crate::fetch::plan::PlanLimits;
use crate::fetch::{run_prefetch, FillConfig, FillShared, FillState, FrameStore, RangeSource};
use crate::fs::layer::{Layer, ROOT_INO};
use crate::fs::ops::{FsState, Layers};
use crate::fs::passthrough::Passthrough;
use crate::fs::trust::{check_complete, PersistFn, QuarantineHook};
pub use crate::fs::verify::Verdict;
use crate::fs::{SessionKind, SessionState, WeenvFs};
use crate::handover::client::KeeperClient;
use crate::handover::{resume, SessionMeta, META_VERSION};
use crate::metrics::Metrics;
use fuser::{BackgroundSession, Config, INodeNo, MountOption, Notifier, Session, SessionACL};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use thiserror::Error;
use tokio::task::JoinHandle;
use weenv_format::{Digest, FrameIdx, Toc};

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

/// State of one mounted layer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LayerStatus {
    pub digest: Digest,
    pub path: PathBuf,
    /// TOC entries.
    pub entries: usize,
    /// Heap bytes of the layer's in-memory TOC (compact table, frames, read state).
    pub toc_bytes: u64,
    /// Uncompressed bytes of all frames.
    pub bytes_total: u64,
    /// Uncompressed bytes of the frames in L2.
    pub bytes_cached: u64,
    /// Compressed (blob) bytes of the frames in L2: what fetching them cost on the link.
    pub bytes_fetched: u64,
    /// Of those, compressed bytes the background fill fetched.
    pub bytes_filled: u64,
    /// Of those, compressed bytes the start-up prefetch fetched.
    pub bytes_prefetched: u64,
    /// File bytes read from the layer since it was added or the access log was reset
    /// (chunk granularity, see [`Layer::bytes_read`]).
    pub bytes_read: u64,
    pub frames_total: usize,
    pub frames_cached: usize,
    pub fill: FillState,
    pub fill_error: Option<String>,
    /// Frames named by the image's start-up profile (0: none).
    pub prefetch_frames: u64,
    /// Of those, frames in L2.
    pub prefetch_done: u64,
    pub prefetch_error: Option<String>,
    /// The diff_id the image claims for the layer.
    pub claimed_diff_id: Option<Digest>,
    /// The completion check (stream sha256 = claimed diff_id) passed.
    pub verified: bool,
    /// New mounts use the layer's native tree (see `fs::native`).
    pub native: bool,
    /// Why the layer is quarantined (reads fail with EIO), if it is.
    pub quarantined: Option<String>,
}

/// The keepers of the two sessions (see [`crate::handover`]); none: the sessions end with the
/// daemon.
#[derive(Default)]
pub struct Keepers {
    pub full: Option<KeeperClient>,
    pub plain: Option<KeeperClient>,
}

/// One FUSE session of the store, mounted at `mountpoint`.
struct FuseMount {
    mountpoint: PathBuf,
    state: Arc<SessionState>,
    session: Mutex<Option<BackgroundSession>>,
    /// A taken-over session, served by [`LayerStore::serve`] once the layers are back.
    pending: Mutex<Option<Session<WeenvFs>>>,
    notifier: Option<Notifier>,
    /// The keeper holding a copy of the session's fd (see [`crate::handover`]).
    keeper: Option<Arc<KeeperClient>>,
    /// The FUSE INTERRUPT probe: its lookup on our own mount must be answered while the
    /// workers live, or its thread waits in the kernel forever and keeps the process (and the
    /// session's fd) from ending.
    probe: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl FuseMount {
    fn kind(&self) -> SessionKind {
        self.state.kind
    }

    fn live(&self) -> bool {
        self.session.lock().is_some() || self.pending.lock().is_some()
    }

    /// Drops the kernel's cached listing of the mount root (layers came or went).
    fn root_changed(&self) {
        if let Some(n) = &self.notifier {
            if let Err(e) = n.inval_inode(INodeNo(ROOT_INO), 0, 0) {
                // ENOENT: the kernel has no inode for the root cached yet (nothing to drop).
                if e.raw_os_error() != Some(libc::ENOENT) {
                    tracing::debug!(error = %e, mountpoint = %self.mountpoint.display(), "invalidating the mount root's listing failed");
                }
            }
        }
    }

    /// Waits for the INTERRUPT probe (about [`crate::fs::interrupt::HOLD`], at most a few
    /// seconds) while the session still answers it.
    fn join_probe(&self) {
        if let Some(h) = self.probe.lock().take() {
            let _ = h.join();
        }
    }

    /// Serves a taken-over session (no-op for a new one).
    fn serve(&self, layers: usize) -> Result<(), LayerError> {
        let Some(session) = self.pending.lock().take() else {
            return Ok(());
        };
        let err = |error| LayerError::Mount {
            mountpoint: self.mountpoint.clone(),
            error,
        };
        let fd = session.as_fd().try_clone_to_owned().map_err(err)?;
        let bg = session.spawn().map_err(err)?;
        *self.session.lock() = Some(bg);
        match resume::notify_resend(fd.as_fd()) {
            Ok(()) => tracing::info!(
                layers,
                mountpoint = %self.mountpoint.display(),
                "serving the taken-over FUSE session (unanswered requests re-queued)"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "FUSE_NOTIFY_RESEND failed (Linux < 6.9?): requests the previous daemon read are never answered")
            }
        }
        Ok(())
    }

    /// Leaves the session to its keeper (never unmounted by this process).
    fn hand_over(&self) {
        self.join_probe();
        if let Some(s) = self.session.lock().take() {
            // Dropping it would unmount.
            std::mem::forget(s);
        }
        if let Some(s) = self.pending.lock().take() {
            std::mem::forget(s);
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "FUSE session left to the keeper for the next daemon");
    }

    fn shutdown(&self) {
        drop(self.pending.lock().take());
        self.join_probe();
        let Some(session) = self.session.lock().take() else {
            return;
        };
        if let Err(e) = session.umount_and_join() {
            tracing::warn!(error = %e, mountpoint = %self.mountpoint.display(), "unmount failed; detaching lazily");
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(k) = &self.keeper {
            if let Err(e) = k.release() {
                tracing::warn!(error = %e, mountpoint = %self.mountpoint.display(), "the keeper did not forget the unmounted session");
            }
        }
    }
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

/// Makes the allocator give freed memory back (call once, before threads start): glibc raises
/// its mmap and trim thresholds on its own after a large block is freed (up to 32/64 MiB), so
/// a decoded TOC freed in a worker thread's arena stayed resident (300k entries: +120 B/entry
/// after the TOC was gone). Fixed thresholds: blocks over 256 KiB are mmapped (unmapped on
/// free) and an arena's free top over 1 MiB is trimmed.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // Raw libc: nix does not wrap glibc's allocator tuning.
    // SAFETY: mallopt only sets allocator parameters; no pointer is passed.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Returns freed heap pages to the kernel: a decoded TOC is millions of small allocations, and
/// glibc keeps freed chunks below the top of the heap mapped (RSS would stay at its peak).
fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // Raw libc: nix does not wrap malloc_trim.
    // SAFETY: malloc_trim only walks the allocator's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LayerError + '_ {
    move |source| LayerError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// True if `mountinfo` (`/proc/self/mountinfo`) lists a FUSE mount at `path`. Pure.
pub fn fuse_mounted_at(mountinfo: &str, path: &Path) -> bool {
    let want = path.to_string_lossy().replace(' ', "\\040");
    mountinfo.lines().any(|l| {
        let mut f = l.split(' ');
        let point = f.nth(4);
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        point == Some(want.as_str()) && fstype.is_some_and(|t| t.starts_with("fuse"))
    })
}

/// The session a keeper holds, if this store can serve it: same protocol version, same
/// mountpoint, still mounted. An unusable one is detached (never stat'ed: with no server
/// a stat would wait forever).
fn usable_takeover(
    keeper: &KeeperClient,
    mountpoint: &Path,
) -> Option<(std::os::fd::OwnedFd, SessionMeta)> {
    let (fd, meta) = match keeper.take() {
        Ok(Some(v)) => v,
        Ok(None) => {
            tracing::info!("no FUSE session to take over (the keeper holds none): mounting a new session; containers started before this daemon lost their lazy layers");
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot ask the keeper for a FUSE session: mounting a new session");
            return None;
        }
    };
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|mi| fuse_mounted_at(&mi, mountpoint));
    if meta.version == META_VERSION && meta.mountpoint == mountpoint && mounted {
        return Some((fd, meta));
    }
    tracing::warn!(kept = %meta.mountpoint.display(), version = meta.version, mounted,
        "the kept FUSE session cannot be taken over (other version or mountpoint, or unmounted): mounting a new session");
    if meta.mountpoint == mountpoint && mounted {
        let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
    }
    None
}

/// Sends the changes of live opens to the keeper from a thread of its own (never on a
/// request path), in batches.
fn start_open_log(st: &FsState, k: Arc<KeeperClient>) -> Option<std::thread::JoinHandle<()>> {
    let (tx, rx) = std::sync::mpsc::channel::<crate::handover::OpenRecord>();
    st.passthrough.set_open_log(tx);
    let spawned = std::thread::Builder::new()
        .name("keeper-opens".into())
        .spawn(move || {
            let mut warned = false;
            while let Ok(first) = rx.recv() {
                let mut set = vec![first];
                while let (true, Ok(r)) = (set.len() < 4096, rx.try_recv()) {
                    set.push(r);
                }
                if let Err(e) = k.opens(set) {
                    if !warned {
                        tracing::warn!(error = %e, "the keeper did not take the live opens; a successor may refuse opens of files open across the restart");
                        warned = true;
                    }
                }
            }
        });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the keeper-opens thread");
            None
        }
    }
}

/// Lazily detaches the FUSE mounts a previous daemon left at `mountpoint` (this one mounts a
/// new session there; a second daemon on the same root never gets here: the metadata store is
/// locked). Found in `/proc/self/mountinfo`, not by a stat: the kernel answers a stat of a
/// dead session's root from its attribute cache for a while, so a daemon restarted right after
/// a crash saw a live directory, and its mount failed with ENOTCONN.
fn clear_stale_mount(mountpoint: &Path) {
    let stale = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|mi| fuse_mounted_at(&mi, mountpoint))
            || std::fs::metadata(mountpoint)
                .is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
    };
    // Several, if daemons crashed one after another without a successor cleaning up.
    for _ in 0..8 {
        if !stale() {
            return;
        }
        tracing::warn!(mountpoint = %mountpoint.display(), "detaching a stale FUSE mount");
        if let Err(e) = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mountpoint = %mountpoint.display(), error = %e, "cannot detach the stale FUSE mount");
            return;
        }
    }
}

/// Gives every digest of a kept session its old slot.
fn restore_slots(st: &FsState, meta: &SessionMeta) {
    let mut g = st.layers.write();
    for (d, slot) in &meta.slots {
        match d.parse::<Digest>() {
            Ok(d) => {
                if let Some(old) = g.slot_of.get(&d).filter(|s| **s != *slot) {
                    tracing::warn!(digest = %d, slot, kept = old, "the keepers disagree on a layer's slot; keeping the first");
                    continue;
                }
                g.slot_of.insert(d, *slot);
                if g.by_slot.len() <= *slot as usize {
                    g.by_slot.resize(*slot as usize + 1, None);
                }
            }
            Err(e) => {
                tracing::warn!(digest = %d, error = %e, "kept slot of an unparsable digest")
            }
        }
    }
}

/// Takes over the session `takeover` (kept by `keeper`), else mounts a new session of `kind`
/// at `mountpoint` and gives `keeper` a copy of its fd.
fn open_mount(
    st: &Arc<FsState>,
    kind: SessionKind,
    mountpoint: &Path,
    threads: usize,
    mut keeper: Option<Arc<KeeperClient>>,
    takeover: Option<(std::os::fd::OwnedFd, SessionMeta)>,
) -> Result<FuseMount, LayerError> {
    if takeover.is_none() {
        clear_stale_mount(mountpoint);
        // Private to root (the mounted session's root is 0700 too: `fs::ops`).
        crate::dirs::ensure_private(mountpoint).map_err(io_err(mountpoint))?;
    }
    let state = SessionState::new(kind);
    let fs = WeenvFs {
        st: st.clone(),
        session: state.clone(),
    };
    let mut fc = Config::default();
    fc.mount_options = vec![
        MountOption::FSName("weenv".into()),
        MountOption::Subtype("weenv".into()),
        MountOption::RO,
        MountOption::DefaultPermissions,
        MountOption::Suid,
        MountOption::Dev,
        MountOption::NoAtime,
    ];
    fc.acl = SessionACL::All;
    fc.n_threads = Some(threads.max(1));
    // One /dev/fuse fd shared by the workers, not one cloned fd each: the kernel finds
    // the request an answer is for only in the queue of the fd it was read from, and an
    // INTERRUPT is read by any worker; with cloned fds fuser's ENOSYS for it mostly went
    // to another fd than the request's (ENOENT, logged as `Failed to send FUSE reply`) and
    // the kernel never learnt that interrupts are not supported (see `fs::interrupt`).
    fc.clone_fd = false;
    let mount_err = |source| LayerError::Mount {
        mountpoint: mountpoint.to_path_buf(),
        error: source,
    };
    if let Some((fd, meta)) = takeover {
        state.set_init(meta.init);
        let session = resume::resume_session(fs, fd, &meta.init, fc).map_err(mount_err)?;
        tracing::info!(
            mountpoint = %mountpoint.display(),
            ?kind,
            slots = meta.slots.len(),
            takeovers = meta.takeovers,
            passthrough = st.passthrough.active(),
            "taking over the FUSE session kept by the keeper; requests wait until the layers are back"
        );
        return Ok(FuseMount {
            mountpoint: mountpoint.to_path_buf(),
            state,
            session: Mutex::new(None),
            notifier: Some(session.notifier()),
            pending: Mutex::new(Some(session)),
            keeper,
            probe: Mutex::new(None),
        });
    }
    let session = Session::new(fs, mountpoint, &fc).map_err(mount_err)?;
    if let Some(k) = &keeper {
        let init = (*state.init.lock()).unwrap_or(crate::handover::InitParams {
            major: 7,
            minor: 0,
            flags: 0,
        });
        // A new session starts with every slot given so far (the other session's layers
        // included: both number inodes alike).
        let slots = st
            .layers
            .read()
            .slot_of
            .iter()
            .map(|(d, s)| (d.to_string(), *s))
            .collect();
        let meta = SessionMeta {
            version: META_VERSION,
            mountpoint: mountpoint.to_path_buf(),
            init,
            slots,
            takeovers: 0,
            opens: Vec::new(),
        };
        match k.put(session.as_fd(), meta) {
            Ok(()) => {
                tracing::info!(mountpoint = %mountpoint.display(), "the keeper holds the FUSE session: running containers survive a restart of this daemon")
            }
            Err(e) => {
                tracing::warn!(error = %e, mountpoint = %mountpoint.display(), "the keeper refused the FUSE session: running containers will not survive a restart");
                keeper = None;
            }
        }
    }
    let notifier = Some(session.notifier());
    let session = session.spawn().map_err(mount_err)?;
    let probe = {
        // Off the start path: the probe holds one lookup for a few hundred ms.
        let (state, mp) = (state.clone(), mountpoint.to_path_buf());
        let probe = std::thread::Builder::new()
            .name("fuse-interrupts".into())
            .spawn(move || {
                let ok = crate::fs::interrupt::disable_interrupts(&mp, &state.probe);
                tracing::debug!(
                    ok,
                    mountpoint = %mp.display(),
                    "FUSE INTERRUPT probe (the kernel stops sending interrupts)"
                );
            });
        match probe {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the FUSE INTERRUPT probe");
                None
            }
        }
    };
    tracing::info!(
        mountpoint = %mountpoint.display(),
        ?kind,
        passthrough = st.passthrough.active(),
        threads,
        "weenv FUSE session mounted"
    );
    Ok(FuseMount {
        mountpoint: mountpoint.to_path_buf(),
        state,
        session: Mutex::new(Some(session)),
        pending: Mutex::new(None),
        keeper,
        probe: Mutex::new(probe),
        notifier,
    })
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

    /// The directory of layer `digest` (whether or not it is mounted): on the plain session
    /// when there is one and the layer has no xattrs, else on the full session.
    pub fn layer_path(&self, digest: &Digest) -> PathBuf {
        let mount = match &self.plain {
            Some(p) if self.layer(digest).is_some_and(|l| self.on_plain(&l)) => p,
            _ => &self.full,
        };
        mount.mountpoint.join(digest.hex())
    }

    /// True if new mounts see `layer` on the plain session (mounted, and the layer has no
    /// xattrs).
    fn on_plain(&self, layer: &Layer) -> bool {
        layer.plain && self.plain.is_some()
    }

    /// True if `dir` is a directory of layer `digest` on one of the sessions (the full session
    /// lists every layer: a snapshot made before the plain session existed keeps working).
    pub fn serves_dir(&self, digest: &Digest, dir: &Path) -> bool {
        let Some(l) = self.layer(digest) else {
            return false;
        };
        self.mounts()
            .any(|m| m.kind().serves(&l) && m.mountpoint.join(digest.hex()) == dir)
    }

    /// Exposes a layer (idempotent) and starts its background fill. The returned directory
    /// is immediately usable as an overlayfs lowerdir; no file content is fetched.
    pub fn add_layer(
        &self,
        digest: &Digest,
        toc: Toc,
        source: Arc<dyn RangeSource>,
    ) -> Result<PathBuf, LayerError> {
        self.add_layer_claimed(digest, toc, source, None, None)
    }

    /// [`Self::add_layer`] for a layer whose image claims diff_id `claim`: the completion
    /// check compares the stream's sha256 with it and quarantines the layer on a mismatch.
    /// `reload` reads the full TOC again for that check; without one a copy of the decoded
    /// TOC is kept in memory (tests).
    pub fn add_layer_claimed(
        &self,
        digest: &Digest,
        toc: Toc,
        source: Arc<dyn RangeSource>,
        claim: Option<Digest>,
        reload: Option<TocReload>,
    ) -> Result<PathBuf, LayerError> {
        if !self.full.live() {
            return Err(LayerError::ShutDown);
        }
        if self.has_layer(digest) {
            return Ok(self.layer_path(digest));
        }
        let size = source.size().unwrap_or(u64::MAX);
        for (index, f) in toc.frames.iter().enumerate() {
            let end = f.offset.saturating_add(f.clen);
            if end > size {
                return Err(LayerError::TocMismatch {
                    digest: digest.clone(),
                    index,
                    end,
                    size,
                });
            }
        }
        let (slot, new) = {
            let mut g = self.st.layers.write();
            match g.slot_of.get(digest) {
                Some(s) => (*s, false),
                None => {
                    let s = u32::try_from(g.by_slot.len())
                        .ok()
                        .filter(|s| *s < crate::fs::layer::MAX_SLOTS)
                        .ok_or_else(|| LayerError::TooManyLayers {
                            digest: digest.clone(),
                            max: crate::fs::layer::MAX_SLOTS,
                        })?;
                    g.slot_of.insert(digest.clone(), s);
                    g.by_slot.push(None);
                    (s, true)
                }
            }
        };
        if new {
            // Recorded before the layer is visible: no inode of it reaches the kernel first.
            for k in self.mounts().filter_map(|m| m.keeper.as_ref()) {
                if let Err(e) = k.slot(digest.as_str(), slot) {
                    tracing::warn!(error = %e, layer = %digest, "the keeper did not record the layer's slot; a successor cannot serve it");
                }
            }
        }
        let reload: TocReload = match reload {
            Some(r) => r,
            None => {
                let kept = Arc::new(toc.clone());
                Arc::new(move || Ok((*kept).clone()))
            }
        };
        self.reloads.lock().insert(digest.clone(), reload.clone());
        // Built outside the lock (a large TOC takes a while); the decoded TOC is dropped here.
        let built =
            Layer::new(digest.clone(), slot, toc, source).map_err(|source| LayerError::Table {
                digest: digest.clone(),
                error: source,
            })?;
        release_free_heap();
        let layer = {
            let mut g = self.st.layers.write();
            match g.by_slot.get(slot as usize) {
                Some(Some(l)) => l.clone(), // raced with another add_layer
                _ => {
                    let l = Arc::new(built);
                    l.trust.bind(self.st.quarantine.clone(), claim);
                    if let Some(s) = g.by_slot.get_mut(slot as usize) {
                        *s = Some(l.clone());
                    }
                    l
                }
            }
        };
        self.root_changed();
        let native = self.cfg.fill.native && self.st.store.l2().has_native(digest);
        if native {
            // Built before a restart: the layer was complete and verified (the store's
            // record restores `verified`; until then the tree is not used).
            layer.native.store(true, Ordering::Release);
            layer.fill.set_state(FillState::Done);
            self.st
                .metrics
                .native_layers
                .fetch_add(1, Ordering::Relaxed);
        } else if self.cfg.fill.enabled {
            let mut fills = self.fills.lock();
            if !fills.contains_key(digest) {
                // After the fill, before it reports Done: the completion check, then (if
                // the layer passed) the complete-file copies for passthrough.
                let after: Option<AfterFill> = {
                    let (st, layer, reload) = (self.st.clone(), layer.clone(), reload.clone());
                    // Copies serve passthrough, which only the full session has: a layer
                    // new mounts see on the plain session gets none (an older snapshot on the
                    // full session still copies a file at its first open).
                    let min = (self.cfg.passthrough
                        && self.cfg.fill.materialise_min_bytes != u64::MAX
                        && !self.on_plain(&layer))
                    .then_some(self.cfg.fill.materialise_min_bytes);
                    let native = self.cfg.fill.native;
                    Some(Box::new(move || {
                        // The full TOC, for this check only (dropped right after).
                        match reload() {
                            Ok(full) => {
                                let checked = st.rt.block_on(async {
                                    // One check at a time; one concluded on request is final.
                                    let _one = layer.trust.check_lock.lock().await;
                                    if Verdict::known(&layer).is_some() {
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
                            Err(e) => {
                                tracing::warn!(error = %e, layer = %layer.digest, "completion check skipped: the layer's TOC could not be read again");
                            }
                        }
                        // Complete and verified: a native tree replaces the copies below.
                        if native && crate::fs::native::switch(&st, &layer) {
                            return;
                        }
                        let Some(min) = min else { return };
                        if !st.passthrough.active() || layer.quarantined() {
                            return;
                        }
                        match st.passthrough.materialise_layer(st.store.l2(), &layer, min) {
                            Ok(n) => {
                                tracing::debug!(layer = %layer.digest, files = n, "complete files materialised")
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, layer = %layer.digest, "materialising complete files failed; they are copied on first open")
                            }
                        }
                    }) as AfterFill)
                };
                let h = self.st.rt.spawn(run_fill(
                    self.st.store.clone(),
                    layer.frames.clone(),
                    layer.source.clone(),
                    self.cfg.fill.clone(),
                    layer.fill.clone(),
                    self.fill_budget.clone(),
                    after,
                ));
                fills.insert(digest.clone(), h);
            }
        } else {
            layer.fill.set_state(FillState::Disabled);
        }
        tracing::info!(layer = %digest, entries = layer.entries, frames = layer.frames.frames.len(), toc_bytes = layer.toc_bytes(), "layer added");
        Ok(self.layer_path(digest))
    }

    /// Starts the start-up prefetch of `frames` of layer `digest` (no-op when the layer is
    /// not exposed, the list is empty or prefetch is off in the config).
    pub fn prefetch(&self, digest: &Digest, frames: Vec<FrameIdx>) {
        if !self.cfg.fill.prefetch || frames.is_empty() {
            return;
        }
        let Some(layer) = self.layer(digest) else {
            return;
        };
        // The header checks will want the frames holding the headers of the profile's files.
        let frames = if self.cfg.fill.check_headers && !layer.trust.walked() {
            crate::fs::trust::with_header_frames(&layer, frames)
        } else {
            frames
        };
        // Another image (or a second Prepare) may name the same frames: only new ones.
        let frames = layer.claim_prefetch(&frames);
        if frames.is_empty() {
            return;
        }
        tracing::debug!(layer = %digest, frames = frames.len(), "start-up prefetch");
        self.st.rt.spawn(run_prefetch(
            self.st.store.clone(),
            layer.frames.clone(),
            layer.source.clone(),
            frames,
            self.cfg.fill.prefetch_batch_bytes,
            layer.prefetch.clone(),
        ));
    }

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

    /// A quarantined layer never stays native: the tree is unused from now on and deleted
    /// once no snapshot's mount names it.
    fn drop_native(&self, l: &Layer) {
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

    /// (file bytes, TOC entries) of exposed layer `digest`, as reported for its snapshot usage.
    pub fn usage(&self, digest: &Digest) -> Option<(i64, i64)> {
        self.layer(digest)
            .map(|l| (l.file_bytes as i64, l.entries as i64))
    }

    /// Frames in the TOC of exposed layer `digest`.
    pub fn frame_count(&self, digest: &Digest) -> Option<usize> {
        self.layer(digest).map(|l| l.frames.frames.len())
    }

    fn layer(&self, digest: &Digest) -> Option<Arc<Layer>> {
        let g = self.st.layers.read();
        let slot = *g.slot_of.get(digest)?;
        g.by_slot.get(slot as usize).cloned().flatten()
    }

    /// Files read from each exposed layer since it was added or [`LayerStore::reset_access`],
    /// in first-read order (paths relative to the layer root, byte ranges read; empty = all).
    pub fn accessed(&self) -> Vec<(Digest, Vec<crate::fs::layer::FileRanges>)> {
        self.all_layers()
            .iter()
            .map(|l| (l.digest.clone(), l.accessed()))
            .collect()
    }

    /// Forgets every layer's access log.
    pub fn reset_access(&self) {
        for l in self.all_layers() {
            l.reset_access();
        }
    }

    fn all_layers(&self) -> Vec<Arc<Layer>> {
        self.st
            .layers
            .read()
            .by_slot
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The mount root's listing changed (a layer came or went): the kernel caches directory
    /// listings for the whole session (see `WeenvFs::opendir`), so the root inode's cached
    /// listing and attributes are dropped.
    fn root_changed(&self) {
        for m in self.mounts() {
            m.root_changed();
        }
    }

    /// True if `digest` is exposed.
    pub fn has_layer(&self, digest: &Digest) -> bool {
        let g = self.st.layers.read();
        g.slot_of
            .get(digest)
            .is_some_and(|s| matches!(g.by_slot.get(*s as usize), Some(Some(_))))
    }

    /// Stops exposing a layer (its directory disappears; cached frames stay in L2 until
    /// evicted). The caller must have unmounted every overlay that uses it.
    pub fn remove_layer(&self, digest: &Digest) -> Result<(), LayerError> {
        {
            let mut g = self.st.layers.write();
            let slot = *g
                .slot_of
                .get(digest)
                .ok_or_else(|| LayerError::NotFound(digest.clone()))?;
            match g.by_slot.get_mut(slot as usize) {
                Some(s @ Some(_)) => *s = None,
                _ => return Err(LayerError::NotFound(digest.clone())),
            }
        }
        if let Some(h) = self.fills.lock().remove(digest) {
            h.abort();
        }
        self.reloads.lock().remove(digest);
        for n in self.mounts().filter_map(|m| m.notifier.as_ref()) {
            let _ = n.inval_entry(INodeNo(ROOT_INO), OsStr::new(digest.hex()));
        }
        self.root_changed();
        self.st.store.l2().remove_layer_files(digest);
        // No snapshot names the layer any more (the caller checked), so neither its tree.
        self.st.store.l2().remove_native(digest);
        tracing::info!(layer = %digest, "layer removed");
        Ok(())
    }

    /// Mounted layers with cache and fill state.
    pub fn status(&self) -> Vec<LayerStatus> {
        let layers = self.all_layers();
        let l2 = self.st.store.l2();
        layers
            .iter()
            .map(|l| {
                let (mut frames_cached, mut bytes_cached, mut bytes_fetched) = (0, 0, 0);
                let native = l.native_ok() && l2.has_native(&l.digest);
                for f in &l.frames.frames {
                    // A native layer holds every byte in its tree (its frames are dropped).
                    if native || l2.contains(&f.digest) {
                        frames_cached += 1;
                        bytes_cached += f.ulen;
                        bytes_fetched += f.clen;
                    }
                }
                LayerStatus {
                    digest: l.digest.clone(),
                    path: self.layer_path(&l.digest),
                    entries: l.entries,
                    toc_bytes: l.toc_bytes(),
                    bytes_total: l.bytes_total(),
                    bytes_cached,
                    bytes_fetched,
                    bytes_filled: l.fill.bytes_fetched.load(Ordering::Relaxed),
                    bytes_prefetched: l.prefetch.bytes_fetched.load(Ordering::Relaxed),
                    bytes_read: l.bytes_read(),
                    frames_total: l.frames.frames.len(),
                    frames_cached,
                    fill: l.fill.state(),
                    fill_error: l.fill.last_error(),
                    prefetch_frames: l.prefetch.frames_total.load(Ordering::Relaxed),
                    prefetch_done: l.prefetch.frames_done.load(Ordering::Relaxed),
                    prefetch_error: l.prefetch.last_error(),
                    claimed_diff_id: l.trust.claim(),
                    verified: l.trust.verified(),
                    native,
                    quarantined: l.trust.reason(),
                }
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_fuse_mount_in_mountinfo() {
        let mi = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                  90 27 0:55 / /var/lib/weenv/mnt ro,nosuid - fuse.weenv weenv ro,user_id=0\n\
                  91 27 0:56 / /a\\040b rw - fuse.weenv weenv rw\n\
                  92 27 8:1 / /var/lib/weenv/other rw - ext4 /dev/sda1 rw\n";
        assert!(fuse_mounted_at(mi, Path::new("/var/lib/weenv/mnt")));
        assert!(fuse_mounted_at(mi, Path::new("/a b")));
        assert!(!fuse_mounted_at(mi, Path::new("/var/lib/weenv/other")));
        assert!(!fuse_mounted_at(mi, Path::new("/var/lib/weenv")));
    }
}
