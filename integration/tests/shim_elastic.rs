//! End-to-end elastic provisioning with the weenv shim (cgroup v1 or v2, as the machine
//! has it; every test asserts that the shim used the machine's version): CPU burst
//! scale-up and idle scale-down, memory growth under elastic vs fixed limits, memory raised
//! on pressure alone before the OOM killer, termination for persistent OOM at the maximum,
//! admission preemption. On this development machine they run on v1; on v2 inside the VM
//! of `scripts/vm-shim-tests.sh`. Times are the container's and the shim's own clock
//! (`/proc/uptime`, CLOCK_BOOTTIME), bounds are multiples of the sampling interval
//! (`WEENV_TEST_INTERVAL_MS`, default 200).

mod shim_common;

use std::time::Instant;

use anyhow::{Context, Result};
use shim_common::{
    burst_script, code, grow_memory_cmd, interval_ms, machine_cgroup_version, stdout, ShimEnv,
};

/// The shim ran container `id` elastically on the machine's cgroup version.
fn assert_cgroup_version(env: &ShimEnv, id: &str) -> Result<()> {
    let st = env.status(id)?;
    assert_eq!(
        st["cgroup"].as_str(),
        Some(machine_cgroup_version()),
        "shim used another cgroup version than the machine's: {st}"
    );
    assert_eq!(st["elastic"], true, "{st}");
    Ok(())
}

/// The node's CPU ceiling for scale-up: capacity minus the default 10% reserve.
fn cpu_ceiling_millicores() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    cpus * 1000 - cpus * 1000 / 10
}

/// The elastic tests measure timing: run them one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads `/proc/uptime` printed by the container as `mark <seconds>`.
fn marks(out: &str, name: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix(&format!("{name} ")))
        .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * 1000.0) as u64)
        .collect()
}

/// Writes one line to a FIFO the container blocks on in `read` (no CPU used while it waits,
/// unlike a polling loop, whose forks alone can be throttled at a small quota on an emulated
/// machine and raise the quota). Opened non-blocking, retried until the container has it
/// open for reading; gives up once `gone()` says the container ended.
fn release(fifo: &std::path::Path, gone: impl Fn() -> bool) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(fifo)
        {
            Ok(mut f) => {
                f.write_all(b"go\n")?;
                return Ok(());
            }
            // ENXIO: no reader yet.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) && !gone() => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) if gone() => {
                eprintln!("container ended before {} was written: {e}", fifo.display());
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("open {}", fifo.display())),
        }
    }
}

/// The container's CPU quota in millicores, read from its cgroup (v2 `cpu.max`, v1
/// `cpu.cfs_quota_us` / `cpu.cfs_period_us`); `None` while it cannot be read.
fn cgroup_cpu_millicores(ns: &str, id: &str) -> Option<u64> {
    let read = |p: String| std::fs::read_to_string(p).ok();
    let (quota, period) = match read(format!("/sys/fs/cgroup/{ns}/{id}/cpu.max")) {
        Some(max) => {
            let mut f = max.split_whitespace();
            (
                f.next()?.parse::<u64>().ok()?,
                f.next()?.parse::<u64>().ok()?,
            )
        }
        None => (
            read(format!("/sys/fs/cgroup/cpu/{ns}/{id}/cpu.cfs_quota_us"))?
                .trim()
                .parse()
                .ok()?,
            read(format!("/sys/fs/cgroup/cpu/{ns}/{id}/cpu.cfs_period_us"))?
                .trim()
                .parse()
                .ok()?,
        ),
    };
    Some(quota * 1000 / period.max(1))
}

