#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use std::fs;
use std::time::Duration;

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;
use crate::cgroup::v1::V1;

fn setup(t: &std::path::Path) -> (V1, ShimConfig, StatusDir) {
    let (cpu, acct, mem) = (t.join("cpu"), t.join("cpuacct"), t.join("memory"));
    for d in [&cpu, &acct, &mem] {
        fs::create_dir_all(d).unwrap(); // ok: test code
    }
    fs::write(cpu.join("cpu.cfs_quota_us"), "50000").unwrap(); // ok: test code
    fs::write(cpu.join("cpu.cfs_period_us"), "100000").unwrap(); // ok: test code
    fs::write(cpu.join("cpu.stat"), "nr_periods 0\nnr_throttled 0\n").unwrap(); // ok: test code
    fs::write(acct.join("cpuacct.usage"), "0").unwrap(); // ok: test code
    fs::write(mem.join("memory.usage_in_bytes"), "1048576").unwrap(); // ok: test code
    fs::write(mem.join("memory.stat"), "total_inactive_file 0\n").unwrap(); // ok: test code
    fs::write(mem.join("memory.failcnt"), "0").unwrap(); // ok: test code
    fs::write(
        mem.join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    )
    .unwrap(); // ok: test code
    let limit = (64u64 << 20).to_string();
    fs::write(mem.join("memory.limit_in_bytes"), limit).unwrap(); // ok: test code
    fs::write(
        mem.join("memory.memsw.limit_in_bytes"),
        (64u64 << 20).to_string(),
    )
    .unwrap(); // ok: test code
    let mut cfg = ShimConfig::default();
    cfg.node.ledger_dir = t.join("ledger");
    cfg.node.cpu_millicores = 8000;
    cfg.node.memory_bytes = 8 << 30;
    cfg.monitor.status_dir = t.join("status");
    let sd = StatusDir::new(&cfg.monitor.status_dir, "ns", "c");
    (V1::new(cpu, acct, mem), cfg, sd)
}

#[test]
fn burst_raises_quota_in_one_round_and_records_it() -> TestResult {
    let t = tempfile::tempdir()?;
    let (io, cfg, sd) = setup(t.path());
    let cpu = io.cpu.clone();
    let mem = io.memory.clone();
    let acct = io.cpuacct.clone();
    let mut m = Monitor::new("ns/c".into(), Box::new(io), cfg, sd.clone(), Duration::ZERO)?;
    assert_eq!(
        fs::read_to_string(mem.join("memory.oom_control"))?,
        "1",
        "v1 freeze enabled"
    );
    assert_eq!(m.round(Duration::from_millis(200))?, Outcome::Continue);
    // 200 ms at 2 threads against 0.5 core: fully throttled.
    fs::write(acct.join("cpuacct.usage"), "100000000")?;
    fs::write(cpu.join("cpu.stat"), "nr_periods 2\nnr_throttled 2\n")?;
    m.round(Duration::from_millis(400))?;
    assert_eq!(fs::read_to_string(cpu.join("cpu.cfs_quota_us"))?, "200000");
    // Memory working set 50 MiB of 64: doubles, memsw first.
    fs::write(mem.join("memory.usage_in_bytes"), (50u64 << 20).to_string())?;
    m.round(Duration::from_millis(600))?;
    assert_eq!(
        fs::read_to_string(mem.join("memory.limit_in_bytes"))?,
        (128u64 << 20).to_string()
    );
    assert_eq!(
        fs::read_to_string(mem.join("memory.memsw.limit_in_bytes"))?,
        (128u64 << 20).to_string()
    );
    let log = fs::read_to_string(sd.changes_path())?;
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap()) // ok: test code
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["resource"], "cpu");
    assert_eq!(
        (lines[0]["old"].as_u64(), lines[0]["new"].as_u64()),
        (Some(500), Some(2000))
    );
    assert_eq!(lines[0]["t_ms"], 400);
    assert_eq!(lines[0]["reason"]["kind"], "cpu_severe_throttled");
    assert_eq!(lines[1]["resource"], "memory");
    // The ledger knows the grant.
    let f = Ledger::new(t.path().join("ledger")).read()?;
    assert_eq!(
        f.entries["ns/c"].granted,
        Res {
            cpu_m: 2000,
            mem: 128 << 20
        }
    );
    m.release();
    assert!(Ledger::new(t.path().join("ledger"))
        .read()?
        .entries
        .is_empty());
    Ok(())
}

