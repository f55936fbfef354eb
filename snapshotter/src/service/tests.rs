#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;
use crate::remote::contest::{ClaimSource, ImageClaims};
use crate::remote::{MountedLayer, Verdict, LABEL_CRI_IMAGE_REF, LABEL_CRI_LAYER_DIGEST};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
/// Another weenv layer (the attacker's).
const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";

/// A weenv layer over a configured limit.
const D4: &str = "sha256:4444444444444444444444444444444444444444444444444444444444444444";

/// Fake provider: D1 and D3 are weenv layers, D4 one over a limit, everything else is not.
#[derive(Default)]
struct Fake {
    mounted: Mutex<Vec<String>>,
    released: Mutex<Vec<String>>,
    /// Layer digest -> the diff_id its image claims (none: the fake names no claim).
    claims: Mutex<HashMap<String, Digest>>,
    quarantined: Mutex<HashSet<String>>,
    /// (reference, manifest) of every mount request.
    requests: Mutex<Vec<(String, Option<String>)>>,
    /// What a verification of a layer concludes (absent: verified); every layer verified.
    verify_to: Mutex<HashMap<String, Verdict>>,
    verified: Mutex<Vec<String>>,
}

/// Where the fake exposes its layers: one directory per digest (a new snapshot's root takes
/// its parent's owner and mode, so the directory must exist), mode 0750.
fn fake_layer_dir(digest: &Digest) -> PathBuf {
    static ROOT: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let root = ROOT.get_or_init(|| tempfile::tempdir().unwrap()); // ok: test code
    let d = root.path().join(digest.hex());
    if !d.exists() {
        crate::dirs::ensure(&d, 0o750).unwrap(); // ok: test code
    }
    d
}

impl Fake {
    fn layer(&self, digest: &Digest) -> MountedLayer {
        MountedLayer {
            dir: fake_layer_dir(digest),
            size: 7,
            inodes: 3,
            toc_digest: Some(Digest::sha256(digest.as_str().as_bytes())),
            diff_id: self.claims.lock().get(digest.as_str()).cloned(),
        }
    }
}

#[async_trait::async_trait]
impl LayerProvider for Fake {
    async fn mount(&self, req: &RemoteLayerRequest) -> Result<Option<MountedLayer>, RemoteError> {
        if req.digest.as_str() == D4 {
            return Err(RemoteError::Limit(format!(
                "layer {D4}: its TOC entry count is 3000000, over the limit of 1000000"
            )));
        }
        if req.digest.as_str() != D1 && req.digest.as_str() != D3 {
            return Ok(None);
        }
        self.mounted.lock().push(req.digest.to_string());
        self.requests
            .lock()
            .push((req.reference.clone(), req.manifest.clone()));
        Ok(Some(self.layer(&req.digest)))
    }
    async fn remount(&self, digest: &Digest) -> Result<MountedLayer, RemoteError> {
        self.mounted.lock().push(digest.to_string());
        Ok(self.layer(digest))
    }
    fn release(&self, digest: &Digest) -> Result<(), RemoteError> {
        self.released.lock().push(digest.to_string());
        Ok(())
    }
    fn verdict(&self, digest: &Digest) -> Option<Verdict> {
        self.quarantined
            .lock()
            .contains(digest.as_str())
            .then(|| Verdict::Quarantined("diff_id mismatch".into()))
    }
    async fn verify(&self, digest: &Digest) -> Result<Verdict, RemoteError> {
        self.verified.lock().push(digest.to_string());
        let v = self
            .verify_to
            .lock()
            .get(digest.as_str())
            .cloned()
            .unwrap_or(Verdict::Verified);
        if matches!(v, Verdict::Quarantined(_)) {
            self.quarantined.lock().insert(digest.to_string());
        }
        Ok(v)
    }
    fn quarantined(&self, digest: &Digest) -> Option<String> {
        self.quarantined
            .lock()
            .contains(digest.as_str())
            .then(|| "diff_id mismatch".to_string())
    }
}

fn svc(d: &Path, fake: Option<Arc<Fake>>) -> SnapshotService {
    let store = Arc::new(MetaStore::open(&d.join("m.redb")).unwrap()); // ok: test code
    SnapshotService::new(
        store,
        d.join("snapshots"),
        fake.map(|f| f as Arc<dyn LayerProvider>),
    )
    .unwrap() // ok: test code
}

