//! `weenv-convert`: command-line front end of the weenv-converter library.

mod cli_groups;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weenv_converter::prefetch::profile_table;
use weenv_converter::summary::{human, image_table};
use weenv_converter::{
    apply_annotations, apply_profile, convert_image, inspect::info_table, inspect_image,
    parse_platform, read_profile, registry_config, verify::verdict_table, verify_image,
    ConvertError, ConvertOptions, ImageLocation, LayerReport, ProfileReport, Progress,
};
use weenv_format::writer::WriterOptions;
use weenv_registry::{Client, Platform};

#[derive(Parser)]
#[command(
    name = "weenv-convert",
    version,
    about = "Convert OCI/Docker images into weenv images, verify and inspect them"
)]
struct Cli {
    /// Talk plain HTTP to this registry host (host:port); repeatable.
    #[arg(long = "plain-http", global = true, value_name = "HOST")]
    plain_http: Vec<String>,
    /// Only this platform of a multi-platform image (os/arch[/variant]).
    #[arg(long, global = true)]
    platform: Option<String>,
    /// Print the report as JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Convert SRC into a weenv image at DST (reg/repo:tag, oci:DIR[:tag], docker-archive:FILE).
    Image {
        src: String,
        dst: String,
        /// Chunk size for large files, bytes.
        #[arg(long, default_value_t = 1 << 20)]
        chunk_size: u64,
        /// Target size of shared frames (headers + small files), bytes (default 256 KiB).
        #[arg(long, default_value_t = WriterOptions::default().frame_size)]
        frame_size: u64,
        /// Files up to this size share frames, bytes.
        #[arg(long, default_value_t = 256 << 10)]
        small_file_threshold: u64,
        /// zstd level (1..=22) of chunk frames (large files). Default 6: independent 1 MiB
        /// frames lose ~7% against one zstd stream at level 3, and level 6 wins it back at
        /// about 1.7x the CPU of level 3. Shared frames have their own level (--shared-level).
        #[arg(long, default_value_t = weenv_converter::convert::DEFAULT_LEVEL)]
        level: i32,
        /// zstd level (1..=22) of shared frames (headers + small files). Default 14: 256 KiB
        /// frames lose ~7% against one stream at level 6, and level 14 wins most of it back
        /// (the image within 5% of `zstd -3`), at several times the CPU of level 6 for those
        /// frames (`--shared-level 6`: the levels of before issue 15).
        #[arg(long, default_value_t = weenv_converter::convert::DEFAULT_SHARED_LEVEL)]
        shared_level: i32,
        /// Layers converted at once (default: number of cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Threads compressing the frames of one layer (default: number of cores; 1 = the
        /// layer's own thread compresses). The output is the same for any number.
        #[arg(long)]
        workers: Option<usize>,
        /// After converting, attach this start-up prefetch profile to DST (as `prefetch DST
        /// --profile FILE`; `-` reads stdin). Read before converting.
        #[arg(long, value_name = "FILE")]
        prefetch_profile: Option<String>,
    },
    /// Check every weenv layer: TOC, every frame digest, and the diff_id of the whole stream.
    Verify { image: String },
    /// Show layers, sizes, entry counts, compression ratios and prefetch profile sizes.
    Inspect { image: String },
    /// Attach a start-up prefetch profile to a weenv image: rewrites only the manifest(s).
    ///
    /// The profile lists the files a container reads at start-up, one file per line in first-read
    /// order (`PATH`, or `PATH<TAB>OFFSET+LEN,...` for byte ranges; `#` comments), as
    /// `weenv profile` prints them. Paths are resolved through the image's
    /// merged view (whiteouts, opaque directories, symlinks, hardlinks), and every weenv layer
    /// descriptor gets the frames holding those files in the annotation
    /// io.weenv.prefetch.frames; the snapshotter fetches them as soon as it mounts the layer.
    /// No layer or config blob is re-uploaded (same repository: nothing copied; another
    /// repository of the same registry: cross-repository mount).
    ///
    /// Paths that do not resolve (absent, deleted by a whiteout, not a regular file) are listed
    /// and skipped. If NO path resolves, nothing is written and the command fails (wrong image
    /// or profile). An empty profile removes the image's profile. An image without any weenv
    /// layer is an error. Same image + same profile = same manifest digest.
    ///
    /// Every weenv layer descriptor also gets (or has refreshed) the containerd.io/snapshot/*
    /// annotations with which stock clients (nerdctl, the containerd Go client, CRI) pull it
    /// lazily. Without --profile the profile stays as it is and only those are written: the way
    /// to make an image converted by an older weenv-convert lazy for stock clients.
    #[command(verbatim_doc_comment)]
    Prefetch {
        /// The weenv image (reg/repo:tag, reg/repo@sha256:.., oci:DIR[:tag]).
        image: String,
        /// Profile file, one path per line; `-` reads stdin. Without it the image keeps its
        /// profile and only the stock-client annotations are (re)written.
        #[arg(long, value_name = "FILE")]
        profile: Option<String>,
        /// Write the profiled image here instead of back to IMAGE's place and tag.
        #[arg(long, value_name = "DST")]
        to: Option<String>,
    },
    /// Layer groups: create, mutate.
    #[command(subcommand)]
    Group(Box<cli_groups::GroupCmd>),
    /// Environment plans: compose, stats.
    #[command(subcommand)]
    Plan(Box<cli_groups::PlanCmd>),
}

