//! Cost of one elastic monitoring round per container over real cgroup files.
//!
//! Creates a cgroup (v1 `cpu`, `cpuacct`, `memory` when the memory controller is on v1,
//! else a cgroup2 child), moves a `sleep` into it, then times `CgroupIo::sample` and a
//! full `Monitor::round` (sample + ledger check + decide; no change is applied because the
//! sleeper is idle). Prints µs per round; the target is ≤ 50 µs.
//!
//! Two references measured the same way in the same run, so that machines of different
//! speed (this host, the emulated cgroup v2 VM of `scripts/vm-shim-tests.sh`) compare as
//! ratios: `file read` (open + read + close of `/proc/self/stat`: the kernel path a sample
//! is made of) and `compute` (10,000 rounds of xorshift64 in user space).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use weenv_shim::cgroup;
use weenv_shim::config::ShimConfig;
use weenv_shim::monitor::Monitor;
use weenv_shim::status::StatusDir;

struct Cgroup {
    dirs: Vec<PathBuf>,
    child: std::process::Child,
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn make_cgroup(name: &str) -> Cgroup {
    let child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists();
    let mut dirs = vec![];
    if v1 {
        for c in ["cpu", "cpuacct", "memory"] {
            let d = PathBuf::from(format!("/sys/fs/cgroup/{c}/{name}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup.procs"), &pid).unwrap();
            dirs.push(d);
        }
        std::fs::write(dirs[0].join("cpu.cfs_quota_us"), "50000").unwrap();
        std::fs::write(
            dirs[2].join("memory.limit_in_bytes"),
            (64u64 << 20).to_string(),
        )
        .unwrap();
    } else {
        let d = PathBuf::from(format!("/sys/fs/cgroup/{name}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup.procs"), &pid).unwrap();
        std::fs::write(d.join("cpu.max"), "50000 100000").unwrap();
        std::fs::write(d.join("memory.max"), (64u64 << 20).to_string()).unwrap();
        dirs.push(d);
    }
    Cgroup { dirs, child }
}

#[test]
#[ignore = "needs root and cgroups"]
fn monitoring_cost_per_round() {
    let name = format!("weenv-cost-{}", std::process::id());
    let cg = make_cgroup(&name);
    let io = cgroup::open(cg.child.id() as i32).unwrap();
    let version = io.version();
    // 10 batches; the machine is shared, so report the fastest and the median batch.
    let (batches, n) = (10, 2_000u32);
    let mut sample_us = vec![];
    for _ in 0..batches {
        let t = Instant::now();
        for i in 0..n {
            std::hint::black_box(io.sample(Duration::from_micros(i as u64)).unwrap());
        }
        sample_us.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }

    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = ShimConfig::default();
    cfg.node.ledger_dir = tmp.path().join("ledger");
    cfg.monitor.status_dir = tmp.path().join("status");
    let sd = StatusDir::new(&cfg.monitor.status_dir, "bench", &name);
    let io = cgroup::open(cg.child.id() as i32).unwrap();
    let mut m = Monitor::new(format!("bench/{name}"), io, cfg, sd, Duration::ZERO).unwrap();
    assert!(m.is_elastic());
    // Rounds 200 ms apart in monitor time (the clock is passed in), run back to back.
    let mut round_us = vec![];
    let mut k = 0u64;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..n {
            k += 1;
            m.round(Duration::from_millis(200 * k)).unwrap();
        }
        round_us.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    m.release();
    let mut read_us = vec![];
    let mut compute_us = vec![];
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(std::fs::read("/proc/self/stat").unwrap());
        }
        read_us.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        let t = Instant::now();
        for i in 0..n {
            let mut x = std::hint::black_box(0x9e37_79b9_7f4a_7c15u64 ^ i as u64);
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            std::hint::black_box(x);
        }
        compute_us.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    };
    let (smin, smed) = stats(&mut sample_us);
    let (rmin, rmed) = stats(&mut round_us);
    let (_, fmed) = stats(&mut read_us);
    let (_, cmed) = stats(&mut compute_us);
    println!(
        "cgroup {}: sample min {smin:.1} / median {smed:.1} µs; full round (sample + ledger check + decide) min {rmin:.1} / median {rmed:.1} µs per container",
        version.as_str()
    );
    println!(
        "references (medians, same run): file read {fmed:.2} µs, compute {cmed:.1} µs; \
         sample = {:.1} file reads = {:.2} computes; round = {:.1} file reads = {:.2} computes",
        smed / fmed,
        smed / cmed,
        rmed / fmed,
        rmed / cmed
    );
    assert_eq!(
        m.current().cpu.unwrap().value,
        500,
        "an idle sleeper must not be scaled"
    );
}
