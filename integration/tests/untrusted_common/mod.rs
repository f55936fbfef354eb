//! Images shared by the `untrusted_*` tests: GOOD (the busybox test image converted to weenv,
//! in a private registry) and EVIL (busybox with another `/etc/weenv`, converted, whose image
//! config is GOOD's: it claims GOOD's diff_ids, so its chain ids are GOOD's).

#![allow(dead_code)]

use anyhow::{ensure, Context, Result};
use std::io::Read;
use std::process::{Command, Stdio};
use weenv_integration::images::{self, OciImage};
use weenv_integration::registry::LocalRegistry;
use weenv_integration::util::{require_root_and_bins, E2E_FUSE_BINS};
use weenv_registry::{Bytes, Client, Reference};

use crate::snapshotter_common::{client, convert};

pub const GOOD_TEXT: &str = "hello from weenv test image";
pub const EVIL_TEXT: &str = "EVIL: not the image you pulled";

/// The uncompressed tar of the (single, gzip) layer of `img`.
pub fn layout_layer_tar(img: &OciImage) -> Result<Vec<u8>> {
    let blob = |d: &str| {
        img.layout
            .join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(img.layout.join("index.json"))?)?;
    let md = index["manifests"][0]["digest"]
        .as_str()
        .context("index.json names no manifest")?;
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(blob(md))?)?;
    let ld = m["layers"][0]["digest"]
        .as_str()
        .context("manifest names no layer")?;
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(std::fs::File::open(blob(ld))?)
        .stdout(Stdio::piped())
        .spawn()
        .context("gzip -dc")?;
    let mut tar = Vec::new();
    child
        .stdout
        .take()
        .context("gzip stdout")?
        .read_to_end(&mut tar)?;
    ensure!(child.wait()?.success(), "gzip -dc failed");
    Ok(tar)
}

/// `tar` with the content of regular file `path` replaced by `data`.
pub fn replace_file(tar_bytes: &[u8], path: &str, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = tar::Builder::new(Vec::new());
    let mut found = false;
    for e in tar::Archive::new(tar_bytes).entries()? {
        let mut e = e?;
        let mut h = e.header().clone();
        let name = e
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if name == path {
            found = true;
            h.set_size(data.len() as u64);
            h.set_cksum();
            out.append(&h, data)?;
        } else {
            let mut body = Vec::new();
            e.read_to_end(&mut body)?;
            out.append(&h, &body[..])?;
        }
    }
    ensure!(found, "{path} not in the layer");
    Ok(out.into_inner()?)
}

/// Pushes GOOD's manifest with `blob` (annotated `annotations`) in place of GOOD's layer,
/// GOOD's config (diff_ids) unchanged, as `dest`. Returns the layer digest.
pub async fn push_with_layer(
    cl: &Client,
    good: &str,
    dest: &str,
    blob: Vec<u8>,
    annotations: std::collections::BTreeMap<String, String>,
) -> Result<String> {
    let digest = weenv_format::Digest::sha256(&blob);
    let size = blob.len();
    let rd: Reference = dest.parse()?;
    cl.push_blob(&rd, &digest, Bytes::from(blob)).await?;
    let (_, mb) = cl
        .get_image_manifest(
            &good.parse()?,
            "linux",
            &weenv_registry::manifest::host_platform().architecture,
            None,
        )
        .await?;
    let mut m: serde_json::Value = serde_json::from_slice(&mb.bytes)?;
    // GOOD's config (its diff_ids) in the destination repository too.
    let cd: weenv_format::Digest = m["config"]["digest"]
        .as_str()
        .context("manifest names no config")?
        .parse()?;
    let config = cl.get_blob(&good.parse()?, &cd).await?;
    cl.push_blob(&rd, &cd, config).await?;
    let layers = m["layers"].as_array_mut().context("manifest layers")?;
    ensure!(layers.len() == 1, "busybox has one layer");
    layers[0]["digest"] = digest.to_string().into();
    layers[0]["size"] = size.into();
    layers[0]["annotations"] = serde_json::to_value(annotations)?;
    cl.push_manifest(&rd, Bytes::from(serde_json::to_vec(&m)?), &mb.media_type)
        .await?;
    Ok(digest.to_string())
}

/// Pushes EVIL: busybox with another `/etc/weenv`, claiming GOOD's diff_ids.
pub async fn push_evil(cl: &Client, img: &OciImage, good: &str, evil: &str) -> Result<String> {
    let tar = replace_file(&layout_layer_tar(img)?, "etc/weenv", EVIL_TEXT.as_bytes())?;
    let mut blob = Vec::new();
    let sum = weenv_format::write_layer(&tar[..], &mut blob, &Default::default())?;
    // As weenv-convert writes them: stock clients' unpackers pass these to Prepare.
    let mut annotations = weenv_format::descriptor_annotations(&sum);
    weenv_format::snapshot_labels::add_snapshot_annotations(
        &weenv_format::Digest::sha256(&blob),
        &mut annotations,
    );
    push_with_layer(cl, good, evil, blob, annotations).await
}

/// A registry holding the busybox test image converted to weenv as `app:good` (GOOD).
pub struct Good {
    pub cl: Client,
    pub img: OciImage,
    pub host: String,
    pub good: String,
    pub reg: LocalRegistry,
    pub tmp: tempfile::TempDir,
}

pub async fn good_image() -> Result<Good> {
    require_root_and_bins(E2E_FUSE_BINS)?;
    let tmp = tempfile::tempdir()?;
    let reg = LocalRegistry::start(tmp.path())?;
    let host = reg.host();
    let img = images::busybox()?;
    let gz = reg.push(&img, "app:gz")?;
    let cl = client(std::slice::from_ref(&host))?;
    let good = format!("{host}/app:good");
    convert(&cl, &gz, &good).await?;
    Ok(Good {
        cl,
        img,
        host,
        good,
        reg,
        tmp,
    })
}

pub const CAT: &[&str] = &["/bin/cat", "/etc/weenv"];

/// Pushes `dest`: one weenv layer made of busybox's tar with another `/etc/weenv`, under an
/// image config that claims `diff_id` for it (another image's layer). Returns the layer digest.
pub async fn push_claiming(
    cl: &Client,
    img: &OciImage,
    dest: &str,
    diff_id: &str,
) -> Result<String> {
    let tar = replace_file(&layout_layer_tar(img)?, "etc/weenv", EVIL_TEXT.as_bytes())?;
    let mut blob = Vec::new();
    let sum = weenv_format::write_layer(&tar[..], &mut blob, &Default::default())?;
    let digest = weenv_format::Digest::sha256(&blob);
    let mut annotations = weenv_format::descriptor_annotations(&sum);
    weenv_format::snapshot_labels::add_snapshot_annotations(&digest, &mut annotations);
    let host = weenv_registry::manifest::host_platform();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": host.architecture,
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "config": {},
    }))?;
    let cd = weenv_format::Digest::sha256(&config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": cd.to_string(),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+zstd",
            "digest": digest.to_string(),
            "size": blob.len(),
            "annotations": annotations,
        }],
    });
    let rd: Reference = dest.parse()?;
    cl.push_blob(&rd, &digest, Bytes::from(blob)).await?;
    cl.push_blob(&rd, &cd, Bytes::from(config)).await?;
    cl.push_manifest(
        &rd,
        Bytes::from(serde_json::to_vec(&manifest)?),
        "application/vnd.oci.image.manifest.v1+json",
    )
    .await?;
    Ok(digest.to_string())
}
