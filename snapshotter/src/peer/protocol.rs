//! The peer protocol: one request type, its validation (pure), and the response layout.
//!
//! `POST /peer/v1/frames` with a JSON [`FrameRequest`] (at most [`MAX_BODY`] bytes; the shared
//! token, if configured, as `Authorization: Bearer <token>`). It names the blob well enough for
//! the owner to fetch it from the registry itself (repository, blob digest and size) and each
//! frame as the reader's TOC describes it (compressed range, uncompressed length, digest of the
//! uncompressed bytes). The owner serves each frame from its caches or fetches it through its
//! own single flight, verified against the digest the request names; the reader verifies every
//! frame again against its own TOC (a peer is never trusted).
//!
//! Answers: `200` with the uncompressed frames back to back in request order (`Content-Length`
//! = the sum of their `ulen`); `400` an invalid request; `401` a missing or wrong token; `404`
//! a frame missing from a `cache_only` request; `502` the owner's registry read failed; `503`
//! the owner's serving limits are full.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use weenv_format::frame::{MAX_FRAME_CLEN, MAX_FRAME_ULEN};
use weenv_format::{Digest, Frame};
use weenv_registry::Reference;

/// The request path.
pub const FRAMES_PATH: &str = "/peer/v1/frames";
/// The protocol version a request carries.
pub const VERSION: u32 = 1;
/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;
/// Most frames in one request.
pub const MAX_FRAMES: usize = 4096;

/// Why frames are wanted (the owner fetches at the same priority).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WirePriority {
    Demand,
    Prefetch,
    Fill,
}

/// The blob the frames belong to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlobRef {
    /// `registry/repository` (a tag or digest is ignored).
    pub reference: String,
    pub digest: Digest,
    pub size: u64,
}

/// `POST /peer/v1/frames`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrameRequest {
    pub version: u32,
    pub blob: BlobRef,
    pub priority: WirePriority,
    /// Serve only what is cached (`404` otherwise): asking the previous owner after a
    /// membership change, never causing a registry fetch.
    #[serde(default)]
    pub cache_only: bool,
    /// In blob order, not overlapping.
    pub frames: Vec<Frame>,
}

/// Bounds a server puts on requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most uncompressed bytes in one request.
    pub max_request_bytes: u64,
    /// Registry hosts fetched from on a peer's behalf; empty: any.
    pub registries: Vec<String>,
}

/// A request that passed [`validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidRequest {
    pub reference: Reference,
    pub digest: Digest,
    pub size: u64,
    pub priority: WirePriority,
    pub cache_only: bool,
    pub frames: Vec<Frame>,
    /// Sum of the frames' `ulen` (the response length).
    pub total_ulen: u64,
}

/// Why a request was refused (`400`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("unsupported protocol version {0} (this node speaks {VERSION})")]
    Version(u32),
    #[error("no frames asked")]
    Empty,
    #[error("{0} frames asked, at most {MAX_FRAMES}")]
    TooManyFrames(usize),
    #[error("bad repository {reference:?}: {reason}")]
    Reference { reference: String, reason: String },
    #[error("registry {0} is not one this node fetches from for peers (peers.registries)")]
    Registry(String),
    #[error("frame {index}: {reason}")]
    Frame { index: usize, reason: String },
    #[error("{total} uncompressed bytes asked, at most {max} per request")]
    TooLarge { total: u64, max: u64 },
}

/// Checks `req` against `limits`. Pure.
pub fn validate(req: FrameRequest, limits: &RequestLimits) -> Result<ValidRequest, RequestError> {
    if req.version != VERSION {
        return Err(RequestError::Version(req.version));
    }
    if req.frames.is_empty() {
        return Err(RequestError::Empty);
    }
    if req.frames.len() > MAX_FRAMES {
        return Err(RequestError::TooManyFrames(req.frames.len()));
    }
    let reference: Reference =
        req.blob
            .reference
            .parse()
            .map_err(|e: weenv_registry::RegistryError| RequestError::Reference {
                reference: req.blob.reference.clone(),
                reason: e.to_string(),
            })?;
    if !limits.registries.is_empty() && !limits.registries.iter().any(|r| r == reference.registry())
    {
        return Err(RequestError::Registry(reference.registry().to_string()));
    }
    let mut total: u64 = 0;
    let mut end_prev = 0u64;
    for (index, f) in req.frames.iter().enumerate() {
        let bad = |reason: String| RequestError::Frame { index, reason };
        if f.clen == 0 || f.clen > MAX_FRAME_CLEN {
            return Err(bad(format!("compressed length {} out of range", f.clen)));
        }
        if f.ulen > MAX_FRAME_ULEN {
            return Err(bad(format!("uncompressed length {} too large", f.ulen)));
        }
        let end = f
            .offset
            .checked_add(f.clen)
            .filter(|e| *e <= req.blob.size)
            .ok_or_else(|| bad(format!("range past the blob's {} bytes", req.blob.size)))?;
        if index > 0 && f.offset < end_prev {
            return Err(bad("frames overlap or are out of blob order".into()));
        }
        end_prev = end;
        total = total.saturating_add(f.ulen);
    }
    if total > limits.max_request_bytes {
        return Err(RequestError::TooLarge {
            total,
            max: limits.max_request_bytes,
        });
    }
    Ok(ValidRequest {
        reference,
        digest: req.blob.digest,
        size: req.blob.size,
        priority: req.priority,
        cache_only: req.cache_only,
        frames: req.frames,
        total_ulen: total,
    })
}

