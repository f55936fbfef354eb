//! Real containerd clients for end-to-end tests, each confined to one private
//! [`Containerd`]: [`Nerdctl`] (its own data root, config file and `hosts.toml` dir, so
//! nothing of `/var/lib/nerdctl` or `/etc/nerdctl` is read or written) and [`Crictl`] (a config
//! file naming the containerd's socket as both CRI endpoints). Both return the command's
//! output and fail with it when the command fails.

use crate::containerd::Containerd;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// stdout of `o`, or an error naming the command and holding both streams.
pub fn ok_output(what: &str, o: Output) -> Result<String> {
    if !o.status.success() {
        bail!(
            "{what} failed ({}):\nstdout: {}\nstderr: {}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `nerdctl` on one containerd and namespace.
pub struct Nerdctl {
    bin: PathBuf,
    address: PathBuf,
    namespace: String,
    data_root: PathBuf,
    hosts_dir: PathBuf,
    config: PathBuf,
    /// containerd's `PATH` (nerdctl execs itself as the log driver from the shim).
    path: String,
}

impl Nerdctl {
    /// nerdctl `bin` on `ctd`, namespace `namespace`, state under `dir` (created); the
    /// `plain_http` registries get a `hosts.toml` in its hosts dir.
    pub fn new(
        bin: &Path,
        ctd: &Containerd,
        namespace: &str,
        dir: &Path,
        plain_http: &[String],
    ) -> Result<Nerdctl> {
        let data_root = dir.join("data");
        let hosts_dir = dir.join("certs.d");
        std::fs::create_dir_all(&data_root)?;
        for h in plain_http {
            std::fs::create_dir_all(hosts_dir.join(h))?;
            std::fs::write(
                hosts_dir.join(h).join("hosts.toml"),
                format!(
                    "server = \"http://{h}\"\n[host.\"http://{h}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )?;
        }
        let config = dir.join("nerdctl.toml");
        std::fs::write(
            &config,
            format!(
                "address = {:?}\nnamespace = {namespace:?}\ndata_root = {:?}\nhosts_dir = [{:?}]\n\
                 cgroup_manager = \"cgroupfs\"\ncni_netconfpath = {:?}\n",
                ctd.address().display().to_string(),
                data_root.display().to_string(),
                hosts_dir.display().to_string(),
                dir.join("cni-conf").display().to_string(),
            ),
        )?;
        let path = format!(
            "{}:{}",
            bin.parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            std::env::var("PATH").unwrap_or_default()
        );
        Ok(Nerdctl {
            bin: bin.to_path_buf(),
            address: ctd.address().to_path_buf(),
            namespace: namespace.into(),
            data_root,
            hosts_dir,
            config,
            path,
        })
    }

    /// The command `nerdctl ARGS` (config through `NERDCTL_TOML`).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("NERDCTL_TOML", &self.config)
            .env("PATH", &self.path)
            .args(["--address"])
            .arg(&self.address)
            .args(["--namespace", &self.namespace])
            .arg("--data-root")
            .arg(&self.data_root)
            .arg("--hosts-dir")
            .arg(&self.hosts_dir)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Runs `nerdctl ARGS`; its stdout (an error with both streams if it fails).
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let o = self
            .command(args)
            .output()
            .with_context(|| format!("spawn nerdctl {args:?}"))?;
        ok_output(&format!("nerdctl {args:?}"), o)
    }
}

/// `crictl` on one containerd's CRI.
pub struct Crictl {
    bin: PathBuf,
    config: PathBuf,
}

impl Crictl {
    /// crictl `bin` on `ctd`'s socket; its config file goes to `dir` (created).
    pub fn new(bin: &Path, ctd: &Containerd, dir: &Path, timeout: Duration) -> Result<Crictl> {
        std::fs::create_dir_all(dir)?;
        let config = dir.join("crictl.yaml");
        let ep = format!("unix://{}", ctd.address().display());
        std::fs::write(
            &config,
            format!(
                "runtime-endpoint: {ep}\nimage-endpoint: {ep}\ntimeout: {}\ndebug: false\npull-image-on-create: false\n",
                timeout.as_secs()
            ),
        )?;
        Ok(Crictl {
            bin: bin.to_path_buf(),
            config,
        })
    }

    /// Runs `crictl ARGS`; its stdout (an error with both streams if it fails).
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let o = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("spawn crictl {args:?}"))?;
        ok_output(&format!("crictl {args:?}"), o)
    }

    /// The endpoint (`unix://…`) for other CRI tools (critest).
    pub fn config(&self) -> &Path {
        &self.config
    }
}

/// One pod through crictl: what runs and what must come out.
pub struct PodFlow<'a> {
    /// Pod and container name.
    pub name: &'a str,
    pub image: &'a str,
    /// The CRI runtime handler (`runp --runtime`).
    pub handler: &'a str,
    /// The container's command (it must keep running until `stop`).
    pub command: &'a [&'a str],
    /// `crictl logs` must contain this.
    pub log_contains: &'a str,
    /// `crictl exec` command and what its output must contain.
    pub exec: &'a [&'a str],
    pub exec_contains: &'a str,
}

