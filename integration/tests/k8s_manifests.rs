//! The Kubernetes manifests of `config/k8s/` (no cluster, no privilege): every YAML document
//! parses, and the fields the daemon needs on a node agree with its ConfigMap's config (parsed
//! and validated by the daemon's own `Config`) and with the containerd snippets of `config/`:
//! privileged, `/dev/fuse`, the state dir with Bidirectional propagation, hostPaths for the
//! weenv and containerd socket dirs, liveness/readiness probes on `/status` at
//! `[observability] listen`, resource requests, RollingUpdate, the keeper socket shared with the
//! weenv-fuse-keeper DaemonSet, the RuntimeClass handler containerd knows, and the image both
//! DaemonSets run is the one `scripts/build-image.sh` builds (`k8s_image` runs that image).

mod k8s_common;

use k8s_common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use weenv_snapshotter::config::{Config, ListenAddr};

/// The hostPath behind the volume mounted at `mount_path` (or at a parent of it) in
/// `container`, with that volumeMount.
fn host_path_for<'a>(
    ds: &'a Value,
    container: &'a Value,
    path: &Path,
    what: &str,
) -> (PathBuf, &'a Value) {
    let mounts = array_at(container, "/volumeMounts", what);
    let mount = mounts
        .iter()
        .filter(|m| path.starts_with(str_at(m, "/mountPath", what)))
        .max_by_key(|m| str_at(m, "/mountPath", what).len())
        .unwrap_or_else(|| panic!("{what}: no volumeMount covers {}", path.display()));
    let name = str_at(mount, "/name", what);
    let volumes = array_at(ds, "/spec/template/spec/volumes", what);
    let volume = volumes
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("{what}: volumeMount {name} has no volume"));
    let host = volume
        .pointer("/hostPath/path")
        .and_then(Value::as_str)
        .unwrap_or_else(|| {
            panic!(
                "{what}: volume {name} (for {}) is not a hostPath",
                path.display()
            )
        });
    let mount_path = Path::new(str_at(mount, "/mountPath", what));
    let rest = path.strip_prefix(mount_path).expect("mount covers path");
    (Path::new(host).join(rest), mount)
}

fn assert_requests(container: &Value, what: &str) {
    for res in ["cpu", "memory"] {
        let ptr = format!("/resources/requests/{res}");
        assert!(
            container
                .pointer(&ptr)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty()),
            "{what}: no {res} request (resources.requests.{res}): the scheduler must reserve it"
        );
    }
}

/// The runtime handler names containerd's CRI plugin maps to `io.containerd.weenv.v1`
/// (containerd-shim-weenv-v1) in a containerd config fragment of `config/`.
fn weenv_runtime_handlers(rel: &str) -> Vec<String> {
    const PREFIX: &str = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.";
    let text = read(rel);
    let mut handlers = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            current = line
                .strip_prefix(PREFIX)
                .and_then(|r| r.strip_suffix(']'))
                .map(|h| h.trim_matches('"').to_string());
        } else if let Some(h) = &current {
            if line.replace(' ', "") == "runtime_type=\"io.containerd.weenv.v1\"" {
                handlers.push(h.clone());
            }
        }
    }
    handlers
}

/// `key = "value"` in the `[section]` of a TOML fragment (first match).
fn toml_string(rel: &str, section: &str, key: &str) -> Option<String> {
    let text = read(rel);
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key {
                    return Some(v.trim().trim_matches('"').to_string());
                }
            }
        }
    }
    None
}

/// The daemon's config as the DaemonSet gives it (ConfigMap key mounted at `--config`).
fn daemon_config(docs: &[Value], ds: &Value, container: &Value) -> Config {
    let (path, text) = config_file(docs, ds, container, SNAPSHOTTER);
    Config::from_toml(&text, &path)
        .unwrap_or_else(|e| panic!("{SNAPSHOTTER}: ConfigMap text of {}: {e}", path.display()))
}

