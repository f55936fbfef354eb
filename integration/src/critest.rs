//! `critest` (the CRI validation suite of cri-tools, built by `scripts/go-tools.sh`) against a
//! private containerd 2.x, with pod networks through real CNI plugins.
//!
//! Set-up: containerd runs in a network namespace of its own ([`Netns`]), so the CNI bridge and
//! the pods' addresses exist only there; critest runs in it too (it reaches the streaming
//! server on that loopback). Images come from the test's loopback registry: a second
//! `docker-registry` on the same storage and the same `127.0.0.1:port` inside the namespace
//! ([`Netns::serve_registry`]), so one reference works for containerd (inside) and for the weenv
//! daemon (outside). critest's default container image is given by `--test-images-file`; images
//! critest names itself (`gcr.io/k8s-staging-cri-tools/…`, `registry.k8s.io/e2e-test-images/…`)
//! cannot be fetched here (no network), so the specs that pull them fail in every
//! configuration; [`Outcome`]s of two configurations are compared spec by spec.

use crate::util::ChildGuard;
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace made for one test (deleted on drop).
pub struct Netns {
    pub name: String,
    registry: Option<ChildGuard>,
}

fn ip(args: &[&str]) -> Result<()> {
    let o = Command::new("ip").args(args).output().context("run ip")?;
    ensure!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

impl Netns {
    /// `ip netns add weenv-<tag>-<pid>` with loopback up.
    pub fn new(tag: &str) -> Result<Netns> {
        let name = format!("weenv-{tag}-{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = Netns {
            name,
            registry: None,
        };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `program` entered into this namespace (`nsenter --net`, keeping the mount namespace).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name))
            .arg(program);
        c
    }

    /// Serves the registry storage `data` at `addr` inside the namespace (read by containerd
    /// there; the same storage is served on the host's loopback by the test's registry).
    pub fn serve_registry(&mut self, data: &Path, addr: SocketAddr, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let cfg = dir.join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                data.display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = self
            .command("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.registry = Some(ChildGuard::new("docker-registry (netns)", child));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self
                .command("bash")
                .args([
                    "-c",
                    &format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port()),
                ])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "registry in {} did not start: {}",
                    self.name,
                    std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.registry.take();
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The result of one spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Passed,
    Failed,
    Skipped,
}

/// Spec name → (outcome, failure message) from a JUnit report (pure; ginkgo's format:
/// `<testcase name="…" …>` with `<failure message="…">`, `<skipped …>` or nothing).
pub fn parse_junit(xml: &str) -> BTreeMap<String, (Outcome, String)> {
    let mut out = BTreeMap::new();
    for case in xml.split("<testcase ").skip(1) {
        let Some(name) = attr(case, "name") else {
            continue;
        };
        let body_end = case.find("</testcase>").unwrap_or(case.len());
        let body = &case[..body_end];
        let (outcome, msg) = if body.contains("<failure") || body.contains("<error") {
            let m = body
                .split("<failure")
                .nth(1)
                .or_else(|| body.split("<error").nth(1))
                .and_then(|f| attr(f, "message"))
                .unwrap_or_default();
            (Outcome::Failed, m)
        } else if body.contains("<skipped") || attr(case, "status").as_deref() == Some("skipped") {
            (Outcome::Skipped, String::new())
        } else {
            (Outcome::Passed, String::new())
        };
        out.insert(unescape(&name), (outcome, unescape(&msg)));
    }
    out
}

fn attr(s: &str, key: &str) -> Option<String> {
    let head = &s[..s.find('>').unwrap_or(s.len())];
    let pat = format!("{key}=\"");
    let start = head.find(&pat)? + pat.len();
    let end = head[start..].find('"')? + start;
    Some(head[start..end].to_string())
}

fn unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#xA;", " ")
        .replace("&amp;", "&")
}

/// Spec name → (outcome, failure message).
pub type Outcomes = BTreeMap<String, (Outcome, String)>;

/// One critest run.
pub struct CritestRun {
    pub critest: PathBuf,
    /// containerd's socket.
    pub endpoint: PathBuf,
    /// `defaultTestContainerImage` (and the web-server image).
    pub image: String,
    /// `--runtime-handler` (empty: the default runtime).
    pub runtime_handler: String,
    /// `--ginkgo.focus` / `--ginkgo.skip` (regexes; empty: none).
    pub focus: String,
    pub skip: String,
    /// `webServerTestImage` (networking and port-forward specs: serves HTTP on port 80);
    /// empty: [`CritestRun::image`].
    pub web_server_image: String,
    /// `--registry-prefix`: the registry critest's own images (httpd, …) are pulled from
    /// instead of registry.k8s.io (`host:port`; empty: registry.k8s.io).
    pub registry_prefix: String,
    /// Where the images file and the JUnit report go.
    pub dir: PathBuf,
    pub timeout: Duration,
}

