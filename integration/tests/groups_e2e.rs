//! Layer groups and environment plans end to end, with a stock containerd:
//! base (Debian + python3, from an ordinary gzip image) + a task group (a small Python project
//! with its test suite) + a pre-applied mutation group + harness:1 + an evaluator group are
//! composed (metadata only) into an image; containerd pulls and runs it; the evaluator runs the
//! harness and the project's tests and writes a reward file. Then only harness:2 is published
//! and the plan recomposed: the new environment runs harness:2, and the bytes pushed for the
//! upgrade are the harness group's size plus a few KB of manifests/configs. With the weenv
//! snapshotter, the upgraded environment fetches nothing of the layers it shares with the
//! old one (content is keyed by layer digest on the node).

use anyhow::{ensure, Context, Result};
mod snapshotter_common;
mod untrusted_common;

use std::path::{Path, PathBuf};
use weenv_converter::group::{create_group, GroupReport, GroupSource, GroupSpec};
use weenv_converter::mutate::{mutate_group, MutateSpec};
use weenv_converter::plan::{compose_plan, parse_ref, publish_composed};
use weenv_converter::registry_config;
use weenv_converter::resolve_cache::{ResolveCache, ResolvePolicy};
use weenv_env::group::{ConfigFragment, GroupKind};
use weenv_env::plan::Plan;
use weenv_format::writer::WriterOptions;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::images;
use weenv_integration::registry::{CountingProxy, LocalRegistry};
use weenv_integration::util::{require_root_and_bins, E2E_BINS};
use weenv_registry::Client;

const CALC: &str = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n";
const TEST_CALC: &str = "import unittest\n\nfrom calc import add, mul\n\n\nclass CalcTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n";
/// The task's mutation: a new function and its test (pre-applied as a tiny group).
const TASK_PATCH: &str = "diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -4,3 +4,7 @@ def add(a, b):
 
 def mul(a, b):
     return a * b
+
+
+def sub(a, b):
+    return a - b
diff --git a/test_sub.py b/test_sub.py
new file mode 100644
--- /dev/null
+++ b/test_sub.py
@@ -0,0 +1,5 @@
+import unittest
+from calc import sub
+class SubTest(unittest.TestCase):
+    def test_sub(self):
+        self.assertEqual(sub(5, 3), 2)
";
const EVAL: &str = "#!/bin/sh
harness > /out/harness.txt 2>&1
cd /src/proj || exit 1
if python3 -m unittest -v > /out/tests.txt 2>&1; then echo 1 > /out/reward; else echo 0 > /out/reward; fi
";

fn write(root: &Path, rel: &str, content: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().context("parent")?)?;
    std::fs::write(&p, content)?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn spec(kind: GroupKind, name: &str, fragment: ConfigFragment) -> GroupSpec {
    GroupSpec {
        kind,
        name: name.into(),
        fragment,
        platform: None,
        mtime_clamp: None,
    }
}

async fn dir_group(
    client: &Client,
    dir: &Path,
    spec: &GroupSpec,
    target: &str,
    scratch: &Path,
) -> Result<GroupReport> {
    Ok(create_group(
        client,
        &GroupSource::Dir(dir.to_path_buf()),
        spec,
        &parse_ref(target)?,
        scratch,
        &WriterOptions::default(),
    )
    .await?)
}

/// A harness: an entry point and 1 MiB of incompressible "SDK" payload (unique per version).
fn harness_dir(root: &Path, version: u32) -> Result<()> {
    use sha2::{Digest as _, Sha256};
    let mut payload = Vec::with_capacity(1 << 20);
    let mut h = Sha256::digest(format!("harness-{version}").as_bytes()).to_vec();
    while payload.len() < 1 << 20 {
        h = Sha256::digest(&h).to_vec();
        payload.extend_from_slice(&h);
    }
    let p = root.join("opt/harness/lib/sdk.bin");
    std::fs::create_dir_all(p.parent().context("parent")?)?;
    std::fs::write(p, payload)?;
    write(
        root,
        "opt/harness/bin/harness",
        &format!("#!/usr/bin/python3\nprint(\"harness v{version} running\")\n"),
        0o755,
    )
}

