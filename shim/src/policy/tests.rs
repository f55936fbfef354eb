#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;
use proptest::prelude::*;

const MS: u64 = 200;

fn at(i: u64) -> Duration {
    Duration::from_millis(i * MS)
}

fn tracked(value: u64, initial: u64, ceiling: u64) -> Tracked {
    Tracked {
        value,
        initial,
        ceiling,
        changed_at: Duration::ZERO,
    }
}

/// A simple kernel model: demand `d` millicores against quota `q` over one interval.
fn cpu_step(prev: &Sample, i: u64, demand_m: u64, quota_m: u64) -> Sample {
    let dt_ns = MS * 1_000_000;
    let used_m = demand_m.min(quota_m);
    let periods = 2; // 100 ms periods in a 200 ms interval
    let throttled = if demand_m > quota_m { periods } else { 0 };
    Sample {
        at: at(i),
        cpu_usage_ns: prev.cpu_usage_ns + dt_ns * used_m / 1000,
        cpu_periods: prev.cpu_periods + periods,
        cpu_throttled: prev.cpu_throttled + throttled,
        ..*prev
    }
}

fn mem_step(prev: &Sample, i: u64, ws: u64, limit: u64) -> Sample {
    Sample {
        at: at(i),
        mem_usage: ws.min(limit),
        mem_working_set: ws.min(limit),
        under_oom: ws > limit,
        ..*prev
    }
}

#[test]
fn cpu_scale_up_reacts_to_a_single_sample() -> TestResult {
    let t = tracked(500, 500, 64_000);
    let s0 = Sample::default();
    let s1 = cpu_step(&s0, 1, 500, 500); // 100% of 0.5 core, not throttled
    let cur = Current {
        cpu: Some(t),
        ..Default::default()
    };
    let d = decide(&[s0, s1], at(1), &cur, &Policy::default());
    let c = d.cpu.ok_or("scale-up after one interval")?;
    assert_eq!((c.old, c.new), (500, 1000));
    assert!(matches!(c.reason, Reason::CpuUtilisation { .. }));
    Ok(())
}

#[test]
fn severe_throttling_quadruples() -> TestResult {
    let t = tracked(500, 500, 64_000);
    let s0 = Sample::default();
    let s1 = cpu_step(&s0, 1, 2000, 500);
    let cur = Current {
        cpu: Some(t),
        ..Default::default()
    };
    let c = decide(&[s0, s1], at(1), &cur, &Policy::default())
        .cpu
        .ok_or("unexpected None")?;
    assert_eq!(c.new, 2000);
    assert!(matches!(c.reason, Reason::CpuSevereThrottled { .. }));
    Ok(())
}

#[test]
fn cpu_scale_down_needs_the_full_quiet_window() -> TestResult {
    let p = Policy::default();
    let t = tracked(2000, 500, 64_000);
    let cur = Current {
        cpu: Some(t),
        ..Default::default()
    };
    let mut v = vec![Sample::default()];
    // 10 s of idle = 50 intervals; before the window is full nothing happens.
    for i in 1..=50 {
        let s = cpu_step(v.last().ok_or("unexpected None")?, i, 100, 2000);
        v.push(s);
        let d = decide(&v, at(i), &cur, &p);
        if i < 50 {
            assert_eq!(d.cpu, None, "scaled down after only {} ms", i * MS);
        } else {
            let c = d.cpu.ok_or("halve after the quiet window")?;
            assert_eq!((c.old, c.new, c.reason), (2000, 1000, Reason::CpuIdle));
        }
    }
    // One busy interval inside the window blocks it.
    let mut v2 = vec![Sample::default()];
    for i in 1..=50 {
        let demand = if i == 30 { 1500 } else { 100 };
        let s = cpu_step(v2.last().ok_or("unexpected None")?, i, demand, 2000);
        v2.push(s);
    }
    let cur2 = Current {
        cpu: Some(Tracked {
            changed_at: at(0),
            ..t
        }),
        ..Default::default()
    };
    let d = decide(
        &v2,
        at(50),
        &cur2,
        &Policy {
            cpu: CpuPolicy {
                scale_up_utilisation: 0.99,
                ..p.cpu.clone()
            },
            ..p.clone()
        },
    );
    assert_eq!(d.cpu, None);
    Ok(())
}

