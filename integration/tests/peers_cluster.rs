//! The peer cache (issue 14) on a cluster built on one machine (`weenv_integration::cluster`):
//! nodes in network namespaces, each with its own containerd and weenv-snapshotter, the
//! registry behind a 200 Mbit/s HTB-shaped link. The image is busybox plus 24 MiB of
//! incompressible files and their `SHA256SUMS`; every container checks every byte it read.
//!
//! (a) 4 nodes cold-start the image at once: the registry sends ≤ 1.3× what one node fetched;
//! (b) a fifth node started afterwards fetches 0 frame bytes from the registry;
//! (c) a peer killed mid-read: every read completes;
//! (d) a peer returning corrupt frames: 0 wrong bytes, the peer is ejected.

use anyhow::{ensure, Result};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weenv_integration::cluster::{
    metric_sum, prepare_image, Cluster, ClusterOptions, Node, CLUSTER_BINS,
};
use weenv_integration::util::{require_root_and_bins, E2E_FUSE_BINS};

/// One cluster at a time: they share the machine's two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Fixture {
    /// docker-registry storage holding `data:weenv`.
    storage: PathBuf,
    /// `10.77.0.2:5000/data:weenv`.
    image: String,
    _tmp: tempfile::TempDir,
}

async fn fixture() -> Result<Fixture> {
    let mut bins = E2E_FUSE_BINS.to_vec();
    bins.extend_from_slice(CLUSTER_BINS);
    require_root_and_bins(&bins)?;
    let tmp = tempfile::tempdir()?;
    let (storage, image) = prepare_image(tmp.path()).await?;
    Ok(Fixture {
        storage,
        image,
        _tmp: tmp,
    })
}

/// A cluster over the fixture's registry whose nodes hedge a peer request after 2 s.
fn hedged_cluster(fx: &Fixture) -> Result<Cluster> {
    Cluster::start(
        &fx.storage,
        ClusterOptions {
            hedge_ms: 2000,
            ..Default::default()
        },
    )
}

