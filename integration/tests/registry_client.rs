//! The registry client against a real `docker-registry` (distribution 2.8) behind a counting
//! proxy: uploads (monolithic, chunked), cross-repository mount, manifests, resolve, range
//! reads, redirects, servers ignoring Range, mirrors, and the one-HEAD-one-GET TOC read of a
//! weenv layer. Every test asserts the exact requests seen on the wire.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use weenv_format::RangeRead;
use weenv_integration::registry::{CountingProxy, LocalRegistry, ProxyOptions, ProxyStats};
use weenv_registry::manifest::{OCI_CONFIG, OCI_MANIFEST};
use weenv_registry::{
    BlobPush, BlobRangeReader, Bytes, Client, Digest, HostConfig, ImageManifest, Manifest,
    Reference, RegistryConfig,
};

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u64).wrapping_mul(2654435761) >> 7) as u8 ^ seed)
        .collect()
}

fn plain_http(hosts: &[String]) -> RegistryConfig {
    let mut c = RegistryConfig {
        docker_credentials: false,
        ..RegistryConfig::default()
    };
    for h in hosts {
        c.hosts.insert(
            h.clone(),
            HostConfig {
                plain_http: true,
                ..HostConfig::default()
            },
        );
    }
    c
}

fn reqs(stats: &ProxyStats) -> Vec<(String, String, u16)> {
    stats
        .requests()
        .into_iter()
        .map(|r| {
            let path = r.path.split('?').next().unwrap_or("").to_string();
            // collapse upload session ids
            let path = match path.find("/blobs/uploads/") {
                Some(i) => format!("{}/blobs/uploads/*", &path[..i]),
                None => path,
            };
            (r.method, path, r.status)
        })
        .collect()
}