async fn compose_publish(client: &Client, plan_text: &str, target: &str) -> Result<String> {
    let plan = Plan::parse(plan_text)?;
    let mut cache = ResolveCache::in_memory();
    let (groups, composed) =
        compose_plan(client, &plan, &mut cache, 0, ResolvePolicy::default()).await?;
    let r = publish_composed(client, &groups, &composed, &parse_ref(target)?).await?;
    ensure!(r.manifest_digest == Some(composed.manifest_digest.clone()));
    Ok(composed.manifest_digest.to_string())
}

fn run_env(ctd: &Containerd, image: &str, id: &str, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    ctd.ctr_ok(&["images", "pull", "--plain-http", image])?;
    let mount = format!("type=bind,src={},dst=/out,options=rbind:rw", out.display());
    ctd.ctr_ok(&["run", "--rm", "--mount", &mount, image, id])?;
    Ok(())
}

/// Everything a test needs: registry behind a counting proxy, groups published.
struct Published {
    tmp: tempfile::TempDir,
    _reg: LocalRegistry,
    proxy: CountingProxy,
    host: String,
    client: Client,
    scratch: PathBuf,
    harness_spec: GroupSpec,
}

/// Publish base (converted Debian+python3), task, its pre-applied mutation, harness:1, eval.
async fn publish_groups() -> Result<Published> {
    let tmp = tempfile::tempdir()?;
    let reg = LocalRegistry::start(tmp.path())?;
    let proxy = CountingProxy::start(reg.addr())?;
    let host = proxy.host();
    let client = Client::new(registry_config(std::slice::from_ref(&host)))?;
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch)?;

    // base: all layers of an ordinary Debian+python3 image, converted to weenv layers
    let img = match images::python() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("debootstrap image unavailable ({e:#}); using python_fast");
            images::python_fast()?
        }
    };
    images::push_oci_layout(&img, &format!("{}/src/python:1", reg.host()))?;
    let src = format!("{host}/src/python:1");
    let host_p = weenv_registry::manifest::host_platform();
    let (m, _) = client
        .get_image_manifest(&parse_ref(&src)?, &host_p.os, &host_p.architecture, None)
        .await?;
    let base = create_group(
        &client,
        &GroupSource::Image {
            reference: src.clone(),
            layers: 0..m.layers.len(),
        },
        &spec(GroupKind::Base, "debian-python", ConfigFragment::default()),
        &parse_ref(&format!("{host}/weenv/base:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    ensure!(base.built.config.diff_ids.len() == m.layers.len());

    // task: one repository (shared by all tasks on it)
    let task_dir = tmp.path().join("task");
    write(&task_dir, "src/proj/calc.py", CALC, 0o644)?;
    write(&task_dir, "src/proj/test_calc.py", TEST_CALC, 0o644)?;
    let task_spec = spec(
        GroupKind::Task,
        "calc",
        ConfigFragment {
            workdir: Some("/src/proj".into()),
            ..Default::default()
        },
    );
    dir_group(
        &client,
        &task_dir,
        &task_spec,
        &format!("{host}/weenv/task-calc:1"),
        &scratch,
    )
    .await?;

    // per-task mutation, pre-applied: a tiny group with only the changed files
    let (mutation, summary) = mutate_group(
        &client,
        &format!("{host}/weenv/task-calc:1"),
        TASK_PATCH.as_bytes(),
        &MutateSpec {
            name: "calc-task-1".into(),
            root: "/src/proj".into(),
            strip: 1,
        },
        &parse_ref(&format!("{host}/weenv/task-calc-1:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    ensure!(
        summary.written
            == vec![
                "src/proj/calc.py".to_string(),
                "src/proj/test_sub.py".into()
            ],
        "{summary:?}"
    );
    ensure!(
        mutation.layers.len() == 1 && mutation.layers[0].1 < 4096,
        "{:?}",
        mutation.layers
    );

    // harness:1 and the evaluator
    let h1 = tmp.path().join("h1");
    harness_dir(&h1, 1)?;
    let harness_spec = spec(
        GroupKind::Harness,
        "harness",
        ConfigFragment {
            env: vec!["PATH=/opt/harness/bin".into()],
            ..Default::default()
        },
    );
    dir_group(
        &client,
        &h1,
        &harness_spec,
        &format!("{host}/weenv/harness:1"),
        &scratch,
    )
    .await?;
    let ev = tmp.path().join("eval");
    write(&ev, "eval/run.sh", EVAL, 0o755)?;
    let eval_spec = spec(
        GroupKind::Evaluator,
        "unittest-eval",
        ConfigFragment {
            cmd: Some(vec!["/bin/sh".into(), "/eval/run.sh".into()]),
            ..Default::default()
        },
    );
    dir_group(
        &client,
        &ev,
        &eval_spec,
        &format!("{host}/weenv/eval:1"),
        &scratch,
    )
    .await?;
    Ok(Published {
        tmp,
        _reg: reg,
        proxy,
        host,
        client,
        scratch,
        harness_spec,
    })
}

impl Published {
    fn plan(&self, harness: &str) -> String {
        let host = &self.host;
        format!(
            "version = 1\ngroups = [\"{host}/weenv/base:1\", \"{host}/weenv/task-calc:1\", \"{host}/weenv/harness:{harness}\", \"{host}/weenv/eval:1\"]\n\
             [mutation]\nmode = \"pre-applied\"\ngroup = \"{host}/weenv/task-calc-1:1\"\n"
        )
    }

    async fn publish_harness2(&self) -> Result<GroupReport> {
        let h2 = self.tmp.path().join("h2");
        harness_dir(&h2, 2)?;
        dir_group(
            &self.client,
            &h2,
            &self.harness_spec,
            &format!("{}/weenv/harness:2", self.host),
            &self.scratch,
        )
        .await
    }
}

fn read(d: &Path, f: &str) -> String {
    std::fs::read_to_string(d.join(f)).unwrap_or_default()
}

fn check_run(out: &Path, harness: u32) -> Result<()> {
    ensure!(
        read(out, "reward").trim() == "1",
        "reward {:?}; tests: {}; harness: {}",
        read(out, "reward"),
        read(out, "tests.txt"),
        read(out, "harness.txt")
    );
    ensure!(
        read(out, "harness.txt").contains(&format!("harness v{harness}")),
        "{}",
        read(out, "harness.txt")
    );
    ensure!(
        read(out, "tests.txt").contains("test_sub"),
        "mutation missing: {}",
        read(out, "tests.txt")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, docker-registry, skopeo, umoci, debootstrap (or host python3)"]
async fn groups_compose_run_and_upgrade_harness() -> Result<()> {
    require_root_and_bins(E2E_BINS)?;
    let p = publish_groups().await?;
    let env1 = format!("{}/weenv/env:calc-1-h1", p.host);
    compose_publish(&p.client, &p.plan("1"), &env1).await?;

    let ctd = Containerd::start(ContainerdOptions::default())?;
    let out1 = p.tmp.path().join("out1");
    run_env(&ctd, &env1, "groups-e2e-1", &out1)?;
    check_run(&out1, 1)?;

    // upgrade: publish harness:2 only, recompose, count what was pushed
    p.proxy.stats().clear();
    let h2r = p.publish_harness2().await?;
    let env2 = format!("{}/weenv/env:calc-1-h2", p.host);
    compose_publish(&p.client, &p.plan("2"), &env2).await?;
    let pushed: u64 = p
        .proxy
        .stats()
        .requests()
        .iter()
        .map(|r| r.request_bytes)
        .sum();
    let harness_layer: u64 = h2r.layers.iter().map(|l| l.1).sum();
    let harness_group =
        harness_layer + h2r.built.config_json.len() as u64 + h2r.built.manifest_json.len() as u64;
    println!("upgrade pushed {pushed} bytes; harness:2 group {harness_group} bytes (layer {harness_layer})");
    ensure!(
        pushed >= harness_group,
        "pushed {pushed} < harness group {harness_group}"
    );
    ensure!(
        pushed <= harness_group + 8192,
        "upgrade pushed {pushed} bytes, more than the harness group ({harness_group}) + 8 KiB of metadata"
    );

    let out2 = p.tmp.path().join("out2");
    run_env(&ctd, &env2, "groups-e2e-2", &out2)?;
    check_run(&out2, 2)
}

/// With the weenv snapshotter, layers are shared by digest on the node: after running the
/// harness:1 environment, the harness:2 environment fetches no byte of the base, task,
/// mutation or evaluator layers, only (part of) the new harness layer.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, weenv-snapshotter"]
async fn lazy_upgrade_fetches_only_the_new_harness() -> Result<()> {
    require_root_and_bins(E2E_BINS)?;
    let p = publish_groups().await?;
    let (daemon, ctd) = snapshotter_common::lazy_stack(&p.tmp.path().join("snap"), &p.host)?;
    let lazy_run = |image: &str, id: &str, out: &Path| -> Result<()> {
        std::fs::create_dir_all(out)?;
        daemon.pull(ctd.address(), ctd.namespace(), image)?;
        let mount = format!("type=bind,src={},dst=/out,options=rbind:rw", out.display());
        ctd.ctr_ok(&[
            "run",
            "--rm",
            "--snapshotter",
            "weenv",
            "--mount",
            &mount,
            image,
            id,
        ])
        .with_context(|| format!("daemon log:\n{}", daemon.log()))?;
        Ok(())
    };
    let env1 = format!("{}/weenv/env:calc-1-h1", p.host);
    compose_publish(&p.client, &p.plan("1"), &env1).await?;
    let out1 = p.tmp.path().join("out1");
    lazy_run(&env1, "lazy-1", &out1)?;
    check_run(&out1, 1)?;

    let h2r = p.publish_harness2().await?;
    let env2 = format!("{}/weenv/env:calc-1-h2", p.host);
    let d2 = compose_publish(&p.client, &p.plan("2"), &env2).await?;
    p.proxy.stats().clear();
    let out2 = p.tmp.path().join("out2");
    lazy_run(&env2, "lazy-2", &out2)?;
    check_run(&out2, 2)?;

    let harness_layer = h2r.layers[0].0.to_string();
    let reqs = p.proxy.stats().requests();
    let blob_gets: Vec<_> = reqs
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/blobs/sha256:"))
        .collect();
    let fetched: u64 = blob_gets.iter().map(|r| r.response_bytes).sum();
    let env2_manifest = p.client.get_manifest(&parse_ref(&env2)?).await?;
    let m = weenv_env::group::parse_manifest(&env2_manifest.bytes)?;
    ensure!(env2_manifest.digest.to_string() == d2);
    let other_layers: Vec<String> = m
        .layers
        .iter()
        .map(|l| l.digest.to_string())
        .filter(|d| *d != harness_layer)
        .collect();
    let refetched: Vec<_> = blob_gets
        .iter()
        .filter(|r| other_layers.iter().any(|d| r.path.contains(d.as_str())))
        .collect();
    println!(
        "harness:2 environment fetched {fetched} blob bytes in {} GETs (harness layer {} bytes)",
        blob_gets.len(),
        h2r.layers[0].1
    );
    ensure!(
        refetched.is_empty(),
        "layers shared with harness:1 were fetched again: {refetched:#?}"
    );
    ensure!(
        fetched <= h2r.layers[0].1 + 64 * 1024,
        "fetched {fetched} bytes, more than the harness layer + config: {blob_gets:#?}"
    );
    Ok(())
}

/// `weenv run` (library call `weenv_cli::run::run_plan`): one environment composed on the node.
async fn weenv_run(
    p: &Published,
    ctd: &Containerd,
    plan: &str,
    name: &str,
    out: &Path,
    cmd: &[&str],
) -> Result<weenv_cli::run::RunReport> {
    weenv_run_with(p, ctd, None, plan, name, out, cmd).await
}

/// [`weenv_run`] with the daemon's endpoint (verifications of contested chains).
async fn weenv_run_with(
    p: &Published,
    ctd: &Containerd,
    daemon: Option<&snapshotter_common::Daemon>,
    plan: &str,
    name: &str,
    out: &Path,
    cmd: &[&str],
) -> Result<weenv_cli::run::RunReport> {
    std::fs::create_dir_all(out)?;
    let plan_path = p.tmp.path().join(format!("{name}.toml"));
    std::fs::write(&plan_path, plan)?;
    let o = weenv_cli::run::RunOptions {
        plan: plan_path,
        image: format!("{}/weenv/env:{name}", p.host),
        publish: false,
        address: ctd.address().to_path_buf(),
        namespace: ctd.namespace().to_string(),
        snapshotter: "weenv".into(),
        runtime: None,
        id: Some(format!("run-{name}")),
        mounts: vec![format!(
            "type=bind,src={},dst=/out,options=rbind:rw",
            out.display()
        )],
        limits: Default::default(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        labels: Default::default(),
        keep: false,
        stdio: weenv_cli::run::stdio::StdioMode::Output,
        cache_dir: p.tmp.path().join("resolve-cache"),
        policy: ResolvePolicy::default(),
        daemon: daemon
            .map(|d| d.status_addr.parse())
            .transpose()?
            .map(weenv_snapshotter_api::config::ListenAddr::Tcp),
    };
    let rep = weenv_cli::run::run_plan(&p.client, &o).await?;
    println!(
        "{name}: layers (lazy, applied, present) {:?}; steps: {}",
        rep.layers,
        rep.timings.render()
    );
    ensure!(rep.exit_code == 0, "{name}: exit {}", rep.exit_code);
    Ok(rep)
}

/// Requests that write to the registry (anything but GET and HEAD).
fn registry_writes(p: &Published) -> Vec<String> {
    p.proxy
        .stats()
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET" && r.method != "HEAD")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// `weenv run` composes each plan on the node (manifest and config into containerd's content
/// store, image record) and never writes to the registry; the environments run with the
/// right content (rewards); a stack that shares every layer with stacks already on the node,
/// some under another parent, fetches nothing: no TOC, no byte of any layer.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, weenv-snapshotter"]
async fn weenv_run_composes_on_the_node_without_registry_writes() -> Result<()> {
    require_root_and_bins(E2E_BINS)?;
    let p = publish_groups().await?;
    let (daemon, ctd) = snapshotter_common::lazy_stack(&p.tmp.path().join("snap"), &p.host)?;
    let with_log = |e: anyhow::Error| e.context(format!("daemon log:\n{}", daemon.log()));

    p.proxy.stats().clear();
    let out1 = p.tmp.path().join("out1");
    let r1 = weenv_run(&p, &ctd, &p.plan("1"), "calc-1-h1", &out1, &[])
        .await
        .map_err(with_log)?;
    check_run(&out1, 1)?;
    ensure!(r1.layers.0 > 0, "no lazy layer: {:?}", r1.layers);
    let writes = registry_writes(&p);
    ensure!(writes.is_empty(), "weenv run wrote: {writes:#?}");
    // cold node: the CLI resolves each group (manifest + config) and writes them into
    // containerd's content store; the daemon reads them there: one GET each
    let reqs = p.proxy.stats().requests();
    let gets = |suffix: &str| {
        reqs.iter()
            .filter(|r| r.method == "GET" && r.path.contains(suffix))
            .count()
    };
    let mut counts = Vec::new();
    for repo in ["base", "task-calc", "task-calc-1", "harness", "eval"] {
        let r = parse_ref(&format!("{}/weenv/{repo}:1", p.host))?;
        let config = weenv_env::group::parse_manifest(&p.client.get_manifest(&r).await?.bytes)?
            .config
            .digest;
        counts.push((
            repo,
            gets(&format!("/weenv/{repo}/manifests/")),
            gets(&format!("/weenv/{repo}/blobs/{config}")),
        ));
    }
    println!("calc-1-h1 (cold node): group manifest and config GETs: {counts:?}");
    ensure!(
        counts.iter().all(|(_, m, c)| (*m, *c) == (1, 1)),
        "a group manifest or config was fetched more than once: {counts:?}\n{reqs:#?}"
    );
    let images = ctd.ctr_ok(&["images", "ls", "-q"])?;
    ensure!(images.contains("weenv/env:calc-1-h1"), "{images}");
    ensure!(
        p.client
            .get_manifest(&parse_ref(&format!("{}/weenv/env:calc-1-h1", p.host))?)
            .await
            .is_err(),
        "the composed image is in the registry"
    );

    // harness:2: only its layer is fetched; the evaluator layer above it is reused under
    // its new parent
    let h2r = p.publish_harness2().await?;
    p.proxy.stats().clear();
    let out2 = p.tmp.path().join("out2");
    weenv_run(&p, &ctd, &p.plan("2"), "calc-1-h2", &out2, &[])
        .await
        .map_err(with_log)?;
    check_run(&out2, 2)?;
    let writes = registry_writes(&p);
    ensure!(writes.is_empty(), "weenv run wrote: {writes:#?}");
    let harness_layer = h2r.layers[0].0.to_string();
    let reqs = p.proxy.stats().requests();
    let other_blob_bytes: u64 = reqs
        .iter()
        .filter(|r| r.path.contains("/blobs/sha256:") && !r.path.contains(&harness_layer))
        .filter(|r| r.response_bytes > 4096) // configs are < 4 KiB; no layer range is
        .map(|r| r.response_bytes)
        .sum();
    let fetched: u64 = reqs.iter().map(|r| r.response_bytes).sum();
    println!(
        "calc-1-h2: {} registry requests, {fetched} bytes (harness layer {} bytes)",
        reqs.len(),
        h2r.layers[0].1
    );
    ensure!(other_blob_bytes == 0, "shared layers fetched: {reqs:#?}");

    // base + task + mutation + evaluator, without a harness: the evaluator's layer now sits
    // on another parent than in both stacks before; every layer is on the node
    p.proxy.stats().clear();
    let plan3 = format!(
        "version = 1\ngroups = [\"{h}/weenv/base:1\", \"{h}/weenv/task-calc:1\", \"{h}/weenv/eval:1\"]\n\
         [mutation]\nmode = \"pre-applied\"\ngroup = \"{h}/weenv/task-calc-1:1\"\n",
        h = p.host
    );
    let out3 = p.tmp.path().join("out3");
    let r3 = weenv_run(
        &p,
        &ctd,
        &plan3,
        "calc-1-noh",
        &out3,
        &[
            "/bin/sh",
            "-c",
            // shell builtins only: files the runs before read already (no demand read)
            "test -x /eval/run.sh && while read -r l; do case \"$l\" in 'def sub'*) echo 1 > /out/sub;; esac; done < /src/proj/calc.py",
        ],
    )
    .await
    .map_err(with_log)?;
    ensure!(read(&out3, "sub").trim() == "1", "{:?}", read(&out3, "sub"));
    let reqs = p.proxy.stats().requests();
    let bytes: u64 = reqs.iter().map(|r| r.response_bytes).sum();
    println!(
        "calc-1-noh (every layer on the node, the evaluator under a new parent): {} registry requests, {bytes} bytes; layers {:?}",
        reqs.len(),
        r3.layers
    );
    ensure!(r3.layers.1 == 0, "layers applied: {:?}", r3.layers);
    ensure!(
        reqs.is_empty(),
        "a stack of layers already on the node reached the registry: {reqs:#?}"
    );
    Ok(())
}

/// Issue 24 through `weenv run`: an image whose config claims the diff_id of the base group's
/// first layer (busybox files instead of Debian's), pulled lazily first in the same namespace,
/// holds that chain; `weenv run` of the plan must not build on it: the CLI has the daemon
/// verify the chain's layer (quarantined), replaces the chain, and the environment runs on
/// the real base (reward 1; on EVIL's layer python would be missing).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, weenv-snapshotter"]
async fn weenv_run_never_builds_on_a_forged_base_layer() -> Result<()> {
    require_root_and_bins(E2E_BINS)?;
    let p = publish_groups().await?;
    let (daemon, ctd) = snapshotter_common::lazy_stack(&p.tmp.path().join("snap"), &p.host)?;
    let base: weenv_registry::Reference = format!("{}/weenv/base:1", p.host).parse()?;
    let (m, _) = p
        .client
        .get_image_manifest(
            &base,
            "linux",
            &weenv_registry::manifest::host_platform().architecture,
            None,
        )
        .await?;
    let config: serde_json::Value =
        serde_json::from_slice(&p.client.get_blob(&base, &m.config.digest).await?)?;
    let d1 = config["diffIds"][0]
        .as_str()
        .context("the base group's config names no diff_id")?
        .to_string();
    let evil = format!("{}/tenant/evil:1", p.host);
    let evil_layer =
        untrusted_common::push_claiming(&p.client, &images::busybox()?, &evil, &d1).await?;
    let out = daemon.pull(ctd.address(), ctd.namespace(), &evil)?;
    ensure!(out.contains("(1 lazy"), "EVIL pulled lazily: {out}");
    let out1 = p.tmp.path().join("out-forged");
    weenv_run_with(&p, &ctd, Some(&daemon), &p.plan("1"), "forged", &out1, &[])
        .await
        .map_err(|e| e.context(format!("daemon log:\n{}", daemon.log())))?;
    check_run(&out1, 1)?;
    ensure!(daemon.metric("weenv_layer_quarantined_total")? == 1);
    ensure!(
        daemon.log().contains("layer quarantined") && daemon.log().contains(&evil_layer),
        "EVIL's layer was not verified and quarantined"
    );
    Ok(())
}
