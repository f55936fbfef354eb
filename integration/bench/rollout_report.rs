//! Report of the rollout benchmark (issue 12): reads the rows `integration/bench/rollout.sh`
//! writes and produces the markdown report and the PNG figures (plotters).
//!
//! ```sh
//! cargo run -p weenv-integration --example rollout_report -- DIR
//! ```
//! DIR holds `envs.tsv` (one row per environment: mode, iter, env, task, harness, init_s,
//! task_s, reward, expected, fetched_bytes (on demand + start-up prefetch), fill_bytes
//! (background fill), read_bytes; `NA` where not measured),
//! `iterations.tsv` (mode, iter, wall_s, link_bytes, registry_bytes), `meta.tsv` (key, value:
//! the run's settings, load average, command) and optionally `table1.md` (Table 1 from the
//! workload builder). Writes DIR/report.md, DIR/init_cdf.png (Fig. 10a), DIR/iterations.png
//! (Fig. 10b) and DIR/bytes.png (bytes fetched vs bytes read per environment, cold iteration).
//! Exits 1 when an environment's reward differs from its expected reward.

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

#[path = "plot_util.rs"]
mod plot_util;

/// Modes in report order, with their long names.
const MODES: [(&str, &str); 7] = [
    ("bundles", "static bundles, overlayfs full pull"),
    ("bundles-lazy", "static bundles, lazy via weenv"),
    ("dynamic", "dynamic assembly (pip at init over the link)"),
    ("plans", "composed plans via weenv"),
    (
        "plans-profile",
        "composed plans via weenv + start-up profiles",
    ),
    ("plans-fixed", "composed plans, weenv shim, fixed quota"),
    ("plans-elastic", "composed plans, weenv shim, elastic quota"),
];

/// The composed-plan modes the targets are checked for.
const PLAN_MODES: [&str; 2] = ["plans", "plans-profile"];

/// Registry bytes per environment at most this many times the bytes it read.
const BYTES_RATIO_MAX: f64 = 1.5;

fn label(mode: &str) -> &str {
    MODES
        .iter()
        .find(|(m, _)| *m == mode)
        .map_or(mode, |(_, l)| l)
}

/// One environment of one iteration.
#[derive(Clone, Debug, PartialEq)]
struct Env {
    mode: String,
    iter: u32,
    env: u32,
    task: String,
    harness: String,
    init_s: Option<f64>,
    task_s: Option<f64>,
    reward: String,
    expected: String,
    /// Registry bytes fetched on demand or by the start-up prefetch.
    fetched: Option<u64>,
    /// Registry bytes the background fill fetched.
    fill: Option<u64>,
    read: Option<u64>,
}

/// One iteration of one mode.
#[derive(Clone, Debug, PartialEq)]
struct Iter {
    mode: String,
    iter: u32,
    wall_s: f64,
    link_bytes: u64,
    registry_bytes: Option<u64>,
}

fn opt<T: std::str::FromStr>(s: &str) -> Result<Option<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match s {
        "NA" | "" => Ok(None),
        v => Ok(Some(v.parse()?)),
    }
}

/// The data rows of a TSV with a header line of `cols` columns.
fn rows(text: &str, cols: usize) -> Result<Vec<Vec<&str>>> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() != cols {
                bail!("row {}: {} columns, want {cols}: {l:?}", i + 2, f.len());
            }
            Ok(f)
        })
        .collect()
}

fn parse_envs(text: &str) -> Result<Vec<Env>> {
    rows(text, 12)?
        .into_iter()
        .map(|f| {
            Ok(Env {
                mode: f[0].into(),
                iter: f[1].parse()?,
                env: f[2].parse()?,
                task: f[3].into(),
                harness: f[4].into(),
                init_s: opt(f[5])?,
                task_s: opt(f[6])?,
                reward: f[7].into(),
                expected: f[8].into(),
                fetched: opt(f[9])?,
                fill: opt(f[10])?,
                read: opt(f[11])?,
            })
        })
        .collect()
}

