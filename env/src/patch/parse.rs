//! Unified / git diff parser.

use super::{FilePatch, Hunk, LineKind, Patch, PatchError};

#[derive(Default)]
struct Section {
    git_a: Option<String>,
    git_b: Option<String>,
    minus: Option<String>,
    plus: Option<String>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    old_mode: Option<u32>,
    new_mode: Option<u32>,
    is_new: bool,
    is_delete: bool,
    hunks: Vec<Hunk>,
}

/// Parse a unified or git diff, stripping `strip` leading path components (`patch -pN`)
/// from `diff --git`, `---` and `+++` paths (`rename from/to` paths carry no prefix).
pub fn parse_patch(text: &[u8], strip: u32) -> Result<Patch, PatchError> {
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let mut files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with(b"diff --git ") {
            let (sec, next) = parse_section(&lines, i, true)?;
            files.push(finish(sec, strip, i + 1)?);
            i = next;
        } else if l.starts_with(b"--- ") && lines.get(i + 1).is_some_and(|n| n.starts_with(b"+++ "))
        {
            let (sec, next) = parse_section(&lines, i, false)?;
            files.push(finish(sec, strip, i + 1)?);
            i = next;
        } else {
            i += 1; // commit message, `index` noise of plain diffs, signatures
        }
    }
    Ok(Patch { files })
}

fn text(l: &[u8]) -> String {
    String::from_utf8_lossy(l).into_owned()
}

fn perr(line: usize, reason: impl Into<String>) -> PatchError {
    PatchError::Parse {
        line: line + 1,
        reason: reason.into(),
    }
}

fn parse_mode(s: &str, line: usize) -> Result<u32, PatchError> {
    u32::from_str_radix(s.trim(), 8).map_err(|_| perr(line, format!("bad file mode {s:?}")))
}

fn parse_section(lines: &[&[u8]], start: usize, git: bool) -> Result<(Section, usize), PatchError> {
    let mut s = Section::default();
    let mut i = start;
    if git {
        let rest = text(&lines[i]["diff --git ".len()..]);
        let (a, b) = split_git_header(&rest)
            .ok_or_else(|| perr(i, format!("cannot parse diff header {rest:?}")))?;
        s.git_a = Some(a);
        s.git_b = Some(b);
        i += 1;
        while i < lines.len() {
            let l = text(lines[i]);
            if l.starts_with("--- ") || l.starts_with("@@ ") || l.starts_with("diff --git ") {
                break;
            }
            if let Some(m) = l.strip_prefix("old mode ") {
                s.old_mode = Some(parse_mode(m, i)?);
            } else if let Some(m) = l.strip_prefix("new mode ") {
                s.new_mode = Some(parse_mode(m, i)?);
            } else if let Some(m) = l.strip_prefix("new file mode ") {
                s.is_new = true;
                s.new_mode = Some(parse_mode(m, i)?);
            } else if let Some(m) = l.strip_prefix("deleted file mode ") {
                s.is_delete = true;
                s.old_mode = Some(parse_mode(m, i)?);
            } else if let Some(p) = l.strip_prefix("rename from ") {
                s.rename_from = Some(unquote(p));
            } else if let Some(p) = l.strip_prefix("rename to ") {
                s.rename_to = Some(unquote(p));
            } else if l.starts_with("copy from ") || l.starts_with("copy to ") {
                return Err(PatchError::Unsupported {
                    file: s.git_b.clone().unwrap_or_default(),
                    what: "copies (git diff -C)".into(),
                });
            } else if l.starts_with("GIT binary patch")
                || (l.starts_with("Binary files ") && l.ends_with(" differ"))
            {
                return Err(PatchError::Unsupported {
                    file: s.git_b.clone().unwrap_or_default(),
                    what: "binary patches".into(),
                });
            } else if l.starts_with("index ")
                || l.starts_with("similarity index ")
                || l.starts_with("dissimilarity index ")
            {
                // informational
            } else {
                break;
            }
            i += 1;
        }
    }
    if i + 1 < lines.len() && lines[i].starts_with(b"--- ") && lines[i + 1].starts_with(b"+++ ") {
        s.minus = Some(header_path(&text(&lines[i][4..])));
        s.plus = Some(header_path(&text(&lines[i + 1][4..])));
        i += 2;
    }
    while i < lines.len() && lines[i].starts_with(b"@@ ") {
        let (h, next) = parse_hunk(lines, i)?;
        s.hunks.push(h);
        i = next;
    }
    Ok((s, i))
}