#[test]
fn memory_scale_down_needs_sixty_seconds() -> TestResult {
    let p = Policy::default();
    let t = tracked(1 << 30, 64 << 20, 32 << 30);
    let cur = Current {
        mem: Some(t),
        ..Default::default()
    };
    let mut v = vec![Sample::default()];
    for i in 1..=300 {
        let s = mem_step(v.last().ok_or("unexpected None")?, i, 10 << 20, 1 << 30);
        v.push(s);
        let d = decide(&v, at(i), &cur, &p);
        if i < 300 {
            assert_eq!(d.mem, None, "at {i}");
        } else {
            assert_eq!(d.mem.ok_or("unexpected None")?.new, 512 << 20);
        }
    }
    Ok(())
}

#[test]
fn oom_emergency_quadruples_then_terminates_at_ceiling() -> TestResult {
    let p = Policy::default();
    let s0 = Sample::default();
    let s1 = mem_step(&s0, 1, 200 << 20, 64 << 20);
    let cur = Current {
        mem: Some(tracked(64 << 20, 64 << 20, 1 << 30)),
        ..Default::default()
    };
    let d = decide(&[s0, s1], at(1), &cur, &p);
    assert_eq!(d.mem.ok_or("unexpected None")?.new, 256 << 20);
    assert!(d.terminate.is_none());
    // At the ceiling: the emergency starts a grace period, then terminates.
    let cur = Current {
        mem: Some(tracked(128 << 20, 64 << 20, 128 << 20)),
        ..Default::default()
    };
    let s1 = mem_step(&s0, 1, 1 << 30, 128 << 20);
    let d = decide(&[s0, s1], at(1), &cur, &p);
    assert_eq!(
        (d.mem.clone(), d.oom_at_ceiling_since, d.terminate.clone()),
        (None, Some(at(1)), None)
    );
    let cur = Current {
        oom_at_ceiling_since: d.oom_at_ceiling_since,
        ..cur
    };
    let s6 = mem_step(&s1, 6, 1 << 30, 128 << 20);
    let d = decide(&[s1, s6], at(6), &cur, &p);
    assert!(d
        .terminate
        .ok_or("unexpected None")?
        .contains("out of memory at the maximum"));
    Ok(())
}

/// cgroup v2 at the ceiling: no freeze, `memory.high` throttles. A working set at the
/// throttle line with new `high` events (or PSI) is the emergency; file cache reclaim below
/// the line, or pressure below the ceiling, is not.
#[test]
fn pressure_at_the_throttle_line_of_the_ceiling_is_an_oom_emergency() -> TestResult {
    let p = Policy::default();
    let limit = 128u64 << 20;
    let at_ceiling = Current {
        mem: Some(tracked(limit, 64 << 20, limit)),
        ..Default::default()
    };
    let v2 = |i: u64, ws: u64, high_events: u64, psi: f64| Sample {
        at: at(i),
        mem_usage: ws,
        mem_working_set: ws,
        mem_pressure_events: high_events,
        mem_psi_some_avg10: Some(psi),
        ..Default::default()
    };
    let line = (limit as f64 * 0.95) as u64;
    // Throttled at the line: new high events -> grace starts, then terminate.
    let d = decide(
        &[v2(0, line, 0, 0.0), v2(1, line, 4, 0.0)],
        at(1),
        &at_ceiling,
        &p,
    );
    assert_eq!((d.mem.clone(), d.oom_at_ceiling_since), (None, Some(at(1))));
    let cur = Current {
        oom_at_ceiling_since: d.oom_at_ceiling_since,
        ..at_ceiling
    };
    // A sample without new events while the task sleeps in the kernel's penalty: PSI
    // keeps the emergency.
    let d = decide(
        &[v2(1, line, 4, 0.0), v2(6, line, 4, 35.0)],
        at(6),
        &cur,
        &p,
    );
    let reason = d.terminate.ok_or("no termination after the grace")?;
    assert!(reason.contains("out of memory at the maximum"), "{reason}");
    // Reclaim of a page cache below the line is no emergency.
    let low = limit / 2;
    let d = decide(
        &[v2(0, low, 0, 0.0), v2(1, low, 9, 0.0)],
        at(1),
        &at_ceiling,
        &p,
    );
    assert_eq!((d.oom_at_ceiling_since, d.terminate), (None, None));
    // Below the ceiling the same pressure raises the limit (x2: not an emergency).
    let below = Current {
        mem: Some(tracked(limit, 64 << 20, 1 << 30)),
        ..Default::default()
    };
    let d = decide(
        &[v2(0, line, 0, 0.0), v2(1, line, 4, 0.0)],
        at(1),
        &below,
        &p,
    );
    assert_eq!(d.mem.ok_or("no raise")?.new, 256 << 20);
    assert_eq!(d.oom_at_ceiling_since, None);
    Ok(())
}

