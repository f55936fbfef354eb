//! The environment service (`weenv-envd`) end to end through its Python SDK: a private
//! registry with a busybox base group (converted to weenv, lazy) and a repository group, the
//! weenv snapshotter, a private containerd with the weenv shim; then `pytest python/tests`
//! starts (and restarts) `weenv-envd` on that stack and drives it with the SDK, the SWE-ReX
//! adapter and the gym wrapper (see `python/tests/conftest.py`). pytest's output, with its
//! summary line, goes straight to this test's stdout.
//!
//! Needs the Python deps (`scripts/python_deps.sh`: grpcio, protobuf, pytest, swe-rex);
//! without them the test fails naming the script.

mod snapshotter_common;

use anyhow::{bail, ensure, Context, Result};
use snapshotter_common::{Daemon, DaemonOptions};
use std::path::Path;
use std::process::Command;
use weenv_converter::group::{create_group, GroupSource, GroupSpec};
use weenv_converter::plan::parse_ref;
use weenv_converter::registry_config;
use weenv_env::group::{ConfigFragment, GroupKind};
use weenv_format::writer::WriterOptions;
use weenv_integration::containerd::{default_shim_dir, Containerd, ContainerdOptions, SHIM_BINARY};
use weenv_integration::images;
use weenv_integration::registry::LocalRegistry;
use weenv_integration::util::{require_root_and_bins, workspace_bin, E2E_FUSE_BINS};
use weenv_registry::Client;

/// Publish `weenv/base:1` (busybox, converted to weenv) and `weenv/repo:1` (a small tree at
/// `/src/repo`) to the registry at `host`.
async fn publish_groups(client: &Client, host: &str, scratch: &Path) -> Result<()> {
    weenv_converter::convert_image(
        client,
        &weenv_converter::ImageLocation::parse(&format!("{host}/src/busybox:1"))?,
        &weenv_converter::ImageLocation::parse(&format!("{host}/src/busybox-weenv:1"))?,
        &weenv_converter::ConvertOptions::default(),
        std::sync::Arc::new(weenv_converter::NoProgress),
    )
    .await?;
    let spec = |kind, name: &str| GroupSpec {
        kind,
        name: name.into(),
        fragment: ConfigFragment::default(),
        platform: None,
        mtime_clamp: None,
    };
    create_group(
        client,
        &GroupSource::Image {
            reference: format!("{host}/src/busybox-weenv:1"),
            layers: 0..1,
        },
        &spec(GroupKind::Base, "busybox"),
        &parse_ref(&format!("{host}/weenv/base:1"))?,
        scratch,
        &WriterOptions::default(),
    )
    .await?;
    let repo = scratch.join("repo-tree");
    std::fs::create_dir_all(repo.join("src/repo"))?;
    std::fs::write(
        repo.join("src/repo/app.py"),
        "def answer():\n    return 42\n\n",
    )?;
    std::fs::write(repo.join("src/repo/README"), "a repository\n")?;
    create_group(
        client,
        &GroupSource::Dir(repo),
        &spec(GroupKind::Task, "repo"),
        &parse_ref(&format!("{host}/weenv/repo:1"))?,
        scratch,
        &WriterOptions::default(),
    )
    .await?;
    Ok(())
}

