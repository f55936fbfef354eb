//! FUSE layers as overlayfs lowers: whiteouts and opaque dirs across two layers, writes,
//! copy-up of a lazily fetched file, deletion of a lower file.

mod fuse_common;

use anyhow::{ensure, Result};
use fuse_common::*;
use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

fn lower_tar() -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    add_dir(&mut b, "etc")?;
    add_file(
        &mut b,
        "etc/passwd",
        b"root:x:0:0::/root:/bin/sh\n",
        0o644,
        0,
        0,
    )?;
    add_file(&mut b, "etc/hosts", b"127.0.0.1 localhost\n", 0o644, 0, 0)?;
    add_file(&mut b, "data/big.bin", &noise(3, 3 << 20), 0o644, 0, 0)?;
    add_file(&mut b, "opq/a", b"a\n", 0o644, 0, 0)?;
    add_file(&mut b, "opq/b", b"b\n", 0o644, 0, 0)?;
    add_file(&mut b, "keep/x", b"x\n", 0o644, 0, 0)?;
    Ok(b.into_inner()?)
}

fn upper_tar() -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    add_dir(&mut b, "etc")?;
    add_file(&mut b, "etc/.wh.hosts", b"", 0o644, 0, 0)?;
    add_dir(&mut b, "opq")?;
    add_file(&mut b, "opq/.wh..wh..opq", b"", 0o644, 0, 0)?;
    add_file(&mut b, "opq/c", b"c\n", 0o644, 0, 0)?;
    add_file(&mut b, "keep/y", b"y\n", 0o644, 0, 0)?;
    Ok(b.into_inner()?)
}

fn names(p: &std::path::Path) -> Result<BTreeSet<String>> {
    Ok(std::fs::read_dir(p)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn overlay_over_fuse_layers() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let lower = TestLayer::new(fx.dir.path(), "lower", &lower_tar()?)?;
    let upper = TestLayer::new(fx.dir.path(), "upper", &upper_tar()?)?;
    let (ld, ud) = (fx.add(&lower)?, fx.add(&upper)?);

    // The upper layer as containerd's overlayfs snapshotter would have unpacked it.
    let wh = std::fs::symlink_metadata(ud.join("etc/hosts"))?;
    ensure!(
        wh.file_type().is_char_device() && wh.rdev() == 0,
        "whiteout is char 0:0"
    );
    ensure!(
        !ud.join("etc/.wh.hosts").exists() && !ud.join("opq/.wh..wh..opq").exists(),
        ".wh. entries hidden"
    );
    let opaque = xattr::get(ud.join("opq"), "trusted.overlay.opaque")?;
    ensure!(
        opaque.as_deref() == Some(b"y".as_slice()),
        "opaque xattr on opq ({opaque:?})"
    );

    let merged = fx.dir.path().join("merged");
    let _ov = mount_overlay(
        &[ud.clone(), ld.clone()],
        &fx.dir.path().join("ovl"),
        &merged,
    )?;
    ensure!(merged.join("etc/passwd").exists(), "lower file visible");
    ensure!(
        !merged.join("etc/hosts").exists(),
        "whiteout hides the lower file"
    );
    ensure!(
        names(&merged.join("opq"))? == BTreeSet::from(["c".to_string()]),
        "opaque dir: {:?}",
        names(&merged.join("opq"))?
    );
    ensure!(
        names(&merged.join("keep"))? == BTreeSet::from(["x".to_string(), "y".to_string()]),
        "merged dir"
    );

    // Writes land in the upper dir.
    std::fs::write(merged.join("new.txt"), b"new\n")?;
    ensure!(std::fs::read(fx.dir.path().join("ovl/upper/new.txt"))? == b"new\n");

    // Copy-up of a file never read before (fetched lazily during the copy-up).
    let before = lower.source.bytes();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(merged.join("data/big.bin"))?;
        f.write_all(b"appended")?;
    }
    let mut want = noise(3, 3 << 20);
    want.extend_from_slice(b"appended");
    ensure!(
        std::fs::read(merged.join("data/big.bin"))? == want,
        "copied-up content"
    );
    ensure!(
        std::fs::read(ld.join("data/big.bin"))? == noise(3, 3 << 20),
        "lower unchanged"
    );
    ensure!(lower.source.bytes() > before, "copy-up fetched lazily");

    // Deleting a lower file.
    std::fs::remove_file(merged.join("etc/passwd"))?;
    ensure!(!merged.join("etc/passwd").exists());
    ensure!(ld.join("etc/passwd").exists(), "lower keeps it");
    let w = std::fs::symlink_metadata(fx.dir.path().join("ovl/upper/etc/passwd"))?;
    ensure!(w.file_type().is_char_device(), "overlay whiteout in upper");

    // A binary from the lazy layer runs inside a chroot on the overlay.
    println!(
        "overlay ok; lower layer fetched {} bytes",
        lower.source.bytes()
    );
    Ok(())
}
