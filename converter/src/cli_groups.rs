//! `weenv-convert group ...` and `weenv-convert plan ...` front ends (argument parsing and
//! printing only; the logic is in the library's `group`, `mutate`, `plan`, `stats` modules).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use weenv_converter::group::{create_group, parse_layer_range, GroupSource, GroupSpec};
use weenv_converter::mutate::{mutate_group, MutateSpec};
use weenv_converter::plan::{compose_plan, parse_ref, publish_composed};
use weenv_converter::resolve_cache::{default_cache_dir, unix_secs, ResolveCache, ResolvePolicy};
use weenv_env::group::{ConfigFragment, GroupKind};
use weenv_env::plan::Plan;
use weenv_env::stats::{stats, synthetic, table, GroupShape, PlanShape, SyntheticSizes};
use weenv_format::writer::WriterOptions;
use weenv_registry::Client;

/// `group` subcommands.
#[derive(Subcommand)]
pub enum GroupCmd {
    /// Publish a layer group from a directory, a tarball or a range of an image's layers.
    Create(Box<CreateArgs>),
    /// Publish a tiny group holding a patch applied to a base group (changed files + whiteouts).
    Mutate(Box<MutateArgs>),
}

#[derive(Args)]
pub struct CreateArgs {
    /// base, task, harness, evaluator, or any other name.
    #[arg(long)]
    kind: String,
    #[arg(long)]
    name: String,
    /// Source image (with --layers).
    #[arg(long, conflicts_with_all = ["dir", "tar"], requires = "layers")]
    from: Option<String>,
    /// Layer range of --from: A..B (end exclusive) or N.
    #[arg(long)]
    layers: Option<String>,
    /// Source directory.
    #[arg(long, conflicts_with = "tar")]
    dir: Option<PathBuf>,
    /// Source tarball (plain, gzip or zstd).
    #[arg(long)]
    tar: Option<PathBuf>,
    /// KEY=VALUE (repeatable); PATH entries are merged over lower groups.
    #[arg(long = "env")]
    env: Vec<String>,
    #[arg(long)]
    workdir: Option<String>,
    /// JSON array or a whitespace-separated command.
    #[arg(long)]
    entrypoint: Option<String>,
    /// JSON array or a whitespace-separated command.
    #[arg(long)]
    cmd: Option<String>,
    #[arg(long)]
    user: Option<String>,
    /// KEY=VALUE (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Group reference to publish to.
    #[arg(long)]
    push: String,
    /// Scratch directory for converted layers (default: a temp dir).
    #[arg(long)]
    scratch: Option<PathBuf>,
    /// --dir: clamp file mtimes to this epoch second for reproducible digests
    /// (default: $SOURCE_DATE_EPOCH if set).
    #[arg(long)]
    mtime: Option<u64>,
}

#[derive(Args)]
pub struct MutateArgs {
    #[arg(long)]
    base_group: String,
    /// Unified diff (git or plain).
    #[arg(long)]
    patch: PathBuf,
    /// Directory inside the image the patch paths are relative to.
    #[arg(long, default_value = "/")]
    root: String,
    /// Leading path components stripped from patch paths.
    #[arg(long, default_value_t = 1)]
    strip: u32,
    #[arg(long, default_value = "mutation")]
    name: String,
    #[arg(long)]
    push: String,
}

