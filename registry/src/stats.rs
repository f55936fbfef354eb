//! Request counters of a [`crate::Client`] (shared by its clones), for tests and metrics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Kinds of requests the client counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Head,
    Get,
    RangeGet,
    Post,
    Put,
    Patch,
    Delete,
}

/// Live counters (atomics).
#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    heads: AtomicU64,
    gets: AtomicU64,
    range_gets: AtomicU64,
    posts: AtomicU64,
    puts: AtomicU64,
    patches: AtomicU64,
    deletes: AtomicU64,
    token_requests: AtomicU64,
    retries: AtomicU64,
    auth_retries: AtomicU64,
    redirects: AtomicU64,
    mirror_fallbacks: AtomicU64,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    full_body_for_range: AtomicU64,
}

/// A point-in-time copy of the counters. Each HTTP request sent counts once in `requests`
/// and once in its kind (redirect hops and retries included); token requests count only in
/// `token_requests`. `bytes_received` counts response body bytes read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub heads: u64,
    pub gets: u64,
    pub range_gets: u64,
    pub posts: u64,
    pub puts: u64,
    pub patches: u64,
    pub deletes: u64,
    pub token_requests: u64,
    pub retries: u64,
    pub auth_retries: u64,
    pub redirects: u64,
    pub mirror_fallbacks: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// Range requests the server answered with the whole blob (200).
    pub full_body_for_range: u64,
}

impl StatsSnapshot {
    /// Counter-wise difference `self - earlier` (saturating).
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        macro_rules! d {
            ($($f:ident),*) => { StatsSnapshot { $($f: self.$f.saturating_sub(earlier.$f)),* } };
        }
        d!(
            requests,
            heads,
            gets,
            range_gets,
            posts,
            puts,
            patches,
            deletes,
            token_requests,
            retries,
            auth_retries,
            redirects,
            mirror_fallbacks,
            bytes_received,
            bytes_sent,
            full_body_for_range
        )
    }
}

impl Stats {
    pub(crate) fn count_request(&self, kind: Kind, body_len: u64) {
        self.requests.fetch_add(1, Relaxed);
        self.bytes_sent.fetch_add(body_len, Relaxed);
        match kind {
            Kind::Head => &self.heads,
            Kind::Get => &self.gets,
            Kind::RangeGet => &self.range_gets,
            Kind::Post => &self.posts,
            Kind::Put => &self.puts,
            Kind::Patch => &self.patches,
            Kind::Delete => &self.deletes,
        }
        .fetch_add(1, Relaxed);
    }
    pub(crate) fn count_token_request(&self) {
        self.token_requests.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_auth_retry(&self) {
        self.auth_retries.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_redirect(&self) {
        self.redirects.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_mirror_fallback(&self) {
        self.mirror_fallbacks.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_received(&self, n: u64) {
        self.bytes_received.fetch_add(n, Relaxed);
    }
    pub(crate) fn count_full_body_for_range(&self) {
        self.full_body_for_range.fetch_add(1, Relaxed);
    }

    /// Copy the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            requests: self.requests.load(Relaxed),
            heads: self.heads.load(Relaxed),
            gets: self.gets.load(Relaxed),
            range_gets: self.range_gets.load(Relaxed),
            posts: self.posts.load(Relaxed),
            puts: self.puts.load(Relaxed),
            patches: self.patches.load(Relaxed),
            deletes: self.deletes.load(Relaxed),
            token_requests: self.token_requests.load(Relaxed),
            retries: self.retries.load(Relaxed),
            auth_retries: self.auth_retries.load(Relaxed),
            redirects: self.redirects.load(Relaxed),
            mirror_fallbacks: self.mirror_fallbacks.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            full_body_for_range: self.full_body_for_range.load(Relaxed),
        }
    }
}
