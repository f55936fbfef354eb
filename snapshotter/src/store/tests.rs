#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn store() -> (tempfile::TempDir, MetaStore) {
    let d = tempfile::tempdir().unwrap(); // ok: test code
    let s = MetaStore::open(&d.path().join("m.redb")).unwrap(); // ok: test code
    (d, s)
}

fn new(key: &str, parent: &str, kind: Kind) -> NewSnapshot {
    NewSnapshot {
        key: key.into(),
        parent: parent.into(),
        kind,
        labels: BTreeMap::new(),
        remote: None,
        usage: (0, 0),
        now_nanos: 1,
        native: Vec::new(),
    }
}

#[test]
fn create_commit_remove_lifecycle() -> TestResult {
    let (_d, s) = store();
    let a = s.create(new("a", "", Kind::Active))?;
    assert!(matches!(
        s.create(new("a", "", Kind::Active)),
        Err(StoreError::AlreadyExists(_))
    ));
    // parent must be committed
    assert!(matches!(
        s.create(new("b", "a", Kind::Active)),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.create(new("b", "nope", Kind::Active)),
        Err(StoreError::NotFound(_))
    ));
    let c = s.commit("c", "a", BTreeMap::new(), (10, 2), 5)?;
    assert_eq!(c.id, a.id);
    assert_eq!((c.size, c.inodes, c.kind), (10, 2, Kind::Committed));
    assert!(matches!(s.get("a"), Err(StoreError::NotFound(_))));
    // committing a committed snapshot is a precondition failure
    assert!(matches!(
        s.commit("d", "c", BTreeMap::new(), (0, 0), 5),
        Err(StoreError::FailedPrecondition(_))
    ));
    let v = s.create(new("v", "c", Kind::View))?;
    assert_ne!(v.id, c.id);
    assert!(matches!(
        s.remove("c"),
        Err(StoreError::FailedPrecondition(_))
    ));
    s.remove("v")?;
    s.remove("c")?;
    assert!(matches!(s.remove("c"), Err(StoreError::NotFound(_))));
    assert!(s.list()?.is_empty());
    Ok(())
}

#[test]
fn commit_name_collision() -> TestResult {
    let (_d, s) = store();
    s.create(new("a", "", Kind::Active))?;
    s.commit("c", "a", BTreeMap::new(), (0, 0), 1)?;
    s.create(new("a2", "", Kind::Active))?;
    assert!(matches!(
        s.commit("c", "a2", BTreeMap::new(), (0, 0), 1),
        Err(StoreError::AlreadyExists(_))
    ));
    // the failed transaction left a2 active
    assert_eq!(s.get("a2")?.kind, Kind::Active);
    Ok(())
}

#[test]
fn persists_across_reopen_and_ids_are_unique() -> TestResult {
    let d = tempfile::tempdir()?;
    let p = d.path().join("m.redb");
    let id1 = {
        let s = MetaStore::open(&p)?;
        s.put_ref("r:1", "sha256:x")?;
        s.create(new("a", "", Kind::Active))?.id
    };
    let s = MetaStore::open(&p)?;
    assert_eq!(s.get("a")?.id, id1);
    assert!(s.create(new("b", "", Kind::Active))?.id > id1);
    assert_eq!(s.get_ref("r:1")?.as_deref(), Some("sha256:x"));
    Ok(())
}

#[test]
fn label_updates() -> TestResult {
    let old: BTreeMap<_, _> = [("a".to_string(), "1".to_string()), ("b".into(), "2".into())].into();
    let newl: BTreeMap<_, _> =
        [("a".to_string(), "9".to_string()), ("c".into(), "3".into())].into();
    assert_eq!(apply_label_update(&old, &newl, &[])?, newl);
    let r = apply_label_update(&old, &newl, &["labels.a".into(), "labels.b".into()])?;
    assert_eq!(r, [("a".to_string(), "9".to_string())].into());
    assert!(apply_label_update(&old, &newl, &["parent".into()]).is_err());
    let (_d, s) = store();
    s.create(new("k", "", Kind::Active))?;
    let r = s.update_labels("k", &newl, &["labels.c".into()], 7)?;
    assert_eq!(r.labels.get("c").map(String::as_str), Some("3"));
    assert_eq!(r.updated_nanos, 7);
    assert!(matches!(
        s.update_labels("zz", &newl, &[], 7),
        Err(StoreError::NotFound(_))
    ));
    Ok(())
}

#[test]
fn remote_committed_and_layers() -> TestResult {
    let (_d, s) = store();
    let mut n = new("sha256:chain", "", Kind::Committed);
    assert!(s.create(n.clone()).is_err());
    n.remote = Some(RemoteLayerRef {
        digest: "sha256:l".into(),
        dir: "/mnt/l".into(),
        toc_digest: Some("sha256:t".into()),
        diff_id: Some("sha256:d".into()),
    });
    let r = s.create(n)?;
    assert_eq!(r.kind, Kind::Committed);
    let l = LayerRecord {
        digest: "sha256:l".into(),
        reference: "r/x:1".into(),
        size: 5,
        kind: LayerKind::Weenv {
            toc_path: "/t".into(),
        },
        toc_digest: Some("sha256:t".into()),
        diff_id: None,
        verified: false,
        quarantined: None,
    };
    s.put_layer(&l)?;
    assert_eq!(s.layer("sha256:l")?, Some(l.clone()));
    assert_eq!(s.layers()?, vec![l.clone()]);
    assert_eq!(s.layer("sha256:q")?, None);
    assert!(s.update_layer("sha256:l", |r| r.quarantined = Some("bad".into()))?);
    assert!(!s.update_layer("sha256:q", |_| {})?);
    assert_eq!(
        s.layer("sha256:l")?
            .ok_or("unexpected None")?
            .quarantined
            .as_deref(),
        Some("bad")
    );
    Ok(())
}

#[test]
fn records_of_older_daemons_still_decode() -> TestResult {
    let old =
        br#"{"digest":"sha256:l","reference":"r/x:1","size":5,"kind":"weenv","toc_path":"/t"}"#;
    let l: LayerRecord = serde_json::from_slice(old)?;
    assert_eq!(
        (l.toc_digest, l.diff_id, l.verified, l.quarantined),
        (None, None, false, None)
    );
    let old = br#"{"digest":"sha256:l","dir":"/mnt/l"}"#;
    let r: RemoteLayerRef = serde_json::from_slice(old)?;
    assert_eq!((r.toc_digest, r.diff_id), (None, None));
    Ok(())
}