fn remote_labels(target: &str, digest: &str) -> HashMap<String, String> {
    [
        (LABEL_TARGET.to_string(), target.to_string()),
        (
            LABEL_CRI_IMAGE_REF.to_string(),
            "127.0.0.1:1/img:1".to_string(),
        ),
        (LABEL_CRI_LAYER_DIGEST.to_string(), digest.to_string()),
    ]
    .into()
}

#[tokio::test]
async fn ordinary_lifecycle_and_mount_shapes() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = svc(d.path(), None);
    let m = s.prepare("ns/1/extract a", "", HashMap::new()).await?;
    assert_eq!(m[0].kind, "bind");
    let upper = PathBuf::from(&m[0].source);
    std::fs::write(upper.join("f"), vec![1u8; 10000])?;
    let (size, inodes) = s.usage("ns/1/extract a")?;
    assert!(size >= 10000 && inodes == 2, "{size} {inodes}");
    s.commit("ns/2/L1", "ns/1/extract a", HashMap::new())?;
    assert_eq!(s.stat("ns/2/L1")?.kind, Kind::Committed);
    assert_eq!(s.usage("ns/2/L1")?, (size, inodes));
    assert!(matches!(
        s.mounts("ns/2/L1"),
        Err(SnapshotError::Store(StoreError::FailedPrecondition(_)))
    ));
    let m = s.prepare("ns/3/c", "ns/2/L1", HashMap::new()).await?;
    assert_eq!(m[0].kind, "overlay");
    assert!(m[0]
        .options
        .contains(&format!("lowerdir={}", upper.display())));
    assert_eq!(s.mounts("ns/3/c")?, m);
    let v = s.view("ns/4/v", "ns/2/L1", HashMap::new())?;
    assert_eq!(
        (v[0].kind.as_str(), v[0].source.as_str()),
        ("bind", upper.to_str().ok_or("upper dir is not UTF-8")?)
    );
    assert!(matches!(
        s.remove("ns/2/L1"),
        Err(SnapshotError::Store(StoreError::FailedPrecondition(_)))
    ));
    assert_eq!(s.walk(&["parent==ns/2/L1".into()])?.len(), 2);
    s.remove("ns/3/c")?;
    s.remove("ns/4/v")?;
    s.remove("ns/2/L1")?;
    assert!(!upper.exists());
    assert!(s.walk(&[])?.is_empty());
    Ok(())
}

#[tokio::test]
async fn remote_prepare_commits_and_says_already_exists() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake.clone()));
    let r = s
        .prepare(
            "ns/1/extract-x sha256:c1",
            "",
            remote_labels("sha256:c1", D1),
        )
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(ref t)) if t == "sha256:c1"));
    // the Walk containerd sends next finds it
    let w = s.walk(&[r#"labels."containerd.io/snapshot.ref"==sha256:c1,parent=="""#.into()])?;
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].kind, Kind::Committed);
    // same layer under another chain: same FUSE dir, a second record
    let r = s
        .prepare(
            "ns/5/extract-y sha256:c9",
            "sha256:c1",
            remote_labels("sha256:c9", D1),
        )
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    assert_eq!(s.stat("sha256:c9")?.parent, "sha256:c1");
    assert_eq!(s.usage("sha256:c9")?, (7, 3));
    // a non-weenv layer on top takes the ordinary path
    let m = s
        .prepare(
            "ns/6/extract-z",
            "sha256:c9",
            remote_labels("sha256:c10", D2),
        )
        .await?;
    let dir = fake_layer_dir(&D1.parse()?).display().to_string();
    assert!(
        m[0].options
            .iter()
            .any(|o| o == &format!("lowerdir={dir}:{dir}")),
        "{m:?}"
    );
    // Its root takes the owner and mode of the layer's root (the fake's dir, 0750).
    let upper = m[0]
        .options
        .iter()
        .find_map(|o| o.strip_prefix("upperdir="))
        .unwrap(); // ok: test code
    let (want, got) = (std::fs::metadata(&dir)?, std::fs::metadata(upper)?);
    assert_eq!(got.mode() & 0o7777, 0o750);
    assert_eq!((got.uid(), got.gid()), (want.uid(), want.gid()));
    // a repeated Prepare of an existing target answers AlreadyExists without mounting again
    let n = fake.mounted.lock().len();
    let r = s
        .prepare("ns/7/extract", "", remote_labels("sha256:c1", D1))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    assert_eq!(fake.mounted.lock().len(), n);
    let m = s.counters().render();
    assert!(
        m.contains("weenv_remote_prepares_total{outcome=\"remote\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("weenv_remote_prepares_total{outcome=\"not_weenv\"} 1"),
        "{m}"
    );
    Ok(())
}

