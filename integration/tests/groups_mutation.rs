//! At-init mutation through `weenv run` (library entry `weenv_cli::run::run_plan`):
//! a plan stacks busybox (base group, from an ordinary image) + a repository group and names a
//! patch; `run_plan` composes on the node (manifest and config into containerd's content store,
//! image record; no registry write: the registry sits behind a counting proxy that sees no
//! PUT/POST/PATCH/DELETE from any run), prepares the layers, creates the container, applies the
//! patch into its rootfs and starts it. Checked with stock overlayfs and with the weenv
//! snapshotter (lazy):
//! - the task sees the patched tree (modified file, new file in a new dir, deletion, mode
//!   change), identical to what the pre-applied mutation group gives;
//! - a patch with a rejected hunk fails with an error naming the file and hunk, and no
//!   container or task is left (nothing started).

mod snapshotter_common;

use anyhow::{ensure, Context, Result};
use snapshotter_common::{Daemon, DaemonOptions};
use std::path::{Path, PathBuf};
use weenv_cli::run::{compose_and_start, run_plan, RunError, RunOptions};
use weenv_converter::group::{create_group, GroupSource, GroupSpec};
use weenv_converter::mutate::{mutate_group, MutateSpec};
use weenv_converter::plan::parse_ref;
use weenv_converter::registry_config;
use weenv_converter::resolve_cache::ResolvePolicy;
use weenv_env::group::{ConfigFragment, GroupKind};
use weenv_format::writer::WriterOptions;
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::images;
use weenv_integration::registry::{CountingProxy, LocalRegistry};
use weenv_integration::util::{require_root_and_bins, E2E_BINS};
use weenv_registry::Client;

const PATCH: &str = "diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,3 +1,3 @@
 def answer():
-    return 42
+    return 41
 
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
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

/// Lists the repository tree inside the container (paths, modes, contents) into /out/tree.
const LIST: &str = "cd /src/repo && for f in $(find . | busybox sort); do if [ -f \"$f\" ]; then echo \"$f $(stat -c %a \"$f\") $(cat \"$f\" | md5sum | busybox cut -c1-8)\"; else echo \"$f dir\"; fi; done > /out/tree";