impl Crictl {
    /// `runp`, `create`, `start`, `exec`, `logs` (until `log_contains` shows), `stop`, `rm`,
    /// `stopp`, `rmp` of `f` with files under `dir`; the seconds from the call to the awaited log
    /// line. Fails if a command fails, an output lacks its text or a pod is left.
    pub fn pod_flow(&self, dir: &Path, f: &PodFlow) -> Result<f64> {
        let t = std::time::Instant::now();
        std::fs::create_dir_all(dir.join("logs"))?;
        let pod = dir.join(format!("{}-pod.json", f.name));
        std::fs::write(
            &pod,
            serde_json::json!({
                "metadata": {"name": f.name, "namespace": "weenv-test",
                             "uid": format!("{}-{}", f.name, std::process::id())},
                "log_directory": dir.join("logs").display().to_string(),
                "linux": {"security_context": {"namespace_options": {"network": 2}}}
            })
            .to_string(),
        )?;
        let container = dir.join(format!("{}-container.json", f.name));
        std::fs::write(
            &container,
            serde_json::json!({
                "metadata": {"name": f.name},
                "image": {"image": f.image},
                "command": f.command,
                "log_path": format!("{}.log", f.name)
            })
            .to_string(),
        )?;
        let (pod_s, ctr_s) = (pod.display().to_string(), container.display().to_string());
        let pod_id = self.ok(&["runp", "--runtime", f.handler, &pod_s])?;
        let pod_id = pod_id.trim();
        let ctr_id = self.ok(&["create", pod_id, &ctr_s, &pod_s])?;
        let ctr_id = ctr_id.trim();
        self.ok(&["start", ctr_id])?;
        let mut exec_args = vec!["exec", ctr_id];
        exec_args.extend_from_slice(f.exec);
        let exec = self.ok(&exec_args)?;
        if !exec.contains(f.exec_contains) {
            bail!(
                "crictl exec {:?}: {exec:?} lacks {:?}",
                f.exec,
                f.exec_contains
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let first = loop {
            let logs = self.ok(&["logs", ctr_id])?;
            if logs.contains(f.log_contains) {
                break t.elapsed().as_secs_f64();
            }
            if std::time::Instant::now() > deadline {
                bail!("crictl logs {ctr_id}: {logs:?} lacks {:?}", f.log_contains);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        self.ok(&["stop", "--timeout", "0", ctr_id])?;
        self.ok(&["rm", ctr_id])?;
        self.ok(&["stopp", pod_id])?;
        self.ok(&["rmp", pod_id])?;
        let pods = self.ok(&["pods", "-q"])?;
        if !pods.trim().is_empty() {
            bail!("pods left: {pods}");
        }
        Ok(first)
    }
}
