//! Start-up prefetch profiles on generated OCI layouts (no root, no daemons): a two-layer
//! image (the upper layer overrides one file and whites out another) is converted, profiled,
//! and checked frame by frame against its TOCs; blobs stay, the manifest verifies, the result
//! is deterministic, and the CLI does the same through `weenv-convert prefetch`.

#![allow(clippy::unwrap_used)]

mod common;

use common::two_layer::{convert, converted_two_layer, paths, PROFILE};
use common::{client, rt};
use std::collections::BTreeSet;
use std::path::Path;
use weenv_converter::{
    apply_profile, inspect_image, verify_image, ConvertError, ImageLocation, ProfileReport,
};
use weenv_format::prefetch::{decode_frames, ANNOTATION_PREFETCH};
use weenv_format::{FrameIdx, LayerReader, Toc, TocHint};
use weenv_registry::{ImageManifest, Manifest};

async fn apply(image: &str, to: Option<&str>, p: &[String]) -> Result<ProfileReport, ConvertError> {
    let to = to.map(|t| ImageLocation::parse(t).unwrap());
    apply_profile(
        &client(),
        &ImageLocation::parse(image)?,
        to.as_ref(),
        p,
        None,
    )
    .await
}

/// The manifest tagged `tag` in the layout at `dir`.
fn manifest(dir: &Path, tag: &str) -> ImageManifest {
    let d = weenv_converter::source::layout_lookup(dir, Some(tag)).unwrap();
    let bytes = std::fs::read(weenv_converter::source::layout_blob_path(dir, &d.digest)).unwrap();
    match Manifest::parse(&d.media_type, &bytes).unwrap() {
        Manifest::Image(m) => m,
        Manifest::Index(_) => panic!("index"),
    }
}

fn toc_of(dir: &Path, desc: &weenv_registry::Descriptor) -> Toc {
    let blob = std::fs::read(weenv_converter::source::layout_blob_path(dir, &desc.digest)).unwrap();
    let hint = TocHint::from_annotations(&desc.annotations).unwrap();
    LayerReader::open(blob, hint).unwrap().into_toc()
}

fn frames_of(toc: &Toc, files: &[&str]) -> Vec<FrameIdx> {
    let set: BTreeSet<FrameIdx> = files
        .iter()
        .flat_map(|f| toc.lookup(f).unwrap().chunks.iter().map(|c| c.frame))
        .collect();
    set.into_iter().collect()
}

#[test]
fn profile_annotates_exactly_the_frames_of_the_profile_files() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let (converted, dir, img) = converted_two_layer(tmp.path(), &rt);
    let before = manifest(&dir, "conv");

    let r = rt.block_on(apply(&img, None, &paths(PROFILE))).unwrap();
    assert_eq!(r.paths, PROFILE.len());
    let m = &r.manifests[0];
    assert_eq!(
        m.unresolved,
        paths(&["/d/gone", "/nope"]),
        "whited-out and absent paths are unresolved"
    );
    let after = manifest(&dir, "conv");
    assert_eq!(r.digest, m.digest);
    assert_ne!(r.digest, converted.digest);

    // Blobs unchanged: same config, same layer digests and sizes, nothing copied.
    assert_eq!(after.config, before.config);
    assert_eq!(after.layers.len(), 2);
    for (a, b) in after.layers.iter().zip(&before.layers) {
        assert_eq!((&a.digest, a.size), (&b.digest, b.size));
    }
    assert_eq!(
        (m.blobs.existing, m.blobs.mounted, m.blobs.written),
        (3, 0, 0)
    );

    // Per layer: exactly the frames of the files that layer provides in the merged view.
    let lower = toc_of(&dir, &after.layers[0]);
    let upper = toc_of(&dir, &after.layers[1]);
    let want_lower = frames_of(&lower, &["d/keep", "d/small"]);
    let want_upper = frames_of(&upper, &["d/over", "d/new"]);
    assert!(want_lower.len() >= 3 && want_upper.len() >= 2);
    // Files outside the profile do not drag in frames of their own.
    assert!(frames_of(&lower, &["d/other"])
        .iter()
        .any(|f| !want_lower.contains(f)));
    for (desc, toc, want) in [
        (&after.layers[0], &lower, &want_lower),
        (&after.layers[1], &upper, &want_upper),
    ] {
        let v = desc.annotations.get(ANNOTATION_PREFETCH).unwrap();
        assert_eq!(&decode_frames(v, toc.frames.len()).unwrap(), want, "{v}");
    }
    assert_eq!((m.layers[0].files, m.layers[1].files), (2, 2));
    assert_eq!(m.layers[0].frames, want_lower.len());
    let clen =
        |t: &Toc, w: &[FrameIdx]| -> u64 { w.iter().map(|f| t.frame(*f).unwrap().clen).sum() };
    assert_eq!(m.layers[0].bytes, clen(&lower, &want_lower));
    assert_eq!(m.layers[1].bytes, clen(&upper, &want_upper));
    assert_eq!(m.file_bytes, 9000 + 100 + 6000 + 800);

    // The image still verifies, and inspect shows the profile.
    let loc = ImageLocation::parse(&img).unwrap();
    let v = rt.block_on(verify_image(&client(), &loc, None)).unwrap();
    assert!(v.iter().all(|l| l.weenv && l.problems.is_empty()), "{v:?}");
    let info = rt.block_on(inspect_image(&client(), &loc, None)).unwrap();
    assert_eq!(info[0].prefetch_frames, Some(want_lower.len() as u64));
    assert_eq!(info[1].prefetch_frames, Some(want_upper.len() as u64));

    // Deterministic: applying again (in place, or to another tag) gives the same digest.
    let again = rt.block_on(apply(&img, None, &paths(PROFILE))).unwrap();
    assert_eq!(again.digest, r.digest);
    assert_eq!(again.manifests[0].source_digest, r.digest);
    let other = rt
        .block_on(apply(
            &img,
            Some(&format!("oci:{}:tag2", dir.display())),
            &paths(&[
                "/nope", "/d/keep", "/d/small", "d/link", "/d/over", "/d/new",
            ]),
        ))
        .unwrap();
    assert_eq!(other.digest, r.digest, "order and duplicates do not matter");

    // An empty profile removes the annotations: back to the converted manifest.
    let cleared = rt.block_on(apply(&img, None, &[])).unwrap();
    assert_eq!(cleared.digest, converted.digest);
}