/// Fake content store: D1 is listed by a manifest pulled from `reg.io/team/app`.
struct FakeSources;

#[async_trait::async_trait]
impl LayerSources for FakeSources {
    async fn source(
        &self,
        namespace: &str,
        layer: &Digest,
    ) -> Result<crate::remote::source::LayerSource, crate::remote::source::NoSource> {
        use crate::remote::source::{LayerSource, NoSource};
        match (namespace, layer.as_str()) {
            ("k8s.io", D1) => Ok(LayerSource {
                reference: format!("reg.io/team/app@{D2}"),
                manifest: D2.to_string(),
            }),
            ("down", _) => Err(NoSource::Unreachable("connection refused".into())),
            ("two", _) => Err(NoSource::AmbiguousHost {
                host: "reg.io".into(),
                candidates: vec!["reg.io:5000".into(), "reg.io:5001".into()],
            }),
            _ => Err(NoSource::NoManifest),
        }
    }
}

#[tokio::test]
async fn stock_client_prepares_find_the_image_in_the_content_store() -> TestResult {
    use weenv_format::snapshot_labels::ANNOTATION_SNAPSHOT_LAYER_DIGEST;
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake.clone())).with_sources(Arc::new(FakeSources));
    // What containerd's unpacker sends: the target and the inherited annotations only.
    let labels = |target: &str, digest: &str| -> HashMap<String, String> {
        [
            (LABEL_TARGET.to_string(), target.to_string()),
            (
                ANNOTATION_SNAPSHOT_LAYER_DIGEST.to_string(),
                digest.to_string(),
            ),
        ]
        .into()
    };
    let r = s
        .prepare_in("k8s.io", "ns/1/extract-x", "", labels("sha256:c1", D1))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(ref t)) if t == "sha256:c1"));
    assert_eq!(
        fake.requests.lock().clone(),
        vec![(format!("reg.io/team/app@{D2}"), Some(D2.to_string()))]
    );
    // Another namespace's content store does not list it: the ordinary path.
    let m = s
        .prepare_in("default", "ns/2/extract-y", "", labels("sha256:c2", D1))
        .await?;
    assert_eq!(m[0].kind, "bind");
    // Without a source lookup configured: the ordinary path, no lookup counted.
    let p = tempfile::tempdir()?;
    let plain = svc(p.path(), Some(fake.clone()));
    assert!(plain
        .prepare_in("k8s.io", "ns/3/e", "", labels("sha256:c3", D1))
        .await
        .is_ok());
    let m = s.counters().render();
    assert!(
        m.contains("weenv_remote_prepares_total{outcome=\"remote\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("weenv_remote_prepares_total{outcome=\"no_source\"} 1"),
        "{m}"
    );
    // containerd not answering, or a host name naming two registries: the ordinary path,
    // each counted apart.
    for (ns, key) in [("down", "ns/4/e"), ("two", "ns/5/e"), ("two", "ns/6/e")] {
        let m = s.prepare_in(ns, key, "", labels("sha256:c4", D1)).await?;
        assert_eq!(m[0].kind, "bind");
    }
    let m = s.counters().render();
    for want in [
        "weenv_remote_prepares_total{outcome=\"no_containerd\"} 1",
        "weenv_remote_prepares_total{outcome=\"ambiguous_source\"} 2",
        "weenv_remote_prepares_total{outcome=\"no_source\"} 1",
    ] {
        assert!(m.contains(want), "{want}\n{m}");
    }
    Ok(())
}

#[tokio::test]
async fn remount_all_and_cleanup() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    {
        let s = svc(d.path(), Some(fake.clone()));
        let _ = s.prepare("k", "", remote_labels("sha256:c1", D1)).await;
        s.prepare("orphan", "", HashMap::new()).await?;
    }
    let fake2 = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake2.clone()));
    assert_eq!(s.remount_all().await?, (1, 0));
    assert_eq!(*fake2.mounted.lock(), vec![D1.to_string()]);
    // orphan dir with no record is removed by cleanup
    std::fs::create_dir_all(d.path().join("snapshots/999/fs"))?;
    s.cleanup()?;
    assert!(!d.path().join("snapshots/999").exists());
    assert!(d.path().join("snapshots").read_dir()?.count() == 1);
    Ok(())
}