/// indicatif bars, one per running layer.
struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<(String, usize), ProgressBar>>,
}

impl Progress for Bars {
    fn layer_started(&self, platform: &str, index: usize, total: usize, size: u64) {
        let pb = self.multi.add(ProgressBar::new_spinner());
        pb.set_style(
            ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_message(format!(
            "{platform} layer {}/{total} ({})",
            index + 1,
            human(size)
        ));
        pb.enable_steady_tick(std::time::Duration::from_millis(200));
        if let Ok(mut b) = self.bars.lock() {
            b.insert((platform.to_string(), index), pb);
        }
    }
    fn layer_done(&self, platform: &str, r: &LayerReport) {
        if let Some(pb) = self
            .bars
            .lock()
            .ok()
            .and_then(|mut b| b.remove(&(platform.to_string(), r.index)))
        {
            pb.finish_and_clear();
        }
        let _ = self.multi.println(format!(
            "{platform} layer {} {}: {} -> {} in {:.2}s",
            r.index,
            &r.source_digest[..r.source_digest.len().min(19)],
            human(r.source_size),
            human(r.size),
            r.seconds
        ));
        if let Some(note) = &r.note {
            let _ = self.multi.println(format!("warning: {note}"));
        }
    }
}

/// Warns on stderr about profile paths that did not resolve; printed before the report, whose
/// last line is the summary (scripts `tail -1` it).
fn warn_unresolved(r: &ProfileReport) {
    let unresolved = r.manifests.iter().map(|m| m.unresolved.len()).max();
    if let Some(n @ 1..) = unresolved {
        eprintln!(
            "weenv-convert: warning: {n} of {} profile paths did not resolve (listed in the report)",
            r.paths
        );
    }
}

/// The error and its causes, each said once: a cause whose text the message already contains
/// is not repeated (the one rule, `weenv_registry::causes`, shared with `weenv`).
fn error_chain(e: &anyhow::Error) -> String {
    weenv_registry::causes(e.as_ref())
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let msg = error_chain(&e);
            eprintln!("weenv-convert: error: {msg}");
            if msg.contains("https://") && msg.contains("Connect") {
                eprintln!("hint: for a registry without TLS pass --plain-http HOST:PORT");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let platform: Option<Platform> = cli.platform.as_deref().map(parse_platform).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let client = Client::new(registry_config(&cli.plain_http))?;
    rt.block_on(async {
        match cli.cmd {
            Cmd::Image {
                src,
                dst,
                chunk_size,
                frame_size,
                small_file_threshold,
                level,
                shared_level,
                jobs,
                workers,
                prefetch_profile,
            } => {
                let profile = prefetch_profile.as_deref().map(read_profile).transpose()?;
                let mut opts = ConvertOptions {
                    writer: WriterOptions {
                        frame_size,
                        small_file_threshold,
                        chunk_size,
                        level,
                        shared_level: Some(shared_level),
                    },
                    platform: platform.clone(),
                    ..ConvertOptions::default()
                };
                if let Some(j) = jobs {
                    opts.jobs = j;
                }
                if let Some(w) = workers {
                    opts.workers = w;
                }
                let bars = Arc::new(Bars {
                    multi: MultiProgress::new(),
                    bars: Mutex::new(HashMap::new()),
                });
                let dst = ImageLocation::parse(&dst)?;
                let report =
                    convert_image(&client, &ImageLocation::parse(&src)?, &dst, &opts, bars).await?;
                let prefetch = match &profile {
                    Some(paths) => Some(
                        apply_profile(&client, &dst, None, paths, platform.as_ref())
                            .await
                            .with_context(|| {
                                format!(
                                    "{dst} was converted but its prefetch profile was not applied"
                                )
                            })?,
                    ),
                    None => None,
                };
                if let Some(p) = &prefetch {
                    warn_unresolved(p);
                }
                if cli.json {
                    match &prefetch {
                        Some(p) => println!(
                            "{}",
                            serde_json::to_string_pretty(
                                &serde_json::json!({"convert": report, "prefetch": p})
                            )?
                        ),
                        None => println!("{}", serde_json::to_string_pretty(&report)?),
                    }
                } else {
                    print!("{}", image_table(&report));
                    if let Some(p) = &prefetch {
                        print!("{}", profile_table(p));
                    }
                }
            }
            Cmd::Verify { image } => {
                let v = verify_image(&client, &ImageLocation::parse(&image)?, platform.as_ref())
                    .await?;
                if cli.json {
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    print!("{}", verdict_table(&v));
                }
                let failed = v.iter().filter(|l| !l.problems.is_empty()).count();
                if failed > 0 {
                    return Err(ConvertError::VerifyFailed {
                        failed,
                        total: v.len(),
                    }
                    .into());
                }
                if !cli.json {
                    println!("verified {} layers: all good", v.len());
                }
            }
            Cmd::Group(g) => {
                cli_groups::run_group(&client, *g, cli.platform.as_deref(), cli.json).await?
            }
            Cmd::Plan(p) => cli_groups::run_plan(&client, *p, cli.json).await?,
            Cmd::Prefetch { image, profile, to } => {
                let to = to.as_deref().map(ImageLocation::parse).transpose()?;
                let image = ImageLocation::parse(&image)?;
                let r = match profile {
                    Some(profile) => {
                        let paths = read_profile(&profile)?;
                        apply_profile(&client, &image, to.as_ref(), &paths, platform.as_ref())
                            .await?
                    }
                    None => {
                        apply_annotations(&client, &image, to.as_ref(), platform.as_ref()).await?
                    }
                };
                warn_unresolved(&r);
                if cli.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    print!("{}", profile_table(&r));
                }
            }
            Cmd::Inspect { image } => {
                let info =
                    inspect_image(&client, &ImageLocation::parse(&image)?, platform.as_ref())
                        .await?;
                if cli.json {
                    println!("{}", serde_json::to_string_pretty(&info)?);
                } else {
                    print!("{}", info_table(&info));
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_says_each_cause_once() {
        let inner = weenv_format::FormatError::DotDotPath {
            path: "a/../b".into(),
        };
        let e = anyhow::Error::new(ConvertError::format("sha256:x", inner));
        let msg = error_chain(&e);
        assert_eq!(msg.matches("'..' component").count(), 1, "{msg}");
        let e = anyhow::Error::new(std::io::Error::other("disk full")).context("writing x");
        assert_eq!(error_chain(&e), "writing x: disk full");
    }
}