fn s(m: &str, p: &str, st: u16) -> (String, String, u16) {
    (m.to_string(), p.to_string(), st)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn push_mount_manifest_resolve_and_range_read() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let proxy = CountingProxy::start(reg.addr()).unwrap();
    let st = proxy.stats();
    let host = proxy.host();
    let client = Client::new(plain_http(std::slice::from_ref(&host))).unwrap();
    let a: Reference = format!("{host}/weenv/test-a:v1").parse().unwrap();
    let b: Reference = format!("{host}/weenv/test-b:v1").parse().unwrap();

    // monolithic upload: HEAD (404), POST (202), PUT (201)
    let small = data(300_000, 1);
    let d_small = Digest::sha256(&small);
    let r = client
        .push_blob(&a, &d_small, Bytes::from(small.clone()))
        .await
        .unwrap();
    assert_eq!(r, BlobPush::Uploaded);
    let blobs_a = format!("/v2/weenv/test-a/blobs/{d_small}");
    assert_eq!(
        reqs(&st),
        vec![
            s("HEAD", &blobs_a, 404),
            s("POST", "/v2/weenv/test-a/blobs/uploads/*", 202),
            s("PUT", "/v2/weenv/test-a/blobs/uploads/*", 201),
        ]
    );
    assert_eq!(st.requests()[2].request_bytes, small.len() as u64);
    st.clear();
    // second push: only a HEAD
    assert_eq!(
        client
            .push_blob(&a, &d_small, Bytes::from(small.clone()))
            .await
            .unwrap(),
        BlobPush::AlreadyExists
    );
    assert_eq!(reqs(&st), vec![s("HEAD", &blobs_a, 200)]);
    st.clear();

    // chunked upload: 2.5 MiB in 1 MiB chunks -> 3 PATCHes
    let big = data(2_621_440 + 123, 2);
    let d_big = Digest::sha256(&big);
    let r = client
        .push_blob_chunked(&a, &d_big, &big[..], 1 << 20)
        .await
        .unwrap();
    assert_eq!(r, BlobPush::Uploaded);
    let upl = "/v2/weenv/test-a/blobs/uploads/*";
    assert_eq!(
        reqs(&st),
        vec![
            s("HEAD", &format!("/v2/weenv/test-a/blobs/{d_big}"), 404),
            s("POST", upl, 202),
            s("PATCH", upl, 202),
            s("PATCH", upl, 202),
            s("PATCH", upl, 202),
            s("PUT", upl, 201),
        ]
    );
    let patched: u64 = st
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.request_bytes)
        .sum();
    assert_eq!(patched, big.len() as u64);
    assert_eq!(
        client.get_blob(&a, &d_big).await.unwrap(),
        Bytes::from(big.clone())
    );
    // a wrong digest for a chunked stream fails before commit
    let wrong = Digest::sha256(b"not it");
    assert!(matches!(
        client
            .push_blob_chunked(&a, &wrong, &big[..1000], 512)
            .await,
        Err(weenv_registry::RegistryError::DigestMismatch { .. })
    ));
    st.clear();

    // cross-repository mount: HEAD (404) + POST ?mount= (201), nothing uploaded
    let r = client
        .push_blob_or_mount(
            &b,
            Some("weenv/test-a"),
            &d_small,
            Bytes::from(small.clone()),
        )
        .await
        .unwrap();
    assert_eq!(r, BlobPush::Mounted);
    assert_eq!(
        reqs(&st),
        vec![
            s("HEAD", &format!("/v2/weenv/test-b/blobs/{d_small}"), 404),
            s("POST", "/v2/weenv/test-b/blobs/uploads/*", 201),
        ]
    );
    assert!(st.requests()[1]
        .path
        .ends_with(&format!("?mount={d_small}&from=weenv/test-a")));
    assert_eq!(
        st.requests().iter().map(|r| r.request_bytes).sum::<u64>(),
        0
    );
    assert_eq!(
        client.head_blob(&b, &d_small).await.unwrap(),
        Some(small.len() as u64)
    );
    // mount of a blob the source lacks: 202 (not mounted)
    assert!(!client
        .mount_blob(&b, "weenv/test-a", &Digest::sha256(b"absent"))
        .await
        .unwrap());
    st.clear();

    // config + manifest, then resolve by tag: exactly one HEAD
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let d_cfg = Digest::sha256(config);
    client
        .push_blob(&a, &d_cfg, Bytes::from_static(config))
        .await
        .unwrap();
    let mut layer = weenv_registry::Descriptor::new(
        "application/vnd.oci.image.layer.v1.tar",
        d_small.clone(),
        small.len() as u64,
    );
    layer.annotations = BTreeMap::from([("k".to_string(), "v".to_string())]);
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        artifact_type: None,
        config: weenv_registry::Descriptor::new(OCI_CONFIG, d_cfg.clone(), config.len() as u64),
        layers: vec![
            layer,
            weenv_registry::Descriptor::new(
                "application/octet-stream",
                d_big.clone(),
                big.len() as u64,
            ),
        ],
        subject: None,
        annotations: BTreeMap::new(),
    };
    let mbytes = serde_json::to_vec(&manifest).unwrap();
    let d_man = client
        .push_manifest(&a, Bytes::from(mbytes.clone()), OCI_MANIFEST)
        .await
        .unwrap();
    assert_eq!(d_man, Digest::sha256(&mbytes));
    st.clear();
    let desc = client.resolve(&a).await.unwrap();
    assert_eq!(
        (desc.digest.clone(), desc.media_type.as_str(), desc.size),
        (d_man.clone(), OCI_MANIFEST, mbytes.len() as u64)
    );
    assert_eq!(
        reqs(&st),
        vec![s("HEAD", "/v2/weenv/test-a/manifests/v1", 200)]
    );
    let got = client
        .get_manifest(&a.with_digest(d_man.clone()))
        .await
        .unwrap();
    assert_eq!(got.bytes, Bytes::from(mbytes.clone()));
    assert_eq!(got.parse().unwrap(), Manifest::Image(manifest.clone()));
    st.clear();

    // range read: exactly one GET with the Range header, 5000 body bytes
    let stats0 = client.stats();
    let got = client
        .get_blob_range(&a, &d_big, 1_000_000, 5000)
        .await
        .unwrap();
    assert_eq!(&got[..], &big[1_000_000..1_005_000]);
    let r = st.requests();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].method.as_str(), r[0].status), ("GET", 206));
    assert_eq!(r[0].range.as_deref(), Some("bytes=1000000-1004999"));
    assert_eq!(r[0].response_bytes, 5000);
    let delta = client.stats().since(&stats0);
    assert_eq!(
        (delta.requests, delta.range_gets, delta.bytes_received),
        (1, 1, 5000)
    );
    // past the end: typed error
    let past = client
        .get_blob_range(&a, &d_big, big.len() as u64 + 10, 5)
        .await;
    assert!(
        matches!(past, Err(weenv_registry::RegistryError::BadRange { .. })),
        "{past:?} {:?}",
        st.requests()
    );
    st.clear();

    // streaming download
    let mut out = Vec::new();
    let n = client.get_blob_stream(&a, &d_big, &mut out).await.unwrap();
    assert_eq!((n, out == big), (big.len() as u64, true));
    st.clear();

    // BlobRangeReader from inside a multi-thread runtime: HEAD once, then one GET per read
    let rr = BlobRangeReader::new(
        client.clone(),
        tokio::runtime::Handle::current(),
        a.clone(),
        d_big.clone(),
    );
    assert_eq!(rr.size().unwrap(), big.len() as u64);
    assert_eq!(rr.size().unwrap(), big.len() as u64);
    assert_eq!(rr.read_at(7, 11).unwrap(), big[7..18].to_vec());
    // and from a plain thread
    let rr2 = rr.clone();
    let v = std::thread::spawn(move || rr2.read_at(100, 3).unwrap())
        .join()
        .unwrap();
    assert_eq!(v, big[100..103].to_vec());
    let methods: Vec<_> = st
        .requests()
        .into_iter()
        .map(|r| (r.method, r.range))
        .collect();
    assert_eq!(
        methods,
        vec![
            ("HEAD".to_string(), None),
            ("GET".to_string(), Some("bytes=7-17".to_string())),
            ("GET".to_string(), Some("bytes=100-102".to_string())),
        ]
    );
    // the client's own counters agree with the wire
    let total = client.stats();
    assert_eq!(total.token_requests, 0);
    assert_eq!(total.retries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn redirects_keep_range_and_full_bodies_are_sliced() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let redirect = CountingProxy::start_with(
        reg.addr(),
        ProxyOptions {
            redirect_blob_gets: true,
            ..Default::default()
        },
    )
    .unwrap();
    let ignore = CountingProxy::start_with(
        reg.addr(),
        ProxyOptions {
            ignore_range: true,
            ..Default::default()
        },
    )
    .unwrap();
    let client = Client::new(plain_http(&[redirect.host(), ignore.host()])).unwrap();
    let via_redirect: Reference = format!("{}/r/blob:x", redirect.host()).parse().unwrap();
    let via_ignore: Reference = format!("{}/r/blob:x", ignore.host()).parse().unwrap();
    let blob = data(200_000, 3);
    let d = Digest::sha256(&blob);
    client
        .push_blob(&via_ignore, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();

    let st = redirect.stats();
    st.clear();
    let got = client
        .get_blob_range(&via_redirect, &d, 500, 100)
        .await
        .unwrap();
    assert_eq!(&got[..], &blob[500..600]);
    let r = st.requests();
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!((r[0].status, r[1].status), (307, 206));
    assert!(r[1].path.ends_with("redirected=1"));
    assert_eq!(
        r[1].range.as_deref(),
        Some("bytes=500-599"),
        "Range kept across the redirect"
    );
    assert_eq!(client.stats().redirects, 1);

    let st = ignore.stats();
    st.clear();
    let got = client
        .get_blob_range(&via_ignore, &d, 150_000, 1000)
        .await
        .unwrap();
    assert_eq!(&got[..], &blob[150_000..151_000]);
    let r = st.requests();
    assert_eq!((r.len(), r[0].status), (1, 200));
    assert_eq!(client.stats().full_body_for_range, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn mirrors_are_tried_first_and_fall_through() {
    let tmp = tempfile::tempdir().unwrap();
    let origin_reg = LocalRegistry::start(&tmp.path().join("o")).unwrap();
    let mirror_reg = LocalRegistry::start(&tmp.path().join("m")).unwrap();
    let origin = CountingProxy::start(origin_reg.addr()).unwrap();
    let mirror = CountingProxy::start(mirror_reg.addr()).unwrap();
    let dead_port = weenv_integration::util::free_port().unwrap();
    let blob = data(10_000, 4);
    let d = Digest::sha256(&blob);
    // the blob exists at the origin only; another exists at the mirror only
    let direct = Client::new(plain_http(&[origin.host(), mirror.host()])).unwrap();
    let r_origin: Reference = format!("{}/lib/x:1", origin.host()).parse().unwrap();
    let r_mirror: Reference = format!("{}/lib/x:1", mirror.host()).parse().unwrap();
    direct
        .push_blob(&r_origin, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();
    let only_mirror = data(5_000, 5);
    let dm = Digest::sha256(&only_mirror);
    direct
        .push_blob(&r_mirror, &dm, Bytes::from(only_mirror.clone()))
        .await
        .unwrap();
    origin.stats().clear();
    mirror.stats().clear();

    // containerd-style hosts.toml: a dead mirror, then the mirror registry, then the origin
    let certs = tmp.path().join("certs.d");
    std::fs::create_dir_all(certs.join(origin.host())).unwrap();
    std::fs::write(
        certs.join(origin.host()).join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n\n[host.\"http://127.0.0.1:{dead_port}\"]\n  capabilities = [\"pull\"]\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            origin.host(),
            mirror.host()
        ),
    )
    .unwrap();
    let mut cfg = RegistryConfig {
        docker_credentials: false,
        hosts_dir: Some(certs),
        ..RegistryConfig::default()
    };
    cfg.retry.max_retries = 0;
    let client = Client::new(cfg).unwrap();
    // served by the mirror: the origin sees nothing
    assert_eq!(
        client.get_blob(&r_origin, &dm).await.unwrap(),
        Bytes::from(only_mirror)
    );
    assert_eq!(origin.stats().requests().len(), 0);
    assert_eq!(mirror.stats().requests().len(), 1);
    assert!(
        mirror.stats().requests()[0]
            .path
            .ends_with(&format!("?ns={}", origin.host().replace(':', "%3A"))),
        "mirrors get containerd's ns parameter: {:?}",
        mirror.stats().requests()[0].path
    );
    // mirror miss (404) falls through to the origin
    let got = client.get_blob_range(&r_origin, &d, 10, 20).await.unwrap();
    assert_eq!(&got[..], &blob[10..30]);
    assert_eq!(reqs(&mirror.stats())[1].2, 404);
    assert_eq!(origin.stats().requests().len(), 1);
    assert_eq!(
        client.stats().mirror_fallbacks,
        3,
        "dead mirror twice, 404 once: {:?}",
        client.stats()
    );
    // pushes never go to mirrors
    mirror.stats().clear();
    let nb = data(100, 6);
    client
        .push_blob(&r_origin, &Digest::sha256(&nb), Bytes::from(nb))
        .await
        .unwrap();
    assert_eq!(mirror.stats().requests().len(), 0);
}

/// A weenv layer's TOC costs one ranged GET with the descriptor hint, and one HEAD + one
/// ranged GET without it (the snapshotter's mount path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn weenv_layer_toc_costs_one_head_and_one_range_get() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let proxy = CountingProxy::start(reg.addr()).unwrap();
    let client = Client::new(plain_http(&[proxy.host()])).unwrap();
    let r: Reference = format!("{}/weenv/layer:1", proxy.host()).parse().unwrap();

    // a tar with a few small files and one 3 MiB file
    let mut tb = tar::Builder::new(Vec::new());
    for i in 0..50 {
        let body = format!("file {i}\n").repeat(i + 1);
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tb.append_data(&mut h, format!("dir/f{i}.txt"), body.as_bytes())
            .unwrap();
    }
    let big = data(3 << 20, 7);
    let mut h = tar::Header::new_gnu();
    h.set_size(big.len() as u64);
    h.set_mode(0o755);
    h.set_cksum();
    tb.append_data(&mut h, "bin/big", &big[..]).unwrap();
    let tar_bytes = tb.into_inner().unwrap();
    let mut blob = Vec::new();
    let summary =
        weenv_format::write_layer(&tar_bytes[..], &mut blob, &Default::default()).unwrap();
    assert_eq!(summary.blob_digest, Digest::sha256(&blob));
    client
        .push_blob(&r, &summary.blob_digest, Bytes::from(blob.clone()))
        .await
        .unwrap();
    let annotations = weenv_format::descriptor_annotations(&summary);
    let hint = weenv_format::TocHint::from_annotations(&annotations)
        .unwrap()
        .unwrap();
    let st = proxy.stats();

    // with the hint: one ranged GET, no HEAD
    st.clear();
    let handle = tokio::runtime::Handle::current();
    let reader = BlobRangeReader::new(
        client.clone(),
        handle.clone(),
        r.clone(),
        summary.blob_digest.clone(),
    );
    let layer = tokio::task::spawn_blocking(move || {
        weenv_format::LayerReader::open(reader, Some(hint)).map(|l| l.toc().entries.len())
    })
    .await
    .unwrap()
    .unwrap();
    assert!(layer >= 51);
    let seen: Vec<_> = st
        .requests()
        .into_iter()
        .map(|q| (q.method, q.range))
        .collect();
    assert_eq!(
        seen,
        vec![(
            "GET".to_string(),
            Some(format!(
                "bytes={}-{}",
                summary.toc_offset,
                summary.blob_size - 1
            ))
        )]
    );

    // without the hint: exactly one HEAD + one ranged GET
    st.clear();
    let reader = BlobRangeReader::new(
        client.clone(),
        handle,
        r.clone(),
        summary.blob_digest.clone(),
    );
    let opened = tokio::task::spawn_blocking(move || {
        let l = weenv_format::LayerReader::open(reader, None)?;
        let n = l.toc().entries.len();
        let bytes = l.read_file("bin/big", 1_500_000, 10)?;
        Ok::<_, weenv_format::FormatError>((n, bytes))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(opened.0, layer);
    assert_eq!(opened.1, big[1_500_000..1_500_010].to_vec());
    let seen: Vec<_> = st.requests().into_iter().map(|q| q.method).collect();
    assert_eq!(
        seen,
        vec!["HEAD", "GET", "GET"],
        "HEAD + TOC GET, then one frame GET for the read"
    );
    assert!(st.requests()[1].range.is_some() && st.requests()[2].range.is_some());
}

/// Numbers for the report (no timed asserts): sequential and concurrent range GETs straight
/// to the local registry. Run with `--nocapture` to see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn range_get_cost() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let client = Client::new(plain_http(&[reg.host()])).unwrap();
    let r: Reference = format!("{}/bench/blob:1", reg.host()).parse().unwrap();
    let blob = data(8 << 20, 9);
    let d = Digest::sha256(&blob);
    client
        .push_blob(&r, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();
    let n = 500u64;
    let t = std::time::Instant::now();
    for i in 0..n {
        let off = (i * 16_411) % (blob.len() as u64 - 4096);
        let got = client.get_blob_range(&r, &d, off, 4096).await.unwrap();
        assert_eq!(&got[..], &blob[off as usize..off as usize + 4096]);
    }
    let seq = t.elapsed();
    let t = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..128u64 {
        let (c, r, d) = (client.clone(), r.clone(), d.clone());
        tasks.push(tokio::spawn(async move {
            c.get_blob_range(&r, &d, i * 65_536, 65_536)
                .await
                .unwrap()
                .len()
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let conc = t.elapsed();
    assert_eq!(total, 128 * 65_536);
    println!(
        "range GET 4 KiB sequential: {:.0} us/request over {n}; 128 concurrent 64 KiB GETs: {:.1} ms ({:.0} MB/s)",
        seq.as_secs_f64() * 1e6 / n as f64,
        conc.as_secs_f64() * 1e3,
        total as f64 / conc.as_secs_f64() / 1e6
    );
    assert_eq!(client.stats().retries, 0);
}