#[tokio::test]
async fn error_kinds() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = svc(d.path(), None);
    assert!(matches!(
        s.stat("x"),
        Err(SnapshotError::Store(StoreError::NotFound(_)))
    ));
    s.prepare("a", "", HashMap::new()).await?;
    assert!(matches!(
        s.prepare("a", "", HashMap::new()).await,
        Err(SnapshotError::Store(StoreError::AlreadyExists(_)))
    ));
    assert!(matches!(
        s.prepare("b", "a", HashMap::new()).await,
        Err(SnapshotError::Store(StoreError::InvalidArgument(_)))
    ));
    assert!(matches!(
        s.walk(&["name~=x".into()]),
        Err(SnapshotError::Filter(_))
    ));
    assert!(matches!(
        s.update("a", HashMap::new(), &["kind".into()]),
        Err(SnapshotError::Store(StoreError::InvalidArgument(_)))
    ));
    Ok(())
}

#[tokio::test]
async fn same_target_under_another_parent_gets_its_own_remote_snapshot() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = svc(d.path(), Some(Arc::new(Fake::default())));
    // namespace B unpacked the lower layer the ordinary way
    s.prepare("B/1/x", "", HashMap::new()).await?;
    s.commit("B/2/sha256:c1", "B/1/x", HashMap::new())?;
    let r = s
        .prepare("B/3/e", "B/2/sha256:c1", remote_labels("sha256:c2", D1))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    // namespace A has the lower layer as a remote snapshot, then the same upper target
    let _ = s.prepare("A/1/e", "", remote_labels("sha256:c1", D1)).await;
    let r = s
        .prepare("A/2/e", "sha256:c1", remote_labels("sha256:c2", D1))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    let w = s.walk(&[r#"labels."containerd.io/snapshot.ref"==sha256:c2"#.into()])?;
    let mut parents: Vec<_> = w.iter().map(|r| r.parent.as_str()).collect();
    parents.sort();
    assert_eq!(parents, vec!["B/2/sha256:c1", "sha256:c1"]);
    assert!(w.iter().any(|r| r.key.starts_with("sha256:c2@")));
    Ok(())
}

#[test]
fn remote_names() -> TestResult {
    let (d1, d3): (Digest, Digest) = (D1.parse()?, D3.parse()?);
    assert_eq!(
        remote_snapshot_name("sha256:t", "p", &d1, |_| false),
        "sha256:t"
    );
    let n = remote_snapshot_name("sha256:t", "p", &d1, |k| k == "sha256:t");
    assert!(n.starts_with("sha256:t@") && n.len() == "sha256:t@".len() + 16);
    assert_ne!(
        n,
        remote_snapshot_name("sha256:t", "p", &d3, |k| k == "sha256:t")
    );
    Ok(())
}

/// The issue's attack: EVIL (layer D3) claims GOOD's diff_ids, so its chain ids are GOOD's.
/// Pulled first in namespace A, it must not become what GOOD's Prepare in namespace B gets.
#[tokio::test]
async fn a_chain_bound_to_another_layer_is_never_reused() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake.clone()));
    let t = Digest::sha256(b"GOOD's diff_id").to_string();
    let r = s.prepare("A/1/extract", "", remote_labels(&t, D3)).await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    // GOOD in namespace B: same chain, its own layer -> the ordinary path (containerd unpacks
    // and checks the diff_id), not EVIL's snapshot
    let m = s.prepare("B/1/extract", "", remote_labels(&t, D1)).await?;
    assert_eq!(s.stat("B/1/extract")?.kind, Kind::Active);
    assert_eq!(m[0].kind, "bind");
    assert!(s.counters().render().contains("outcome=\"refused\"} 1"));
    // EVIL again (another namespace): its own snapshot is still reused
    let r = s.prepare("C/1/extract", "", remote_labels(&t, D3)).await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    // and the remote record names the layer it was made from
    let rec = s.stat(&t)?;
    let rl = rec.remote.ok_or("no remote record")?;
    assert_eq!(rl.digest, D3);
    assert!(rl.toc_digest.is_some());
    Ok(())
}

