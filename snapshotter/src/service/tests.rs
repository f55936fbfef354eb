#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use super::*;
use crate::remote::{MountedLayer, LABEL_CRI_IMAGE_REF, LABEL_CRI_LAYER_DIGEST};
use parking_lot::Mutex;

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

/// Fake provider: D1 is a weenv layer, everything else is not.
#[derive(Default)]
struct Fake {
    mounted: Mutex<Vec<String>>,
    released: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl LayerProvider for Fake {
    async fn mount(&self, req: &RemoteLayerRequest) -> Result<Option<MountedLayer>, RemoteError> {
        if req.digest.as_str() != D1 {
            return Ok(None);
        }
        self.mounted.lock().push(req.digest.to_string());
        Ok(Some(MountedLayer {
            dir: PathBuf::from(format!("/mnt/{}", req.digest.hex())),
            size: 7,
            inodes: 3,
        }))
    }
    async fn remount(&self, digest: &Digest) -> Result<MountedLayer, RemoteError> {
        self.mounted.lock().push(digest.to_string());
        Ok(MountedLayer {
            dir: PathBuf::from(format!("/mnt/{}", digest.hex())),
            size: 7,
            inodes: 3,
        })
    }
    fn release(&self, digest: &Digest) -> Result<(), RemoteError> {
        self.released.lock().push(digest.to_string());
        Ok(())
    }
}

fn svc(d: &Path, fake: Option<Arc<Fake>>) -> SnapshotService {
    let store = Arc::new(MetaStore::open(&d.join("m.redb")).unwrap());
    SnapshotService::new(
        store,
        d.join("snapshots"),
        fake.map(|f| f as Arc<dyn LayerProvider>),
    )
    .unwrap()
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
async fn ordinary_lifecycle_and_mount_shapes() {
    let d = tempfile::tempdir().unwrap();
    let s = svc(d.path(), None);
    let m = s
        .prepare("ns/1/extract a", "", HashMap::new())
        .await
        .unwrap();
    assert_eq!(m[0].kind, "bind");
    let upper = PathBuf::from(&m[0].source);
    std::fs::write(upper.join("f"), vec![1u8; 10000]).unwrap();
    let (size, inodes) = s.usage("ns/1/extract a").unwrap();
    assert!(size >= 10000 && inodes == 2, "{size} {inodes}");
    s.commit("ns/2/L1", "ns/1/extract a", HashMap::new())
        .unwrap();
    assert_eq!(s.stat("ns/2/L1").unwrap().kind, Kind::Committed);
    assert_eq!(s.usage("ns/2/L1").unwrap(), (size, inodes));
    assert!(matches!(
        s.mounts("ns/2/L1"),
        Err(SnapshotError::Store(StoreError::FailedPrecondition(_)))
    ));
    let m = s
        .prepare("ns/3/c", "ns/2/L1", HashMap::new())
        .await
        .unwrap();
    assert_eq!(m[0].kind, "overlay");
    assert!(m[0]
        .options
        .contains(&format!("lowerdir={}", upper.display())));
    assert_eq!(s.mounts("ns/3/c").unwrap(), m);
    let v = s.view("ns/4/v", "ns/2/L1", HashMap::new()).unwrap();
    assert_eq!(
        (v[0].kind.as_str(), v[0].source.as_str()),
        ("bind", upper.to_str().unwrap())
    );
    assert!(matches!(
        s.remove("ns/2/L1"),
        Err(SnapshotError::Store(StoreError::FailedPrecondition(_)))
    ));
    assert_eq!(s.walk(&["parent==ns/2/L1".into()]).unwrap().len(), 2);
    s.remove("ns/3/c").unwrap();
    s.remove("ns/4/v").unwrap();
    s.remove("ns/2/L1").unwrap();
    assert!(!upper.exists());
    assert!(s.walk(&[]).unwrap().is_empty());
}

#[tokio::test]
async fn remote_prepare_commits_and_says_already_exists() {
    let d = tempfile::tempdir().unwrap();
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
    let w = s
        .walk(&[r#"labels."containerd.io/snapshot.ref"==sha256:c1,parent=="""#.into()])
        .unwrap();
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
    assert_eq!(s.stat("sha256:c9").unwrap().parent, "sha256:c1");
    assert_eq!(s.usage("sha256:c9").unwrap(), (7, 3));
    // a non-weenv layer on top takes the ordinary path
    let m = s
        .prepare(
            "ns/6/extract-z",
            "sha256:c9",
            remote_labels("sha256:c10", D2),
        )
        .await
        .unwrap();
    let dir = format!("/mnt/{}", &D1[7..]);
    assert!(
        m[0].options
            .iter()
            .any(|o| o == &format!("lowerdir={dir}:{dir}")),
        "{m:?}"
    );
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
}

#[tokio::test]
async fn remount_all_and_cleanup() {
    let d = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    {
        let s = svc(d.path(), Some(fake.clone()));
        let _ = s.prepare("k", "", remote_labels("sha256:c1", D1)).await;
        s.prepare("orphan", "", HashMap::new()).await.unwrap();
    }
    let fake2 = Arc::new(Fake::default());
    let s = svc(d.path(), Some(fake2.clone()));
    assert_eq!(s.remount_all().await.unwrap(), (1, 0));
    assert_eq!(*fake2.mounted.lock(), vec![D1.to_string()]);
    // orphan dir with no record is removed by cleanup
    std::fs::create_dir_all(d.path().join("snapshots/999/fs")).unwrap();
    s.cleanup().unwrap();
    assert!(!d.path().join("snapshots/999").exists());
    assert!(d.path().join("snapshots").read_dir().unwrap().count() == 1);
}

#[tokio::test]
async fn error_kinds() {
    let d = tempfile::tempdir().unwrap();
    let s = svc(d.path(), None);
    assert!(matches!(
        s.stat("x"),
        Err(SnapshotError::Store(StoreError::NotFound(_)))
    ));
    s.prepare("a", "", HashMap::new()).await.unwrap();
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
}

#[tokio::test]
async fn same_target_under_another_parent_gets_its_own_remote_snapshot() {
    let d = tempfile::tempdir().unwrap();
    let s = svc(d.path(), Some(Arc::new(Fake::default())));
    // namespace B unpacked the lower layer the ordinary way
    s.prepare("B/1/x", "", HashMap::new()).await.unwrap();
    s.commit("B/2/sha256:c1", "B/1/x", HashMap::new()).unwrap();
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
    let w = s
        .walk(&[r#"labels."containerd.io/snapshot.ref"==sha256:c2"#.into()])
        .unwrap();
    let mut parents: Vec<_> = w.iter().map(|r| r.parent.as_str()).collect();
    parents.sort();
    assert_eq!(parents, vec!["B/2/sha256:c1", "sha256:c1"]);
    assert!(w.iter().any(|r| r.key.starts_with("sha256:c2@")));
}

#[test]
fn remote_names() {
    assert_eq!(remote_snapshot_name("sha256:t", "p", |_| false), "sha256:t");
    let n = remote_snapshot_name("sha256:t", "p", |k| k == "sha256:t");
    assert!(n.starts_with("sha256:t@") && n.len() == "sha256:t@".len() + 16);
}
