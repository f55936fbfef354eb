//! containerd filter expressions for Walk, e.g.
//! `labels."containerd.io/snapshot.ref"==sha256:abc,parent==default/3/sha256:def`.
//!
//! Grammar (containerd `filters` package): a filter is `selector ("," selector)*` (AND);
//! several filters are OR-ed. `selector = fieldpath [op value]`, `op` is `==` or `!=`
//! (`~=` regex is rejected as unsupported), a field path is dot-separated identifiers or
//! double-quoted strings; a value is a double-quoted string or runs to the next `,`.
//! Fields: `name`, `parent`, `kind`, `labels.<key>`. A selector without op tests presence.

use super::SnapshotRecord;
use thiserror::Error;

/// Filter syntax errors (mapped to InvalidArgument).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FilterError {
    #[error("filter {filter:?}: {message}")]
    Syntax { filter: String, message: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Present,
    Eq(String),
    Ne(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Selector {
    path: Vec<String>,
    op: Op,
}

/// A parsed set of filters (OR of ANDs). Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    any: Vec<Vec<Selector>>,
}

impl Filter {
    /// Parse containerd filter strings; empty strings are ignored.
    pub fn parse(filters: &[String]) -> Result<Self, FilterError> {
        let mut any = Vec::new();
        for f in filters {
            if f.trim().is_empty() {
                continue;
            }
            any.push(parse_one(f).map_err(|message| FilterError::Syntax {
                filter: f.clone(),
                message,
            })?);
        }
        Ok(Filter { any })
    }

    /// Does `rec` match?
    pub fn matches(&self, rec: &SnapshotRecord) -> bool {
        self.any.is_empty()
            || self
                .any
                .iter()
                .any(|all| all.iter().all(|s| sel_matches(s, rec)))
    }
}

fn field<'a>(rec: &'a SnapshotRecord, path: &[String]) -> Option<&'a str> {
    match path {
        [f] if f == "name" => Some(&rec.key),
        [f] if f == "parent" => Some(&rec.parent),
        [f] if f == "kind" => Some(rec.kind.as_str()),
        [f, rest @ ..] if f == "labels" && !rest.is_empty() => {
            rec.labels.get(&rest.join(".")).map(String::as_str)
        }
        _ => None,
    }
}

fn sel_matches(s: &Selector, rec: &SnapshotRecord) -> bool {
    let v = field(rec, &s.path);
    match &s.op {
        Op::Present => v.is_some_and(|v| !v.is_empty()),
        Op::Eq(want) => v == Some(want.as_str()),
        Op::Ne(want) => v != Some(want.as_str()),
    }
}

fn parse_one(f: &str) -> Result<Vec<Selector>, String> {
    let mut p = Parser {
        s: f.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    loop {
        p.skip_ws();
        let path = p.fieldpath()?;
        p.skip_ws();
        let op = if p.eat("==") {
            Op::Eq(p.value()?)
        } else if p.eat("!=") {
            Op::Ne(p.value()?)
        } else if p.eat("~=") {
            return Err("regular expression match (~=) is not supported".into());
        } else {
            Op::Present
        };
        out.push(Selector { path, op });
        p.skip_ws();
        if p.i == p.s.len() {
            return Ok(out);
        }
        if !p.eat(",") {
            return Err(format!("unexpected character at offset {}", p.i));
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, t: &str) -> bool {
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }
    fn quoted(&mut self) -> Result<String, String> {
        // at opening quote
        self.i += 1;
        let mut out = Vec::new();
        while self.i < self.s.len() {
            match self.s[self.i] {
                b'"' => {
                    self.i += 1;
                    return String::from_utf8(out).map_err(|_| "invalid UTF-8".to_string());
                }
                b'\\' if self.i + 1 < self.s.len() => {
                    out.push(self.s[self.i + 1]);
                    self.i += 2;
                }
                c => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
        Err("unterminated quoted string".into())
    }
    fn fieldpath(&mut self) -> Result<Vec<String>, String> {
        let mut path = Vec::new();
        loop {
            if self.s.get(self.i) == Some(&b'"') {
                path.push(self.quoted()?);
            } else {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                if start == self.i {
                    return Err(format!("expected field name at offset {start}"));
                }
                path.push(String::from_utf8_lossy(&self.s[start..self.i]).into_owned());
            }
            if !self.eat(".") {
                return Ok(path);
            }
        }
    }
    fn value(&mut self) -> Result<String, String> {
        self.skip_ws();
        if self.s.get(self.i) == Some(&b'"') {
            return self.quoted();
        }
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i] != b',' {
            self.i += 1;
        }
        let v = String::from_utf8_lossy(&self.s[start..self.i])
            .trim()
            .to_string();
        if v.is_empty() {
            return Err(format!("expected value at offset {start}"));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &str, parent: &str, labels: &[(&str, &str)]) -> SnapshotRecord {
        SnapshotRecord {
            labels: labels
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            ..SnapshotRecord::committed(key, parent)
        }
    }

    #[test]
    fn containerd_remote_walk_filter() {
        // Exactly what containerd 1.6's metadata layer sends after AlreadyExists.
        let f = Filter::parse(&[
            r#"labels."containerd.io/snapshot.ref"==sha256:abc,parent=="default/3/sha256:def""#
                .to_string(),
        ])
        .unwrap();
        let hit = rec(
            "sha256:abc",
            "default/3/sha256:def",
            &[("containerd.io/snapshot.ref", "sha256:abc")],
        );
        assert!(f.matches(&hit));
        let other_parent = rec("x", "p", &[("containerd.io/snapshot.ref", "sha256:abc")]);
        assert!(!f.matches(&other_parent));
        let no_label = rec("sha256:abc", "default/3/sha256:def", &[]);
        assert!(!f.matches(&no_label));
    }

    #[test]
    fn empty_parent_and_or_and_presence() {
        let f = Filter::parse(&[r#"parent=="""#.into()]).unwrap();
        assert!(f.matches(&rec("a", "", &[])));
        assert!(!f.matches(&rec("a", "b", &[])));
        let f = Filter::parse(&["name==a".into(), "name==b".into()]).unwrap();
        assert!(f.matches(&rec("b", "", &[])));
        assert!(!f.matches(&rec("c", "", &[])));
        let f = Filter::parse(&["labels.foo".into(), "".into()]).unwrap();
        assert!(f.matches(&rec("c", "", &[("foo", "1")])));
        assert!(!f.matches(&rec("c", "", &[])));
        let f = Filter::parse(&["kind==committed,name!=x".into()]).unwrap();
        assert!(f.matches(&rec("c", "", &[])));
        assert!(Filter::parse(&[]).unwrap().matches(&rec("z", "", &[])));
    }

    #[test]
    fn syntax_errors() {
        assert!(Filter::parse(&["name~=a.*".into()]).is_err());
        assert!(Filter::parse(&["==a".into()]).is_err());
        assert!(Filter::parse(&[r#"labels."x==a"#.into()]).is_err());
        assert!(Filter::parse(&["name==".into()]).is_err());
    }
}
