//! Reports of the converter's commands and their plain-text tables (pure formatting).

use serde::Serialize;
use std::fmt::Write;

/// What happened to one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerAction {
    /// Converted to a weenv layer.
    Converted,
    /// Already a weenv layer: copied/mounted unchanged.
    Passthrough,
    /// A tar that stock containerd unpacks but the weenv format cannot represent (duplicate
    /// entries, a hardlink to a lower layer, GNU sparse files): kept as an ordinary layer,
    /// unpacked the ordinary way; [`LayerReport::note`] says why.
    Plain,
}

/// One converted layer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerReport {
    pub index: usize,
    pub action: LayerAction,
    pub source_digest: String,
    pub source_media_type: String,
    pub source_size: u64,
    /// Uncompressed tar size (0 when passed through).
    pub tar_size: u64,
    pub digest: String,
    pub size: u64,
    /// TOC entries (0 when passed through).
    pub entries: u64,
    pub frames: u64,
    pub seconds: f64,
    /// Why the layer was kept as an ordinary layer ([`LayerAction::Plain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One converted image manifest (one platform).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ManifestReport {
    /// `os/arch[/variant]`, or `None` for a single-manifest source.
    pub platform: Option<String>,
    pub source_digest: String,
    pub digest: String,
    pub layers: Vec<LayerReport>,
}

/// A whole conversion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ImageReport {
    pub source: String,
    pub destination: String,
    /// Digest of what was written under the destination tag (manifest or index).
    pub digest: String,
    pub media_type: String,
    pub manifests: Vec<ManifestReport>,
    pub seconds: f64,
}

/// Human size (binary units, one decimal).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn short(d: &str) -> &str {
    let hex = d.strip_prefix("sha256:").unwrap_or(d);
    &hex[..hex.len().min(12)]
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.3}", a as f64 / b as f64)
    }
}

/// The per-layer table of a conversion, with totals.
pub fn image_table(r: &ImageReport) -> String {
    let mut s = String::new();
    for m in &r.manifests {
        if let Some(p) = &m.platform {
            let _ = writeln!(
                s,
                "platform {p}: {} -> {}",
                short(&m.source_digest),
                short(&m.digest)
            );
        }
        let _ = writeln!(
            s,
            "{:>3}  {:<12}  {:>10}  {:>10}  {:>10}  {:>7}  {:>7}  {:>8}  {:>7}  action",
            "#", "source", "orig", "tar", "weenv", "ratio", "vs tar", "entries", "time"
        );
        let (mut o, mut t, mut w, mut secs) = (0u64, 0u64, 0u64, 0f64);
        for l in &m.layers {
            o += l.source_size;
            t += l.tar_size;
            w += l.size;
            secs += l.seconds;
            let _ = writeln!(
                s,
                "{:>3}  {:<12}  {:>10}  {:>10}  {:>10}  {:>7}  {:>7}  {:>8}  {:>6.2}s  {}",
                l.index,
                short(&l.source_digest),
                human(l.source_size),
                if l.tar_size > 0 {
                    human(l.tar_size)
                } else {
                    "-".into()
                },
                human(l.size),
                ratio(l.size, l.source_size),
                ratio(l.size, l.tar_size),
                l.entries,
                l.seconds,
                match l.action {
                    LayerAction::Converted => "converted",
                    LayerAction::Passthrough => "passthrough",
                    LayerAction::Plain => "kept plain",
                }
            );
        }
        let _ = writeln!(
            s,
            "{:>3}  {:<12}  {:>10}  {:>10}  {:>10}  {:>7}  {:>7}  {:>8}  {:>6.2}s",
            "",
            "total",
            human(o),
            human(t),
            human(w),
            ratio(w, o),
            ratio(w, t),
            "",
            secs
        );
    }
    let _ = writeln!(
        s,
        "wrote {} {} ({}) in {:.2}s",
        r.destination, r.digest, r.media_type, r.seconds
    );
    s
}

