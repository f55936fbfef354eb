//! The `weenv` CLI: `pull`, `status`, `profile`, `metrics`, `run`. Parsing and dispatch; the work is in
//! [`crate::pull`], [`crate::run`] and the daemon's endpoint client
//! (`weenv_snapshotter_api::client`).

use crate::progress;
use crate::pull::{pull, PullOptions};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use weenv_snapshotter_api::client as endpoint_client;
use weenv_snapshotter_api::config::{parse_listen, Config, ListenAddr, DEFAULT_CONFIG_PATH};
use weenv_snapshotter_api::status;

/// weenv: user-facing helpers for the weenv snapshotter.
#[derive(Parser, Debug)]
#[command(name = "weenv", version)]
pub struct Cli {
    /// Daemon config (registry settings, status endpoint). Default: the daemon's default path
    /// if it exists, else built-in defaults; a path given here must exist.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Pull an image through containerd with remote-snapshot labels (lazy weenv layers).
    Pull {
        /// Image reference, e.g. 127.0.0.1:5000/python:3 or docker.io/library/busybox:1.
        reference: String,
        /// containerd namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// containerd socket.
        #[arg(short, long, default_value = "/run/containerd/containerd.sock")]
        address: PathBuf,
        /// Snapshotter name registered in containerd's proxy_plugins.
        #[arg(long, default_value = "weenv")]
        snapshotter: String,
        /// Talk plain HTTP to the image's registry (the daemon needs the same in its config).
        #[arg(long)]
        plain_http: bool,
        /// containerd-style hosts.toml directory (overrides the config's registry.hosts_dir).
        #[arg(long)]
        hosts_dir: Option<PathBuf>,
        /// Platform os/arch[/variant] (default: this host).
        #[arg(long)]
        platform: Option<String>,
        /// Name of the image record (default: the normalised reference).
        #[arg(long)]
        name: Option<String>,
    },
    /// Show mounted layers, fill progress and cache usage from the daemon.
    Status {
        /// Endpoint (ip:port or unix:/path); default: the config's observability.listen.
        #[arg(long)]
        endpoint: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the files containers read from weenv layers since they were mounted (or since
    /// `--reset`), one `/path` per line in first-read order (`/path<TAB>off+len,...` for files read
    /// only in part): a start-up profile for `weenv-convert prefetch`.
    /// Record it on a node where the image's layers were mounted cold (fresh `weenv pull`),
    /// after running the workload once.
    Profile {
        #[arg(long)]
        endpoint: Option<String>,
        /// Only these layers (`sha256:<hex>` or `<hex>`); repeatable.
        #[arg(long = "layer")]
        layers: Vec<String>,
        /// Forget what was recorded so far instead of printing it.
        #[arg(long)]
        reset: bool,
        /// Print the raw JSON (per layer).
        #[arg(long)]
        json: bool,
    },
    /// Print the daemon's Prometheus metrics.
    Metrics {
        #[arg(long)]
        endpoint: Option<String>,
    },
    /// Compose an environment plan, publish it, pull it lazily, apply its at-init mutation
    /// and run it: `weenv run PLAN --image REF [-- cmd...]`.
    Run(Box<RunArgs>),
}

/// Arguments of `weenv run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Plan file (TOML), or a plan reference (`weenv-convert plan publish`) fetched from its
    /// registry when no file of that name exists.
    pub plan: PathBuf,
    /// Name of the composed image in containerd, a reference (a `blob =` patch is read from
    /// its repository). Nothing is pushed there unless --publish.
    #[arg(long)]
    pub image: String,
    /// Also push the composed manifest and config to --image (needs push credentials; for
    /// nodes that pull it with stock clients). Default: composed on this node only.
    #[arg(long)]
    pub publish: bool,
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    #[arg(short, long, default_value = "/run/containerd/containerd.sock")]
    pub address: PathBuf,
    #[arg(long, default_value = "weenv")]
    pub snapshotter: String,
    /// containerd runtime, e.g. io.containerd.weenv.v1.
    #[arg(long)]
    pub runtime: Option<String>,
    /// Container id.
    #[arg(long)]
    pub id: Option<String>,
    /// ctr-style mount spec (repeatable), e.g. type=bind,src=/out,dst=/out,options=rbind:rw.
    #[arg(long = "mount")]
    pub mounts: Vec<String>,
    /// Talk plain HTTP to the image's registry.
    #[arg(long)]
    pub plain_http: bool,
    /// Keep the container after the task exits.
    #[arg(long)]
    pub keep: bool,
    /// Resolution cache directory (default ~/.cache/weenv).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Seconds a resolved group tag stays valid.
    #[arg(long, default_value_t = 300)]
    pub ttl: u64,
    /// Re-resolve every group tag now.
    #[arg(long)]
    pub refresh: bool,
    /// Print the time of each step (resolve, compose, [publish,] layers, prepare, mutate,
    /// create, start, exit, cleanup).
    #[arg(short = 'v', long)]
    pub timings: bool,
    /// CPU quota of the container in cores (like `ctr run --cpus`).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory limit of the container in bytes (like `ctr run --memory-limit`).
    #[arg(long)]
    pub memory_limit: Option<i64>,
    /// OCI annotation of the container, `KEY=VALUE` (repeatable), e.g.
    /// `io.weenv.elastic=false` for the weenv shim's fixed quota.
    #[arg(long = "annotation", value_parser = parse_annotation)]
    pub annotations: Vec<(String, String)>,
    /// Command (default: the image's).
    #[arg(last = true)]
    pub cmd: Vec<String>,
}

/// `KEY=VALUE` of `--annotation`.
fn parse_annotation(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// The config `--config` names (it must exist), else the default path if it exists, else
/// built-in defaults.
fn load_config(given: Option<&std::path::Path>) -> Result<Config> {
    let path = match given {
        Some(p) => p,
        None if std::path::Path::new(DEFAULT_CONFIG_PATH).exists() => {
            std::path::Path::new(DEFAULT_CONFIG_PATH)
        }
        None => return Ok(Config::default()),
    };
    Ok(Config::load(path)?)
}

fn endpoint(cfg: &Config, e: &Option<String>) -> Result<ListenAddr> {
    let s = e
        .clone()
        .unwrap_or_else(|| cfg.observability.listen.clone());
    match parse_listen(&s)? {
        Some(a) => Ok(a),
        None => bail!("the daemon's observability endpoint is disabled; pass --endpoint"),
    }
}

/// Run the CLI.
pub async fn run(cli: Cli) -> Result<()> {
    let cfg = load_config(cli.config.as_deref())?;
    match cli.cmd {
        Cmd::Pull {
            reference,
            namespace,
            address,
            snapshotter,
            plain_http,
            hosts_dir,
            platform,
            name,
        } => {
            let mut rc = cfg.registry_config();
            if let Some(d) = hosts_dir {
                rc.hosts_dir = Some(d);
            }
            if plain_http {
                let r: weenv_registry::Reference = reference.parse()?;
                rc.hosts
                    .entry(r.registry().to_string())
                    .or_default()
                    .plain_http = true;
            }
            let registry = weenv_registry::Client::new(rc)?;
            let ch = containerd_client::connect(&address)
                .await
                .with_context(|| format!("connecting to containerd at {}", address.display()))?;
            let opts = PullOptions {
                namespace,
                snapshotter,
                platform: platform
                    .as_deref()
                    .map(str::parse::<weenv_registry::Platform>)
                    .transpose()?,
                image_name: name,
                daemon: parse_listen(&cfg.observability.listen).ok().flatten(),
            };
            // Per-layer lines and a summary on stderr only on a terminal.
            let tty = std::io::stderr().is_terminal();
            let show = |ev: &progress::LayerEvent| {
                if let Some(l) = progress::layer_line(ev, tty) {
                    eprintln!("{l}");
                }
            };
            let rep = pull(&registry, ch, &reference, &opts, &show)
                .await
                .with_context(|| format!("pulling {reference}"))?;
            if let Some(l) = progress::summary_line(&rep.image, &rep.tally, rep.seconds, tty) {
                eprintln!("{l}");
            }
            println!(
                "{}: manifest {} ({} lazy, {} applied, {} present layers) in {:.2}s",
                rep.image,
                rep.manifest,
                rep.remote_layers,
                rep.applied_layers,
                rep.present_layers,
                rep.seconds
            );
        }
        Cmd::Status { endpoint: e, json } => {
            let body = endpoint_client::get(&endpoint(&cfg, &e)?, "/status").await?;
            if json {
                println!("{body}");
            } else {
                let r: status::StatusReport =
                    serde_json::from_str(&body).context("parsing /status")?;
                print!("{}", status::render_text(&r));
            }
        }
        Cmd::Run(a) => {
            let mut rc = cfg.registry_config();
            if a.plain_http {
                let r: weenv_registry::Reference = a.image.parse()?;
                rc.hosts
                    .entry(r.registry().to_string())
                    .or_default()
                    .plain_http = true;
            }
            let registry = weenv_registry::Client::new(rc)?;
            let o = crate::run::RunOptions {
                plan: a.plan,
                image: a.image,
                publish: a.publish,
                address: a.address,
                namespace: a.namespace,
                snapshotter: a.snapshotter,
                runtime: a.runtime,
                id: a.id,
                mounts: a.mounts,
                limits: crate::run::Limits {
                    cpus: a.cpus,
                    memory_bytes: a.memory_limit,
                    annotations: a.annotations.into_iter().collect(),
                },
                cmd: a.cmd,
                labels: Default::default(),
                keep: a.keep,
                stdio: crate::run::stdio::StdioMode::Inherit,
                cache_dir: a
                    .cache_dir
                    .unwrap_or_else(weenv_converter::resolve_cache::default_cache_dir),
                policy: weenv_converter::resolve_cache::ResolvePolicy {
                    ttl: std::time::Duration::from_secs(a.ttl),
                    refresh: a.refresh,
                },
                daemon: parse_listen(&cfg.observability.listen).ok().flatten(),
            };
            let rep = crate::run::run_plan(&registry, &o).await?;
            eprintln!(
                "weenv run: {} compose {:.1} ms, layers {:.1} ms ({} lazy, {} applied, {} present), mutation {:.1} ms (apply {:.2} ms), exit {}",
                rep.manifest_digest,
                rep.compose_ms,
                rep.layers_ms,
                rep.layers.0,
                rep.layers.1,
                rep.layers.2,
                rep.mutation_ms,
                rep.mutation_apply_ms,
                rep.exit_code
            );
            if a.timings {
                eprintln!("weenv run: steps: {}", rep.timings.render());
            }
            if rep.exit_code != 0 {
                bail!("task exited with status {}", rep.exit_code);
            }
        }
        Cmd::Profile {
            endpoint: e,
            layers,
            reset,
            json,
        } => {
            let addr = endpoint(&cfg, &e)?;
            if reset {
                endpoint_client::request(&addr, "POST", "/profile/reset").await?;
                eprintln!("weenv profile: recording anew");
            } else {
                let body = endpoint_client::get(&addr, "/profile").await?;
                if json {
                    println!("{body}");
                } else {
                    let r: status::ProfileReport =
                        serde_json::from_str(&body).context("parsing /profile")?;
                    print!("{}", status::render_profile(&r, &layers));
                }
            }
        }
        Cmd::Metrics { endpoint: e } => {
            print!(
                "{}",
                endpoint_client::get(&endpoint(&cfg, &e)?, "/metrics").await?
            );
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_given_config_that_does_not_exist_is_an_error_naming_it() {
        let cli = Cli::try_parse_from(["weenv", "--config", "/nonexistent/weenv.toml", "status"])
            .unwrap();
        let err = format!("{:#}", run(cli).await.unwrap_err());
        assert!(err.contains("/nonexistent/weenv.toml"), "{err}");
        // Given after the subcommand too (a global flag).
        let cli =
            Cli::try_parse_from(["weenv", "status", "--config", "/nonexistent/x.toml"]).unwrap();
        assert!(load_config(cli.config.as_deref()).is_err());
        // Not given: the default path may be absent.
        let cli = Cli::try_parse_from(["weenv", "status"]).unwrap();
        assert_eq!(cli.config, None);
        if !std::path::Path::new(DEFAULT_CONFIG_PATH).exists() {
            assert_eq!(load_config(None).unwrap(), Config::default());
        }
    }
}
