//! Tars that stock containerd unpacks but a weenv TOC cannot represent are kept as ordinary
//! layers (with a note naming the layer and the entry); names longer than 255 bytes, which
//! containerd cannot unpack either, fail the conversion with a clear error.

#![allow(clippy::unwrap_used)]

mod common;

use common::{layout, rt, sha, try_convert};
use weenv_converter::{verify_image, ImageLocation, LayerAction};

fn header(path: &str, kind: tar::EntryType, size: u64, link: Option<&str>) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(size);
    if let Some(l) = link {
        h.set_link_name(l).unwrap();
    }
    h.set_path(path).unwrap();
    h.set_cksum();
    h
}

fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, k, d, l) in entries {
        b.append(&header(p, *k, d.len() as u64, *l), *d).unwrap();
    }
    b.into_inner().unwrap()
}

/// Convert a two-layer image (an ordinary first layer, `second` on top) and return the
/// report's layers and the verify verdicts of the result.
fn convert_with_second(second: Vec<u8>) -> Result<Vec<weenv_converter::LayerReport>, String> {
    let tmp = tempfile::tempdir().unwrap();
    let first = tar_of(&[("usr/lib/x", tar::EntryType::Regular, b"lower", None)]);
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    layout(
        &src,
        "t",
        &[
            ("application/vnd.oci.image.layer.v1.tar", first.clone()),
            ("application/vnd.oci.image.layer.v1.tar", second.clone()),
        ],
        &[sha(&first), sha(&second)],
    );
    let rt = rt();
    let r = rt
        .block_on(try_convert(
            &format!("oci:{}:t", src.display()),
            &format!("oci:{}:w", dst.display()),
        ))
        .map_err(|e| e.to_string())?;
    let loc = ImageLocation::parse(&format!("oci:{}:w", dst.display())).unwrap();
    let v = rt
        .block_on(verify_image(&common::client(), &loc, None))
        .unwrap();
    assert!(v.iter().all(|l| l.problems.is_empty()), "{v:?}");
    assert!(v[0].weenv && !v[1].weenv, "{v:?}");
    Ok(r.manifests[0].layers.clone())
}

fn assert_kept_plain(second: Vec<u8>, entry: &str) {
    let layers = convert_with_second(second).unwrap();
    assert_eq!(layers[0].action, LayerAction::Converted);
    assert_eq!(layers[1].action, LayerAction::Plain);
    assert_eq!(layers[1].digest, layers[1].source_digest);
    let note = layers[1].note.as_deref().unwrap();
    assert!(note.contains("layer 1") && note.contains(entry), "{note}");
}

#[test]
fn duplicate_entries_keep_the_layer_plain() {
    let t = tar_of(&[
        ("etc/conf", tar::EntryType::Regular, b"old", None),
        ("etc/conf", tar::EntryType::Regular, b"new!", None),
    ]);
    assert_kept_plain(t, "etc/conf");
}

#[test]
fn hardlink_to_a_lower_layer_keeps_the_layer_plain() {
    let t = tar_of(&[
        ("bin/tool", tar::EntryType::Regular, b"t", None),
        ("usr/lib/y", tar::EntryType::Link, b"", Some("usr/lib/x")),
    ]);
    assert_kept_plain(t, "usr/lib/y");
}

#[test]
fn hardlink_chain_keeps_the_layer_plain() {
    let t = tar_of(&[
        ("a", tar::EntryType::Regular, b"payload", None),
        ("b", tar::EntryType::Link, b"", Some("a")),
        ("c", tar::EntryType::Link, b"", Some("b")),
    ]);
    assert_kept_plain(t, "\"c\" -> \"b\"");
}

#[test]
fn gnu_sparse_file_keeps_the_layer_plain() {
    let t = tar_of(&[("var/sparse", tar::EntryType::GNUSparse, b"", None)]);
    assert_kept_plain(t, "var/sparse");
}

#[test]
fn names_over_255_bytes_fail_the_conversion() {
    let long = format!("opt/{}", "n".repeat(256));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(1);
    b.append_data(&mut h, &long, &b"x"[..]).unwrap();
    let t = b.into_inner().unwrap();
    let err = convert_with_second(t).unwrap_err();
    assert!(
        err.contains("255 bytes") && err.contains("NAME_MAX"),
        "{err}"
    );
    // Said once, not twice.
    assert_eq!(err.matches("NAME_MAX").count(), 1, "{err}");
}
