//! The plain FUSE session (`fuse.plain_session`): layers without xattrs are served at
//! `<mountpoint>-plain/<hex>`, where GETXATTR and OPEN are answered ENOSYS once and the kernel
//! stops sending them (LISTXATTR gets the empty list); layers with xattrs stay on the full
//! session; overlayfs
//! stacks lowers of both sessions.

mod fuse_common;

use anyhow::{ensure, Context, Result};
use fuse_common::*;
use std::collections::BTreeSet;
use std::path::Path;
use weenv_snapshotter::metrics::FuseOp;

/// A layer without xattrs: dirs, files (one of several frames), a symlink, a hardlink, a
/// device and a whiteout.
fn plain_tar() -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    add_dir(&mut b, "etc")?;
    add_file(&mut b, "etc/hostname", b"plain\n", 0o644, 0, 0)?;
    add_file(&mut b, "etc/secret", b"root only\n", 0o600, 0, 0)?;
    add_special(
        &mut b,
        "etc/link",
        tar::EntryType::Symlink,
        Some("hostname"),
        (0, 0),
        0o777,
    )?;
    add_special(
        &mut b,
        "etc/hard",
        tar::EntryType::Link,
        Some("etc/hostname"),
        (0, 0),
        0o644,
    )?;
    add_dir(&mut b, "usr")?;
    add_file(&mut b, "usr/big", &noise(7, 3 << 20), 0o755, 0, 0)?;
    add_special(
        &mut b,
        "usr/null",
        tar::EntryType::Char,
        None,
        (1, 3),
        0o666,
    )?;
    Ok(b.into_inner()?)
}

