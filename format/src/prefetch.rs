//! Start-up prefetch profiles: which frames of each layer an image reads when it starts.
//!
//! A profile belongs to an *image* (a layer is shared by many images, each starting a
//! different program), so it lives in the image manifest, not in the layer blob: each weenv
//! layer descriptor may carry [`ANNOTATION_PREFETCH`], the frames of that layer to fetch as
//! soon as the layer is mounted, in the order the workload first needed them, as index runs
//! (`"9-12,0-3,7"`). Adding or changing a profile rewrites only the manifest; no layer byte
//! changes.
//!
//! A profile is text, one file per line, in first-read order, as `weenv profile` records it:
//! `PATH` (the whole file) or `PATH<TAB>OFFSET+LENGTH,OFFSET+LENGTH...` (only those byte ranges
//! of it, e.g. the pages of a large binary a program start touches). It is resolved here
//! against the image's TOCs the way overlayfs merges the layers: the topmost
//! layer holding a path provides it, whiteouts and opaque directories hide lower layers,
//! symlinks (in any component) are followed through the merged view and hardlinks resolve to
//! their target's payload. Everything here is pure.

use crate::toc::{Entry, EntryKind, FrameIdx, Toc};
use crate::FormatError;
use std::collections::HashMap;

/// Layer-descriptor annotation: frames to prefetch at mount, as sorted ranges `a-b,c,...`.
pub const ANNOTATION_PREFETCH: &str = "io.weenv.prefetch.frames";
/// Longest annotation value a reader accepts (bytes).
pub const MAX_PREFETCH_ANNOTATION: usize = 256 << 10;
/// Symlinks followed while resolving one path (as Linux's `MAXSYMLINKS`).
const MAX_SYMLINK_HOPS: usize = 40;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

fn bad(reason: impl Into<String>) -> FormatError {
    FormatError::TocDecode {
        reason: format!("{ANNOTATION_PREFETCH} annotation: {}", reason.into()),
    }
}

/// Encodes `frames` in their order (duplicates dropped, first wins) as index runs: ascending
/// consecutive indices become `a-b`: `[9,10,11,12,0,1,2,3,7]` -> `"9-12,0-3,7"`.
pub fn encode_frames(frames: &[FrameIdx]) -> String {
    let mut seen = std::collections::HashSet::new();
    let order: Vec<u32> = frames
        .iter()
        .map(|f| f.0)
        .filter(|f| seen.insert(*f))
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i < order.len() {
        let start = order[i];
        let mut end = start;
        while i + 1 < order.len() && end.checked_add(1) == Some(order[i + 1]) {
            end += 1;
            i += 1;
        }
        i += 1;
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
    }
    out
}

/// Decodes an annotation value into frame indices in annotation order (duplicates dropped,
/// first wins), each below `frame_count` (the layer's TOC). Malformed, out-of-range or oversized values are errors:
/// callers log them and mount without a prefetch.
pub fn decode_frames(value: &str, frame_count: usize) -> Result<Vec<FrameIdx>, FormatError> {
    if value.len() > MAX_PREFETCH_ANNOTATION {
        return Err(FormatError::AbsurdSize {
            what: "prefetch annotation",
            value: value.len() as u64,
            limit: MAX_PREFETCH_ANNOTATION as u64,
        });
    }
    let num = |s: &str| -> Result<u32, FormatError> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("{s:?} is not a frame index")));
        }
        let n: u32 = s
            .parse()
            .map_err(|_| bad(format!("{s:?} is not a frame index")))?;
        if n as usize >= frame_count {
            return Err(bad(format!(
                "frame {n} is past the layer's {frame_count} frames (profile of another layer?)"
            )));
        }
        Ok(n)
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for part in value.split(',').filter(|p| !p.trim().is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(part)?;
                (n, n)
            }
        };
        if a > b {
            return Err(bad(format!("range {part:?} is descending")));
        }
        out.extend((a..=b).filter(|f| seen.insert(*f)).map(FrameIdx));
    }
    Ok(out)
}