/// Runs the policy in a loop against a model workload; returns the quota history.
fn simulate(
    cpu_demand: &[u64],
    mem_ws: &[u64],
    init_cpu: u64,
    max_cpu: u64,
    init_mem: u64,
    max_mem: u64,
) -> (Vec<u64>, Vec<u64>) {
    let p = Policy::default();
    let mut cur = Current {
        cpu: Some(tracked(init_cpu, init_cpu, max_cpu)),
        mem: Some(tracked(init_mem, init_mem, max_mem)),
        oom_at_ceiling_since: None,
    };
    let mut samples = vec![Sample::default()];
    let (mut hc, mut hm) = (vec![], vec![]);
    for i in 1..=cpu_demand.len() as u64 {
        let q = cur.cpu.unwrap().value; // ok: test code
        let l = cur.mem.unwrap().value; // ok: test code
        let last = samples.last().unwrap(); // ok: test code
        let s = cpu_step(last, i, cpu_demand[i as usize - 1], q);
        let s = mem_step(&s, i, mem_ws[i as usize - 1], l);
        samples.push(s);
        let d = decide(&samples, at(i), &cur, &p);
        cur.oom_at_ceiling_since = d.oom_at_ceiling_since;
        if let (Some(c), Some(t)) = (d.cpu, cur.cpu.as_mut()) {
            t.value = c.new;
            t.changed_at = at(i);
        }
        if let (Some(c), Some(t)) = (d.mem, cur.mem.as_mut()) {
            t.value = c.new;
            t.changed_at = at(i);
        }
        hc.push(cur.cpu.unwrap().value); // ok: test code
        hm.push(cur.mem.unwrap().value); // ok: test code
    }
    (hc, hm)
}

fn reversals(h: &[u64]) -> usize {
    let dirs: Vec<i8> = h
        .windows(2)
        .filter(|w| w[0] != w[1])
        .map(|w| if w[1] > w[0] { 1 } else { -1 })
        .collect();
    dirs.windows(2).filter(|d| d[0] != d[1]).count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn quota_stays_within_initial_and_max(
        demands in proptest::collection::vec(0u64..100_000, 1..400),
        ws in proptest::collection::vec(0u64..(64u64 << 30), 1..400),
        init_cpu in 100u64..4000, init_mem in (16u64 << 20)..(1u64 << 30),
    ) {
        let n = demands.len().min(ws.len());
        let (hc, hm) = simulate(&demands[..n], &ws[..n], init_cpu, 8000, init_mem, 4 << 30);
        for q in hc { prop_assert!(q >= init_cpu && q <= 8000.max(init_cpu), "cpu {}", q); }
        for l in hm { prop_assert!(l >= init_mem && l <= (4u64 << 30).max(init_mem), "mem {}", l); }
    }

    #[test]
    fn no_oscillation_under_steady_load(demand in 0u64..16_000, ws in (1u64 << 20)..(8u64 << 30), init_cpu in 250u64..2000) {
        let steps = 600; // 120 s
        let (hc, hm) = simulate(&vec![demand; steps], &vec![ws; steps], init_cpu, 64_000, 64 << 20, 32 << 30);
        prop_assert!(reversals(&hc) <= 1, "cpu history oscillates: {:?}", hc);
        prop_assert!(reversals(&hm) <= 1, "mem history oscillates: {:?}", hm);
        // Settled: no change in the last 45 s.
        prop_assert!(hc[steps - 225..].windows(2).all(|w| w[0] == w[1]));
    }
}
