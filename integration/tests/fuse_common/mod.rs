//! Shared helpers of the `fuse_*` tests: weenv layers from tars, a mounted `LayerStore` on a
//! temp dir, overlay mounts with Drop guards, and a tree walker that records everything a
//! conformance comparison needs (type, mode, owner, size, rdev, nlink, content hash, symlink
//! target, xattrs, inode for hardlink groups).
#![allow(dead_code)]

use anyhow::{bail, Context, Result};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weenv_format::writer::{write_layer, WriterOptions};
use weenv_format::{Digest, Toc};
use weenv_snapshotter::fetch::{
    CountingSource, FileBlobSource, FillConfig, FillState, RangeSource,
};
use weenv_snapshotter::layers::{LayerStore, LayerStoreConfig};
use weenv_snapshotter::metrics::Metrics;

/// Fails unless root with /dev/fuse.
pub fn require_fuse() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("needs root (run ignored tests as root)");
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("needs /dev/fuse");
    }
    Ok(())
}

/// A converted layer on disk with a counting source.
pub struct TestLayer {
    pub digest: Digest,
    pub toc: Arc<Toc>,
    pub blob: PathBuf,
    pub tar: PathBuf,
    pub source: Arc<CountingSource<FileBlobSource>>,
}

impl TestLayer {
    /// Converts `tar` (bytes) into a weenv layer under `dir/name.*`, with 1 MiB frames (the
    /// writer's default before issue 15; these tests' figures assume it).
    pub fn new(dir: &Path, name: &str, tar: &[u8]) -> Result<Self> {
        Self::with_frames(dir, name, tar, 1 << 20)
    }

    /// Like [`new`](Self::new) with frames of `frame_size` bytes (small files up to a quarter).
    pub fn with_frames(dir: &Path, name: &str, tar: &[u8], frame_size: u64) -> Result<Self> {
        let opts = WriterOptions {
            frame_size,
            small_file_threshold: frame_size / 4,
            chunk_size: frame_size,
            ..WriterOptions::default()
        };
        let tar_path = dir.join(format!("{name}.tar"));
        std::fs::write(&tar_path, tar)?;
        let blob = dir.join(format!("{name}.blob"));
        let out = std::fs::File::create(&blob)?;
        let s = write_layer(tar, std::io::BufWriter::new(out), &opts)
            .context("converting the test tar")?;
        Self::open(s.blob_digest, blob, tar_path)
    }

    /// Converts the tar file `tar_path` into a weenv layer under `dir/name.blob`.
    pub fn from_tar_file(dir: &Path, name: &str, tar_path: &Path) -> Result<Self> {
        let blob = dir.join(format!("{name}.blob"));
        let out = std::fs::File::create(&blob)?;
        let input = std::io::BufReader::new(std::fs::File::open(tar_path)?);
        let s = write_layer(
            input,
            std::io::BufWriter::new(out),
            &WriterOptions::default(),
        )
        .with_context(|| format!("converting {}", tar_path.display()))?;
        Self::open(s.blob_digest, blob, tar_path.to_path_buf())
    }

    /// Reads back the TOC of the converted `blob` and puts a counting source over it.
    fn open(digest: Digest, blob: PathBuf, tar: PathBuf) -> Result<Self> {
        let toc = weenv_format::reader::LayerReader::open(std::fs::File::open(&blob)?, None)
            .context("reading back the TOC")?
            .into_toc();
        let source = Arc::new(CountingSource::new(FileBlobSource::open(&blob)?));
        Ok(TestLayer {
            digest,
            toc: Arc::new(toc),
            blob,
            tar,
            source,
        })
    }

    /// The TOC entry of `path`; panics if the layer has none (a broken test fixture).
    pub fn entry(&self, path: &str) -> &weenv_format::toc::Entry {
        self.toc
            .entries
            .iter()
            .find(|e| e.path == path)
            .expect("in TOC")
    }

    pub fn dyn_source(&self) -> Arc<dyn RangeSource> {
        self.source.clone()
    }
}