#[test]
#[ignore = "needs root, containerd, runc, FUSE, python3 with the SDK's deps"]
fn python_sdk_against_a_real_service() -> Result<()> {
    require_root_and_bins(E2E_FUSE_BINS)?;
    let shim = default_shim_dir().join(SHIM_BINARY);
    ensure!(
        shim.exists(),
        "{} missing: cargo build -p weenv-shim",
        shim.display()
    );
    let envd = workspace_bin("weenv-envd")?;
    let deps = Command::new("python3")
        .args([
            "-c",
            "import grpc, google.protobuf, pytest, pytest_asyncio, swerex",
        ])
        .status()?;
    if !deps.success() {
        bail!("the Python SDK's test deps are missing: run scripts/python_deps.sh");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let tmp = tempfile::tempdir()?;
    let reg = LocalRegistry::start(tmp.path())?;
    reg.push(&images::busybox()?, "src/busybox:1")?;
    let host = reg.host();
    let client = Client::new(registry_config(std::slice::from_ref(&host)))?;
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch)?;
    rt.block_on(publish_groups(&client, &host, &scratch))?;
    let daemon = Daemon::start(
        &tmp.path().join("snap"),
        &DaemonOptions {
            plain_http: vec![host.clone()],
            fill: false,
            fill_extra: String::new(),
        },
    )?;
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(daemon.socket.clone()),
        ..Default::default()
    })?;
    let ns = ctd.namespace().to_string();
    let groups = vec![
        format!("{host}/weenv/base:1"),
        format!("{host}/weenv/repo:1"),
    ];
    let plan = tmp.path().join("plan.toml");
    std::fs::write(
        &plan,
        format!(
            "version = 1\ngroups = {}\n",
            serde_json::to_string(&groups)?
        ),
    )?;
    // The same plan published as a plan artifact: the service fetches it by reference.
    let plan_ref = format!("{host}/weenv/plans:envd");
    let o = Command::new(workspace_bin("weenv-convert")?)
        .args(["--plain-http", &host, "plan", "publish"])
        .arg(&plan)
        .args(["--to", &plan_ref, "--cache-dir"])
        .arg(tmp.path().join("publish-cache"))
        .output()?;
    ensure!(
        o.status.success(),
        "weenv-convert plan publish: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let status_dir = tmp.path().join("shim-status");
    let ledger_dir = tmp.path().join("shim-ledger");
    let path = |p: &Path| p.display().to_string();
    let cmd = vec![
        path(&envd),
        "--address".into(),
        path(ctd.address()),
        "--namespace".into(),
        ns.clone(),
        "--plain-http".into(),
        host.clone(),
        "--state-dir".into(),
        path(&tmp.path().join("envd-state")),
        "--shim-status-dir".into(),
        path(&status_dir),
        "--shim-ledger-dir".into(),
        path(&ledger_dir),
        "--gc-interval".into(),
        "1".into(),
    ];
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let path_var = format!(
        "{}:{}",
        path(&default_shim_dir()),
        std::env::var("PATH").unwrap_or_default()
    );
    // A benchmark on this stack instead of pytest (integration/bench/envd_create.py): the
    // service started here, its address and the plan handed over in the environment.
    if let Ok(run) = std::env::var("WEENV_ENVD_RUN") {
        let argv: Vec<String> =
            serde_json::from_str(&run).context("WEENV_ENVD_RUN: a JSON argv")?;
        ensure!(!argv.is_empty(), "WEENV_ENVD_RUN: an empty argv");
        let sock = tmp.path().join("envd.sock");
        let log = std::fs::File::create(tmp.path().join("envd.log"))?;
        // WEENV_ENVD_BIN: another build of the service (e.g. main's, for a before/after).
        let bin = std::env::var("WEENV_ENVD_BIN").unwrap_or_else(|_| cmd[0].clone());
        let mut envd = Command::new(bin)
            .args(&cmd[1..])
            .arg("--socket")
            .arg(&sock)
            .args(
                std::env::var("WEENV_ENVD_ARGS")
                    .map(|a| a.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .env("PATH", &path_var)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        for _ in 0..300 {
            if sock.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let status = Command::new(&argv[0])
            .args(&argv[1..])
            .env("PYTHONPATH", python.join("src"))
            .env("WEENV_ENVD_ADDRESS", format!("unix://{}", sock.display()))
            .env("WEENV_TEST_PLAN", &plan)
            .env("WEENV_TEST_PLAN_REF", &plan_ref)
            .env("WEENV_TEST_GROUPS", serde_json::to_string(&groups)?)
            .env("PATH", &path_var)
            .status();
        let _ = envd.kill();
        let _ = envd.wait();
        let _ = std::fs::copy(
            tmp.path().join("envd.log"),
            std::env::temp_dir().join("envd-bench.log"),
        );
        ensure!(status?.success(), "{argv:?} failed");
        return Ok(());
    }
    let status = Command::new("python3")
        .args([
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "-rs",
            "tests",
        ])
        .current_dir(&python)
        .env("PYTHONPATH", python.join("src"))
        .env("WEENV_TEST_ENVD_CMD", serde_json::to_string(&cmd)?)
        .env("WEENV_TEST_PLAN", &plan)
        .env("WEENV_TEST_PLAN_REF", &plan_ref)
        .env("WEENV_TEST_GROUPS", serde_json::to_string(&groups)?)
        .env("WEENV_TEST_IMAGE", format!("{host}/src/busybox:1"))
        .env(
            "WEENV_TEST_CTR",
            serde_json::to_string(&["ctr", "-a", &path(ctd.address()), "-n", &ns])?,
        )
        .env("WEENV_TEST_LEDGER", &ledger_dir)
        .env("PATH", &path_var)
        .status()
        .context("running pytest")?;
    if !status.success() {
        bail!(
            "pytest failed ({status}); containerd log tail:\n{}\ndaemon log tail:\n{}",
            tail(&ctd.log(), 30),
            tail(&daemon.log(), 30)
        );
    }
    Ok(())
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
