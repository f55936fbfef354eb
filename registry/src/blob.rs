//! Blob reads: HEAD (size), whole blob (verified), streaming to a writer (verified, resumes
//! with `Range` after a broken connection) and ranged GETs (the FUSE hot path: one attempt is
//! exactly one request, `206` expected, a `200` full body is sliced with a one-time warning;
//! retries are [`crate::RangeSource::read`]'s, once per read).

use crate::auth::repo_scope;
use crate::client::{header_content_length, header_str, next_chunk, Client, Req, Target};
use crate::config::Capability;
use crate::error::RegistryError;
use crate::reference::Reference;
use crate::retry::{next_delay, random_jitter, Outcome};
use crate::stats::Kind;
use bytes::Bytes;
use reqwest::header::{CACHE_CONTROL, RANGE};
use reqwest::{Method, Response};
use sha2::{Digest as _, Sha256};
use std::sync::atomic::Ordering;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use weenv_format::Digest;

/// `Range` header value for `len` bytes at `offset` (`bytes=a-b`, inclusive); `None` for an
/// empty or overflowing range.
pub fn range_header(offset: u64, len: u64) -> Option<String> {
    if len == 0 {
        return None;
    }
    let last = offset.checked_add(len - 1)?;
    Some(format!("bytes={offset}-{last}"))
}

/// Parse `Content-Range: bytes a-b/total` (total may be `*`) into (a, b, total).
pub fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.trim().split_once('-')?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    if b < a {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((a, b, total))
}

fn is_transport(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Transport { .. })
}

impl Client {
    fn blob_req(r: &Reference, d: &Digest, method: Method, kind: Kind) -> Req {
        Req::new(
            method,
            Target::Path(format!("/{}/blobs/{}", r.repository(), d)),
            kind,
            vec![repo_scope(r.repository(), "pull")],
        )
    }

    /// Size of blob `d` in `r`'s repository, `None` if the registry does not have it.
    pub async fn head_blob(&self, r: &Reference, d: &Digest) -> Result<Option<u64>, RegistryError> {
        self.head_blob_cap(r, d, Capability::Pull).await
    }

    pub(crate) async fn head_blob_cap(
        &self,
        r: &Reference,
        d: &Digest,
        cap: Capability,
    ) -> Result<Option<u64>, RegistryError> {
        let mut req = Self::blob_req(r, d, Method::HEAD, Kind::Head);
        if cap == Capability::Push {
            // the existence check before an upload uses the upload's token
            req.scopes = vec![repo_scope(r.repository(), "pull,push")];
        }
        let (resp, ep) = self.execute(r.registry(), cap, &req).await?;
        match resp.status().as_u16() {
            200..=299 => header_content_length(resp.headers())
                .map(Some)
                .ok_or_else(|| RegistryError::Protocol {
                    url: resp.url().to_string(),
                    detail: "HEAD of a blob without Content-Length".into(),
                }),
            404 => Ok(None),
            _ => Err(self
                .error_for(resp, "HEAD", &format!("{r} blob {d}"), &ep.host)
                .await),
        }
    }

    /// Sleep before retry `attempt` of a body read that failed, or give up.
    async fn body_retry(&self, attempt: u32, e: &RegistryError) -> bool {
        if !is_transport(e) {
            return false;
        }
        match next_delay(
            &self.inner.config.retry,
            attempt,
            true,
            Outcome::Transport,
            random_jitter(),
        ) {
            Some(delay) => {
                self.stats_ref().count_retry();
                tokio::time::sleep(delay).await;
                true
            }
            None => false,
        }
    }