/// A mounted LayerStore on a temp dir, with its own tokio runtime.
pub struct Fixture {
    pub store: Arc<LayerStore>,
    pub metrics: Arc<Metrics>,
    pub dir: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
}

impl Fixture {
    pub fn new(fill: FillConfig, passthrough: bool) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("weenv-fuse").tempdir()?;
        let cache = dir.path().join("cache");
        Self::build(fill, passthrough, dir, &cache)
    }

    /// Like [`new`](Self::new) with the node cache in `cache` (to test restarts).
    pub fn with_cache(fill: FillConfig, passthrough: bool, cache: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("weenv-fuse").tempdir()?;
        Self::build(fill, passthrough, dir, cache)
    }

    /// Like [`new`](Self::new) with the plain session too, at `<dir>/mnt-plain`.
    pub fn with_plain(fill: FillConfig, passthrough: bool) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("weenv-fuse").tempdir()?;
        let (cache, plain) = (dir.path().join("cache"), dir.path().join("mnt-plain"));
        Self::build_with(fill, passthrough, dir, &cache, Some(plain))
    }

    fn build(
        fill: FillConfig,
        passthrough: bool,
        dir: tempfile::TempDir,
        cache: &Path,
    ) -> Result<Self> {
        Self::build_with(fill, passthrough, dir, cache, None)
    }

    fn build_with(
        fill: FillConfig,
        passthrough: bool,
        dir: tempfile::TempDir,
        cache: &Path,
        plain_mountpoint: Option<PathBuf>,
    ) -> Result<Self> {
        require_fuse()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let metrics = Arc::new(Metrics::new());
        let cfg = LayerStoreConfig {
            mountpoint: dir.path().join("mnt"),
            plain_mountpoint,
            cache_dir: cache.to_path_buf(),
            memory_cache_bytes: 64 << 20,
            disk_cache_bytes: 1 << 30,
            fill,
            fuse_threads: 2,
            passthrough,
        };
        let store = LayerStore::start(cfg, rt.handle().clone(), metrics.clone())?;
        Ok(Fixture {
            store,
            metrics,
            dir,
            rt,
        })
    }

    /// Fill off, read-ahead off, directory prefetch off: only what is read is fetched.
    pub fn strict() -> FillConfig {
        FillConfig {
            enabled: false,
            read_ahead_bytes: 0,
            dir_prefetch_frames: 0,
            ..FillConfig::default()
        }
    }

    pub fn add(&self, l: &TestLayer) -> Result<PathBuf> {
        Ok(self
            .store
            .add_layer(&l.digest, (*l.toc).clone(), l.dyn_source())?)
    }

    /// Waits (bounded) until every layer's fill is done.
    pub fn wait_fill(&self, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let st = self.store.status();
            if st.iter().all(|s| s.fill == FillState::Done) {
                return Ok(());
            }
            if st.iter().any(|s| s.fill == FillState::Failed) || t0.elapsed() > limit {
                bail!("fill did not complete: {st:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.store.shutdown();
    }
}

/// Unmounts on drop (overlays before the FUSE session: declare guards after the Fixture).
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        use nix::mount::{umount2, MntFlags};
        if umount2(&self.0, MntFlags::empty()).is_err() {
            let _ = umount2(&self.0, MntFlags::MNT_DETACH);
        }
    }
}

/// Mounts overlayfs at `target` with `lowers` (top first) and upper/work under `scratch`.
pub fn mount_overlay(lowers: &[PathBuf], scratch: &Path, target: &Path) -> Result<MountGuard> {
    let upper = scratch.join("upper");
    let work = scratch.join("work");
    for d in [&upper, &work, &target.to_path_buf()] {
        std::fs::create_dir_all(d)?;
    }
    let lower: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},index=off",
        lower.join(":"),
        upper.display(),
        work.display()
    );
    let st = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(target)
        .status()?;
    if !st.success() {
        bail!("mount -t overlay -o {opts} failed: {st}");
    }
    Ok(MountGuard(target.to_path_buf()))
}