#[test]
fn snapshotter_daemonset() {
    let docs = documents(SNAPSHOTTER);
    let ds = find(&docs, "DaemonSet", "weenv-snapshotter", SNAPSHOTTER);
    let what = "weenv-snapshotter DaemonSet";
    let c = only_container(ds, what);
    let cfg = daemon_config(&docs, ds, c);

    // Every namespaced object lives in the Namespace the file creates.
    let ns = str_at(find_kind(&docs, "Namespace"), "/metadata/name", "Namespace");
    for d in docs.iter().filter(|d| d["kind"] != "Namespace") {
        assert_eq!(
            d.pointer("/metadata/namespace").and_then(Value::as_str),
            Some(ns),
            "{SNAPSHOTTER}: {} {} is not in namespace {ns}",
            d["kind"],
            d["metadata"]["name"]
        );
    }

    assert_eq!(
        c.pointer("/securityContext/privileged"),
        Some(&Value::Bool(true)),
        "{what}: the container must be privileged (FUSE mounts, overlay mounts for containerd)"
    );
    assert_eq!(
        str_at(ds, "/spec/updateStrategy/type", what),
        "RollingUpdate",
        "{what}: updateStrategy must be RollingUpdate (handover to the keeper, docs/restart.md)"
    );
    assert_eq!(
        ds.pointer("/spec/template/spec/hostNetwork"),
        Some(&Value::Bool(true)),
        "{what}: hostNetwork must be on (the probes reach the node's 127.0.0.1)"
    );
    let selector = ds.pointer("/spec/selector/matchLabels").expect("selector");
    let labels = ds
        .pointer("/spec/template/metadata/labels")
        .expect("labels");
    assert_eq!(
        selector, labels,
        "{what}: selector.matchLabels must match the template's labels"
    );

    // /dev/fuse from the host.
    let (host, _) = host_path_for(ds, c, Path::new("/dev/fuse"), what);
    assert_eq!(
        host,
        Path::new("/dev/fuse"),
        "{what}: /dev/fuse must be the host's /dev/fuse"
    );

    // The state dir (and the FUSE mountpoint below it): same path as on the host, Bidirectional.
    for (path, role) in [
        (cfg.root_dir.clone(), "root_dir"),
        (cfg.mountpoint(), "fuse mountpoint"),
    ] {
        let (host, mount) = host_path_for(ds, c, &path, what);
        assert_eq!(
            host,
            path,
            "{what}: {role} {} must be the same path on the host (containerd mounts from it)",
            path.display()
        );
        assert_eq!(
            mount.pointer("/mountPropagation").and_then(Value::as_str),
            Some("Bidirectional"),
            "{what}: the mount of {role} {} needs mountPropagation: Bidirectional (containerd must see the FUSE mount)",
            path.display()
        );
    }

    // The snapshotter socket dir, where containerd's proxy_plugins.weenv.address points.
    let (host, _) = host_path_for(ds, c, &cfg.socket, what);
    assert_eq!(
        host,
        cfg.socket,
        "{what}: the socket {} must be on the host at the same path",
        cfg.socket.display()
    );
    let proxy = toml_string(
        "config/containerd-config.toml",
        "proxy_plugins.weenv",
        "address",
    )
    .expect("config/containerd-config.toml: no proxy_plugins.weenv address");
    assert_eq!(
        Path::new(&proxy),
        cfg.socket,
        "containerd's proxy_plugins.weenv.address and the ConfigMap's socket differ"
    );

    // containerd's socket dir (the daemon reads image labels from containerd's content store).
    let sock = &cfg.registry.containerd_socket;
    assert!(
        !sock.as_os_str().is_empty(),
        "{what}: registry.containerd_socket is off in the ConfigMap"
    );
    let (host, _) = host_path_for(ds, c, sock, what);
    assert_eq!(
        host,
        *sock,
        "{what}: containerd's socket {} must be mounted from the host",
        sock.display()
    );

    // Liveness and readiness on /status of the observability endpoint.
    let Some(ListenAddr::Tcp(listen)) = cfg.listen_addr().expect("listen") else {
        panic!("{what}: [observability] listen must be ip:port for the kubelet's HTTP probes");
    };
    for probe in ["livenessProbe", "readinessProbe"] {
        let p = c.get(probe).unwrap_or_else(|| panic!("{what}: no {probe}"));
        assert_eq!(
            str_at(p, "/httpGet/path", probe),
            "/status",
            "{what}: {probe} must GET /status (the daemon's status endpoint)"
        );
        assert_eq!(
            p.pointer("/httpGet/port").and_then(Value::as_u64),
            Some(u64::from(listen.port())),
            "{what}: {probe} port must be the port of [observability] listen {listen}"
        );
        let host = p.pointer("/httpGet/host").and_then(Value::as_str);
        if listen.ip().is_loopback() {
            assert_eq!(
                host,
                Some(listen.ip().to_string().as_str()),
                "{what}: {probe} host must be {} ([observability] listen is loopback)",
                listen.ip()
            );
        }
    }
    assert_requests(c, what);
}