#[test]
fn preemption_shrinks_on_the_next_round() -> TestResult {
    let t = tempfile::tempdir()?;
    let (io, cfg, sd) = setup(t.path());
    let cpu = io.cpu.clone();
    let acct = io.cpuacct.clone();
    let mut m = Monitor::new("ns/c".into(), Box::new(io), cfg.clone(), sd, Duration::ZERO)?;
    m.round(Duration::from_millis(200))?;
    fs::write(acct.join("cpuacct.usage"), "100000000")?;
    fs::write(cpu.join("cpu.stat"), "nr_periods 2\nnr_throttled 2\n")?;
    m.round(Duration::from_millis(400))?;
    assert_eq!(m.current().cpu.ok_or("unexpected None")?.value, 2000);
    // Another container is admitted needing 7000 of 8000 millicores.
    let ledger = Ledger::new(&cfg.node.ledger_dir);
    let cap = node_capacity(&cfg);
    let adm = ledger.transact(|f| {
        f.admit(
            "ns/new",
            std::process::id(),
            crate::ledger::process_start(std::process::id()).unwrap(), // ok: test code
            Res {
                cpu_m: 7000,
                mem: 0,
            },
            &cap,
            0,
        )
    })?;
    assert_eq!(adm.preempted.len(), 1);
    m.round(Duration::from_millis(600))?;
    assert_eq!(m.current().cpu.ok_or("unexpected None")?.value, 1000);
    assert_eq!(fs::read_to_string(cpu.join("cpu.cfs_quota_us"))?, "100000");
    Ok(())
}

#[test]
fn memory_preemption_never_goes_below_the_working_set() -> TestResult {
    let t = tempfile::tempdir()?;
    let (io, mut cfg, sd) = setup(t.path());
    cfg.node.memory_bytes = 1 << 30;
    cfg.node.reserve_fraction = 0.0;
    let mem = io.memory.clone();
    let mut m = Monitor::new("ns/c".into(), Box::new(io), cfg.clone(), sd, Duration::ZERO)?;
    // Working set 100 MiB of 64: emergency-free doubling twice -> 256 MiB.
    fs::write(
        mem.join("memory.usage_in_bytes"),
        (100u64 << 20).to_string(),
    )?;
    m.round(Duration::from_millis(200))?;
    m.round(Duration::from_millis(400))?;
    assert_eq!(m.current().mem.ok_or("unexpected None")?.value, 256 << 20);
    // An admission of 900 MiB on a 1 GiB node takes back 132 MiB of the 192 MiB gain.
    let ledger = Ledger::new(&cfg.node.ledger_dir);
    let cap = node_capacity(&cfg);
    let pid = std::process::id();
    let start = crate::ledger::process_start(pid).ok_or("unexpected None")?;
    ledger.transact(|f| {
        f.admit(
            "ns/new",
            pid,
            start,
            Res {
                cpu_m: 0,
                mem: 900 << 20,
            },
            &cap,
            0,
        )
    })?;
    assert_eq!(ledger.read()?.entries["ns/c"].granted.mem, 124 << 20);
    m.round(Duration::from_millis(600))?;
    // Shrinks to working set / 0.6 (~167 MiB), not to 124 MiB, and the ledger holds that.
    let v = m.current().mem.ok_or("unexpected None")?.value;
    assert_eq!(v, ((100u64 << 20) as f64 / 0.6) as u64);
    assert_eq!(
        fs::read_to_string(mem.join("memory.limit_in_bytes"))?,
        v.to_string()
    );
    assert_eq!(ledger.read()?.entries["ns/c"].granted.mem, v);
    // Stable afterwards: no further preemption or scale-up.
    m.round(Duration::from_millis(800))?;
    assert_eq!(m.current().mem.ok_or("unexpected None")?.value, v);
    Ok(())
}

