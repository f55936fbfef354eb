//! Manifest operations: resolve a reference (HEAD, falling back to GET), fetch and verify a
//! manifest, and follow an index to the image manifest of a platform.

use crate::auth::repo_scope;
use crate::client::{header_content_length, header_str, Client, Req, Target};
use crate::config::Capability;
use crate::error::RegistryError;
use crate::manifest::{
    select_platform, Descriptor, ImageManifest, Manifest, MANIFEST_ACCEPT, MAX_MANIFEST_SIZE,
};
use crate::reference::Reference;
use crate::stats::Kind;
use bytes::Bytes;
use reqwest::header::ACCEPT;
use reqwest::Method;
use weenv_format::Digest;

/// A fetched manifest: its exact bytes, media type and verified digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestBlob {
    pub digest: Digest,
    pub media_type: String,
    pub bytes: Bytes,
}

impl ManifestBlob {
    /// Parse as an image manifest or index.
    pub fn parse(&self) -> Result<Manifest, RegistryError> {
        Manifest::parse(&self.media_type, &self.bytes).map_err(|e| match e {
            RegistryError::BadManifest { detail, .. } => RegistryError::BadManifest {
                reference: self.digest.to_string(),
                detail,
            },
            e => e,
        })
    }

    /// Descriptor of this manifest.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor::new(
            &self.media_type,
            self.digest.clone(),
            self.bytes.len() as u64,
        )
    }
}

fn content_type(h: &reqwest::header::HeaderMap) -> String {
    header_str(h, "content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

impl Client {
    fn manifest_req(&self, r: &Reference, method: Method) -> Result<Req, RegistryError> {
        let kind = if method == Method::HEAD {
            Kind::Head
        } else {
            Kind::Get
        };
        Req::new(
            method,
            Target::Path(format!(
                "/{}/manifests/{}",
                r.repository(),
                r.manifest_ref()
            )),
            kind,
            vec![repo_scope(r.repository(), "pull")],
        )
        .header(ACCEPT, MANIFEST_ACCEPT)
    }

    fn manifest_cap(r: &Reference) -> Capability {
        if r.digest().is_some() {
            Capability::Pull
        } else {
            Capability::Resolve
        }
    }

    /// Resolve `r` to the descriptor (digest, media type, size) of its manifest: one HEAD when
    /// the registry sends `Docker-Content-Digest`, else a GET whose body is hashed.
    pub async fn resolve(&self, r: &Reference) -> Result<Descriptor, RegistryError> {
        let req = self.manifest_req(r, Method::HEAD)?;
        let (resp, ep) = self
            .execute(r.registry(), Self::manifest_cap(r), &req)
            .await?;
        if resp.status().is_success() {
            let h = resp.headers();
            let digest =
                header_str(h, "docker-content-digest").and_then(|d| d.parse::<Digest>().ok());
            let mt = content_type(h);
            let size = header_content_length(h);
            if let (Some(digest), Some(size), false) = (digest, size, mt.is_empty()) {
                if let Some(want) = r.digest() {
                    if *want != digest {
                        return Err(RegistryError::DigestMismatch {
                            what: "manifest (HEAD)",
                            url: resp.url().to_string(),
                            expected: want.to_string(),
                            actual: digest.to_string(),
                        });
                    }
                }
                return Ok(Descriptor::new(&mt, digest, size));
            }
            tracing::debug!(reference = %r, "HEAD lacks digest/type/length, falling back to GET");
        } else if resp.status().as_u16() != 405 && !resp.status().is_server_error() {
            return Err(self.error_for(resp, "HEAD", &r.to_string(), &ep.host).await);
        }
        Ok(self.get_manifest(r).await?.descriptor())
    }

    /// Fetch the manifest of `r`, verifying its digest (against the reference's digest, or
    /// against `Docker-Content-Digest` when fetching by tag).
    pub async fn get_manifest(&self, r: &Reference) -> Result<ManifestBlob, RegistryError> {
        let req = self.manifest_req(r, Method::GET)?;
        let (resp, ep) = self
            .execute(r.registry(), Self::manifest_cap(r), &req)
            .await?;
        if !resp.status().is_success() {
            return Err(self.error_for(resp, "GET", &r.to_string(), &ep.host).await);
        }
        let url = resp.url().to_string();
        let mt = content_type(resp.headers());
        let header_digest = header_str(resp.headers(), "docker-content-digest").map(str::to_string);
        let bytes = self.read_body(resp, MAX_MANIFEST_SIZE).await?;
        let actual = Digest::sha256(&bytes);
        let expected = r.digest().map(|d| d.to_string()).or(header_digest);
        if let Some(expected) = expected {
            if expected != actual.as_str() {
                return Err(RegistryError::DigestMismatch {
                    what: "manifest",
                    url,
                    expected,
                    actual: actual.to_string(),
                });
            }
        }
        let media_type = if mt.is_empty() || mt == "application/json" || mt == "text/plain" {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| {
                    v.get("mediaType")
                        .and_then(|m| m.as_str())
                        .map(str::to_string)
                })
                .unwrap_or(mt)
        } else {
            mt
        };
        Ok(ManifestBlob {
            digest: actual,
            media_type,
            bytes,
        })
    }

    /// Fetch the image manifest of `r` for (os, arch, variant), following an index if `r`
    /// names one. Returns the manifest and its bytes/digest.
    pub async fn get_image_manifest(
        &self,
        r: &Reference,
        os: &str,
        arch: &str,
        variant: Option<&str>,
    ) -> Result<(ImageManifest, ManifestBlob), RegistryError> {
        let blob = self.get_manifest(r).await?;
        match blob.parse()? {
            Manifest::Image(m) => Ok((m, blob)),
            Manifest::Index(ix) => {
                let d = select_platform(&ix, os, arch, variant).ok_or_else(|| {
                    RegistryError::BadManifest {
                        reference: r.to_string(),
                        detail: format!(
                            "index has no manifest for {os}/{arch}{}",
                            variant.map(|v| format!("/{v}")).unwrap_or_default()
                        ),
                    }
                })?;
                let child = self.get_manifest(&r.with_digest(d.digest.clone())).await?;
                match child.parse()? {
                    Manifest::Image(m) => Ok((m, child)),
                    Manifest::Index(_) => Err(RegistryError::BadManifest {
                        reference: r.to_string(),
                        detail: "nested index for a platform".into(),
                    }),
                }
            }
        }
    }
}
