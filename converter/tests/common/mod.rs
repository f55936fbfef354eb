//! Helpers shared by the converter's test binaries: OCI layouts built from blobs, a client,
//! a runtime.

#![allow(dead_code, clippy::unwrap_used)]

pub mod two_layer;

use sha2::{Digest as _, Sha256};
use std::path::Path;
use std::sync::Arc;
use weenv_converter::{
    convert_image, registry_config, ConvertError, ConvertOptions, ImageLocation, NoProgress,
};
use weenv_registry::Client;

/// Convert `src` to `dst` with small frames and chunks (files span several frames).
pub async fn try_convert(
    src: &str,
    dst: &str,
) -> Result<weenv_converter::ImageReport, ConvertError> {
    try_convert_with_workers(src, dst, ConvertOptions::default().workers).await
}

/// [`try_convert`] with the frames of each layer compressed on `workers` threads.
pub async fn try_convert_with_workers(
    src: &str,
    dst: &str,
    workers: usize,
) -> Result<weenv_converter::ImageReport, ConvertError> {
    convert_image(
        &client(),
        &ImageLocation::parse(src)?,
        &ImageLocation::parse(dst)?,
        &ConvertOptions {
            writer: weenv_format::writer::WriterOptions {
                frame_size: 4096,
                small_file_threshold: 1024,
                chunk_size: 2048,
                level: 3,
                shared_level: None,
            },
            workers,
            ..Default::default()
        },
        Arc::new(NoProgress),
    )
    .await
}

pub fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

pub fn put(dir: &Path, data: &[u8]) -> String {
    let d = sha(data);
    std::fs::write(dir.join("blobs/sha256").join(&d[7..]), data).unwrap();
    d
}

/// An OCI layout at `dir` with one image tagged `tag` whose layers are `layers`
/// (media type, blob) and whose diff_ids are `diff_ids`.
pub fn layout(dir: &Path, tag: &str, layers: &[(&str, Vec<u8>)], diff_ids: &[String]) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids}}))
    .unwrap();
    let cd = put(dir, &config);
    let descs: Vec<_> = layers
        .iter()
        .map(|(mt, b)| serde_json::json!({"mediaType": mt, "digest": put(dir, b), "size": b.len()}))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": descs})).unwrap();
    let md = put(dir, &manifest);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": manifest.len(),
        "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

pub fn client() -> Client {
    Client::new(registry_config(&[])).unwrap()
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A `docker-registry serve` on a free 127.0.0.1 port with storage under a temp dir; killed
/// (and reaped) on drop. `None` when the binary is not installed.
pub struct Registry {
    pub host: String,
    child: std::process::Child,
}

impl Registry {
    pub fn start(dir: &Path) -> Option<Registry> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let cfg = dir.join("registry.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
                dir.join("registry-data").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = std::process::Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .ok()?;
        let reg = Registry { host, child };
        let addr: std::net::SocketAddr = reg.host.parse().unwrap();
        for _ in 0..400 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Some(reg);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!(
            "docker-registry did not listen on {addr}; see {}",
            dir.join("registry.log").display()
        );
    }

    /// A client talking plain HTTP to this registry.
    pub fn client(&self) -> Client {
        Client::new(registry_config(std::slice::from_ref(&self.host))).unwrap()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
