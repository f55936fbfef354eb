//! Weenv layers whose TOC passes validation but lies about the tar stream in the same blob
//! (built with the public format API): `verify` must fail and name the lie; the honest layer
//! verifies. Also the tars the format cannot represent (kept as ordinary layers) and names
//! longer than 255 bytes (refused).

#![allow(clippy::unwrap_used)]

mod common;

use common::{put, rt, sha};
use std::path::Path;
use weenv_converter::layer::hint_annotations;
use weenv_converter::{verify_image, ImageLocation, LayerVerdict};
use weenv_format::toc::{EntryKind, Toc};
use weenv_format::writer::{retail, write_layer, WriterOptions};
use weenv_format::{LayerReader, MEDIA_TYPE_LAYER_ZSTD};

/// path, type, mode, payload, link target.
type Spec<'a> = (&'a str, tar::EntryType, u32, &'a [u8], Option<&'a str>);

fn tar_with(entries: &[Spec]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, mode, data, link) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h.set_path(path).unwrap();
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn busybox_tar() -> Vec<u8> {
    use tar::EntryType as T;
    tar_with(&[
        ("bin", T::Directory, 0o755, b"", None),
        ("bin/busybox", T::Regular, 0o755, &[0xbb; 5000], None),
        ("bin/sh", T::Symlink, 0o777, b"", Some("busybox")),
        ("etc", T::Directory, 0o755, b"", None),
        ("etc/motd", T::Regular, 0o644, b"hello\n", None),
        ("etc/secret", T::Regular, 0o600, b"s3cret\n", None),
    ])
}

/// A weenv blob of `tar` plus its TOC and TOC offset.
fn weenv(tar: &[u8]) -> (Vec<u8>, Toc, u64) {
    let mut blob = Vec::new();
    let opts = WriterOptions {
        frame_size: 4096,
        small_file_threshold: 1024,
        chunk_size: 2048,
        level: 3,
        shared_level: None,
    };
    let s = write_layer(tar, &mut blob, &opts).unwrap();
    let toc = LayerReader::open(&blob[..], None).unwrap().into_toc();
    (blob, toc, s.toc_offset)
}

/// An OCI layout holding one single-layer image `tag`, layer annotated like a converted one.
fn layout_with_layer(
    dir: &Path,
    tag: &str,
    blob: &[u8],
    hint: &weenv_format::TocHint,
    diff_id: &str,
) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}}))
    .unwrap();
    let cd = put(dir, &config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": [{"mediaType": MEDIA_TYPE_LAYER_ZSTD, "digest": put(dir, blob), "size": blob.len(),
                    "annotations": hint_annotations(hint)}]}))
    .unwrap();
    let md = put(dir, &manifest);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": manifest.len(),
        "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// Verify the image made of `tar` with its TOC changed by `lie`.
fn verify_lie(lie: impl Fn(&mut Toc)) -> LayerVerdict {
    let tar = busybox_tar();
    let (blob, mut toc, toc_offset) = weenv(&tar);
    lie(&mut toc);
    let (blob, hint) = retail(&blob, toc_offset, &toc).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    layout_with_layer(tmp.path(), "t", &blob, &hint, &sha(&tar));
    let loc = ImageLocation::parse(&format!("oci:{}:t", tmp.path().display())).unwrap();
    let mut v = rt()
        .block_on(verify_image(&common::client(), &loc, None))
        .unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

/// Append an empty file `path` to the TOC, its header on the tar's end-of-archive block (a
/// placement validation accepts).
fn push_fake<'t>(t: &'t mut Toc, path: &str) -> &'t mut weenv_format::Entry {
    let mut fake = t.entries.last().unwrap().clone();
    let end = t.data_start(&fake).unwrap() + fake.size;
    fake.path = path.into();
    fake.header = end.div_ceil(512) * 512;
    fake.size = 0;
    fake.chunks.clear();
    t.entries.push(fake);
    t.entries.last_mut().unwrap()
}

fn idx(toc: &Toc, path: &str) -> usize {
    toc.entries.iter().position(|e| e.path == path).unwrap()
}

fn assert_lie_named(v: &LayerVerdict, words: &[&str]) {
    assert!(v.weenv, "{v:?}");
    let all = v.problems.join("\n");
    assert!(!v.problems.is_empty(), "verify accepted a lying TOC");
    for w in words {
        assert!(all.contains(w), "{w:?} not in {all}");
    }
}

#[test]
fn honest_layer_verifies() {
    let v = verify_lie(|_| {});
    assert!(v.weenv && v.problems.is_empty(), "{v:?}");
}

#[test]
fn setuid_busybox_only_in_the_toc() {
    let v = verify_lie(|t| {
        let i = idx(t, "bin/busybox");
        t.entries[i].mode |= 0o4000;
    });
    assert_lie_named(&v, &["bin/busybox", "mode", "0o4755", "0o755"]);
}

#[test]
fn extra_char_device_only_in_the_toc() {
    let v = verify_lie(|t| {
        let dev = push_fake(t, "dev/mem");
        dev.kind = EntryKind::Char;
        dev.mode = 0o666;
        dev.devmajor = 1;
        dev.devminor = 1;
    });
    assert_lie_named(&v, &["dev/mem", "no entry"]);
}

#[test]
fn path_served_from_another_files_bytes() {
    // etc/motd served from etc/secret's payload; secret left out of the TOC so the placement
    // rules (data between an entry's header and the next one) still hold.
    let v = verify_lie(|t| {
        let s = idx(t, "etc/secret");
        let m = idx(t, "etc/motd");
        let mut c = t.entries[s].chunks[0].clone();
        c.len = 6;
        t.entries[m].chunks = vec![c];
        t.entries.remove(s);
    });
    assert_lie_named(&v, &["etc/motd", "content mapping"]);
}

#[test]
fn file_grown_by_repeating_a_frame_is_refused_by_validation() {
    let tar = busybox_tar();
    let (blob, mut toc, toc_offset) = weenv(&tar);
    let i = idx(&toc, "bin/busybox");
    let e = &mut toc.entries[i];
    let mut again = e.chunks[0].clone();
    again.file_offset = e.size;
    e.size += again.len;
    e.chunks.push(again);
    let err = retail(&blob, toc_offset, &toc).unwrap_err();
    assert!(err.to_string().contains("bin/busybox"), "{err}");
}

#[test]
fn file_present_only_in_the_toc() {
    // An empty etc/sudoers placed on the end-of-archive block (valid placement).
    let v = verify_lie(|t| {
        push_fake(t, "etc/sudoers");
    });
    assert_lie_named(&v, &["etc/sudoers", "no entry"]);
}

#[test]
fn toc_missing_a_tar_entry() {
    let v = verify_lie(|t| {
        let i = idx(t, "etc/secret");
        t.entries.remove(i);
    });
    assert_lie_named(&v, &["etc/secret", "no entry"]);
}

#[test]
fn wrong_owner_and_link() {
    let v = verify_lie(|t| {
        let i = idx(t, "etc/secret");
        t.entries[i].uid = 1000;
    });
    assert_lie_named(&v, &["etc/secret", "uid"]);
    let v = verify_lie(|t| {
        let i = idx(t, "bin/sh");
        t.entries[i].link = Some("/proc/self/root".into());
    });
    assert_lie_named(&v, &["bin/sh", "link target"]);
}
