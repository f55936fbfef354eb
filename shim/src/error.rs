//! [`ShimError`]: every failure of the task service and its helpers, and the one table
//! ([`ShimError::code`]) that maps it to a ttrpc status code at the ttrpc edge.
//!
//! containerd turns the code back into its `errdefs` kind (`NOT_FOUND` → `ErrNotFound`,
//! ...), so the code is part of the contract: a missing container or exec is
//! `NOT_FOUND`, a second exec with the same id `ALREADY_EXISTS`, a bad request payload
//! `INVALID_ARGUMENT`, a state that forbids the call `FAILED_PRECONDITION`, and runc or
//! I/O failures `UNKNOWN` with runc's own message (as the Go runc shim reports them).

use std::path::PathBuf;

use containerd_shim::protos::ttrpc::{self, Code};

use crate::config::ConfigError;
use crate::stats::StatsError;

/// A failed task API call.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("container {0} not found")]
    ContainerNotFound(String),
    #[error("exec {0} not found")]
    ExecNotFound(String),
    /// Kill of a process that has already exited (containerd's runc shim says the same).
    #[error("process already finished")]
    ProcessFinished,
    #[error("exec {0} already exists")]
    ExecExists(String),
    /// A request field that does not decode (exec process spec, update resources).
    #[error("{what}: {source}")]
    BadRequest {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("read OCI spec in {path}: {source}")]
    Spec {
        path: PathBuf,
        source: oci_spec::OciSpecError,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("process has no TTY (created without terminal=true)")]
    NoTty,
    #[error("no cgroup found for this container")]
    NoCgroup,
    #[error("weenv shim: {0} is not supported")]
    Unsupported(&'static str),
    /// A runc command failed; `detail` carries runc's log.json error when there is one.
    #[error("runc {op}: {detail}")]
    Runc { op: &'static str, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A containerd-shim helper failed (rootfs mount, pid file read).
    #[error("{what}: {source}")]
    Shim {
        what: String,
        source: containerd_shim::Error,
    },
    #[error(transparent)]
    Stats(#[from] StatsError),
    /// A stdio URI that does not parse, or a log file / logging binary that cannot be opened.
    #[error(transparent)]
    Stdio(#[from] crate::stdio::StdioError),
    #[error("process went away before its exit was seen")]
    ExitLost,
    #[error("monitor lock poisoned")]
    Poisoned,
}

impl ShimError {
    /// An I/O failure while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShimError {
        let what = what.into();
        move |source| ShimError::Io { what, source }
    }

    /// A containerd-shim helper failure while doing `what`.
    pub fn shim(what: impl Into<String>) -> impl FnOnce(containerd_shim::Error) -> ShimError {
        let what = what.into();
        move |source| ShimError::Shim { what, source }
    }

    /// A failed runc `op`, with the reason from `<bundle>/log.json` (see [`crate::runc::detail`]).
    pub fn runc(op: &'static str, bundle: &std::path::Path, e: &runc::error::Error) -> ShimError {
        ShimError::Runc {
            op,
            detail: crate::runc::detail(bundle, e),
        }
    }

    /// The ttrpc status code of this error: the one mapping table of the shim.
    pub fn code(&self) -> Code {
        use ShimError::*;
        match self {
            ContainerNotFound(_) | ExecNotFound(_) | ProcessFinished => Code::NOT_FOUND,
            ExecExists(_) => Code::ALREADY_EXISTS,
            BadRequest { .. } | Spec { .. } => Code::INVALID_ARGUMENT,
            Config(ConfigError::Invalid { .. }) => Code::INVALID_ARGUMENT,
            Config(ConfigError::Read { .. } | ConfigError::Parse { .. }) => {
                Code::FAILED_PRECONDITION
            }
            NoTty => Code::FAILED_PRECONDITION,
            NoCgroup => Code::UNAVAILABLE,
            Unsupported(_) => Code::UNIMPLEMENTED,
            Stdio(crate::stdio::StdioError::Uri { .. }) => Code::INVALID_ARGUMENT,
            Runc { .. } | Io { .. } | Shim { .. } | Stats(_) | Stdio(_) => Code::UNKNOWN,
            ExitLost | Poisoned => Code::INTERNAL,
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> ttrpc::Error {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_err() -> serde_json::Error {
        serde_json::from_str::<u8>("x").unwrap_err()
    }

    fn io_err() -> std::io::Error {
        std::io::Error::other("boom")
    }

    #[test]
    fn every_variant_maps_to_its_code() {
        let table: Vec<(ShimError, Code)> = vec![
            (ShimError::ContainerNotFound("c".into()), Code::NOT_FOUND),
            (ShimError::ExecNotFound("e".into()), Code::NOT_FOUND),
            (ShimError::ProcessFinished, Code::NOT_FOUND),
            (ShimError::ExecExists("e".into()), Code::ALREADY_EXISTS),
            (
                ShimError::BadRequest {
                    what: "exec process spec",
                    source: json_err(),
                },
                Code::INVALID_ARGUMENT,
            ),
            (
                ShimError::Spec {
                    path: "/b".into(),
                    source: oci_spec::OciSpecError::Other("bad".into()),
                },
                Code::INVALID_ARGUMENT,
            ),
            (
                ShimError::Config(ConfigError::Invalid {
                    field: "io.weenv.memory.max".into(),
                    problem: "not a size".into(),
                }),
                Code::INVALID_ARGUMENT,
            ),
            (
                ShimError::Config(ConfigError::Read {
                    path: "/etc/weenv/shim.toml".into(),
                    source: io_err(),
                }),
                Code::FAILED_PRECONDITION,
            ),
            (
                ShimError::Config(ConfigError::Parse {
                    path: "/etc/weenv/shim.toml".into(),
                    source: toml::from_str::<toml::Table>("=").unwrap_err(),
                }),
                Code::FAILED_PRECONDITION,
            ),
            (ShimError::NoTty, Code::FAILED_PRECONDITION),
            (ShimError::NoCgroup, Code::UNAVAILABLE),
            (ShimError::Unsupported("checkpoint"), Code::UNIMPLEMENTED),
            (
                ShimError::Runc {
                    op: "start",
                    detail: "exit status 1".into(),
                },
                Code::UNKNOWN,
            ),
            (ShimError::io("pty copy")(io_err()), Code::UNKNOWN),
            (
                ShimError::shim("mount rootfs")(containerd_shim::Error::InvalidArgument(
                    "x".into(),
                )),
                Code::UNKNOWN,
            ),
            (
                ShimError::Stats(StatsError::Encode("x".into())),
                Code::UNKNOWN,
            ),
            (ShimError::ExitLost, Code::INTERNAL),
            (ShimError::Poisoned, Code::INTERNAL),
        ];
        for (e, code) in table {
            assert_eq!(e.code(), code, "{e}");
        }
    }

    #[test]
    fn ttrpc_status_carries_code_and_message() {
        let e: ttrpc::Error = ShimError::ExecNotFound("sh-1".into()).into();
        match e {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), Code::NOT_FOUND);
                assert_eq!(s.message(), "exec sh-1 not found");
            }
            other => panic!("not a status: {other:?}"),
        }
    }

    #[test]
    fn runc_error_without_log_keeps_runc_message() {
        let dir = tempfile::tempdir().unwrap();
        let e = ShimError::runc("kill", dir.path(), &runc::error::Error::NotFound);
        assert_eq!(e.to_string(), "runc kill: Unable to locate the runc");
        assert_eq!(e.code(), Code::UNKNOWN);
    }
}