/// `plan` subcommands.
#[derive(Subcommand)]
pub enum PlanCmd {
    /// Compose a plan into an OCI image (metadata only) and publish it.
    Compose(Box<ComposeArgs>),
    /// Artifacts and bytes to publish: weenv vs static bundling vs dynamic assembly.
    Stats(Box<StatsArgs>),
    /// Publish a plan as an OCI artifact (plans by reference): its groups are resolved and
    /// composed first (so a broken plan is never published), then the patch blob, the plan
    /// config and the manifest are pushed to `--to`; prints `REF@DIGEST`. Nodes run the
    /// reference through the weenv daemon's registry endpoint (`[plans]`, docs/kubernetes.md).
    Publish {
        plan: PathBuf,
        /// Reference to publish the plan under (reg/repo:tag).
        #[arg(long)]
        to: String,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Upload a patch file as a blob for `[mutation] blob = "sha256:..."`; prints its digest.
    PushPatch {
        patch: PathBuf,
        /// Repository of the composed image (reg/repo or reg/repo:tag), where `weenv run` reads it.
        #[arg(long)]
        to: String,
    },
}

#[derive(Args)]
pub struct CacheArgs {
    /// Resolution cache directory (default ~/.cache/weenv).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Seconds a resolved tag stays valid.
    #[arg(long, default_value_t = 300)]
    ttl: u64,
    /// Re-resolve every tag now.
    #[arg(long)]
    refresh: bool,
}

#[derive(Args)]
pub struct ComposeArgs {
    plan: PathBuf,
    /// Image reference to publish to (omit to only print the manifest).
    #[arg(long)]
    push: Option<String>,
    /// Also write manifest.json and config.json here.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
}

#[derive(Args)]
pub struct StatsArgs {
    /// Plan files.
    plans: Vec<PathBuf>,
    /// Synthetic workload TASKS,REPOS,HARNESSES (e.g. 200,4,3) instead of plan files.
    #[arg(long)]
    synthetic: Option<String>,
    #[command(flatten)]
    cache: CacheArgs,
}

fn command_vec(s: &str) -> Result<Vec<String>> {
    if s.trim_start().starts_with('[') {
        return serde_json::from_str(s)
            .with_context(|| format!("{s:?} is not a JSON array of strings"));
    }
    Ok(s.split_whitespace().map(str::to_string).collect())
}

fn platform_of(s: Option<&str>) -> Result<Option<weenv_registry::Platform>> {
    Ok(s.map(weenv_converter::parse_platform).transpose()?)
}

fn scratch_dir(given: Option<PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    match given {
        Some(p) => {
            std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
            Ok((p, None))
        }
        None => {
            let t = tempfile::tempdir().context("creating a scratch dir")?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// Run a `group` subcommand.
pub async fn run_group(
    client: &Client,
    cmd: GroupCmd,
    platform: Option<&str>,
    json: bool,
) -> Result<()> {
    match cmd {
        GroupCmd::Create(a) => {
            let source = match (a.from, a.dir, a.tar) {
                (Some(from), None, None) => GroupSource::Image {
                    reference: from,
                    layers: parse_layer_range(a.layers.as_deref().unwrap_or_default())?,
                },
                (None, Some(d), None) => GroupSource::Dir(d),
                (None, None, Some(t)) => GroupSource::Tar(t),
                _ => bail!("give exactly one of --from REF --layers A..B, --dir PATH, --tar FILE"),
            };
            let labels = a
                .labels
                .iter()
                .map(|l| {
                    l.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .with_context(|| format!("--label {l:?} is not KEY=VALUE"))
                })
                .collect::<Result<_>>()?;
            let spec = GroupSpec {
                kind: GroupKind::from(a.kind.as_str()),
                name: a.name,
                fragment: ConfigFragment {
                    env: a.env,
                    workdir: a.workdir,
                    entrypoint: a.entrypoint.as_deref().map(command_vec).transpose()?,
                    cmd: a.cmd.as_deref().map(command_vec).transpose()?,
                    user: a.user,
                    labels,
                },
                platform: platform_of(platform)?,
                mtime_clamp: a.mtime.or_else(|| {
                    std::env::var("SOURCE_DATE_EPOCH")
                        .ok()
                        .and_then(|v| v.parse().ok())
                }),
            };
            let target = parse_ref(&a.push)?;
            let (scratch, _guard) = scratch_dir(a.scratch)?;
            let r = create_group(
                client,
                &source,
                &spec,
                &target,
                &scratch,
                &WriterOptions::default(),
            )
            .await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "reference": a.push,
                        "digest": r.built.manifest_digest.to_string(),
                        "layers": r.layers.iter().map(|(d, s, o)| serde_json::json!({"digest": d.to_string(), "size": s, "push": format!("{o:?}")})).collect::<Vec<_>>(),
                        "bytesUploaded": r.bytes_uploaded,
                    })
                );
            } else {
                for (d, s, o) in &r.layers {
                    println!("layer {d} {s} bytes: {o:?}");
                }
                println!(
                    "pushed group {}@{} ({} bytes uploaded)",
                    a.push, r.built.manifest_digest, r.bytes_uploaded
                );
            }
        }
        GroupCmd::Mutate(a) => {
            let patch = std::fs::read(&a.patch)
                .with_context(|| format!("reading {}", a.patch.display()))?;
            let target = parse_ref(&a.push)?;
            let (scratch, _guard) = scratch_dir(None)?;
            let spec = MutateSpec {
                name: a.name,
                root: a.root,
                strip: a.strip,
            };
            let (r, summary) = mutate_group(
                client,
                &a.base_group,
                &patch,
                &spec,
                &target,
                &scratch,
                &WriterOptions::default(),
            )
            .await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "reference": a.push,
                        "digest": r.built.manifest_digest.to_string(),
                        "written": summary.written,
                        "deleted": summary.deleted,
                        "bytesUploaded": r.bytes_uploaded,
                    })
                );
            } else {
                for w in &summary.written {
                    println!("write   {w}");
                }
                for d in &summary.deleted {
                    println!("delete  {d}");
                }
                println!(
                    "pushed mutation group {}@{} ({} bytes uploaded)",
                    a.push, r.built.manifest_digest, r.bytes_uploaded
                );
            }
        }
    }
    Ok(())
}

