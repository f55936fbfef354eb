//! The per-task mutation of a plan as a small synthesised layer: the plan's groups' weenv
//! layers are opened over ranged registry reads (TOC first), only the files the patch touches
//! are read, the patch is applied in memory ([`weenv_env::mutation::build_mutation_tar`]) and
//! the tar of the changes is compressed with zstd at a fixed level. Equal groups and patch give
//! the same bytes, hence the same digest (content-addressed; the caller caches it).

use bytes::Bytes;
use thiserror::Error;
use weenv_env::mutation::{build_mutation_tar, MutationError};
use weenv_env::patch::parse_patch;
use weenv_env::plan::{Mutation, ResolvedGroup};
use weenv_env::plan_ref::{MutationLayer, MEDIA_TYPE_MUTATION_LAYER};
use weenv_format::reader::{LayerReader, TocHint};
use weenv_format::Digest;
use weenv_registry::manifest::Descriptor;
use weenv_registry::{BlobRangeReader, Client, Reference};

/// zstd level of synthesised layers (fixed: part of the layer's identity).
pub const ZSTD_LEVEL: i32 = 3;

/// Why a mutation layer could not be built.
#[derive(Debug, Error)]
pub enum SynthError {
    /// The patch does not parse or apply, or a file it names is not in the groups.
    #[error(transparent)]
    Mutation(#[from] MutationError),
    #[error("{0}")]
    Internal(String),
}

/// Builds the mutation layer of `m` with `patch` over `groups` (bottom→top): the layer's
/// descriptor and diff_id, and its compressed bytes.
pub async fn synthesise(
    client: &Client,
    groups: &[ResolvedGroup],
    m: &Mutation,
    patch: &[u8],
) -> Result<(MutationLayer, Bytes), SynthError> {
    let patch = parse_patch(patch, m.strip).map_err(MutationError::from)?;
    let mut layers = Vec::new();
    for g in groups {
        let r: Reference = g
            .reference
            .parse()
            .map_err(|e| SynthError::Internal(format!("group {}: {e}", g.reference)))?;
        for d in &g.manifest.layers {
            layers.push((r.clone(), d.clone()));
        }
    }
    let (client, root) = (client.clone(), m.root.clone());
    let handle = tokio::runtime::Handle::current();
    let tar = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, SynthError> {
        let mut readers = Vec::new();
        for (r, d) in &layers {
            let hint = TocHint::from_annotations(&d.annotations).map_err(|error| {
                MutationError::Layer {
                    path: format!("layer {} of {r}", d.digest),
                    error,
                }
            })?;
            let rr =
                BlobRangeReader::new(client.clone(), handle.clone(), r.clone(), d.digest.clone())
                    .with_size(d.size);
            readers.push(
                LayerReader::open(rr, hint).map_err(|error| MutationError::Layer {
                    path: format!("layer {} of {r}", d.digest),
                    error,
                })?,
            );
        }
        Ok(build_mutation_tar(&readers, &patch, &root)?.0)
    })
    .await
    .map_err(|e| SynthError::Internal(format!("mutation task: {e}")))??;
    let blob = zstd::encode_all(&tar[..], ZSTD_LEVEL)
        .map_err(|e| SynthError::Internal(format!("compressing the mutation layer: {e}")))?;
    let layer = MutationLayer {
        descriptor: Descriptor::new(
            MEDIA_TYPE_MUTATION_LAYER,
            Digest::sha256(&blob),
            blob.len() as u64,
        ),
        diff_id: Digest::sha256(&tar),
    };
    Ok((layer, Bytes::from(blob)))
}
