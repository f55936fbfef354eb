//! `containerd-shim-weenv-v1 -info`: containerd 2.x asks each runtime's shim what it is and
//! which OCI features its low-level runtime has; the CRI plugin turns the features into the
//! runtime handler's features (recursive read-only mounts, user namespaces) that the kubelet
//! and critest check. Answered as containerd's runc shim answers: a `RuntimeInfo` protobuf on
//! stdout whose `features` is runc's `runc features` JSON.
//!
//! [`runtime_info`] is pure; [`print_info`] reads the options containerd writes on stdin (for
//! runc's `BinaryName`), runs `runc features` and prints the answer.

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use containerd_shim::protos::shim::oci::Options;
use containerd_shim::protos::types::introspection::{RuntimeInfo, RuntimeVersion};
use std::io::{Read, Write};

/// The `Any` type URL of OCI runtime features, as containerd expects it.
pub const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    #[error("{binary} features: {reason} (install a runc that has `runc features`, ≥ 1.1)")]
    Features { binary: String, reason: String },
    #[error("the runtime options on stdin do not decode: {0}")]
    Options(String),
    #[error("writing the answer: {0}")]
    Write(std::io::Error),
}

/// The answer for runc's features JSON `features` (checked to be a JSON object) (pure).
pub fn runtime_info(features: &[u8], binary: &str) -> Result<RuntimeInfo, InfoError> {
    let bad = |reason: String| InfoError::Features {
        binary: binary.to_string(),
        reason,
    };
    let v: serde_json::Value =
        serde_json::from_slice(features).map_err(|e| bad(format!("not JSON: {e}")))?;
    if !v.is_object() {
        return Err(bad("not a JSON object".into()));
    }
    Ok(RuntimeInfo {
        name: crate::service::RUNTIME_ID.to_string(),
        version: MessageField::some(RuntimeVersion {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        }),
        features: MessageField::some(Any {
            type_url: FEATURES_TYPE_URL.to_string(),
            value: features.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// runc's binary named by the options containerd sent (`BinaryName`), `runc` by default.
pub fn binary_from_options(stdin: &[u8]) -> Result<String, InfoError> {
    if stdin.is_empty() {
        return Ok("runc".into());
    }
    let any = Any::parse_from_bytes(stdin).map_err(|e| InfoError::Options(e.to_string()))?;
    if !any.type_url.ends_with("Options") {
        return Ok("runc".into());
    }
    let o = Options::parse_from_bytes(&any.value).map_err(|e| InfoError::Options(e.to_string()))?;
    Ok(if o.binary_name.is_empty() {
        "runc".into()
    } else {
        o.binary_name
    })
}

fn info() -> Result<(), InfoError> {
    let mut stdin = Vec::new();
    // containerd may give no stdin at all: nothing to read is the default options.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let binary = binary_from_options(&stdin)?;
    let out = std::process::Command::new(&binary)
        .arg("features")
        .output()
        .map_err(|e| InfoError::Features {
            binary: binary.clone(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(InfoError::Features {
            binary,
            reason: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let answer = runtime_info(&out.stdout, &binary)?
        .write_to_bytes()
        .map_err(|e| InfoError::Write(std::io::Error::other(e.to_string())))?;
    std::io::stdout()
        .write_all(&answer)
        .map_err(InfoError::Write)
}

/// `-info`: prints the answer; the exit status (an error is said on stderr).
pub fn print_info() -> i32 {
    match info() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("containerd-shim-weenv-v1 -info: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_carries_runc_features_under_containerd_type_url() {
        let f = br#"{"ociVersionMin":"1.0.0","mountOptions":["rro"]}"#;
        let i = runtime_info(f, "runc").unwrap();
        assert_eq!(i.name, "io.containerd.weenv.v1");
        assert_eq!(i.features.type_url, FEATURES_TYPE_URL);
        assert_eq!(i.features.value, f.to_vec());
        // Round trip through the wire format containerd reads.
        let back = RuntimeInfo::parse_from_bytes(&i.write_to_bytes().unwrap()).unwrap();
        assert_eq!(back.features.value, f.to_vec());
        let e = runtime_info(b"[1]", "runc").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }

    #[test]
    fn the_runc_binary_comes_from_the_options() {
        assert_eq!(binary_from_options(b"").unwrap(), "runc");
        let o = Options {
            binary_name: "/opt/runc".into(),
            ..Default::default()
        };
        let any = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        };
        assert_eq!(
            binary_from_options(&any.write_to_bytes().unwrap()).unwrap(),
            "/opt/runc"
        );
    }
}
