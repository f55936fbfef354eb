//! A weenv image whose TOC lies about the tar in the same blob (issue 9, hole 2), pushed to a
//! private registry: `weenv-convert verify` must exit non-zero and name the lie (entry and
//! field), while the honest image it was made from verifies.
//!
//! Lies: `bin/busybox` marked setuid only in the TOC; a character device `dev/mem` present only
//! in the TOC. (The full catalogue of lies is unit-tested in format/tests/tarcheck.rs and
//! converter/tests/lying_toc.rs; this checks the shipped binary against a real registry.)

use anyhow::{ensure, Context, Result};
use std::process::Command;
use std::sync::Arc;
use weenv_converter::{convert_image, registry_config, ConvertOptions, ImageLocation, NoProgress};
use weenv_format::EntryKind;
use weenv_integration::images::{busybox, OciImage};
use weenv_integration::registry::LocalRegistry;
use weenv_integration::untrusted_tocbind::lying_copy;
use weenv_integration::util::{require_root_and_bins, workspace_bin};

/// `weenv-convert --plain-http HOST verify REF`: (success, stdout + stderr).
fn verify(host: &str, reference: &str) -> Result<(bool, String)> {
    let out = Command::new(workspace_bin("weenv-convert")?)
        .args(["--plain-http", host, "verify", reference])
        .output()
        .context("running weenv-convert verify")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

#[test]
#[ignore = "needs root, docker-registry, skopeo and umoci (scripts/deps.sh)"]
fn verify_rejects_lying_tocs_from_a_registry() -> Result<()> {
    require_root_and_bins(&["docker-registry", "skopeo", "umoci"])?;
    let tmp = tempfile::tempdir()?;
    let registry = LocalRegistry::start(tmp.path())?;
    let host = registry.host();
    let src = busybox()?;
    let conv = tmp.path().join("conv");
    let honest = OciImage {
        layout: conv.clone(),
        tag: "honest".into(),
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(convert_image(
        &weenv_registry::Client::new(registry_config(&[]))?,
        &ImageLocation::parse(&src.oci_ref())?,
        &ImageLocation::parse(&honest.oci_ref())?,
        &ConvertOptions::default(),
        Arc::new(NoProgress),
    ))?;
    let setuid = lying_copy(&honest, "setuid", |t| {
        if let Some(e) = t.entries.iter_mut().find(|e| e.path == "bin/busybox") {
            e.mode |= 0o4000;
        }
    })?;
    let devmem = lying_copy(&honest, "devmem", |t| {
        let Some(mut dev) = t.entries.last().cloned() else {
            return;
        };
        // On the end-of-archive block: a placement validation accepts.
        let end = t.data_start(&dev).unwrap_or(dev.header + 512) + dev.size;
        dev.path = "dev/mem".into();
        dev.header = end.div_ceil(512) * 512;
        dev.kind = EntryKind::Char;
        dev.mode = 0o666;
        dev.devmajor = 1;
        dev.devminor = 1;
        dev.size = 0;
        dev.link = None;
        dev.chunks.clear();
        t.entries.push(dev);
    })?;
    let honest_ref = registry.push(&honest, "bb:honest")?;
    let setuid_ref = registry.push(&setuid, "bb:setuid")?;
    let devmem_ref = registry.push(&devmem, "bb:devmem")?;

    let (ok, out) = verify(&host, &honest_ref)?;
    ensure!(ok, "the honest image failed verify:\n{out}");
    eprintln!("honest: verify ok");

    let (ok, out) = verify(&host, &setuid_ref)?;
    ensure!(!ok, "verify accepted a TOC marking busybox setuid:\n{out}");
    ensure!(
        out.contains("bin/busybox") && out.contains("mode") && out.contains("0o4755"),
        "verify failed without naming the lie:\n{out}"
    );
    eprintln!("setuid lie:\n{out}");

    let (ok, out) = verify(&host, &devmem_ref)?;
    ensure!(!ok, "verify accepted a TOC with an extra device:\n{out}");
    ensure!(
        out.contains("dev/mem") && out.contains("no entry"),
        "verify failed without naming the lie:\n{out}"
    );
    eprintln!("device lie:\n{out}");
    Ok(())
}
