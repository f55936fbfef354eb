#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn put(dir: &Path, name: &str, s: &str) {
    fs::create_dir_all(dir).unwrap(); // ok: test code
    fs::write(dir.join(name), s).unwrap(); // ok: test code
}

pub(crate) fn fake_v1(root: &Path) -> v1::V1 {
    let (cpu, acct, mem) = (root.join("cpu"), root.join("cpuacct"), root.join("memory"));
    put(&cpu, "cpu.cfs_quota_us", "50000\n");
    put(&cpu, "cpu.cfs_period_us", "100000\n");
    put(
        &cpu,
        "cpu.stat",
        "nr_periods 10\nnr_throttled 4\nthrottled_time 123\n",
    );
    put(&acct, "cpuacct.usage", "5000000\n");
    put(&mem, "memory.usage_in_bytes", "41943040\n");
    put(
        &mem,
        "memory.stat",
        "cache 0\ntotal_inactive_file 1048576\n",
    );
    put(&mem, "memory.failcnt", "3\n");
    put(
        &mem,
        "memory.oom_control",
        "oom_kill_disable 1\nunder_oom 1\noom_kill 2\n",
    );
    put(&mem, "memory.limit_in_bytes", "67108864\n");
    put(&mem, "memory.memsw.limit_in_bytes", "67108864\n");
    v1::V1::new(cpu, acct, mem)
}

#[test]
fn v1_reads_sample_and_limits() -> TestResult {
    let t = tempfile::tempdir()?;
    let io = fake_v1(t.path());
    let s = io.sample(Duration::from_millis(7))?;
    assert_eq!(s.at, Duration::from_millis(7));
    assert_eq!(
        (s.cpu_usage_ns, s.cpu_periods, s.cpu_throttled),
        (5_000_000, 10, 4)
    );
    assert_eq!((s.mem_usage, s.mem_working_set), (40 << 20, 39 << 20));
    assert_eq!(
        (s.mem_pressure_events, s.oom_events, s.under_oom),
        (3, 2, true)
    );
    let l = io.limits()?;
    assert_eq!(
        l.cpu,
        CpuMax {
            quota_us: Some(50_000),
            period_us: 100_000
        }
    );
    assert_eq!(l.cpu.millicores(), Some(500));
    assert_eq!((l.memory, l.memsw), (Some(64 << 20), Some(64 << 20)));
    Ok(())
}

#[test]
fn v1_unlimited_and_writes() -> TestResult {
    let t = tempfile::tempdir()?;
    let io = fake_v1(t.path());
    put(&io.cpu, "cpu.cfs_quota_us", "-1\n");
    put(&io.memory, "memory.limit_in_bytes", "9223372036854771712\n");
    let l = io.limits()?;
    assert_eq!((l.cpu.quota_us, l.memory), (None, None));
    io.write(&CgroupWrite::CpuMax(CpuMax {
        quota_us: Some(200_000),
        period_us: 100_000,
    }))?;
    io.write(&CgroupWrite::MemswLimit(1 << 30))?;
    io.write(&CgroupWrite::MemoryLimit(1 << 30))?;
    io.write(&CgroupWrite::OomKillDisable(false))?;
    assert_eq!(
        fs::read_to_string(io.cpu.join("cpu.cfs_quota_us"))?,
        "200000"
    );
    assert_eq!(
        fs::read_to_string(io.memory.join("memory.limit_in_bytes"))?,
        "1073741824"
    );
    assert_eq!(
        fs::read_to_string(io.memory.join("memory.memsw.limit_in_bytes"))?,
        "1073741824"
    );
    assert_eq!(
        fs::read_to_string(io.memory.join("memory.oom_control"))?,
        "0"
    );
    assert!(matches!(
        io.write(&CgroupWrite::MemoryHigh(1)),
        Err(CgroupError::Unsupported { .. })
    ));
    Ok(())
}

