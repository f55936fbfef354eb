//! Where an image lives: a registry reference, an OCI layout directory (`oci:DIR[:tag]`) or a
//! docker-archive tarball (`docker-archive:FILE`, or a path to an existing `.tar` file).
//! Parsing is pure.

use crate::ConvertError;
use std::fmt;
use std::path::PathBuf;
use weenv_registry::Reference;

/// An image location given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageLocation {
    /// `registry/repo:tag` or `...@sha256:..`.
    Registry(Reference),
    /// `oci:DIR[:tag]`; without a tag the layout must hold exactly one image (source) or the
    /// tag `latest` is written (destination).
    Layout { dir: PathBuf, tag: Option<String> },
    /// `docker-archive:FILE` (what `docker save` / `skopeo copy ... docker-archive:` write).
    Archive { path: PathBuf },
}

impl ImageLocation {
    /// Parse `input`. `oci:` and `docker-archive:` prefixes are explicit; an existing file path
    /// is a docker archive; anything else must be a registry reference.
    pub fn parse(input: &str) -> Result<ImageLocation, ConvertError> {
        let bad = |reason: &str| ConvertError::BadLocation {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = input.strip_prefix("oci:") {
            if rest.is_empty() {
                return Err(bad("empty OCI layout directory"));
            }
            // The tag is after the last ':' if that part has no '/'.
            let (dir, tag) = match rest.rsplit_once(':') {
                Some((d, t)) if !t.contains('/') && !d.is_empty() => (d, Some(t)),
                _ => (rest, None),
            };
            if let Some(t) = tag {
                if t.is_empty() {
                    return Err(bad("empty tag after ':'"));
                }
            }
            return Ok(ImageLocation::Layout {
                dir: PathBuf::from(dir),
                tag: tag.map(str::to_string),
            });
        }
        if let Some(rest) = input.strip_prefix("docker-archive:") {
            // skopeo allows docker-archive:FILE:REF; the REF part is ignored when reading.
            let path = match rest.split_once(':') {
                Some((p, _)) => p,
                None => rest,
            };
            if path.is_empty() {
                return Err(bad("empty docker-archive path"));
            }
            return Ok(ImageLocation::Archive {
                path: PathBuf::from(path),
            });
        }
        if input.starts_with('/') || input.starts_with("./") {
            let p = PathBuf::from(input);
            if p.is_file() {
                return Ok(ImageLocation::Archive { path: p });
            }
            if p.is_dir() {
                return Err(bad("a directory: write oci:DIR[:tag] for an OCI layout"));
            }
            return Err(bad(
                "no such file; write oci:DIR[:tag] for an OCI layout (created if missing) or docker-archive:FILE",
            ));
        }
        let reference = input
            .strip_prefix("docker://")
            .unwrap_or(input)
            .parse::<Reference>()?;
        Ok(ImageLocation::Registry(reference))
    }
}

impl fmt::Display for ImageLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageLocation::Registry(r) => write!(f, "{r}"),
            ImageLocation::Layout { dir, tag: Some(t) } => write!(f, "oci:{}:{t}", dir.display()),
            ImageLocation::Layout { dir, tag: None } => write!(f, "oci:{}", dir.display()),
            ImageLocation::Archive { path } => write!(f, "docker-archive:{}", path.display()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_layouts() {
        assert_eq!(
            ImageLocation::parse("oci:/tmp/x:v1").unwrap(),
            ImageLocation::Layout {
                dir: "/tmp/x".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            ImageLocation::parse("oci:/tmp/x").unwrap(),
            ImageLocation::Layout {
                dir: "/tmp/x".into(),
                tag: None
            }
        );
        assert_eq!(
            ImageLocation::parse("oci:rel/dir").unwrap(),
            ImageLocation::Layout {
                dir: "rel/dir".into(),
                tag: None
            }
        );
        assert!(ImageLocation::parse("oci:").is_err());
        assert!(ImageLocation::parse("oci:/x:").is_err());
    }

    #[test]
    fn parses_archives_and_references() {
        assert_eq!(
            ImageLocation::parse("docker-archive:/a/b.tar:img:1").unwrap(),
            ImageLocation::Archive {
                path: "/a/b.tar".into()
            }
        );
        match ImageLocation::parse("127.0.0.1:5000/busybox:1").unwrap() {
            ImageLocation::Registry(r) => {
                assert_eq!(r.registry(), "127.0.0.1:5000");
                assert_eq!(r.repository(), "busybox");
                assert_eq!(r.tag(), Some("1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(ImageLocation::parse("Bad Ref!").is_err());
        assert!(ImageLocation::parse("/definitely/not/here/dir/").is_err());
    }
}