/// A fake v2 cgroup directory: no CPU limit, memory.max 64 MiB.
fn v2_dir(t: &std::path::Path) -> std::path::PathBuf {
    let d = t.join("cg");
    fs::create_dir_all(&d).unwrap(); // ok: test code
    for (f, v) in [
        ("cpu.stat", "usage_usec 0\nnr_periods 0\nnr_throttled 0\n"),
        ("cpu.max", "max 100000\n"),
        ("memory.current", "1048576\n"),
        ("memory.stat", "inactive_file 0\n"),
        ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"),
        ("memory.max", "67108864\n"),
        ("memory.high", "max\n"),
    ] {
        fs::write(d.join(f), v).unwrap(); // ok: test code
    }
    d
}

#[test]
fn v2_sets_memory_high_and_scales_on_high_events() -> TestResult {
    let t = tempfile::tempdir()?;
    let d = v2_dir(t.path());
    let (_, mut cfg, sd) = setup(t.path());
    cfg.node.ledger_dir = t.path().join("ledger2");
    let io = crate::cgroup::v2::V2::new(d.clone());
    let mut m = Monitor::new("ns/v2".into(), Box::new(io), cfg, sd, Duration::ZERO)?;
    assert!(m.current().cpu.is_none(), "no CPU limit: not scaled");
    let high = |d: &std::path::Path| {
        fs::read_to_string(d.join("memory.high")).unwrap() // ok: test code
    };
    assert_eq!(high(&d), (((64u64 << 20) as f64 * 0.9) as u64).to_string());
    m.round(Duration::from_millis(200))?;
    // The kernel throttled at memory.high 3 times: pressure -> x2.
    fs::write(
        d.join("memory.events"),
        "low 0\nhigh 3\nmax 0\noom 0\noom_kill 0\n",
    )?;
    m.round(Duration::from_millis(400))?;
    assert_eq!(
        fs::read_to_string(d.join("memory.max"))?,
        (128u64 << 20).to_string()
    );
    assert_eq!(high(&d), (((128u64 << 20) as f64 * 0.9) as u64).to_string());
    m.release();
    Ok(())
}

#[test]
fn v2_kernel_oom_kill_is_attributed_to_the_top_tier_only_at_the_ceiling() -> TestResult {
    let t = tempfile::tempdir()?;
    let d = v2_dir(t.path());
    let (_, mut cfg, sd) = setup(t.path());
    cfg.node.ledger_dir = t.path().join("ledger3");
    cfg.memory.max_bytes = 128 << 20;
    let io = crate::cgroup::v2::V2::new(d.clone());
    let mut m = Monitor::new("ns/v2oom".into(), Box::new(io), cfg, sd, Duration::ZERO)?;
    let events = |oom: u32| format!("low 0\nhigh {oom}\nmax 0\noom {oom}\noom_kill {oom}\n");
    m.round(Duration::from_millis(200))?;
    // An OOM kill below the ceiling (64 of 128 MiB): the limit is raised (x4, clamped).
    fs::write(d.join("memory.events"), events(1))?;
    m.round(Duration::from_millis(400))?;
    assert_eq!(m.oom_total(), 1);
    assert_eq!(m.oom_at_max_reason(), None, "below the ceiling");
    assert_eq!(m.current().mem.ok_or("not tracked")?.value, 128 << 20);
    // At the ceiling the next kernel OOM kill is the top tier's.
    fs::write(d.join("memory.events"), events(2))?;
    assert!(m.final_oom_check(Duration::from_millis(600)));
    let r = m.oom_at_max_reason().ok_or("no top-tier reason")?;
    assert!(
        r.contains("out of memory at the maximum memory tier") && r.contains("134217728"),
        "{r}"
    );
    m.release();
    Ok(())
}
