//! A weenv layer through the FUSE session: conformance with a tar extraction, lazy fetch of
//! exactly the frames a read needs, and tampered frames answered with EIO.

mod fuse_common;

use anyhow::{ensure, Result};
use fuse_common::*;
use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

#[test]
#[ignore = "needs root and /dev/fuse"]
fn layer_matches_tar_extraction() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let dir = fx.add(&layer)?;
    ensure!(
        layer.source.requests().is_empty(),
        "mounting fetched file content"
    );
    let reference = fx.dir.path().join("ref");
    extract_reference(&layer.tar, &reference)?;
    let want = snapshot(&reference)?;
    let got = snapshot(&dir)?;
    let want_paths: BTreeSet<_> = want.keys().collect();
    let got_paths: BTreeSet<_> = got.keys().collect();
    ensure!(
        want_paths == got_paths,
        "paths differ: only in tar {:?}, only in weenv {:?}",
        want_paths.difference(&got_paths).collect::<Vec<_>>(),
        got_paths.difference(&want_paths).collect::<Vec<_>>()
    );
    let mut diffs = Vec::new();
    for (p, (w, _)) in &want {
        let (g, _) = &got[p];
        if w != g {
            diffs.push(format!("{p}:\n  tar   {w:?}\n  weenv {g:?}"));
        }
    }
    ensure!(
        diffs.is_empty(),
        "{} entries differ:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    let (wg, gg) = (hardlink_groups(&want), hardlink_groups(&got));
    ensure!(wg == gg, "hardlink groups differ: tar {wg:?} weenv {gg:?}");
    let out = std::process::Command::new("chroot")
        .arg(&dir)
        .args([
            "/bin/sh",
            "-c",
            "echo exec-ok; /usr/bin/ls /usr/lib/python3/json",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.starts_with("exec-ok"),
        "chroot exec: {out:?}"
    );
    ensure!(
        gg.iter().any(|g| g.len() == 3),
        "busybox hardlink group present: {gg:?}"
    );
    println!(
        "{} entries identical to the tar extraction; {} range requests",
        want.len(),
        layer.source.requests().len()
    );
    Ok(())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn reading_a_small_file_fetches_only_its_frames() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let dir = fx.add(&layer)?;
    let path = "usr/lib/python3/json/decoder.py";
    let entry = layer.entry(path);
    let frames: BTreeSet<u32> = entry.chunks.iter().map(|c| c.frame.0).collect();
    let data = std::fs::read(dir.join(path))?;
    ensure!(
        data == std::fs::read("/usr/lib/python3.11/json/decoder.py")?,
        "content"
    );
    let reqs = layer.source.requests();
    ensure!(!reqs.is_empty(), "something was fetched");
    let allowed: Vec<(u64, u64)> = frames
        .iter()
        .map(|i| {
            let f = &layer.toc.frames[*i as usize];
            (f.offset, f.offset + f.clen)
        })
        .collect();
    for (off, len) in &reqs {
        let (s, e) = (*off, off + len);
        let lo = allowed.iter().map(|a| a.0).min().unwrap_or(0);
        let hi = allowed.iter().map(|a| a.1).max().unwrap_or(0);
        ensure!(
            lo <= s && e <= hi,
            "request {s}..{e} outside the file's frames {allowed:?}"
        );
    }
    let fetched: u64 = reqs.iter().map(|(_, l)| l).sum();
    let blob = std::fs::metadata(&layer.blob)?.len();
    println!(
        "read {} bytes; fetched {fetched} of {blob} blob bytes in {} request(s)",
        data.len(),
        reqs.len()
    );
    ensure!(fetched * 10 < blob, "fetched {fetched} of {blob}");
    Ok(())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn tampered_frame_is_eio_and_repair_works() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let dir = fx.add(&layer)?;
    let path = "usr/lib/python3/email/utils.py";
    let entry = layer.entry(path);
    let f = layer.toc.frames[entry.chunks[0].frame.0 as usize].clone();
    let at = f.offset + f.clen / 2;
    let blob = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&layer.blob)?;
    let mut b = [0u8; 1];
    blob.read_exact_at(&mut b, at)?;
    blob.write_all_at(&[b[0] ^ 0xff], at)?;
    let err = std::fs::read(dir.join(path)).expect_err("tampered frame must not be served");
    ensure!(
        err.raw_os_error() == Some(nix::errno::Errno::EIO as i32),
        "expected EIO, got {err}"
    );
    ensure!(fx.metrics.verification_failures.load(Ordering::Relaxed) >= 1);
    blob.write_all_at(&b, at)?;
    let data = std::fs::read(dir.join(path))?;
    ensure!(
        data == std::fs::read("/usr/lib/python3.11/email/utils.py")?,
        "content after repair"
    );
    println!("tampered read: {err}; after repair {} bytes ok", data.len());
    Ok(())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn first_read_prefetches_the_rest_of_the_file() -> Result<()> {
    let fill = weenv_snapshotter::fetch::FillConfig {
        enabled: false,
        dir_prefetch_frames: 0,
        read_ahead_bytes: 64 << 20,
        ..Default::default()
    };
    let fx = Fixture::new(fill, false)?;
    let layer = TestLayer::new(fx.dir.path(), "rich", &rich_tar()?)?;
    let dir = fx.add(&layer)?;
    let path = "opt/deep/nested/big.bin";
    let entry = layer.entry(path);
    let frames: BTreeSet<u32> = entry.chunks.iter().map(|c| c.frame.0).collect();
    ensure!(frames.len() >= 5, "big.bin spans {} frames", frames.len());
    let f = std::fs::File::open(dir.join(path))?;
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 0)?;
    ensure!(buf == noise(7, 4096));
    let covered = |reqs: &[(u64, u64)]| {
        frames.iter().all(|i| {
            let fr = &layer.toc.frames[*i as usize];
            reqs.iter()
                .any(|(o, l)| *o <= fr.offset && fr.offset + fr.clen <= o + l)
        })
    };
    // Read-ahead runs in the background: wait (bounded) for it.
    for _ in 0..500 {
        if covered(&layer.source.requests()) {
            println!(
                "read-ahead fetched all {} frames in {} request(s)",
                frames.len(),
                layer.source.requests().len()
            );
            let t0 = layer.source.requests().len();
            let all = std::fs::read(dir.join(path))?;
            ensure!(all == noise(7, 5 << 20));
            ensure!(
                layer.source.requests().len() == t0,
                "whole file then read from cache"
            );
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    anyhow::bail!(
        "read-ahead did not fetch the file's frames: {:?}",
        layer.source.requests()
    )
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn disk_cache_survives_a_restart() -> Result<()> {
    let tar = rich_tar()?;
    let cache_root = tempfile::tempdir()?;
    let path = "usr/lib/python3/email/message.py";
    let layer_dir = tempfile::tempdir()?;
    let layer = TestLayer::new(layer_dir.path(), "rich", &tar)?;
    for round in 0..2 {
        let fx = Fixture::with_cache(Fixture::strict(), false, cache_root.path())?;
        layer.source.reset();
        let dir = fx.add(&layer)?;
        let data = std::fs::read(dir.join(path))?;
        ensure!(data == std::fs::read("/usr/lib/python3.11/email/message.py")?);
        let n = layer.source.requests().len();
        println!("round {round}: {n} range request(s)");
        if round == 0 {
            ensure!(n > 0);
        } else {
            ensure!(n == 0, "after restart the frame came from the disk cache");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn concurrent_readers_get_correct_content_with_one_fetch_per_frame() -> Result<()> {
    let fill = weenv_snapshotter::fetch::FillConfig {
        enabled: false,
        max_gap_bytes: 0,
        ..Default::default()
    };
    let fx = Fixture::new(fill, false)?;
    let layer = TestLayer::with_frames(fx.dir.path(), "rich", &rich_tar()?, 16 << 10)?;
    let dir = fx.add(&layer)?;
    let files: Vec<(String, std::path::PathBuf)> = ["json", "email", "http"]
        .iter()
        .flat_map(|pkg| {
            std::fs::read_dir(format!("/usr/lib/python3.11/{pkg}"))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.path().is_file())
                .map(move |e| {
                    (
                        format!("usr/lib/python3/{pkg}/{}", e.file_name().to_string_lossy()),
                        e.path(),
                    )
                })
        })
        .collect();
    ensure!(files.len() > 20, "{} files", files.len());
    std::thread::scope(|s| -> Result<()> {
        let mut hs = Vec::new();
        for t in 0..8usize {
            let (files, dir) = (&files, &dir);
            hs.push(s.spawn(move || -> Result<()> {
                for k in 0..files.len() {
                    let (rel, src) = &files[(k * 7 + t * 13) % files.len()];
                    ensure!(
                        std::fs::read(dir.join(rel))? == std::fs::read(src)?,
                        "{rel}"
                    );
                }
                Ok(())
            }));
        }
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
        }
        Ok(())
    })?;
    let reqs = layer.source.requests();
    let mut seen = BTreeSet::new();
    for (off, len) in &reqs {
        for (i, f) in layer.toc.frames.iter().enumerate() {
            if *off <= f.offset && f.offset + f.clen <= off + len {
                ensure!(seen.insert(i), "frame {i} fetched twice: {reqs:?}");
            }
        }
    }
    println!(
        "8 readers x {} files: {} range requests, {} frames fetched once each",
        files.len(),
        reqs.len(),
        seen.len()
    );
    Ok(())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn root_lists_layers_and_remove_readd_work() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "a", b"A\n", 0o644, 0, 0)?;
    let l1 = TestLayer::new(fx.dir.path(), "one", &b.into_inner()?)?;
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "b", b"B\n", 0o644, 0, 0)?;
    let l2 = TestLayer::new(fx.dir.path(), "two", &b.into_inner()?)?;
    let (d1, d2) = (fx.add(&l1)?, fx.add(&l2)?);
    ensure!(fx.add(&l1)? == d1, "add_layer is idempotent");
    let mnt = fx.store.mountpoint().to_path_buf();
    // The kernel caches directory listings for the whole session (OPENDIR is answered
    // ENOSYS); the root's cached listing is dropped whenever a layer comes or goes.
    let list = || -> Result<BTreeSet<String>> {
        Ok(std::fs::read_dir(&mnt)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?)
    };
    let names = list()?;
    let want: BTreeSet<String> = [l1.digest.hex().to_string(), l2.digest.hex().to_string()].into();
    ensure!(names == want, "root lists {names:?}");
    ensure!(list()? == want, "cached root listing");
    ensure!(std::fs::read(d2.join("b"))? == b"B\n");
    fx.store.remove_layer(&l2.digest)?;
    let names = list()?;
    ensure!(
        names == [l1.digest.hex().to_string()].into(),
        "root lists {names:?} after a remove"
    );
    ensure!(!fx.store.has_layer(&l2.digest));
    ensure!(
        std::fs::metadata(d2.join("b")).is_err(),
        "removed layer is gone"
    );
    ensure!(
        fx.store.remove_layer(&l2.digest).is_err(),
        "second remove is NotFound"
    );
    let again = fx.add(&l2)?;
    ensure!(list()? == want, "root lists both again after the re-add");
    ensure!(
        again == d2 && std::fs::read(d2.join("b"))? == b"B\n",
        "re-added layer works"
    );
    ensure!(std::fs::read(d1.join("a"))? == b"A\n");
    let st = fx.store.status();
    ensure!(st.len() == 2 && st.iter().all(|s| s.entries >= 1), "{st:?}");
    Ok(())
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn identical_frames_are_shared_across_layers() -> Result<()> {
    let fx = Fixture::new(Fixture::strict(), false)?;
    let big = noise(9, 3 << 20);
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "a/big.bin", &big, 0o644, 0, 0)?;
    let la = TestLayer::new(fx.dir.path(), "a", &b.into_inner()?)?;
    let mut b = tar::Builder::new(Vec::new());
    add_file(&mut b, "somewhere/else/copy.bin", &big, 0o600, 1, 1)?;
    let lb = TestLayer::new(fx.dir.path(), "b", &b.into_inner()?)?;
    ensure!(la.digest != lb.digest);
    let (da, db) = (fx.add(&la)?, fx.add(&lb)?);
    ensure!(std::fs::read(da.join("a/big.bin"))? == big);
    let before = lb.source.requests().len();
    ensure!(std::fs::read(db.join("somewhere/else/copy.bin"))? == big);
    let after = lb.source.requests();
    // Only frames that differ (the one holding the tar header) may be fetched from b.
    let fetched: u64 = after[before..].iter().map(|(_, l)| l).sum();
    println!(
        "second layer fetched {fetched} bytes in {} requests for a {}-byte file",
        after.len() - before,
        big.len()
    );
    ensure!(
        fetched < (big.len() as u64) / 4,
        "payload frames came from the shared cache"
    );
    Ok(())
}
