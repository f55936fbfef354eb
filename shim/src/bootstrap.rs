//! What containerd writes to a shim's stdin at `start`, made readable for containerd-shim 0.11.
//!
//! containerd 1.6/1.7 write the runtime options (a protobuf `Any` holding runc's `Options`, or
//! nothing); containerd ≥ 2.0 writes its Bootstrap protocol's `BootstrapParams` instead (for
//! every shim not named `*shim-runc-v1*`). containerd-shim 0.11's `spawn` reads stdin as the
//! former to place the shim in `Options.shim_cgroup`, and fails on the latter (`WireError`), so
//! no task starts. [`classify`] tells the two apart (pure); [`normalise_stdin`] puts legacy
//! options back on stdin unchanged and gives the library an empty stdin for bootstrap params
//! (this shim uses none of their fields: the address and namespace also come in its arguments
//! and environment).

use containerd_shim::protos::protobuf::{well_known_types::any::Any, Message};
use containerd_shim::protos::shim::oci::Options;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;

/// What the start stdin holds.
#[derive(Debug, PartialEq, Eq)]
pub enum StartInput {
    Empty,
    /// containerd 1.x: runtime options.
    LegacyOptions,
    /// containerd 2.x: `BootstrapParams` (or anything else that is not legacy options).
    Other,
}

/// Classifies the start stdin (pure).
pub fn classify(data: &[u8]) -> StartInput {
    if data.is_empty() {
        return StartInput::Empty;
    }
    match Any::parse_from_bytes(data) {
        Ok(a) if a.type_url.ends_with("Options") && Options::parse_from_bytes(&a.value).is_ok() => {
            StartInput::LegacyOptions
        }
        _ => StartInput::Other,
    }
}

/// Reads stdin and replaces it with what containerd-shim 0.11 can parse: the same bytes for
/// legacy options (through a pipe), nothing otherwise. Returns the classification.
pub fn normalise_stdin() -> std::io::Result<StartInput> {
    let mut data = Vec::new();
    std::io::stdin().read_to_end(&mut data)?;
    let kind = classify(&data);
    let replacement: std::fs::File = match kind {
        StartInput::LegacyOptions => {
            let (r, w) = nix::unistd::pipe().map_err(std::io::Error::from)?;
            let mut w = std::fs::File::from(w);
            // Options are a few hundred bytes: far below a pipe's buffer.
            w.write_all(&data)?;
            drop(w);
            std::fs::File::from(r)
        }
        StartInput::Empty | StartInput::Other => std::fs::File::open("/dev/null")?,
    };
    // SAFETY: dup2 onto fd 0 with a valid open fd; `replacement` is closed after, fd 0 stays.
    if unsafe { libc::dup2(replacement.as_raw_fd(), 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_options_and_bootstrap_params_are_told_apart() {
        let mut o = Options::new();
        o.binary_name = "runc".into();
        o.shim_cgroup = "/x".into();
        let mut a = Any::new();
        a.type_url = "containerd.runc.v1.Options".into();
        a.value = o.write_to_bytes().unwrap();
        assert_eq!(
            classify(&a.write_to_bytes().unwrap()),
            StartInput::LegacyOptions
        );
        assert_eq!(classify(b""), StartInput::Empty);
        // BootstrapParams{instance_id: "c1", namespace: "default", containerd_version: "v2.4.2"}
        let mut b = vec![0x0a, 2];
        b.extend_from_slice(b"c1");
        b.extend_from_slice(&[0x12, 7]);
        b.extend_from_slice(b"default");
        b.extend_from_slice(&[0x22, 6]);
        b.extend_from_slice(b"v2.4.2");
        assert_eq!(classify(&b), StartInput::Other);
    }
}
