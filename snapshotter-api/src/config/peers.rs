//! `[peers]`: the node disk cache shared with peer nodes (issue 14).
//!
//! A node with `listen` set serves the verified frames of its disk cache to its peers and asks
//! them for frames it misses: each frame digest has one owner among the members (rendezvous
//! hashing); the owner fetches a frame it lacks from the registry once for the cluster. Members
//! come from `members` (a static list) or `dns` (a name resolving to every node, e.g. a
//! Kubernetes headless Service over the DaemonSet), re-resolved every `dns_refresh_ms`.
//! Peers are never trusted: every frame a peer returns is verified against the TOC.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The peer cache. Off unless `listen` is set and `members` or `dns` names the peers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeersSection {
    /// `ip:port` serving frames to peers (`0.0.0.0:7470` on every interface). Default `""`:
    /// the peer cache is off (nothing is served, no peer is asked).
    #[serde(default)]
    pub listen: String,
    /// Static membership: every node's peer address (`ip:port`), this node's included or not.
    /// Default none.
    #[serde(default)]
    pub members: Vec<String>,
    /// Dynamic membership: `name:port`, resolved to every node's address (A/AAAA records) and
    /// re-resolved every `dns_refresh_ms`. Default `""` (use `members`).
    #[serde(default)]
    pub dns: String,
    /// How often `dns` is resolved again, in ms. Default 10000.
    #[serde(default = "default_dns_refresh_ms")]
    pub dns_refresh_ms: u64,
    /// This node's address as the other members name it (`ip:port`). Default `""`: the member
    /// whose IP is an address of this host and whose port is `listen`'s.
    #[serde(default)]
    pub advertise: String,
    /// File holding a shared secret: requests must carry it (`Authorization: Bearer`), and this
    /// node sends it. Default none (any host that reaches `listen` may read cached frames and
    /// ask this node to fetch frames of blobs of `registries`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Registry hosts (`host[:port]`) this node fetches from on a peer's behalf. Default none:
    /// any registry its own config reaches.
    #[serde(default)]
    pub registries: Vec<String>,
    /// A peer that has not answered after this many ms is bypassed (the frames are fetched from
    /// the registry) and ejected. Default 2000.
    #[serde(default = "default_hedge_ms")]
    pub hedge_ms: u64,
    /// First ejection of a failing, slow or lying peer, in ms; doubles with each further
    /// failure up to `eject_max_ms`. Default 1000.
    #[serde(default = "default_eject_base_ms")]
    pub eject_base_ms: u64,
    /// Longest ejection, in ms. Default 60000.
    #[serde(default = "default_eject_max_ms")]
    pub eject_max_ms: u64,
    /// Peer requests served at once; more are answered 503 (the peer goes to the registry).
    /// Default 64.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: usize,
    /// Uncompressed frame bytes of the requests being served at once; more are answered 503.
    /// Default 128 MiB.
    #[serde(default = "default_max_bytes_in_flight")]
    pub max_bytes_in_flight: u64,
    /// Uncompressed frame bytes asked of one peer in one request. Default 8 MiB.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: u64,
}

fn default_dns_refresh_ms() -> u64 {
    10_000
}
fn default_hedge_ms() -> u64 {
    2000
}
fn default_eject_base_ms() -> u64 {
    1000
}
fn default_eject_max_ms() -> u64 {
    60_000
}
fn default_max_concurrent() -> usize {
    64
}
fn default_max_bytes_in_flight() -> u64 {
    128 << 20
}
fn default_max_request_bytes() -> u64 {
    8 << 20
}

impl Default for PeersSection {
    fn default() -> Self {
        Self {
            listen: String::new(),
            members: Vec::new(),
            dns: String::new(),
            dns_refresh_ms: default_dns_refresh_ms(),
            advertise: String::new(),
            token_file: None,
            registries: Vec::new(),
            hedge_ms: default_hedge_ms(),
            eject_base_ms: default_eject_base_ms(),
            eject_max_ms: default_eject_max_ms(),
            max_concurrent: default_max_concurrent(),
            max_bytes_in_flight: default_max_bytes_in_flight(),
            max_request_bytes: default_max_request_bytes(),
        }
    }
}

/// The largest frame the format allows (`weenv_format` `MAX_FRAME_ULEN`) must fit one request.
const MIN_REQUEST_BYTES: u64 = 64 << 20;

impl PeersSection {
    /// True when this node serves and asks peers.
    pub fn enabled(&self) -> bool {
        !self.listen.trim().is_empty()
    }

