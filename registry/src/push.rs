//! Uploads: blobs (monolithic POST+PUT, or chunked POST+PATCH…+PUT), cross-repository mounts
//! and manifests. Every blob upload first asks (HEAD) whether the blob is already there.
//!
//! Retries: the upload-starting POST is retried like an idempotent request (a stray session
//! is harmless); a monolithic upload that fails retryably is restarted from the POST. PATCH
//! and the final PUT of a chunked upload are not retried (the input is a stream); rerun the
//! upload. Manifest PUTs are idempotent and retried.

use crate::auth::repo_scope;
use crate::client::{header_str, Client, Req, Target};
use crate::config::{Capability, Endpoint};
use crate::error::RegistryError;
use crate::reference::Reference;
use crate::retry::{next_delay, random_jitter, Outcome};
use crate::stats::Kind;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Method, Response, Url};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};
use weenv_format::Digest;

/// What a blob push did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobPush {
    /// The registry already had the blob (HEAD); nothing was sent.
    AlreadyExists,
    /// Mounted from another repository; nothing was sent.
    Mounted,
    /// Uploaded.
    Uploaded,
}

/// Build the final `PUT` URL: the upload location with `digest=` appended to its query.
pub fn finalize_url(location: &Url, d: &Digest) -> Url {
    let mut u = location.clone();
    u.query_pairs_mut().append_pair("digest", d.as_str());
    u
}

impl Client {
    fn push_scopes(r: &Reference) -> Vec<String> {
        vec![repo_scope(r.repository(), "pull,push")]
    }

    /// POST `/blobs/uploads/<query>` (a new session, or a mount attempt).
    async fn start_upload(
        &self,
        r: &Reference,
        query: &str,
        scopes: Vec<String>,
    ) -> Result<(Response, Endpoint), RegistryError> {
        let mut req = Req::new(
            Method::POST,
            Target::Path(format!("/{}/blobs/uploads/{query}", r.repository())),
            Kind::Post,
            scopes,
        );
        // An explicit empty body sends `Content-Length: 0` (proxies answer 411 without it).
        req.body = Some(Bytes::new());
        req.idempotent = true;
        self.execute(r.registry(), Capability::Push, &req).await
    }

    fn location(resp: &Response, ep: &Endpoint) -> Result<Url, RegistryError> {
        let loc = header_str(resp.headers(), LOCATION.as_str()).ok_or_else(|| {
            RegistryError::Protocol {
                url: resp.url().to_string(),
                detail: format!("HTTP {} without Location header", resp.status()),
            }
        })?;
        let base = Client::url_for(ep, &Target::Path("/".into()))?;
        base.join(loc).map_err(|e| RegistryError::Protocol {
            url: resp.url().to_string(),
            detail: format!("bad Location {loc:?}: {e}"),
        })
    }

    async fn new_session(&self, r: &Reference) -> Result<(Url, Endpoint), RegistryError> {
        let (resp, ep) = self.start_upload(r, "", Self::push_scopes(r)).await?;
        if resp.status().as_u16() != 202 {
            return Err(self
                .error_for(resp, "POST", &format!("{r} upload"), &ep.host)
                .await);
        }
        let loc = Self::location(&resp, &ep)?;
        Ok((loc, ep))
    }

    async fn exists_for_push(&self, r: &Reference, d: &Digest) -> Result<bool, RegistryError> {
        Ok(self.head_blob_cap(r, d, Capability::Push).await?.is_some())
    }

    /// Upload `data` as blob `d` in one PUT (POST, then PUT `?digest=`), unless HEAD finds it.
    pub async fn push_blob(
        &self,
        r: &Reference,
        d: &Digest,
        data: Bytes,
    ) -> Result<BlobPush, RegistryError> {
        let actual = Digest::sha256(&data);
        if actual != *d {
            return Err(RegistryError::DigestMismatch {
                what: "blob to push",
                url: r.to_string(),
                expected: d.to_string(),
                actual: actual.to_string(),
            });
        }
        if self.exists_for_push(r, d).await? {
            return Ok(BlobPush::AlreadyExists);
        }
        self.upload_retrying(r, d, data).await
    }

    /// Monolithic upload, restarted from the POST on retryable failures.
    async fn upload_retrying(
        &self,
        r: &Reference,
        d: &Digest,
        data: Bytes,
    ) -> Result<BlobPush, RegistryError> {
        let mut attempt = 0;
        loop {
            match self.upload_monolithic(r, d, data.clone()).await {
                Ok(()) => return Ok(BlobPush::Uploaded),
                Err(e) => {
                    let outcome = match &e {
                        RegistryError::Transport { .. } => Some(Outcome::Transport),
                        RegistryError::Status { status, .. } => Some(Outcome::Status {
                            status: *status,
                            retry_after: None,
                        }),
                        _ => None,
                    };
                    let delay = outcome.and_then(|o| {
                        next_delay(&self.inner.config.retry, attempt, true, o, random_jitter())
                    });
                    match delay {
                        Some(delay) => {
                            tracing::debug!(blob = %d, error = %e, "restarting upload");
                            self.stats_ref().count_retry();
                            attempt += 1;
                            tokio::time::sleep(delay).await;
                        }
                        None => return Err(e),
                    }
                }
            }
        }
    }