/// Plain-text report of [`crate::prefetch::apply_profile`].
pub fn profile_table(r: &crate::prefetch::ProfileReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let short = |d: &str| d[..d.len().min(19)].to_string();
    for m in &r.manifests {
        let _ = writeln!(
            s,
            "{}manifest {} -> {}{}",
            m.platform
                .as_deref()
                .map(|p| format!("{p} "))
                .unwrap_or_default(),
            short(&m.source_digest),
            short(&m.digest),
            if m.digest == m.source_digest {
                " (unchanged)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "{:>3}  {:<19}  {:<6}  {:>6}  {:>15}  {:>10}  {:>10}",
            "#", "digest", "kind", "files", "frames", "prefetch", "layer"
        );
        for l in &m.layers {
            let _ = writeln!(
                s,
                "{:>3}  {:<19}  {:<6}  {:>6}  {:>15}  {:>10}  {:>10}",
                l.index,
                short(&l.digest),
                if l.weenv { "weenv" } else { "other" },
                l.files,
                format!("{}/{}", l.frames, l.layer_frames),
                human(l.bytes),
                human(l.size),
            );
        }
        let resolved = r.paths - m.unresolved.len();
        let _ = writeln!(
            s,
            "{resolved}/{} paths resolved ({} of files), prefetch {} compressed; blobs: {} present, {} mounted, {} copied",
            r.paths,
            human(m.file_bytes),
            human(m.bytes()),
            m.blobs.existing,
            m.blobs.mounted,
            m.blobs.written,
        );
        if !m.unresolved.is_empty() {
            let _ = writeln!(
                s,
                "unresolved ({}: absent, deleted, or not a regular file):",
                m.unresolved.len()
            );
            for p in m.unresolved.iter().take(20) {
                let _ = writeln!(s, "    {p}");
            }
            if m.unresolved.len() > 20 {
                let _ = writeln!(
                    s,
                    "    ... {} more (--json lists all)",
                    m.unresolved.len() - 20
                );
            }
        }
    }
    let resolved: usize = r
        .manifests
        .iter()
        .map(|m| r.paths - m.unresolved.len())
        .max()
        .unwrap_or(0);
    let frames: usize = r
        .manifests
        .iter()
        .flat_map(|m| &m.layers)
        .map(|l| l.frames)
        .sum();
    let bytes: u64 = r.manifests.iter().map(|m| m.bytes()).sum();
    let _ = writeln!(
        s,
        "wrote {} {}: {resolved}/{} paths, prefetch {frames} frames, {} compressed",
        r.destination,
        r.digest,
        r.paths,
        human(bytes)
    );
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(5 << 20), "5.0 MiB");
    }

    #[test]
    fn table_has_totals_and_ratios() {
        let l = LayerReport {
            index: 0,
            action: LayerAction::Converted,
            source_digest: format!("sha256:{}", "a".repeat(64)),
            source_media_type: "gzip".into(),
            source_size: 1000,
            tar_size: 4000,
            digest: format!("sha256:{}", "b".repeat(64)),
            size: 900,
            entries: 7,
            frames: 3,
            seconds: 0.5,
            note: None,
        };
        let r = ImageReport {
            source: "src".into(),
            destination: "dst".into(),
            digest: "sha256:cc".into(),
            media_type: "m".into(),
            manifests: vec![ManifestReport {
                platform: None,
                source_digest: "sha256:dd".into(),
                digest: "sha256:ee".into(),
                layers: vec![l.clone(), LayerReport { index: 1, ..l }],
            }],
            seconds: 1.0,
        };
        let t = image_table(&r);
        assert!(t.contains("aaaaaaaaaaaa"), "{t}");
        assert!(t.contains("0.900"), "{t}");
        assert!(t.contains("0.225"), "{t}");
        assert!(t.contains("total"), "{t}");
        assert!(t.contains("1.00s"), "{t}");
    }
}
