//! Background work yields to on-demand reads on the registry link, end to end: an image whose
//! start-up profile names almost every frame (python reading every file of its standard library), pulled
//! through a shaped link (a proxy sending every body through one link of a fixed rate, so the
//! prefetch takes ~30 s), and a command that reads a small file the profile does not name, then
//! a small file the profile names late (its frame sits in a prefetch batch still queued).
//! The first read must go before the queued prefetch: while its range request is in flight
//! no prefetch request starts, and prefetch requests are still sent after it (the prefetch had
//! work queued when the read came). The second read takes its frame out of the queued batch:
//! its request is that frame alone, and the frame the profile names next (same batch) comes
//! in a later request. Ordering and byte ranges at the proxy, no wall-clock threshold.

mod snapshotter_common;

use anyhow::{bail, ensure, Context, Result};
use snapshotter_common::*;
use std::collections::HashSet;
use std::process::Command;
use weenv_format::FrameIdx;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::registry::{CountingProxy, ProxyOptions};
use weenv_integration::util::workspace_bin;

/// Reads every regular file of python's standard library (the profile's command).
const BIG: &str = "import glob, os\nfor d, _, fs in (w for top in glob.glob('/usr/lib/python3*') for w in os.walk(top)):\n    for f in fs:\n        p = os.path.join(d, f)\n        try:\n            if os.path.isfile(p) and not os.path.islink(p):\n                open(p, 'rb').read()\n        except OSError:\n            pass\n";

/// Range `bytes=a-b` of a request, as (a, b+1).
fn span(range: &str) -> Option<(u64, u64)> {
    let (a, b) = range.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse::<u64>().ok()? + 1))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, debootstrap"]