    async fn upload_monolithic(
        &self,
        r: &Reference,
        d: &Digest,
        data: Bytes,
    ) -> Result<(), RegistryError> {
        let (loc, ep) = self.new_session(r).await?;
        let mut put = Req::new(
            Method::PUT,
            Target::Url(finalize_url(&loc, d)),
            Kind::Put,
            Self::push_scopes(r),
        )
        .header(CONTENT_TYPE, "application/octet-stream")?;
        put.body = Some(data);
        let resp = self.execute_on(&ep, &put).await?;
        if resp.status().as_u16() != 201 {
            return Err(self
                .error_for(resp, "PUT", &format!("{r} blob {d}"), &ep.host)
                .await);
        }
        Ok(())
    }

    /// Upload blob `d` from `reader` in chunks of `chunk_size` bytes (POST, PATCH with
    /// `Content-Range` per chunk, PUT `?digest=`), unless HEAD finds it. The content is hashed
    /// while sending; a mismatch with `d` fails before the upload is committed.
    pub async fn push_blob_chunked<R: AsyncRead + Unpin + Send>(
        &self,
        r: &Reference,
        d: &Digest,
        mut reader: R,
        chunk_size: usize,
    ) -> Result<BlobPush, RegistryError> {
        if chunk_size == 0 {
            return Err(RegistryError::BadConfig {
                field: "chunk_size".into(),
                reason: "must be > 0".into(),
            });
        }
        if self.exists_for_push(r, d).await? {
            return Ok(BlobPush::AlreadyExists);
        }
        let (mut loc, ep) = self.new_session(r).await?;
        let mut hasher = Sha256::new();
        let mut offset: u64 = 0;
        loop {
            let mut buf = Vec::with_capacity(chunk_size);
            while buf.len() < chunk_size {
                let n = (&mut reader)
                    .take((chunk_size - buf.len()) as u64)
                    .read_to_end(&mut buf)
                    .await
                    .map_err(|source| RegistryError::Io {
                        context: format!("reading blob {d} for upload"),
                        error: source,
                    })?;
                if n == 0 {
                    break;
                }
            }
            if buf.is_empty() {
                break;
            }
            let n = buf.len() as u64;
            hasher.update(&buf);
            let mut patch = Req::new(
                Method::PATCH,
                Target::Url(loc.clone()),
                Kind::Patch,
                Self::push_scopes(r),
            )
            .header(CONTENT_TYPE, "application/octet-stream")?
            .header(
                reqwest::header::CONTENT_RANGE,
                &format!("{}-{}", offset, offset + n - 1),
            )?;
            patch.body = Some(Bytes::from(buf));
            let resp = self.execute_on(&ep, &patch).await?;
            if resp.status().as_u16() != 202 {
                return Err(self
                    .error_for(
                        resp,
                        "PATCH",
                        &format!("{r} blob {d} chunk at {offset}"),
                        &ep.host,
                    )
                    .await);
            }
            // The registry reports what it has received as `Range: 0-<last>`.
            if let Some(range) = header_str(resp.headers(), "range") {
                let last = range
                    .trim()
                    .split('-')
                    .nth(1)
                    .and_then(|v| v.trim().parse::<u64>().ok());
                if last != Some(offset + n - 1) {
                    return Err(RegistryError::Protocol {
                        url: loc.to_string(),
                        detail: format!(
                            "after a chunk ending at {} the registry reports Range {range:?}",
                            offset + n - 1
                        ),
                    });
                }
            }
            loc = Self::location(&resp, &ep)?;
            offset += n;
            if n < chunk_size as u64 {
                break;
            }
        }
        let actual = Digest::from_sha256_bytes(&hasher.finalize().into());
        if actual != *d {
            return Err(RegistryError::DigestMismatch {
                what: "blob to push (chunked)",
                url: loc.to_string(),
                expected: d.to_string(),
                actual: actual.to_string(),
            });
        }
        let mut put = Req::new(
            Method::PUT,
            Target::Url(finalize_url(&loc, d)),
            Kind::Put,
            Self::push_scopes(r),
        );
        put.body = Some(Bytes::new());
        let resp = self.execute_on(&ep, &put).await?;
        if resp.status().as_u16() != 201 {
            return Err(self
                .error_for(resp, "PUT", &format!("{r} blob {d}"), &ep.host)
                .await);
        }
        Ok(BlobPush::Uploaded)
    }

