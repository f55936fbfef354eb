//! What `weenv pull` shows while it works: one line per layer and a summary on stderr when
//! stderr is a terminal, nothing in a pipe (the one-line report on stdout is unchanged).
//! Pure functions of the event and `tty`; the caller decides `tty` with
//! [`std::io::IsTerminal`].

/// What became of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed as a remote snapshot by the weenv daemon (mounted lazily, no byte fetched).
    Lazy,
    /// Fetched (unless in the content store) and unpacked in full.
    Applied,
    /// Already a snapshot on this node.
    Present,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Lazy => "lazy",
            Outcome::Applied => "applied",
            Outcome::Present => "present",
        }
    }
}

/// One layer prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerEvent {
    /// 1-based, bottom up.
    pub index: usize,
    pub total: usize,
    pub digest: String,
    /// Compressed size (the manifest's).
    pub size: u64,
    pub outcome: Outcome,
}

/// `sha256:0123456789ab…` -> `0123456789ab` (12 hex digits, as docker shows them).
pub fn short_digest(d: &str) -> &str {
    let hex = d.split_once(':').map_or(d, |(_, h)| h);
    hex.get(..12).unwrap_or(hex)
}

/// Bytes as `512 B`, `1.5 KiB`, `3.2 MiB`, `1.1 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The line to print for a prepared layer: `[2/5] 0123456789ab  3.2 MiB  lazy` on a
/// terminal, none in a pipe.
pub fn layer_line(ev: &LayerEvent, tty: bool) -> Option<String> {
    if !tty {
        return None;
    }
    let w = ev.total.to_string().len();
    Some(format!(
        "[{:>w$}/{}] {}  {:>10}  {}",
        ev.index,
        ev.total,
        short_digest(&ev.digest),
        human_bytes(ev.size),
        ev.outcome.as_str(),
    ))
}

/// Layers and bytes by outcome (bytes: the manifest's compressed sizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub lazy: (usize, u64),
    pub applied: (usize, u64),
    pub present: (usize, u64),
}

impl Tally {
    pub fn add(&mut self, ev: &LayerEvent) {
        let slot = match ev.outcome {
            Outcome::Lazy => &mut self.lazy,
            Outcome::Applied => &mut self.applied,
            Outcome::Present => &mut self.present,
        };
        slot.0 += 1;
        slot.1 += ev.size;
    }
}

/// The closing line on a terminal (none in a pipe): layers and bytes by outcome, elapsed.
pub fn summary_line(image: &str, t: &Tally, seconds: f64, tty: bool) -> Option<String> {
    if !tty {
        return None;
    }
    let part = |(n, b): (usize, u64), what: &str| format!("{n} {what} ({})", human_bytes(b));
    Some(format!(
        "{image}: {}, {}, {} in {seconds:.2}s",
        part(t.lazy, "lazy"),
        part(t.applied, "applied"),
        part(t.present, "present"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(index: usize, outcome: Outcome) -> LayerEvent {
        LayerEvent {
            index,
            total: 12,
            digest: format!("sha256:{}", "ab".repeat(32)),
            size: 3 * 1024 * 1024 + 200 * 1024,
            outcome,
        }
    }

    #[test]
    fn nothing_is_printed_in_a_pipe() {
        for o in [Outcome::Lazy, Outcome::Applied, Outcome::Present] {
            assert_eq!(layer_line(&ev(1, o), false), None);
        }
        assert_eq!(summary_line("r/x:1", &Tally::default(), 1.0, false), None);
    }

    #[test]
    fn a_layer_line_says_index_digest_size_and_outcome() {
        let l = layer_line(&ev(3, Outcome::Lazy), true).unwrap();
        assert_eq!(l, "[ 3/12] abababababab     3.2 MiB  lazy");
        assert!(layer_line(&ev(12, Outcome::Applied), true)
            .unwrap()
            .ends_with("applied"));
        assert!(layer_line(&ev(1, Outcome::Present), true)
            .unwrap()
            .ends_with("present"));
    }

    #[test]
    fn the_summary_counts_layers_and_bytes_by_outcome() {
        let mut t = Tally::default();
        for o in [Outcome::Lazy, Outcome::Lazy, Outcome::Applied] {
            t.add(&ev(1, o));
        }
        assert_eq!(t.lazy.0, 2);
        assert_eq!(t.applied, (1, 3 * 1024 * 1024 + 200 * 1024));
        let s = summary_line("r/x:1", &t, 1.234, true).unwrap();
        assert_eq!(
            s,
            "r/x:1: 2 lazy (6.4 MiB), 1 applied (3.2 MiB), 0 present (0 B) in 1.23s"
        );
    }

    #[test]
    fn digests_and_sizes_are_short() {
        assert_eq!(short_digest("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short_digest("abc"), "abc");
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
    }
}