/// What the conformance checks compare for one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: Option<u64>,
    pub mtime: Option<i64>,
    pub rdev: u64,
    pub nlink: u64,
    pub sha256: Option<String>,
    pub link: Option<String>,
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

fn xattrs_of(p: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    // nix does not wrap the xattr calls; the `xattr` crate's plain (not `_deref`) functions are
    // llistxattr/lgetxattr.
    let mut out = BTreeMap::new();
    let Ok(names) = xattr::list(p) else {
        return Ok(out);
    };
    for name in names {
        if let Ok(Some(val)) = xattr::get(p, &name) {
            out.insert(name.to_string_lossy().into_owned(), val);
        }
    }
    Ok(out)
}

/// Every path under `root` (relative) with its [`Info`] and inode number.
pub fn snapshot(root: &Path) -> Result<BTreeMap<String, (Info, u64)>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let e = e?;
            let p = e.path();
            let md = std::fs::symlink_metadata(&p)?;
            let ft = md.file_type();
            let rel = p.strip_prefix(root)?.display().to_string();
            let kind = if ft.is_dir() {
                stack.push(p.clone());
                "dir"
            } else if ft.is_file() {
                "file"
            } else if ft.is_symlink() {
                "symlink"
            } else if ft.is_char_device() {
                "char"
            } else if ft.is_block_device() {
                "block"
            } else if ft.is_fifo() {
                "fifo"
            } else {
                "socket"
            };
            let sha256 = if ft.is_file() {
                Some(hex::encode(Sha256::digest(
                    std::fs::read(&p).with_context(|| format!("reading {rel}"))?,
                )))
            } else {
                None
            };
            let link = if ft.is_symlink() {
                Some(std::fs::read_link(&p)?.display().to_string())
            } else {
                None
            };
            let info = Info {
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                size: (!ft.is_dir()).then(|| md.size()),
                mtime: ft.is_file().then(|| md.mtime()),
                rdev: md.rdev(),
                nlink: md.nlink(),
                sha256,
                link,
                xattrs: xattrs_of(&p)?,
            };
            out.insert(rel, (info, md.ino()));
        }
    }
    Ok(out)
}

/// Groups of paths sharing an inode (hardlinks).
pub fn hardlink_groups(s: &BTreeMap<String, (Info, u64)>) -> BTreeSet<Vec<String>> {
    let mut by_ino: HashMap<u64, Vec<String>> = HashMap::new();
    for (p, (i, ino)) in s {
        if i.kind != "dir" {
            by_ino.entry(*ino).or_default().push(p.clone());
        }
    }
    by_ino
        .into_values()
        .filter(|v| v.len() > 1)
        .map(|mut v| {
            v.sort();
            v
        })
        .collect()
}

/// Appends a file to a tar builder.
pub fn add_file(
    b: &mut tar::Builder<Vec<u8>>,
    path: &str,
    data: &[u8],
    mode: u32,
    uid: u64,
    gid: u64,
) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_mtime(1_700_000_123);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, path, data)?;
    Ok(())
}

/// Appends a non-file entry (dir, symlink, hardlink, device, fifo).
pub fn add_special(
    b: &mut tar::Builder<Vec<u8>>,
    path: &str,
    t: tar::EntryType,
    link: Option<&str>,
    dev: (u32, u32),
    mode: u32,
) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(t);
    h.set_mode(mode);
    h.set_mtime(1_700_000_123);
    h.set_size(0);
    h.set_device_major(dev.0)?;
    h.set_device_minor(dev.1)?;
    match link {
        Some(l) => b.append_link(&mut h, path, l)?,
        None => b.append_data(&mut h, path, &[][..])?,
    }
    Ok(())
}

/// Appends a root-owned 0755 directory `path`.
pub fn add_dir(b: &mut tar::Builder<Vec<u8>>, path: &str) -> Result<()> {
    add_special(b, path, tar::EntryType::Directory, None, (0, 0), 0o755)
}

/// Deterministic poorly compressible bytes (one generator for every test: `weenv_format`).
pub use weenv_format::testdata::noise;

