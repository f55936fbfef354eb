//! Membership: who the peers are, and which member is this node.
//!
//! Members come from the config's static list, or from a DNS name resolved again every
//! `dns_refresh_ms` by [`Membership::run_dns`] (a failed lookup keeps the last members). The
//! list is replaced atomically; readers take a snapshot per fetch, so membership changes need
//! no restart and never block a read. This node is the configured `advertise` address, else the
//! member whose IP is an address of this host and whose port is the listen port
//! ([`pick_self`], with [`is_local_ip`]).

use parking_lot::RwLock;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

/// The current members and this node's own address among them.
#[derive(Debug)]
pub struct Membership {
    members: RwLock<Arc<Vec<SocketAddr>>>,
    me: RwLock<Option<SocketAddr>>,
    advertise: Option<SocketAddr>,
    listen: SocketAddr,
}

/// Is `ip` an address of this host? Asks the kernel which source address it would use to reach
/// `ip` (a UDP `connect` sends nothing): a local address is its own source.
pub fn is_local_ip(ip: IpAddr) -> bool {
    if ip.is_loopback() {
        return true;
    }
    let bind: SocketAddr = match ip {
        IpAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    UdpSocket::bind(bind)
        .and_then(|s| {
            s.connect((ip, 9))?;
            s.local_addr()
        })
        .is_ok_and(|a| a.ip() == ip)
}

/// This node among `members`: `advertise` if set, else the first member on `listen`'s port
/// whose IP `is_local` says is ours, else `listen` itself when it names one address. Pure.
pub fn pick_self(
    members: &[SocketAddr],
    advertise: Option<SocketAddr>,
    listen: SocketAddr,
    is_local: impl Fn(IpAddr) -> bool,
) -> Option<SocketAddr> {
    if advertise.is_some() {
        return advertise;
    }
    if let Some(m) = members
        .iter()
        .find(|m| m.port() == listen.port() && is_local(m.ip()))
    {
        return Some(*m);
    }
    (!listen.ip().is_unspecified()).then_some(listen)
}

/// Sorted, deduplicated members, this node included (it owns its share of the frames even when
/// the list or DNS does not name it yet). Pure.
pub fn normalise(mut members: Vec<SocketAddr>, me: Option<SocketAddr>) -> Vec<SocketAddr> {
    members.extend(me);
    members.sort();
    members.dedup();
    members
}

impl Membership {
    /// A membership of `members` (static, or the first DNS answer).
    pub fn new(
        members: Vec<SocketAddr>,
        advertise: Option<SocketAddr>,
        listen: SocketAddr,
    ) -> Self {
        let m = Membership {
            members: RwLock::new(Arc::new(Vec::new())),
            me: RwLock::new(None),
            advertise,
            listen,
        };
        m.set(members);
        m
    }

    /// Replaces the members.
    pub fn set(&self, members: Vec<SocketAddr>) {
        let me = pick_self(&members, self.advertise, self.listen, is_local_ip);
        let members = normalise(members, me);
        let changed = **self.members.read() != members;
        if changed {
            tracing::info!(members = ?members, me = ?me, "peer membership");
        }
        *self.me.write() = me;
        *self.members.write() = Arc::new(members);
    }

    /// The members now (this node included).
    pub fn members(&self) -> Arc<Vec<SocketAddr>> {
        self.members.read().clone()
    }

    /// This node's member address, if known.
    pub fn me(&self) -> Option<SocketAddr> {
        *self.me.read()
    }

    /// Resolves `name_port` every `every`, forever (spawned at start-up).
    pub async fn run_dns(self: Arc<Self>, name_port: String, every: Duration) {
        loop {
            match tokio::net::lookup_host(name_port.as_str()).await {
                Ok(addrs) => self.set(addrs.collect()),
                Err(e) => {
                    tracing::warn!(name = %name_port, error = %e, "peer DNS lookup failed; keeping the last members")
                }
            }
            tokio::time::sleep(every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn self_is_advertised_or_the_local_member_on_our_port() {
        let ms = [a("10.0.0.1:7470"), a("10.0.0.2:7470"), a("10.0.0.2:9999")];
        let local = |ip: IpAddr| ip == a("10.0.0.2:1").ip();
        let any = a("0.0.0.0:7470");
        assert_eq!(pick_self(&ms, None, any, local), Some(ms[1]));
        assert_eq!(
            pick_self(&ms, Some(a("10.0.0.9:1")), any, local),
            Some(a("10.0.0.9:1"))
        );
        assert_eq!(pick_self(&ms, None, any, |_| false), None);
        assert_eq!(
            pick_self(&ms, None, a("10.0.0.7:7470"), |_| false),
            Some(a("10.0.0.7:7470"))
        );
    }

    #[test]
    fn members_are_sorted_unique_and_include_self() {
        let m = normalise(
            vec![a("10.0.0.2:1"), a("10.0.0.1:1"), a("10.0.0.2:1")],
            Some(a("10.0.0.3:1")),
        );
        assert_eq!(m, vec![a("10.0.0.1:1"), a("10.0.0.2:1"), a("10.0.0.3:1")]);
    }

    #[test]
    fn loopback_is_local_and_a_foreign_address_is_not() {
        assert!(is_local_ip(a("127.0.0.1:1").ip()));
        assert!(!is_local_ip(a("192.0.2.77:1").ip()));
    }

    #[tokio::test]
    async fn membership_follows_dns_and_keeps_members_when_lookup_fails() {
        let m = Arc::new(Membership::new(vec![], None, a("127.0.0.1:7470")));
        assert_eq!(*m.members(), vec![a("127.0.0.1:7470")]);
        let t = tokio::spawn(
            m.clone()
                .run_dns("localhost:7470".into(), Duration::from_millis(50)),
        );
        for _ in 0..100 {
            if m.me() == Some(a("127.0.0.1:7470")) && !m.members().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(m.members().contains(&a("127.0.0.1:7470")));
        t.abort();
        m.set(vec![a("10.1.0.1:7470"), a("10.1.0.2:7470")]);
        assert_eq!(m.members().len(), 3, "{:?}", m.members());
    }
}