#[test]
fn profile_to_another_layout_copies_blobs_once() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let (_, _, img) = converted_two_layer(tmp.path(), &rt);
    let in_place = rt.block_on(apply(&img, None, &paths(PROFILE))).unwrap();
    let elsewhere = format!("oci:{}:p", tmp.path().join("elsewhere").display());
    let r = rt
        .block_on(apply(&img, Some(&elsewhere), &paths(PROFILE)))
        .unwrap();
    assert_eq!(r.digest, in_place.digest);
    let b = r.manifests[0].blobs;
    assert_eq!((b.existing, b.mounted, b.written), (0, 0, 3));
    let again = rt
        .block_on(apply(&img, Some(&elsewhere), &paths(PROFILE)))
        .unwrap();
    assert_eq!(again.manifests[0].blobs.existing, 3);
    let v = rt
        .block_on(verify_image(
            &client(),
            &ImageLocation::parse(&elsewhere).unwrap(),
            None,
        ))
        .unwrap();
    assert!(v.iter().all(|l| l.problems.is_empty()), "{v:?}");
}

#[test]
fn bad_profiles_and_images_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let (_, dir, img) = converted_two_layer(tmp.path(), &rt);
    let index = std::fs::read(dir.join("index.json")).unwrap();
    match rt.block_on(apply(&img, None, &paths(&["/nope", "/d/gone", "/d"]))) {
        Err(ConvertError::ProfileUnresolved {
            paths: 3, first, ..
        }) => assert_eq!(first, "/nope"),
        other => panic!("expected ProfileUnresolved, got {other:?}"),
    }
    assert_eq!(std::fs::read(dir.join("index.json")).unwrap(), index);
    let src_img = format!("oci:{}:src", tmp.path().join("src").display());
    match rt.block_on(apply(&src_img, None, &paths(PROFILE))) {
        Err(ConvertError::NotWeenv { .. }) => {}
        other => panic!("expected NotWeenv, got {other:?}"),
    }
}

