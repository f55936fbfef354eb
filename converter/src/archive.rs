//! Reading a docker-archive tarball (`docker save`, `skopeo copy ... docker-archive:`) in place:
//! an index of its members (name, offset, size) is built by walking the tar headers, and blobs
//! are then read straight from the tarball at their offsets. Nothing is extracted.
//!
//! The archive's `manifest.json` (`[{"Config": "...", "RepoTags": [...], "Layers": [...]}]`)
//! names the config and the layer members in order.

use crate::ConvertError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Largest `manifest.json` / config member read into memory.
const MAX_META: u64 = 16 << 20;

/// Where a member's content lies in the tarball.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub offset: u64,
    pub size: u64,
}

/// One image of the archive's `manifest.json`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ArchiveImage {
    pub config: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    pub layers: Vec<String>,
}

/// Parse an octal (or base-256) numeric tar field.
fn tar_number(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(*b))?;
        }
        return Some(v);
    }
    let s = std::str::from_utf8(field).ok()?;
    let s = s.trim_matches(|c: char| c == '\0' || c == ' ');
    if s.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(s, 8).ok()
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// `path=` record of a PAX extended header.
fn pax_path(data: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(data);
    text.lines().find_map(|rec| {
        let (_, kv) = rec.split_once(' ')?;
        kv.strip_prefix("path=").map(str::to_string)
    })
}

/// Index every regular-file member of the tar stream `r` (ustar, PAX and GNU long names).
pub fn index_members<R: Read + Seek>(mut r: R) -> Result<BTreeMap<String, Member>, String> {
    let mut out = BTreeMap::new();
    let mut offset: u64 = 0;
    let mut long_name: Option<String> = None;
    let mut header = [0u8; 512];
    loop {
        match r.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("reading tar header at {offset}: {e}")),
        }
        if header.iter().all(|b| *b == 0) {
            break;
        }
        let sum: u64 = header
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(*b)
                }
            })
            .sum();
        if tar_number(&header[148..156]) != Some(sum) {
            return Err(format!("bad tar header checksum at offset {offset}"));
        }
        let size = tar_number(&header[124..136])
            .ok_or_else(|| format!("bad size field in tar header at {offset}"))?;
        let typeflag = header[156];
        let data_at = offset + 512;
        let padded = size.div_ceil(512) * 512;
        match typeflag {
            b'L' | b'x' => {
                if size > MAX_META {
                    return Err(format!("tar extension header at {offset} is {size} bytes"));
                }
                let mut data = vec![0u8; size as usize];
                r.read_exact(&mut data)
                    .map_err(|e| format!("reading tar extension at {data_at}: {e}"))?;
                r.seek(SeekFrom::Current((padded - size) as i64))
                    .map_err(|e| e.to_string())?;
                long_name = if typeflag == b'L' {
                    Some(cstr(&data))
                } else {
                    pax_path(&data).or(long_name)
                };
            }
            _ => {
                let name = long_name.take().unwrap_or_else(|| {
                    let prefix = cstr(&header[345..500]);
                    let name = cstr(&header[0..100]);
                    if prefix.is_empty() || &header[257..263] != b"ustar\0" {
                        name
                    } else {
                        format!("{prefix}/{name}")
                    }
                });
                if typeflag == b'0' || typeflag == 0 {
                    let name = name.trim_start_matches("./").to_string();
                    out.insert(
                        name,
                        Member {
                            offset: data_at,
                            size,
                        },
                    );
                }
                r.seek(SeekFrom::Current(padded as i64))
                    .map_err(|e| e.to_string())?;
            }
        }
        offset = data_at + padded;
    }
    Ok(out)
}

/// An opened docker-archive: its member index and parsed `manifest.json`.
#[derive(Debug)]
pub struct DockerArchive {
    pub members: BTreeMap<String, Member>,
    pub images: Vec<ArchiveImage>,
}

impl DockerArchive {
    /// Index the tarball at `path` and parse its `manifest.json`.
    pub fn open(path: &Path) -> Result<DockerArchive, ConvertError> {
        let bad = |reason: String| ConvertError::BadImage {
            location: format!("docker-archive:{}", path.display()),
            reason,
        };
        let f = File::open(path)
            .map_err(|e| ConvertError::io(format!("opening {}", path.display()), e))?;
        let members = index_members(std::io::BufReader::new(f)).map_err(bad)?;
        let m = members
            .get("manifest.json")
            .ok_or_else(|| bad("no manifest.json: not a docker-archive tarball".into()))?;
        let bytes = read_member(path, *m, MAX_META)?;
        let images: Vec<ArchiveImage> = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("manifest.json is not valid: {e}")))?;
        if images.is_empty() {
            return Err(bad("manifest.json lists no image".into()));
        }
        Ok(DockerArchive { members, images })
    }

    /// The member named `name` (as written in manifest.json).
    pub fn member(&self, name: &str) -> Option<Member> {
        self.members.get(name.trim_start_matches("./")).copied()
    }
}

/// Read a small member into memory (at most `limit` bytes).
pub fn read_member(path: &Path, m: Member, limit: u64) -> Result<Vec<u8>, ConvertError> {
    if m.size > limit {
        return Err(ConvertError::BadImage {
            location: format!("docker-archive:{}", path.display()),
            reason: format!("member at {} is {} bytes (limit {limit})", m.offset, m.size),
        });
    }
    let mut f =
        File::open(path).map_err(|e| ConvertError::io(format!("opening {}", path.display()), e))?;
    f.seek(SeekFrom::Start(m.offset))
        .map_err(|e| ConvertError::io("seeking in docker-archive", e))?;
    let mut buf = vec![0u8; m.size as usize];
    f.read_exact(&mut buf)
        .map_err(|e| ConvertError::io("reading docker-archive member", e))?;
    Ok(buf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn header(name: &str, size: u64, typeflag: u8) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        let s = format!("{size:011o}\0");
        h[124..136].copy_from_slice(s.as_bytes());
        h[156] = typeflag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    fn tar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            if name.len() >= 100 {
                let mut n = name.as_bytes().to_vec();
                n.push(0);
                out.extend_from_slice(&header("././@LongLink", n.len() as u64, b'L'));
                out.extend_from_slice(&n);
                out.resize(out.len().div_ceil(512) * 512, 0);
                out.extend_from_slice(&header("short", data.len() as u64, b'0'));
            } else {
                out.extend_from_slice(&header(name, data.len() as u64, b'0'));
            }
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn indexes_members_with_long_names() {
        let long = format!("{}/layer.tar", "d".repeat(120));
        let t = tar(&[("manifest.json", b"[]"), (&long, b"hello"), ("x", b"")]);
        let idx = index_members(Cursor::new(&t)).unwrap();
        let m = idx["manifest.json"];
        assert_eq!(&t[m.offset as usize..(m.offset + m.size) as usize], b"[]");
        let l = idx[&long];
        assert_eq!(
            &t[l.offset as usize..(l.offset + l.size) as usize],
            b"hello"
        );
        assert_eq!(idx["x"].size, 0);
    }

    #[test]
    fn rejects_garbage() {
        let mut t = tar(&[("a", b"1")]);
        t[0] ^= 0xff;
        assert!(index_members(Cursor::new(&t)).is_err());
    }

    #[test]
    fn parses_numbers() {
        assert_eq!(tar_number(b"0000644\0"), Some(0o644));
        assert_eq!(tar_number(b"\0\0\0"), Some(0));
        assert_eq!(tar_number(&[0x80, 0, 0, 1, 0]), Some(256));
        assert_eq!(tar_number(b"99"), None);
    }
}