fn parse_iters(text: &str) -> Result<Vec<Iter>> {
    rows(text, 5)?
        .into_iter()
        .map(|f| {
            Ok(Iter {
                mode: f[0].into(),
                iter: f[1].parse()?,
                wall_s: f[2].parse()?,
                link_bytes: f[3].parse()?,
                registry_bytes: opt(f[4])?,
            })
        })
        .collect()
}

/// The `q` quantile (0..=1) of `v`, nearest rank; the median is the midpoint of the two middle
/// values of an even count. None when empty.
fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    if q == 0.5 {
        let n = s.len();
        return Some(if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        });
    }
    let rank = (q * s.len() as f64).ceil().max(1.0) as usize;
    Some(s[rank.min(s.len()) - 1])
}

fn median(v: &[f64]) -> Option<f64> {
    quantile(v, 0.5)
}

/// Empirical CDF: sorted values with the fraction of values ≤ each.
fn cdf(v: &[f64]) -> Vec<(f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    s.into_iter()
        .enumerate()
        .map(|(i, x)| (x, (i + 1) as f64 / n))
        .collect()
}

/// A target of the issue and whether the run meets it.
#[derive(Clone, Debug, PartialEq)]
struct Target {
    what: String,
    measured: String,
    met: Option<bool>,
}

/// `base / fast` ≥ `min` (a speed-up), None when a side was not measured.
fn speedup(base: Option<f64>, fast: Option<f64>, min: f64) -> (Option<f64>, Option<bool>) {
    match (base, fast) {
        (Some(b), Some(f)) if f > 0.0 => (Some(b / f), Some(b / f >= min)),
        _ => (None, None),
    }
}

fn inits(envs: &[Env], mode: &str) -> Vec<f64> {
    envs.iter()
        .filter(|e| e.mode == mode)
        .filter_map(|e| e.init_s)
        .collect()
}

fn wall(iters: &[Iter], mode: &str, iter: u32) -> Option<f64> {
    iters
        .iter()
        .find(|i| i.mode == mode && i.iter == iter)
        .map(|i| i.wall_s)
}

fn rewards_ok(envs: &[Env]) -> bool {
    envs.iter().all(|e| e.reward == e.expected)
}

/// Cold-iteration environments of `mode` with both byte counts, and the largest
/// fetched / read ratio among them.
fn bytes_ratio(envs: &[Env], mode: &str) -> Option<(usize, f64)> {
    let r: Vec<f64> = envs
        .iter()
        .filter(|e| e.mode == mode && e.iter == 1)
        .filter_map(|e| match (e.fetched, e.read) {
            (Some(f), Some(r)) if r > 0 => Some(f as f64 / r as f64),
            _ => None,
        })
        .collect();
    (!r.is_empty()).then(|| (r.len(), r.iter().copied().fold(0.0, f64::max)))
}

fn targets(envs: &[Env], iters: &[Iter]) -> Vec<Target> {
    let fmt = |x: Option<f64>| x.map_or("not measured".to_string(), |x| format!("{x:.1}×"));
    let mut t = Vec::new();
    for p in PLAN_MODES {
        if inits(envs, p).is_empty() {
            continue;
        }
        let med = median(&inits(envs, p));
        let cold = |m: &str| -> Vec<f64> {
            envs.iter()
                .filter(|e| e.mode == m && e.iter == 1)
                .filter_map(|e| e.init_s)
                .collect()
        };
        for (base, min) in [("bundles", 10.0), ("dynamic", 3.0)] {
            let (x, met) = speedup(median(&inits(envs, base)), med, min);
            let (xc, _) = speedup(median(&cold(base)), median(&cold(p)), min);
            t.push(Target {
                what: format!(
                    "median init (all iterations): {} ≥ {min}× faster than {}",
                    label(p),
                    label(base)
                ),
                measured: match xc {
                    Some(c) if x.is_some() => format!("{} (cold iteration alone: {c:.1}×)", fmt(x)),
                    _ => fmt(x),
                },
                met,
            });
        }
        let (x, met) = speedup(wall(iters, "bundles", 1), wall(iters, p, 1), 2.0);
        t.push(Target {
            what: format!(
                "cold iteration: {} ≥ 2× faster than {}",
                label(p),
                label("bundles")
            ),
            measured: fmt(x),
            met,
        });
        let b = bytes_ratio(envs, p);
        t.push(Target {
            what: format!(
                "registry bytes per environment (on demand + start-up prefetch) ≤ {BYTES_RATIO_MAX}× the bytes it read ({}, cold iteration)",
                label(p)
            ),
            measured: b.map_or("not measured".into(), |(n, m)| {
                format!("largest {m:.2}× over {n} environments")
            }),
            met: b.map(|(_, m)| m <= BYTES_RATIO_MAX),
        });
    }
    let bad = envs.iter().filter(|e| e.reward != e.expected).count();
    t.push(Target {
        what: "every environment's reward is the task's expected reward, in every mode".into(),
        measured: format!("{}/{} as expected", envs.len() - bad, envs.len()),
        met: Some(bad == 0 && !envs.is_empty()),
    });
    t
}

