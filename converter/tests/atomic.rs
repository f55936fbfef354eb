//! Conversions into an OCI layout are atomic: a run that fails midway leaves the destination
//! exactly as it was (no blob, no scratch directory, same `index.json`), and the scratch of a
//! killed run is removed by the next run.

#![allow(clippy::unwrap_used)]

mod common;

use common::two_layer::{tars, TAR};
use common::{client, layout, rt, sha};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use weenv_converter::scratch::{LAYOUT_PREFIX, LOCK_FILE};
use weenv_converter::{convert_image, ConvertError, ConvertOptions, ImageLocation, NoProgress};

/// Every file under `dir` with the digest of its contents.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                out.insert(
                    format!("{}/", p.strip_prefix(dir).unwrap().display()),
                    String::new(),
                );
                stack.push(p);
            } else {
                let name = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(name, sha(&std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// One layer at a time, so the first layer is finished before the second fails.
async fn convert_serially(src: &str, dst: &str) -> Result<(), ConvertError> {
    convert_image(
        &client(),
        &ImageLocation::parse(src)?,
        &ImageLocation::parse(dst)?,
        &ConvertOptions {
            jobs: 1,
            ..Default::default()
        },
        Arc::new(NoProgress),
    )
    .await
    .map(drop)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A two-layer source whose second (gzip) layer turns to garbage halfway through its stream;
/// its size and digest match the descriptor, so the failure comes from the decoder, midway.
fn source_failing_midway(dir: &Path) {
    let (lower, upper) = tars();
    let mut bad = gzip(&upper);
    let n = bad.len();
    for b in &mut bad[n / 2..n - 8] {
        *b ^= 0x5a;
    }
    layout(
        dir,
        "src",
        &[(TAR, lower.clone()), (&format!("{TAR}+gzip"), bad)],
        &[sha(&lower), sha(&upper)],
    );
}

#[test]
fn a_failed_conversion_leaves_the_destination_layout_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    // Another image (only the upper layer): the failing run's config and first layer are new
    // to the destination.
    let good = tmp.path().join("good");
    let (_, upper) = tars();
    layout(&good, "src", &[(TAR, upper.clone())], &[sha(&upper)]);
    let bad = tmp.path().join("bad");
    source_failing_midway(&bad);
    let dst = tmp.path().join("dst");

    // An existing destination with one image in it.
    rt.block_on(convert_serially(
        &format!("oci:{}:src", good.display()),
        &format!("oci:{}:old", dst.display()),
    ))
    .unwrap();
    let before = snapshot(&dst);

    for tag in ["old", "new"] {
        let err = rt
            .block_on(convert_serially(
                &format!("oci:{}:src", bad.display()),
                &format!("oci:{}:{tag}", dst.display()),
            ))
            .unwrap_err();
        assert!(
            !matches!(err, ConvertError::BadOption { .. }),
            "fails in the layer: {err}"
        );
        assert_eq!(
            snapshot(&dst),
            before,
            "destination changed by a failed run ({err})"
        );
    }

    // A fresh destination gets no blob either.
    let fresh = tmp.path().join("fresh");
    rt.block_on(convert_serially(
        &format!("oci:{}:src", bad.display()),
        &format!("oci:{}:x", fresh.display()),
    ))
    .unwrap_err();
    let left: Vec<String> = snapshot(&fresh).into_keys().collect();
    assert!(left.is_empty(), "left in a fresh destination: {left:?}");
}

#[test]
fn the_next_run_removes_scratch_of_killed_runs_only() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let good = tmp.path().join("good");
    common::two_layer::two_layer_source(&good);
    let dst = tmp.path().join("dst");
    std::fs::create_dir_all(&dst).unwrap();
    // What a SIGKILLed run leaves: its scratch dir with the (now unlocked) lock file.
    let dead = dst.join(format!("{LAYOUT_PREFIX}Killed"));
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join(LOCK_FILE), b"").unwrap();
    std::fs::write(dead.join("out-0-partial"), vec![7u8; 1 << 20]).unwrap();
    // Not provably stale (no lock file): kept.
    let unknown = dst.join(format!("{LAYOUT_PREFIX}Unknown"));
    std::fs::create_dir(&unknown).unwrap();

    rt.block_on(convert_serially(
        &format!("oci:{}:src", good.display()),
        &format!("oci:{}:x", dst.display()),
    ))
    .unwrap();
    assert!(!dead.exists(), "stale scratch removed");
    assert!(unknown.exists(), "scratch without a lock file kept");
    let scratch: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(LAYOUT_PREFIX))
        .collect();
    assert_eq!(scratch, vec![format!("{LAYOUT_PREFIX}Unknown")]);
}
