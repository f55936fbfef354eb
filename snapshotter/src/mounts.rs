//! Mount specs for active and view snapshots, shaped exactly like containerd's overlayfs
//! snapshotter (`snapshots/overlay/overlay.go`, `mounts()`):
//!
//! - no parents: `bind` of the snapshot's own `fs` dir, `rw,rbind` (active) or `ro,rbind` (view);
//! - view with one parent: `bind` of the parent dir, `ro,rbind`;
//! - otherwise `overlay` with `index=off` (+ `xino=on` when the layers span filesystems and
//!   the kernel has it, see [`OverlayFeatures`]; + `workdir=`, `upperdir=` when active) and
//!   `lowerdir=` the parent chain's dirs, nearest parent first.
//!
//! Parent dirs are plain directories, FUSE layer directories or native trees of complete
//! layers; [`native_for_new`] decides, when an active or view snapshot is created, which of
//! its remote parents it mounts from their native tree (the decision is recorded with the
//! snapshot and holds for its life: a container that started on a FUSE lower keeps it).

use crate::remote::LayerProvider;
use crate::store::SnapshotRecord;
use std::path::{Path, PathBuf};
use weenv_format::Digest;

/// The layers of the parent chain (`chain`, nearest first) whose native tree a new active
/// or view snapshot mounts: remote parents whose layer has a usable tree, each tree pinned
/// once for the snapshot (release with [`release_native`]).
pub fn native_for_new(layers: Option<&dyn LayerProvider>, chain: &[SnapshotRecord]) -> Vec<String> {
    let Some(layers) = layers else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for r in chain {
        let Some(d) = r
            .remote
            .as_ref()
            .and_then(|r| r.digest.parse::<Digest>().ok())
        else {
            continue;
        };
        if !out.contains(&d.to_string())
            && layers.native_dir(&d).is_some()
            && layers.hold_native(&d, true)
        {
            out.push(d.to_string());
        }
    }
    out
}

/// Releases the pins [`native_for_new`] (or a restart, `hold`) took for a snapshot.
pub fn hold_natives(layers: Option<&dyn LayerProvider>, native: &[String], hold: bool) {
    let Some(layers) = layers else { return };
    for d in native.iter().filter_map(|d| d.parse::<Digest>().ok()) {
        layers.hold_native(&d, hold);
    }
}

/// Releases the pins of a snapshot's native trees.
pub fn release_native(layers: Option<&dyn LayerProvider>, native: &[String]) {
    hold_natives(layers, native, false);
}

/// The lowerdir of `parent` for a snapshot that mounts the native trees of `native`: the
/// tree when the parent's layer is one of them and the tree is there, else `None` (the
/// parent's own dir).
pub fn native_lower(
    layers: Option<&dyn LayerProvider>,
    native: &[String],
    parent: &SnapshotRecord,
) -> Option<PathBuf> {
    let d = parent.remote.as_ref()?.digest.parse::<Digest>().ok()?;
    if !native.contains(&d.to_string()) {
        return None;
    }
    layers?.native_path(&d).filter(|p| p.is_dir())
}

/// Linux 4.17 added overlayfs's `xino` option (`fs/overlayfs/super.c`, "xino=on|off|auto").
const XINO_SINCE: (u32, u32) = (4, 17);

/// Overlayfs options of the running kernel that mount specs use.
///
/// Why `xino=on`: when an overlay's layers live on more than one filesystem (FUSE lowers on
/// one or two FUSE sessions, native trees or ordinary layers on the disk, the upper on the
/// disk) and `xino` is off (this kernel's default: `xino_auto=N`), overlayfs reports a
/// non-persistent inode number in `stat(2)` for every directory while `readdir` reports the
/// real one (`d_ino != st_ino`), and gives non-directories one pseudo `st_dev` per underlying
/// filesystem. With `xino=on` overlayfs puts a filesystem id into the top bits of each real
/// inode number (`ovl_map_ino`, `ovl_map_dev_ino`; readdir remaps the same way), so `d_ino ==
/// st_ino`, numbers are persistent and every object has the overlay's `st_dev`, as on
/// containerd's overlayfs snapshotter where all layers share one filesystem. The top bits it
/// takes are `ilog2(numfs - 1) + 2` once a lower is not a 32-bit-inode filesystem (FUSE): at
/// most 10 for the 500 lowers overlayfs allows, so FUSE inode numbers stay below 2^54
/// ([`crate::fs::layer::INO_BITS`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverlayFeatures {
    /// The kernel accepts `xino=on`.
    pub xino: bool,
}

