//! The conversion pipeline on generated OCI layouts (no root, no daemons): round trip through
//! `zstd` decoding, verify, determinism, pass-through, and the typed errors for bad sources.

#![allow(clippy::unwrap_used)]

mod common;

use common::{client, layout, rt, sha, try_convert as convert, try_convert_with_workers};
use flate2::write::GzEncoder;
use proptest::prelude::*;
use std::io::{Read, Write};
use std::path::Path;
use weenv_converter::{verify_image, ConvertError, ImageLocation, LayerAction};

fn tar_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    b.append_data(&mut h, "d/", std::io::empty()).unwrap();
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, format!("d/{name}"), &data[..])
            .unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd_decode(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(std::fs::File::open(path).unwrap())
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn files_strategy() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    prop::collection::btree_map(
        "[a-z]{1,12}",
        prop::collection::vec(
            prop::sample::select(vec![0u8, 1, 7, b'a', b'z', 255]),
            0..9000,
        ),
        1..12,
    )
    .prop_map(|m| m.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn converted_layers_decode_to_the_source_tar(files in files_strategy(), plain in any::<bool>()) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        let tar = tar_of(&files);
        let (mt, blob) = if plain {
            ("application/vnd.oci.image.layer.v1.tar", tar.clone())
        } else {
            ("application/vnd.docker.image.rootfs.diff.tar.gzip", gzip(&tar))
        };
        layout(&src, "t", &[(mt, blob)], &[sha(&tar)]);
        let rt = rt();
        let dst = tmp.path().join("dst");
        let r = rt.block_on(convert(&format!("oci:{}:t", src.display()), &format!("oci:{}:w", dst.display()))).unwrap();
        let l = &r.manifests[0].layers[0];
        prop_assert_eq!(l.action, LayerAction::Converted);
        prop_assert_eq!(l.tar_size, tar.len() as u64);
        let out = dst.join("blobs/sha256").join(&l.digest[7..]);
        prop_assert!(zstd_decode(&out) == tar, "zstd -d of the converted layer differs from the tar");
        let v = rt.block_on(verify_image(&client(), &ImageLocation::parse(&format!("oci:{}:w", dst.display())).unwrap(), None)).unwrap();
        prop_assert!(v[0].weenv && v[0].problems.is_empty(), "{:?}", v);
        // Deterministic whatever the number of compression workers (1 = the layer's thread
        // compresses; the first conversion used one per core), and a second conversion of the
        // result passes the layer through.
        for workers in [1, 3] {
            let r2 = rt.block_on(try_convert_with_workers(&format!("oci:{}:t", src.display()), &format!("oci:{}:w2", dst.display()), workers)).unwrap();
            prop_assert_eq!(&r2.digest, &r.digest);
        }
        let r3 = rt.block_on(convert(&format!("oci:{}:w", dst.display()), &format!("oci:{}:w3", dst.display()))).unwrap();
        prop_assert_eq!(r3.manifests[0].layers[0].action, LayerAction::Passthrough);
        prop_assert_eq!(&r3.digest, &r.digest);
    }
}

