//! Errors of the service, each mapped to one gRPC status code ([`EnvdError::status`]).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EnvdError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("no environment {0} (list them with List)")]
    NoEnv(String),
    #[error("environment {env} has no session {session} (open one with OpenSession)")]
    NoSession { env: String, session: String },
    #[error("environment {id} is {state}: {cause}")]
    NotRunning {
        id: String,
        state: String,
        cause: String,
    },
    #[error("{0}")]
    TooLarge(String),
    #[error("creating environment: {0}")]
    Run(#[from] Box<weenv_cli::run::RunError>),
    #[error(transparent)]
    Containerd(#[from] Box<weenv_cli::pull::PullError>),
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    #[error("mutation failed: the pooled environment {id} it was applied to is removed, nothing of the caller's ran in it: {error}")]
    PooledMutation {
        id: String,
        error: Box<weenv_converter::mutate::MutateError>,
    },
    #[error("{0}")]
    Internal(String),
}

impl From<weenv_cli::pull::PullError> for EnvdError {
    fn from(e: weenv_cli::pull::PullError) -> Self {
        EnvdError::Containerd(Box::new(e))
    }
}

impl From<weenv_cli::run::RunError> for EnvdError {
    fn from(e: weenv_cli::run::RunError) -> Self {
        EnvdError::Run(Box::new(e))
    }
}

impl EnvdError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EnvdError {
        let what = what.into();
        move |error| EnvdError::Io { what, error }
    }

    /// The gRPC status of this error (its message is the error's text).
    pub fn status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self {
            EnvdError::InvalidArgument(_) => Code::InvalidArgument,
            EnvdError::NoEnv(_) | EnvdError::NoSession { .. } => Code::NotFound,
            EnvdError::NotRunning { .. } => Code::FailedPrecondition,
            EnvdError::TooLarge(_) => Code::ResourceExhausted,
            EnvdError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                Code::NotFound
            }
            EnvdError::Io { error, .. } if error.kind() == std::io::ErrorKind::InvalidInput => {
                Code::InvalidArgument
            }
            EnvdError::Run(_) | EnvdError::Containerd(_) | EnvdError::Io { .. } => Code::Internal,
            EnvdError::Internal(_) | EnvdError::PooledMutation { .. } => Code::Internal,
        };
        tonic::Status::new(code, self.to_string())
    }
}

impl From<EnvdError> for tonic::Status {
    fn from(e: EnvdError) -> Self {
        e.status()
    }
}