    /// The parsed `listen` address (`None`: off).
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        let s = self.listen.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse()
            .map(Some)
            .map_err(|_| invalid("peers.listen", format!("{s:?} is not ip:port")))
    }

    /// The parsed `advertise` address (`None`: detect).
    pub fn advertise_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        let s = self.advertise.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse()
            .map(Some)
            .map_err(|_| invalid("peers.advertise", format!("{s:?} is not ip:port")))
    }

    /// The parsed static members.
    pub fn member_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        self.members
            .iter()
            .map(|m| {
                m.trim()
                    .parse()
                    .map_err(|_| invalid("peers.members", format!("{m:?} is not ip:port")))
            })
            .collect()
    }

    /// Check every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let listen = self.listen_addr()?;
        self.advertise_addr()?;
        self.member_addrs()?;
        let dns = self.dns.trim();
        if !dns.is_empty() {
            let ok = dns
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(invalid("peers.dns", format!("{dns:?} is not name:port")));
            }
            if !self.members.is_empty() {
                return Err(invalid(
                    "peers.dns",
                    "set either peers.members or peers.dns, not both",
                ));
            }
        }
        if listen.is_some() && self.members.is_empty() && dns.is_empty() {
            return Err(invalid(
                "peers.listen",
                "set peers.members or peers.dns too (who are the peers?)",
            ));
        }
        if self.dns_refresh_ms < 100 {
            return Err(invalid("peers.dns_refresh_ms", "must be at least 100"));
        }
        if self.hedge_ms == 0 {
            return Err(invalid("peers.hedge_ms", "must be at least 1"));
        }
        if self.eject_base_ms == 0 || self.eject_max_ms < self.eject_base_ms {
            return Err(invalid(
                "peers.eject_max_ms",
                "need 1 <= eject_base_ms <= eject_max_ms",
            ));
        }
        if self.max_concurrent == 0 {
            return Err(invalid("peers.max_concurrent", "must be at least 1"));
        }
        if self.max_bytes_in_flight < MIN_REQUEST_BYTES {
            return Err(invalid(
                "peers.max_bytes_in_flight",
                "must be at least 64 MiB (the largest frame)",
            ));
        }
        if self.max_request_bytes == 0 || self.max_request_bytes > self.max_bytes_in_flight {
            return Err(invalid(
                "peers.max_request_bytes",
                "must be between 1 and peers.max_bytes_in_flight",
            ));
        }
        for h in &self.registries {
            if h.is_empty() || h.contains('/') {
                return Err(invalid(
                    "peers.registries",
                    format!("{h:?} is not a host[:port]"),
                ));
            }
        }
        if let Some(p) = &self.token_file {
            if !p.is_absolute() {
                return Err(invalid("peers.token_file", "must be an absolute path"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(p: PeersSection) -> &'static str {
        match p.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn default_is_off_and_valid() {
        let p = PeersSection::default();
        assert!(!p.enabled());
        p.validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let on = || PeersSection {
            listen: "0.0.0.0:7470".into(),
            members: vec!["10.0.0.1:7470".into()],
            ..Default::default()
        };
        on().validate().unwrap();
        assert_eq!(
            field(PeersSection {
                listen: "x".into(),
                ..on()
            }),
            "peers.listen"
        );
        assert_eq!(
            field(PeersSection {
                members: vec![],
                ..on()
            }),
            "peers.listen"
        );
        assert_eq!(
            field(PeersSection {
                members: vec!["nohost".into()],
                ..on()
            }),
            "peers.members"
        );
        assert_eq!(
            field(PeersSection {
                dns: "svc:7470".into(),
                ..on()
            }),
            "peers.dns"
        );
        assert_eq!(
            field(PeersSection {
                members: vec![],
                dns: "svc".into(),
                ..on()
            }),
            "peers.dns"
        );
        PeersSection {
            members: vec![],
            dns: "weenv-peers.weenv.svc:7470".into(),
            ..on()
        }
        .validate()
        .unwrap();
        assert_eq!(
            field(PeersSection {
                hedge_ms: 0,
                ..on()
            }),
            "peers.hedge_ms"
        );
        assert_eq!(
            field(PeersSection {
                eject_max_ms: 1,
                ..on()
            }),
            "peers.eject_max_ms"
        );
        assert_eq!(
            field(PeersSection {
                max_request_bytes: 1 << 40,
                ..on()
            }),
            "peers.max_request_bytes"
        );
        assert_eq!(
            field(PeersSection {
                token_file: Some("rel".into()),
                ..on()
            }),
            "peers.token_file"
        );
        assert_eq!(
            field(PeersSection {
                registries: vec!["a/b".into()],
                ..on()
            }),
            "peers.registries"
        );
    }
}
