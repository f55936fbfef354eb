//! `weenv run PLAN --image REF [-- cmd...]`: compose an environment plan, publish the composed
//! image (metadata only), pull it lazily through containerd ([`crate::pull`]), create the
//! container, apply the plan's at-init mutation into the container's rootfs, then start it.
//!
//! Container lifecycle goes through `ctr` (it builds the OCI runtime spec from the image
//! config, like `ctr run`): `containers create`; the container's rootfs mounts come from
//! containerd's Snapshots API and are mounted on a temp dir, patched, unmounted; then
//! `tasks start`. A mutation that fails (rejected hunk, missing file, failed checkout) removes
//! the container again and returns the error: no task is ever started on an unpatched rootfs.

use crate::pull::{pull, PullOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime};
use thiserror::Error;
use weenv_converter::mutate::{apply_mutation_to_dir, MutateError};
use weenv_converter::plan::{compose_plan, parse_ref, publish_composed, PlanCmdError};
use weenv_converter::resolve_cache::{unix_secs, ResolveCache, ResolvePolicy};
use weenv_env::plan::{Mutation, Plan, PlanError};
use weenv_registry::Client;

/// Errors of `weenv run`.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("plan {path}: {error}")]
    Plan {
        path: PathBuf,
        error: Box<PlanError>,
    },
    #[error(transparent)]
    Compose(Box<PlanCmdError>),
    #[error("pulling {image}: {message}")]
    Pull { image: String, message: String },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("unexpected container rootfs mounts: {0}")]
    MountLine(String),
    #[error("fetching the patch blob {digest}: {message}")]
    PatchBlob { digest: String, message: String },
    #[error("mutation failed, container {id} removed and not started: {error}")]
    Mutation { id: String, error: Box<MutateError> },
}

impl From<PlanCmdError> for RunError {
    fn from(e: PlanCmdError) -> Self {
        RunError::Compose(Box::new(e))
    }
}

/// Options of `weenv run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub plan: PathBuf,
    /// Reference the composed image is published to (same registry as the groups).
    pub image: String,
    pub address: PathBuf,
    pub namespace: String,
    pub snapshotter: String,
    /// containerd runtime (e.g. `io.containerd.weenv.v1`); default containerd's.
    pub runtime: Option<String>,
    /// Container id (default `weenv-run-<pid>`).
    pub id: Option<String>,
    /// Extra `ctr --mount` specs.
    pub mounts: Vec<String>,
    /// Command (default: the image's entrypoint/cmd).
    pub cmd: Vec<String>,
    /// Keep the container after the task exits.
    pub keep: bool,
    pub cache_dir: PathBuf,
    pub policy: ResolvePolicy,
}

/// Timings and outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub manifest_digest: String,
    pub compose_ms: f64,
    pub pull_ms: f64,
    /// Whole at-init mutation step (mounts query, mount, apply, umount).
    pub mutation_ms: f64,
    /// The patch/checkout application alone.
    pub mutation_apply_ms: f64,
    pub exit_code: i32,
}

/// `ctr -a ADDR -n NS containers create ...` arguments (pure).
pub fn create_args(o: &RunOptions, image_name: &str, id: &str) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-a".into(),
        o.address.display().to_string(),
        "-n".into(),
        o.namespace.clone(),
        "containers".into(),
        "create".into(),
        "--snapshotter".into(),
        o.snapshotter.clone(),
    ];
    if let Some(r) = &o.runtime {
        a.extend(["--runtime".into(), r.clone()]);
    }
    for m in &o.mounts {
        a.extend(["--mount".into(), m.clone()]);
    }
    // `--`: ctr would parse a `-c` of the command as its own `--config` flag.
    a.extend(["--".to_string(), image_name.to_string(), id.to_string()]);
    a.extend(o.cmd.iter().cloned());
    a
}

