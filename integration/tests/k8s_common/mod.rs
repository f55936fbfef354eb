//! Reading the Kubernetes manifests of `config/k8s/` in tests (`k8s_manifests`, `k8s_image`):
//! multi-document YAML as JSON values and lookups that fail with the file and field named.

#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};

pub const SNAPSHOTTER: &str = "config/k8s/weenv-snapshotter-daemonset.yaml";
pub const KEEPER: &str = "config/k8s/weenv-fuse-keeper-daemonset.yaml";
pub const RUNTIMECLASS: &str = "config/k8s/runtimeclass-weenv.yaml";

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

pub fn read(rel: &str) -> String {
    let path = repo_file(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every document of a multi-document YAML file (split at `---` lines), as JSON values.
pub fn documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            let doc: Value = serde_yaml_ng::from_str(&current).unwrap_or_else(|e| {
                panic!("{rel}: document {} is not valid YAML: {e}", docs.len() + 1)
            });
            if !doc.is_null() {
                assert!(
                    doc.is_object(),
                    "{rel}: document {} is not a mapping",
                    docs.len() + 1
                );
                docs.push(doc);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    assert!(!docs.is_empty(), "{rel}: no YAML document");
    for (i, d) in docs.iter().enumerate() {
        for key in ["/apiVersion", "/kind", "/metadata/name"] {
            assert!(
                d.pointer(key).and_then(Value::as_str).is_some(),
                "{rel}: document {} has no {key}",
                i + 1
            );
        }
    }
    docs
}

pub fn str_at<'a>(v: &'a Value, ptr: &str, what: &str) -> &'a str {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{what}: {ptr} missing or not a string"))
}

pub fn array_at<'a>(v: &'a Value, ptr: &str, what: &str) -> &'a Vec<Value> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{what}: {ptr} missing or not a list"))
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str, file: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{file}: no {kind} named {name}"))
}

/// The one container of a DaemonSet's pod template.
pub fn only_container<'a>(ds: &'a Value, what: &str) -> &'a Value {
    let containers = array_at(ds, "/spec/template/spec/containers", what);
    assert_eq!(containers.len(), 1, "{what}: expected one container");
    &containers[0]
}

pub fn find_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// The `--config` file of the weenv-snapshotter container of `ds` and its text: the ConfigMap
/// key mounted at that path (ConfigMap found in `docs`, the documents of `file`).
pub fn config_file(docs: &[Value], ds: &Value, container: &Value, file: &str) -> (PathBuf, String) {
    let what = "weenv-snapshotter container";
    let args: Vec<&str> = array_at(container, "/args", what)
        .iter()
        .map(|a| a.as_str().expect("args are strings"))
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--config")
        .unwrap_or_else(|| panic!("{what}: no --config argument"));
    let path = Path::new(args.get(at + 1).expect("--config has a value"));
    let mount = array_at(container, "/volumeMounts", what)
        .iter()
        .find(|m| path.parent() == Some(Path::new(str_at(m, "/mountPath", what))))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no volumeMount at the dir of --config {}",
                path.display()
            )
        });
    let volume = array_at(ds, "/spec/template/spec/volumes", what)
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("config volume");
    let cm_name = str_at(volume, "/configMap/name", "config volume");
    let cm = find(docs, "ConfigMap", cm_name, file);
    let key = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("--config names a file");
    let text = str_at(cm, &format!("/data/{key}"), "ConfigMap");
    (path.to_path_buf(), text.to_string())
}
