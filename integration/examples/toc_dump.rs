//! Print a weenv layer blob's TOC as JSON lines (one per entry: path, kind, size, and the
//! frames holding it with their compressed offsets), for analysing access traces against the
//! layout: `cargo run -q -p weenv-integration --example toc_dump -- BLOB...`.
use anyhow::Context;
use weenv_format::LayerReader;

fn main() -> anyhow::Result<()> {
    for path in std::env::args().skip(1) {
        let f = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        let r = LayerReader::open(f, None).with_context(|| format!("reading the TOC of {path}"))?;
        let toc = r.toc();
        for e in &toc.entries {
            let frames: Vec<_> = e
                .chunks
                .iter()
                .map(|c| c.frame.0)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter_map(|i| {
                    toc.frames
                        .get(i as usize)
                        .map(|f| serde_json::json!([i, f.offset, f.clen, f.ulen]))
                })
                .collect();
            let line = serde_json::json!({
                "blob": path, "path": e.path, "kind": format!("{:?}", e.kind),
                "size": e.size, "frames": frames,
            });
            println!("{line}");
        }
    }
    Ok(())
}