/// Milliseconds of the boot clock (CLOCK_BOOTTIME, as the shim's `boot_ms` and the
/// container's `/proc/uptime`).
fn boot_now_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
        .unwrap_or(0)
}

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn cpu_burst_raises_quota_within_one_sample_and_lowers_it_after_idle() -> Result<()> {
    /// The container's request, millicores (2000 µs per 20000 µs period).
    const REQUEST: u64 = 100;
    let _serial = serial();
    let env = ShimEnv::start("el-burst")?;
    // The container (0.1 core as 2 ms per 20 ms CFS period, so that one sample of the
    // default 200 ms holds ~10 periods — with 100 ms periods a sample holds 2 and the
    // throttled fraction is 0, 1/2 or 1 by where the burst starts; 2 busy threads in the
    // burst, 20x the quota, so that even a saturated node gives them more than the quota and
    // every period is throttled; scale-down window 3 s) is
    // driven through two FIFOs in a bind-mounted dir, so that it is idle — blocked in
    // `read`, not polling — whenever the test waits:
    // 1. it writes `ready` and blocks on `go1`; the test waits until its cgroup quota is
    //    the request (a start-up raise — runc init and the shell on a slow emulated
    //    machine can be throttled at 0.1 core — is halved back by the idle window) and no
    //    change came for 3 sampling intervals after both `ready` and the last change;
    // 2. it prints `start <uptime>`, bursts, prints `end <uptime>`, blocks on `go2`; the
    //    test waits for the first lowering (bounded: window + 20 intervals after `end`);
    // 3. it exits. Times are the machine's boot clock: the shim's `boot_ms`, the
    //    container's `/proc/uptime` (read with the shell's `read`, no fork).
    let iters = std::env::var("WEENV_TEST_BURST_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let iv = interval_ms();
    let window_ms = 3000;
    let sync = env.ctd.dir().join("burst-sync");
    std::fs::create_dir_all(&sync)?;
    for f in ["go1", "go2"] {
        nix::unistd::mkfifo(
            &sync.join(f),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )?;
    }
    let script = format!(
        "echo ready > /sync/ready; read x < /sync/go1; \
         read up _ < /proc/uptime; echo start $up; {} ; read up _ < /proc/uptime; echo end $up; \
         echo end > /sync/end; read x < /sync/go2",
        burst_script(iters)
    );
    let mount = format!(
        "--mount=type=bind,src={},dst=/sync,options=rbind:rw",
        sync.display()
    );
    let window_ann = format!(
        "--annotation=io.weenv.cpu.scale_down_window_s={}",
        window_ms / 1000
    );
    let ns = env.ctd.namespace().to_string();
    let (o, waited) = std::thread::scope(|s| -> Result<_> {
        let run = s.spawn(|| {
            let r = env.run(
                "b1",
                &[
                    "--rm",
                    "--cpu-quota=2000",
                    "--cpu-period=20000",
                    &window_ann,
                    &mount,
                ],
                &["/bin/sh", "-c", &script],
            );
            // Unblock the steps below if the container ended early.
            let _ = std::fs::write(sync.join("exited"), "");
            r
        });
        let gone = || sync.join("exited").exists();
        // Step 1: idle at the request.
        let mut ready_at = None;
        let deadline = Instant::now() + std::time::Duration::from_secs(600);
        let mut at_request_since = None;
        while !gone() && Instant::now() < deadline {
            let now = boot_now_ms();
            if ready_at.is_none() && sync.join("ready").exists() {
                ready_at = Some(now);
            }
            let last_change = env
                .changes("b1")
                .unwrap_or_default()
                .iter()
                .filter(|c| c["resource"] == "cpu")
                .filter_map(|c| c["boot_ms"].as_u64())
                .max()
                .unwrap_or(0);
            let at_request = cgroup_cpu_millicores(&ns, "b1") == Some(REQUEST);
            at_request_since = match (at_request, at_request_since) {
                (false, _) => None,
                (true, None) => Some(now),
                (true, s) => s,
            };
            if let (Some(r), Some(a)) = (ready_at, at_request_since) {
                if now >= r.max(last_change).max(a) + 3 * iv {
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(iv / 4));
        }
        let waited = (ready_at, boot_now_ms());
        release(&sync.join("go1"), gone)?;
        // Step 2: wait for the burst's end, then for the first lowering.
        while !gone() && !sync.join("end").exists() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(iv / 4));
        }
        let end_seen = boot_now_ms();
        while !gone() && boot_now_ms() < end_seen + window_ms + 20 * iv {
            let lowered = env.changes("b1").unwrap_or_default().iter().any(|c| {
                c["resource"] == "cpu"
                    && c["new"].as_u64() < c["old"].as_u64()
                    && c["boot_ms"].as_u64() >= Some(waited.1)
            });
            if lowered {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(iv / 4));
        }
        release(&sync.join("go2"), gone)?;
        let o = run
            .join()
            .map_err(|_| anyhow::anyhow!("ctr run thread panicked"))??;
        Ok((o, waited))
    })?;
    let out = stdout(&o);
    assert_eq!(code(&o), 0, "{out} {}", String::from_utf8_lossy(&o.stderr));
    let (ready_at, released_at) = waited;
    assert!(ready_at.is_some(), "the container never got ready: {out}");
    let start = *marks(&out, "start").first().context("no start mark")?;
    let end = *marks(&out, "end").first().context("no end mark")?;
    let changes = env.changes("b1")?;
    let all: Vec<_> = changes.iter().filter(|c| c["resource"] == "cpu").collect();
    println!(
        "ready {ready_at:?}, released {released_at}, burst {start}..{end} ms (boot clock); cpu changes: {all:#?}"
    );
    assert_cgroup_version(&env, "b1")?;
    // Before the release the quota was back at the request (start-up changes, if any,
    // ended there); every change after it is the burst's or the idle phase's.
    let before: Vec<_> = all
        .iter()
        .filter(|c| c["boot_ms"].as_u64() < Some(released_at))
        .collect();
    if let Some(last) = before.last() {
        assert_eq!(
            last["new"], REQUEST,
            "released above the request: {before:?}"
        );
    }
    let cpu: Vec<_> = all
        .iter()
        .filter(|c| c["boot_ms"].as_u64() >= Some(released_at))
        .copied()
        .collect();
    let first = cpu.first().with_context(|| {
        format!(
            "no CPU change after the release; status {:?}; log:\n{}",
            env.status("b1"),
            env.ctd.log()
        )
    })?;
    let up_at = first["boot_ms"].as_u64().context("boot_ms")?;
    assert_eq!(first["old"], REQUEST);
    // Every raise: x4 when more than 80% of the sample's periods were throttled (severe),
    // x2 for ordinary pressure (>= 10% throttled or >= 85% of the quota used), clamped to
    // the node's ceiling; the reason's recorded fraction agrees with the rule.
    for c in cpu.iter().filter(|c| c["new"].as_u64() > c["old"].as_u64()) {
        let old = c["old"].as_u64().context("old")?;
        let thr = c["reason"]["throttled"].as_f64();
        let factor = match c["reason"]["kind"].as_str() {
            Some("cpu_severe_throttled") if thr > Some(0.8) => 4,
            Some("cpu_throttled") if thr >= Some(0.1) && thr <= Some(0.8) => 2,
            Some("cpu_utilisation") => 2,
            _ => panic!("raise with an unexpected reason: {c}"),
        };
        assert_eq!(
            c["new"].as_u64(),
            Some((old * factor).min(cpu_ceiling_millicores())),
            "raise {c}"
        );
    }
    // /proc/uptime has 10 ms resolution; the first sample after the burst starts sees it.
    assert!(
        up_at + 10 >= start,
        "raised before the burst: {up_at} < {start}"
    );
    assert!(
        up_at <= start + 2 * iv,
        "raised {} ms after the burst started; expected within one sample period of {iv} ms (+1 of scheduling slack)",
        up_at - start
    );
    // Two busy threads at 0.1 core demand 20x the quota: every whole CFS period of the
    // burst is throttled, so the first raise is the severe one (x4).
    assert_eq!(
        first["reason"]["kind"], "cpu_severe_throttled",
        "first raise of a 20x overload not x4: {first}"
    );
    let raises = cpu
        .iter()
        .filter(|c| c["new"].as_u64() > c["old"].as_u64())
        .count();
    // Conservative scale-down: no lowering during the burst, the first one only after a
    // whole quiet window following the last raise, and then within a few samples of it.
    let down = cpu
        .iter()
        .find(|c| c["new"].as_u64() < c["old"].as_u64())
        .context("quota was never lowered in the idle phase")?;
    let down_at = down["boot_ms"].as_u64().context("boot_ms")?;
    assert_eq!(down["reason"]["kind"], "cpu_idle");
    assert!(
        down_at >= end,
        "lowered during the burst: {down:?} (burst ended {end})"
    );
    let last_up = cpu
        .iter()
        .filter(|c| c["new"].as_u64() > c["old"].as_u64())
        .filter_map(|c| c["boot_ms"].as_u64())
        .filter(|t| *t <= down_at)
        .max()
        .context("no raise before the lowering")?;
    assert!(
        down_at + 10 >= last_up + window_ms,
        "halved {} ms after the last raise, before the {window_ms} ms window",
        down_at - last_up
    );
    // And not lazily: due a window after the later of the last raise and the burst's end
    // (the window may already start in the sample holding the end), within 4 samples.
    let due = last_up.max(end) + window_ms;
    assert!(
        down_at <= due + 4 * iv,
        "halved {} ms after a quiet window since the last raise and the burst's end ({due} ms); expected within 4 samples of {iv} ms",
        down_at - due
    );
    println!(
        "burst raised after {} ms ({} -> {}, {raises} raises in all); halved {} ms after the last raise, {} ms after the burst ended",
        up_at.saturating_sub(start),
        first["old"],
        first["new"],
        down_at - last_up,
        down_at as i64 - end as i64
    );
    Ok(())
}

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn memory_growth_completes_elastic_and_is_oom_killed_fixed() -> Result<()> {
    let _serial = serial();
    let env = ShimEnv::start("el-mem")?;
    let cmd = grow_memory_cmd(400);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = env.run("m-elastic", &["--rm", "--memory-limit=67108864"], &cmd)?;
    let elastic_s = t.elapsed().as_secs_f64();
    assert_eq!(
        code(&o),
        0,
        "elastic run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(stdout(&o), "grown 400\n");
    let mem: Vec<_> = env
        .changes("m-elastic")?
        .into_iter()
        .filter(|c| c["resource"] == "memory")
        .collect();
    assert!(
        mem.len() >= 3,
        "expected several raises 64→…→≥512 MiB: {mem:?}"
    );
    assert!(mem.last().and_then(|c| c["new"].as_u64()) >= Some(400 << 20));
    assert_cgroup_version(&env, "m-elastic")?;

    let t = Instant::now();
    let o = env.run(
        "m-fixed",
        &[
            "--rm",
            "--memory-limit=67108864",
            "--annotation=io.weenv.elastic=false",
        ],
        &cmd,
    )?;
    let fixed_s = t.elapsed().as_secs_f64();
    assert_eq!(
        code(&o),
        137,
        "fixed 64 MiB must be OOM-killed: {}",
        stdout(&o)
    );
    assert!(env.changes("m-fixed")?.is_empty());
    let st = env.status("m-fixed")?;
    assert!(
        st["reason"].as_str().unwrap_or("").contains("OOM-killed"),
        "kernel OOM kill reported in status.json: {st}"
    );
    println!("memory growth to 400 MiB: elastic completed in {elastic_s:.2} s; fixed OOM-killed after {fixed_s:.2} s");
    Ok(())
}

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn memory_pressure_alone_raises_the_limit_before_the_oom_killer() -> Result<()> {
    let _serial = serial();
    let env = ShimEnv::start("el-press")?;
    // The working-set rule off (threshold 100%): only the kernel's pressure signals can
    // raise the limit — v2 `memory.events` high (memory.high = 90% of memory.max) and PSI,
    // v1 `memory.failcnt` and the frozen-at-limit state (memory.oom_control).
    let cfg = env.config_annotation(
        "press",
        "[memory]\nscale_up_working_set = 1.0\nscale_down_working_set = 0.2\n",
    )?;
    let cmd = grow_memory_cmd(256);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let o = env.run("p1", &["--rm", "--memory-limit=67108864", &cfg], &cmd)?;
    let mem: Vec<_> = env
        .changes("p1")?
        .into_iter()
        .filter(|c| c["resource"] == "memory")
        .collect();
    let st = env.status("p1")?;
    assert_eq!(
        (code(&o), stdout(&o).as_str()),
        (0, "grown 256\n"),
        "growth under pressure-only scaling failed; status {st}; changes {mem:?}; {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_cgroup_version(&env, "p1")?;
    assert!(st["reason"].is_null(), "the kernel OOM killer acted: {st}");
    let kinds: Vec<&str> = mem
        .iter()
        .filter_map(|c| c["reason"]["kind"].as_str())
        .collect();
    assert!(
        mem.last().and_then(|c| c["new"].as_u64()) >= Some(256 << 20),
        "limit never reached the working set: {mem:?}"
    );
    let pressure = ["mem_pressure_events", "mem_psi"];
    if machine_cgroup_version() == "v2" {
        // v2 has no freeze: an OOM event would mean the kernel killed; every raise must
        // come from memory.high events or PSI.
        assert!(
            kinds.iter().all(|k| pressure.contains(k)),
            "v2 raises not all from pressure: {mem:?}"
        );
    } else {
        // v1 freezes the tasks at the limit (failcnt, under_oom), where the working set can
        // reach the whole limit: a 100% ratio is that same state.
        let at_limit = |c: &serde_json::Value| {
            c["reason"]["kind"] == "mem_working_set" && c["reason"]["ratio"].as_f64() >= Some(0.999)
        };
        assert!(
            mem.iter().all(|c| at_limit(c)
                || c["reason"]["kind"]
                    .as_str()
                    .is_some_and(|k| pressure.contains(&k) || k == "oom_emergency")),
            "v1 raises not from failcnt/under_oom: {mem:?}"
        );
    }
    println!(
        "pressure-only memory scaling on {}: {} raises {kinds:?}",
        machine_cgroup_version(),
        mem.len()
    );
    Ok(())
}

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn persistent_oom_at_max_terminates_with_reason() -> Result<()> {
    let _serial = serial();
    let env = ShimEnv::start("el-oom")?;
    let cmd = grow_memory_cmd(1024);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = env.run(
        "o1",
        &[
            "--rm",
            "--memory-limit=67108864",
            "--annotation=io.weenv.memory.max=128Mi",
        ],
        &cmd,
    )?;
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(
        code(&o),
        247,
        "distinct exit status for OOM at max; out: {}",
        stdout(&o)
    );
    let st = env.status("o1")?;
    assert_cgroup_version(&env, "o1")?;
    assert_eq!(st["state"], "terminated");
    assert_eq!(st["exit_status"], 247);
    let reason = st["reason"].as_str().context("reason")?;
    assert!(
        reason.contains("out of memory at the maximum memory tier"),
        "{reason}"
    );
    // The status command shows it too.
    let shim = weenv_integration::containerd::default_shim_dir()
        .join(weenv_integration::containerd::SHIM_BINARY);
    let key = format!("{}/o1", env.ctd.namespace());
    let s = std::process::Command::new(shim)
        .args(["status", &key])
        .arg(&env.status_dir)
        .output()?;
    assert!(String::from_utf8_lossy(&s.stdout).contains("out of memory at the maximum"));
    assert!(secs < 60.0, "termination took {secs:.1} s");
    println!("terminated after {secs:.2} s: {reason}");
    Ok(())
}

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn admission_preempts_scaled_up_quota() -> Result<()> {
    let env = ShimEnv::start("el-admit")?;
    let _serial = serial();
    // Node: 1 core, 20% reserve; ledger private to this test.
    let cfg = env.ctd.dir().join("shim.toml");
    std::fs::write(
        &cfg,
        format!(
            "version = 1\n[monitor]\nstatus_dir = {:?}\n[node]\nledger_dir = {:?}\ncpu_millicores = 1000\nmemory_bytes = 8589934592\nreserve_fraction = 0.2\n",
            env.status_dir.display().to_string(),
            env.ledger_dir.display().to_string()
        ),
    )?;
    let cfg_ann = format!("--annotation=io.weenv.config={}", cfg.display());
    let o = env.run(
        "a1",
        &["-d", "--cpus=0.2", &cfg_ann],
        &["/bin/sh", "-c", "while :; do :; done"],
    )?;
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    // a1 (one busy thread, fully throttled at 0.2 core) scales up to the ceiling
    // 1000 - 200 (reserve) = 800.
    let mut scaled = false;
    for _ in 0..100 {
        if env.changes("a1")?.iter().any(|c| c["new"] == 800) {
            scaled = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(scaled, "a1 never scaled to 800: {:?}", env.changes("a1")?);
    assert_cgroup_version(&env, "a1")?;
    // a2 needs 500: only 200 free (the reserve), so 300 of a1's gain is preempted; a2
    // starts at once.
    let t = Instant::now();
    let o = env.run(
        "a2",
        &["--rm", "--cpus=0.5", &cfg_ann],
        &["/bin/echo", "admitted"],
    )?;
    let a2_s = t.elapsed().as_secs_f64();
    assert_eq!(stdout(&o), "admitted\n");
    let mut preempted = None;
    for _ in 0..50 {
        preempted = env
            .changes("a1")?
            .into_iter()
            .find(|c| c["reason"]["kind"] == "preempted");
        if preempted.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let p = preempted.context("a1 was not preempted")?;
    assert_eq!(
        (p["old"].as_u64(), p["new"].as_u64()),
        (Some(800), Some(500))
    );
    println!("a2 ran in {a2_s:.2} s; a1 preempted: {p}");
    env.ctd.ctr_ok(&["task", "kill", "-s", "SIGKILL", "a1"])?;
    for _ in 0..50 {
        if env
            .ctd
            .ctr(&["task", "rm", "a1"])
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    env.ctd.ctr_ok(&["containers", "rm", "a1"])?;
    Ok(())
}
