//! Differential fuzz: our tar parser (`weenv_format::tar`, the one the writer and the TOC
//! checks use) against the `tar` crate on the same bytes. Where both accept the input, they
//! must list the same entries in the same order with the same path (normalised), type, size,
//! link name, permission bits (setuid/setgid/sticky included), uid/gid (PAX overrides
//! included) and, for devices, major/minor numbers.
//!
//! Accepted differences (inputs showing them are skipped or normalised, never compared):
//! - we reject much the tar crate accepts (checksums are not the issue: we accept signed ones
//!   too): bad PAX records, paths with `..`/NUL/absolute/over 255 bytes, payloads on non-file
//!   entries, unknown typeflags, GNU sparse, a zero block followed by data, truncated
//!   payloads, a second `x`/`L`/`K` for one entry, a `g` between an entry's extension headers
//!   and the entry. Only inputs both accept are compared.
//! - PAX `g` headers: the tar crate returns them as entries, we skip them (as containerd
//!   does); they are filtered out of its list.
//! - extension headers (`x`, `L`, `K`) in a V7 header (no ustar/GNU magic): the tar crate
//!   returns them as ordinary entries, we (and Go) apply them. Inputs where the tar crate
//!   lists such an entry are skipped.
//! - a PAX record with an empty value: Go and we treat it as "unset" (the header field
//!   applies); the tar crate uses the empty value. A key given twice: Go and we keep the last,
//!   the tar crate the first. Inputs with either for `path`, `linkpath`, `size`, `uid` or
//!   `gid` are skipped.
//! - GNU long names are cut at the first NUL by Go and us; the tar crate drops one trailing
//!   NUL only. Its names are cut at the first NUL before comparing.
//! - numeric fields the tar crate cannot read (it reads `mode` as octal only, and ignores a
//!   PAX `uid`/`gid` it cannot parse where we refuse the input): the entry's mode or ids are
//!   then not compared (`None`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::io::Read;
use weenv_format::tar::{TarParser, TarSink};
use weenv_format::toc::{Entry, EntryKind};
use weenv_format::FormatError;

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    path: String,
    kind: EntryKind,
    size: u64,
    link: Option<String>,
    mode: Option<u32>,
    ids: Option<(u64, u64)>,
    dev: Option<(u64, u64)>,
}

impl Seen {
    /// Equal, where a field one side could not read counts as equal.
    fn agrees(&self, o: &Seen) -> bool {
        fn opt<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            a.is_none() || b.is_none() || a == b
        }
        (&self.path, self.kind, self.size, &self.link) == (&o.path, o.kind, o.size, &o.link)
            && opt(&self.mode, &o.mode)
            && opt(&self.ids, &o.ids)
            && opt(&self.dev, &o.dev)
    }
}

#[derive(Default)]
struct Collect(Vec<Seen>);

impl TarSink for Collect {
    fn meta(&mut self, _: &[u8]) -> Result<(), FormatError> {
        Ok(())
    }
    fn entry(&mut self, e: Entry) -> Result<(), FormatError> {
        let dev = matches!(e.kind, EntryKind::Char | EntryKind::Block)
            .then(|| (u64::from(e.devmajor), u64::from(e.devminor)));
        self.0.push(Seen {
            path: e.path,
            kind: e.kind,
            size: e.size,
            link: e.link,
            mode: Some(e.mode),
            ids: Some((u64::from(e.uid), u64::from(e.gid))),
            dev,
        });
        Ok(())
    }
    fn payload(&mut self, _: &[u8]) -> Result<(), FormatError> {
        Ok(())
    }
}

fn ours(data: &[u8]) -> Option<Vec<Seen>> {
    // Isolated: no namespace rules (duplicates, hardlink resolution), which the tar crate
    // does not have either.
    let mut p = TarParser::isolated_at(0);
    let mut c = Collect::default();
    p.push(data, &mut c).ok()?;
    p.finish(&mut c).ok()?;
    Some(c.0)
}

fn cut_nul(b: &[u8]) -> &[u8] {
    b.iter().position(|c| *c == 0).map_or(b, |n| &b[..n])
}

/// The tar crate's view; `None` if it fails or the input shows an accepted difference.
fn theirs(data: &[u8]) -> Option<Vec<Seen>> {
    let mut ar = tar::Archive::new(data);
    let mut out = Vec::new();
    for e in ar.entries().ok()? {
        let mut e = e.ok()?;
        let t = e.header().entry_type();
        if t.is_pax_global_extensions() {
            continue;
        }
        if t.is_pax_local_extensions() || t.is_gnu_longname() || t.is_gnu_longlink() {
            return None; // V7 extension header, see above
        }
        if let Ok(Some(pax)) = e.pax_extensions() {
            let mut keys = HashSet::new();
            for r in pax {
                let r = r.ok()?;
                let k = r.key_bytes().to_vec();
                if matches!(&k[..], b"path" | b"linkpath" | b"size" | b"uid" | b"gid")
                    && (r.value_bytes().is_empty() || !keys.insert(k))
                {
                    return None;
                }
            }
        }
        let raw = cut_nul(&e.path_bytes()).to_vec();
        let flag = e.header().as_bytes()[156];
        // The typeflag mapping is ours (a table, not parsing); what is compared is which
        // header blocks each parser finds and what it makes of names, sizes and links.
        let kind = weenv_format::tar::entry_kind(flag, &raw)?;
        let link = match kind {
            EntryKind::Symlink | EntryKind::Hardlink => {
                let l = cut_nul(&e.link_name_bytes().unwrap_or_default()).to_vec();
                Some(match kind {
                    EntryKind::Hardlink => weenv_format::paths::normalise(&l)
                        .unwrap_or_else(|e| panic!("tar crate link {l:?}, we refused: {e}")),
                    _ => String::from_utf8(l).ok()?,
                })
            }
            _ => None,
        };
        let path = weenv_format::paths::normalise(&raw)
            .unwrap_or_else(|err| panic!("tar crate path {raw:?} that we refuse: {err}"));
        let size = e.size();
        let h = e.header();
        let mode = h.mode().ok().map(|m| m & 0o7777);
        // The tar crate applies parsable PAX uid/gid to the header it returns.
        let ids = match (h.uid(), h.gid()) {
            (Ok(u), Ok(g)) => Some((u, g)),
            _ => None,
        };
        let dev = match kind {
            EntryKind::Char | EntryKind::Block => match (h.device_major(), h.device_minor()) {
                (Ok(Some(a)), Ok(Some(b))) => Some((u64::from(a), u64::from(b))),
                (Ok(None), Ok(None)) => Some((0, 0)), // V7 header: no device fields
                _ => None,
            },
            _ => None,
        };
        // Read the payload so the archive position is the tar crate's own.
        let mut sink = Vec::new();
        e.read_to_end(&mut sink).ok()?;
        out.push(Seen {
            path,
            kind,
            size,
            link,
            mode,
            ids,
            dev,
        });
    }
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some(a) = ours(data) else { return };
    let Some(b) = theirs(data) else { return };
    assert!(
        a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.agrees(y)),
        "our parser and the tar crate disagree:\nours:  {a:?}\ntheirs: {b:?}"
    );
});
