//! weenv-snapshotter end to end with the busybox test image, against a private containerd,
//! runc, docker-registry (behind a counting proxy) and real FUSE:
//! - ordinary path: a plain gzip image through `ctr images pull/run --snapshotter weenv`;
//! - lazy path: `weenv pull` of the converted image commits remote snapshots (no layer blob in
//!   containerd's content store), `ctr run` reads through FUSE; `ctr-remote image rpull` (the
//!   stargz label family) works too;
//! - writes: new files, append to a lazily fetched lower file (copy-up), delete a lower file;
//! - restart: stop the daemon, start it again, a new container runs from the same image with
//!   no registry blob access;
//! - non-weenv image through `weenv pull` (fallback: fetch + Diff.Apply + Commit);
//! - registry settings from a containerd-style `hosts.toml` directory (ctr-remote test).

use anyhow::{ensure, Result};
use weenv_integration::images;
use weenv_integration::registry::CountingProxy;
use weenv_integration::stack::Stack;
use weenv_integration::util::which;

struct Env {
    s: Stack,
    gz: String,
    weenv: String,
}

impl std::ops::Deref for Env {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.s
    }
}

impl std::ops::DerefMut for Env {
    fn deref_mut(&mut self) -> &mut Stack {
        &mut self.s
    }
}

/// `via_hosts_toml`: the daemon learns that the registry speaks plain HTTP from a
/// containerd-style `hosts.toml` (`server = "http://..."`) instead of `registry.plain_http`.
async fn setup(fill: bool, via_hosts_toml: bool) -> Result<Env> {
    let mut b = Stack::builder().proxy().fill(fill);
    if via_hosts_toml {
        b = b.via_hosts_toml();
    }
    let s = b.start()?;
    let img = s.push_converted(&images::busybox()?, "busybox").await?;
    Ok(Env {
        s,
        gz: img.gz,
        weenv: img.weenv,
    })
}

