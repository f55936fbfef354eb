//! The store's FUSE sessions and their handover: mounting a new session (with its INTERRUPT
//! probe) or taking over one a keeper holds ([`open_mount`]), serving it, leaving it to the
//! keeper at a planned restart, unmounting it at shutdown.
//!
//! Contract with [`crate::handover`]: a kept session is taken over only if its protocol
//! version and mountpoint match and it is still mounted ([`usable_takeover`]); every digest
//! keeps the inode slot the keeper recorded ([`restore_slots`]), so the kernel's inode numbers
//! stay valid; live opens reach the keeper from a thread of their own ([`start_open_log`]),
//! never from a request path.

use super::{io_err, LayerError};
use crate::fs::layer::ROOT_INO;
use crate::fs::ops::FsState;
use crate::fs::{SessionKind, SessionState, WeenvFs};
use crate::handover::client::KeeperClient;
use crate::handover::{resume, SessionMeta, META_VERSION};
use fuser::{BackgroundSession, Config, INodeNo, MountOption, Notifier, Session, SessionACL};
use parking_lot::Mutex;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weenv_format::Digest;

/// The keepers of the two sessions (see [`crate::handover`]); none: the sessions end with the
/// daemon.
#[derive(Default)]
pub struct Keepers {
    pub full: Option<KeeperClient>,
    pub plain: Option<KeeperClient>,
}

/// One FUSE session of the store, mounted at `mountpoint`.
pub(super) struct FuseMount {
    pub(super) mountpoint: PathBuf,
    state: Arc<SessionState>,
    session: Mutex<Option<BackgroundSession>>,
    /// A taken-over session, served by [`LayerStore::serve`] once the layers are back.
    pending: Mutex<Option<Session<WeenvFs>>>,
    pub(super) notifier: Option<Notifier>,
    /// The keeper holding a copy of the session's fd (see [`crate::handover`]).
    pub(super) keeper: Option<Arc<KeeperClient>>,
    /// The FUSE INTERRUPT probe: its lookup on our own mount must be answered while the
    /// workers live, or its thread waits in the kernel forever and keeps the process (and the
    /// session's fd) from ending.
    probe: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl FuseMount {
    pub(super) fn kind(&self) -> SessionKind {
        self.state.kind
    }

    pub(super) fn live(&self) -> bool {
        self.session.lock().is_some() || self.pending.lock().is_some()
    }

    /// Drops the kernel's cached listing of the mount root (layers came or went).
    pub(super) fn root_changed(&self) {
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
    pub(super) fn serve(&self, layers: usize) -> Result<(), LayerError> {
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
    pub(super) fn hand_over(&self) {
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

    pub(super) fn shutdown(&self) {
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
pub(super) fn usable_takeover(
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
pub(super) fn start_open_log(
    st: &FsState,
    k: Arc<KeeperClient>,
) -> Option<std::thread::JoinHandle<()>> {
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
pub(super) fn restore_slots(st: &FsState, meta: &SessionMeta) {
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
pub(super) fn open_mount(
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