/// Everything `node` fetched for its reads, in compressed bytes: from the registry (including
/// frames it fetched on its peers' behalf) and from peers.
fn fetched(node: &Node) -> Result<(u64, u64)> {
    let m = node.metrics()?;
    Ok((
        node.registry_frame_bytes()?,
        metric_sum(&m, "weenv_peer_bytes_total"),
    ))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, ip/tc/nsenter, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn four_nodes_fetch_the_image_about_once_and_a_fifth_gets_it_from_peers() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let fx = fixture().await?;
    let mut c = Cluster::start(&fx.storage, ClusterOptions::default())?;
    for i in 1..=4 {
        c.add_node(i, &[1, 2, 3, 4], &[])?;
    }
    let before = c.registry_sent_bytes()?;
    let times: Vec<Duration> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .nodes
            .iter()
            .map(|n| {
                let image = fx.image.clone();
                s.spawn(move || n.cold_start(&image, &format!("a{}", n.index)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("thread panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    let sent = c.registry_sent_bytes()? - before;
    let mut one_node = 0;
    let mut owners = 0;
    for n in &c.nodes {
        let (reg, peers) = fetched(n)?;
        println!(
            "node {}: {reg} bytes from the registry (own reads and its peers'), {peers} from peers",
            n.index
        );
        one_node = one_node.max(reg + peers);
        owners += u64::from(reg > 0);
    }
    println!(
        "(a) 4 nodes at once: registry sent {sent} bytes on its link; one node needed {one_node}; \
         ratio {:.2}; start times {times:?}",
        sent as f64 / one_node as f64
    );
    ensure!(
        one_node > 20 << 20,
        "one node fetched only {one_node} bytes"
    );
    ensure!(
        (sent as f64) <= 1.3 * one_node as f64,
        "registry sent {sent} bytes for 4 nodes, more than 1.3 × {one_node}"
    );
    ensure!(owners >= 3, "frames were fetched by {owners} owners only");

    // (b) A fifth node: its frames are in its peers' caches.
    c.add_node(5, &[1, 2, 3, 4, 5], &[])?;
    let before = c.registry_sent_bytes()?;
    let t5 = c.node(5)?.cold_start(&fx.image, "b5")?;
    let sent5 = c.registry_sent_bytes()? - before;
    let (reg5, peers5) = fetched(c.node(5)?)?;
    println!(
        "(b) fifth node: {reg5} frame bytes from the registry, {peers5} from peers; the registry \
         sent {sent5} bytes (manifest, config, TOC); start {t5:?}"
    );
    ensure!(
        reg5 == 0,
        "the fifth node fetched {reg5} frame bytes from the registry"
    );
    ensure!(
        peers5 >= one_node * 9 / 10,
        "only {peers5} bytes from peers"
    );
    ensure!(
        sent5 < 1 << 20,
        "the registry sent {sent5} bytes to the fifth node"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, ip/tc/nsenter, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn a_peer_killed_mid_read_fails_no_read() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let fx = fixture().await?;
    let mut c = hedged_cluster(&fx)?;
    for i in 1..=4 {
        c.add_node(i, &[1, 2, 3, 4], &[])?;
    }
    let victim_addr = c.node(4)?.peer_addr();
    let (readers, victim) = c.nodes.split_at_mut(3);
    let victim = &mut victim[0];
    let served_before_kill = std::thread::scope(|s| -> Result<u64> {
        let hs: Vec<_> = readers
            .iter()
            .map(|n| {
                let image = fx.image.clone();
                s.spawn(move || n.cold_start(&image, &format!("c{}", n.index)))
            })
            .collect();
        // Kill node 4 as soon as it has served its peers something: reads are under way.
        let deadline = Instant::now() + Duration::from_secs(120);
        let served = loop {
            let m = victim.metrics()?;
            let served = metric_sum(&m, "weenv_peer_served_requests_total");
            if served > 0 || Instant::now() > deadline {
                break served;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        victim.kill_daemon();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("thread panicked"))??;
        }
        Ok(served)
    })?;
    let mut failures = 0;
    for n in &c.nodes[..3] {
        let m = n.metrics()?;
        let errs = m
            .lines()
            .filter(|l| {
                l.starts_with("weenv_peer_errors_total") && l.contains(victim_addr.as_str())
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
        failures += errs;
    }
    println!(
        "(c) node 4 killed after serving {served_before_kill} requests; its peers saw {failures} \
         failed requests to it, and every read completed"
    );
    ensure!(
        served_before_kill > 0,
        "node 4 served nothing before the deadline"
    );
    ensure!(
        failures > 0,
        "no request to node 4 failed: it was not killed mid-read"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, ip/tc/nsenter, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn a_corrupting_peer_costs_no_wrong_byte_and_is_ejected() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let fx = fixture().await?;
    let mut c = hedged_cluster(&fx)?;
    let liar = c.corrupt_peer(9)?;
    c.add_node(1, &[1], std::slice::from_ref(&liar.addr))?;
    let t = c.node(1)?.cold_start(&fx.image, "d1")?;
    let m = c.node(1)?.metrics()?;
    let corrupt = metric_sum(&m, "weenv_peer_corrupt_frames_total");
    let ejections = metric_sum(&m, "weenv_peer_ejections_total");
    let asked = liar.requests.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "(d) the liar was asked {asked} times and returned {corrupt} corrupt frames; {ejections} \
         ejections; every byte checked in the container; start {t:?}"
    );
    ensure!(asked >= 1 && corrupt >= 1, "the liar was not asked");
    ensure!(ejections >= 1, "the liar was not ejected");
    let status = c.node(1)?.weenv(&["status"])?;
    ensure!(
        status.contains(&format!("{}  EJECTED", liar.addr)),
        "status does not show the ejection:\n{status}"
    );
    Ok(())
}