fn load_plan(p: &PathBuf) -> Result<Plan> {
    let text =
        std::fs::read_to_string(p).with_context(|| format!("reading plan {}", p.display()))?;
    Plan::parse(&text).with_context(|| format!("plan {}", p.display()))
}

fn cache_of(a: &CacheArgs) -> (ResolveCache, ResolvePolicy) {
    let dir = a.cache_dir.clone().unwrap_or_else(default_cache_dir);
    (
        ResolveCache::load(&dir),
        ResolvePolicy {
            ttl: Duration::from_secs(a.ttl),
            refresh: a.refresh,
        },
    )
}

/// Run a `plan` subcommand.
pub async fn run_plan(client: &Client, cmd: PlanCmd, json: bool) -> Result<()> {
    match cmd {
        PlanCmd::Compose(a) => {
            let plan = load_plan(&a.plan)?;
            let (mut cache, policy) = cache_of(&a.cache);
            let t0 = std::time::Instant::now();
            let now = unix_secs(SystemTime::now());
            let (groups, composed) = compose_plan(client, &plan, &mut cache, now, policy).await?;
            let composed_in = t0.elapsed();
            if let Err(e) = cache.save() {
                tracing::warn!(error = %e, "could not save the resolution cache");
            }
            if let Some(dir) = &a.output_dir {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join("manifest.json"), &composed.manifest_json)?;
                std::fs::write(dir.join("config.json"), &composed.config_json)?;
            }
            let published = match &a.push {
                Some(target) => {
                    Some(publish_composed(client, &groups, &composed, &parse_ref(target)?).await?)
                }
                None => None,
            };
            let total = t0.elapsed();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "manifestDigest": composed.manifest_digest.to_string(),
                        "configDigest": composed.config_digest.to_string(),
                        "layers": composed.manifest.layers.len(),
                        "groups": groups.iter().map(|g| format!("{}@{}", g.reference, g.manifest_digest)).collect::<Vec<_>>(),
                        "pushed": a.push,
                        "layersMounted": published.as_ref().map(|p| p.layers_mounted),
                        "composeMs": composed_in.as_secs_f64() * 1e3,
                        "totalMs": total.as_secs_f64() * 1e3,
                    })
                );
            } else {
                for g in &groups {
                    println!(
                        "{:<10} {}@{}",
                        g.config.kind, g.reference, g.manifest_digest
                    );
                }
                match (&a.push, &published) {
                    (Some(t), Some(p)) => println!(
                        "pushed {t}@{} ({} layers, {} mounted, {} present) in {:.1} ms (compose {:.1} ms)",
                        composed.manifest_digest,
                        composed.manifest.layers.len(),
                        p.layers_mounted,
                        p.layers_present,
                        total.as_secs_f64() * 1e3,
                        composed_in.as_secs_f64() * 1e3
                    ),
                    _ => println!("{}", String::from_utf8_lossy(&composed.manifest_json)),
                }
            }
        }
        PlanCmd::Publish { plan, to, cache } => {
            let p = load_plan(&plan)?;
            let patch = match p.init_mutation().and_then(|m| m.patch.as_ref()) {
                Some(file) => {
                    let path = plan
                        .parent()
                        .unwrap_or(std::path::Path::new("."))
                        .join(file);
                    Some(
                        std::fs::read(&path)
                            .with_context(|| format!("reading patch {}", path.display()))?,
                    )
                }
                None => None,
            };
            let (mut c, policy) = cache_of(&cache);
            compose_plan(client, &p, &mut c, unix_secs(SystemTime::now()), policy)
                .await
                .with_context(|| format!("plan {} does not compose", plan.display()))?;
            let _ = c.save();
            let artifact = weenv_env::plan_ref::build_plan_artifact(&p, patch.as_deref())?;
            let target = parse_ref(&to)?;
            let d = weenv_converter::plan::publish_plan(client, &artifact, &target).await?;
            println!("{}@{d}", target);
        }
        PlanCmd::PushPatch { patch, to } => {
            let bytes =
                std::fs::read(&patch).with_context(|| format!("reading {}", patch.display()))?;
            weenv_env::patch::parse_patch(&bytes, 0)
                .or_else(|_| weenv_env::patch::parse_patch(&bytes, 1))
                .with_context(|| format!("{} is not a patch weenv can apply", patch.display()))?;
            let d = weenv_format::Digest::sha256(&bytes);
            client
                .push_blob(&parse_ref(&to)?, &d, bytes::Bytes::from(bytes))
                .await?;
            println!("{d}");
        }
        PlanCmd::Stats(a) => {
            let shapes: Vec<PlanShape> = if let Some(s) = &a.synthetic {
                let n: Vec<usize> = s
                    .split(',')
                    .map(|x| x.trim().parse())
                    .collect::<Result<_, _>>()
                    .with_context(|| {
                        format!("--synthetic {s:?}: expected TASKS,REPOS,HARNESSES")
                    })?;
                let [t, r, h] = n[..] else {
                    bail!("--synthetic {s:?}: expected TASKS,REPOS,HARNESSES");
                };
                synthetic(t, r, h, SyntheticSizes::default())
            } else {
                let (mut cache, policy) = cache_of(&a.cache);
                let now = unix_secs(SystemTime::now());
                let mut shapes = Vec::new();
                for p in &a.plans {
                    let plan = load_plan(p)?;
                    let (groups, _) = compose_plan(client, &plan, &mut cache, now, policy).await?;
                    shapes.push(PlanShape {
                        groups: groups
                            .iter()
                            .map(|g| GroupShape {
                                id: g.manifest_digest.to_string(),
                                kind: g.config.kind.to_string(),
                                layers: g
                                    .manifest
                                    .layers
                                    .iter()
                                    .map(|l| (l.digest.to_string(), l.size))
                                    .collect(),
                            })
                            .collect(),
                    });
                }
                let _ = cache.save();
                shapes
            };
            let st = stats(&shapes);
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "plans": st.plans, "groups": st.groups,
                        "weenv": {"artifacts": st.weenv.artifacts, "bytes": st.weenv.bytes},
                        "weenvInitMutation": {"artifacts": st.weenv_init_mutation.artifacts, "bytes": st.weenv_init_mutation.bytes, "initBytes": st.weenv_init_mutation.init_bytes},
                        "static": {"artifacts": st.static_bundling.artifacts, "bytes": st.static_bundling.bytes},
                        "dynamic": {"artifacts": st.dynamic.artifacts, "bytes": st.dynamic.bytes, "initBytes": st.dynamic.init_bytes},
                    })
                );
            } else {
                print!("{}", table(&st));
            }
        }
    }
    Ok(())
}