#[test]
fn keeper_shares_the_socket_dir() {
    let sdocs = documents(SNAPSHOTTER);
    let sds = find(&sdocs, "DaemonSet", "weenv-snapshotter", SNAPSHOTTER);
    let sc = only_container(sds, "weenv-snapshotter DaemonSet");
    let cfg = daemon_config(&sdocs, sds, sc);
    assert!(
        cfg.fuse.handover,
        "ConfigMap: fuse.handover must be on (the keeper DaemonSet exists for it)"
    );
    assert!(
        !cfg.fuse.spawn_keeper,
        "ConfigMap: fuse.spawn_keeper must be off (a keeper spawned in the pod dies with it on a rollout)"
    );

    let kdocs = documents(KEEPER);
    let kds = find(&kdocs, "DaemonSet", "weenv-fuse-keeper", KEEPER);
    let what = "weenv-fuse-keeper DaemonSet";
    assert_eq!(
        kds["metadata"]["namespace"], sds["metadata"]["namespace"],
        "{what}: not in the snapshotter's namespace"
    );
    let kc = only_container(kds, what);
    assert_eq!(
        kc["image"], sc["image"],
        "{what}: must run the snapshotter's image (its `keeper` subcommand)"
    );
    let args: Vec<&str> = array_at(kc, "/args", what)
        .iter()
        .map(|a| a.as_str().expect("args are strings"))
        .collect();
    assert_eq!(
        args.first(),
        Some(&"keeper"),
        "{what}: args must start with the keeper subcommand"
    );
    let sockets: Vec<PathBuf> = args
        .iter()
        .enumerate()
        .filter(|(_, a)| **a == "--socket")
        .filter_map(|(i, _)| args.get(i + 1).map(PathBuf::from))
        .collect();
    let mut want = vec![cfg.keeper_socket()];
    if cfg.fuse.plain_session {
        want.push(cfg.plain_keeper_socket());
    }
    assert_eq!(
        sockets, want,
        "{what}: --socket arguments differ from the snapshotter's fuse.keeper_socket (and the plain session's keeper socket beside it)"
    );
    let socket = sockets[0].clone();
    let (khost, _) = host_path_for(kds, kc, &socket, what);
    let (shost, _) = host_path_for(sds, sc, &cfg.keeper_socket(), "weenv-snapshotter DaemonSet");
    assert_eq!(
        khost, shost,
        "the keeper socket must be on the same host path in both DaemonSets"
    );
    assert_ne!(
        kc.pointer("/securityContext/privileged"),
        Some(&Value::Bool(true)),
        "{what}: the keeper needs no privilege"
    );
    assert_eq!(
        str_at(kds, "/spec/updateStrategy/type", what),
        "OnDelete",
        "{what}: deleting a keeper ends the session it holds: updateStrategy must be OnDelete"
    );
    assert_requests(kc, what);
}

/// Both DaemonSets run the image `scripts/build-image.sh` builds by default (its name and the
/// workspace version as tag).
#[test]
fn daemonsets_run_the_image_the_script_builds() {
    let out = std::process::Command::new("bash")
        .arg(repo_file("scripts/build-image.sh"))
        .arg("--print-ref")
        .output()
        .expect("run scripts/build-image.sh --print-ref");
    assert!(
        out.status.success(),
        "scripts/build-image.sh --print-ref failed: {out:?}"
    );
    let built = String::from_utf8(out.stdout).expect("UTF-8");
    let built = built.trim();
    for (file, name) in [
        (SNAPSHOTTER, "weenv-snapshotter"),
        (KEEPER, "weenv-fuse-keeper"),
    ] {
        let docs = documents(file);
        let c = only_container(find(&docs, "DaemonSet", name, file), file);
        assert_eq!(
            str_at(c, "/image", file),
            built,
            "{file}: the DaemonSet's image is not what scripts/build-image.sh builds"
        );
    }
}

#[test]
fn runtimeclass_handler_is_the_containerd_runtime() {
    let docs = documents(RUNTIMECLASS);
    let rc = find_kind(&docs, "RuntimeClass");
    let handler = str_at(rc, "/handler", "RuntimeClass");
    for rel in [
        "config/containerd-config.toml",
        "config/containerd-shim.toml",
    ] {
        let handlers = weenv_runtime_handlers(rel);
        assert!(
            handlers.iter().any(|h| h == handler),
            "RuntimeClass handler {handler:?} is not a runtime of {rel} with runtime_type io.containerd.weenv.v1 (found {handlers:?})"
        );
    }
    let name = str_at(rc, "/metadata/name", "RuntimeClass");
    for pod in docs.iter().filter(|d| d["kind"] == "Pod") {
        assert_eq!(
            pod.pointer("/spec/runtimeClassName")
                .and_then(Value::as_str),
            Some(name),
            "{RUNTIMECLASS}: example pod does not use RuntimeClass {name}"
        );
    }
}

#[test]
fn every_manifest_is_checked() {
    let mut files: Vec<String> = std::fs::read_dir(repo_file("config/k8s"))
        .expect("config/k8s")
        .map(|e| {
            let name = e.expect("config/k8s entry").file_name();
            name.into_string().expect("UTF-8 file name")
        })
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    files.sort();
    let known = [RUNTIMECLASS, KEEPER, SNAPSHOTTER]
        .map(|p| p.trim_start_matches("config/k8s/").to_string());
    for f in &files {
        assert!(
            known.contains(f),
            "config/k8s/{f} is not checked by integration/tests/k8s_manifests.rs"
        );
        documents(&format!("config/k8s/{f}"));
    }
}