fn run(e: &Env, ns: &str, image: &str, id: &str, script: &str) -> Result<String> {
    let o = e.ctd.run_weenv_sh(ns, image, id, script)?;
    ensure!(
        o.status.success(),
        "ctr run {image} failed: {} {}\ndaemon log:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        e.daemon.log()
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn blob_bytes(p: &CountingProxy) -> u64 {
    p.stats()
        .requests()
        .iter()
        .filter(|r| r.path.contains("/blobs/"))
        .map(|r| r.response_bytes)
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn ordinary_path_with_plain_gzip_image() -> Result<()> {
    let e = setup(true, false).await?;
    e.ctd.ctr_ok(&[
        "images",
        "pull",
        "--plain-http",
        "--snapshotter",
        "weenv",
        &e.gz,
    ])?;
    let ns = e.ctd.namespace().to_string();
    let out = run(
        &e,
        &ns,
        &e.gz,
        "ord1",
        "cat /etc/weenv; echo ok > /new; cat /new",
    )?;
    ensure!(
        out.contains("hello from weenv test image") && out.contains("ok"),
        "{out}"
    );
    // The same image through `weenv pull`: not a weenv layer, so fetched and applied.
    let rep = e.daemon.pull(e.ctd.address(), "wp", &e.gz)?;
    ensure!(rep.contains("0 lazy, 1 applied"), "{rep}");
    let out = run(&e, "wp", &e.gz, "ord2", "cat /etc/weenv")?;
    ensure!(out.contains("hello from weenv test image"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn lazy_pull_run_writes_and_restart() -> Result<()> {
    let mut e = setup(false, false).await?;
    e.counting_proxy()?.stats().clear();
    let rep = e.daemon.pull(e.ctd.address(), "lazy", &e.weenv)?;
    ensure!(rep.contains("1 lazy, 0 applied"), "{rep}");
    // No layer blob in containerd's content store: only manifest and config.
    let content = e.ctd.ctr_ns("lazy", &["content", "ls", "-q"])?;
    let n = String::from_utf8_lossy(&content.stdout).lines().count();
    ensure!(n == 2, "content store holds {n} blobs");
    // Mounting fetched no file content: HEAD + TOC read only (well under the layer size).
    let after_pull = blob_bytes(e.counting_proxy()?);
    ensure!(
        after_pull < 200 << 10,
        "pull fetched {after_pull} blob bytes"
    );

    let out = run(
        &e,
        "lazy",
        &e.weenv,
        "lz1",
        "cat /etc/weenv; md5sum /bin/busybox; echo appended >> /etc/weenv; busybox tail -n1 /etc/weenv; \
         rm /bin/ls; test -e /bin/ls || echo ls-gone; mkdir -p /w && echo new > /w/f && cat /w/f",
    )?;
    // Reference: the same file unpacked the ordinary way from the gzip image.
    let o = e.ctd.ctr_ns(
        "plain",
        &[
            "images",
            "pull",
            "--plain-http",
            "--snapshotter",
            "weenv",
            &e.gz,
        ],
    )?;
    ensure!(
        o.status.success(),
        "ctr pull: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let plain = run(&e, "plain", &e.gz, "pl1", "md5sum /bin/busybox")?;
    let host_md5 = plain.split(' ').next().unwrap_or("").to_string();
    ensure!(host_md5.len() == 32, "{plain}");
    ensure!(out.contains("hello from weenv test image"), "{out}");
    ensure!(
        out.contains(&host_md5),
        "busybox md5 differs: {out} vs {host_md5}"
    );
    ensure!(
        out.contains("appended") && out.contains("ls-gone") && out.contains("new"),
        "{out}"
    );
    // Writes landed in that container's upper dir only: a new container sees the image.
    let out = run(
        &e,
        "lazy",
        &e.weenv,
        "lz2",
        "busybox tail -n1 /etc/weenv; test -e /bin/ls && echo ls-here",
    )?;
    ensure!(
        out.contains("hello from weenv test image") && out.contains("ls-here"),
        "{out}"
    );
    let status = e.daemon.weenv(&["status"])?;
    ensure!(
        status.contains("layers: 1") && status.contains("(1 remote)"),
        "{status}"
    );
    let metrics = e.daemon.weenv(&["metrics"])?;
    ensure!(
        metrics.contains("weenv_fuse_ops_total")
            && metrics.contains("weenv_remote_prepares_total{outcome=\"remote\"} 1")
            && metrics.contains("weenv_snapshots{kind=\"remote\"} 1"),
        "{metrics}"
    );

    // Restart: a new container from the same image, no blob bytes for cached chunks.
    e.daemon.restart()?;
    e.counting_proxy()?.stats().clear();
    let mut out = Err(anyhow::anyhow!("not run"));
    // containerd's connection to the proxy plugin may be in backoff for a moment.
    for _ in 0..20 {
        out = run(
            &e,
            "lazy",
            &e.weenv,
            "lz3",
            "cat /etc/weenv; md5sum /bin/busybox",
        );
        if out.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let out = out?;
    ensure!(out.contains(&host_md5), "{out}");
    ensure!(
        blob_bytes(e.counting_proxy()?) == 0,
        "registry blob access after restart: {:#?}",
        e.counting_proxy()?.stats().requests()
    );
    ensure!(e.daemon.log().contains("remounted=1"), "{}", e.daemon.log());

    // kill -9: the FUSE session dies with the process; the next daemon clears the dead mount,
    // remounts from the cached TOC and new containers work.
    // The TOC cache is lost too: remount fetches the TOC again from the registry.
    for f in std::fs::read_dir(e.daemon.root.join("state/tocs"))? {
        std::fs::remove_file(f?.path())?;
    }
    e.daemon.crash_and_restart()?;
    let mut out = Err(anyhow::anyhow!("not run"));
    for _ in 0..20 {
        out = run(&e, "lazy", &e.weenv, "lz4", "md5sum /bin/busybox");
        if out.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    ensure!(out?.contains(&host_md5), "after kill -9");
    ensure!(
        e.daemon.log().contains("refetching"),
        "TOC not refetched:\n{}",
        e.daemon.log()
    );

    // Pulling again finds the layer present and updates the image record.
    let rep = e.daemon.pull(e.ctd.address(), "lazy", &e.weenv)?;
    ensure!(rep.contains("1 present"), "{rep}");
    // Removing the image lets containerd's GC remove the snapshots; Cleanup releases the layer.
    let o = e
        .ctd
        .ctr_ns("lazy", &["images", "rm", "--sync", &e.weenv])?;
    ensure!(
        o.status.success(),
        "image rm: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let status = e.daemon.weenv(&["status"])?;
    ensure!(
        status.contains("layers: 0") && status.contains("(0 remote)"),
        "after GC: {status}\n{}",
        e.daemon.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, ctr-remote"]
async fn ctr_remote_rpull_labels_are_accepted() -> Result<()> {
    ensure!(
        which("ctr-remote").is_some(),
        "ctr-remote (stargz-snapshotter) is not installed"
    );
    let e = setup(true, true).await?;
    let sock = e.ctd.address().display().to_string();
    let o = std::process::Command::new("ctr-remote")
        .args([
            "-a",
            &sock,
            "-n",
            "rp",
            "image",
            "rpull",
            "--plain-http",
            "--snapshotter",
            "weenv",
            &e.weenv,
        ])
        .output()?;
    ensure!(
        o.status.success(),
        "rpull: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let content = e.ctd.ctr_ns("rp", &["content", "ls", "-q"])?;
    let n = String::from_utf8_lossy(&content.stdout).lines().count();
    ensure!(n == 2, "rpull stored {n} blobs (layer fetched?)");
    let out = run(&e, "rp", &e.weenv, "rp1", "cat /etc/weenv")?;
    ensure!(out.contains("hello from weenv test image"), "{out}");
    // The daemon reached the registry through its hosts.toml (plain HTTP from `server`).
    let m = e.daemon.weenv(&["metrics"])?;
    ensure!(
        m.contains("weenv_remote_prepares_total{outcome=\"remote\"} 1"),
        "{m}"
    );
    Ok(())
}