#[test]
fn v2_reads_and_writes() -> TestResult {
    let t = tempfile::tempdir()?;
    let d = t.path().to_path_buf();
    put(&d, "cpu.stat", "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\nnr_periods 7\nnr_throttled 1\nthrottled_usec 9\n");
    put(&d, "cpu.max", "max 100000\n");
    put(&d, "memory.current", "1048576\n");
    put(&d, "memory.stat", "anon 1\ninactive_file 4096\n");
    put(
        &d,
        "memory.events",
        "low 0\nhigh 2\nmax 3\noom 1\noom_kill 1\n",
    );
    put(
        &d,
        "memory.pressure",
        "some avg10=1.50 avg60=0 avg300=0 total=5\nfull avg10=0 avg60=0 avg300=0 total=0\n",
    );
    put(&d, "memory.max", "max\n");
    put(&d, "memory.high", "max\n");
    let io = v2::V2::new(d.clone());
    let s = io.sample(Duration::ZERO)?;
    assert_eq!(
        (s.cpu_usage_ns, s.cpu_periods, s.cpu_throttled),
        (2_500_000, 7, 1)
    );
    assert_eq!(
        (s.mem_usage, s.mem_working_set),
        (1 << 20, (1 << 20) - 4096)
    );
    assert_eq!((s.mem_pressure_events, s.oom_events), (5, 1));
    assert_eq!(s.mem_psi_some_avg10, Some(1.5));
    let l = io.limits()?;
    assert_eq!(
        (l.cpu.quota_us, l.cpu.period_us, l.memory, l.memory_high),
        (None, 100_000, None, None)
    );
    io.write(&CgroupWrite::CpuMax(CpuMax {
        quota_us: Some(50_000),
        period_us: 100_000,
    }))?;
    io.write(&CgroupWrite::MemoryLimit(64 << 20))?;
    io.write(&CgroupWrite::MemoryHigh(60 << 20))?;
    assert_eq!(fs::read_to_string(d.join("cpu.max"))?, "50000 100000");
    let l = io.limits()?;
    assert_eq!(
        (l.cpu.millicores(), l.memory, l.memory_high),
        (Some(500), Some(64 << 20), Some(60 << 20))
    );
    assert!(io.write(&CgroupWrite::MemswLimit(1)).is_err());
    Ok(())
}

const MOUNTINFO: &str = "\
25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 31 0:30 / /sys/fs/cgroup/cpu rw shared:14 - cgroup cgroup rw,cpu
36 31 0:31 / /sys/fs/cgroup/cpuacct rw shared:15 - cgroup cgroup rw,cpuacct
37 31 0:32 / /sys/fs/cgroup/memory rw shared:16 - cgroup cgroup rw,memory
";

#[test]
fn detect_prefers_v1_memory_and_falls_back_to_unified() -> TestResult {
    let pc = "4:memory:/t/s2\n2:cpuacct:/t/s2\n1:cpu:/t/s2\n0::/t/s2\n";
    assert_eq!(
        detect(1, pc, MOUNTINFO)?,
        CgroupPaths::V1 {
            cpu: "/sys/fs/cgroup/cpu/t/s2".into(),
            cpuacct: "/sys/fs/cgroup/cpuacct/t/s2".into(),
            memory: "/sys/fs/cgroup/memory/t/s2".into(),
        }
    );
    assert_eq!(
        detect(1, "0::/k/c\n", MOUNTINFO)?,
        CgroupPaths::V2 {
            dir: "/sys/fs/cgroup/unified/k/c".into()
        }
    );
    let combined = "35 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n37 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    let p = detect(1, "3:memory:/a\n2:cpu,cpuacct:/a\n", combined)?;
    assert!(
        matches!(p, CgroupPaths::V1 { ref cpu, .. } if cpu == Path::new("/sys/fs/cgroup/cpu,cpuacct/a"))
    );
    assert!(detect(1, "1:name=systemd:/\n", "").is_err());
    Ok(())
}

#[test]
fn stats_extra_reads_what_each_version_offers() -> TestResult {
    let t = tempfile::tempdir()?;
    let io = fake_v1(t.path());
    // Without kmem, memsw usage, procs and tasks: only the OOM kills.
    assert_eq!(
        io.stats_extra(),
        StatsExtra {
            oom_kills: Some(2),
            ..Default::default()
        }
    );
    let mem = t.path().join("memory");
    put(&mem, "memory.kmem.usage_in_bytes", "4096\n");
    put(&mem, "memory.memsw.usage_in_bytes", "41947136\n");
    put(&mem, "cgroup.procs", "10\n11\n");
    put(&mem, "tasks", "10\n11\n12\n");
    assert_eq!(
        io.stats_extra(),
        StatsExtra {
            kernel_bytes: Some(4096),
            swap_bytes: Some(4096),
            oom_kills: Some(2),
            processes: Some(2),
            threads: Some(3),
        }
    );

    let d = t.path().join("v2");
    put(&d, "memory.stat", "anon 1\nkernel_stack 16384\n");
    put(&d, "memory.swap.current", "0\n");
    put(
        &d,
        "memory.events",
        "low 0\nhigh 2\nmax 3\noom 1\noom_kill 1\n",
    );
    put(&d, "cgroup.procs", "7\n");
    put(&d, "cgroup.threads", "7\n8\n");
    let io = v2::V2::new(d.clone());
    assert_eq!(
        io.stats_extra(),
        StatsExtra {
            kernel_bytes: Some(16384),
            swap_bytes: Some(0),
            oom_kills: Some(1),
            processes: Some(1),
            threads: Some(2),
        }
    );
    // `kernel` (newer kernels) wins over `kernel_stack`.
    put(&d, "memory.stat", "kernel 65536\nkernel_stack 16384\n");
    assert_eq!(io.stats_extra().kernel_bytes, Some(65536));
    Ok(())
}
