//! Layer identity on the lazy path: which layer a remote snapshot may be made from. Pure.
//!
//! A chain id is computed by the client from the diff_ids an image config *claims*; nothing
//! on the lazy path proves that claim until every frame of the layer has been fetched and
//! hashed. So a layer known to this node is bound to what it was first exposed as — its blob
//! digest, its TOC digest and the diff_id claimed for it — and a Prepare is served from it
//! only when it names the same: another image naming the same blob with another diff_id or
//! another TOC does not get it lazily (its Prepare takes the ordinary path, where containerd
//! checks the diff_id itself), and neither does any Prepare once the layer is quarantined.

use crate::store::{LayerKind, LayerRecord};
use weenv_format::Digest;

/// Whether known layer `rec` may serve a Prepare whose image claims diff_id `claim` for it
/// and whose manifest names TOC digest `hint_toc` (when it has a TOC hint). `Err` says why
/// not.
pub fn reuse_verdict(
    rec: &LayerRecord,
    claim: &Digest,
    hint_toc: Option<&Digest>,
) -> Result<(), String> {
    if let Some(reason) = &rec.quarantined {
        return Err(format!("the layer is quarantined: {reason}"));
    }
    if !matches!(rec.kind, LayerKind::Weenv { .. }) {
        return Err("not a weenv layer".into());
    }
    if let Some(bound) = &rec.diff_id {
        if bound != claim.as_str() {
            return Err(format!(
                "this image claims diff_id {claim} for it, the image it was first exposed for \
                 claimed {bound}"
            ));
        }
    }
    if let (Some(bound), Some(hint)) = (&rec.toc_digest, hint_toc) {
        if bound != hint.as_str() {
            return Err(format!(
                "this image's manifest names TOC {hint}, the layer's TOC is {bound}"
            ));
        }
    }
    Ok(())
}

/// Whether the diff_id `claim` (from the image config) is the one chain id `target` (from the
/// Prepare labels) was computed from, given the parent's chain id (`None` for a base layer).
/// A disagreement means the labels and the config the daemon read are not of one image.
pub fn claim_fits_target(parent_chain: Option<&str>, claim: &Digest, target: &str) -> bool {
    weenv_registry::manifest::chain_id(parent_chain, claim.as_str()) == target
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(diff_id: Option<&Digest>, toc: Option<&Digest>) -> LayerRecord {
        LayerRecord {
            digest: "sha256:l".into(),
            reference: "r/x:1".into(),
            size: 5,
            kind: LayerKind::Weenv {
                toc_path: "/t".into(),
            },
            toc_digest: toc.map(|d| d.to_string()),
            diff_id: diff_id.map(|d| d.to_string()),
            verified: false,
            quarantined: None,
        }
    }

    #[test]
    fn only_the_same_claim_and_toc_reuse_a_layer() {
        let (good, evil) = (Digest::sha256(b"good"), Digest::sha256(b"evil"));
        let (t1, t2) = (Digest::sha256(b"toc1"), Digest::sha256(b"toc2"));
        let r = rec(Some(&good), Some(&t1));
        assert!(reuse_verdict(&r, &good, Some(&t1)).is_ok());
        assert!(reuse_verdict(&r, &good, None).is_ok());
        assert!(reuse_verdict(&r, &evil, Some(&t1)).is_err());
        assert!(reuse_verdict(&r, &good, Some(&t2)).is_err());
        // a record of an older daemon (no claim) adopts the first one
        assert!(reuse_verdict(&rec(None, None), &evil, Some(&t2)).is_ok());
        let mut q = rec(Some(&good), Some(&t1));
        q.quarantined = Some("diff_id mismatch".into());
        assert!(reuse_verdict(&q, &good, Some(&t1))
            .unwrap_err()
            .contains("quarantined"));
        let n = LayerRecord::not_weenv("sha256:l".into(), "r".into());
        assert!(reuse_verdict(&n, &good, None).is_err());
    }

    #[test]
    fn claims_must_fit_the_chain() {
        let (a, b) = (Digest::sha256(b"a"), Digest::sha256(b"b"));
        assert!(claim_fits_target(None, &a, a.as_str()));
        assert!(!claim_fits_target(None, &a, b.as_str()));
        let chain = weenv_registry::manifest::chain_ids(&[a.to_string(), b.to_string()]);
        assert!(claim_fits_target(Some(&chain[0]), &b, &chain[1]));
        assert!(!claim_fits_target(Some(&chain[0]), &a, &chain[1]));
    }
}
