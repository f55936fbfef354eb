//! L2: everything the daemon keeps on the node's disk under `cache_dir`, bounded by ONE
//! byte cap (`cache.disk_bytes`) and ONE LRU ([`Lru`]):
//! - verified, uncompressed frames, content addressed: `frames/<hex[0..2]>/<hex>` (a frame
//!   shared by several layers is stored once);
//! - complete-file copies for FUSE passthrough: `files/<layer hex>/<node>` (see
//!   [`crate::fs::passthrough`]);
//! - the directories themselves (4 KiB each, as `du` counts them).
//!
//! Sizes are accounted in 4 KiB blocks, as `du` reports them. Frames are written to
//! `frames/tmp/<hex>.<n>` and renamed into place, then accounted (the cache may exceed the
//! cap by the frames being written). A complete copy is first *reserved* (accounted, pinned;
//! refused when the pinned entries leave no room), written next to its final path and renamed
//! ([`FileReservation::commit`]), so a copy never pushes the cache past the cap. A crash leaves
//! only temp files, removed at the next open.
//!
//! Frames are verified against their digest *before* they are written, and trusted when
//! loaded (only the length is checked against the TOC's `ulen`): the directory is private to
//! the daemon (0700, root), and hashing every cached frame again on each read would cost
//! ~2 ms per MiB on the hot path. A frame whose length is wrong is deleted and treated as a
//! miss.
//!
//! Pinned entries are never evicted: frames while they are read or copied, complete copies
//! while a passthrough file handle has them open (evicting a copy just means later opens are
//! served through FUSE reads again). The index is rebuilt from the directory on open (oldest
//! mtime first), so the cache survives restarts.

use super::lru::Lru;
use super::CacheError;
use crate::metrics::Metrics;
use bytes::Bytes;
use parking_lot::Mutex;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use weenv_format::Digest;

/// Block size `du` counts in.
const BLOCK: u64 = 4096;
/// Directories always present: `cache_dir`, `frames`, `frames/tmp`, the 256 `frames/xx`
/// fan-out directories (created on demand; accounted up front), `files` and `native`.
const FIXED_DIRS: u64 = 5 + 256;

/// Bytes `du` charges for a file of `len` bytes (whole 4 KiB blocks). Pure.
pub fn on_disk(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// What an LRU entry stands for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// A frame file.
    Frame(Digest),
    /// The complete copy of file node `.1` of layer `.0`.
    File(Digest, u32),
    /// The `files/<layer hex>` directory (removed with the layer's copies).
    LayerDir(Digest),
    /// The native tree of a layer, `native/<layer hex>` (size: as `du` counts it; pinned
    /// once per live snapshot whose mount names it, see [`crate::fs::native`]).
    Native(Digest),
    /// The fixed directories (pinned for good).
    Dirs,
}

/// The disk cache.
#[derive(Debug)]
pub struct DiskCache {
    frames_dir: PathBuf,
    files_dir: PathBuf,
    native_dir: PathBuf,
    /// Native trees found at open, pinned until [`DiskCache::native_restored`] (the snapshots
    /// naming them take their own pins first).
    boot_pins: Mutex<Vec<Digest>>,
    lru: Mutex<Lru<Key>>,
    seq: AtomicU64,
    metrics: Arc<Metrics>,
}

/// Keeps a frame from being evicted while alive.
pub struct Pin<'a> {
    cache: &'a DiskCache,
    digest: Digest,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let evicted = self
            .cache
            .lru
            .lock()
            .unpin(&Key::Frame(self.digest.clone()));
        self.cache.delete(evicted);
    }
}

impl Pin<'_> {
    /// Path of the pinned frame file.
    pub fn path(&self) -> PathBuf {
        self.cache.path_of(&self.digest)
    }
}

/// Space reserved (and pinned) for a complete copy being written; dropped uncommitted, it
/// releases the space and removes the temp file.
pub struct FileReservation<'a> {
    cache: &'a DiskCache,
    layer: Digest,
    node: u32,
    tmp: PathBuf,
    committed: bool,
}

impl FileReservation<'_> {
    /// The temp file to write the copy to (in the final directory, for the rename).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Renames the written temp file into place and makes the copy evictable.
    pub fn commit(mut self) -> std::io::Result<PathBuf> {
        let path = self.cache.file_path(&self.layer, self.node);
        fs::rename(&self.tmp, &path)?;
        self.committed = true;
        let key = Key::File(self.layer.clone(), self.node);
        let evicted = self.cache.lru.lock().unpin(&key);
        self.cache.delete(evicted);
        Ok(path)
    }
}