impl OverlayFeatures {
    /// What a kernel of release `release` (`uname -r`, e.g. `6.18.44-fc-v1300`) supports; an
    /// unparsable release gets nothing (the mount options of kernels before the feature).
    pub fn for_release(release: &str) -> Self {
        let mut parts = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|p| p.parse::<u32>().ok());
        let version = match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor),
            _ => return Self::default(),
        };
        OverlayFeatures {
            xino: version >= XINO_SINCE,
        }
    }

    /// The running kernel's (`/proc/sys/kernel/osrelease`).
    pub fn detect() -> Self {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|r| Self::for_release(r.trim()))
            .unwrap_or_default()
    }

    /// True if an overlay over `lowers` (and `upper` when active) should get `xino=on`: the
    /// kernel has it and the layers are on more than one filesystem (device numbers, `None`
    /// when a stat failed: counted as another filesystem). On one filesystem overlayfs uses
    /// the real inode numbers anyway (and only logs that `xino=on` is useless). Pure.
    pub fn xino_for(self, upper: Option<Option<u64>>, lowers: &[Option<u64>]) -> bool {
        if !self.xino {
            return false;
        }
        let mut devs = upper.into_iter().chain(lowers.iter().copied());
        let Some(first) = devs.next() else {
            return false;
        };
        first.is_none() || devs.any(|d| d.is_none() || d != first)
    }
}

/// One mount, converted to containerd's `types.Mount` at the gRPC edge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountSpec {
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// Whether the snapshot is writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Active,
    View,
}

/// Mounts for a snapshot with upper dir `upper`, work dir `work`, and parent dirs
/// `parents` (nearest first); `xino`: add `xino=on` to an overlay (see
/// [`OverlayFeatures::xino_for`]).
pub fn mounts_for(
    access: Access,
    upper: &Path,
    work: &Path,
    parents: &[PathBuf],
    xino: bool,
) -> Vec<MountSpec> {
    if parents.is_empty() {
        let ro = if access == Access::View { "ro" } else { "rw" };
        return vec![bind(upper, ro)];
    }
    let mut options = vec!["index=off".to_string()];
    if xino {
        options.push("xino=on".to_string());
    }
    match access {
        Access::Active => {
            options.push(format!("workdir={}", work.display()));
            options.push(format!("upperdir={}", upper.display()));
        }
        Access::View if parents.len() == 1 => return vec![bind(&parents[0], "ro")],
        Access::View => {}
    }
    let lower: Vec<String> = parents.iter().map(|p| p.display().to_string()).collect();
    options.push(format!("lowerdir={}", lower.join(":")));
    vec![MountSpec {
        kind: "overlay".into(),
        source: "overlay".into(),
        options,
    }]
}

