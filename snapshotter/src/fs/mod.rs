//! The FUSE filesystem: two sessions (full and plain, see [`SessionKind`]) over one inode
//! numbering, one directory per layer at the root (named by digest hex).
//!
//! - [`inode`]: the inode table of a layer, built from its TOC (pure; whiteouts, hardlinks).
//! - [`layer`]: a mounted layer and the inode numbering (slot in the high bits).
//! - [`ops`]: the shared state and the `Result<T, Errno>` helpers behind lookups, attributes,
//!   listings, xattrs and read planning.
//! - [`read_path`]: the work behind READ and OPEN (native tree, cached frames or a fetch;
//!   read-ahead; header checks; passthrough opens).
//! - [`readahead`]: read-ahead windows within a file and across a layer's files (pure).
//! - [`passthrough`]: complete files handed to the kernel (FUSE passthrough).
//! - [`native`]: native trees of complete, verified layers.
//! - [`trust`] + [`verify`]: quarantine, the completion check (diff_id) and the per-entry
//!   header checks.
//! - [`interrupt`]: the probe that makes the kernel stop sending FUSE INTERRUPT.
//!
//! This module's [`WeenvFs`] only decodes requests, calls a helper and replies. Reads that
//! miss memory move their `ReplyData` into a tokio task and reply when the frames arrive, so
//! no FUSE loop ever waits on the network. Nothing here panics on a request path.

pub mod inode;
pub mod interrupt;
pub mod layer;
pub mod native;
pub mod ops;
pub mod passthrough;
pub mod read_path;
pub mod readahead;
pub mod trust;
pub mod verify;

use crate::metrics::FuseOp;
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use layer::{decode_ino, ROOT_INO};
use ops::FsState;
use read_path::{Opened, ReadData};
use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Which of the node's two FUSE sessions a handler serves. Both serve the same layers'
/// inodes (one [`FsState`], one inode numbering); they differ in what the kernel learns to
/// stop asking, which is per session (per FUSE connection), not per file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionKind {
    /// Every layer: xattrs are answered, opens hand complete files to the kernel
    /// (passthrough).
    Full,
    /// Only layers without any xattr ([`layer::Layer::plain`]). GETXATTR and OPEN are
    /// answered ENOSYS, so the kernel stops sending them for the whole session: xattr reads
    /// then fail with EOPNOTSUPP in the kernel, which overlayfs takes as "no such xattr"
    /// (LISTXATTR gets the empty list), and files open without a round trip, keeping their page cache
    /// (`FOPEN_KEEP_CACHE`). Measured on a warm python start over lazy layers: overlayfs
    /// asked ~490 xattrs (`trusted.overlay.metacopy` of every regular file it looks up,
    /// whatever its `metacopy` option) and python made ~160 OPEN/RELEASE pairs, all gone.
    /// The price: no passthrough on this session (reads of uncached pages are FUSE reads).
    Plain,
}

impl SessionKind {
    /// True if this session's root lists `layer`.
    pub fn serves(self, layer: &layer::Layer) -> bool {
        match self {
            SessionKind::Full => true,
            SessionKind::Plain => layer.plain,
        }
    }
}

/// What belongs to one FUSE session (the layers' state is shared: [`FsState`]).
pub struct SessionState {
    pub kind: SessionKind,
    /// The INTERRUPT probe run right after mounting (see [`interrupt`]).
    pub probe: interrupt::ProbeSlot,
    /// What the kernel offered in FUSE INIT (kept for a successor, see [`crate::handover`]).
    pub init: parking_lot::Mutex<Option<crate::handover::InitParams>>,
}

impl SessionState {
    pub fn new(kind: SessionKind) -> Arc<Self> {
        Arc::new(SessionState {
            kind,
            probe: Default::default(),
            init: parking_lot::Mutex::new(None),
        })
    }

    /// Records what the kernel offered in INIT (`flags`: its capability bits).
    pub fn set_init(&self, init: crate::handover::InitParams) {
        *self.init.lock() = Some(init);
    }

    /// True if the kernel opens files without a request once OPEN is answered ENOSYS
    /// (`FUSE_NO_OPEN_SUPPORT`, Linux 4.19+); before that an ENOSYS fails the open(2).
    pub fn zero_open(&self) -> bool {
        self.init
            .lock()
            .is_some_and(|i| i.flags & InitFlags::FUSE_NO_OPEN_SUPPORT.bits() != 0)
    }
}

/// The `fuser::Filesystem` adapter over [`FsState`], for one session.
pub struct WeenvFs {
    pub st: Arc<FsState>,
    pub session: Arc<SessionState>,
}

impl WeenvFs {
    fn plain(&self) -> bool {
        self.session.kind == SessionKind::Plain
    }
}