/// An ordinary committed snapshot carrying the chain's snapshot.ref label (anyone can commit
/// one with any label) is not a remote layer: the Prepare mounts its own, and containerd's
/// Walk finds the remote one first.
#[tokio::test]
async fn an_ordinary_snapshot_under_the_chain_is_not_the_remote_layer() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake.clone()));
    let t = Digest::sha256(b"diff").to_string();
    s.prepare("A/1/x", "", HashMap::new()).await?;
    let forged: HashMap<String, String> = [(LABEL_TARGET.to_string(), t.clone())].into();
    s.commit("A/2/forged", "A/1/x", forged)?;
    let r = s.prepare("B/1/extract", "", remote_labels(&t, D1)).await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    assert_eq!(*fake.mounted.lock(), vec![D1.to_string()]);
    let filter = format!(r#"labels."containerd.io/snapshot.ref"=={t},parent=="""#);
    let w = s.walk(&[filter])?;
    assert_eq!(w.len(), 2);
    assert_eq!(
        w[0].remote.as_ref().ok_or("no remote record")?.digest,
        D1,
        "remote first: {w:?}"
    );
    assert_eq!(w[1].key, "A/2/forged");
    Ok(())
}

#[tokio::test]
async fn quarantined_layers_and_false_claims_take_the_ordinary_path() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake.clone()));
    let good = Digest::sha256(b"good");
    fake.claims.lock().insert(D1.into(), good.clone());
    // a base layer's chain id is its diff_id: labels and config disagree -> refused
    let other = Digest::sha256(b"other").to_string();
    s.prepare("A/1/e", "", remote_labels(&other, D1)).await?;
    // consistent: committed; upper layer chain checked against the parent's chain
    let r = s
        .prepare("A/2/e", "", remote_labels(good.as_str(), D1))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    let up = Digest::sha256(b"up");
    fake.claims.lock().insert(D3.into(), up.clone());
    let wrong = weenv_registry::manifest::chain_id(Some(good.as_str()), good.as_str());
    s.prepare("A/3/e", good.as_str(), remote_labels(&wrong, D3))
        .await?;
    let right = weenv_registry::manifest::chain_id(Some(good.as_str()), up.as_str());
    let r = s
        .prepare("A/4/e", good.as_str(), remote_labels(&right, D3))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    // once quarantined, the existing snapshot is not handed out again
    fake.quarantined.lock().insert(D1.into());
    s.prepare("B/1/e", "", remote_labels(good.as_str(), D1))
        .await?;
    assert!(s.counters().render().contains("outcome=\"refused\"} 3"));
    Ok(())
}

#[tokio::test]
async fn a_layer_over_a_limit_fails_its_prepare() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = svc(d.path(), Some(Arc::new(Fake::default())));
    let e = s
        .prepare("ns/1/extract", "", remote_labels("sha256:c4", D4))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            SnapshotError::Remount {
                error: RemoteError::Limit(_),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(D4) && e.to_string().contains("over the limit"));
    assert_eq!(
        crate::grpc::status_of(&e).code(),
        tonic::Code::ResourceExhausted
    );
    assert!(
        s.stat("ns/1/extract").is_err(),
        "no ordinary snapshot either"
    );
    Ok(())
}

/// Claims read from a fixed list.
struct FixedClaims(Mutex<Vec<Arc<ImageClaims>>>);

#[async_trait::async_trait]
impl ClaimSource for FixedClaims {
    async fn claims(&self) -> Result<Vec<Arc<ImageClaims>>, String> {
        Ok(self.0.lock().clone())
    }
}