/// Adds every regular file under `src` as `prefix/<rel>` (sorted, directory order).
pub fn add_tree(b: &mut tar::Builder<Vec<u8>>, src: &Path, prefix: &str) -> Result<usize> {
    let mut n = 0;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(src)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        let md = std::fs::symlink_metadata(&p)?;
        let name = format!(
            "{prefix}/{}",
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        if md.is_dir() {
            if p.file_name().is_some_and(|n| n == "__pycache__") {
                continue;
            }
            add_dir(b, &name)?;
            n += add_tree(b, &p, &name)?;
        } else if md.is_file() {
            add_file(b, &name, &std::fs::read(&p)?, md.mode() & 0o7777, 0, 0)?;
            n += 1;
        }
    }
    Ok(n)
}

/// A layer with every kind of entry: busybox + hardlinks, python stdlib packages (many small
/// files), symlinks, devices, a fifo, setuid, odd owners, xattrs, an empty and a large file,
/// and parent directories that only exist implicitly.
pub fn rich_tar() -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    add_dir(&mut b, "usr")?;
    add_dir(&mut b, "usr/bin")?;
    add_file(
        &mut b,
        "usr/bin/busybox",
        &std::fs::read("/bin/busybox")?,
        0o755,
        0,
        0,
    )?;
    for link in ["usr/bin/sh", "usr/bin/ls"] {
        add_special(
            &mut b,
            link,
            tar::EntryType::Link,
            Some("usr/bin/busybox"),
            (0, 0),
            0o755,
        )?;
    }
    add_special(
        &mut b,
        "bin",
        tar::EntryType::Symlink,
        Some("usr/bin"),
        (0, 0),
        0o777,
    )?;
    add_dir(&mut b, "usr/lib")?;
    add_dir(&mut b, "usr/lib/python3")?;
    for pkg in ["json", "email", "http"] {
        let src = Path::new("/usr/lib/python3.11").join(pkg);
        add_dir(&mut b, &format!("usr/lib/python3/{pkg}"))?;
        add_tree(&mut b, &src, &format!("usr/lib/python3/{pkg}"))?;
    }
    add_dir(&mut b, "dev")?;
    add_special(
        &mut b,
        "dev/null",
        tar::EntryType::Char,
        None,
        (1, 3),
        0o666,
    )?;
    add_special(
        &mut b,
        "dev/sda",
        tar::EntryType::Block,
        None,
        (8, 0),
        0o660,
    )?;
    add_dir(&mut b, "run")?;
    add_special(
        &mut b,
        "run/fifo",
        tar::EntryType::Fifo,
        None,
        (0, 0),
        0o644,
    )?;
    add_file(&mut b, "usr/bin/su", b"#!/bin/sh\necho su\n", 0o4755, 0, 0)?;
    add_file(&mut b, "home/user/secret", b"private\n", 0o600, 1000, 1000)?;
    add_file(&mut b, "home/user/empty", b"", 0o644, 1000, 1000)?;
    b.append_pax_extensions([
        ("SCHILY.xattr.user.comment", &b"hello xattr"[..]),
        (
            "SCHILY.xattr.security.capability",
            &[
                1u8, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ][..],
        ),
    ])?;
    add_file(&mut b, "usr/bin/ping", b"not really ping\n", 0o755, 0, 0)?;
    add_file(
        &mut b,
        "opt/deep/nested/big.bin",
        &noise(7, 5 << 20),
        0o644,
        0,
        0,
    )?;
    add_special(
        &mut b,
        "usr/bin/busybox-link",
        tar::EntryType::Symlink,
        Some("busybox"),
        (0, 0),
        0o777,
    )?;
    Ok(b.into_inner()?)
}

/// Extracts `tar` into `dest` with GNU tar (numeric owners, modes, xattrs): the reference.
pub fn extract_reference(tar: &Path, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)?;
    let st = Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "-xpf"])
        .arg(tar)
        .arg("-C")
        .arg(dest)
        .status()?;
    if !st.success() {
        bail!("tar -x failed: {st}");
    }
    Ok(())
}
