//! Weak spots of issue 9, end to end with the built binaries:
//! - a SIGKILLed `weenv-convert image ... oci:DIR:TAG` leaves the destination layout unchanged
//!   except for its locked scratch directory, which the next run removes before it succeeds;
//! - `weenv-snapshotter` whose `observability.listen` is taken exits at start, naming it;
//! - `weenv --config MISSING` is an error naming the file;
//! - (root) `weenv pull --platform linux/s390x` of a single-platform amd64 image fails naming
//!   both platforms.

mod fuse_common;
mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use fuse_common::noise;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use weenv_integration::util::workspace_bin;

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn put(dir: &Path, data: &[u8]) -> Result<String> {
    let d = sha(data);
    std::fs::write(dir.join("blobs/sha256").join(&d[7..]), data)?;
    Ok(d)
}

/// A tar of `files` noise files of `size` bytes each.
fn tar_of(seed: u64, files: usize, size: usize) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_size(size as u64);
        b.append_data(
            &mut h,
            format!("d{seed}/f{i}"),
            &noise(seed * 100 + i as u64, size)[..],
        )?;
    }
    Ok(b.into_inner()?)
}

/// An OCI layout tagged `src` with two uncompressed layers of `mib` MiB each.
fn big_layout(dir: &Path, mib: usize) -> Result<()> {
    std::fs::create_dir_all(dir.join("blobs/sha256"))?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let layers = [tar_of(1, mib / 4, 4 << 20)?, tar_of(2, mib / 4, 4 << 20)?];
    let ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": ids}}))?;
    let cd = put(dir, &config)?;
    let mut descs = Vec::new();
    for l in &layers {
        descs.push(
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": put(dir, l)?, "size": l.len()}),
        );
    }
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": descs}))?;
    let md = put(dir, &m)?;
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": m.len(),
        "annotations": {"org.opencontainers.image.ref.name": "src"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    Ok(())
}

/// Every file under `dir` (relative path -> size and content digest), scratch dirs apart.
fn snapshot(dir: &Path, skip_prefix: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let rel = e.path().strip_prefix(dir)?.display().to_string();
            if rel.starts_with(skip_prefix) {
                continue;
            }
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(rel, sha(&std::fs::read(e.path())?));
            }
        }
    }
    Ok(out)
}

fn scratch_dirs(dir: &Path) -> Result<Vec<String>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let n = e?.file_name().to_string_lossy().into_owned();
        if n.starts_with(".weenv-convert") {
            v.push(n);
        }
    }
    Ok(v)
}

/// Size of the largest file named `prefix*` in the scratch dirs of `dir`.
fn largest_in_scratch(dir: &Path, prefix: &str) -> u64 {
    let mut best = 0;
    for s in scratch_dirs(dir).unwrap_or_default() {
        if let Ok(rd) = std::fs::read_dir(dir.join(s)) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(prefix) {
                    best = best.max(e.metadata().map(|m| m.len()).unwrap_or(0));
                }
            }
        }
    }
    best
}

