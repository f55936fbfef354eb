//! Lazy → native (issue 15): once a layer's fill and completion check are done, new
//! containers mount its native tree as their overlayfs lowerdir instead of its FUSE directory.
//!
//! The Debian+python3 test image plus a fourth, hand-made layer (a whiteout of a lower file, an
//! opaque directory over a lower one, a hardlink pair, a setuid file, a fifo, a symlink, a
//! user xattr), converted to weenv. With the fill slowed down, a container started lazily
//! (before the switch) has FUSE lowers; after every layer is native a new container's rootfs
//! lowerdirs are the native trees (`/proc/mounts`), it sees every file exactly as the lazily
//! started one does through FUSE (path, type, mode, owner, size, sha256 of every file, link
//! targets, devices, xattrs, hardlink groups), the whiteout and the opaque directory still hide
//! lower content, and the early container keeps working after the switch (its FUSE view now
//! reads the native tree). After a daemon restart new containers still use the trees. No FUSE
//! reply fails in the daemon log (`Failed to send FUSE reply`: the INTERRUPT race).

mod snapshotter_common;

use anyhow::{bail, ensure, Result};
use snapshotter_common::*;
use std::time::{Duration, Instant};
use weenv_integration::stack::Stack;

/// The fourth layer: whiteout, opaque dir and the entry kinds the conformance check covers.
fn extra_layer() -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        if let Some(l) = link {
            h.set_link_name(l)?;
        }
        h.set_path(path)?;
        h.set_cksum();
        b.append(&h, data)
    };
    add(
        "etc/.wh.debian_version",
        tar::EntryType::Regular,
        0o644,
        b"",
        None,
    )?;
    add("etc/apt/", tar::EntryType::Directory, 0o755, b"", None)?;
    add(
        "etc/apt/.wh..wh..opq",
        tar::EntryType::Regular,
        0o644,
        b"",
        None,
    )?;
    add(
        "etc/apt/only-this",
        tar::EntryType::Regular,
        0o644,
        b"opaque\n",
        None,
    )?;
    add("native/", tar::EntryType::Directory, 0o750, b"", None)?;
    add(
        "native/a",
        tar::EntryType::Regular,
        0o644,
        b"hardlinked\n",
        None,
    )?;
    add(
        "native/b",
        tar::EntryType::Link,
        0o644,
        b"",
        Some("native/a"),
    )?;
    add(
        "native/suid",
        tar::EntryType::Regular,
        0o4755,
        b"#!/bin/sh\n",
        None,
    )?;
    add("native/fifo", tar::EntryType::Fifo, 0o600, b"", None)?;
    add("native/sym", tar::EntryType::Symlink, 0o777, b"", Some("a"))?;

    b.append_pax_extensions([("SCHILY.xattr.user.weenv", &b"native"[..])])?;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h.set_size(6);
    h.set_path("native/xattr")?;
    h.set_cksum();
    b.append(&h, &b"xattr\n"[..])?;
    Ok(b.into_inner()?)
}