fn parse_range(s: &str, line: usize) -> Result<(usize, usize), PatchError> {
    let bad = || perr(line, format!("bad hunk range {s:?}"));
    let (a, b) = match s.split_once(',') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let start = a.parse().map_err(|_| bad())?;
    let len = match b {
        Some(b) => b.parse().map_err(|_| bad())?,
        None => 1,
    };
    Ok((start, len))
}

fn parse_hunk(lines: &[&[u8]], start: usize) -> Result<(Hunk, usize), PatchError> {
    let header = text(lines[start]);
    let inner = header
        .strip_prefix("@@ -")
        .and_then(|r| r.split_once(" @@"))
        .map(|(r, _)| r)
        .ok_or_else(|| perr(start, format!("bad hunk header {header:?}")))?;
    let (old, new) = inner
        .split_once(" +")
        .ok_or_else(|| perr(start, format!("bad hunk header {header:?}")))?;
    let (old_start, old_len) = parse_range(old, start)?;
    let (new_start, new_len) = parse_range(new, start)?;
    let mut hunk = Hunk {
        old_start,
        old_len,
        new_start,
        new_len,
        lines: Vec::new(),
    };
    let (mut seen_old, mut seen_new) = (0usize, 0usize);
    let mut i = start + 1;
    while seen_old < old_len || seen_new < new_len {
        let Some(l) = lines.get(i) else {
            return Err(perr(i, format!("hunk {header:?} is truncated")));
        };
        let (kind, body): (LineKind, &[u8]) = match l.first() {
            Some(b' ') => (LineKind::Context, &l[1..]),
            None => (LineKind::Context, &[][..]), // context line whose single space was stripped
            Some(b'-') => (LineKind::Remove, &l[1..]),
            Some(b'+') => (LineKind::Add, &l[1..]),
            Some(b'\\') => {
                strip_newline(&mut hunk, i)?;
                i += 1;
                continue;
            }
            _ => {
                return Err(perr(
                    i,
                    format!("unexpected line in hunk {header:?}: {:?}", text(l)),
                ))
            }
        };
        match kind {
            LineKind::Context => {
                seen_old += 1;
                seen_new += 1;
            }
            LineKind::Remove => seen_old += 1,
            LineKind::Add => seen_new += 1,
        }
        if seen_old > old_len || seen_new > new_len {
            return Err(perr(
                i,
                format!("hunk {header:?} has more lines than its header says"),
            ));
        }
        let mut v = body.to_vec();
        v.push(b'\n');
        hunk.lines.push((kind, v));
        i += 1;
    }
    if lines.get(i).is_some_and(|l| l.starts_with(b"\\")) {
        strip_newline(&mut hunk, i)?;
        i += 1;
    }
    Ok((hunk, i))
}

fn strip_newline(hunk: &mut Hunk, line: usize) -> Result<(), PatchError> {
    match hunk.lines.last_mut() {
        Some((_, v)) if v.last() == Some(&b'\n') => {
            v.pop();
            Ok(())
        }
        _ => Err(perr(
            line,
            "`\\ No newline at end of file` without a preceding line",
        )),
    }
}

/// `--- a/x\t2024-01-01 ...` -> `a/x`.
fn header_path(s: &str) -> String {
    let s = s.split('\t').next().unwrap_or(s);
    unquote(s.trim_end_matches('\r'))
}