impl CritestRun {
    /// Runs critest in `netns`; the outcomes from its JUnit report and its output.
    pub fn run(&self, netns: &Netns) -> Result<(Outcomes, String)> {
        std::fs::create_dir_all(&self.dir)?;
        let images = self.dir.join("images.yaml");
        std::fs::write(
            &images,
            format!(
                "defaultTestContainerImage: {}\nwebServerTestImage: {}\n",
                self.image,
                if self.web_server_image.is_empty() {
                    &self.image
                } else {
                    &self.web_server_image
                }
            ),
        )?;
        let ep = format!("unix://{}", self.endpoint.display());
        let mut c = netns.command(&self.critest);
        c.args(["--runtime-endpoint", &ep, "--image-endpoint", &ep])
            .arg("--test-images-file")
            .arg(&images)
            // critest 1.37 takes --report-dir but writes no report itself; ginkgo does.
            .arg(format!(
                "--ginkgo.junit-report={}",
                self.dir.join("junit.xml").display()
            ))
            .arg(format!("--ginkgo.timeout={}s", self.timeout.as_secs()))
            .arg("--ginkgo.no-color")
            .stdin(Stdio::null());
        if !self.registry_prefix.is_empty() {
            c.args(["--registry-prefix", &self.registry_prefix]);
        }
        if !self.runtime_handler.is_empty() {
            c.args(["--runtime-handler", &self.runtime_handler]);
        }
        if !self.focus.is_empty() {
            c.arg(format!("--ginkgo.focus={}", self.focus));
        }
        if !self.skip.is_empty() {
            c.arg(format!("--ginkgo.skip={}", self.skip));
        }
        let o = c.output().context("run critest")?;
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::write(self.dir.join("critest.log"), &log)?;
        let report = std::fs::read_dir(&self.dir)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "xml"))
            .with_context(|| format!("critest wrote no JUnit report ({}):\n{log}", o.status))?;
        let xml = std::fs::read_to_string(&report)?;
        let results = parse_junit(&xml);
        ensure!(
            !results.is_empty(),
            "no spec in {}:\n{log}",
            report.display()
        );
        Ok((results, log))
    }
}

/// A markdown table of two configurations' outcomes, spec by spec (pure).
pub fn table(
    a_name: &str,
    a: &BTreeMap<String, (Outcome, String)>,
    b_name: &str,
    b: &BTreeMap<String, (Outcome, String)>,
) -> String {
    let mut s =
        format!("| spec | {a_name} | {b_name} | failure (first line) |\n|---|---|---|---|\n");
    for (name, (oa, ma)) in a {
        let ob = b
            .get(name)
            .map(|(o, _)| format!("{o:?}"))
            .unwrap_or("-".into());
        let msg = if ma.is_empty() {
            b.get(name).map(|(_, m)| m.clone()).unwrap_or_default()
        } else {
            ma.clone()
        };
        let first: String = msg.lines().next().unwrap_or("").chars().take(140).collect();
        s.push_str(&format!(
            "| {} | {oa:?} | {ob} | {} |\n",
            name.replace('|', "/"),
            first.replace('|', "/")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_outcomes() {
        let xml = r#"<testsuite><testcase name="[k8s.io] A should pass" classname="x" status="passed" time="1"></testcase>
<testcase name="B &#34;q&#34;" status="failed"><failure message="boom: pull &amp; fail" type="failed">x</failure></testcase>
<testcase name="C" status="skipped"><skipped message="skip"></skipped></testcase></testsuite>"#;
        let r = parse_junit(xml);
        assert_eq!(r["[k8s.io] A should pass"].0, Outcome::Passed);
        assert_eq!(r["B \"q\""], (Outcome::Failed, "boom: pull & fail".into()));
        assert_eq!(r["C"].0, Outcome::Skipped);
        let t = table("weenv", &r, "overlayfs", &r);
        assert!(t.contains("| C | Skipped | Skipped |"), "{t}");
    }
}
