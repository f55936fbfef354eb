//! Property tests: the parsers never panic on arbitrary input, and references round-trip
//! through `Display`.

use crate::auth::parse_www_authenticate;
use crate::blob::parse_content_range;
use crate::manifest::Manifest;
use crate::reference::Reference;
use proptest::prelude::*;

fn assert_send_sync_clone<T: Send + Sync + Clone>() {}

#[test]
fn client_is_send_sync_clone() {
    assert_send_sync_clone::<crate::Client>();
    assert_send_sync_clone::<crate::BlobRangeReader>();
}

proptest! {
    #[test]
    fn reference_parse_never_panics_and_round_trips(s in "\\PC{0,80}") {
        if let Ok(r) = s.parse::<Reference>() {
            let again: Reference = r.to_string().parse().unwrap();
            prop_assert_eq!(again, r);
        }
    }

    #[test]
    fn structured_references_round_trip(
        reg in "(localhost|[a-z]{1,8}\\.[a-z]{2,3}|127\\.0\\.0\\.1)(:[0-9]{1,5})?",
        repo in "[a-z0-9]{1,6}(/[a-z0-9]{1,6}){0,3}",
        tag in "[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}",
    ) {
        let s = format!("{reg}/{repo}:{tag}");
        let r: Reference = s.parse().unwrap();
        prop_assert_eq!(r.registry(), reg.as_str());
        prop_assert_eq!(r.repository(), repo.as_str());
        prop_assert_eq!(r.tag(), Some(tag.as_str()));
        prop_assert_eq!(r.to_string(), s);
    }

    #[test]
    fn header_parsers_never_panic(s in "\\PC{0,120}") {
        let _ = parse_www_authenticate(&s);
        let _ = parse_content_range(&s);
        let _ = crate::retry::parse_retry_after(&s);
    }

    #[test]
    fn manifest_parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..256), mt in "\\PC{0,40}") {
        let _ = Manifest::parse(&mt, &b);
    }
}
