//! Plans by reference: a plan published as an OCI artifact (`weenv-convert plan publish`) is
//! pulled by name by stock clients through the daemon's plan endpoint (`[plans] listen`),
//! which containerd reaches as a registry mirror (`hosts.toml`, the registry itself keeping no
//! pull/resolve capability so every pull of it goes through the node). The plan stacks a
//! busybox base group and a repository group and carries a patch; the node composes it
//! (metadata only), synthesises the patch as a small layer and serves both; the weenv layers are
//! mounted lazily from their groups' repository. The registry sits behind a counting proxy:
//! after publishing, no request writes to it.
//!
//! - containerd 1.6 (Debian): `ctr images pull` + `ctr run` of the plan reference; the task sees
//!   the patched tree (1.6's `ctr` unpacks without the layers' snapshot annotations, so its
//!   layers are fetched through the endpoint's redirects, not mounted lazily).
//! - containerd 2.x (`scripts/go-tools.sh`): `ctr image pull` (transfer service), `nerdctl
//!   run`, `crictl pull` of the same reference.
//! - Errors reach the client as registry errors with the message: an unknown group, a patch
//!   whose hunk does not apply.

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::{Daemon, DaemonOptions};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use weenv_converter::group::{create_group, GroupSource, GroupSpec};
use weenv_converter::plan::parse_ref;
use weenv_converter::registry_config;
use weenv_env::group::{ConfigFragment, GroupKind};
use weenv_env::plan::Plan;
use weenv_format::writer::WriterOptions;
use weenv_integration::clients::{ok_output, Crictl, Nerdctl, PodFlow};
use weenv_integration::containerd::{Containerd, ContainerdOptions, Release};
use weenv_integration::cri::CriOptions;
use weenv_integration::gotools::{self, GoTools};
use weenv_integration::images;
use weenv_integration::registry::{CountingProxy, LocalRegistry};
use weenv_integration::util::{free_port, require_root_and_bins, workspace_bin, E2E_FUSE_BINS};
use weenv_registry::Client;

const PATCH: &str = "diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,3 +1,3 @@
 def answer():
-    return 42
+    return 41
 
diff --git a/docs/NOTE.md b/docs/NOTE.md
new file mode 100644
--- /dev/null
+++ b/docs/NOTE.md
@@ -0,0 +1 @@
+bug introduced
diff --git a/obsolete.txt b/obsolete.txt
deleted file mode 100644
--- a/obsolete.txt
+++ /dev/null
@@ -1 +0,0 @@
-remove me
";

const BAD_PATCH: &str = "--- a/app.py
+++ b/app.py
@@ -1,2 +1,2 @@
 def answer():
-    return 7
+    return 8
";

/// What the task prints: the patched tree.
const SHOW: &str =
    "cat /src/repo/app.py; cat /src/repo/docs/NOTE.md; ls /src/repo; echo \"task=$TASK\"";

fn check_output(out: &str) -> Result<()> {
    ensure!(out.contains("return 41"), "patch not applied:\n{out}");
    ensure!(out.contains("bug introduced"), "new file missing:\n{out}");
    ensure!(
        !out.contains("obsolete.txt"),
        "deleted file still there:\n{out}"
    );
    ensure!(
        out.contains("task=t1"),
        "plan config override missing:\n{out}"
    );
    Ok(())
}

struct Env {
    host: String,
    /// The CRI sandbox image, through the proxy.
    pause: String,
    proxy: CountingProxy,
    tmp: tempfile::TempDir,
    client: Client,
    _reg: LocalRegistry,
}