impl Drop for FileReservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
            self.cache
                .lru
                .lock()
                .remove(&Key::File(self.layer.clone(), self.node));
        }
    }
}

/// Space reserved (and pinned) for a native tree being built in [`Self::tmp_path`]; dropped
/// uncommitted, it releases the space and deletes the temp tree.
pub struct NativeReservation<'a> {
    cache: &'a DiskCache,
    layer: Digest,
    tmp: PathBuf,
    committed: bool,
}

impl NativeReservation<'_> {
    /// The directory to build the tree in (renamed into place by [`Self::commit`]).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Renames the built tree into place, accounts its real size and makes it evictable.
    pub fn commit(mut self) -> std::io::Result<PathBuf> {
        let path = self.cache.native_path(&self.layer);
        let size = tree_usage(&self.tmp);
        fs::rename(&self.tmp, &path)?;
        self.committed = true;
        let key = Key::Native(self.layer.clone());
        let evicted = {
            let mut g = self.cache.lru.lock();
            let mut ev = g.insert(key.clone(), size, false); // keeps the build's pin
            ev.extend(g.unpin(&key));
            ev
        };
        self.cache.delete(evicted);
        Ok(path)
    }
}

impl Drop for NativeReservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            remove_tree_in_background(self.tmp.clone());
            self.cache
                .lru
                .lock()
                .remove(&Key::Native(self.layer.clone()));
        }
    }
}

/// Bytes `du` counts for the tree at `root` (allocated blocks, each inode once).
pub fn tree_usage(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut size = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(md) = fs::symlink_metadata(&p) else {
            continue;
        };
        if seen.insert(md.ino()) {
            size += md.blocks() * 512;
        }
        if md.is_dir() {
            if let Ok(rd) = fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    size
}

fn remove_tree_in_background(path: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("remove-tree".into())
        .spawn({
            let path = path.clone();
            move || {
                let _ = fs::remove_dir_all(&path);
            }
        });
    if spawned.is_err() {
        let _ = fs::remove_dir_all(&path);
    }
}

fn io_err<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> CacheError + 'a {
    move |source| CacheError::Io {
        what,
        path: path.to_path_buf(),
        error: source,
    }
}

/// Cache dirs are private to root whatever the umask (`crate::dirs`).
fn mkdir(dir: &Path) -> std::io::Result<()> {
    crate::dirs::ensure(dir, crate::dirs::PRIVATE).map(|_| ())
}

/// Files of `dir` (`(mtime, name, len)`); temp files (`tmp(name)`) are removed.
fn scan(dir: &Path, tmp: impl Fn(&str) -> bool) -> Vec<(i64, String, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for f in rd.flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if tmp(&name) {
            let _ = fs::remove_file(f.path());
        } else if let Ok(md) = f.metadata() {
            if md.is_file() {
                out.push((md.mtime(), name, md.len()));
            }
        }
    }
    out
}

