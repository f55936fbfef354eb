//! Mount specs for active and view snapshots, shaped exactly like containerd's overlayfs
//! snapshotter (`snapshots/overlay/overlay.go`, `mounts()`):
//!
//! - no parents: `bind` of the snapshot's own `fs` dir, `rw,rbind` (active) or `ro,rbind` (view);
//! - view with one parent: `bind` of the parent dir, `ro,rbind`;
//! - otherwise `overlay` with `index=off` (+ `workdir=`, `upperdir=` when active) and
//!   `lowerdir=` the parent chain's dirs, nearest parent first.
//!
//! Parent dirs are plain directories or FUSE layer directories; the caller resolves them.

use std::path::{Path, PathBuf};

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
/// `parents` (nearest first).
pub fn mounts_for(
    access: Access,
    upper: &Path,
    work: &Path,
    parents: &[PathBuf],
) -> Vec<MountSpec> {
    if parents.is_empty() {
        let ro = if access == Access::View { "ro" } else { "rw" };
        return vec![bind(upper, ro)];
    }
    let mut options = vec!["index=off".to_string()];
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

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn active_without_parent_is_rw_bind() {
        let m = mounts_for(Access::Active, &p("/s/1/fs"), &p("/s/1/work"), &[]);
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
        let m = mounts_for(Access::View, &p("/s/2/fs"), &p("/s/2/work"), &[]);
        assert_eq!(m[0].options, vec!["ro", "rbind"]);
        let m = mounts_for(
            Access::View,
            &p("/s/2/fs"),
            &p("/s/2/work"),
            &[p("/mnt/abc")],
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
        );
        assert_eq!(m[0].kind, "overlay");
        assert_eq!(m[0].options, vec!["index=off", "lowerdir=/a:/b"]);
    }

    #[test]
    fn active_with_parents_is_overlay_nearest_first() {
        let m = mounts_for(
            Access::Active,
            &p("/s/3/fs"),
            &p("/s/3/work"),
            &[p("/a"), p("/b")],
        );
        assert_eq!(
            m,
            vec![MountSpec {
                kind: "overlay".into(),
                source: "overlay".into(),
                options: vec![
                    "index=off".into(),
                    "workdir=/s/3/work".into(),
                    "upperdir=/s/3/fs".into(),
                    "lowerdir=/a:/b".into()
                ]
            }]
        );
    }
}