fn bind(dir: &Path, ro: &str) -> MountSpec {
    MountSpec {
        kind: "bind".into(),
        source: dir.display().to_string(),
        options: vec![ro.to_string(), "rbind".to_string()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{MountedLayer, RemoteError, RemoteLayerRequest};
    use crate::store::{Kind, RemoteLayerRef};

    /// Layers with a native tree under `root`, and the pins taken.
    struct Natives {
        root: PathBuf,
        with_tree: Vec<String>,
        pins: parking_lot::Mutex<std::collections::HashMap<String, i32>>,
    }

    #[async_trait::async_trait]
    impl LayerProvider for Natives {
        async fn mount(&self, _: &RemoteLayerRequest) -> Result<Option<MountedLayer>, RemoteError> {
            Ok(None)
        }
        async fn remount(&self, d: &Digest) -> Result<MountedLayer, RemoteError> {
            Err(RemoteError::NotCached {
                digest: d.to_string(),
            })
        }
        fn release(&self, _: &Digest) -> Result<(), RemoteError> {
            Ok(())
        }
        fn native_dir(&self, d: &Digest) -> Option<PathBuf> {
            self.with_tree
                .contains(&d.to_string())
                .then(|| self.root.join(d.hex()))
        }
        fn native_path(&self, d: &Digest) -> Option<PathBuf> {
            Some(self.root.join(d.hex()))
        }
        fn hold_native(&self, d: &Digest, hold: bool) -> bool {
            *self.pins.lock().entry(d.to_string()).or_default() += if hold { 1 } else { -1 };
            true
        }
    }

    fn remote(key: &str, digest: &Digest) -> SnapshotRecord {
        SnapshotRecord {
            key: key.into(),
            id: 0,
            kind: Kind::Committed,
            parent: String::new(),
            labels: Default::default(),
            created_nanos: 0,
            updated_nanos: 0,
            size: 0,
            inodes: 0,
            remote: Some(RemoteLayerRef {
                digest: digest.to_string(),
                dir: PathBuf::from(format!("/mnt/{}", digest.hex())),
                toc_digest: None,
                diff_id: None,
            }),
            native: Vec::new(),
        }
    }

    #[test]
    fn new_snapshots_mount_native_trees_of_complete_layers_and_pin_them() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (Digest::sha256(b"a"), Digest::sha256(b"b"));
        std::fs::create_dir_all(t.path().join(a.hex())).unwrap();
        let p = Natives {
            root: t.path().to_path_buf(),
            with_tree: vec![a.to_string()],
            pins: Default::default(),
        };
        let chain = [remote("top", &b), remote("base", &a)];
        let native = native_for_new(Some(&p), &chain);
        assert_eq!(native, vec![a.to_string()], "only the layer with a tree");
        assert_eq!(p.pins.lock()[&a.to_string()], 1);
        assert_eq!(
            native_lower(Some(&p), &native, &chain[1]),
            Some(t.path().join(a.hex()))
        );
        assert_eq!(native_lower(Some(&p), &native, &chain[0]), None, "FUSE dir");
        // A snapshot created before the switch keeps its FUSE lowers.
        assert_eq!(native_lower(Some(&p), &[], &chain[1]), None);
        // A tree that vanished (deleted by hand) falls back to the FUSE dir.
        std::fs::remove_dir(t.path().join(a.hex())).unwrap();
        assert_eq!(native_lower(Some(&p), &native, &chain[1]), None);
        release_native(Some(&p), &native);
        assert_eq!(p.pins.lock()[&a.to_string()], 0);
        assert!(native_for_new(None, &chain).is_empty());
    }

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn active_without_parent_is_rw_bind() {
        let m = mounts_for(Access::Active, &p("/s/1/fs"), &p("/s/1/work"), &[], true);
        assert_eq!(
            m,
            vec![MountSpec {
                kind: "bind".into(),
                source: "/s/1/fs".into(),
                options: vec!["rw".into(), "rbind".into()]
            }]
        );
    }

    #[test]
    fn view_shapes() {
        let m = mounts_for(Access::View, &p("/s/2/fs"), &p("/s/2/work"), &[], false);
        assert_eq!(m[0].options, vec!["ro", "rbind"]);
        let m = mounts_for(
            Access::View,
            &p("/s/2/fs"),
            &p("/s/2/work"),
            &[p("/mnt/abc")],
            true,
        );
        assert_eq!(
            (m[0].kind.as_str(), m[0].source.as_str()),
            ("bind", "/mnt/abc")
        );
        assert_eq!(m[0].options, vec!["ro", "rbind"]);
        let m = mounts_for(
            Access::View,
            &p("/s/2/fs"),
            &p("/s/2/work"),
            &[p("/a"), p("/b")],
            false,
        );
        assert_eq!(m[0].kind, "overlay");
        assert_eq!(m[0].options, vec!["index=off", "lowerdir=/a:/b"]);
        let m = mounts_for(
            Access::View,
            &p("/s/2/fs"),
            &p("/s/2/work"),
            &[p("/a"), p("/b")],
            true,
        );
        assert_eq!(m[0].options, vec!["index=off", "xino=on", "lowerdir=/a:/b"]);
    }

    #[test]
    fn active_with_parents_is_overlay_nearest_first() {
        let m = mounts_for(
            Access::Active,
            &p("/s/3/fs"),
            &p("/s/3/work"),
            &[p("/a"), p("/b")],
            true,
        );
        assert_eq!(
            m,
            vec![MountSpec {
                kind: "overlay".into(),
                source: "overlay".into(),
                options: vec![
                    "index=off".into(),
                    "xino=on".into(),
                    "workdir=/s/3/work".into(),
                    "upperdir=/s/3/fs".into(),
                    "lowerdir=/a:/b".into()
                ]
            }]
        );
    }

    #[test]
    fn xino_needs_the_kernel_option_and_layers_on_several_filesystems() {
        let on = OverlayFeatures::for_release("6.18.44-fc-v1300");
        assert!(on.xino);
        assert!(OverlayFeatures::for_release("4.17.0").xino);
        assert!(OverlayFeatures::for_release("5.10.0-28-amd64").xino);
        assert!(!OverlayFeatures::for_release("4.16.18").xino);
        assert!(!OverlayFeatures::for_release("3.10.0-1160.el7.x86_64").xino);
        assert!(
            !OverlayFeatures::for_release("").xino,
            "unparsable: nothing"
        );
        assert!(!OverlayFeatures::for_release("six").xino);
        // FUSE lowers (dev 40) under an upper on the disk (dev 8): on.
        assert!(on.xino_for(Some(Some(8)), &[Some(40), Some(40)]));
        // A native tree or ordinary layer on the upper's filesystem next to a FUSE lower: on.
        assert!(on.xino_for(Some(Some(8)), &[Some(8), Some(40)]));
        // Everything on the upper's filesystem (ordinary layers, native trees): the real
        // inode numbers are consistent already.
        assert!(!on.xino_for(Some(Some(8)), &[Some(8), Some(8)]));
        // A view over lowers of one FUSE session: one filesystem.
        assert!(!on.xino_for(None, &[Some(40), Some(40)]));
        // The plain and the full session are two filesystems.
        assert!(on.xino_for(None, &[Some(40), Some(41)]));
        // A lower that could not be stat'ed is taken as another filesystem.
        assert!(on.xino_for(Some(Some(8)), &[None]));
        // A kernel without the option never gets it.
        let off = OverlayFeatures::default();
        assert!(!off.xino_for(Some(Some(8)), &[Some(40)]));
    }
}