/// Parses a profile file into its entry lines: one file per line (path absolute or relative
/// to the image root, optionally followed by a TAB and byte ranges, see the module doc);
/// blank lines and lines starting with `#` are skipped; duplicate lines are dropped, first one
/// wins. Lines are resolved by [`resolve_profile`].
pub fn parse_profile(text: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .map(|l| l.trim_matches(|c: char| c == ' ' || c == '\r'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| seen.insert(l.to_string()))
        .map(str::to_string)
        .collect()
}

/// One profile line: a path and the byte ranges read (empty: the whole file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileLine {
    pub path: String,
    /// `(offset, length)` pairs.
    pub ranges: Vec<(u64, u64)>,
}

impl ProfileLine {
    /// Parses `PATH` or `PATH<TAB>OFF+LEN,OFF+LEN...`. Malformed ranges are an error naming
    /// the line.
    pub fn parse(line: &str) -> Result<ProfileLine, String> {
        let (path, ranges) = match line.split_once('\t') {
            None => (line, ""),
            Some((p, r)) => (p, r.trim()),
        };
        let mut out = Vec::new();
        for part in ranges.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let parsed = part.split_once('+').and_then(|(o, l)| {
                Some((o.trim().parse::<u64>().ok()?, l.trim().parse::<u64>().ok()?))
            });
            match parsed {
                Some(r) => out.push(r),
                None => {
                    return Err(format!(
                        "profile line {line:?}: range {part:?} is not OFFSET+LENGTH"
                    ))
                }
            }
        }
        Ok(ProfileLine {
            path: path.to_string(),
            ranges: out,
        })
    }

    /// The profile text of this line (inverse of [`ProfileLine::parse`]).
    pub fn render(&self) -> String {
        if self.ranges.is_empty() {
            return self.path.clone();
        }
        let r: Vec<String> = self
            .ranges
            .iter()
            .map(|(o, l)| format!("{o}+{l}"))
            .collect();
        format!("{}\t{}", self.path, r.join(","))
    }
}

/// What [`resolve_profile`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Per layer (same order as the input, bottom first): frames to prefetch, in the order
    /// the profile first needs them.
    pub frames: Vec<Vec<FrameIdx>>,
    /// Per layer: profile files that layer provides.
    pub files: Vec<usize>,
    /// Uncompressed payload bytes of the resolved files (all layers; the listed ranges for
    /// lines with ranges).
    pub file_bytes: u64,
    /// Profile lines that name no regular file in the merged view (absent, deleted by a
    /// whiteout, a directory, a device, a symlink loop, or malformed ranges).
    pub unresolved: Vec<String>,
}

impl Resolved {
    /// Compressed bytes of the frames to prefetch, given the layers' TOCs.
    pub fn compressed_bytes(&self, tocs: &[&Toc]) -> u64 {
        self.frames
            .iter()
            .zip(tocs)
            .flat_map(|(fs, t)| fs.iter().filter_map(|f| t.frame(*f)).map(|f| f.clen))
            .sum()
    }
}

/// The merged view of an image's layers (bottom first), for path lookups.
struct Merged<'a> {
    tocs: &'a [&'a Toc],
    index: Vec<HashMap<&'a str, usize>>,
}

enum Found<'a> {
    Entry(usize, &'a Entry),
    Absent,
}

