//! A two-layer image for prefetch tests: the upper layer overrides one file of the lower one,
//! whites out another and adds one; small frames so files span several frames.

use super::{layout, put, sha};
use std::path::Path;

pub enum E<'a> {
    Dir(&'a str),
    File(&'a str, Vec<u8>),
    Link(&'a str, &'a str),
}

pub fn data(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 16) as u8
        })
        .collect()
}

pub fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_size(0);
        match e {
            E::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            E::File(p, d) => {
                h.set_size(d.len() as u64);
                b.append_data(&mut h, p, &d[..]).unwrap();
            }
            E::Link(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, p, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// The layer tars: lower holds keep, over, gone, small, other, link -> keep; upper overrides
/// over, whites out gone and adds new.
pub fn tars() -> (Vec<u8>, Vec<u8>) {
    let lower = tar_of(&[
        E::Dir("d/"),
        E::File("d/keep", data(1, 9000)),
        E::File("d/over", data(2, 5000)),
        E::File("d/gone", data(3, 3000)),
        E::File("d/small", data(4, 100)),
        E::File("d/other", data(5, 7000)),
        E::Link("d/link", "keep"),
    ]);
    let upper = tar_of(&[
        E::Dir("d/"),
        E::File("d/over", data(6, 6000)),
        E::File("d/.wh.gone", Vec::new()),
        E::File("d/new", data(7, 800)),
    ]);
    (lower, upper)
}

pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// An OCI layout at `dir` tagged `src` with the two-layer image of [`tars`].
pub fn two_layer_source(dir: &Path) {
    let (lower, upper) = tars();
    layout(
        dir,
        "src",
        &[(TAR, lower.clone()), (TAR, upper.clone())],
        &[sha(&lower), sha(&upper)],
    );
}

/// An OCI layout at `dir` tagged `src` holding an index: linux/amd64 is the two-layer image,
/// linux/arm64 only its lower layer.
pub fn index_source(dir: &Path) {
    let (lower, upper) = tars();
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let image = |arch: &str, layers: &[&Vec<u8>]| {
        let ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": arch, "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": ids}}))
        .unwrap();
        let cd = put(dir, &config);
        let descs: Vec<_> = layers
            .iter()
            .map(|b| serde_json::json!({"mediaType": TAR, "digest": put(dir, b), "size": b.len()}))
            .collect();
        let m = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
            "layers": descs}))
        .unwrap();
        serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": put(dir, &m), "size": m.len(),
            "platform": {"os": "linux", "architecture": arch}})
    };
    let ix = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [image("amd64", &[&lower, &upper]), image("arm64", &[&lower])]}))
    .unwrap();
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": put(dir, &ix), "size": ix.len(),
        "annotations": {"org.opencontainers.image.ref.name": "src"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
}

pub const PROFILE: &[&str] = &[
    "/d/keep", "/d/over", "/d/gone", "d/link", "/d/new", "/d/small", "/nope",
];

pub fn paths(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

/// The two-layer source under `tmp/src`, converted to the layout `tmp/w` tag `conv`:
/// (report, layout dir, `oci:` reference of the converted image).
pub fn converted_two_layer(
    tmp: &Path,
    rt: &tokio::runtime::Runtime,
) -> (weenv_converter::ImageReport, std::path::PathBuf, String) {
    let src = tmp.join("src");
    two_layer_source(&src);
    let dir = tmp.join("w");
    let report = rt.block_on(convert(
        &format!("oci:{}:src", src.display()),
        &format!("oci:{}:conv", dir.display()),
    ));
    let img = format!("oci:{}:conv", dir.display());
    (report, dir, img)
}

pub async fn convert(src: &str, dst: &str) -> weenv_converter::ImageReport {
    super::try_convert(src, dst).await.unwrap()
}