/// Modes present in the rows, in report order (unknown modes last, by name).
fn modes_of(envs: &[Env]) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for (m, _) in MODES {
        if envs.iter().any(|e| e.mode == m) {
            seen.push(m.into());
        }
    }
    let mut rest: Vec<String> = envs
        .iter()
        .map(|e| e.mode.clone())
        .filter(|m| !MODES.iter().any(|(k, _)| k == m))
        .collect();
    rest.sort();
    rest.dedup();
    seen.extend(rest);
    seen
}

fn mb(b: f64) -> f64 {
    b / 1e6
}

fn f2(x: Option<f64>) -> String {
    x.map_or("–".into(), |x| format!("{x:.2}"))
}

fn report(
    envs: &[Env],
    iters: &[Iter],
    meta: &BTreeMap<String, String>,
    table1: Option<&str>,
) -> String {
    let m = |k: &str| meta.get(k).map_or("?", String::as_str);
    let n_iter = iters.iter().map(|i| i.iter).max().unwrap_or(0);
    let mut s = String::new();
    let _ = writeln!(s, "# Rollout benchmark\n");
    let _ = writeln!(
        s,
        "B = {} environments started at once per iteration, {} iterations (the first cold: fresh \
         containerd and snapshotter, empty caches), registry behind a {} HTB-shaped link + {} ms, \
         {} cores, {} binaries. Run {}; load average before: {}; after: {}.\n",
        m("B"),
        m("ITERS"),
        m("RATE"),
        m("LATENCY_MS"),
        m("cores"),
        m("bins"),
        m("date"),
        m("uptime_before"),
        m("uptime_after"),
    );
    let _ = writeln!(s, "Command: `{}`\n", m("command"));
    let _ = writeln!(
        s,
        "Init latency: request → the agent's first instruction (`AGENT_START`); task: \
         `AGENT_START` → exit. MB fetched + fill / read per environment: the registry \
         (compressed) bytes of the frames of its image's layers fetched in the cold iteration on \
         demand or by the start-up prefetch, + those the background fill fetched (the rest of \
         each layer, for later starts), and the file bytes read from them (chunk granularity); \
         each layer shared equally among the iteration's environments that use it (daemon \
         `/status` per layer; weenv modes only). MB on the link: everything the registry side \
         sent in the cold iteration (`rx` of the shaped veth, all environments).\n"
    );
    let mut h = String::from(
        "| mode | init median (s) | init p90 (s) | init median, cold (s) | task median (s) |",
    );
    let mut sep = String::from("|---|---:|---:|---:|---:|");
    for i in 1..=n_iter {
        let _ = write!(h, " iteration {i} (s) |");
        sep.push_str("---:|");
    }
    h.push_str(" MB on the link, cold | MB fetched + fill / read per env, cold (median) | rewards as expected |");
    sep.push_str("---:|---:|---:|");
    let _ = writeln!(s, "{h}\n{sep}");
    for mode in modes_of(envs) {
        let e: Vec<&Env> = envs.iter().filter(|e| e.mode == mode).collect();
        let init = inits(envs, &mode);
        let task: Vec<f64> = e.iter().filter_map(|e| e.task_s).collect();
        let cold_init: Vec<f64> = e
            .iter()
            .filter(|e| e.iter == 1)
            .filter_map(|e| e.init_s)
            .collect();
        let mut row = format!(
            "| {} | {} | {} | {} | {} |",
            label(&mode),
            f2(median(&init)),
            f2(quantile(&init, 0.9)),
            f2(median(&cold_init)),
            f2(median(&task))
        );
        for i in 1..=n_iter {
            let _ = write!(
                row,
                " {} |",
                wall(iters, &mode, i).map_or("–".into(), |w| format!("{w:.1}"))
            );
        }
        let link = iters
            .iter()
            .find(|i| i.mode == mode && i.iter == 1)
            .map_or("–".into(), |i| format!("{:.0}", mb(i.link_bytes as f64)));
        let cold: Vec<&&Env> = e.iter().filter(|e| e.iter == 1).collect();
        let fr = median(
            &cold
                .iter()
                .filter_map(|e| e.fetched.map(|b| b as f64))
                .collect::<Vec<_>>(),
        );
        let fl = median(
            &cold
                .iter()
                .filter_map(|e| e.fill.map(|b| b as f64))
                .collect::<Vec<_>>(),
        );
        let rd = median(
            &cold
                .iter()
                .filter_map(|e| e.read.map(|b| b as f64))
                .collect::<Vec<_>>(),
        );
        let bytes = match (fr, rd) {
            (Some(f), Some(r)) => {
                format!("{:.1} + {:.1} / {:.1}", mb(f), mb(fl.unwrap_or(0.0)), mb(r))
            }
            _ => "–".into(),
        };
        let ok = e.iter().filter(|e| e.reward == e.expected).count();
        let _ = writeln!(row, " {link} | {bytes} | {ok}/{} |", e.len());
        s.push_str(&row);
    }
    let _ = writeln!(s, "\n## Targets (ratios within this run)\n");
    let _ = writeln!(s, "| target | measured | met |\n|---|---|---|");
    for t in targets(envs, iters) {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(s, "| {} | {} | {met} |", t.what, t.measured);
    }
    if envs.iter().any(|e| e.mode == "plans-fixed")
        && envs.iter().any(|e| e.mode == "plans-elastic")
    {
        let _ = writeln!(s, "\n## Fixed vs elastic quota (weenv shim, same tasks)\n");
        let _ = writeln!(
            s,
            "| quota | task median (s) | task p90 (s) | iterations (s) |\n|---|---:|---:|---|"
        );
        for mode in ["plans-fixed", "plans-elastic"] {
            let task: Vec<f64> = envs
                .iter()
                .filter(|e| e.mode == mode)
                .filter_map(|e| e.task_s)
                .collect();
            let walls: Vec<String> = (1..=n_iter)
                .filter_map(|i| wall(iters, mode, i))
                .map(|w| format!("{w:.1}"))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                label(mode),
                f2(median(&task)),
                f2(quantile(&task, 0.9)),
                walls.join(" / ")
            );
        }
    }
    let _ = writeln!(s, "\n## Figures\n");
    let _ = writeln!(s, "![CDF of init latency per mode](init_cdf.png)\n");
    let _ = writeln!(
        s,
        "![Iteration time per mode and iteration](iterations.png)\n"
    );
    let _ = writeln!(
        s,
        "![Bytes fetched vs bytes read per environment](bytes.png)\n"
    );
    if let Some(t) = table1 {
        let _ = writeln!(s, "## Table 1: packaging strategies\n");
        s.push_str(t.trim_end());
        s.push('\n');
    }
    let bad: Vec<&Env> = envs.iter().filter(|e| e.reward != e.expected).collect();
    if !bad.is_empty() {
        let _ = writeln!(s, "\n## Rewards not as expected\n");
        for e in bad {
            let _ = writeln!(
                s,
                "- {} iteration {} env {} ({} {}): reward {}, expected {}",
                e.mode, e.iter, e.env, e.task, e.harness, e.reward, e.expected
            );
        }
    }
    s
}

