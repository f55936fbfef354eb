//! The peer tier in one process: reader frame stores with a [`PeerClient`], an owner with a
//! [`PeerServer`] fetching from a minimal registry (ranged blob GETs), and misbehaving peers:
//! a corrupting one, a dead one, a silent one.
#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`

use super::*;
use crate::cache::{DiskCache, MemoryCache};
use crate::fetch::plan::PlanLimits;
use crate::fetch::testutil::{build_layer, noise, tar_of, MemSource, T};
use crate::fetch::{FrameStore, RangeSource};
use crate::metrics::Metrics;
use crate::peer::health::EjectPolicy;
use crate::peer::protocol::RequestLimits;
use crate::peer::{PeerServer, ServerConfig};
use http_body_util::Full;
use hyper::{Request, Response};
use std::convert::Infallible;
use std::sync::atomic::AtomicUsize;
use weenv_registry::{Attempt, ByteRange, Reference, SourceError};

fn frame(offset: u64, ulen: u64, n: u32) -> Frame {
    Frame {
        offset,
        clen: 10,
        ulen,
        digest: Digest::sha256(&n.to_le_bytes()),
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap() // ok: test code
}

#[test]
fn batches_go_to_owners_self_owned_to_the_runner_up_cache_only() {
    let frames: Vec<Frame> = (0..200).map(|i| frame(u64::from(i) * 10, 100, i)).collect();
    let want: Vec<FrameIdx> = (0..200).map(FrameIdx).collect();
    let (a, b, me) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"), addr("10.0.0.3:1"));
    let live = [a, b, me];
    let batches = plan_batches(&frames, &want, &live, Some(me), 1 << 20);
    let mut seen = 0;
    for bt in &batches {
        assert_ne!(bt.peer, me, "never asks itself");
        for i in &bt.frames {
            let r = ranked(&live, &frames[i.0 as usize].digest);
            if bt.cache_only {
                assert_eq!((r[0], r[1]), (me, bt.peer));
            } else {
                assert_eq!(r[0], bt.peer);
            }
            seen += 1;
        }
        assert!(bt.frames.windows(2).all(|w| w[0] < w[1]), "blob order");
    }
    assert_eq!(seen, 200, "every frame asked of someone");
    assert_eq!(
        batches.len(),
        4,
        "one batch per (peer, cache_only): {batches:?}"
    );
    // Split at max_bytes; a frame over it is asked of nobody; alone, nobody is asked.
    let small = plan_batches(&frames, &want, &live, Some(me), 250);
    assert!(small.iter().all(|b| b.frames.len() <= 2));
    assert_eq!(small.iter().map(|b| b.frames.len()).sum::<usize>(), 200);
    assert!(plan_batches(&frames, &want, &live, Some(me), 99).is_empty());
    assert!(plan_batches(&frames, &want, &[me], Some(me), 1 << 20).is_empty());
}

#[test]
fn frames_are_checked_against_the_toc() {
    let f = Frame {
        offset: 0,
        clen: 1,
        ulen: 3,
        digest: Digest::sha256(b"abc"),
    };
    assert!(check_frame(&f, b"abc").is_ok());
    assert!(check_frame(&f, b"abd").unwrap_err().contains("digest"));
    assert!(check_frame(&f, b"ab").unwrap_err().contains("2 bytes"));
}

/// Serves `f` on a fresh loopback port (HTTP/1.1); returns the address.
async fn serve_fn<F>(f: F) -> SocketAddr
where
    F: Fn(Request<hyper::body::Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(); // ok: test code
    let a = l.local_addr().unwrap(); // ok: test code
    let f = Arc::new(f);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let f = f.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| {
                    let f = f.clone();
                    async move { Ok::<_, Infallible>(f(r)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    a
}

/// A registry serving one blob by ranged GETs; counts blob requests.
async fn registry(blob: Vec<u8>) -> (SocketAddr, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let a = serve_fn(move |r| {
        let range = r
            .headers()
            .get("range")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
        match (r.uri().path().contains("/blobs/"), range) {
            (true, Some((a, b))) if b < blob.len() => {
                count.fetch_add(1, Ordering::Relaxed);
                let mut resp = Response::new(Full::new(Bytes::copy_from_slice(&blob[a..=b])));
                *resp.status_mut() = hyper::StatusCode::PARTIAL_CONTENT;
                resp.headers_mut().insert(
                    "content-range",
                    format!("bytes {a}-{b}/{}", blob.len()).parse().unwrap(), // ok: test code
                );
                resp
            }
            _ => {
                let mut resp = Response::new(Full::new(Bytes::new()));
                *resp.status_mut() = hyper::StatusCode::NOT_FOUND;
                resp
            }
        }
    })
    .await;
    (a, n)
}

/// A reader's blob source: the test blob in memory, located in the test registry.
struct Located(Arc<MemSource>, BlobLocator);

#[async_trait]
impl RangeSource for Located {
    async fn try_read(&self, range: ByteRange, a: Attempt) -> Result<Bytes, SourceError> {
        self.0.try_read(range, a).await
    }
    fn size(&self) -> Option<u64> {
        self.0.size()
    }
    fn locator(&self) -> Option<BlobLocator> {
        Some(self.1.clone())
    }
}

struct Node {
    _dir: tempfile::TempDir,
    store: Arc<FrameStore>,
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap(); // ok: test code
    let metrics = Arc::new(Metrics::new());
    let l2 = DiskCache::open(dir.path(), 1 << 30, metrics.clone()).unwrap(); // ok: test code
    let store = Arc::new(FrameStore::new(
        MemoryCache::new(1 << 20),
        l2,
        metrics,
        PlanLimits::default(),
    ));
    Node { _dir: dir, store }
}

fn layer() -> (weenv_format::Toc, Vec<u8>) {
    let files: Vec<(String, Vec<u8>)> = (0..6).map(|i| (format!("f{i}"), noise(i, 3000))).collect();
    let entries: Vec<T<'_>> = files.iter().map(|(p, d)| T::File(p, d.clone())).collect();
    let (_, toc, blob) = build_layer(&tar_of(&entries), 4096);
    (toc, blob)
}

const TOKEN: &str = "s3cret";

/// A client over `members`; `me`: this node's member address (`None`: listening on an
/// unspecified address with no member on its port, this node is not a member).
fn client(
    members: Vec<SocketAddr>,
    me: Option<SocketAddr>,
    token: &str,
    hedge_ms: u64,
) -> (Arc<PeerClient>, Arc<PeerStats>) {
    let stats = Arc::new(PeerStats::default());
    let m = Arc::new(Membership::new(members, me, addr("0.0.0.0:1")));
    let c = PeerClient::new(
        m,
        ClientConfig {
            hedge: Duration::from_millis(hedge_ms),
            eject: EjectPolicy {
                base: Duration::from_secs(30),
                max: Duration::from_secs(60),
            },
            max_request_bytes: 8 << 20,
            token: Some(token.into()),
        },
        stats.clone(),
    )
    .unwrap(); // ok: test code
    (Arc::new(c), stats)
}

/// An owner node serving peers; its registry is `reg`.
async fn owner(reg: SocketAddr) -> (Node, SocketAddr, Arc<PeerStats>) {
    let n = node();
    let mut rc = weenv_registry::RegistryConfig::default();
    rc.hosts.insert(
        reg.to_string(),
        weenv_registry::HostConfig {
            plain_http: true,
            ..Default::default()
        },
    );
    let stats = Arc::new(PeerStats::default());
    let server = Arc::new(PeerServer::new(
        n.store.clone(),
        weenv_registry::Client::new(rc).unwrap(), // ok: test code
        ServerConfig {
            limits: RequestLimits {
                max_request_bytes: 8 << 20,
                registries: vec![],
            },
            token: Some(TOKEN.into()),
            max_concurrent: 8,
            max_bytes_in_flight: 64 << 20,
        },
        stats.clone(),
    ));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(); // ok: test code
    let a = l.local_addr().unwrap(); // ok: test code
    tokio::spawn(server.serve(l));
    (n, a, stats)
}

fn source(blob: &[u8], reg: SocketAddr) -> (Arc<MemSource>, Arc<dyn RangeSource>) {
    let mem = MemSource::new(blob.to_vec());
    let loc = BlobLocator {
        reference: format!("{reg}/test/layer").parse::<Reference>().unwrap(), // ok: test code
        digest: Digest::sha256(blob),
        size: blob.len() as u64,
    };
    (mem.clone(), Arc::new(Located(mem, loc)))
}

/// Every frame of the layer through a fresh reader node whose peer tier is `c`, as byte vectors.
async fn read_all(
    c: &Arc<PeerClient>,
    toc: &weenv_format::Toc,
    src: &Arc<dyn RangeSource>,
) -> (Node, Vec<Vec<u8>>) {
    let reader = node();
    reader.store.set_peer_tier(c.clone());
    let all: Vec<FrameIdx> = (0..toc.frames.len() as u32).map(FrameIdx).collect();
    let got = reader
        .store
        .get_frames(&toc.frames, src, &all, Priority::OnDemand)
        .await
        .unwrap(); // ok: test code
    (reader, got.iter().map(|b| b.to_vec()).collect())
}

fn expected(toc: &weenv_format::Toc, blob: &[u8]) -> Vec<Vec<u8>> {
    toc.frames
        .iter()
        .map(|f| {
            weenv_format::frame::decode_frame(
                f,
                &blob[f.offset as usize..(f.offset + f.clen) as usize],
            )
            .unwrap() // ok: test code
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_fetches_once_for_every_reader_and_readers_verify() {
    let (toc, blob) = layer();
    let (reg, reg_requests) = registry(blob.clone()).await;
    let (own, own_addr, own_stats) = owner(reg).await;
    let want = expected(&toc, &blob);
    for round in 0..2 {
        let (c, stats) = client(vec![own_addr], None, TOKEN, 5000);
        let (mem, src) = source(&blob, reg);
        let (reader, got) = read_all(&c, &toc, &src).await;
        assert_eq!(got, want);
        assert!(
            mem.requests().is_empty(),
            "round {round}: nothing from the reader's registry source"
        );
        let p = stats.peer(own_addr);
        assert_eq!((p.requests, p.errors), (1, 0), "round {round}: {p:?}");
        assert_eq!(p.bytes, toc.frames.iter().map(|f| f.clen).sum::<u64>());
        assert!(c.is_live(own_addr));
        for f in &toc.frames {
            assert!(
                reader.store.l2().contains(&f.digest),
                "cached at the reader"
            );
            assert!(own.store.l2().contains(&f.digest), "cached at the owner");
        }
    }
    // The owner went to the registry in the first round only (coalesced), not in the second.
    assert_eq!(reg_requests.load(Ordering::Relaxed), 1);
    assert_eq!(own_stats.served_requests.load(Ordering::Relaxed), 2);

    // A wrong token gets nothing from the owner: the reader falls back to its source.
    let (c, stats) = client(vec![own_addr], None, "wrong", 5000);
    let (mem, src) = source(&blob, reg);
    assert_eq!(read_all(&c, &toc, &src).await.1, want);
    assert_eq!(mem.requests().len(), 1);
    assert_eq!(stats.peer(own_addr).errors, 1);
    assert!(!c.is_live(own_addr), "ejected");
    assert_eq!(own_stats.refused_auth.load(Ordering::Relaxed), 1);

    // An invalid request is refused (400) and counted.
    let r = reqwest::Client::new()
        .post(format!("http://{own_addr}{}", super::FRAMES_PATH))
        .bearer_auth(TOKEN)
        .body("{\"version\":1}")
        .send()
        .await
        .unwrap(); // ok: test code
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(own_stats.refused_invalid.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_dead_and_silent_peers_cost_a_registry_fetch_and_an_ejection_never_a_wrong_byte() {
    let (toc, blob) = layer();
    let want = expected(&toc, &blob);
    // Answers every request with the right length of flipped bytes.
    let want_len: u64 = toc.frames.iter().map(|f| f.ulen).sum();
    let wrong: Vec<u8> = want.concat().iter().map(|b| b ^ 0xff).collect();
    assert_eq!(wrong.len() as u64, want_len);
    let liar = serve_fn(move |_| Response::new(Full::new(Bytes::from(wrong.clone())))).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // ok: test code
        l.local_addr().unwrap() // ok: test code
    };
    let silent_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(); // ok: test code
    let silent = silent_l.local_addr().unwrap(); // ok: test code
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent_l.accept().await {
            held.push(s);
        }
    });
    for (peer, what) in [(liar, "liar"), (dead, "dead"), (silent, "silent")] {
        let (c, stats) = client(vec![peer], None, TOKEN, 300);
        let (mem, src) = source(&blob, addr("127.0.0.1:9"));
        let t0 = Instant::now();
        assert_eq!(
            read_all(&c, &toc, &src).await.1,
            want,
            "{what}: only verified bytes"
        );
        assert_eq!(mem.requests().len(), 1, "{what}: fetched from the source");
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{what}: bounded by the hedge delay"
        );
        assert!(!c.is_live(peer), "{what}: ejected");
        let p = stats.peer(peer);
        assert_eq!((p.errors, p.ejections, p.bytes), (1, 1, 0), "{what}: {p:?}");
        if what == "liar" {
            assert_eq!(p.corrupt_frames, toc.frames.len() as u64);
        }
        assert_eq!(
            stats.bypassed_frames.load(Ordering::Relaxed),
            toc.frames.len() as u64
        );
        // Ejected: the next read does not ask it at all.
        read_all(&c, &toc, &src).await;
        assert_eq!(
            stats.peer(peer).requests,
            p.requests,
            "{what}: not asked while ejected"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_reading_each_others_frames_at_once_do_not_wait_on_each_other() {
    let (toc, blob) = layer();
    let (reg, _) = registry(blob.clone()).await;
    let (a, a_addr, _) = owner(reg).await;
    let (b, b_addr, _) = owner(reg).await;
    let all: Vec<FrameIdx> = (0..toc.frames.len() as u32).map(FrameIdx).collect();
    let mut clients = Vec::new();
    for (n, me) in [(&a, a_addr), (&b, b_addr)] {
        let (c, stats) = client(vec![a_addr, b_addr], Some(me), TOKEN, 3000);
        n.store.set_peer_tier(c.clone());
        let mine = c.self_owned(&toc.frames, &all).len();
        assert!(
            mine > 0 && mine < all.len(),
            "each owns some frames: {mine}"
        );
        clients.push((c, stats));
    }
    let (_, src_a) = source(&blob, reg);
    let (_, src_b) = source(&blob, reg);
    let t0 = Instant::now();
    // Both claim every frame at once: each holds claims of frames the other asks it for.
    let (ra, rb) = tokio::join!(
        a.store
            .get_frames(&toc.frames, &src_a, &all, Priority::OnDemand),
        b.store
            .get_frames(&toc.frames, &src_b, &all, Priority::OnDemand)
    );
    let want = expected(&toc, &blob);
    for r in [ra, rb] {
        let got: Vec<Vec<u8>> = r.unwrap().iter().map(|b| b.to_vec()).collect(); // ok: test code
        assert_eq!(got, want);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}: waited for the hedge delay",
        t0.elapsed()
    );
    for ((c, stats), other) in clients.iter().zip([b_addr, a_addr]) {
        let p = stats.peer(other);
        assert_eq!(p.errors, 0, "{p:?}");
        assert!(c.is_live(other));
    }
}
