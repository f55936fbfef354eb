//! Benchmark of the peer cache (issue 14): N nodes cold-start the same image at once, with and
//! without peers, on the netns cluster of `weenv_integration::cluster` (registry behind a
//! 200 Mbit/s HTB link; image: busybox + 24 MiB of incompressible files, each container reads
//! and checks all of them). Each (N, peers) run is a fresh cluster (cold caches). Prints a
//! markdown table (registry bytes on the link, median and max start time, ratios) and writes a
//! PNG plot (plotters).
//!
//! ```sh
//! cargo build -p weenv-snapshotter -p weenv-cli --bins
//! cargo run -p weenv-integration --example peers_bench -- [NODES=1,2,4,8] [OUT=integration/bench/peers_bench.png]
//! ```
//! Needs root, ip/tc/nsenter, containerd, runc, fuse, docker-registry, skopeo, umoci, and a
//! TrueType font for the plot's text (`$WEENV_FONT`, default DejaVu Sans).

use anyhow::Result;
use plotters::prelude::*;
use std::time::Duration;
use weenv_integration::cluster::{prepare_image, Cluster, ClusterOptions};

#[path = "plot_util.rs"]
mod plot_util;

#[derive(Clone, Copy, Debug)]
struct Row {
    nodes: usize,
    peers: bool,
    registry_bytes: u64,
    median: Duration,
    max: Duration,
}

fn run(storage: &std::path::Path, image: &str, nodes: usize, peers: bool) -> Result<Row> {
    let mut c = Cluster::start(
        storage,
        ClusterOptions {
            peers,
            ..Default::default()
        },
    )?;
    let all: Vec<usize> = (1..=nodes).collect();
    for i in &all {
        c.add_node(*i, &all, &[])?;
    }
    let before = c.registry_sent_bytes()?;
    let mut times = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .nodes
            .iter()
            .map(|n| s.spawn(move || n.cold_start(image, &format!("bench{}", n.index))))
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("thread panicked"))?)
            .collect::<Result<Vec<Duration>>>()
    })?;
    let registry_bytes = c.registry_sent_bytes()? - before;
    times.sort();
    let row = Row {
        nodes,
        peers,
        registry_bytes,
        median: times[times.len() / 2],
        max: times[times.len() - 1],
    };
    eprintln!("{row:?} times {times:?}");
    Ok(row)
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| nodes | registry MB, no peers | with peers | ratio | median / max start, no peers | with peers | median ratio |\n|---|---|---|---|---|---|---|\n",
    );
    let one = rows
        .iter()
        .find(|r| r.nodes == 1 && !r.peers)
        .map_or(1, |r| r.registry_bytes);
    for n in rows.iter().filter(|r| !r.peers) {
        let Some(p) = rows.iter().find(|r| r.peers && r.nodes == n.nodes) else {
            continue;
        };
        s.push_str(&format!(
            "| {} | {:.1} ({:.2}× one node) | {:.1} ({:.2}×) | {:.2} | {:.2} / {:.2} s | {:.2} / {:.2} s | {:.2} |\n",
            n.nodes,
            mb(n.registry_bytes),
            n.registry_bytes as f64 / one as f64,
            mb(p.registry_bytes),
            p.registry_bytes as f64 / one as f64,
            p.registry_bytes as f64 / n.registry_bytes as f64,
            n.median.as_secs_f64(),
            n.max.as_secs_f64(),
            p.median.as_secs_f64(),
            p.max.as_secs_f64(),
            p.median.as_secs_f64() / n.median.as_secs_f64(),
        ));
    }
    s
}

fn plot(rows: &[Row], out: &str) -> Result<()> {
    plot_util::register_font()?;
    let root = BitMapBackend::new(out, (1100, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let max_n = rows.iter().map(|r| r.nodes).max().unwrap_or(1) as u32;
    let series = |peers: bool, f: &dyn Fn(&Row) -> f64| -> Vec<(u32, f64)> {
        let mut v: Vec<(u32, f64)> = rows
            .iter()
            .filter(|r| r.peers == peers)
            .map(|r| (r.nodes as u32, f(r)))
            .collect();
        v.sort_by_key(|p| p.0);
        v
    };
    let styles = [(false, RED, "no peers"), (true, BLUE, "peers")];
    {
        let top = rows
            .iter()
            .map(|r| mb(r.registry_bytes))
            .fold(1.0, f64::max)
            * 1.1;
        let mut ch = ChartBuilder::on(&left)
            .caption("registry bytes (MB on the link)", ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(1u32..max_n, 0.0..top)?;
        ch.configure_mesh()
            .x_desc("nodes starting at once")
            .draw()?;
        for (peers, color, name) in styles {
            ch.draw_series(LineSeries::new(
                series(peers, &|r| mb(r.registry_bytes)),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        plot_util::legend(&mut ch, SeriesLabelPosition::MiddleRight)?;
    }
    {
        let top = rows.iter().map(|r| r.max.as_secs_f64()).fold(1.0, f64::max) * 1.1;
        let mut ch = ChartBuilder::on(&right)
            .caption(
                "start time (s): median solid, max dashed",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(1u32..max_n, 0.0..top)?;
        ch.configure_mesh()
            .x_desc("nodes starting at once")
            .draw()?;
        for (peers, color, name) in styles {
            ch.draw_series(LineSeries::new(
                series(peers, &|r| r.median.as_secs_f64()),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            ch.draw_series(DashedLineSeries::new(
                series(peers, &|r| r.max.as_secs_f64()),
                6,
                4,
                color.stroke_width(1),
            ))?;
        }
        plot_util::legend(&mut ch, SeriesLabelPosition::MiddleRight)?;
    }
    root.present()?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{k}=")).map(str::to_string))
    };
    let nodes: Vec<usize> = arg("NODES")
        .unwrap_or_else(|| "1,2,4,8".into())
        .split(',')
        .map(|n| n.trim().parse())
        .collect::<Result<_, _>>()?;
    let out = arg("OUT").unwrap_or_else(|| "integration/bench/peers_bench.png".into());
    let tmp = tempfile::tempdir()?;
    let rt = tokio::runtime::Runtime::new()?;
    let (storage, image) = rt.block_on(prepare_image(tmp.path()))?;
    let mut rows = Vec::new();
    for n in &nodes {
        for peers in [false, true] {
            rows.push(run(&storage, &image, *n, peers)?);
        }
    }
    println!("{}", table(&rows));
    plot(&rows, &out)?;
    println!("plot: {out}");
    Ok(())
}
