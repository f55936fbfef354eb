//! `POST /verify/<layer digest>` on the daemon's endpoint: fetch a lazily served layer in full
//! now and check it against the diff_id claimed for it (a mismatch quarantines it). `weenv pull`
//! and `weenv run` ask it when a chain they would reuse is a remote snapshot bound to another
//! layer than their manifest names.

use serde::{Deserialize, Serialize};

/// Path prefix of the request (the layer digest follows).
pub const VERIFY_PATH: &str = "/verify/";

/// What a verification concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyVerdict {
    /// Every byte fetched; the TOC is the tar and the stream is the claimed diff_id.
    Verified,
    /// The layer is quarantined (reads of its files fail with EIO).
    Quarantined,
    /// Complete and consistent, but no diff_id was claimed for it.
    Unclaimed,
}

/// The answer (JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub layer: String,
    pub verdict: VerifyVerdict,
    /// Why it is quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Seconds the request took.
    pub secs: f64,
}