#[test]
fn bad_sources_give_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let tar = tar_of(&[("a".into(), b"hello".to_vec())]);
    let dst = format!("oci:{}:x", tmp.path().join("dst").display());

    let src = tmp.path().join("wrong-diff-id");
    layout(
        &src,
        "t",
        &[("application/vnd.oci.image.layer.v1.tar", tar.clone())],
        &[sha(b"other")],
    );
    match rt.block_on(convert(&format!("oci:{}:t", src.display()), &dst)) {
        Err(ConvertError::DiffIdMismatch { index: 0, .. }) => {}
        other => panic!("expected DiffIdMismatch, got {other:?}"),
    }

    let src = tmp.path().join("unsupported");
    layout(
        &src,
        "t",
        &[("application/vnd.example.layer+squashfs", tar.clone())],
        &[sha(&tar)],
    );
    match rt.block_on(convert(&format!("oci:{}:t", src.display()), &dst)) {
        Err(ConvertError::UnsupportedMediaType { media_type, .. }) => {
            assert!(media_type.contains("squashfs"))
        }
        other => panic!("expected UnsupportedMediaType, got {other:?}"),
    }

    match rt.block_on(convert(&format!("oci:{}:nope", src.display()), &dst)) {
        Err(ConvertError::MissingReference { available, .. }) => assert_eq!(available, "t"),
        other => panic!("expected MissingReference, got {other:?}"),
    }

    let src = tmp.path().join("corrupt");
    layout(
        &src,
        "t",
        &[("application/vnd.oci.image.layer.v1.tar+gzip", gzip(&tar))],
        &[sha(&tar)],
    );
    // Truncate the layer blob: the descriptor size no longer matches.
    let m = std::fs::read_dir(src.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read(p).unwrap().starts_with(&[0x1f, 0x8b]))
        .unwrap();
    let data = std::fs::read(&m).unwrap();
    std::fs::write(&m, &data[..data.len() / 2]).unwrap();
    match rt.block_on(convert(&format!("oci:{}:t", src.display()), &dst)) {
        Err(ConvertError::CorruptBlob { .. }) => {}
        other => panic!("expected CorruptBlob, got {other:?}"),
    }

    match rt.block_on(convert(
        &format!("oci:{}", tmp.path().join("missing").display()),
        &dst,
    )) {
        Err(ConvertError::BadImage { .. }) => {}
        other => panic!("expected BadImage, got {other:?}"),
    }
}

#[test]
fn weenv_layers_without_annotations_are_recognised_by_their_footer() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let tar = tar_of(&[("a".into(), vec![7u8; 5000]), ("b".into(), b"x".to_vec())]);
    let src = tmp.path().join("src");
    layout(
        &src,
        "t",
        &[("application/vnd.oci.image.layer.v1.tar", tar.clone())],
        &[sha(&tar)],
    );
    let dst = tmp.path().join("dst");
    let r = rt
        .block_on(convert(
            &format!("oci:{}:t", src.display()),
            &format!("oci:{}:w", dst.display()),
        ))
        .unwrap();
    let weenv_blob = std::fs::read(
        dst.join("blobs/sha256")
            .join(&r.manifests[0].layers[0].digest[7..]),
    )
    .unwrap();
    // The same blob in an image whose descriptor lost the annotations (e.g. via docker-archive).
    let again = tmp.path().join("again");
    layout(
        &again,
        "t",
        &[("application/vnd.oci.image.layer.v1.tar+zstd", weenv_blob)],
        &[sha(&tar)],
    );
    let r2 = rt
        .block_on(convert(
            &format!("oci:{}:t", again.display()),
            &format!("oci:{}:w", dst.display()),
        ))
        .unwrap();
    assert_eq!(r2.manifests[0].layers[0].action, LayerAction::Passthrough);
    assert_eq!(
        r2.manifests[0].layers[0].digest,
        r.manifests[0].layers[0].digest
    );
    // The rewritten descriptor carries the annotations again: same manifest as the first time.
    assert_eq!(r2.digest, r.digest);
}

#[test]
fn repeated_layers_convert_to_repeated_descriptors() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let tar = tar_of(&[("a".into(), vec![3u8; 3000])]);
    let gz = gzip(&tar);
    let src = tmp.path().join("src");
    let mt = "application/vnd.oci.image.layer.v1.tar+gzip";
    layout(
        &src,
        "t",
        &[(mt, gz.clone()), (mt, gz.clone()), (mt, gz)],
        &[sha(&tar), sha(&tar), sha(&tar)],
    );
    let dst = tmp.path().join("dst");
    let r = rt
        .block_on(convert(
            &format!("oci:{}:t", src.display()),
            &format!("oci:{}:w", dst.display()),
        ))
        .unwrap();
    let layers = &r.manifests[0].layers;
    assert_eq!(layers.len(), 3);
    assert!(layers.iter().all(|l| l.digest == layers[0].digest));
    let v = rt
        .block_on(verify_image(
            &client(),
            &ImageLocation::parse(&format!("oci:{}:w", dst.display())).unwrap(),
            None,
        ))
        .unwrap();
    assert!(v.iter().all(|l| l.problems.is_empty()), "{v:?}");
}
