//! [`RegistryLayerSource`]: a [`BlobSource`] reading one layer blob with ranged GETs through
//! `weenv_registry::Client` (mirrors, auth, retries are the client's business).

use crate::fetch::{BlobSource, FetchError};
use async_trait::async_trait;
use bytes::Bytes;
use weenv_format::Digest;
use weenv_registry::{Client, Reference};

/// One layer blob in a registry repository.
pub struct RegistryLayerSource {
    client: Client,
    reference: Reference,
    digest: Digest,
    size: u64,
}

impl RegistryLayerSource {
    pub fn new(client: Client, reference: Reference, digest: Digest, size: u64) -> Self {
        Self {
            client,
            reference,
            digest,
            size,
        }
    }
}

#[async_trait]
impl BlobSource for RegistryLayerSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Bytes, FetchError> {
        let b = self
            .client
            .get_blob_range(&self.reference, &self.digest, offset, len)
            .await
            .map_err(|e| FetchError::Source {
                source_name: self.name(),
                offset,
                len,
                reason: e.to_string(),
            })?;
        if b.len() as u64 != len {
            return Err(FetchError::ShortRead {
                source_name: self.name(),
                offset,
                expected: len,
                actual: b.len() as u64,
            });
        }
        Ok(b)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        format!(
            "{}/{}@{}",
            self.reference.registry(),
            self.reference.repository(),
            self.digest
        )
    }
}
