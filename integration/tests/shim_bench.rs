//! Benchmark (ignored test, prints a table): a bursty workload's completion time under
//! elastic provisioning vs a fixed small CPU quota vs no quota.
//!
//! Workload: three bursts (two busy threads each, `WEENV_BENCH_ITERS` iterations per
//! thread, default 400000) separated by 1 s idle. Quotas: elastic starts at
//! `WEENV_BENCH_CPUS` cores (default 0.5), fixed keeps that quota (`io.weenv.elastic=false`),
//! unlimited has no quota.
//! `WEENV_BENCH_RUNS` runs per mode (default 3), interleaved; medians and ratios printed.
//! Run: `integration/bench/shim_elastic.sh` (sets `WEENV_BENCH=1`). Without it (CI) one
//! short run per mode only checks that every run succeeds and only the elastic one scaled.

mod shim_common;

use std::time::Instant;

use anyhow::{ensure, Result};
use shim_common::{burst_script, code, ShimEnv};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "needs root, containerd, runc, umoci; benchmark"]
fn bursty_workload_elastic_vs_fixed_vs_unlimited() -> Result<()> {
    let env = ShimEnv::start("bench")?;
    // Full benchmark with WEENV_BENCH=1 (integration/bench/shim_elastic.sh); otherwise (CI)
    // one short run per mode that checks the runs succeed and only elastic scaled.
    let full = std::env::var_os("WEENV_BENCH").is_some();
    let env_num = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let iters = env_num("WEENV_BENCH_ITERS", if full { 400_000 } else { 100_000 });
    let runs = env_num("WEENV_BENCH_RUNS", if full { 3 } else { 1 }) as usize;
    let cpus: String = std::env::var("WEENV_BENCH_CPUS").unwrap_or_else(|_| "0.5".into());
    let cpus_flag = format!("--cpus={cpus}");
    let b = burst_script(iters);
    let script = format!("{b}; sleep 1; {b}; sleep 1; {b}");
    let elastic_name = format!("elastic (start {cpus} core)");
    let fixed_name = format!("fixed {cpus} core");
    let modes: [(&str, Vec<&str>); 3] = [
        (&elastic_name, vec!["--rm", &cpus_flag]),
        (
            &fixed_name,
            vec!["--rm", &cpus_flag, "--annotation=io.weenv.elastic=false"],
        ),
        ("unlimited", vec!["--rm"]),
    ];
    let mut times: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    for r in 0..runs {
        for (i, (_, flags)) in modes.iter().enumerate() {
            let id = format!("bench-{i}-{r}");
            let t = Instant::now();
            let o = env.run(&id, flags, &["/bin/sh", "-c", &script])?;
            times[i].push(t.elapsed().as_secs_f64());
            ensure!(
                code(&o) == 0,
                "{id} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let scaled = env.changes(&id)?.iter().any(|c| c["resource"] == "cpu");
            ensure!(
                scaled == (i == 0),
                "{id}: CPU quota changes recorded: {scaled}"
            );
        }
    }
    let med: Vec<f64> = times.iter_mut().map(|v| median(v)).collect();
    println!("\nbursty workload: 3 bursts x 2 threads x {iters} iterations, 1 s idle between; {runs} runs per mode");
    println!("{:<26} {:>10} {:>22}", "mode", "median s", "runs s");
    for (i, (name, _)) in modes.iter().enumerate() {
        let runs: Vec<String> = times[i].iter().map(|t| format!("{t:.2}")).collect();
        println!("{:<26} {:>10.2} {:>22}", name, med[i], runs.join(" "));
    }
    println!(
        "fixed / elastic     = {:.2}x  (elastic is this much faster than the fixed small quota)",
        med[1] / med[0]
    );
    println!("elastic / unlimited = {:.2}x", med[0] / med[2]);
    Ok(())
}