#[test]
fn sigkilled_conversion_leaves_the_layout_unchanged_and_the_rerun_cleans_up() -> Result<()> {
    let bin = workspace_bin("weenv-convert")?;
    let tmp = tempfile::tempdir()?;
    let src = tmp.path().join("src");
    big_layout(&src, 96)?;
    let dst = tmp.path().join("dst");
    let src_ref = format!("oci:{}:src", src.display());
    let dst_ref = format!("oci:{}:big", dst.display());

    // The destination holds an image already.
    let small = tmp.path().join("small");
    std::fs::create_dir_all(small.join("blobs/sha256"))?;
    let layer = tar_of(3, 1, 1000)?;
    let config = serde_json::to_vec(&serde_json::json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha(&layer)]}}))?;
    let cd = put(&small, &config)?;
    let ld = put(&small, &layer)?;
    let m = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": layer.len()}]}))?;
    let md = put(&small, &m)?;
    std::fs::write(
        small.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    std::fs::write(
        small.join("index.json"),
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": m.len(),
        "annotations": {"org.opencontainers.image.ref.name": "src"}}]}))?,
    )?;
    let out = Command::new(&bin)
        .args(["image", &format!("oci:{}:src", small.display())])
        .arg(format!("oci:{}:old", dst.display()))
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = snapshot(&dst, ".weenv-convert")?;
    ensure!(scratch_dirs(&dst)?.is_empty());

    // Kill the conversion once the first layer is finished (staged) and the second is being
    // written: both kinds of partial output exist at that moment.
    let mut child = Command::new(&bin)
        .args(["image", "--jobs", "1", &src_ref, &dst_ref])
        .spawn()?;
    let t0 = Instant::now();
    loop {
        if largest_in_scratch(&dst, "staged-") > (1 << 20) && largest_in_scratch(&dst, "out-") > 0 {
            break;
        }
        if let Some(st) = child.try_wait()? {
            anyhow::bail!(
                "conversion ended ({st}) before it could be killed midway; make the input larger"
            );
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(300),
            "conversion did not progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().context("kill the converter")?;
    child.wait()?;
    let left = scratch_dirs(&dst)?;
    eprintln!(
        "killed after {:?}; scratch left: {left:?}, {} MiB staged",
        t0.elapsed(),
        largest_in_scratch(&dst, "staged-") >> 20
    );
    ensure!(
        left.len() == 1,
        "one scratch dir of the killed run: {left:?}"
    );
    ensure!(
        snapshot(&dst, ".weenv-convert")? == before,
        "the killed run changed the layout outside its scratch dir"
    );

    // The rerun removes the dead run's scratch and succeeds; nothing is left behind.
    let out = Command::new(&bin)
        .args(["image", &src_ref, &dst_ref])
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        scratch_dirs(&dst)?.is_empty(),
        "scratch left after the rerun: {:?}",
        scratch_dirs(&dst)?
    );
    let after = snapshot(&dst, ".weenv-convert")?;
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dst.join("index.json"))?)?;
    let tags: Vec<&str> = index["manifests"]
        .as_array()
        .context("manifests")?
        .iter()
        .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str())
        .collect();
    ensure!(tags == ["old", "big"], "tags {tags:?}");
    // The old image's blobs are untouched.
    for (k, v) in &before {
        if k != "index.json" {
            ensure!(after.get(k) == Some(v), "{k} changed");
        }
    }
    let out = Command::new(&bin).args(["verify", &dst_ref]).output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn snapshotter_exits_at_start_when_its_status_address_is_taken() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let socket = tmp.path().join("snap.sock");
    let config = tmp.path().join("config.toml");
    let mut cfg = weenv_snapshotter_api::config::Config {
        root_dir: tmp.path().join("state"),
        socket: socket.clone(),
        ..Default::default()
    };
    cfg.observability.listen = addr.clone();
    std::fs::write(&config, weenv_integration::daemon::config_text(&cfg)?)?;
    let mut child = Command::new(workspace_bin("weenv-snapshotter")?)
        .arg("--config")
        .arg(&config)
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            child.kill()?;
            child.wait()?;
            anyhow::bail!("the daemon kept running with {addr} taken");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().context("stderr")?, &mut err)?;
    ensure!(!status.success(), "exit {status}");
    let last = err.lines().last().unwrap_or_default();
    ensure!(
        last.contains(&addr) && last.contains("observability.listen"),
        "stderr: {err}"
    );
    ensure!(!socket.exists(), "it served containerd before failing");
    Ok(())
}

#[test]
fn weenv_with_a_missing_config_file_fails_naming_it() -> Result<()> {
    let o = Command::new(workspace_bin("weenv")?)
        .args(["--config", "/nonexistent/weenv-config.toml", "status"])
        .output()?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(!o.status.success(), "exit {}: {err}", o.status);
    ensure!(
        err.matches("/nonexistent/weenv-config.toml").count() == 1,
        "{err}"
    );
    ensure!(err.matches("No such file").count() == 1, "said once: {err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, containerd, runc, docker-registry, skopeo, umoci and busybox-static"]
async fn pull_for_another_platform_of_a_single_platform_image_fails() -> Result<()> {
    let stack = weenv_integration::stack::Stack::builder()
        .use_containerd()
        .start()?;
    let img = weenv_integration::images::busybox()?;
    let weenv = stack.push_converted(&img, "busybox").await?.weenv;
    let (daemon, ctd) = (&stack.daemon, &stack.ctd);
    let sock = ctd.address().display().to_string();
    let pull = |platform: Option<&str>| -> Result<std::process::Output> {
        let mut c = Command::new(workspace_bin("weenv")?);
        c.arg("--config").arg(&daemon.config);
        c.args(["pull", "-a", &sock, "-n", "weak", "--plain-http", &weenv]);
        if let Some(p) = platform {
            c.args(["--platform", p]);
        }
        Ok(c.output()?)
    };
    let arch = weenv_registry::manifest::host_platform().architecture;
    let o = pull(Some("linux/s390x"))?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(!o.status.success(), "pull for s390x succeeded: {err}");
    ensure!(
        err.contains("linux/s390x") && err.contains(&format!("linux/{arch}")),
        "error names both platforms: {err}"
    );
    let o = pull(None)?;
    ensure!(
        o.status.success(),
        "pull for the host platform: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        daemon.log()
    );
    drop(stack);
    Ok(())
}