struct Env {
    ctd: Containerd,
    _daemon: Option<Daemon>,
    host: String,
    client: Client,
    tmp: tempfile::TempDir,
    proxy: CountingProxy,
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

async fn setup(lazy: bool) -> Result<Env> {
    require_root_and_bins(E2E_BINS)?;
    let tmp = tempfile::tempdir()?;
    let reg = LocalRegistry::start(tmp.path())?;
    reg.push(&images::busybox()?, "src/busybox:1")?;
    // everything else goes through a counting proxy: the runs must not write
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
    // The base group reuses the layers of an already converted weenv image: mounted across
    // repositories, not re-uploaded (groups sharing layers share blobs).
    weenv_converter::convert_image(
        &client,
        &weenv_converter::ImageLocation::parse(&format!("{host}/src/busybox:1"))?,
        &weenv_converter::ImageLocation::parse(&format!("{host}/src/busybox-weenv:1"))?,
        &weenv_converter::ConvertOptions::default(),
        std::sync::Arc::new(weenv_converter::NoProgress),
    )
    .await?;
    let base = create_group(
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
    ensure!(
        base.layers
            .iter()
            .all(|l| l.2 == weenv_registry::BlobPush::Mounted),
        "{:?}",
        base.layers
    );
    ensure!(
        base.bytes_uploaded < 4096,
        "uploaded {}",
        base.bytes_uploaded
    );
    let repo = tmp.path().join("repo");
    let w = |rel: &str, c: &str| -> Result<()> {
        let p = repo.join("src/repo").join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        Ok(std::fs::write(p, c)?)
    };
    w("app.py", "def answer():\n    return 42\n\n")?;
    w("run.sh", "#!/bin/sh\necho run\n")?;
    w("obsolete.txt", "remove me\n")?;
    create_group(
        &client,
        &GroupSource::Dir(repo),
        &spec(GroupKind::Task, "repo"),
        &parse_ref(&format!("{host}/weenv/repo:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    // a group cut from a group: same layers, nothing uploaded but its config and manifest
    let copy = create_group(
        &client,
        &GroupSource::Image {
            reference: format!("{host}/weenv/repo:1"),
            layers: 0..1,
        },
        &spec(GroupKind::Task, "repo-copy"),
        &parse_ref(&format!("{host}/weenv/repo-copy:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    ensure!(
        copy.layers[0].2 == weenv_registry::BlobPush::Mounted,
        "{:?}",
        copy.layers
    );
    ensure!(
        copy.bytes_uploaded < 4096,
        "uploaded {}",
        copy.bytes_uploaded
    );
    let daemon = if lazy {
        Some(Daemon::start(
            &tmp.path().join("snap"),
            &DaemonOptions {
                plain_http: vec![host.clone()],
                fill: false,
                fill_extra: String::new(),
            },
        )?)
    } else {
        None
    };
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: daemon.as_ref().map(|d| d.socket.clone()),
        ..Default::default()
    })?;
    Ok(Env {
        ctd,
        _daemon: daemon,
        host,
        client,
        tmp,
        proxy,
        _reg: reg,
    })
}

fn write_plan(e: &Env, name: &str, extra: &str) -> Result<PathBuf> {
    let p = e.tmp.path().join(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!(
            "version = 1\ngroups = [\"{h}/weenv/base:1\", \"{h}/weenv/repo:1\"]\n{extra}",
            h = e.host
        ),
    )?;
    Ok(p)
}

fn opts(
    e: &Env,
    plan: PathBuf,
    image: &str,
    id: &str,
    snapshotter: &str,
    out: &Path,
) -> RunOptions {
    RunOptions {
        plan,
        image: image.to_string(),
        publish: false,
        address: e.ctd.address().to_path_buf(),
        namespace: e.ctd.namespace().to_string(),
        snapshotter: snapshotter.to_string(),
        runtime: None,
        id: Some(id.to_string()),
        mounts: vec![format!(
            "type=bind,src={},dst=/out,options=rbind:rw",
            out.display()
        )],
        limits: Default::default(),
        cmd: vec!["/bin/sh".into(), "-c".into(), LIST.into()],
        labels: Default::default(),
        keep: false,
        stdio: weenv_cli::run::stdio::StdioMode::Output,
        cache_dir: e.tmp.path().join("cache"),
        policy: ResolvePolicy::default(),
        daemon: None,
    }
}

/// [`opts`] of the run `name` (image `env:NAME`, id `mut-NAME`) writing to its new dir
/// `out-NAME`.
fn named_opts(
    e: &Env,
    plan: PathBuf,
    name: &str,
    snapshotter: &str,
) -> Result<(RunOptions, PathBuf)> {
    let out = e.tmp.path().join(format!("out-{name}"));
    std::fs::create_dir_all(&out)?;
    let image = format!("{}/weenv/env:{name}", e.host);
    let o = opts(e, plan, &image, &format!("mut-{name}"), snapshotter, &out);
    Ok((o, out))
}

/// `weenv --config DEFAULTS run init.toml` of image `env:cli` (`extra` after `--plain-http`)
/// with this stack's containerd, `snapshotter`, container `id` and resolution cache.
fn cli_run(
    e: &Env,
    defaults: &Path,
    snapshotter: &str,
    id: &str,
    extra: &[&str],
) -> Result<std::process::Command> {
    let mut c = std::process::Command::new(weenv_integration::util::workspace_bin("weenv")?);
    c.arg("--config")
        .arg(defaults)
        .arg("run")
        .arg(e.tmp.path().join("init.toml"))
        .args([
            "--image",
            &format!("{}/weenv/env:cli", e.host),
            "--plain-http",
        ])
        .args(extra)
        .arg("--address")
        .arg(e.ctd.address())
        .args([
            "--namespace",
            e.ctd.namespace(),
            "--snapshotter",
            snapshotter,
            "--id",
            id,
        ])
        .arg("--cache-dir")
        .arg(e.tmp.path().join("cache"));
    Ok(c)
}

async fn scenario(lazy: bool) -> Result<()> {
    let e = setup(lazy).await?;
    let snap = if lazy { "weenv" } else { "overlayfs" };
    std::fs::write(e.tmp.path().join("bug.diff"), PATCH)?;
    std::fs::write(e.tmp.path().join("bad.diff"), BAD_PATCH)?;
    e.proxy.stats().clear();

    // at init
    let plan = write_plan(
        &e,
        "init",
        "[mutation]\npatch = \"bug.diff\"\nroot = \"/src/repo\"\n",
    )?;
    // several environments of one plan started at once (`compose_and_start` from one
    // process, as a rollout benchmark does): same layers prepared concurrently, each container
    // patched and run
    let ch = weenv_cli::run::connect(e.ctd.address()).await?;
    let mut starts = Vec::new();
    for i in 0..3 {
        let out = e.tmp.path().join(format!("out-par-{i}"));
        std::fs::create_dir_all(&out)?;
        let o = opts(
            &e,
            plan.clone(),
            &format!("{}/weenv/env:init", e.host),
            &format!("mut-par-{i}"),
            snap,
            &out,
        );
        let (client, ch) = (e.client.clone(), ch.clone());
        starts.push(tokio::spawn(async move {
            let mut tm = weenv_cli::run::Timings::default();
            let mut s = compose_and_start(&client, ch, &o, &mut tm).await?;
            let code = s.task.wait(false, &mut tm).await?;
            s.task.remove(&mut tm).await?;
            Ok::<_, RunError>((code, tm))
        }));
    }
    let mut trees = Vec::new();
    for (i, h) in starts.into_iter().enumerate() {
        let (code, tm) = h.await??;
        ensure!(code == 0, "parallel run {i}: exit {code}");
        println!("{snap}: parallel run {i}: {}", tm.render());
        trees.push(std::fs::read_to_string(
            e.tmp.path().join(format!("out-par-{i}/tree")),
        )?);
    }
    ensure!(trees.windows(2).all(|w| w[0] == w[1]), "{trees:#?}");

    let (o, out_init) = named_opts(&e, plan, "init", snap)?;
    let rep = run_plan(&e.client, &o).await?;
    ensure!(rep.exit_code == 0, "exit {}", rep.exit_code);
    println!(
        "{snap}: compose {:.1} ms, layers {:.1} ms {:?}, mutation {:.1} ms (apply {:.2} ms); {}",
        rep.compose_ms,
        rep.layers_ms,
        rep.layers,
        rep.mutation_ms,
        rep.mutation_apply_ms,
        rep.timings.render()
    );
    // composed on the node: the image record and the manifest with its GC and source labels
    // are in containerd; the registry has no such manifest
    let name = format!("{}/weenv/env:init", e.host);
    let images = e.ctd.ctr_ok(&["images", "ls", "-q"])?;
    ensure!(
        images.lines().any(|l| l == name),
        "no image record: {images}"
    );
    let content = e.ctd.ctr_ok(&["content", "ls"])?;
    let mline = content
        .lines()
        .find(|l| l.starts_with(&rep.manifest_digest))
        .with_context(|| format!("composed manifest not in the content store: {content}"))?;
    ensure!(
        mline.contains("containerd.io/gc.ref.content.config=")
            && mline.contains("containerd.io/gc.ref.content.l.0=")
            && mline.contains(&format!(
                "containerd.io/distribution.source.{}=weenv/base,weenv/repo",
                e.host
            )),
        "manifest labels: {mline}"
    );
    let tree_init = std::fs::read_to_string(out_init.join("tree"))?;

    // the same through the `weenv run` command line
    let out_cli = e.tmp.path().join("out-cli");
    std::fs::create_dir_all(&out_cli)?;
    // A config of defaults (not the host's /etc/weenv one; a missing --config is an error).
    let defaults = e.tmp.path().join("defaults.toml");
    std::fs::write(&defaults, "version = 1\n")?;
    let o = cli_run(&e, &defaults, snap, "mut-cli", &[])?
        .arg("--mount")
        .arg(format!(
            "type=bind,src={},dst=/out,options=rbind:rw",
            out_cli.display()
        ))
        .args(["--", "/bin/sh", "-c", LIST])
        .output()?;
    ensure!(
        o.status.success(),
        "weenv run: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    ensure!(
        String::from_utf8_lossy(&o.stderr).contains("mutation"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    ensure!(
        std::fs::read_to_string(out_cli.join("tree"))? == tree_init,
        "CLI run differs"
    );

    // the task's output and exit code come back through `weenv run` (FIFOs, Tasks.Wait), and
    // nothing is left behind after the run
    let o = cli_run(&e, &defaults, snap, "mut-exit", &["--timings"])?
        .args([
            "--",
            "/bin/sh",
            "-c",
            "grep return /src/repo/app.py; echo to-stderr >&2; read x || echo stdin-closed; exit 3",
        ])
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    ensure!(!o.status.success(), "exit 3 must fail weenv run: {stderr}");
    ensure!(
        stdout.contains("return 41") && stdout.contains("stdin-closed"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    ensure!(
        stderr.contains("to-stderr") && stderr.contains("task exited with status 3"),
        "{stderr}"
    );
    for step in [
        "resolve", "compose", "layers", "prepare", "mutate", "create", "start", "exit",
    ] {
        ensure!(
            stderr.contains(&format!("{step} ")),
            "no {step} timing: {stderr}"
        );
    }
    let containers = e.ctd.ctr_ok(&["containers", "ls", "-q"])?;
    ensure!(
        !containers.contains("mut-exit"),
        "container left: {containers}"
    );
    let snaps = e.ctd.ctr_ok(&["snapshots", "--snapshotter", snap, "ls"])?;
    ensure!(!snaps.contains("mut-exit"), "snapshot left: {snaps}");
    // the same through the library: the exit code in the report
    let mut o3 = opts(
        &e,
        e.tmp.path().join("init.toml"),
        &format!("{}/weenv/env:init", e.host),
        "mut-exit-lib",
        snap,
        &out_init,
    );
    o3.cmd = vec!["/bin/sh".into(), "-c".into(), "exit 7".into()];
    let rep = run_plan(&e.client, &o3).await?;
    ensure!(rep.exit_code == 7, "exit {}", rep.exit_code);
    ensure!(
        rep.timings.get(weenv_cli::run::Step::Start).is_some(),
        "{:?}",
        rep.timings
    );
    // none of the runs so far wrote to the registry (read-only credentials suffice)
    let writes = registry_writes(&e.proxy);
    ensure!(
        writes.is_empty(),
        "weenv run wrote to the registry: {writes:#?}"
    );
    ensure!(
        e.client.get_manifest(&parse_ref(&name)?).await.is_err(),
        "the composed image was published"
    );

    // at init from a blob in the image's repository (`weenv-convert plan push-patch`)
    let o = std::process::Command::new(weenv_integration::util::workspace_bin("weenv-convert")?)
        .args(["--plain-http", &e.host, "plan", "push-patch"])
        .arg(e.tmp.path().join("bug.diff"))
        .args(["--to", &format!("{}/weenv/env:blob", e.host)])
        .output()?;
    ensure!(
        o.status.success(),
        "push-patch: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let d = String::from_utf8_lossy(&o.stdout).trim().to_string();
    ensure!(
        d == weenv_format::Digest::sha256(PATCH.as_bytes()).to_string(),
        "{d}"
    );
    let plan = write_plan(
        &e,
        "blob",
        &format!("[mutation]\nblob = \"{d}\"\nroot = \"/src/repo\"\n"),
    )?;
    let (o, out_blob) = named_opts(&e, plan, "blob", snap)?;
    run_plan(&e.client, &o).await?;
    let tree_blob = std::fs::read_to_string(out_blob.join("tree"))?;
    ensure!(
        tree_blob == tree_init,
        "blob patch:\n{tree_blob}\nfile patch:\n{tree_init}"
    );

    // pre-applied: the same patch as a tiny group on top
    mutate_group(
        &e.client,
        &format!("{}/weenv/repo:1", e.host),
        PATCH.as_bytes(),
        &MutateSpec {
            name: "bug".into(),
            root: "/src/repo".into(),
            strip: 1,
        },
        &parse_ref(&format!("{}/weenv/repo-bug:1", e.host))?,
        e.tmp.path(),
        &WriterOptions::default(),
    )
    .await?;
    let plan = write_plan(
        &e,
        "pre",
        &format!(
            "[mutation]\nmode = \"pre-applied\"\ngroup = \"{}/weenv/repo-bug:1\"\n",
            e.host
        ),
    )?;
    let (o, out_pre) = named_opts(&e, plan, "pre", snap)?;
    run_plan(&e.client, &o).await?;
    let tree_pre = std::fs::read_to_string(out_pre.join("tree"))?;
    ensure!(
        tree_init == tree_pre,
        "trees differ:\ninit:\n{tree_init}\npre-applied:\n{tree_pre}"
    );
    ensure!(tree_init.contains("./docs/NOTE.md 644"), "{tree_init}");
    ensure!(tree_init.contains("./run.sh 755"), "{tree_init}");
    ensure!(!tree_init.contains("obsolete"), "{tree_init}");

    // a missing group fails before anything is pulled or created
    let plan = e.tmp.path().join("missing.toml");
    std::fs::write(
        &plan,
        format!(
            "version = 1\ngroups = [\"{h}/weenv/base:1\", \"{h}/weenv/nope:1\"]\n",
            h = e.host
        ),
    )?;
    let out_missing = e.tmp.path().join("out-missing");
    let err = run_plan(
        &e.client,
        &opts(
            &e,
            plan,
            &format!("{}/weenv/env:missing", e.host),
            "mut-missing",
            snap,
            &out_missing,
        ),
    )
    .await
    .err()
    .context("a missing group must fail the run")?;
    ensure!(
        matches!(&err, RunError::Compose(c) if matches!(**c, weenv_converter::plan::PlanCmdError::MissingGroup { .. })),
        "{err}"
    );
    ensure!(err.to_string().contains("weenv/nope:1 not found"), "{err}");

    // rejected hunk: clear error, no container left, nothing started
    let plan = write_plan(
        &e,
        "bad",
        "[mutation]\npatch = \"bad.diff\"\nroot = \"/src/repo\"\n",
    )?;
    let (o, out_bad) = named_opts(&e, plan, "bad", snap)?;
    let err = run_plan(&e.client, &o)
        .await
        .err()
        .context("a rejected hunk must fail the run")?;
    ensure!(matches!(err, RunError::Mutation { .. }), "{err}");
    let msg = err.to_string() + &format!("{:?}", err);
    ensure!(msg.contains("app.py") && msg.contains("hunk #1"), "{msg}");
    let containers = e.ctd.ctr_ok(&["containers", "ls", "-q"])?;
    ensure!(
        !containers.contains("mut-bad"),
        "container left behind: {containers}"
    );
    let tasks = e.ctd.ctr_ok(&["tasks", "ls", "-q"])?;
    ensure!(!tasks.contains("mut-bad"), "task started: {tasks}");
    ensure!(!out_bad.join("tree").exists(), "the task ran");
    // the only writes of the whole scenario: push-patch's blob and the mutation group
    let writes = registry_writes(&e.proxy);
    ensure!(
        writes
            .iter()
            .all(|w| w.contains("/weenv/env/blobs/") || w.contains("/weenv/repo-bug/")),
        "{writes:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, docker-registry, skopeo, umoci, weenv and weenv-convert built"]
async fn at_init_mutation_with_stock_overlayfs() -> Result<()> {
    scenario(false).await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, weenv-snapshotter, weenv, weenv-convert built"]
async fn at_init_mutation_with_weenv_snapshotter() -> Result<()> {
    scenario(true).await
}
