//! Running containers survive a daemon crash and an in-place restart (issue 11).
//!
//! The Debian+python3 image, pulled lazily (fill off) by a daemon with `fuse.handover` on
//! (it starts a keeper holding the FUSE session). A container reads random files of the
//! image at ≈ 1,000 reads/s (open, read all, sha256, drop the file's page cache so the next
//! read of it reaches FUSE again, close) and compares every checksum with the source: the
//! same image's gzip original unpacked by containerd's stock overlayfs snapshotter. Meanwhile
//! the daemon is killed with SIGKILL and started again, then stopped with SIGTERM (planned
//! restart/upgrade: it leaves the session to the keeper) and started again. Both times the
//! new daemon takes the session over. Checked: 0 failed reads, 0 wrong bytes, both
//! takeovers logged, a new container starts after each restart. Printed: reads, rate,
//! longest and p99 read time around the takeovers, restart and new-container times.
//!
//! Opens that span a takeover: a second process in the reader container holds a big file of
//! the image open through FUSE passthrough (complete file, opened after its copy was made);
//! the new container started after each restart reads that same file (same inode), which
//! the kernel allows only with the same backing file: the successor must reuse the
//! predecessor's backing id (the live opens the keeper kept).

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_snapshotter::handover::client::KeeperClient;

/// Prints `<sha256> <path>` of the regular files of 1 B – 256 KiB under /usr.
const MANIFEST: &str = r#"
import os, hashlib, stat, sys
out = []
for d, dirs, files in os.walk('/usr'):
    dirs.sort()
    for n in sorted(files):
        p = os.path.join(d, n)
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode) and 0 < st.st_size <= 262144 and ' ' not in p:
            out.append('%s %s' % (hashlib.sha256(open(p, 'rb').read()).hexdigest(), p))
sys.stdout.write('\n'.join(out) + '\n')
"#;

/// Prints `<sha256> <path>` of the first (by path) regular file of 1–8 MiB under /usr/lib.
const BIG: &str = r#"
import os, hashlib
best = None
for d, dirs, files in os.walk('/usr/lib'):
    for n in files:
        p = os.path.join(d, n)
        if os.path.islink(p) or ' ' in p:
            continue
        if (1 << 20) <= os.path.getsize(p) <= (8 << 20) and (best is None or p < best):
            best = p
print(hashlib.sha256(open(best, 'rb').read()).hexdigest(), best)
"#;

/// Reads argv[1] whole a few times (its frames reach the disk cache, then the daemon makes a
/// complete copy for passthrough), then holds it open and writes /io/held.
const HOLDER: &str = r#"
import sys, time
p = sys.argv[1]
for _ in range(4):
    with open(p, 'rb') as f:
        f.read()
    time.sleep(1)
f = open(p, 'rb')
f.read()
open('/io/held', 'w').write('1')
time.sleep(600)
"#;

/// Reads random files of /io/manifest at argv[1] reads/s until /io/stop exists; writes
/// /io/progress now and then and /io/result.json at the end.
const READER: &str = r#"
import os, sys, time, random, hashlib, json
man = {}
for line in open('/io/manifest'):
    h, p = line.rstrip('\n').split(' ', 1)
    man[p] = h
paths = sorted(man)
rng = random.Random(11)
rate = float(sys.argv[1])
reads = failed = wrong = 0
durs, errors = [], []
start = time.monotonic()
next_t = last = start
while not os.path.exists('/io/stop'):
    p = rng.choice(paths)
    t0 = time.monotonic()
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            h = hashlib.sha256()
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                h.update(b)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if h.hexdigest() != man[p]:
            wrong += 1
            errors.append('wrong bytes: ' + p)
    except OSError as e:
        failed += 1
        errors.append('%s: %s' % (p, e))
    t1 = time.monotonic()
    reads += 1
    durs.append((round(t0 - start, 4), round(t1 - t0, 5)))
    if t1 - last > 0.25:
        with open('/io/progress.tmp', 'w') as f:
            f.write('%d %d %d' % (reads, failed, wrong))
        os.rename('/io/progress.tmp', '/io/progress')
        last = t1
    next_t += 1.0 / rate
    d = next_t - time.monotonic()
    if d > 0:
        time.sleep(d)
    elif d < -1:
        next_t = time.monotonic()
res = {'reads': reads, 'failed': failed, 'wrong': wrong, 'secs': time.monotonic() - start,
       'errors': errors[:20], 'durs': durs}
with open('/io/result.tmp', 'w') as f:
    json.dump(res, f)
os.rename('/io/result.tmp', '/io/result.json')
"#;

/// Stops the keeper on drop (after the daemon: declared before it).
struct KeeperGuard(PathBuf);

impl Drop for KeeperGuard {
    fn drop(&mut self) {
        if let Ok(k) = KeeperClient::connect(&self.0) {
            let _ = k.stop();
        }
    }
}

