//! Prefetch profiles on a registry (a `docker-registry` started by the test on a free
//! loopback port): in place nothing is copied, to another repository every blob is mounted,
//! a digest reference is rewritten by digest; the TOCs are read with ranged GETs.

#![allow(clippy::unwrap_used)]

mod common;

use common::two_layer::{convert, paths, two_layer_source, PROFILE};
use common::{rt, Registry};
use std::sync::Arc;
use weenv_converter::{
    apply_profile, convert_image, verify_image, ConvertOptions, ImageLocation, NoProgress,
};
use weenv_format::prefetch::ANNOTATION_PREFETCH;
use weenv_registry::{Manifest, Reference};

#[test]
#[ignore = "needs docker-registry"]
fn registry_profiles_copy_no_blob() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start(tmp.path()).expect("docker-registry is not installed");
    let client = reg.client();
    let rt = rt();
    let src = tmp.path().join("src");
    two_layer_source(&src);
    let dir = tmp.path().join("w");
    let layout = rt.block_on(convert(
        &format!("oci:{}:src", src.display()),
        &format!("oci:{}:conv", dir.display()),
    ));
    let img = format!("{}/a/img:conv", reg.host);
    let pushed = rt
        .block_on(convert_image(
            &client,
            &ImageLocation::parse(&format!("oci:{}:conv", dir.display())).unwrap(),
            &ImageLocation::parse(&img).unwrap(),
            &ConvertOptions::default(),
            Arc::new(NoProgress),
        ))
        .unwrap();
    assert_eq!(pushed.digest, layout.digest, "weenv layers pass through");
    let loc = |s: &str| ImageLocation::parse(s).unwrap();
    let apply = |image: &str, to: Option<&str>| {
        let to = to.map(loc);
        rt.block_on(apply_profile(
            &client,
            &loc(image),
            to.as_ref(),
            &paths(PROFILE),
            None,
        ))
        .unwrap()
    };

    // In place: every blob is already there.
    let r = apply(&img, None);
    let b = r.manifests[0].blobs;
    assert_eq!((b.existing, b.mounted, b.written), (3, 0, 0));
    assert_eq!(r.manifests[0].unresolved, paths(&["/d/gone", "/nope"]));
    let reference: Reference = img.parse().unwrap();
    let m = rt.block_on(client.get_manifest(&reference)).unwrap();
    assert_eq!(m.digest.to_string(), r.digest);
    let Manifest::Image(m) = Manifest::parse(&m.media_type, &m.bytes).unwrap() else {
        panic!("index")
    };
    assert!(m
        .layers
        .iter()
        .all(|l| l.annotations.contains_key(ANNOTATION_PREFETCH)));

    // The same profile on the layout gives the same manifest.
    let in_layout = rt
        .block_on(apply_profile(
            &common::client(),
            &loc(&format!("oci:{}:conv", dir.display())),
            None,
            &paths(PROFILE),
            None,
        ))
        .unwrap();
    assert_eq!(in_layout.digest, r.digest);

    // Another repository of the same registry: mounted, not uploaded.
    let other = format!("{}/b/img:p", reg.host);
    let r2 = apply(&img, Some(&other));
    let b = r2.manifests[0].blobs;
    assert_eq!((b.existing, b.mounted, b.written), (0, 3, 0));
    assert_eq!(r2.digest, r.digest);
    let v = rt
        .block_on(verify_image(&client, &loc(&other), None))
        .unwrap();
    assert!(v.iter().all(|l| l.weenv && l.problems.is_empty()), "{v:?}");

    // A digest reference: the rewritten manifest (here: an empty profile) goes by digest.
    let by_digest = format!("{}/a/img@{}", reg.host, r.digest);
    let cleared = rt
        .block_on(apply_profile(&client, &loc(&by_digest), None, &[], None))
        .unwrap();
    assert_eq!(cleared.digest, layout.digest);
    let back: Reference = format!("{}/a/img@{}", reg.host, cleared.digest)
        .parse()
        .unwrap();
    assert_eq!(
        rt.block_on(client.get_manifest(&back))
            .unwrap()
            .digest
            .to_string(),
        layout.digest
    );
}