async fn a_read_the_profile_did_not_predict_goes_before_the_queued_prefetch() -> Result<()> {
    let py = PythonImage::start().await?;
    let tmp = &py.tmp;

    // 1. Record the big profile on a cold node (fill off).
    let plain = format!("{}/python:weenv", py.proxy.host());
    let (profile, _) = py.record_profile(&tmp.path().join("snap-rec"), &plain, |ctd| {
        ctr_run(ctd, "a", "weenv", &plain, "rec", &["python3", "-c", BIG])
    })?;
    let file = tmp.path().join("big.profile");
    std::fs::write(&file, &profile)?;
    let big_direct = format!("{}/python:weenv-big", py.reg.host());
    let o = Command::new(workspace_bin("weenv-convert")?)
        .args(["--plain-http", &py.reg.host(), "prefetch", &py.direct])
        .arg("--profile")
        .arg(&file)
        .args(["--to", &big_direct])
        .output()?;
    ensure!(
        o.status.success(),
        "weenv-convert prefetch: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // 2. The profile's frames and a small file outside them (and not next to them: the
    //    daemon's header checks may read the frame before a file's first frame).
    let r: weenv_registry::Reference = big_direct.parse()?;
    let arch = weenv_registry::manifest::host_platform().architecture;
    let (m, _) = py
        .client
        .get_image_manifest(&r, "linux", &arch, None)
        .await?;
    let mut pick = None;
    let mut inside = None;
    let mut profile_bytes = 0u64;
    for l in &m.layers {
        let blob = py.client.get_blob(&r, &l.digest).await?;
        let toc = weenv_format::reader::LayerReader::open(blob.to_vec(), None)?.into_toc();
        let order: Vec<FrameIdx> = match l
            .annotations
            .get(weenv_format::prefetch::ANNOTATION_PREFETCH)
        {
            Some(v) => weenv_format::prefetch::decode_frames(v, toc.frames.len())?,
            None => Vec::new(),
        };
        let wanted: HashSet<FrameIdx> = order.iter().copied().collect();
        // A small python file in one frame of the profile's last third, its tar header in the
        // same frame, and the frame the profile names next (the rest of its batch); no frame
        // of the profile's first half within 256 KiB of either (a prefetch request sent before
        // the read may bridge a hole of up to 256 KiB between its frames).
        if inside.is_none() && order.len() > 6 {
            let late = &order[order.len() * 2 / 3..];
            let early: Vec<(u64, u64)> = order[..order.len() / 2]
                .iter()
                .filter_map(|i| toc.frames.get(i.0 as usize))
                .map(|f| (f.offset, f.offset + f.clen))
                .collect();
            let clear = |i: FrameIdx| {
                let f = &toc.frames[i.0 as usize];
                let (a, b) = (
                    f.offset.saturating_sub(256 << 10),
                    f.offset + f.clen + (256 << 10),
                );
                !early.iter().any(|(x, y)| *x < b && a < *y)
            };
            inside = toc
                .entries
                .iter()
                .filter(|e| {
                    e.path.starts_with("usr/lib/python3") && (1..=16 << 10).contains(&e.size)
                })
                .filter(|e| e.chunks.len() == 1 && e.chunks[0].frame_offset >= 4096)
                .find_map(|e| {
                    let f = e.chunks[0].frame;
                    let at = late.iter().position(|i| *i == f)?;
                    let next = *late.get(at + 1)?;
                    (next != f && clear(f) && clear(next)).then(|| {
                        let span = |i: FrameIdx| {
                            let fr = &toc.frames[i.0 as usize];
                            (fr.offset, fr.offset + fr.clen)
                        };
                        (e.path.clone(), l.digest.to_string(), span(f), span(next))
                    })
                });
            println!(
                "layer {}: {} profile frames, {} late; late frames clear of the early ones: {}",
                l.digest,
                order.len(),
                late.len(),
                late.iter().filter(|i| clear(**i)).count()
            );
        }
        profile_bytes += wanted
            .iter()
            .filter_map(|i| toc.frames.get(i.0 as usize))
            .map(|f| f.clen)
            .sum::<u64>();
        // Far from every profile frame: the prefetch coalesces across holes of up to 256 KiB
        // and adds the frames holding its files' headers.
        let spans: Vec<(u64, u64)> = wanted
            .iter()
            .filter_map(|i| toc.frames.get(i.0 as usize))
            .map(|f| (f.offset, f.offset + f.clen))
            .collect();
        let near = |i: u32| {
            let Some(f) = toc.frames.get(i as usize) else {
                return true;
            };
            let (a, b) = (
                f.offset.saturating_sub(512 << 10),
                f.offset + f.clen + (512 << 10),
            );
            (i.saturating_sub(2)..=i + 2).any(|j| wanted.contains(&FrameIdx(j)))
                || spans.iter().any(|(x, y)| *x < b && a < *y)
        };
        if pick.is_none() {
            pick = toc
                .entries
                .iter()
                .filter(|e| !e.path.starts_with("usr/") && (1..=64 << 10).contains(&e.size))
                .find(|e| !e.chunks.is_empty() && e.chunks.iter().all(|c| !near(c.frame.0)))
                .map(|e| {
                    let f = &toc.frames[e.chunks[0].frame.0 as usize];
                    (e.path.clone(), l.digest.to_string(), f.offset, f.clen)
                });
        }
    }
    let (path, layer, frame_off, frame_len) =
        pick.context("no small file outside the profile's frames")?;
    let (in_path, in_layer, in_frame, next_frame) =
        inside.context("no small python file in one frame late in the profile")?;
    println!(
        "profile: {} files, {profile_bytes} compressed bytes; the read: /{path} (frame at {frame_off}, {frame_len} bytes)",
        profile.lines().count()
    );
    ensure!(
        profile_bytes > 8 << 20,
        "profile too small: {profile_bytes}"
    );

    // 3. A fresh node behind a link on which the prefetch takes ~30 s.
    let rate = (profile_bytes / 30).max(256 << 10);
    let shaped = CountingProxy::start_with(
        py.reg.addr(),
        ProxyOptions {
            rate_bytes_per_sec: rate,
            ..Default::default()
        },
    )?;
    let mut opts = py.daemon_options();
    opts.plain_http.push(shaped.host());
    let d = Daemon::start(&tmp.path().join("snap-run"), &opts)?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(d.socket.clone()),
        ..Default::default()
    })?;
    let image = format!("{}/python:weenv-big", shaped.host());
    d.pull(ctd.address(), "b", &image)?;
    let script = format!(
        "sleep 2; cat '/{path}' > /dev/null && sleep 1 && cat '/{in_path}' > /dev/null && echo read"
    );
    let out = ctr_run(&ctd, "b", "weenv", &image, "small", &["sh", "-c", &script])?;
    ensure!(out.contains("read"), "{out}");

    // 4. The order at the proxy. The prefetch's requests that were in flight when the read
    //    came share the link with it and may still be running when the container exits; the
    //    next prefetch request starts only when they end. Wait (up to the prefetch's own
    //    duration) until a request starts after the read, then judge the order.
    let gets_of = |stats: &weenv_integration::registry::ProxyStats| -> Vec<_> {
        stats
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path.contains("/blobs/"))
            .filter_map(|r| Some((span(r.range.as_deref()?)?, r)))
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let blob_gets = loop {
        let gets = gets_of(&shaped.stats());
        let read_end = gets
            .iter()
            .rev()
            .find(|((a, b), r)| r.path.contains(&layer) && *a <= frame_off && frame_off < *b)
            .map(|(_, r)| r.end_us);
        let later = read_end.is_some_and(|e| e > 0 && gets.iter().any(|(_, r)| r.start_us >= e));
        if later || std::time::Instant::now() > deadline {
            break gets;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let Some((_, read)) = blob_gets
        .iter()
        .rev()
        .find(|((a, b), r)| r.path.contains(&layer) && *a <= frame_off && frame_off < *b)
    else {
        bail!("no request for /{path}'s frame: {blob_gets:#?}");
    };
    let (start, end) = (read.start_us, read.end_us);
    ensure!(end > start, "the read's request did not finish: {read:?}");
    // A request sent just before the read may reach the proxy's record just after it.
    const SLACK_US: u64 = 50_000;
    let during: Vec<_> = blob_gets
        .iter()
        .filter(|(_, r)| r.start_us > start + SLACK_US && r.start_us < end)
        .collect();
    let is_inside_read = |(a, b): (u64, u64), r: &weenv_integration::registry::ProxyRequest| {
        r.path.contains(&in_layer) && a <= in_frame.0 && in_frame.0 < b
    };
    let after = blob_gets
        .iter()
        .filter(|(s, r)| r.start_us >= end && !is_inside_read(*s, r))
        .count();
    let in_flight: u64 = blob_gets
        .iter()
        .filter(|(_, r)| r.start_us < start && r.end_us > start)
        .map(|(_, r)| r.response_bytes)
        .sum();
    println!(
        "the read's request: {} bytes in {} ms on a {rate} B/s link, sharing it with {in_flight} \
         background bytes already in flight; prefetch requests started during it: {}; after it: {after}",
        read.response_bytes,
        (end - start) / 1000,
        during.len()
    );
    ensure!(
        during.is_empty(),
        "prefetch requests started while the read's request was in flight: {during:#?}"
    );
    ensure!(
        after > 0,
        "no prefetch request came after the read: the prefetch was done before it (link too fast?)"
    );

    // 5. The read of a frame in a queued prefetch batch: its request is that frame alone, and
    //    the frame the profile names next comes later, in another request (wait for the
    //    prefetch to get there).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let covering = |gets: &[((u64, u64), weenv_integration::registry::ProxyRequest)], at: u64| {
        gets.iter()
            .filter(|((a, b), r)| r.path.contains(&in_layer) && *a <= at && at < *b)
            .map(|(s, r)| (*s, r.clone()))
            .collect::<Vec<_>>()
    };
    let gets = loop {
        let gets = gets_of(&shaped.stats());
        if !covering(&gets, next_frame.0).is_empty() || std::time::Instant::now() > deadline {
            break gets;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    // The first request with the read's frame is the read's (nothing sent before the read
    // covers it); a later batch may still bridge over it.
    let first = |at: u64| {
        let mut c = covering(&gets, at);
        c.sort_by_key(|(_, r)| r.start_us);
        c
    };
    let reads = first(in_frame.0);
    let Some((read_span, read)) = reads.first() else {
        bail!("no request for /{in_path}'s frame {in_frame:?}");
    };
    let next = first(next_frame.0);
    println!(
        "the read in a queued batch: /{in_path}, frame {in_frame:?}, request {read_span:?} \
         ({} bytes); the profile's next frame {next_frame:?}: requests {:?}",
        read.response_bytes,
        next.iter()
            .map(|(s, r)| (*s, r.start_us))
            .collect::<Vec<_>>()
    );
    ensure!(
        *read_span == in_frame,
        "the read's request {read_span:?} is not its frame {in_frame:?} alone: it waited for bytes it did not ask for"
    );
    ensure!(
        !next.is_empty(),
        "the profile's next frame {next_frame:?} never came (prefetch stalled?)"
    );
    ensure!(
        next[0].1.start_us > read.start_us,
        "the rest of the batch went before (or with) the read: {next:#?} vs {read:?}"
    );
    Ok(())
}
