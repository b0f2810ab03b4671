//! `docs/config/shaperd.md` against the policy parser: the page's example parses, every key of
//! the page's tables is in it, and the tables list exactly the keys the parser accepts
//! (serde's own list, from its unknown-field error: the raw policy structs deny unknown
//! fields).

use std::collections::BTreeSet;

use aliasnet_shaper::Policy;

#[path = "../../docs/config/doc_tables.rs"]
mod doc_tables;
use doc_tables::{assert_same_keys, example, expected_fields, table_keys};

const PAGE: &str = include_str!("../../docs/config/shaperd.md");

/// The keys the parser accepts where `text` puts the unknown key `zz_not_a_key`.
fn accepted_keys(text: &str) -> BTreeSet<String> {
    let message = Policy::parse(text).expect_err("an unknown key was not refused");
    assert!(message.contains("zz_not_a_key"), "{message}");
    expected_fields(&message)
}

#[test]
fn top_level_keys_are_the_parsers() {
    let parsed = accepted_keys("zz_not_a_key = 1\n");
    assert_same_keys("shaper.toml", &table_keys(PAGE, "top"), &parsed);
}

#[test]
fn namespace_keys_are_the_parsers() {
    let parsed = accepted_keys("[namespaces.research]\nzz_not_a_key = 1\n");
    assert_same_keys(
        "[namespaces.<name>]",
        &table_keys(PAGE, "namespace"),
        &parsed,
    );
}

/// Every documented key is accepted: the example holds each of them and parses.
#[test]
fn the_example_parses_and_uses_every_key() {
    let text = example(PAGE, "toml");
    Policy::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let doc: toml::Table = text.parse().unwrap();
    for key in table_keys(PAGE, "top") {
        assert!(doc.contains_key(&key), "the example does not set {key}");
    }
    let namespaces = doc["namespaces"].as_table().unwrap();
    for key in table_keys(PAGE, "namespace") {
        assert!(
            namespaces
                .values()
                .any(|ns| ns.as_table().unwrap().contains_key(&key)),
            "no namespace of the example sets {key}"
        );
    }
}