/// (reads, failed, wrong) so far.
fn progress(io: &Path) -> (u64, u64, u64) {
    let s = std::fs::read_to_string(io.join("progress")).unwrap_or_default();
    let v: Vec<u64> = s.split(' ').filter_map(|x| x.parse().ok()).collect();
    match v[..] {
        [a, b, c] => (a, b, c),
        _ => (0, 0, 0),
    }
}

/// Waits until the reader has done `more` reads past now.
async fn read_on(io: &Path, more: u64) -> Result<()> {
    let (start, _, _) = progress(io);
    let t = Instant::now();
    while progress(io).0 < start + more {
        ensure!(
            t.elapsed() < Duration::from_secs(120),
            "the reader stalled at {:?}",
            progress(io)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Time until a new container on the weenv snapshotter printed `sha256sum` of `big` (the
/// file held open across the restart; retried for 10 s); fails on other bytes.
fn new_container(
    ctd: &Containerd,
    ns: &str,
    image: &str,
    id: &str,
    big: (&str, &str),
) -> Result<Duration> {
    let t = Instant::now();
    loop {
        match ctr_run(ctd, ns, "weenv", image, id, &["sha256sum", big.1]) {
            Ok(out) => {
                ensure!(
                    out.starts_with(big.0),
                    "{id}: {} has other bytes: {out}",
                    big.1
                );
                return Ok(t.elapsed());
            }
            Err(e) if t.elapsed() > Duration::from_secs(10) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// `weenv_passthrough_opens_total` of the running daemon.
fn passthrough_opens(d: &Daemon) -> Result<u64> {
    let m = d.weenv(&["metrics"])?;
    m.lines()
        .find_map(|l| l.strip_prefix("weenv_passthrough_opens_total "))
        .and_then(|v| v.trim().parse().ok())
        .context("no weenv_passthrough_opens_total")
}

/// (longest, p99) of the read times started in `[from, to)` seconds.
fn stall(durs: &[(f64, f64)], from: f64, to: f64) -> (f64, f64) {
    let mut v: Vec<f64> = durs
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, d)| *d)
        .collect();
    v.sort_by(f64::total_cmp);
    let max = v.last().copied().unwrap_or(0.0);
    let p99 = v.get(v.len() * 99 / 100).copied().unwrap_or(max);
    (max, p99)
}

/// The layers on the full session only (`plain_session = false`): the held file is opened
/// with passthrough, and its backing id must survive both takeovers.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse (Linux 6.9+), docker-registry, skopeo, debootstrap"]
async fn running_container_reads_through_kill_and_restart() -> Result<()> {
    restart_scenario(false).await
}

/// The defaults: the image's layers (no xattrs) on the plain session, kept by a keeper of its
/// own; both sessions are taken over at each restart.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse (Linux 6.9+), docker-registry, skopeo, debootstrap"]
async fn running_container_on_the_plain_session_reads_through_kill_and_restart() -> Result<()> {
    restart_scenario(true).await
}

async fn restart_scenario(plain: bool) -> Result<()> {
    // Namespaces of their own: runc keeps container state per host and namespace, and the
    // two scenarios may run at once (same container ids).
    let (truth, ns) = if plain {
        ("truth-plain", "restart-plain")
    } else {
        ("truth", "restart")
    };
    let pi = PythonImage::start().await?;
    let root = pi.tmp.path().join("snap");
    let _keeper = KeeperGuard(root.join("state/fuse-keeper.sock"));
    let _plain_keeper = KeeperGuard(root.join("state/fuse-keeper-plain.sock"));
    let mut daemon = Daemon::start_with(&root, &pi.daemon_options(), &[], |c| {
        c.fuse.handover = true;
        c.fuse.keeper_timeout_secs = 120;
        c.fuse.plain_session = plain;
    })?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;

    // The source: the gzip image unpacked by the stock snapshotter.
    let o = ctd.ctr_ns(truth, &["images", "pull", "--plain-http", &pi.gz])?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest = ctr_run(
        &ctd,
        truth,
        "overlayfs",
        &pi.gz,
        "manifest",
        &["python3", "-c", MANIFEST],
    )?;
    let files = manifest.lines().count();
    ensure!(files > 1000, "only {files} files in the manifest");
    let big_line = ctr_run(
        &ctd,
        truth,
        "overlayfs",
        &pi.gz,
        "big",
        &["python3", "-c", BIG],
    )?;
    let (big_sum, big_path) = big_line.trim().split_once(' ').context("no big file")?;

    let io = ctd.dir().join("io");
    std::fs::create_dir_all(&io)?;
    std::fs::write(io.join("manifest"), &manifest)?;
    std::fs::write(io.join("reader.py"), READER)?;
    let rep = daemon.pull(ctd.address(), ns, &pi.direct)?;
    ensure!(rep.contains("lazy"), "{rep}");
    let mount = format!("type=bind,src={},dst=/io,options=rbind:rw", io.display());
    let o = ctd.ctr_ns(
        ns,
        &[
            "run",
            "-d",
            "--snapshotter",
            "weenv",
            "--mount",
            &mount,
            &pi.direct,
            "reader",
            "python3",
            "/io/reader.py",
            "1000",
        ],
    )?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t0 = Instant::now();
    let mut holder = ctd
        .ctr_command(
            ns,
            &[
                "task",
                "exec",
                "--exec-id",
                "holder",
                "reader",
                "python3",
                "-c",
                HOLDER,
                big_path,
            ],
        )
        .stdin(std::process::Stdio::null())
        .spawn()?;
    let t = Instant::now();
    while !io.join("held").exists() {
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "the holder did not open {big_path}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pt = passthrough_opens(&daemon)?;
    let plain_lowers = std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .filter(|l| l.contains(&*root.join("state/mnt-plain/").to_string_lossy()))
        .count();
    if plain {
        ensure!(
            plain_lowers >= 1,
            "the reader's layers should be on the plain session\n{}",
            daemon.log()
        );
    } else {
        ensure!(
            plain_lowers == 0,
            "plain_session = false, yet a plain lower"
        );
        ensure!(pt >= 1, "{big_path} was never opened with passthrough");
    }
    read_on(&io, 2000).await.with_context(|| daemon.log())?;

    // 1. kill -9, then a new daemon at once.
    let t_kill = t0.elapsed().as_secs_f64();
    let crash = daemon.kill_and_restart()?;
    let big = (big_sum, big_path);
    let new1 =
        new_container(&ctd, ns, &pi.direct, "after-kill", big).with_context(|| daemon.log())?;
    read_on(&io, 2000).await.with_context(|| daemon.log())?;

    // 2. Planned restart (an upgrade in place): SIGTERM, then the new daemon.
    let t_term = t0.elapsed().as_secs_f64();
    let term = daemon.term_and_restart()?;
    let new2 =
        new_container(&ctd, ns, &pi.direct, "after-term", big).with_context(|| daemon.log())?;
    read_on(&io, 2000).await.with_context(|| daemon.log())?;

    std::fs::write(io.join("stop"), b"")?;
    let t = Instant::now();
    while !io.join("result.json").exists() {
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "no result from the reader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(io.join("result.json"))?)?;
    let durs: Vec<(f64, f64)> = res["durs"]
        .as_array()
        .context("durs")?
        .iter()
        .filter_map(|d| Some((d[0].as_f64()?, d[1].as_f64()?)))
        .collect();
    let (reads, failed, wrong) = (
        res["reads"].as_u64().unwrap_or(0),
        res["failed"].as_u64().unwrap_or(u64::MAX),
        res["wrong"].as_u64().unwrap_or(u64::MAX),
    );
    let secs = res["secs"].as_f64().unwrap_or(1.0);
    // The reader's clock starts ~when the container started, a little before t0.
    let (all_max, all_p99) = stall(&durs, 0.0, f64::MAX);
    let (k_max, k_p99) = stall(&durs, t_kill - 1.0, t_kill + crash.as_secs_f64() + 3.0);
    let (s_max, s_p99) = stall(&durs, t_term - 1.0, t_term + term.as_secs_f64() + 3.0);
    println!(
        "reads {reads} over {secs:.1} s ({:.0}/s) of {files} files; failed {failed}, wrong {wrong}",
        reads as f64 / secs
    );
    println!(
        "longest read {:.0} ms (p99 {:.1} ms); around kill -9: longest {:.0} ms, p99 {:.1} ms; around SIGTERM restart: longest {:.0} ms, p99 {:.1} ms",
        all_max * 1e3,
        all_p99 * 1e3,
        k_max * 1e3,
        k_p99 * 1e3,
        s_max * 1e3,
        s_p99 * 1e3
    );
    println!(
        "kill -9 → new daemon serving: {} ms; SIGTERM → new daemon serving: {} ms; new container (reads {big_path}, held open with passthrough since before the restarts, {pt} passthrough opens) after: {} ms / {} ms",
        crash.as_millis(),
        term.as_millis(),
        new1.as_millis(),
        new2.as_millis()
    );
    ensure!(
        failed == 0 && wrong == 0,
        "{failed} failed, {wrong} wrong reads: {:?}\n{}",
        res["errors"],
        daemon.log()
    );
    ensure!(reads >= 6000, "only {reads} reads");
    let log = daemon.log();
    let sessions = if plain { 2 } else { 1 };
    ensure!(
        log.matches("serving the taken-over FUSE session").count() == 2 * sessions,
        "both restarts should take the {sessions} session(s) over:\n{log}"
    );

    let _ = ctd.ctr_ns(ns, &["task", "kill", "-s", "KILL", "reader"]);
    let _ = holder.wait();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = ctd.ctr_ns(ns, &["task", "rm", "-f", "reader"]);
    let _ = ctd.ctr_ns(ns, &["container", "rm", "reader"]);
    drop(ctd);
    daemon.stop();
    Ok(())
}
