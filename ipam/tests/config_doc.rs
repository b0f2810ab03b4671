//! `docs/config/ipamd.md` against the parser: the page's example parses, every key of the
//! page's tables is in it, and the tables list exactly the keys the parser accepts (serde's
//! own list, from its unknown-field error: the raw config structs deny unknown fields).

use std::path::Path;

use aliasnet_ipam::config::{Config, ConfigError};

#[path = "../../docs/config/doc_tables.rs"]
mod doc_tables;
use doc_tables::{assert_same_keys, example, expected_fields, table_keys};

const PAGE: &str = include_str!("../../docs/config/ipamd.md");

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("ipamd.toml"))
}

/// The keys the parser accepts where `text` puts the unknown key `zz_not_a_key`.
fn accepted_keys(text: &str) -> std::collections::BTreeSet<String> {
    match parse(text) {
        Err(ConfigError::Parse { message, .. }) => {
            assert!(message.contains("zz_not_a_key"), "{message}");
            expected_fields(&message)
        }
        other => panic!("an unknown key was not refused: {other:?}"),
    }
}

#[test]
fn top_level_keys_are_the_parsers() {
    let parsed = accepted_keys("zz_not_a_key = 1\n");
    assert_same_keys("ipamd.toml", &table_keys(PAGE, "top"), &parsed);
}

#[test]
fn pool_keys_are_the_parsers() {
    let parsed = accepted_keys("[[pool]]\nzz_not_a_key = 1\n");
    assert_same_keys("[[pool]]", &table_keys(PAGE, "pool"), &parsed);
}

/// Every documented key is accepted: the example holds each of them and parses.
#[test]
fn the_example_parses_and_uses_every_key() {
    let text = example(PAGE, "toml");
    let conf = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(conf.pools.len(), 5);
    let families: Vec<_> = conf.pools.iter().map(|p| p.family.as_str()).collect();
    assert_eq!(families, ["ipv4", "ipv4", "ipv6", "ipv6", "ipv4"]);
    let doc: toml::Table = text.parse().unwrap();
    for key in table_keys(PAGE, "top") {
        assert!(doc.contains_key(&key), "the example does not set {key}");
    }
    let pools = doc["pool"].as_array().unwrap();
    for key in table_keys(PAGE, "pool") {
        assert!(
            pools
                .iter()
                .any(|p| p.as_table().unwrap().contains_key(&key)),
            "no pool of the example sets {key}"
        );
    }
}