impl DiskCache {
    /// Opens (creating) the cache under `dir` (`frames/`, `files/`) with a cap of `capacity`
    /// bytes, indexing what is already there and removing leftover temp files.
    pub fn open(dir: &Path, capacity: u64, metrics: Arc<Metrics>) -> Result<Self, CacheError> {
        crate::dirs::ensure_private(dir).map_err(io_err(dir, "create cache dir"))?;
        let frames_dir = dir.join("frames");
        let files_dir = dir.join("files");
        let tmp = frames_dir.join("tmp");
        mkdir(&tmp).map_err(io_err(&tmp, "create cache dir"))?;
        mkdir(&files_dir).map_err(io_err(&files_dir, "create cache dir"))?;
        let native_dir = dir.join("native");
        mkdir(&native_dir).map_err(io_err(&native_dir, "create cache dir"))?;
        scan(&tmp, |_| true);
        let mut found: Vec<(i64, Key, u64)> = Vec::new();
        for sub in fs::read_dir(&frames_dir)
            .map_err(io_err(&frames_dir, "list cache dir"))?
            .flatten()
        {
            let sub_name = sub.file_name().to_string_lossy().into_owned();
            if sub_name.len() != 2 {
                continue;
            }
            for (mtime, name, len) in scan(&sub.path(), |_| false) {
                if let Ok(d) = format!("sha256:{name}").parse::<Digest>() {
                    found.push((mtime, Key::Frame(d), len));
                }
            }
        }
        for sub in fs::read_dir(&files_dir)
            .map_err(io_err(&files_dir, "list cache dir"))?
            .flatten()
        {
            let Ok(layer) =
                format!("sha256:{}", sub.file_name().to_string_lossy()).parse::<Digest>()
            else {
                continue;
            };
            found.push((i64::MIN, Key::LayerDir(layer.clone()), BLOCK));
            for (mtime, name, len) in scan(&sub.path(), |n| n.starts_with(".tmp.")) {
                if let Ok(node) = name.parse::<u32>() {
                    found.push((mtime, Key::File(layer.clone(), node), len));
                }
            }
        }
        let mut boot_pins = Vec::new();
        for sub in fs::read_dir(&native_dir)
            .map_err(io_err(&native_dir, "list cache dir"))?
            .flatten()
        {
            let name = sub.file_name().to_string_lossy().into_owned();
            let layer = format!("sha256:{name}").parse::<Digest>();
            match layer {
                Ok(layer) if !name.starts_with('.') => {
                    let mtime = sub.metadata().map(|m| m.mtime()).unwrap_or(0);
                    let size = tree_usage(&sub.path());
                    boot_pins.push(layer.clone());
                    found.push((mtime, Key::Native(layer), size));
                }
                // Temp trees of an interrupted build, trees being deleted.
                _ => remove_tree_in_background(sub.path()),
            }
        }
        found.sort_by_key(|(mtime, _, _)| *mtime);
        let mut lru = Lru::new(capacity);
        let mut evicted = lru.insert(Key::Dirs, FIXED_DIRS * BLOCK, true);
        for (_, k, len) in found {
            let pin = matches!(k, Key::LayerDir(_) | Key::Native(_));
            let size = if matches!(k, Key::LayerDir(_) | Key::Native(_)) {
                len
            } else {
                on_disk(len)
            };
            evicted.extend(lru.insert(k, size, pin));
        }
        let c = DiskCache {
            frames_dir,
            files_dir,
            native_dir,
            boot_pins: Mutex::new(boot_pins),
            lru: Mutex::new(lru),
            seq: AtomicU64::new(0),
            metrics,
        };
        c.delete(evicted);
        Ok(c)
    }

    /// Where the frame `d` lives.
    pub fn path_of(&self, d: &Digest) -> PathBuf {
        let hex = d.hex();
        self.frames_dir.join(&hex[..2]).join(hex)
    }

    /// True if `d` is cached.
    pub fn contains(&self, d: &Digest) -> bool {
        self.lru.lock().contains(&Key::Frame(d.clone()))
    }