/// Requests that write to the registry (anything but GET and HEAD).
fn registry_writes(p: &CountingProxy) -> Vec<String> {
    p.stats()
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET" && r.method != "HEAD")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// Registry, proxy, the base and repository groups.
async fn setup() -> Result<Env> {
    require_root_and_bins(E2E_FUSE_BINS)?;
    let tmp = tempfile::tempdir()?;
    let reg = LocalRegistry::start(tmp.path())?;
    reg.push(&images::busybox()?, "src/busybox:1")?;
    reg.push(&images::pause()?, "src/pause:1")?;
    let proxy = CountingProxy::start(reg.addr())?;
    let host = proxy.host();
    let client = Client::new(registry_config(std::slice::from_ref(&host)))?;
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let spec = |kind, name: &str| GroupSpec {
        kind,
        name: name.into(),
        fragment: ConfigFragment::default(),
        platform: None,
        mtime_clamp: None,
    };
    weenv_converter::convert_image(
        &client,
        &weenv_converter::ImageLocation::parse(&format!("{host}/src/busybox:1"))?,
        &weenv_converter::ImageLocation::parse(&format!("{host}/src/busybox-weenv:1"))?,
        &weenv_converter::ConvertOptions::default(),
        std::sync::Arc::new(weenv_converter::NoProgress),
    )
    .await?;
    create_group(
        &client,
        &GroupSource::Image {
            reference: format!("{host}/src/busybox-weenv:1"),
            layers: 0..1,
        },
        &spec(GroupKind::Base, "busybox"),
        &parse_ref(&format!("{host}/weenv/base:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    let repo = tmp.path().join("repo");
    for (rel, c) in [
        ("app.py", "def answer():\n    return 42\n\n"),
        ("run.sh", "#!/bin/sh\necho run\n"),
        ("obsolete.txt", "remove me\n"),
    ] {
        let p = repo.join("src/repo").join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(p, c)?;
    }
    create_group(
        &client,
        &GroupSource::Dir(repo),
        &spec(GroupKind::Task, "repo"),
        &parse_ref(&format!("{host}/weenv/repo:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    Ok(Env {
        pause: format!("{host}/src/pause:1"),
        host,
        proxy,
        tmp,
        client,
        _reg: reg,
    })
}

/// Plan text over the two groups (plus `extra_group`), with the patch file `patch.diff`.
fn plan_text(host: &str, extra_group: Option<&str>) -> String {
    let extra = extra_group
        .map(|g| format!(", \"{g}\""))
        .unwrap_or_default();
    format!(
        "version = 1\ngroups = [\"{host}/weenv/base:1\", \"{host}/weenv/repo:1\"{extra}]\n\
         [mutation]\npatch = \"patch.diff\"\nroot = \"/src/repo\"\n\
         [config]\ncmd = [\"/bin/sh\", \"-c\", {SHOW:?}]\n[config.env]\nTASK = \"t1\"\n"
    )
}

/// `weenv-convert plan publish` of a plan with `patch` to `target`.
fn publish_cli(e: &Env, name: &str, patch: &str, target: &str) -> Result<String> {
    let dir = e.tmp.path().join(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("plan.toml"), plan_text(&e.host, None))?;
    std::fs::write(dir.join("patch.diff"), patch)?;
    let o = Command::new(workspace_bin("weenv-convert")?)
        .args(["--plain-http", &e.host, "plan", "publish"])
        .arg(dir.join("plan.toml"))
        .args(["--to", target, "--cache-dir"])
        .arg(dir.join("cache"))
        .output()?;
    ok_output("weenv-convert plan publish", o)
}

/// Publishes a plan artifact without the compose check (to test what the node says).
async fn publish_unchecked(e: &Env, text: &str, patch: &str, target: &str) -> Result<()> {
    let plan = Plan::parse(text)?;
    let a = weenv_env::plan_ref::build_plan_artifact(&plan, Some(patch.as_bytes()))?;
    weenv_converter::plan::publish_plan(&e.client, &a, &parse_ref(target)?).await?;
    Ok(())
}

/// containerd `hosts.toml` dir: the registry reached only through the plan endpoint.
fn hosts_dir(dir: &Path, registry: &str, plans: &str) -> Result<std::path::PathBuf> {
    let d = dir.join("certs.d");
    std::fs::create_dir_all(d.join(registry))?;
    std::fs::write(
        d.join(registry).join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\ncapabilities = [\"push\"]\n\
             [host.\"http://{plans}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )?;
    Ok(d)
}

fn daemon(e: &Env, plans: &str) -> Result<Daemon> {
    Daemon::start_with(
        &e.tmp.path().join("snap"),
        &DaemonOptions {
            plain_http: vec![e.host.clone()],
            fill: false,
            fill_extra: String::new(),
        },
        &[],
        |c| c.plans.listen = plans.to_string(),
    )
}

/// `ctr pull` of `plan` via the hosts dir, then `ctr run`; (stdout, pull secs, total secs).
fn ctr_pull_run(
    ctd: &Containerd,
    hosts: &Path,
    ns: &str,
    plan: &str,
) -> Result<(String, f64, f64)> {
    let t = Instant::now();
    ctr_pull(ctd, hosts, ns, plan).and_then(|o| ok_output("ctr images pull", o))?;
    let pulled = t.elapsed().as_secs_f64();
    let o = ctd.ctr_ns(
        ns,
        &[
            "run",
            "--rm",
            "--snapshotter",
            "weenv",
            plan,
            &container_id(ns),
        ],
    )?;
    let out = ok_output("ctr run", o)?;
    Ok((out, pulled, t.elapsed().as_secs_f64()))
}

/// A container id no other scenario of this process uses: the two containerd releases run
/// side by side and runc's state (`/run/containerd/runc/<namespace>/<id>`) is per host.
fn container_id(ns: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{ns}-{}-{n}", std::process::id())
}

/// `ctr images pull --hosts-dir HOSTS --snapshotter weenv PLAN` in namespace `ns`.
fn ctr_pull(ctd: &Containerd, hosts: &Path, ns: &str, plan: &str) -> Result<std::process::Output> {
    let hd = hosts.display().to_string();
    ctd.ctr_ns(
        ns,
        &[
            "images",
            "pull",
            "--hosts-dir",
            &hd,
            "--snapshotter",
            "weenv",
            plan,
        ],
    )
}

/// The stderr of a `ctr images pull` that must fail.
fn ctr_pull_fails(ctd: &Containerd, hosts: &Path, ns: &str, plan: &str) -> Result<String> {
    let o = ctr_pull(ctd, hosts, ns, plan)?;
    ensure!(!o.status.success(), "pull of {plan} succeeded");
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    ))
}

/// `weenv run PLANREF`: the CLI fetches the plan artifact (no plan file on the node), composes
/// it and runs it with the patched tree and the plan's config; nothing is written to the
/// registry.
async fn weenv_run_reference(e: &Env, ctd: &Containerd, plan: &str) -> Result<()> {
    let out = e.tmp.path().join("weenv-run-out");
    std::fs::create_dir_all(&out)?;
    e.proxy.stats().clear();
    let o = weenv_cli::run::RunOptions {
        plan: plan.into(),
        image: format!("{}/weenv/env:from-reference", e.host),
        publish: false,
        address: ctd.address().to_path_buf(),
        namespace: ctd.namespace().to_string(),
        snapshotter: "weenv".into(),
        runtime: None,
        id: Some("from-reference".into()),
        mounts: vec![format!(
            "type=bind,src={},dst=/out,options=rbind:rw",
            out.display()
        )],
        limits: Default::default(),
        cmd: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("{{ {SHOW}; }} > /out/log 2>&1"),
        ],
        labels: Default::default(),
        keep: false,
        stdio: weenv_cli::run::stdio::StdioMode::Output,
        cache_dir: e.tmp.path().join("resolve-cache"),
        policy: Default::default(),
        daemon: None,
    };
    let rep = weenv_cli::run::run_plan(&e.client, &o).await?;
    ensure!(
        rep.exit_code == 0,
        "weenv run {plan}: exit {}",
        rep.exit_code
    );
    let log = std::fs::read_to_string(out.join("log"))?;
    check_output(&log)?;
    ensure!(
        registry_writes(&e.proxy).is_empty(),
        "weenv run wrote to the registry: {:?}",
        registry_writes(&e.proxy)
    );
    println!(
        "weenv run of the plan reference: {} registry requests, layers (lazy, applied, present) \
         {:?}; steps: {}",
        e.proxy.stats().requests().len(),
        rep.layers,
        rep.timings.render()
    );
    Ok(())
}

async fn scenario(release: Release, label: &str) -> Result<()> {
    let e = setup().await?;
    let plans = format!("127.0.0.1:{}", free_port()?);
    let plan = format!("{}/weenv/plans:t1", e.host);
    let printed = publish_cli(&e, "good", PATCH, &plan)?;
    ensure!(printed.contains("@sha256:"), "{printed}");
    publish_unchecked(
        &e,
        &plan_text(&e.host, Some(&format!("{}/weenv/nope:1", e.host))),
        PATCH,
        &format!("{}/weenv/plans:unknown-group", e.host),
    )
    .await?;
    publish_unchecked(
        &e,
        &plan_text(&e.host, None),
        BAD_PATCH,
        &format!("{}/weenv/plans:bad-patch", e.host),
    )
    .await?;
    let pause = e.pause.clone();
    let d = daemon(&e, &plans)?;
    let is_v2 = matches!(release, Release::V2 { .. });
    let hosts = hosts_dir(e.tmp.path(), &e.host, &plans)?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(d.socket.clone()),
        release: release.clone(),
        cri: is_v2.then(|| CriOptions {
            snapshotter: "weenv".into(),
            disable_snapshot_annotations: true,
            sandbox_image: pause.clone(),
            plain_http: vec![],
            cni: None,
            mirrors: vec![],
        }),
        ..Default::default()
    })?;
    d.use_containerd(&ctd)?;
    if let Release::V17 { .. } = release {
        let v = ctd.ctr_ok(&["version"])?;
        ensure!(v.contains("1.7."), "not containerd 1.7:\n{v}");
    }

    e.proxy.stats().clear();
    let (out, pulled, total) = ctr_pull_run(&ctd, &hosts, "p1", &plan)
        .with_context(|| format!("daemon log:\n{}\ncontainerd log:\n{}", d.log(), ctd.log()))?;
    check_output(&out)?;
    let remote = d.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
    // ctr 1.6 (`images pull` then `Image.Unpack`) passes no descriptor annotations to Prepare:
    // its layers are fetched (through the endpoint's redirects) and unpacked. The 2.x unpacker
    // (transfer service) passes them: the weenv layers are remote snapshots.
    if is_v2 {
        ensure!(
            remote >= 2,
            "weenv layers not mounted lazily ({remote} remote)\n{}",
            d.log()
        );
    }
    let writes = registry_writes(&e.proxy);
    ensure!(writes.is_empty(), "registry writes: {writes:?}");
    println!(
        "{label}: ctr pull + run of a plan reference: {} registry requests, {} bytes; pull {pulled:.2} s, \
         output after {total:.2} s; {remote} remote snapshots; 0 writes",
        e.proxy.stats().requests().len(),
        e.proxy.stats().bytes_served()
    );

    if !is_v2 {
        weenv_run_reference(&e, &ctd, &plan).await?;
    }

    // Errors reach the client with the node's message.
    let err = ctr_pull_fails(
        &ctd,
        &hosts,
        "p2",
        &format!("{}/weenv/plans:unknown-group", e.host),
    )?;
    ensure!(
        err.contains("weenv/nope:1") && err.contains("not found"),
        "unknown group error: {err}"
    );
    let err = ctr_pull_fails(
        &ctd,
        &hosts,
        "p3",
        &format!("{}/weenv/plans:bad-patch", e.host),
    )?;
    ensure!(
        err.contains("does not apply") && err.contains("app.py"),
        "bad patch error: {err}"
    );

    if let Release::V2 { .. } = release {
        let tools = GoTools::find()?;
        // nerdctl run of the plan reference.
        let n = Nerdctl::new(
            &tools.bin("nerdctl", "nerdctl")?,
            &ctd,
            "p-nerd",
            &e.tmp.path().join("nerdctl"),
            &[],
        )?;
        let nd = e.tmp.path().join("nerdctl/certs.d");
        std::fs::remove_dir_all(&nd).ok();
        hosts_dir(&e.tmp.path().join("nerdctl"), &e.host, &plans)?;
        e.proxy.stats().clear();
        let t = Instant::now();
        let out = n.ok(&[
            "run",
            "--rm",
            "--net",
            "none",
            "--snapshotter",
            "weenv",
            "--runtime",
            "io.containerd.weenv.v1",
            &plan,
        ])?;
        check_output(&out)?;
        ensure!(registry_writes(&e.proxy).is_empty());
        println!(
            "{label}: nerdctl run of a plan reference: {} registry requests, {} bytes, output after {:.2} s",
            e.proxy.stats().requests().len(),
            e.proxy.stats().bytes_served(),
            t.elapsed().as_secs_f64()
        );
        // crictl pull (the CRI plugin's registry config is its certs.d: write the same file).
        let certs = ctd.dir().join("cri/certs.d");
        hosts_dir(&ctd.dir().join("cri"), &e.host, &plans)?;
        ensure!(certs.join(&e.host).join("hosts.toml").is_file());
        let c = Crictl::new(
            &tools.bin("crictl", "crictl")?,
            &ctd,
            &e.tmp.path().join("crictl"),
            Duration::from_secs(120),
        )?;
        // The pause image first, so the counts below are the plan's alone.
        c.ok(&["pull", &pause])?;
        let remote0 = d.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
        e.proxy.stats().clear();
        let t = Instant::now();
        let img = c.ok(&["pull", &plan])?;
        ensure!(img.contains("sha256:"), "{img}");
        let pulled = t.elapsed().as_secs_f64();
        let cmd = format!("{SHOW}; echo cri-ready; sleep 600");
        let first = c
            .pod_flow(
                &e.tmp.path().join("crictl"),
                &PodFlow {
                    name: "plan",
                    image: &plan,
                    handler: weenv_integration::cri::WEENV_HANDLER,
                    command: &["/bin/sh", "-c", &cmd],
                    log_contains: "cri-ready",
                    exec: &["cat", "/src/repo/app.py", "/src/repo/docs/NOTE.md"],
                    exec_contains: "bug introduced",
                },
            )
            .with_context(|| format!("daemon log:\n{}\ncontainerd log:\n{}", d.log(), ctd.log()))?;
        let remote = d.metric("weenv_remote_prepares_total{outcome=\"remote\"}")? - remote0;
        ensure!(
            remote >= 2,
            "crictl: the plan's weenv layers were not mounted lazily ({remote} remote)\n{}",
            d.log()
        );
        let writes = registry_writes(&e.proxy);
        ensure!(writes.is_empty(), "registry writes: {writes:?}");
        println!(
            "{label}: crictl pull + runp/create/start/exec/logs of a plan reference: {} registry \
             requests, {} bytes; pull {pulled:.2} s, logs after {:.2} s; {remote} remote snapshots; \
             0 writes",
            e.proxy.stats().requests().len(),
            e.proxy.stats().bytes_served(),
            pulled + first
        );
        let err = c
            .ok(&["pull", &format!("{}/weenv/plans:bad-patch", e.host)])
            .expect_err("pull of a plan whose patch does not apply");
        ensure!(format!("{err:#}").contains("does not apply"), "{err:#}");
        ensure!(registry_writes(&e.proxy).is_empty());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci"]
async fn plan_reference_runs_on_containerd_1_6() -> Result<()> {
    scenario(Release::Debian, "containerd 1.6").await
}
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, fuse, docker-registry, skopeo, umoci and scripts/go-tools.sh"]
async fn plan_reference_runs_on_containerd_2_with_ctr_nerdctl_and_crictl() -> Result<()> {
    let Some(tools) = gotools::require(
        "plan_reference_runs_on_containerd_2_with_ctr_nerdctl_and_crictl",
        &["containerd2", "runc", "nerdctl", "crictl"],
    )?
    else {
        return Ok(());
    };
    scenario(tools.containerd2()?, "containerd 2.x").await
}

/// containerd 1.7 (`containerd17` of `scripts/go-tools.sh`): the 1.6 scenario on 1.7's daemon.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, fuse, docker-registry, skopeo, umoci and containerd17 from scripts/go-tools.sh"]
async fn plan_reference_runs_on_containerd_1_7() -> Result<()> {
    let Some(tools) = gotools::require("plan_reference_runs_on_containerd_1_7", &["containerd17"])?
    else {
        return Ok(());
    };
    scenario(tools.containerd17()?, "containerd 1.7").await
}