impl<'a> Merged<'a> {
    fn new(tocs: &'a [&'a Toc]) -> Self {
        let index = tocs.iter().map(|t| t.index()).collect();
        Merged { tocs, index }
    }

    fn has(&self, layer: usize, path: &str) -> bool {
        self.index[layer].contains_key(path)
    }

    /// The entry visible at normalised `path` ("" = root), topmost layer first.
    fn lookup(&self, path: &str) -> Found<'a> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", path),
        };
        if name.starts_with(WHITEOUT_PREFIX) {
            return Found::Absent; // whiteout files are not part of the merged view
        }
        for layer in (0..self.tocs.len()).rev() {
            if let Some(&i) = self.index[layer].get(path) {
                return Found::Entry(layer, &self.tocs[layer].entries[i]);
            }
            let join = |dir: &str, n: &str| {
                if dir.is_empty() {
                    n.to_string()
                } else {
                    format!("{dir}/{n}")
                }
            };
            if self.has(layer, &join(parent, &format!("{WHITEOUT_PREFIX}{name}"))) {
                return Found::Absent;
            }
            // An ancestor deleted or made opaque in this layer hides every lower layer.
            let mut hidden = false;
            let mut dir = parent;
            loop {
                if self.has(layer, &join(dir, OPAQUE_MARKER)) {
                    hidden = true;
                }
                if dir.is_empty() {
                    break;
                }
                let (up, n) = dir.rsplit_once('/').unwrap_or(("", dir));
                if self.has(layer, &join(up, &format!("{WHITEOUT_PREFIX}{n}"))) {
                    return Found::Absent;
                }
                dir = up;
            }
            if hidden {
                return Found::Absent;
            }
        }
        Found::Absent
    }

    /// Resolves `path` (any form) to a regular file: (layer, entry with the payload).
    fn resolve_file(&self, path: &str) -> Option<(usize, &'a Entry)> {
        let mut pending: Vec<String> = components(path).into_iter().rev().collect();
        let mut cur: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(comp) = pending.pop() {
            match comp.as_str() {
                "." => continue,
                ".." => {
                    cur.pop();
                    continue;
                }
                _ => {}
            }
            cur.push(comp);
            let p = cur.join("/");
            let Found::Entry(layer, e) = self.lookup(&p) else {
                return None;
            };
            match e.kind {
                EntryKind::Symlink => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return None;
                    }
                    let target = e.link.as_deref().unwrap_or("");
                    cur.pop();
                    if target.starts_with('/') {
                        cur.clear();
                    }
                    pending.extend(components(target).into_iter().rev());
                }
                EntryKind::Dir => {}
                EntryKind::File | EntryKind::Hardlink if pending.is_empty() => {
                    return match e.kind {
                        EntryKind::File => Some((layer, e)),
                        _ => {
                            let t = e.link.as_deref()?;
                            let i = *self.index[layer].get(t)?;
                            let target = &self.tocs[layer].entries[i];
                            (target.kind == EntryKind::File).then_some((layer, target))
                        }
                    };
                }
                _ => return None,
            }
        }
        None
    }
}