/// Walks directory `ino` from entry `offset`, handing each entry and the offset of the next
/// one to `add` until `add` returns true (reply buffer full) or the directory ends.
fn walk_dir(
    st: &FsState,
    kind: SessionKind,
    ino: u64,
    offset: u64,
    mut add: impl FnMut(&ops::DirEntry, u64) -> bool,
) -> Result<(), Errno> {
    let mut i = offset;
    while let Some(e) = st.dir_entry(kind, ino, i)? {
        if add(&e, i + 1) {
            break;
        }
        i += 1;
    }
    Ok(())
}

fn xattr_reply(reply: ReplyXattr, size: u32, data: &[u8]) -> bool {
    if size == 0 {
        reply.size(data.len() as u32);
        true
    } else if (size as usize) < data.len() {
        reply.error(Errno::ERANGE);
        false
    } else {
        reply.data(data);
        true
    }
}

impl Filesystem for WeenvFs {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        let abi = cfg.kernel_abi();
        self.session.set_init(crate::handover::InitParams {
            major: abi.0,
            minor: abi.1,
            flags: cfg.capabilities().bits(),
        });
        if self.st.passthrough.enabled && !self.plain() {
            match cfg.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => {
                    if let Err(d) = cfg.set_max_stack_depth(1) {
                        tracing::warn!(
                            max = d,
                            "kernel refused max_stack_depth 1; passthrough off"
                        );
                    } else {
                        self.st.passthrough.available.store(true, Ordering::Relaxed);
                    }
                }
                Err(_) => tracing::warn!(
                    "kernel lacks FUSE_PASSTHROUGH; complete files are served through FUSE reads"
                ),
            }
        }
        // Large reads: frames are ~1 MiB.
        let _ = cfg.set_max_readahead(1 << 20);
        // Listings come with attributes (one READDIRPLUS instead of a LOOKUP per entry:
        // `find` over an overlay of FUSE lowers stats every entry).
        if cfg
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS)
            .is_err()
        {
            tracing::info!("kernel lacks READDIRPLUS; listings need a lookup per entry");
        }
        // Layer content never changes: symlink targets may stay in the page cache (each
        // path walk through a symlink was a READLINK), and lookups/listings in one directory
        // may run in parallel.
        for flag in [
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            if cfg.add_capabilities(flag).is_err() {
                tracing::info!(?flag, "kernel lacks an optional FUSE capability");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut op = self.st.metrics.op(FuseOp::Lookup);
        if parent.0 == ROOT_INO && name == interrupt::PROBE_NAME && self.session.probe.held() {
            // Answered late, so the kernel's INTERRUPT for it finds it pending.
            self.st.rt.spawn(async move {
                tokio::time::sleep(interrupt::HOLD).await;
                reply.error(Errno::ENOENT);
            });
            return;
        }
        let res = self.st.lookup_name(self.session.kind, parent.0, name);
        tracing::trace!(parent = parent.0, ?name, ok = res.is_ok(), "lookup");
        match res {
            Ok((attr, ttl)) => reply.entry(&ttl, &attr, Generation(0)),
            // Layer content never changes: let the kernel cache the absence (node id 0 with a
            // timeout). overlayfs looks every name up in each lower below the one holding it.
            Err(Errno::ENOENT) if parent.0 != ROOT_INO => {
                reply.entry(&self.st.ttl, &ops::negative_attr(), Generation(0));
            }
            Err(e) => {
                if e != Errno::ENOENT {
                    op.fail();
                }
                reply.error(e);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut op = self.st.metrics.op(FuseOp::Getattr);
        match self.st.attr(ino.0) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let mut op = self.st.metrics.op(FuseOp::Readlink);
        match self.st.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut op = self.st.metrics.op(FuseOp::Open);
        match read_path::open(&self.st, &self.session, ino.0, flags.0) {
            Ok(Opened::Now(fh, flags)) => reply.opened(fh, flags),
            Ok(Opened::NoOpens) => reply.error(Errno::ENOSYS),
            Ok(Opened::Cached) => self.st.passthrough.reply_cached(reply),
            Ok(Opened::Passthrough(answer)) => {
                self.st.rt.spawn_blocking(move || answer(reply));
            }
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Owned: a later read takes the guard into its task.
        let mut op = self.st.metrics.op_owned(FuseOp::Read);
        match read_path::read(&self.st, ino.0, offset, size) {
            Ok(ReadData::Now(data)) => reply.data(&data),
            Ok(ReadData::Later(data)) => {
                self.st.rt.spawn(async move {
                    match data.await {
                        Ok(data) => reply.data(&data),
                        Err(e) => {
                            op.fail();
                            reply.error(e);
                        }
                    }
                });
            }
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    /// Nothing to flush on a read-only filesystem. ENOSYS (as fuser's default, minus its
    /// warning) makes the kernel stop sending FLUSH on close: no round trip per close().
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _op = self.st.metrics.op(FuseOp::Release);
        self.st.passthrough.release(self.st.store.l2(), ino.0, fh.0);
        reply.ok();
    }

    /// Layer directories never change, so OPENDIR is answered ENOSYS: the kernel then stops
    /// sending OPENDIR and RELEASEDIR for the whole session (two round trips per directory
    /// open: ~700 per container on the harness import) and opens every directory with
    /// `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`, so listings stay cached. The mount root's listing
    /// changes as layers come and go: [`crate::layers::LayerStore`] invalidates the root inode
    /// (its cached listing) on every add and remove.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut op = self.st.metrics.op(FuseOp::Opendir);
        match ops::opendir_answer(self.st.attr(ino.0).map(|(a, _)| a.kind)) {
            Ok(()) => reply.error(Errno::ENOSYS),
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut op = self.st.metrics.op(FuseOp::Readdir);
        let walked = walk_dir(&self.st, self.session.kind, ino.0, offset, |e, next| {
            reply.add(INodeNo(e.ino), next, e.kind, &e.name)
        });
        match walked {
            Ok(()) => reply.ok(),
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut op = self.st.metrics.op(FuseOp::Readdirplus);
        let walked = walk_dir(&self.st, self.session.kind, ino.0, offset, |e, next| {
            // An entry whose attributes cannot be read ends the listing early.
            let Ok((attr, ttl)) = self.st.attr(e.ino) else {
                return true;
            };
            reply.add(INodeNo(e.ino), next, &e.name, &ttl, &attr, Generation(0))
        });
        match walked {
            Ok(()) => reply.ok(),
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _op = self.st.metrics.op(FuseOp::Statfs);
        let (blocks, files) = self.st.totals();
        reply.statfs(blocks, 0, 0, files, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let mut op = self.st.metrics.op(FuseOp::Getxattr);
        if self.plain() {
            // Once: the kernel answers EOPNOTSUPP for the whole session from now on.
            return reply.error(Errno::ENOSYS);
        }
        tracing::trace!(ino = ino.0, ?name, "getxattr");
        match self.st.getxattr(ino.0, name) {
            Ok(v) => {
                if !xattr_reply(reply, size, &v) {
                    op.fail();
                }
            }
            Err(e) => {
                if e != Errno::NO_XATTR {
                    op.fail();
                }
                reply.error(e);
            }
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut op = self.st.metrics.op(FuseOp::Listxattr);
        if self.plain() {
            // The session serves only layers without xattrs: an empty list, as a disk
            // filesystem gives (ENOSYS would make every listxattr(2) fail with EOPNOTSUPP;
            // listing is rare: `cp -a`, `tar --xattrs`, overlayfs copy-up).
            let _ = xattr_reply(reply, size, &[]);
            return;
        }
        match self.st.listxattr(ino.0) {
            Ok(v) => {
                if !xattr_reply(reply, size, &v) {
                    op.fail();
                }
            }
            Err(e) => {
                op.fail();
                reply.error(e);
            }
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks modes itself; this only confirms existence.
        let mut op = self.st.metrics.op(FuseOp::Access);
        if ino.0 == ROOT_INO || decode_ino(ino.0).is_some_and(|_| self.st.resolve(ino.0).is_ok()) {
            reply.ok();
        } else {
            op.fail();
            reply.error(Errno::ENOENT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_message_opens_follow_the_kernels_offer() {
        let init = |flags| crate::handover::InitParams {
            major: 7,
            minor: 41,
            flags,
        };
        let s = SessionState::new(SessionKind::Plain);
        s.set_init(init(InitFlags::FUSE_NO_OPEN_SUPPORT.bits() | 1));
        assert!(s.zero_open());
        assert_eq!(s.init.lock().map(|i| i.minor), Some(41));
        // A kernel without it (before 4.19): an ENOSYS would fail every open(2).
        s.set_init(init(InitFlags::FUSE_PASSTHROUGH.bits()));
        assert!(!s.zero_open());
    }

    #[test]
    fn the_plain_session_serves_only_layers_without_xattrs() {
        use weenv_format::toc::{Entry, Toc};
        use weenv_format::EntryKind;
        let layer = |entries: Vec<Entry>| {
            let toc = Toc {
                entries,
                ..Toc::new()
            };
            let src: Arc<dyn crate::fetch::RangeSource> =
                crate::fetch::testutil::MemSource::new(Vec::new());
            let digest = format!("sha256:{}", "0".repeat(64)).parse().unwrap();
            layer::Layer::new(digest, 0, toc, src).unwrap()
        };
        let mut dir = inode::tests::entry("d", EntryKind::Dir);
        let plain = layer(vec![dir.clone()]);
        dir.xattrs.insert("security.capability".into(), vec![1]);
        let rich = layer(vec![dir]);
        assert!(SessionKind::Plain.serves(&plain) && SessionKind::Full.serves(&plain));
        assert!(!SessionKind::Plain.serves(&rich) && SessionKind::Full.serves(&rich));
    }
}