    /// Whole blob `d`, verified against its digest.
    pub async fn get_blob(&self, r: &Reference, d: &Digest) -> Result<Bytes, RegistryError> {
        let mut attempt = 0;
        loop {
            let req = Self::blob_req(r, d, Method::GET, Kind::Get);
            let (resp, ep) = self.execute(r.registry(), Capability::Pull, &req).await?;
            if !resp.status().is_success() {
                return Err(self
                    .error_for(resp, "GET", &format!("{r} blob {d}"), &ep.host)
                    .await);
            }
            let url = resp.url().to_string();
            match self.read_body(resp, u64::MAX).await {
                Ok(b) => {
                    let actual = Digest::sha256(&b);
                    if actual != *d {
                        return Err(RegistryError::DigestMismatch {
                            what: "blob",
                            url,
                            expected: d.to_string(),
                            actual: actual.to_string(),
                        });
                    }
                    return Ok(b);
                }
                Err(e) if self.body_retry(attempt, &e).await => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Stream blob `d` into `w`, verifying the digest at the end; returns the byte count.
    /// A connection that breaks mid-body is resumed with `Range: bytes=<written>-`. On
    /// `DigestMismatch` the writer has received bad data: discard it.
    pub async fn get_blob_stream<W: AsyncWrite + Unpin + Send>(
        &self,
        r: &Reference,
        d: &Digest,
        w: &mut W,
    ) -> Result<u64, RegistryError> {
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        let mut attempt = 0;
        let mut last_url: String;
        loop {
            let mut req = Self::blob_req(r, d, Method::GET, Kind::Get);
            if written > 0 {
                req = req.header(RANGE, &format!("bytes={written}-"))?;
                req.kind = Kind::RangeGet;
            }
            let (resp, ep) = self.execute(r.registry(), Capability::Pull, &req).await?;
            let status = resp.status().as_u16();
            if !(200..300).contains(&status) {
                return Err(self
                    .error_for(resp, "GET", &format!("{r} blob {d}"), &ep.host)
                    .await);
            }
            last_url = resp.url().to_string();
            // After a resume the server may ignore Range (200): skip what we already have.
            let mut skip = if written > 0 && status == 200 {
                written
            } else {
                0
            };
            if written > 0 && status == 206 {
                let start =
                    header_str(resp.headers(), "content-range").and_then(parse_content_range);
                if start.map(|s| s.0) != Some(written) {
                    return Err(RegistryError::Protocol {
                        url: last_url,
                        detail: format!(
                            "resume at {written} answered with Content-Range {start:?}"
                        ),
                    });
                }
            }
            match self
                .copy_body(resp, w, &mut hasher, &mut written, &mut skip)
                .await
            {
                Ok(()) => break,
                Err(e) if self.body_retry(attempt, &e).await => {
                    tracing::warn!(blob = %d, written, error = %e, "blob stream broke, resuming");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
        w.flush().await.map_err(|source| RegistryError::Io {
            context: format!("flushing blob {d}"),
            error: source,
        })?;
        let actual = Digest::from_sha256_bytes(&hasher.finalize().into());
        if actual != *d {
            return Err(RegistryError::DigestMismatch {
                what: "blob",
                url: last_url,
                expected: d.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(written)
    }

    async fn copy_body<W: AsyncWrite + Unpin + Send>(
        &self,
        mut resp: Response,
        w: &mut W,
        hasher: &mut Sha256,
        written: &mut u64,
        skip: &mut u64,
    ) -> Result<(), RegistryError> {
        let url = resp.url().to_string();
        while let Some(chunk) = next_chunk(&mut resp, &url).await? {
            self.stats_ref().count_received(chunk.len() as u64);
            let mut c = &chunk[..];
            if *skip > 0 {
                let n = (*skip).min(c.len() as u64) as usize;
                c = &c[n..];
                *skip -= n as u64;
            }
            if c.is_empty() {
                continue;
            }
            hasher.update(c);
            w.write_all(c).await.map_err(|source| RegistryError::Io {
                context: format!("writing blob from {url}"),
                error: source,
            })?;
            *written += c.len() as u64;
        }
        Ok(())
    }

    /// `len` bytes of blob `d` at `offset`, with the retry budget of
    /// [`crate::RangeSource::read`] over [`Client::try_get_blob_range`]. The bytes are not
    /// verified (verify chunk digests from the TOC).
    pub async fn get_blob_range(
        &self,
        r: &Reference,
        d: &Digest,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, RegistryError> {
        use crate::source::{ByteRange, RangeSource, RegistryRangeSource};
        RegistryRangeSource::new(self.clone(), r.clone(), d.clone(), None)
            .read(ByteRange::new(offset, len))
            .await
            .map_err(|e| e.into_registry_error())
    }

    /// One attempt at `len` bytes of blob `d` at `offset`: one GET with `Range: bytes=a-b`
    /// (redirects are followed with the header kept; no retry, a 401 is not resent). A `206`
    /// must start at `offset`; a `200` (server ignores Range) is sliced, reading no further
    /// than needed, and warned about once per client. With `fresh`: from the origin first
    /// (mirrors only if it fails) with `Cache-Control: no-cache`, so neither a mirror nor an
    /// HTTP cache on the way answers from what it holds (the refetch after bytes failed
    /// verification).
    pub async fn try_get_blob_range(
        &self,
        r: &Reference,
        d: &Digest,
        offset: u64,
        len: u64,
        fresh: bool,
    ) -> Result<Bytes, RegistryError> {
        let bad = |detail: String| RegistryError::BadRange {
            digest: d.to_string(),
            offset,
            len,
            detail,
        };
        if len == 0 {
            return Ok(Bytes::new());
        }
        let range = range_header(offset, len).ok_or_else(|| bad("range overflows u64".into()))?;
        let mut req = Self::blob_req(r, d, Method::GET, Kind::RangeGet).header(RANGE, &range)?;
        req.single_attempt = true;
        if fresh {
            req = req.header(CACHE_CONTROL, "no-cache")?;
            req.origin_first = true;
        }
        let (resp, ep) = self.execute(r.registry(), Capability::Pull, &req).await?;
        let res = match resp.status().as_u16() {
            206 => {
                let cr = header_str(resp.headers(), "content-range").and_then(parse_content_range);
                if let Some((a, _, _)) = cr {
                    if a != offset {
                        return Err(bad(format!("server answered a range starting at {a}")));
                    }
                }
                self.read_body(resp, len).await
            }
            200 => {
                if !self.inner.warned_full_range.swap(true, Ordering::Relaxed) {
                    tracing::warn!(registry = r.registry(), blob = %d, "registry ignored Range and sent the whole blob; range reads will be slow");
                }
                self.stats_ref().count_full_body_for_range();
                self.read_prefix_slice(resp, offset, len).await
            }
            416 => {
                return Err(bad(
                    "range not satisfiable (past the end of the blob)".into()
                ))
            }
            _ => {
                return Err(self
                    .error_for(resp, "GET", &format!("{r} blob {d}"), &ep.host)
                    .await)
            }
        };
        match res {
            Ok(b) if b.len() as u64 == len => Ok(b),
            Ok(b) => Err(bad(format!("short read: got {} bytes", b.len()))),
            Err(RegistryError::TooLarge { size, .. }) => Err(bad(format!(
                "server sent more than requested ({size} bytes)"
            ))),
            Err(e) => Err(e),
        }
    }

    /// From a full-body response, keep bytes `[offset, offset+len)` and stop reading after them.
    async fn read_prefix_slice(
        &self,
        mut resp: Response,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, RegistryError> {
        let url = resp.url().to_string();
        let end = offset.saturating_add(len);
        let mut pos: u64 = 0;
        // bounded preallocation: `len` and Content-Length come from callers/servers
        let mut out = Vec::with_capacity(len.min(crate::client::MAX_PREALLOC) as usize);
        while pos < end {
            let Some(chunk) = next_chunk(&mut resp, &url).await? else {
                break;
            };
            self.stats_ref().count_received(chunk.len() as u64);
            let c_start = pos;
            let c_end = pos + chunk.len() as u64;
            let a = offset.max(c_start);
            let b = end.min(c_end);
            if a < b {
                out.extend_from_slice(&chunk[(a - c_start) as usize..(b - c_start) as usize]);
            }
            pos = c_end;
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_headers() {
        assert_eq!(range_header(0, 1).as_deref(), Some("bytes=0-0"));
        assert_eq!(range_header(1000, 100).as_deref(), Some("bytes=1000-1099"));
        assert_eq!(range_header(5, 0), None);
        assert_eq!(range_header(u64::MAX, 2), None);
        assert_eq!(
            range_header(u64::MAX, 1).as_deref(),
            Some(format!("bytes={}-{}", u64::MAX, u64::MAX).as_str())
        );
    }

    #[test]
    fn content_ranges() {
        assert_eq!(
            parse_content_range("bytes 0-99/1000"),
            Some((0, 99, Some(1000)))
        );
        assert_eq!(parse_content_range("bytes 5-5/*"), Some((5, 5, None)));
        assert_eq!(parse_content_range("bytes 9-5/10"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(parse_content_range("bytes */1000"), None);
    }
}