fn components(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

/// Resolves profile lines (see [`parse_profile`]) against an image's layers (`tocs`, bottom
/// first) as overlayfs merges them, and returns the frames each layer must prefetch, in
/// first-need order.
pub fn resolve_profile(tocs: &[&Toc], lines: &[String]) -> Resolved {
    let merged = Merged::new(tocs);
    let mut order: Vec<Vec<FrameIdx>> = vec![Vec::new(); tocs.len()];
    let mut have: Vec<std::collections::HashSet<FrameIdx>> =
        vec![std::collections::HashSet::new(); tocs.len()];
    let mut res = Resolved {
        files: vec![0; tocs.len()],
        ..Resolved::default()
    };
    let mut seen = std::collections::HashSet::new();
    let mut counted = std::collections::HashSet::new();
    for line in lines {
        let Ok(pl) = ProfileLine::parse(line) else {
            res.unresolved.push(line.clone());
            continue;
        };
        let Some((layer, e)) = merged.resolve_file(&pl.path) else {
            res.unresolved.push(pl.path.clone());
            continue;
        };
        if seen.insert((layer, e.path.as_str())) {
            res.files[layer] += 1;
        }
        let ranges = if pl.ranges.is_empty() {
            vec![(0, e.size)]
        } else {
            pl.ranges.clone()
        };
        for (off, len) in ranges {
            for c in e.chunks_in(off, len) {
                if counted.insert((layer, e.path.as_str(), c.file_offset)) {
                    res.file_bytes += c.len;
                }
                if have[layer].insert(c.frame) {
                    order[layer].push(c.frame);
                }
            }
        }
    }
    res.frames = order;
    res
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn f(v: &[u32]) -> Vec<FrameIdx> {
        v.iter().copied().map(FrameIdx).collect()
    }

    #[test]
    fn ranges_round_trip() {
        assert_eq!(encode_frames(&f(&[])), "");
        assert_eq!(
            encode_frames(&f(&[9, 10, 11, 12, 0, 1, 2, 3, 7, 3, 10])),
            "9-12,0-3,7"
        );
        assert_eq!(
            decode_frames("9-12,0-3,7", 13).unwrap(),
            f(&[9, 10, 11, 12, 0, 1, 2, 3, 7])
        );
        assert_eq!(
            decode_frames("0-3,2-5", 13).unwrap(),
            f(&[0, 1, 2, 3, 4, 5])
        );
        assert_eq!(decode_frames("", 0).unwrap(), f(&[]));
        assert_eq!(decode_frames(" 5 , 1-2 ", 6).unwrap(), f(&[5, 1, 2]));
    }

    #[test]
    fn bad_annotations_are_errors() {
        for v in [
            "x",
            "1-",
            "-1",
            "3-1",
            "1--2",
            "1,13",
            "0-13",
            "+1",
            "99999999999",
        ] {
            assert!(decode_frames(v, 13).is_err(), "{v:?} accepted");
        }
        let long = "1,".repeat(MAX_PREFETCH_ANNOTATION);
        assert!(matches!(
            decode_frames(&long, 13),
            Err(FormatError::AbsurdSize { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn encode_decode_keeps_first_order(v in proptest::collection::vec(0u32..200, 0..100)) {
            let enc = encode_frames(&f(&v));
            let mut seen = std::collections::HashSet::new();
            let want: Vec<u32> = v.iter().copied().filter(|x| seen.insert(*x)).collect();
            proptest::prop_assert_eq!(decode_frames(&enc, 200).unwrap(), f(&want));
        }
    }

    #[test]
    fn profile_lines_with_ranges() {
        let l = ProfileLine::parse("/usr/bin/python3.11\t0+4096,1048576+2097152").unwrap();
        assert_eq!(l.path, "/usr/bin/python3.11");
        assert_eq!(l.ranges, vec![(0, 4096), (1048576, 2097152)]);
        assert_eq!(ProfileLine::parse(&l.render()).unwrap(), l);
        let whole = ProfileLine::parse("/etc/x y").unwrap();
        assert_eq!((whole.path.as_str(), whole.ranges.len()), ("/etc/x y", 0));
        assert_eq!(whole.render(), "/etc/x y");
        assert!(ProfileLine::parse("/a\t1-2").is_err());
        assert!(ProfileLine::parse("/a\t1+").is_err());
    }

    #[test]
    fn profile_parsing() {
        let p = parse_profile("# python\n/usr/bin/python3\n\n  usr/lib/x \n/usr/bin/python3\n");
        assert_eq!(p, vec!["/usr/bin/python3", "usr/lib/x"]);
    }

    /// A TOC from (path, kind, link, frames of the payload).
    fn toc(entries: &[(&str, EntryKind, Option<&str>, &[u32])]) -> Toc {
        let max = entries
            .iter()
            .flat_map(|e| e.3.iter().copied())
            .max()
            .map_or(0, |m| m + 1);
        Toc {
            version: 1,
            frames: crate::testdata::frames(max, 10, 100),
            entries: entries
                .iter()
                .map(|(p, k, l, fr)| Entry {
                    kind: *k,
                    link: l.map(str::to_string),
                    ..crate::testdata::chunked_file(p, fr, 100)
                })
                .collect(),
        }
    }

    use EntryKind::{Dir, File, Hardlink, Symlink};

    #[test]
    fn merged_view_resolution() {
        // bottom: merged-usr Debian layout
        let base = toc(&[
            ("", Dir, None, &[]),
            ("usr", Dir, None, &[]),
            ("usr/lib", Dir, None, &[]),
            ("lib", Symlink, Some("usr/lib"), &[]),
            ("usr/lib/libc.so", File, None, &[0, 1]),
            ("usr/lib/old", File, None, &[2]),
            ("usr/lib/hl", Hardlink, Some("usr/lib/libc.so"), &[]),
            ("usr/bin", Dir, None, &[]),
            ("usr/bin/python3.11", File, None, &[3]),
            ("usr/bin/python3", Symlink, Some("python3.11"), &[]),
            ("etc", Dir, None, &[]),
            ("etc/conf", File, None, &[4]),
            ("etc/gone", File, None, &[5]),
            ("loop", Symlink, Some("/loop"), &[]),
        ]);
        // top: replaces python3.11, deletes old and etc/gone, makes etc opaque
        let top = toc(&[
            ("usr", Dir, None, &[]),
            ("usr/bin", Dir, None, &[]),
            ("usr/bin/python3.11", File, None, &[0]),
            ("usr/lib", Dir, None, &[]),
            ("usr/lib/.wh.old", File, None, &[]),
            ("etc", Dir, None, &[]),
            ("etc/.wh..wh..opq", File, None, &[]),
            ("etc/new", File, None, &[1]),
        ]);
        let tocs = [&base, &top];
        let paths: Vec<String> = [
            "/lib/libc.so",              // symlinked dir -> base 0,1
            "/usr/bin/python3",          // symlink -> top's python3.11 (frame 0 of top)
            "usr/lib/hl",                // hardlink -> libc.so, already counted
            "/usr/lib/old",              // whiteout
            "/etc/conf",                 // hidden by the opaque dir
            "/etc/new",                  // top 1
            "/usr/lib/../lib/./libc.so", // same file again
            "/loop",                     // symlink loop
            "/usr/bin",                  // a directory
            "/nope",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let r = resolve_profile(&tocs, &paths);
        assert_eq!(r.frames, vec![f(&[0, 1]), f(&[0, 1])]);
        assert_eq!(r.files, vec![1, 2]);
        assert_eq!(r.file_bytes, 200 + 100 + 100);
        assert_eq!(
            r.unresolved,
            vec!["/usr/lib/old", "/etc/conf", "/loop", "/usr/bin", "/nope"]
        );
        assert_eq!(r.compressed_bytes(&tocs), 40);

        // First-need order, and byte ranges: only the chunks they touch.
        let lines: Vec<String> = ["/etc/new", "/usr/bin/python3.11", "/lib/libc.so\t150+10"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = resolve_profile(&tocs, &lines);
        assert_eq!(r.frames, vec![f(&[1]), f(&[1, 0])]);
        assert_eq!(r.file_bytes, 100 + 100 + 10);
        let r = resolve_profile(&tocs, &["/lib/libc.so\t0+1,x".to_string()]);
        assert_eq!(r.unresolved, vec!["/lib/libc.so\t0+1,x"]);
    }

    #[test]
    fn deleted_directory_hides_lower_files() {
        let base = toc(&[("a", Dir, None, &[]), ("a/f", File, None, &[0])]);
        let top = toc(&[(".wh.a", File, None, &[])]);
        let r = resolve_profile(&[&base, &top], &["/a/f".to_string()]);
        assert_eq!(r.frames, vec![f(&[]), f(&[])]);
        assert_eq!(r.unresolved, vec!["/a/f"]);
        // and the whiteout file itself is never a profile file
        let r = resolve_profile(&[&base, &top], &["/.wh.a".to_string()]);
        assert_eq!(r.unresolved.len(), 1);
    }
}