fn color(i: usize) -> RGBColor {
    plot_util::PALETTE[i % plot_util::PALETTE.len()]
}

/// A mode's colour, the same in every figure (its place in [`MODES`]; unknown modes grey).
fn mode_color(mode: &str) -> RGBColor {
    MODES
        .iter()
        .position(|(m, _)| *m == mode)
        .map_or(plot_util::PALETTE[7], color)
}

/// Fig. 10a: CDF of init latency per mode (log time axis).
fn plot_cdf(envs: &[Env], out: &Path) -> Result<()> {
    let modes = modes_of(envs);
    let all: Vec<f64> = envs
        .iter()
        .filter_map(|e| e.init_s)
        .filter(|x| *x > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) * 0.8;
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0) * 1.25;
    let root = BitMapBackend::new(out, (900, 550)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(
            "init latency (request → agent's first instruction)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
    ch.configure_mesh()
        .x_desc("seconds (log scale)")
        .y_desc("fraction of environments")
        .draw()?;
    for m in &modes {
        let c = mode_color(m);
        // A step function: each value raises the curve at its x.
        let mut pts = Vec::new();
        let mut prev = 0.0;
        for (x, y) in cdf(&inits(envs, m)) {
            let x = x.max(lo);
            pts.push((x, prev));
            pts.push((x, y));
            prev = y;
        }
        if let Some(&(x, _)) = pts.last() {
            pts.push((hi, 1.0f64.min(prev)));
            let _ = x;
        }
        ch.draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(label(m).to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    plot_util::legend(&mut ch, SeriesLabelPosition::LowerRight)?;
    root.present()?;
    Ok(())
}

/// Fig. 10b: iteration wall time per mode (groups) and iteration (bars).
fn plot_iterations(envs: &[Env], iters: &[Iter], out: &Path) -> Result<()> {
    let modes = modes_of(envs);
    let n_iter = iters.iter().map(|i| i.iter).max().unwrap_or(1).max(1);
    let top = iters.iter().map(|i| i.wall_s).fold(1.0, f64::max) * 1.15;
    let root = BitMapBackend::new(out, (1000, 550)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = modes.len().max(1) as f64;
    let names = modes.clone();
    let mut ch = ChartBuilder::on(&root)
        .caption(
            "rollout iteration time (B environments, start to last reward)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(-0.5..(n - 0.5), 0.0..top)?;
    ch.configure_mesh()
        .disable_x_mesh()
        .x_labels(modes.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("seconds")
        .draw()?;
    let w = 0.8 / f64::from(n_iter);
    for it in 1..=n_iter {
        let c = color(it as usize - 1 + 1);
        let bars: Vec<Rectangle<(f64, f64)>> = modes
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let v = wall(iters, m, it)?;
                let x0 = i as f64 - 0.4 + w * f64::from(it - 1);
                Some(Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v)], c.filled()))
            })
            .collect();
        let name = if it == 1 {
            "iteration 1 (cold)".to_string()
        } else {
            format!("iteration {it}")
        };
        ch.draw_series(bars)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], c.filled()));
    }
    plot_util::legend(&mut ch, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

/// Bytes fetched from the registry vs bytes read, per environment of the cold iteration.
fn plot_bytes(envs: &[Env], out: &Path) -> Result<()> {
    let modes = modes_of(envs);
    let pts = |m: &str| -> Vec<(f64, f64)> {
        envs.iter()
            .filter(|e| e.mode == m && e.iter == 1)
            .filter_map(|e| Some((mb(e.read? as f64), mb(e.fetched? as f64))))
            .collect()
    };
    let top = modes
        .iter()
        .flat_map(|m| pts(m))
        .map(|(x, y)| x.max(y))
        .chain(
            envs.iter()
                .filter(|e| e.iter == 1)
                .filter_map(|e| Some(mb((e.fetched? + e.fill.unwrap_or(0)) as f64))),
        )
        .fold(1.0, f64::max)
        * 1.1;
    let root = BitMapBackend::new(out, (800, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut ch = ChartBuilder::on(&root)
        .caption("bytes per environment, cold iteration", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..top, 0.0..top)?;
    ch.configure_mesh()
        .x_desc("MB read (file bytes, chunk granularity)")
        .y_desc("MB fetched (hollow: + background fill)")
        .draw()?;
    ch.draw_series(LineSeries::new(
        vec![(0.0, 0.0), (top, top)],
        BLACK.stroke_width(1),
    ))?
    .label("fetched = read")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    ch.draw_series(DashedLineSeries::new(
        vec![(0.0, 0.0), (top / BYTES_RATIO_MAX, top)],
        6,
        4,
        BLACK.stroke_width(1),
    ))?
    .label(format!("fetched = {BYTES_RATIO_MAX} × read (target bound)"))
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    for m in &modes {
        let p = pts(m);
        if p.is_empty() {
            continue;
        }
        let c = mode_color(m);
        ch.draw_series(p.into_iter().map(|xy| Circle::new(xy, 5, c.filled())))?
            .label(label(m).to_string())
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
        // The same environments with the background fill's share: hollow.
        let with_fill: Vec<(f64, f64)> = envs
            .iter()
            .filter(|e| e.mode == *m && e.iter == 1)
            .filter_map(|e| {
                Some((
                    mb(e.read? as f64),
                    mb((e.fetched? + e.fill.unwrap_or(0)) as f64),
                ))
            })
            .collect();
        ch.draw_series(
            with_fill
                .into_iter()
                .map(|xy| Circle::new(xy, 5, c.stroke_width(1))),
        )?;
    }
    plot_util::legend(&mut ch, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

fn main() -> Result<()> {
    let dir = std::env::args()
        .nth(1)
        .context("usage: rollout_report DIR (with envs.tsv, iterations.tsv, meta.tsv)")?;
    let dir = Path::new(&dir);
    let read = |n: &str| {
        std::fs::read_to_string(dir.join(n))
            .with_context(|| format!("reading {}", dir.join(n).display()))
    };
    let envs = parse_envs(&read("envs.tsv")?).context("envs.tsv")?;
    let iters = parse_iters(&read("iterations.tsv")?).context("iterations.tsv")?;
    let meta: BTreeMap<String, String> = read("meta.tsv")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let table1 = read("table1.md").ok();
    let md = report(&envs, &iters, &meta, table1.as_deref());
    std::fs::write(dir.join("report.md"), &md)?;
    print!("{md}");
    plot_util::register_font()?;
    plot_cdf(&envs, &dir.join("init_cdf.png"))?;
    plot_iterations(&envs, &iters, &dir.join("iterations.png"))?;
    plot_bytes(&envs, &dir.join("bytes.png"))?;
    if !rewards_ok(&envs) {
        eprintln!("rewards not as expected (see report.md)");
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const ENVS: &str = "mode\titer\tenv\ttask\tharness\tinit_s\ttask_s\treward\texpected\tfetched_bytes\tfill_bytes\tread_bytes
bundles\t1\t1\tt1\tv1\t30\t5\t1\t1\tNA\tNA\tNA
bundles\t1\t2\tt2\tv2\t40\t5\t0\t0\tNA\tNA\tNA
dynamic\t1\t1\tt1\tv1\t12\t5\t1\t1\tNA\tNA\tNA
dynamic\t1\t2\tt2\tv2\t9\t5\t0\t0\tNA\tNA\tNA
plans\t1\t1\tt1\tv1\t1.5\t8\t1\t1\t3000000\t9000000\t2500000
plans\t1\t2\tt2\tv2\t2.5\t8\t0\t0\t2000000\t0\t1000000
plans\t2\t1\tt3\tv1\t1.0\t6\t1\t1\t0\t0\t2000000
";
    const ITERS: &str = "mode\titer\twall_s\tlink_bytes\tregistry_bytes
bundles\t1\t50\t300000000\tNA
dynamic\t1\t20\t100000000\tNA
plans\t1\t20\t50000000\t48000000
plans\t2\t8\t0\t0
";

    #[test]
    fn quantiles_and_cdf() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.9), Some(9.0));
        assert_eq!(quantile(&v, 1.0), Some(10.0));
        assert_eq!(quantile(&[7.0], 0.9), Some(7.0));
        assert_eq!(
            cdf(&[3.0, 1.0, 2.0, 2.0]),
            vec![(1.0, 0.25), (2.0, 0.5), (2.0, 0.75), (3.0, 1.0)]
        );
        assert!(cdf(&[f64::NAN]).is_empty());
    }

    #[test]
    fn parses_rows_and_rejects_short_ones() {
        let e = parse_envs(ENVS).unwrap();
        assert_eq!(e.len(), 7);
        assert_eq!(e[0].fetched, None);
        assert_eq!(e[4].init_s, Some(1.5));
        assert_eq!(e[4].read, Some(2_500_000));
        assert_eq!(e[4].fill, Some(9_000_000));
        let i = parse_iters(ITERS).unwrap();
        assert_eq!(i[0].registry_bytes, None);
        assert_eq!(i[2].registry_bytes, Some(48_000_000));
        assert!(parse_envs("h\nplans\t1\n").is_err());
    }

    #[test]
    fn targets_are_ratios_within_the_run() {
        let e = parse_envs(ENVS).unwrap();
        let i = parse_iters(ITERS).unwrap();
        let t = targets(&e, &i);
        let get = |p: &str| t.iter().find(|t| t.what.contains(p)).unwrap().clone();
        // bundles median 35 s / plans median 1.5 s = 23.3x >= 10 (cold alone: 35 / 2 = 17.5x).
        let b = get("faster than static bundles, overlayfs");
        assert_eq!(
            (b.measured.as_str(), b.met),
            ("23.3× (cold iteration alone: 17.5×)", Some(true))
        );
        // dynamic median 10.5 / 1.5 = 7x >= 3.
        assert_eq!(get("faster than dynamic").met, Some(true));
        // cold iteration 50 / 20 = 2.5x >= 2.
        let c = get("cold iteration");
        assert_eq!((c.measured.as_str(), c.met), ("2.5×", Some(true)));
        // cold envs: 3.0/2.5 = 1.2, 2.0/1.0 = 2.0 > 1.5 (the warm env is not counted, nor
        // the fill's bytes).
        let r = get("registry bytes");
        assert_eq!(r.met, Some(false));
        assert!(
            r.measured.contains("2.00×") && r.measured.contains("2 environments"),
            "{r:?}"
        );
        assert_eq!(get("reward").met, Some(true));
        // No profile mode in the rows: no target for it.
        assert!(!t.iter().any(|t| t.what.contains("start-up profiles")));
    }

    #[test]
    fn a_wrong_reward_fails_and_is_listed() {
        let bad = ENVS.replace(
            "dynamic\t1\t2\tt2\tv2\t9\t5\t0\t0",
            "dynamic\t1\t2\tt2\tv2\t9\t5\tnone\t0",
        );
        let e = parse_envs(&bad).unwrap();
        let i = parse_iters(ITERS).unwrap();
        assert!(!rewards_ok(&e));
        assert_eq!(targets(&e, &i).last().unwrap().met, Some(false));
        let md = report(&e, &i, &BTreeMap::new(), None);
        assert!(md.contains("reward none, expected 0"), "{md}");
        assert!(md.contains("| static bundles, overlayfs full pull | 35.00 | 40.00 | 35.00 | 5.00 | 50.0 | – | 300 | – | 2/2 |"), "{md}");
    }

    #[test]
    fn speedup_needs_both_sides() {
        assert_eq!(speedup(Some(10.0), Some(2.0), 3.0), (Some(5.0), Some(true)));
        assert_eq!(
            speedup(Some(10.0), Some(5.0), 3.0),
            (Some(2.0), Some(false))
        );
        assert_eq!(speedup(None, Some(5.0), 3.0), (None, None));
        assert_eq!(speedup(Some(1.0), Some(0.0), 3.0), (None, None));
    }

    #[test]
    fn writes_the_pngs_for_a_fixture() {
        if plot_util::register_font().is_err() {
            eprintln!("no font: skipped");
            return;
        }
        let e = parse_envs(ENVS).unwrap();
        let i = parse_iters(ITERS).unwrap();
        let d = tempfile::tempdir().unwrap();
        plot_cdf(&e, &d.path().join("a.png")).unwrap();
        plot_iterations(&e, &i, &d.path().join("b.png")).unwrap();
        plot_bytes(&e, &d.path().join("c.png")).unwrap();
        for f in ["a.png", "b.png", "c.png"] {
            let b = std::fs::read(d.path().join(f)).unwrap();
            assert!(b.starts_with(b"\x89PNG"), "{f}");
        }
    }
}
