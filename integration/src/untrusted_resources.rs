//! Images for the resource tests (`tests/untrusted_resources.rs`): images of incompressible
//! data (to fill a small disk cache) and a hand-made weenv layer whose TOC lists millions of
//! entries (memory amplification), pushed with the registry client.

use crate::images::{umoci_new, umoci_repack_sh, OciImage};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;
use weenv_format::footer::{skippable_header, Footer, SKIPPABLE_HEADER, TOC_SKIPPABLE_MAGIC};
use weenv_format::Digest;

/// Deterministic incompressible bytes (xorshift64*).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A one-layer OCI image (umoci, gzip) under `dir`, tag `data`: `big` files of `big_bytes`
/// and `small` files of 4 KiB, all incompressible and distinct per `seed`.
pub fn data_image(
    dir: &Path,
    seed: u64,
    big: usize,
    big_bytes: usize,
    small: usize,
) -> Result<OciImage> {
    let layout = dir.join("oci");
    let img = umoci_new(&layout, "data")?;
    let bundle = dir.join("bundle");
    let out = Command::new("umoci")
        .args(["unpack", "--image", &img])
        .arg(&bundle)
        .output()
        .context("running umoci unpack")?;
    anyhow::ensure!(
        out.status.success(),
        "umoci unpack: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = bundle.join("rootfs/data");
    std::fs::create_dir_all(data.join("small"))?;
    for i in 0..big {
        std::fs::write(
            data.join(format!("big{i:03}")),
            noise(seed * 1_000_003 + i as u64, big_bytes),
        )?;
    }
    for i in 0..small {
        std::fs::write(
            data.join(format!("small/{i:04}")),
            noise(seed * 7_000_001 + 500_000 + i as u64, 4096),
        )?;
    }
    umoci_repack_sh(&img, &bundle, "PATH=/bin")?;
    std::fs::remove_dir_all(&bundle)?;
    Ok(OciImage {
        layout,
        tag: "data".into(),
    })
}

/// A hand-made weenv layer blob: one zstd frame holding a tiny tar (one file), then a TOC
/// listing `entries` directory entries (most of them not in the tar), then the footer.
/// Returns (blob, diff_id of the tar, compressed TOC digest, TOC offset, TOC frame length).
pub fn huge_toc_blob(entries: u64) -> Result<HugeToc> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("a")?;
    h.set_size(1);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append(&h, &b"x"[..])?;
    let tar = tar.into_inner()?;
    let frame0 = zstd::bulk::compress(&tar, 3)?;
    let v2 = weenv_format::FORMAT_VERSION >= 2;
    let mut json = String::with_capacity(entries as usize * 64 + 256);
    json.push_str(&format!(
        "{{\"version\":{},\"frames\":[{{\"offset\":0,\"clen\":{},\"ulen\":{},\"digest\":\"{}\"}}],\"entries\":[",
        weenv_format::FORMAT_VERSION,
        frame0.len(),
        tar.len(),
        Digest::sha256(&tar)
    ));
    for i in 0..entries {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "{{\"path\":\"d{i}\",\"kind\":\"dir\",\"mode\":493,\"mtime\":0"
        ));
        if v2 {
            json.push_str(&format!(",\"header\":{}", i * 512));
        }
        json.push('}');
    }
    json.push_str("]}");
    let payload = zstd::bulk::compress(json.as_bytes(), 3)?;
    drop(json);
    let toc_offset = frame0.len() as u64;
    let toc_len = (SKIPPABLE_HEADER + payload.len()) as u64;
    let toc_digest = Digest::sha256(&payload);
    let footer = Footer {
        version: weenv_format::FORMAT_VERSION,
        toc_offset,
        toc_len,
        toc_digest: toc_digest.clone(),
    };
    let mut blob = frame0;
    blob.extend_from_slice(&skippable_header(
        TOC_SKIPPABLE_MAGIC,
        u32::try_from(payload.len())?,
    ));
    blob.extend_from_slice(&payload);
    blob.extend_from_slice(&footer.encode());
    Ok(HugeToc {
        blob,
        diff_id: Digest::sha256(&tar),
        toc_digest,
        toc_offset,
        toc_len,
    })
}

/// See [`huge_toc_blob`].
pub struct HugeToc {
    pub blob: Vec<u8>,
    pub diff_id: Digest,
    pub toc_digest: Digest,
    pub toc_offset: u64,
    pub toc_len: u64,
}

/// Pushes a one-layer image (`layer` with its diff_id and descriptor annotations) as
/// `reference`; returns the manifest digest.
pub async fn push_one_layer_image(
    client: &weenv_registry::Client,
    reference: &str,
    layer: &[u8],
    diff_id: &Digest,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Digest> {
    let r: weenv_registry::Reference = reference.parse()?;
    let config = serde_json::json!({
        "architecture": weenv_registry::manifest::host_platform().architecture,
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id.to_string()]},
    })
    .to_string()
    .into_bytes();
    let cd = Digest::sha256(&config);
    let ld = Digest::sha256(layer);
    client
        .push_blob(&r, &cd, bytes::Bytes::from(config.clone()))
        .await?;
    client
        .push_blob(&r, &ld, bytes::Bytes::copy_from_slice(layer))
        .await?;
    let ann: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd.to_string(), "size": config.len()},
        "layers": [{"mediaType": weenv_format::MEDIA_TYPE_LAYER_ZSTD, "digest": ld.to_string(), "size": layer.len(), "annotations": ann}],
    })
    .to_string();
    Ok(client
        .push_manifest(
            &r,
            bytes::Bytes::from(manifest),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .await?)
}

/// A weenv layer (made by the format writer) of `entries` tar entries shaped like a distro
/// tree: one directory per 50 entries, 10% symlinks, the rest small files (100–300 bytes).
/// Returns the blob and its summary (diff_id, TOC location).
pub fn many_entries_layer(entries: u64) -> Result<(Vec<u8>, weenv_format::LayerSummary)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut dir = String::new();
    for i in 0..entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000 + i);
        if i % 50 == 0 {
            dir = format!("usr/share/pkg{:05}/dir{i:07}", i / 5000);
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            tar.append_data(&mut h, &dir, &[][..])?;
        } else if i % 10 == 1 {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            tar.append_link(
                &mut h,
                format!("{dir}/link{i:07}"),
                format!("file{:07}", i - 1),
            )?;
        } else {
            let data = noise(i, 100 + (i % 200) as usize);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            tar.append_data(&mut h, format!("{dir}/file{i:07}.py"), &data[..])?;
        }
    }
    let tar = tar.into_inner()?;
    let mut blob = Vec::new();
    let summary =
        weenv_format::write_layer(&tar[..], &mut blob, &weenv_format::WriterOptions::default())?;
    Ok((blob, summary))
}