    /// Ask the registry to mount blob `d` from repository `from_repo` into `target`'s
    /// repository: `true` when mounted (201), `false` when the registry opened an upload
    /// session instead (202; the caller uploads, e.g. with [`Client::push_blob`]).
    pub async fn mount_blob(
        &self,
        target: &Reference,
        from_repo: &str,
        d: &Digest,
    ) -> Result<bool, RegistryError> {
        let q = format!(
            "?mount={}&from={}",
            d,
            from_repo
                .replace('%', "%25")
                .replace('&', "%26")
                .replace('=', "%3D")
        );
        let scopes = vec![
            repo_scope(target.repository(), "pull,push"),
            repo_scope(from_repo, "pull"),
        ];
        let (resp, ep) = self.start_upload(target, &q, scopes).await?;
        match resp.status().as_u16() {
            201 => Ok(true),
            202 => Ok(false),
            _ => Err(self
                .error_for(
                    resp,
                    "POST",
                    &format!("{target} mount {d} from {from_repo}"),
                    &ep.host,
                )
                .await),
        }
    }

    /// Put blob `d` into `target`: skip if present, else mount from `from_repo` if given,
    /// else upload `data` monolithically.
    pub async fn push_blob_or_mount(
        &self,
        target: &Reference,
        from_repo: Option<&str>,
        d: &Digest,
        data: Bytes,
    ) -> Result<BlobPush, RegistryError> {
        if self.exists_for_push(target, d).await? {
            return Ok(BlobPush::AlreadyExists);
        }
        if let Some(from) = from_repo {
            if self.mount_blob(target, from, d).await? {
                return Ok(BlobPush::Mounted);
            }
        }
        let actual = Digest::sha256(&data);
        if actual != *d {
            return Err(RegistryError::DigestMismatch {
                what: "blob to push",
                url: target.to_string(),
                expected: d.to_string(),
                actual: actual.to_string(),
            });
        }
        self.upload_retrying(target, d, data).await
    }

    /// Upload a manifest under `r`'s tag (or digest); returns its digest (checked against the
    /// registry's `Docker-Content-Digest` when sent).
    pub async fn push_manifest(
        &self,
        r: &Reference,
        bytes: Bytes,
        media_type: &str,
    ) -> Result<Digest, RegistryError> {
        let digest = Digest::sha256(&bytes);
        if let Some(want) = r.digest() {
            if *want != digest {
                return Err(RegistryError::DigestMismatch {
                    what: "manifest to push",
                    url: r.to_string(),
                    expected: want.to_string(),
                    actual: digest.to_string(),
                });
            }
        }
        let mut req = Req::new(
            Method::PUT,
            Target::Path(format!(
                "/{}/manifests/{}",
                r.repository(),
                r.manifest_ref()
            )),
            Kind::Put,
            Self::push_scopes(r),
        )
        .header(CONTENT_TYPE, media_type)?;
        req.body = Some(bytes);
        req.idempotent = true;
        let (resp, ep) = self.execute(r.registry(), Capability::Push, &req).await?;
        if resp.status().as_u16() != 201 {
            return Err(self
                .error_for(resp, "PUT", &format!("{r} manifest"), &ep.host)
                .await);
        }
        if let Some(h) = header_str(resp.headers(), "docker-content-digest") {
            if h != digest.as_str() {
                return Err(RegistryError::DigestMismatch {
                    what: "pushed manifest",
                    url: resp.url().to_string(),
                    expected: digest.to_string(),
                    actual: h.to_string(),
                });
            }
        }
        Ok(digest)
    }
}

impl Client {
    /// Delete the manifest `r` names by digest (registries refuse deletes by tag; the
    /// registry must allow deletes, e.g. docker-registry's `storage.delete.enabled`).
    pub async fn delete_manifest(&self, r: &Reference) -> Result<(), RegistryError> {
        let d = r.digest().ok_or_else(|| RegistryError::BadReference {
            input: r.to_string(),
            reason: "deleting a manifest needs a digest reference".into(),
        })?;
        let mut req = Req::new(
            Method::DELETE,
            Target::Path(format!("/{}/manifests/{d}", r.repository())),
            Kind::Delete,
            vec![repo_scope(r.repository(), "delete")],
        );
        req.idempotent = true;
        let (resp, ep) = self.execute(r.registry(), Capability::Push, &req).await?;
        if resp.status().as_u16() != 202 {
            return Err(self
                .error_for(resp, "DELETE", &r.to_string(), &ep.host)
                .await);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalize_url_keeps_state_query() {
        let d = Digest::sha256(b"x");
        let u = Url::parse("http://r:1/v2/a/blobs/uploads/uuid?_state=abc%3D").unwrap();
        let f = finalize_url(&u, &d);
        assert_eq!(
            f.as_str(),
            format!(
                "http://r:1/v2/a/blobs/uploads/uuid?_state=abc%3D&digest=sha256%3A{}",
                d.hex()
            )
        );
        let u = Url::parse("http://r:1/v2/a/blobs/uploads/uuid").unwrap();
        assert!(finalize_url(&u, &d)
            .as_str()
            .ends_with(&format!("uuid?digest=sha256%3A{}", d.hex())));
    }
}
