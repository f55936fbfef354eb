//! `Digest`: an OCI content digest (`sha256:<64 hex>`), validated on construction.

use crate::FormatError;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A validated `sha256:<hex>` digest.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// sha256 of `data`.
    pub fn sha256(data: &[u8]) -> Self {
        Self::from_sha256_bytes(&Sha256::digest(data).into())
    }

    /// From a finished sha256 hash.
    pub fn from_sha256_bytes(hash: &[u8; 32]) -> Self {
        Digest(format!("sha256:{}", hex::encode(hash)))
    }

    /// The hex part (64 characters), usable as a file name.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The full `sha256:<hex>` string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Digest {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| FormatError::BadDigest(s.to_string()))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(FormatError::BadDigest(s.to_string()));
        }
        Ok(Digest(s.to_string()))
    }
}

impl TryFrom<String> for Digest {
    type Error = FormatError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let d = Digest::sha256(b"abc");
        assert_eq!(
            d.as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.as_str().parse::<Digest>().ok(), Some(d.clone()));
        assert!("sha256:xyz".parse::<Digest>().is_err());
        assert!("md5:00".parse::<Digest>().is_err());
        assert!(format!("sha256:{}", "A".repeat(64))
            .parse::<Digest>()
            .is_err());
    }
}