const CHECKS: &str = "import os; print('debian_version', os.path.exists('/etc/debian_version')); \
     print('apt', sorted(os.listdir('/etc/apt'))); print(open('/native/b').read().strip())";

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, debootstrap"]
async fn complete_layers_mount_native_trees() -> Result<()> {
    // The fill is slowed down so that the first container starts before the switch.
    let mut stack = Stack::builder()
        .require(PYTHON_BINS)
        .fill(true)
        .fill_extra("rate_bytes_per_sec = 6000000\nquiet_ms = 0")
        .start()?;
    let img = image_with_layers(
        &stack.dir("image")?,
        &weenv_integration::images::python()?,
        &[extra_layer()?],
    )?;
    let weenv = stack.push_converted(&img, "native").await?.weenv;
    let (daemon, ctd) = (&mut stack.daemon, &stack.ctd);
    let ns = "native";
    let rep = daemon.pull(ctd.address(), ns, &weenv)?;
    ensure!(rep.contains("4 lazy, 0 applied"), "{rep}");
    start_sleeper(ctd, ns, &weenv, "early")?;
    let early_lower = lowerdirs("early")?;
    let mnt = daemon.root.join("state/mnt");
    let native_root = daemon.root.join("state/cache/native");
    ensure!(
        early_lower.len() == 4
            && early_lower
                .iter()
                .any(|l| l.starts_with(&*mnt.to_string_lossy())),
        "the early container should have FUSE lowers: {early_lower:?}"
    );

    let t = Instant::now();
    loop {
        let (n, native) = native_layers(daemon)?;
        if n == 4 && native == 4 {
            break;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(180),
            "layers did not become native ({native}/{n}):\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("all layers native after {:.1} s", t.elapsed().as_secs_f64());

    // A new container mounts the native trees.
    start_sleeper(ctd, ns, &weenv, "late")?;
    let late_lower = lowerdirs("late")?;
    ensure!(
        late_lower.len() == 4
            && late_lower
                .iter()
                .all(|l| l.starts_with(&*native_root.to_string_lossy())),
        "the new container should mount native trees: {late_lower:?}"
    );
    ensure!(lowerdirs("early")? == early_lower, "early mount changed");

    // Same bytes and metadata through the early container's FUSE lowers and the native trees.
    let fuse_tree = exec(ctd, ns, "early", "t1", &["python3", "-c", TREE_SCRIPT])?;
    let native_tree = exec(ctd, ns, "late", "t2", &["python3", "-c", TREE_SCRIPT])?;
    let (f, n): (Vec<&str>, Vec<&str>) =
        (fuse_tree.lines().collect(), native_tree.lines().collect());
    ensure!(f.len() > 1000, "tree has only {} entries", f.len());
    if f != n {
        let fs: std::collections::BTreeSet<&str> = f.iter().copied().collect();
        let nset: std::collections::BTreeSet<&str> = n.iter().copied().collect();
        bail!(
            "trees differ ({} vs {} entries)\nonly FUSE: {:#?}\nonly native: {:#?}",
            f.len(),
            n.len(),
            fs.difference(&nset).take(20).collect::<Vec<_>>(),
            nset.difference(&fs).take(20).collect::<Vec<_>>()
        );
    }
    for want in [
        "/native/b 100000 644 0 0 11 ",
        "/native/suid 100000 4755 0 0 10 ",
        "/native/fifo 10000 600 ",
        "/native/sym 120000 777 0 0 1 a ",
        "[('user.weenv', '6e6174697665')]",
    ] {
        ensure!(native_tree.contains(want), "{want:?} missing");
    }
    println!(
        "conformance: {} entries identical (FUSE vs native)",
        f.len()
    );
    for id in ["early", "late"] {
        let out = exec(ctd, ns, id, &format!("c-{id}"), &["python3", "-c", CHECKS])?;
        ensure!(
            out.contains("debian_version False")
                && out.contains("apt ['only-this']")
                && out.contains("hardlinked"),
            "{id}: whiteout/opaque not applied: {out}"
        );
    }
    let status = daemon.weenv(&["status"])?;
    ensure!(status.contains("(4 native)"), "{status}");
    let metrics = daemon.weenv(&["metrics"])?;
    ensure!(metrics.contains("weenv_native_layers_total 4"), "{metrics}");

    // Restart: the trees and the decision persist.
    for id in ["early", "late"] {
        let _ = ctd.ctr_ns(ns, &["task", "kill", "-s", "KILL", id]);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in ["early", "late"] {
        let _ = ctd.ctr_ns(ns, &["task", "rm", "-f", id]);
        let _ = ctd.ctr_ns(ns, &["container", "rm", id]);
    }
    daemon.restart()?;
    let mut out = Err(anyhow::anyhow!("not run"));
    for _ in 0..20 {
        out = ctr_run(
            ctd,
            ns,
            "weenv",
            &weenv,
            "after",
            &["python3", "-c", CHECKS],
        );
        if out.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = out?;
    ensure!(out.contains("apt ['only-this']"), "{out}");
    ensure!(native_layers(daemon)? == (4, 4), "after restart");
    let log = daemon.log();
    ensure!(
        log.contains("native tree built") && !log.contains("Failed to send FUSE reply"),
        "{log}"
    );
    Ok(())
}