/// C-style unquoting of git's quoted paths (`"a/with\ttab"`).
fn unquote(s: &str) -> String {
    let Some(inner) = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return s.to_string();
    };
    let mut out: Vec<u8> = Vec::new();
    let b = inner.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let c = b[i + 1];
            i += 2;
            match c {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'"' => out.push(b'"'),
                b'\\' => out.push(b'\\'),
                b'0'..=b'7' => {
                    let mut v = u32::from(c - b'0');
                    let mut n = 0;
                    while n < 2 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                        v = v * 8 + u32::from(b[i] - b'0');
                        i += 1;
                        n += 1;
                    }
                    out.push(v as u8);
                }
                other => out.push(other),
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a/x b/x` -> (`a/x`, `b/x`); handles quoted paths and spaces when both names are equal.
fn split_git_header(rest: &str) -> Option<(String, String)> {
    if let Some(quoted) = rest.strip_prefix('"') {
        let end = quoted.find("\" ").map(|e| e + 1)?;
        return Some((unquote(&rest[..=end]), unquote(rest[end + 2..].trim())));
    }
    let tail = |p: &str| {
        p.split_once('/')
            .map(|(_, t)| t.to_string())
            .unwrap_or_default()
    };
    for (i, _) in rest.match_indices(' ') {
        let (a, b) = (&rest[..i], &rest[i + 1..]);
        if tail(a) == tail(b) {
            return Some((a.to_string(), b.to_string()));
        }
    }
    rest.split_once(" b/")
        .map(|(a, b)| (a.to_string(), format!("b/{b}")))
}

fn strip_path(p: &str, strip: u32, line: usize) -> Result<String, PatchError> {
    if strip == 0 {
        return check_path(p);
    }
    let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    if comps.len() <= strip as usize {
        return Err(perr(
            line,
            format!("path {p:?} has too few components to strip {strip}"),
        ));
    }
    check_path(&comps[strip as usize..].join("/"))
}

/// Validate a relative patch path: no absolute paths, no `..`, no `.`.
pub(crate) fn check_path(p: &str) -> Result<String, PatchError> {
    let unsafe_path = |reason: &str| PatchError::UnsafePath {
        path: p.to_string(),
        reason: reason.into(),
    };
    if p.starts_with('/') {
        return Err(unsafe_path("absolute paths are not allowed"));
    }
    let comps: Vec<&str> = p
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.is_empty() {
        return Err(unsafe_path("empty path"));
    }
    if comps.contains(&"..") {
        return Err(unsafe_path("`..` components are not allowed"));
    }
    Ok(comps.join("/"))
}

fn finish(s: Section, strip: u32, line: usize) -> Result<FilePatch, PatchError> {
    let is_null = |p: &Option<String>| p.as_deref() == Some("/dev/null");
    let old_path = if s.is_new || is_null(&s.minus) {
        None
    } else if let Some(r) = &s.rename_from {
        Some(check_path(r)?)
    } else if let Some(m) = s.minus.as_ref().or(s.git_a.as_ref()) {
        Some(strip_path(m, strip, line)?)
    } else {
        return Err(perr(line, "file section without a path"));
    };
    let new_path = if s.is_delete || is_null(&s.plus) {
        None
    } else if let Some(r) = &s.rename_to {
        Some(check_path(r)?)
    } else if let Some(p) = s.plus.as_ref().or(s.git_b.as_ref()) {
        Some(strip_path(p, strip, line)?)
    } else {
        return Err(perr(line, "file section without a path"));
    };
    if old_path.is_none() && new_path.is_none() {
        return Err(perr(line, "file section where both sides are /dev/null"));
    }
    Ok(FilePatch {
        old_path,
        new_path,
        old_mode: s.old_mode,
        new_mode: s.new_mode,
        hunks: s.hunks,
    })
}