    /// Pins `d` if cached.
    pub fn pin(&self, d: &Digest) -> Option<Pin<'_>> {
        let key = Key::Frame(d.clone());
        let mut g = self.lru.lock();
        if !g.pin(&key) {
            return None;
        }
        g.touch(&key);
        Some(Pin {
            cache: self,
            digest: d.clone(),
        })
    }

    /// Loads frame `d` if cached and `expected_len` long; a wrong-length file is dropped.
    pub fn get(&self, d: &Digest, expected_len: u64) -> Result<Option<Bytes>, CacheError> {
        let Some(pin) = self.pin(d) else {
            return Ok(None);
        };
        let path = pin.path();
        match fs::read(&path) {
            Ok(v) if v.len() as u64 == expected_len => {
                self.metrics
                    .l2_hit_bytes
                    .fetch_add(expected_len, Ordering::Relaxed);
                Ok(Some(Bytes::from(v)))
            }
            Ok(v) => {
                tracing::warn!(digest = %d, len = v.len(), expected_len, "cached frame has wrong length; dropping it");
                drop(pin);
                self.remove(d);
                Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                drop(pin);
                self.lru.lock().remove(&Key::Frame(d.clone()));
                Ok(None)
            }
            Err(e) => Err(CacheError::Io {
                what: "read frame",
                path,
                error: e,
            }),
        }
    }

    /// Stores verified frame `d` (atomic: temp file + rename).
    pub fn put(&self, d: &Digest, data: &[u8]) -> Result<(), CacheError> {
        if self.contains(d) {
            return Ok(());
        }
        let path = self.path_of(d);
        if let Some(parent) = path.parent() {
            mkdir(parent).map_err(io_err(parent, "create cache subdir"))?;
        }
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.frames_dir.join("tmp").join(format!("{}.{n}", d.hex()));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(CacheError::Io {
                what: "write frame",
                path,
                error: e,
            });
        }
        let evicted =
            self.lru
                .lock()
                .insert(Key::Frame(d.clone()), on_disk(data.len() as u64), false);
        self.delete(evicted);
        Ok(())
    }

    /// Drops `d` from the cache.
    pub fn remove(&self, d: &Digest) {
        if self.lru.lock().remove(&Key::Frame(d.clone())).is_some() {
            let _ = fs::remove_file(self.path_of(d));
        }
    }

    /// Directory of the complete copies of `layer`.
    pub fn layer_dir(&self, layer: &Digest) -> PathBuf {
        self.files_dir.join(layer.hex())
    }

    /// Path of the complete copy of file `node` of `layer`.
    pub fn file_path(&self, layer: &Digest, node: u32) -> PathBuf {
        self.layer_dir(layer).join(node.to_string())
    }

    /// True if the complete copy of `node` of `layer` is cached (marks it recently used).
    pub fn has_file(&self, layer: &Digest, node: u32) -> bool {
        self.lru.lock().touch(&Key::File(layer.clone(), node))
    }

    /// Pins the complete copy of `node` of `layer` (for an open file handle); false if it
    /// is not cached. Undo with [`unpin_file`](Self::unpin_file).
    pub fn pin_file(&self, layer: &Digest, node: u32) -> bool {
        let key = Key::File(layer.clone(), node);
        let mut g = self.lru.lock();
        g.touch(&key) && g.pin(&key)
    }

    /// Releases a pin of [`pin_file`](Self::pin_file).
    pub fn unpin_file(&self, layer: &Digest, node: u32) {
        let evicted = self.lru.lock().unpin(&Key::File(layer.clone(), node));
        self.delete(evicted);
    }

    /// Reserves room for a complete copy of `len` bytes of `node` of `layer`, evicting
    /// least recently used entries; `Ok(None)` when it is cached already or cannot fit
    /// beside the pinned entries (the file is then served through FUSE reads).
    pub fn reserve_file(
        &self,
        layer: &Digest,
        node: u32,
        len: u64,
    ) -> Result<Option<FileReservation<'_>>, CacheError> {
        let dir = self.layer_dir(layer);
        let dir_key = Key::LayerDir(layer.clone());
        let mut evicted = Vec::new();
        {
            let mut g = self.lru.lock();
            if !g.contains(&dir_key) {
                match g.reserve(dir_key, BLOCK) {
                    Some(ev) => evicted.extend(ev),
                    None => return Ok(None),
                }
            }
        }
        self.delete(std::mem::take(&mut evicted));
        mkdir(&dir).map_err(io_err(&dir, "create complete-file dir"))?;
        let Some(ev) = self
            .lru
            .lock()
            .reserve(Key::File(layer.clone(), node), on_disk(len))
        else {
            return Ok(None);
        };
        self.delete(ev);
        let tmp = dir.join(format!(
            ".tmp.{node}.{}",
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        Ok(Some(FileReservation {
            cache: self,
            layer: layer.clone(),
            node,
            tmp,
            committed: false,
        }))
    }

    /// Forgets and deletes every complete copy of `layer` (pins ignored: the layer is gone).
    pub fn remove_layer_files(&self, layer: &Digest) {
        {
            let mut g = self.lru.lock();
            let keys: Vec<Key> = g
                .keys()
                .filter(|k| matches!(k, Key::File(l, _) | Key::LayerDir(l) if l == layer))
                .cloned()
                .collect();
            for k in keys {
                g.remove(&k);
            }
        }
        let _ = fs::remove_dir_all(self.layer_dir(layer));
    }

    fn delete(&self, evicted: Vec<Key>) {
        for k in evicted {
            self.metrics.l2_evictions.fetch_add(1, Ordering::Relaxed);
            match k {
                Key::Frame(d) => {
                    let _ = fs::remove_file(self.path_of(&d));
                }
                Key::File(l, n) => {
                    let _ = fs::remove_file(self.file_path(&l, n));
                }
                Key::Native(l) => {
                    tracing::info!(layer = %l, "native tree evicted from the disk cache");
                    self.trash_native(&l);
                }
                Key::LayerDir(_) | Key::Dirs => {} // pinned for good
            }
        }
    }

    /// Where the native tree of `layer` lives (whether or not it exists).
    pub fn native_path(&self, layer: &Digest) -> PathBuf {
        self.native_dir.join(layer.hex())
    }

    /// True if the native tree of `layer` is in the cache.
    pub fn has_native(&self, layer: &Digest) -> bool {
        self.lru.lock().contains(&Key::Native(layer.clone()))
    }

    /// Pins the native tree of `layer` (a snapshot's mount names it); false if there is none.
    pub fn pin_native(&self, layer: &Digest) -> bool {
        let key = Key::Native(layer.clone());
        let mut g = self.lru.lock();
        g.touch(&key) && g.pin(&key)
    }

    /// Releases a pin of [`pin_native`](Self::pin_native).
    pub fn unpin_native(&self, layer: &Digest) {
        let evicted = self.lru.lock().unpin(&Key::Native(layer.clone()));
        self.delete(evicted);
    }

    /// Drops the pins the trees found at open held (call once the live snapshots pinned theirs).
    pub fn native_restored(&self) {
        let pins = std::mem::take(&mut *self.boot_pins.lock());
        for l in pins {
            self.unpin_native(&l);
        }
    }

    /// Reserves `estimate` bytes for a native tree of `layer` (pinned while it is built);
    /// `Ok(None)` when it exists or cannot fit beside the pinned entries.
    pub fn reserve_native(
        &self,
        layer: &Digest,
        estimate: u64,
    ) -> Result<Option<NativeReservation<'_>>, CacheError> {
        let Some(ev) = self
            .lru
            .lock()
            .reserve(Key::Native(layer.clone()), estimate)
        else {
            return Ok(None);
        };
        self.delete(ev);
        let tmp = self.native_dir.join(format!(
            ".tmp.{}.{}",
            layer.hex(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&tmp);
        Ok(Some(NativeReservation {
            cache: self,
            layer: layer.clone(),
            tmp,
            committed: false,
        }))
    }

    /// Forgets and deletes the native tree of `layer` unless a snapshot pins it; true if it
    /// is gone.
    pub fn remove_native(&self, layer: &Digest) -> bool {
        let key = Key::Native(layer.clone());
        {
            let mut g = self.lru.lock();
            if !g.contains(&key) {
                return true;
            }
            if g.pinned(&key) {
                return false;
            }
            g.remove(&key);
        }
        self.trash_native(layer);
        true
    }

    /// Renames the tree out of the way at once (no new mount can name it) and deletes it in
    /// the background (a big tree takes a while).
    fn trash_native(&self, layer: &Digest) {
        let from = self.native_path(layer);
        let to = self.native_dir.join(format!(
            ".trash.{}.{}",
            layer.hex(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        if fs::rename(&from, &to).is_ok() {
            remove_tree_in_background(to);
        }
    }

    /// Bytes held on disk (frames, complete copies, directories).
    pub fn used(&self) -> u64 {
        self.lru.lock().used()
    }

    /// Byte cap.
    pub fn capacity(&self) -> u64 {
        self.lru.lock().capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIRS: u64 = FIXED_DIRS * BLOCK;

    #[test]
    fn put_get_evict_and_reopen() {
        let t = tempfile::tempdir().unwrap();
        let cap = DIRS + 2 * BLOCK;
        let c = DiskCache::open(t.path(), cap, Arc::default()).unwrap();
        let (a, b) = (Digest::sha256(b"a"), Digest::sha256(b"b"));
        c.put(&a, &[b'a'; 5000]).unwrap();
        assert_eq!(c.used(), DIRS + 2 * BLOCK, "accounted in whole blocks");
        assert_eq!(c.get(&a, 5000).unwrap().map(|b| b.len()), Some(5000));
        {
            let _pin = c.pin(&a).unwrap();
            c.put(&b, b"bbbbbb").unwrap();
            assert!(c.contains(&a), "pinned frame survives");
            assert!(!c.contains(&b));
        }
        assert!(!c.path_of(&b).exists());
        assert!(c.get(&a, 5).unwrap().is_none(), "wrong length is a miss");
        assert!(!c.path_of(&a).exists());
        c.put(&b, b"bbbb").unwrap();
        drop(c);
        let c = DiskCache::open(t.path(), cap, Arc::default()).unwrap();
        assert_eq!(c.get(&b, 4).unwrap().as_deref(), Some(&b"bbbb"[..]));
        assert_eq!(c.used(), DIRS + BLOCK);
    }

    #[test]
    fn native_trees_share_the_cap_and_are_evicted_only_when_unpinned() {
        let t = tempfile::tempdir().unwrap();
        let cap = DIRS + 16 * BLOCK;
        let c = DiskCache::open(t.path(), cap, Arc::default()).unwrap();
        let layer = Digest::sha256(b"layer");
        let r = c.reserve_native(&layer, 4 * BLOCK).unwrap().unwrap();
        fs::create_dir_all(r.tmp_path().join("d")).unwrap();
        fs::write(r.tmp_path().join("d/f"), [1u8; 5000]).unwrap();
        assert!(
            c.reserve_native(&layer, BLOCK).unwrap().is_none(),
            "one build"
        );
        let path = r.commit().unwrap();
        assert_eq!(path, c.native_path(&layer));
        assert!(c.has_native(&layer) && path.join("d/f").is_file());
        let tree = c.used() - DIRS;
        assert_eq!(tree, tree_usage(&path), "accounted as du counts it");
        // Pinned by a snapshot: frames cannot push it out.
        assert!(c.pin_native(&layer));
        for i in 0..20u8 {
            c.put(&Digest::sha256(&[i]), &[i; 4096]).unwrap();
        }
        assert!(c.has_native(&layer) && path.exists());
        assert!(!c.remove_native(&layer), "pinned trees stay");
        // Reopened: found again, pinned until the snapshots pinned theirs.
        drop(c);
        let c = DiskCache::open(t.path(), cap, Arc::default()).unwrap();
        assert!(c.has_native(&layer));
        c.put(&Digest::sha256(b"x"), &[0; 15 * 4096]).unwrap();
        assert!(c.has_native(&layer), "boot pin");
        c.native_restored();
        c.put(&Digest::sha256(b"y"), &[0; 15 * 4096]).unwrap();
        assert!(!c.has_native(&layer), "unpinned tree evicted");
        assert!(!c.native_path(&layer).exists(), "renamed away at once");
        assert!(c.used() <= cap);
        // A dropped reservation leaves nothing.
        let r = c.reserve_native(&layer, BLOCK).unwrap().unwrap();
        fs::create_dir_all(r.tmp_path()).unwrap();
        drop(r);
        assert!(!c.has_native(&layer));
    }

    #[test]
    fn complete_copies_share_the_cap_and_are_pinned_while_open() {
        let t = tempfile::tempdir().unwrap();
        let cap = DIRS + 4 * BLOCK;
        let c = DiskCache::open(t.path(), cap, Arc::default()).unwrap();
        let layer = Digest::sha256(b"layer");
        let (f1, f2) = (Digest::sha256(b"1"), Digest::sha256(b"2"));
        c.put(&f1, &[1; 4096]).unwrap();
        c.put(&f2, &[2; 4096]).unwrap();
        // layer dir (1 block) + copy (2 blocks) evict the older frame only
        let r = c.reserve_file(&layer, 7, 8000).unwrap().unwrap();
        assert!(!c.contains(&f1) && c.contains(&f2));
        fs::write(r.tmp_path(), [7u8; 8000]).unwrap();
        let path = r.commit().unwrap();
        assert_eq!(path, c.file_path(&layer, 7));
        assert!(c.has_file(&layer, 7));
        assert_eq!(c.used(), cap);
        // an open handle pins the copy: a new frame evicts the other frame, then itself
        assert!(c.pin_file(&layer, 7));
        c.put(&f1, &[1; 4096]).unwrap();
        assert!(!c.contains(&f2));
        c.put(&f2, &[2; 8192]).unwrap();
        assert!(path.exists(), "open copy stays");
        // a copy that cannot fit beside pinned entries is refused
        assert!(c.reserve_file(&layer, 8, 3 * 4096).unwrap().is_none());
        c.unpin_file(&layer, 7);
        assert!(c.reserve_file(&layer, 8, 3 * 4096).unwrap().is_some());
        assert!(!path.exists(), "closed copy evicted");
        assert!(
            !c.has_file(&layer, 8),
            "dropped reservation releases its room"
        );
        assert!(c.used() <= cap);
        // reopen indexes copies and drops temp files
        let r = c.reserve_file(&layer, 9, 10).unwrap().unwrap();
        fs::write(r.tmp_path(), b"0123456789").unwrap();
        std::mem::forget(r); // a crash mid-copy
        drop(c);
        let c = DiskCache::open(t.path(), cap, Arc::default()).unwrap();
        assert!(!c.has_file(&layer, 9));
        let names: Vec<_> = fs::read_dir(c.layer_dir(&layer)).unwrap().collect();
        assert!(names.is_empty(), "{names:?}");
        c.remove_layer_files(&layer);
        assert!(!c.layer_dir(&layer).exists());
        assert_eq!(c.used(), DIRS, "frames went for copy 8; no copy left");
    }
}