/// Cuts a `200` body into the frames of the request (`None` if its length is wrong). Pure.
pub fn split_body(body: &bytes::Bytes, frames: &[&Frame]) -> Option<Vec<bytes::Bytes>> {
    let total: u64 = frames.iter().map(|f| f.ulen).sum();
    if body.len() as u64 != total {
        return None;
    }
    let mut at = 0usize;
    let mut out = Vec::with_capacity(frames.len());
    for f in frames {
        let n = usize::try_from(f.ulen).ok()?;
        out.push(body.slice(at..at + n));
        at += n;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(offset: u64, clen: u64, ulen: u64) -> Frame {
        Frame {
            offset,
            clen,
            ulen,
            digest: Digest::sha256(&offset.to_le_bytes()),
        }
    }

    fn req(frames: Vec<Frame>) -> FrameRequest {
        FrameRequest {
            version: VERSION,
            blob: BlobRef {
                reference: "10.0.0.9:5000/app/img".into(),
                digest: Digest::sha256(b"blob"),
                size: 1000,
            },
            priority: WirePriority::Demand,
            cache_only: false,
            frames,
        }
    }

    fn limits() -> RequestLimits {
        RequestLimits {
            max_request_bytes: 10_000,
            registries: vec![],
        }
    }

    #[test]
    fn a_good_request_passes_and_round_trips_as_json() {
        let r = req(vec![frame(0, 100, 400), frame(100, 50, 200)]);
        let json = serde_json::to_string(&r).unwrap();
        let back: FrameRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let v = validate(back, &limits()).unwrap();
        assert_eq!(v.total_ulen, 600);
        assert_eq!(v.reference.registry(), "10.0.0.9:5000");
        assert_eq!(v.reference.repository(), "app/img");
    }

    #[test]
    fn bad_requests_are_refused_with_the_reason() {
        let v = |r: FrameRequest| validate(r, &limits()).unwrap_err();
        assert_eq!(
            v(FrameRequest {
                version: 2,
                ..req(vec![frame(0, 1, 1)])
            }),
            RequestError::Version(2)
        );
        assert_eq!(v(req(vec![])), RequestError::Empty);
        assert!(matches!(
            v(req(vec![frame(990, 20, 1)])),
            RequestError::Frame { index: 0, .. }
        ));
        assert!(matches!(
            v(req(vec![frame(u64::MAX, 2, 1)])),
            RequestError::Frame { index: 0, .. }
        ));
        assert!(matches!(
            v(req(vec![frame(0, 0, 1)])),
            RequestError::Frame { .. }
        ));
        assert!(matches!(
            v(req(vec![frame(0, 1, MAX_FRAME_ULEN + 1)])),
            RequestError::Frame { .. }
        ));
        assert!(matches!(
            v(req(vec![frame(100, 10, 1), frame(50, 10, 1)])),
            RequestError::Frame { index: 1, .. }
        ));
        assert!(matches!(
            v(req(vec![frame(0, 10, 6000), frame(10, 10, 6000)])),
            RequestError::TooLarge { total: 12000, .. }
        ));
        assert!(matches!(
            v(req(vec![frame(0, 1, 1); MAX_FRAMES + 1])),
            RequestError::TooManyFrames(_)
        ));
        let mut bad_ref = req(vec![frame(0, 1, 1)]);
        bad_ref.blob.reference = "UPPER/../x".into();
        assert!(matches!(v(bad_ref), RequestError::Reference { .. }));
        let only = RequestLimits {
            registries: vec!["registry.internal".into()],
            ..limits()
        };
        assert_eq!(
            validate(req(vec![frame(0, 1, 1)]), &only).unwrap_err(),
            RequestError::Registry("10.0.0.9:5000".into())
        );
        // Unknown fields and malformed digests are refused by the parser.
        assert!(serde_json::from_str::<FrameRequest>(
            r#"{"version":1,"blob":{"reference":"a/b","digest":"sha256:zz","size":1},"priority":"fill","frames":[]}"#
        )
        .is_err());
        assert!(serde_json::from_str::<FrameRequest>(
            r#"{"version":1,"extra":1,"blob":{"reference":"a/b","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":1},"priority":"fill","frames":[]}"#
        )
        .is_err());
    }

    #[test]
    fn body_is_split_by_ulen_and_a_wrong_length_is_refused() {
        let (a, b) = (frame(0, 1, 3), frame(1, 1, 2));
        let body = bytes::Bytes::from_static(b"aaabb");
        let parts = split_body(&body, &[&a, &b]).unwrap();
        assert_eq!(&parts[0][..], b"aaa");
        assert_eq!(&parts[1][..], b"bb");
        assert!(split_body(&bytes::Bytes::from_static(b"aaab"), &[&a, &b]).is_none());
    }
}