/// EVIL (layer D3) claims GOOD's diff_id and is committed first. Alone it is used unchecked;
/// once GOOD's manifest (layer D1, same diff_id) is among the claims, a Stat or a Prepare on
/// top of EVIL's snapshot waits for D3's verification: a mismatch quarantines it and the call
/// fails (FailedPrecondition, naming the layer), and from then on every call reaching it fails
/// without another verification. An honest layer that verifies is used.
#[tokio::test]
async fn contested_snapshots_are_verified_before_use_and_quarantined_ones_refused() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    let good = Digest::sha256(b"good diff");
    fake.claims.lock().insert(D3.into(), good.clone());
    let claims = Arc::new(FixedClaims(Mutex::new(vec![Arc::new(
        ImageClaims::new("sha256:evilm", &[D3.to_string()], &[good.to_string()]).unwrap(), // ok: test code
    )])));
    let s = svc(d.path(), Some(fake.clone())).with_claims(claims.clone());
    let r = s
        .prepare("default/1/extract", "", remote_labels(good.as_str(), D3))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    let key = good.to_string();
    // Not contested: no verification.
    s.stat_checked(&key).await?;
    s.check_parent(&key).await?;
    assert!(fake.verified.lock().is_empty());
    // GOOD's manifest arrives: contested. A layer that verifies is used.
    claims.0.lock().push(Arc::new(
        ImageClaims::new("sha256:goodm", &[D1.to_string()], &[good.to_string()]).unwrap(), // ok: test code
    ));
    s.stat_checked(&key).await?;
    assert_eq!(*fake.verified.lock(), vec![D3.to_string()]);
    // One that does not is quarantined: Stat and Prepare on top fail, loudly.
    fake.verify_to
        .lock()
        .insert(D3.into(), Verdict::Quarantined("diff_id mismatch".into()));
    let e = s.stat_checked(&key).await.unwrap_err();
    assert!(matches!(e, SnapshotError::Quarantined { .. }), "{e}");
    assert!(
        e.to_string().contains(D3) && e.to_string().contains("quarantined"),
        "{e}"
    );
    assert_eq!(
        crate::grpc::status_of(&e).code(),
        tonic::Code::FailedPrecondition
    );
    // Later Stats: NotFound (containerd's listings skip it); Prepares on it fail loudly.
    let e = s.stat_checked(&key).await.unwrap_err();
    assert_eq!(
        crate::grpc::status_of(&e).code(),
        tonic::Code::NotFound,
        "{e}"
    );
    let e = s
        .prepare("default/2/container", &key, HashMap::new())
        .await
        .unwrap_err();
    assert!(matches!(e, SnapshotError::Quarantined { .. }), "{e}");
    assert_eq!(
        fake.verified.lock().len(),
        2,
        "a quarantined layer is not verified again"
    );
    assert!(s
        .counters()
        .render()
        .contains("weenv_contested_snapshots_total 2"));
    // Without the contest check (to measure the attack) the same call is let through.
    let d2 = tempfile::tempdir()?;
    let s2 = svc(d2.path(), Some(Arc::new(Fake::default())))
        .with_claims(claims)
        .with_trust(TrustSection {
            check_contested: false,
            ..Default::default()
        });
    let r = s2
        .prepare("default/1/extract", "", remote_labels(good.as_str(), D3))
        .await;
    assert!(matches!(r, Err(SnapshotError::RemoteCommitted(_))));
    s2.stat_checked(&key).await?;
    Ok(())
}

/// `trust.lazy_sources`: an image from another repository takes the ordinary path.
#[tokio::test]
async fn images_outside_lazy_sources_take_the_ordinary_path() -> TestResult {
    let d = tempfile::tempdir()?;
    let fake = Arc::new(Fake::default());
    fake.claims.lock().insert(D1.into(), Digest::sha256(b"x"));
    let s = svc(d.path(), Some(fake.clone())).with_trust(TrustSection {
        lazy_sources: vec!["127.0.0.1:1/trusted".into()],
        ..Default::default()
    });
    let m = s
        .prepare(
            "ns/1/e",
            "",
            remote_labels(Digest::sha256(b"x").as_str(), D1),
        )
        .await?;
    assert_eq!(m[0].kind, "bind", "an ordinary snapshot");
    assert!(fake.mounted.lock().is_empty());
    assert!(s
        .counters()
        .render()
        .contains("outcome=\"untrusted_source\"} 1"));
    Ok(())
}

#[tokio::test]
async fn snapshot_dirs_have_overlayfs_modes_and_the_parent_root_s_mode() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = svc(d.path(), None);
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.mode() & 0o7777);
    assert_eq!(mode(&d.path().join("snapshots"))?, 0o700);
    let m = s.prepare("a", "", HashMap::new()).await?;
    let fs = PathBuf::from(&m[0].source);
    let id_dir = fs.parent().unwrap().to_path_buf(); // ok: test code
    assert_eq!(mode(&id_dir)?, 0o700);
    assert_eq!(mode(&fs)?, 0o755);
    assert_eq!(mode(&id_dir.join("work"))?, 0o711);
    // A committed parent whose root was made 0750 (a layer's root entry): the child's too.
    std::fs::set_permissions(&fs, std::fs::Permissions::from_mode(0o750))?;
    s.commit("c", "a", HashMap::new())?;
    for (key, view) in [("child", false), ("child-view", true)] {
        let m = if view {
            s.view(key, "c", HashMap::new())?
        } else {
            s.prepare(key, "c", HashMap::new()).await?
        };
        let upper = m[0]
            .options
            .iter()
            .find_map(|o| o.strip_prefix("upperdir="))
            .map(PathBuf::from)
            .unwrap_or_else(|| s.dir(s.stat(key).unwrap().id).join("fs")); // ok: test code
        assert_eq!(mode(&upper)?, 0o750, "{key}");
    }
    Ok(())
}