#[test]
fn cli_prefetch_reads_stdin_and_prints_json() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let (_, dir, img) = converted_two_layer(tmp.path(), &rt);
    let expected = rt
        .block_on(apply(
            &img,
            Some(&format!("oci:{}:lib", dir.display())),
            &paths(PROFILE),
        ))
        .unwrap();
    let bin = env!("CARGO_BIN_EXE_weenv-convert");
    let mut child = Command::new(bin)
        .args(["--json", "prefetch", &img, "--profile", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("# recorded by weenv profile\n{}\n", PROFILE.join("\n")).as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["digest"], expected.digest.as_str());
    assert_eq!(r["manifests"][0]["unresolved"].as_array().unwrap().len(), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 of 7 profile paths did not resolve"));

    // A missing profile file is a clear error.
    let out = Command::new(bin)
        .args(["prefetch", &img, "--profile", "/nonexistent/profile"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("reading the prefetch profile /nonexistent/profile"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // image SRC DST --prefetch-profile: convert and profile in one run, same result.
    let profile = tmp.path().join("profile.txt");
    std::fs::write(&profile, PROFILE.join("\n")).unwrap();
    let out = Command::new(bin)
        .args([
            "--json",
            "image",
            &format!("oci:{}:src", tmp.path().join("src").display()),
            &format!("oci:{}:both", dir.display()),
            "--frame-size",
            "4096",
            "--small-file-threshold",
            "1024",
            "--chunk-size",
            "2048",
            "--level",
            "3",
            "--shared-level",
            "3",
            "--prefetch-profile",
            profile.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["prefetch"]["digest"], expected.digest.as_str());
}

#[test]
fn index_platforms_are_profiled_each_against_its_own_layers() {
    use weenv_registry::Platform;
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let src = tmp.path().join("src");
    common::two_layer::index_source(&src);
    let dir = tmp.path().join("w");
    let converted = rt.block_on(convert(
        &format!("oci:{}:src", src.display()),
        &format!("oci:{}:conv", dir.display()),
    ));
    assert_eq!(converted.manifests.len(), 2);
    let img = format!("oci:{}:conv", dir.display());
    let loc = ImageLocation::parse(&img).unwrap();
    let index_of = |dir: &Path, tag: &str| {
        let d = weenv_converter::source::layout_lookup(dir, Some(tag)).unwrap();
        let bytes =
            std::fs::read(weenv_converter::source::layout_blob_path(dir, &d.digest)).unwrap();
        match Manifest::parse(&d.media_type, &bytes).unwrap() {
            Manifest::Index(ix) => ix,
            Manifest::Image(_) => panic!("manifest"),
        }
    };

    // Every platform: the arm64 image has no upper layer, so /d/gone resolves and /d/new not.
    let r = rt.block_on(apply(&img, None, &paths(PROFILE))).unwrap();
    assert_eq!(r.manifests.len(), 2);
    let by = |p: &str| {
        r.manifests
            .iter()
            .find(|m| m.platform.as_deref() == Some(p))
            .unwrap()
    };
    assert_eq!(by("linux/amd64").unresolved, paths(&["/d/gone", "/nope"]));
    assert_eq!(by("linux/arm64").unresolved, paths(&["/d/new", "/nope"]));
    assert_eq!(by("linux/arm64").layers[0].files, 5 - 1);
    let ix = index_of(&dir, "conv");
    let digests: Vec<String> = ix.manifests.iter().map(|d| d.digest.to_string()).collect();
    assert_eq!(
        digests,
        vec![
            by("linux/amd64").digest.clone(),
            by("linux/arm64").digest.clone()
        ]
    );
    assert_eq!(r.digest, common::sha(&serde_json::to_vec(&ix).unwrap()));
    let v = rt.block_on(verify_image(&client(), &loc, None)).unwrap();
    assert!(
        v.len() == 3 && v.iter().all(|l| l.problems.is_empty()),
        "{v:?}"
    );

    // One platform in place: the other entry stays as it was.
    let arm: Platform = "linux/arm64".parse().unwrap();
    let only = rt
        .block_on(apply_profile(
            &client(),
            &loc,
            None,
            &paths(&["/d/keep"]),
            Some(&arm),
        ))
        .unwrap();
    assert_eq!(only.manifests.len(), 1);
    let ix2 = index_of(&dir, "conv");
    assert_eq!(ix2.manifests[0], ix.manifests[0]);
    assert_ne!(ix2.manifests[1].digest, ix.manifests[1].digest);
    assert_eq!(ix2.manifests[1].platform, ix.manifests[1].platform);

    // One platform elsewhere: a plain manifest, as `image --platform` writes.
    let elsewhere = format!("oci:{}:p", tmp.path().join("elsewhere").display());
    let dst = ImageLocation::parse(&elsewhere).unwrap();
    let plain = rt
        .block_on(apply_profile(
            &client(),
            &loc,
            Some(&dst),
            &paths(&["/d/keep"]),
            Some(&arm),
        ))
        .unwrap();
    assert_eq!(plain.digest, only.manifests[0].digest);
    assert_eq!(
        plain.media_type,
        "application/vnd.oci.image.manifest.v1+json"
    );
    let v = rt.block_on(verify_image(&client(), &dst, None)).unwrap();
    assert!(v.len() == 1 && v[0].problems.is_empty(), "{v:?}");
}