fn run_cmd(cmd: &mut Command) -> Result<String, RunError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RunError::Command {
            command: format!("{cmd:?}"),
            status: "not started".into(),
            stderr: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(RunError::Command {
            command: format!("{cmd:?}"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ctr(o: &RunOptions) -> Command {
    let mut c = Command::new("ctr");
    c.arg("-a").arg(&o.address).arg("-n").arg(&o.namespace);
    c
}

/// The patch bytes of an at-init mutation: a file relative to the plan, or a blob.
async fn patch_bytes(
    client: &Client,
    m: &Mutation,
    plan_dir: &Path,
    image: &str,
) -> Result<Option<Vec<u8>>, RunError> {
    if let Some(p) = &m.patch {
        let path = plan_dir.join(p);
        return std::fs::read(&path)
            .map(Some)
            .map_err(|source| RunError::Read {
                path,
                error: source,
            });
    }
    if let Some(d) = &m.blob {
        let r = parse_ref(image)?;
        return client
            .get_blob(&r, d)
            .await
            .map(|b| Some(b.to_vec()))
            .map_err(|e| RunError::PatchBlob {
                digest: d.to_string(),
                message: e.to_string(),
            });
    }
    Ok(None)
}

/// `mount` arguments for one containerd mount on `target` (pure).
pub fn mount_args_for(kind: &str, source: &str, options: &[String], target: &Path) -> Vec<String> {
    let mut a = vec![
        "-t".to_string(),
        kind.to_string(),
        source.to_string(),
        target.display().to_string(),
    ];
    if !options.is_empty() {
        a.extend(["-o".to_string(), options.join(",")]);
    }
    a
}

/// The container snapshot's mounts, asked from containerd directly (no `ctr` process).
async fn snapshot_mounts(
    ch: tonic::transport::Channel,
    o: &RunOptions,
    id: &str,
    target: &Path,
) -> Result<Vec<Vec<String>>, RunError> {
    use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
    use containerd_client::services::v1::snapshots::MountsRequest;
    let mut req = tonic::Request::new(MountsRequest {
        snapshotter: o.snapshotter.clone(),
        key: id.to_string(),
    });
    if let Ok(v) = o.namespace.parse() {
        req.metadata_mut().insert("containerd-namespace", v);
    }
    let resp = SnapshotsClient::new(ch)
        .mounts(req)
        .await
        .map_err(|e| RunError::Command {
            command: format!("containerd Snapshots.Mounts({id})"),
            status: e.code().to_string(),
            stderr: e.message().to_string(),
        })?;
    let mounts = resp.into_inner().mounts;
    if mounts.len() != 1 {
        return Err(RunError::MountLine(format!(
            "expected one rootfs mount, got {}",
            mounts.len()
        )));
    }
    Ok(mounts
        .iter()
        .map(|m| mount_args_for(&m.r#type, &m.source, &m.options, target))
        .collect())
}

/// Mount the container's rootfs, apply the mutation, unmount (always).
async fn mutate_container(
    ch: tonic::transport::Channel,
    o: &RunOptions,
    id: &str,
    m: &Mutation,
    patch: Option<&[u8]>,
) -> Result<f64, RunError> {
    let dir = tempfile::tempdir().map_err(|source| RunError::Read {
        path: std::env::temp_dir(),
        error: source,
    })?;
    for args in snapshot_mounts(ch, o, id, dir.path()).await? {
        run_cmd(Command::new("mount").args(&args))?;
    }
    let t = Instant::now();
    let res = apply_mutation_to_dir(dir.path(), m, patch);
    let apply_ms = t.elapsed().as_secs_f64() * 1e3;
    let um = run_cmd(Command::new("umount").arg(dir.path()));
    match res {
        Ok(_) => um.map(|_| apply_ms),
        Err(source) => Err(RunError::Mutation {
            id: id.to_string(),
            error: Box::new(source),
        }),
    }
}

/// Compose, publish, pull, create, mutate, start. Returns the task's exit code.
pub async fn run_plan(client: &Client, o: &RunOptions) -> Result<RunReport, RunError> {
    let text = std::fs::read_to_string(&o.plan).map_err(|source| RunError::Read {
        path: o.plan.clone(),
        error: source,
    })?;
    let plan = Plan::parse(&text).map_err(|source| RunError::Plan {
        path: o.plan.clone(),
        error: Box::new(source),
    })?;
    let mut report = RunReport::default();
    let t = Instant::now();
    let mut cache = ResolveCache::load(&o.cache_dir);
    let now = unix_secs(SystemTime::now());
    let (groups, composed) = compose_plan(client, &plan, &mut cache, now, o.policy).await?;
    if let Err(e) = cache.save() {
        tracing::warn!(error = %e, "could not save the resolution cache");
    }
    publish_composed(client, &groups, &composed, &parse_ref(&o.image)?).await?;
    tracing::debug!(digest = %composed.manifest_digest, "composed and published");
    report.compose_ms = t.elapsed().as_secs_f64() * 1e3;
    report.manifest_digest = composed.manifest_digest.to_string();

    let t = Instant::now();
    let ch = containerd_client::connect(&o.address)
        .await
        .map_err(|e| RunError::Pull {
            image: o.image.clone(),
            message: format!("connecting to containerd at {}: {e}", o.address.display()),
        })?;
    let popts = PullOptions {
        namespace: o.namespace.clone(),
        snapshotter: o.snapshotter.clone(),
        platform: None,
        image_name: None,
    };
    let pulled = pull(client, ch.clone(), &o.image, &popts)
        .await
        .map_err(|e| RunError::Pull {
            image: o.image.clone(),
            message: e.to_string(),
        })?;
    report.pull_ms = t.elapsed().as_secs_f64() * 1e3;

    let id =
        o.id.clone()
            .unwrap_or_else(|| format!("weenv-run-{}", std::process::id()));
    let plan_dir = o.plan.parent().unwrap_or(Path::new(".")).to_path_buf();
    // Read the patch before creating anything.
    let patch = match plan.init_mutation() {
        Some(m) => patch_bytes(client, m, &plan_dir, &o.image).await?,
        None => None,
    };
    run_cmd(Command::new("ctr").args(create_args(o, &pulled.image, &id)))?;
    if let Some(m) = plan.init_mutation() {
        let t = Instant::now();
        match mutate_container(ch, o, &id, m, patch.as_deref()).await {
            Ok(apply_ms) => report.mutation_apply_ms = apply_ms,
            Err(e) => {
                let _ = run_cmd(ctr(o).args(["containers", "rm", &id]));
                return Err(e);
            }
        }
        report.mutation_ms = t.elapsed().as_secs_f64() * 1e3;
    }
    let status = ctr(o)
        .args(["tasks", "start", &id])
        .status()
        .map_err(|e| RunError::Command {
            command: "ctr tasks start".into(),
            status: "not started".into(),
            stderr: e.to_string(),
        })?;
    report.exit_code = status.code().unwrap_or(128);
    if !o.keep {
        let _ = run_cmd(ctr(o).args(["tasks", "rm", "-f", &id]));
        let _ = run_cmd(ctr(o).args(["containers", "rm", &id]));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> RunOptions {
        RunOptions {
            plan: "p.toml".into(),
            image: "r/env:1".into(),
            address: "/run/c.sock".into(),
            namespace: "ns".into(),
            snapshotter: "weenv".into(),
            runtime: Some("io.containerd.weenv.v1".into()),
            id: None,
            mounts: vec!["type=bind,src=/a,dst=/b,options=rbind:rw".into()],
            cmd: vec!["python3".into(), "-V".into()],
            keep: false,
            cache_dir: "/tmp/c".into(),
            policy: ResolvePolicy::default(),
        }
    }

    #[test]
    fn create_args_shape() {
        let a = create_args(&opts(), "r/env:1", "c1");
        assert_eq!(
            a.join(" "),
            "-a /run/c.sock -n ns containers create --snapshotter weenv --runtime io.containerd.weenv.v1 \
             --mount type=bind,src=/a,dst=/b,options=rbind:rw -- r/env:1 c1 python3 -V"
        );
    }

    #[test]
    fn mount_args_shape() {
        let t = Path::new("/tmp/m");
        let a = mount_args_for(
            "overlay",
            "overlay",
            &["index=off".into(), "lowerdir=/x:/y".into()],
            t,
        );
        assert_eq!(
            a,
            vec![
                "-t",
                "overlay",
                "overlay",
                "/tmp/m",
                "-o",
                "index=off,lowerdir=/x:/y"
            ]
        );
        assert_eq!(
            mount_args_for("bind", "/s", &[], t),
            vec!["-t", "bind", "/s", "/tmp/m"]
        );
    }
}
