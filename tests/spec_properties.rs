//! Property tests for the naming helpers and the spec readers.

use proptest::prelude::*;
use tpu_runner::spec::{gcp, names, parse_fleet, parse_jobs};

/// Valid runner names: a letter, then up to 18 of `[a-z0-9-]`, slugged.
fn runner_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,18}"
        .prop_map(|s| names::slug(&s))
        .prop_filter("slug is itself", |s| s.len() <= 19)
}

/// Valid entry ids: slugs of up to 63 characters.
fn entry_id() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9-]{0,62}".prop_map(|s| names::slug(&s))
}

proptest! {
    #[test]
    fn slug_is_idempotent(text in any::<String>()) {
        let once = names::slug(&text);
        prop_assert_eq!(names::slug(&once), once.clone());
        prop_assert!(!once.is_empty());
        prop_assert!(once.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        prop_assert!(!once.starts_with('-') && !once.ends_with('-') && !once.contains("--"));
    }

    #[test]
    fn generated_names_are_unique_per_ordinal_and_fit_gcp_limits(
        runner in runner_name(),
        entry in entry_id(),
        size in 1u32..512,
        count in 1u32..64,
    ) {
        let tpu_type = format!("v6e-{size}");
        let mut seen = std::collections::BTreeSet::new();
        for k in 1..=count {
            let node = names::managed_node_name(&runner, &entry, &tpu_type, "us-east1-d", k);
            let qr = names::queued_resource_name(&node);
            prop_assert!(node.len() <= names::NODE_NAME_MAX, "{node}");
            prop_assert!(gcp::check_node_name(&node).is_ok(), "{node}");
            prop_assert!(gcp::check_node_name(&qr).is_ok(), "{qr}");
            prop_assert!(seen.insert(node.clone()), "duplicate name {node}");
        }
    }

    #[test]
    fn entry_names_never_collide_across_entries(
        runner in runner_name(),
        a in entry_id(),
        b in entry_id(),
    ) {
        prop_assume!(a != b);
        let na = names::managed_node_name(&runner, &a, "v6e-8", "us-east1-d", 1);
        let nb = names::managed_node_name(&runner, &b, "v6e-8", "us-east1-d", 1);
        prop_assert_ne!(na, nb);
    }

    #[test]
    fn readers_never_panic_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_fleet("f.yaml", &text);
        let _ = parse_jobs("j.yaml", &text, None);
    }

    #[test]
    fn readers_never_panic_on_yaml_like_text(
        lines in proptest::collection::vec(
            prop_oneof![
                Just("tpus:".to_owned()), Just("jobs:".to_owned()), Just("  - ".to_owned()),
                Just("    type: v6e-16".to_owned()), Just("    count: 1".to_owned()),
                Just("name: x".to_owned()), Just("  - {tpu: any, command: x, buckets: [gs://bkt]}".to_owned()),
                "[a-z_]{1,8}: [a-z0-9\"'\\[\\]{}:, -]{0,12}",
                "  [a-z_]{1,8}: [a-z0-9\"'\\[\\]{}:, -]{0,12}",
            ],
            0..12,
        )
    ) {
        let text = lines.join("\n");
        let _ = parse_fleet("f.yaml", &text);
        let _ = parse_jobs("j.yaml", &text, None);
    }
}