fn names(dir: &Path) -> Result<BTreeSet<String>> {
    Ok(std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?)
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn plain_layers_are_served_without_xattr_and_open_requests() -> Result<()> {
    let fx = Fixture::with_plain(Fixture::strict(), true)?;
    let plain = TestLayer::new(fx.dir.path(), "plain", &plain_tar()?)?;
    let rich = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let (p, r) = (fx.add(&plain)?, fx.add(&rich)?);
    let (full_mp, plain_mp) = (fx.dir.path().join("mnt"), fx.dir.path().join("mnt-plain"));
    ensure!(
        p == plain_mp.join(plain.digest.hex()),
        "a layer without xattrs is named on the plain session: {}",
        p.display()
    );
    ensure!(
        r == full_mp.join(rich.digest.hex()),
        "a layer with xattrs stays on the full session: {}",
        r.display()
    );
    // The plain root lists only plain layers; the full one lists all (older paths keep
    // working).
    let want: BTreeSet<String> = [plain.digest.hex().to_string()].into();
    ensure!(
        names(&plain_mp)? == want,
        "plain root: {:?}",
        names(&plain_mp)?
    );
    ensure!(
        names(&full_mp)?.len() == 2,
        "full root: {:?}",
        names(&full_mp)?
    );
    ensure!(
        !plain_mp.join(rich.digest.hex()).exists(),
        "the layer with xattrs must not be reachable on the plain session"
    );

    // Conformance with a tar extraction.
    let reference = fx.dir.path().join("ref");
    extract_reference(&plain.tar, &reference)?;
    let (want, got) = (snapshot(&reference)?, snapshot(&p)?);
    let info = |s: &std::collections::BTreeMap<String, (Info, u64)>| {
        s.iter()
            .map(|(k, (i, _))| (k.clone(), i.clone()))
            .collect::<Vec<_>>()
    };
    ensure!(
        info(&want) == info(&got),
        "the plain session's view differs from tar:\nwant {want:?}\ngot  {got:?}"
    );
    ensure!(
        hardlink_groups(&want) == hardlink_groups(&got),
        "hardlinks differ"
    );

    // The first open and the first xattr read were answered ENOSYS: none reach the daemon
    // again, whatever the file.
    let host = p.join("etc/hostname");
    ensure!(std::fs::read(&host)? == b"plain\n");
    ensure!(
        errno_of(xattr::get(&host, "user.x")) == Some(nix::libc::EOPNOTSUPP),
        "getxattr on the plain session should fail with EOPNOTSUPP"
    );
    // Listing xattrs gives the empty list a disk filesystem gives (each listing is a request:
    // they are rare), not an error.
    ensure!(
        xattr::list(p.join("usr/big"))?.next().is_none(),
        "listxattr on the plain session should be an empty list"
    );
    let (opens, xattrs) = (
        fx.metrics.fuse_op_count(FuseOp::Open),
        fx.metrics.fuse_op_count(FuseOp::Getxattr),
    );
    let big = std::fs::read(p.join("usr/big"))?;
    ensure!(big == noise(7, 3 << 20), "usr/big has other bytes");
    for _ in 0..20 {
        ensure!(std::fs::read(p.join("etc/hard"))? == b"plain\n");
        ensure!(std::fs::read(p.join("etc/link"))? == b"plain\n");
        ensure!(
            errno_of(xattr::get(p.join("etc/secret"), "security.capability"))
                == Some(nix::libc::EOPNOTSUPP)
        );
    }
    ensure!(
        fx.metrics.fuse_op_count(FuseOp::Open) == opens,
        "OPEN reached the daemon again: {} after {opens}",
        fx.metrics.fuse_op_count(FuseOp::Open)
    );
    let xattrs_now = fx.metrics.fuse_op_count(FuseOp::Getxattr);
    ensure!(
        xattrs_now <= xattrs + 1,
        "xattr requests reached the daemon again: {xattrs_now} after {xattrs}"
    );

    // The full session still answers xattrs and opens: the rich layer's capability is there.
    let ping = r.join("usr/bin/ping");
    ensure!(
        xattr::get(&ping, "user.comment")?.as_deref() == Some(&b"hello xattr"[..]),
        "xattrs on the full session"
    );
    let opens = fx.metrics.fuse_op_count(FuseOp::Open);
    std::fs::read(&ping)?;
    ensure!(
        fx.metrics.fuse_op_count(FuseOp::Open) > opens,
        "the full session should still be asked to open"
    );
    // The plain layer through the full session: xattrs answered (none), open asked.
    ensure!(
        xattr::get(
            full_mp.join(plain.digest.hex()).join("etc/hostname"),
            "user.x"
        )?
        .is_none(),
        "the full session answers a plain layer's xattrs (none)"
    );
    Ok(())
}

#[test]
#[ignore = "needs root, /dev/fuse and overlayfs"]
fn overlay_stacks_plain_and_xattr_lowers() -> Result<()> {
    let fx = Fixture::with_plain(Fixture::strict(), true)?;
    // bottom (plain): d/a, x, keep; middle (opaque d: not plain): d/b; top (plain): whiteout
    // of x, new.
    let mut b = tar::Builder::new(Vec::new());
    add_dir(&mut b, "d")?;
    add_file(&mut b, "d/a", b"a\n", 0o644, 0, 0)?;
    add_file(&mut b, "x", b"x\n", 0o644, 0, 0)?;
    add_file(&mut b, "keep", b"keep\n", 0o644, 0, 0)?;
    let bottom = TestLayer::new(fx.dir.path(), "bottom", &b.into_inner()?)?;
    let mut b = tar::Builder::new(Vec::new());
    add_dir(&mut b, "d")?;
    add_file(&mut b, "d/.wh..wh..opq", b"", 0o644, 0, 0)?;
    add_file(&mut b, "d/b", b"b\n", 0o644, 0, 0)?;
    let middle = TestLayer::new(fx.dir.path(), "middle", &b.into_inner()?)?;
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, ".wh.x", b"", 0o644, 0, 0)?;
    add_file(&mut b, "new", b"new\n", 0o644, 0, 0)?;
    let top = TestLayer::new(fx.dir.path(), "top", &b.into_inner()?)?;
    let lowers = vec![fx.add(&top)?, fx.add(&middle)?, fx.add(&bottom)?];
    let plain_mp = fx.dir.path().join("mnt-plain");
    ensure!(
        lowers[0].starts_with(&plain_mp)
            && !lowers[1].starts_with(&plain_mp)
            && lowers[2].starts_with(&plain_mp),
        "sessions: {lowers:?}"
    );
    let target = fx.dir.path().join("merged");
    let _m = mount_overlay(&lowers, &fx.dir.path().join("ovl"), &target)?;
    let root = names(&target)?;
    let want: BTreeSet<String> = ["d", "keep", "new"].map(String::from).into();
    ensure!(root == want, "merged root: {root:?}");
    let d = names(&target.join("d"))?;
    ensure!(
        d == ["b".to_string()].into(),
        "the opaque directory of the middle layer hides the bottom's d/a: {d:?}"
    );
    ensure!(std::fs::read(target.join("keep"))? == b"keep\n");
    ensure!(std::fs::read(target.join("d/b"))? == b"b\n");
    std::fs::write(target.join("keep"), b"changed\n").context("copy-up from a plain lower")?;
    ensure!(std::fs::read(target.join("keep"))? == b"changed\n");
    ensure!(std::fs::read(lowers[2].join("keep"))? == b"keep\n");
    Ok(())
}

/// With `fill.native = false`, the fill copies complete files out for passthrough only for the
/// layers on the full session: the plain session has no passthrough, so a copy of a plain
/// layer's file would only take disk.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn the_fill_copies_files_only_for_full_session_layers() -> Result<()> {
    let fill = weenv_snapshotter::fetch::FillConfig {
        native: false,
        dir_prefetch_frames: 0,
        read_ahead_bytes: 0,
        ..Default::default()
    };
    let fx = Fixture::with_plain(fill, true)?;
    ensure!(
        fx.store.passthrough_active(),
        "kernel 6.9+ with FUSE passthrough expected here"
    );
    let plain = TestLayer::new(fx.dir.path(), "plain", &plain_tar()?)?;
    let rich = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    fx.add(&plain)?;
    fx.add(&rich)?;
    fx.wait_fill(std::time::Duration::from_secs(120))?;
    let copies = |d: &weenv_format::Digest| -> Result<usize> {
        let dir = fx.store.frames().l2().layer_dir(d);
        Ok(match std::fs::read_dir(&dir) {
            Ok(rd) => rd.count(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        })
    };
    // Both layers have a file over the 256 KiB threshold (usr/big, usr/bin/busybox).
    let (p, r) = (copies(&plain.digest)?, copies(&rich.digest)?);
    ensure!(r > 0, "the full-session layer got no complete-file copies");
    ensure!(p == 0, "the plain layer got {p} complete-file copies");
    Ok(())
}
