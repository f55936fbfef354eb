#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use super::serve::{error_body, reason_phrase, route, Route};
use super::*;
use hyper::Method;

#[test]
fn routes_of_a_mirror_request() {
    let q = Some("ns=127.0.0.1%3A5000");
    assert_eq!(
        route(&Method::GET, "/v2/weenv/plans/manifests/flask-1", q),
        Route::Manifest {
            ns: "127.0.0.1:5000".into(),
            name: "weenv/plans".into(),
            reference: "flask-1".into()
        }
    );
    let d = Digest::sha256(b"x");
    assert_eq!(
        route(
            &Method::HEAD,
            &format!("/v2/a/b/blobs/{d}"),
            Some("x=1&ns=reg.io")
        ),
        Route::Blob {
            ns: "reg.io".into(),
            name: "a/b".into(),
            digest: d
        }
    );
    assert_eq!(route(&Method::GET, "/v2/", None), Route::Base);
    assert!(matches!(
        route(&Method::GET, "/v2/a/manifests/1", None),
        Route::Refuse(400, _, m) if m.contains("hosts.toml")
    ));
    assert!(matches!(
        route(&Method::PUT, "/v2/a/manifests/1", q),
        Route::Refuse(405, _, _)
    ));
    assert!(matches!(
        route(&Method::GET, "/v2/a/blobs/nope", q),
        Route::Refuse(400, "DIGEST_INVALID", _)
    ));
    assert!(matches!(
        route(&Method::GET, "/v2/a/tags/list", q),
        Route::Refuse(404, _, _)
    ));
}

#[test]
fn errors_are_registry_errors_with_the_message() {
    let b = error_body("MANIFEST_UNKNOWN", "group r/x:1 not found");
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["errors"][0]["code"], "MANIFEST_UNKNOWN");
    assert_eq!(v["errors"][0]["message"], "group r/x:1 not found");
    let e = PlanServeError::UnknownBlob {
        digest: Digest::sha256(b"y"),
    };
    assert_eq!(e.status_code(), (404, "BLOB_UNKNOWN"));
}

#[test]
fn own_mirror_is_dropped_from_the_daemons_registry_config() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("reg.io")).unwrap();
    std::fs::write(
        d.path().join("reg.io/hosts.toml"),
        "server = \"https://reg.io\"\n[host.\"http://127.0.0.1:9124\"]\n  capabilities = [\"pull\", \"resolve\"]\n\
         [host.\"https://mirror.io\"]\n  capabilities = [\"pull\"]\n",
    )
    .unwrap();
    let cfg = weenv_registry::RegistryConfig {
        hosts_dir: Some(d.path().to_path_buf()),
        ..Default::default()
    };
    let out = without_own_mirror(cfg, "127.0.0.1:9124").unwrap();
    let m: Vec<&str> = out.hosts["reg.io"]
        .mirrors
        .iter()
        .map(|m| m.url.as_str())
        .collect();
    assert_eq!(m, vec!["https://mirror.io"]);
    assert!(out.hosts_dir.is_none());
}

#[test]
fn reason_phrases_are_one_printable_line() {
    assert_eq!(reason_phrase("a\nb\tc é"), "a b c  ");
    assert_eq!(reason_phrase(&"x".repeat(1000)).len(), 400);
}
