//! `docs/config/shaperd.md` against the policy parser: the page's examples parse, every key of
//! the page's tables is set in one of them, and each table lists exactly the keys the parser
//! accepts there (serde's own list, from its unknown-field error: the raw policy structs deny
//! unknown fields).

use std::collections::BTreeSet;

use aliasnet_shaper::Policy;

#[path = "../../docs/config/doc_tables.rs"]
mod doc_tables;
use doc_tables::{assert_same_keys, examples, expected_fields, table_keys};

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
fn internet_keys_are_the_parsers() {
    let parsed = accepted_keys("[internet]\nzz_not_a_key = 1\n");
    assert_same_keys("[internet]", &table_keys(PAGE, "internet"), &parsed);
}

#[test]
fn class_keys_are_the_parsers() {
    let parsed = accepted_keys("[classes.mirrors]\nzz_not_a_key = 1\n");
    assert_same_keys("[classes.<name>]", &table_keys(PAGE, "class"), &parsed);
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

/// `[cluster]` (read by the cluster budget's parser, which refuses an unknown key in serde's
/// words).
#[test]
fn cluster_keys_are_the_parsers() {
    let parsed =
        accepted_keys("[cluster]\netcd_endpoints = [\"http://10.0.0.5:2379\"]\nzz_not_a_key = 1\n");
    assert_same_keys("[cluster]", &table_keys(PAGE, "cluster"), &parsed);
}

/// `[namespaces.<ns>.internet]` and `[namespaces.<ns>.classes.<class>]` take the same keys,
/// the table documents both.
#[test]
fn namespace_limit_keys_are_the_parsers() {
    let documented = table_keys(PAGE, "namespace-limits");
    for (what, text) in [
        (
            "[namespaces.<name>.internet]",
            "[namespaces.research.internet]\nzz_not_a_key = 1\n",
        ),
        (
            "[namespaces.<name>.classes.<class>]",
            "[classes.mirrors]\n[namespaces.research.classes.mirrors]\nzz_not_a_key = 1\n",
        ),
    ] {
        assert_same_keys(what, &documented, &accepted_keys(text));
    }
}

/// The tables of `doc` at `path` (`*` for every entry of a table of tables).
fn tables<'a>(doc: &'a toml::Table, path: &[&str]) -> Vec<&'a toml::Table> {
    let Some((first, rest)) = path.split_first() else {
        return vec![doc];
    };
    let children: Vec<&toml::Value> = if *first == "*" {
        doc.values().collect()
    } else {
        doc.get(*first).into_iter().collect()
    };
    children
        .into_iter()
        .filter_map(toml::Value::as_table)
        .flat_map(|t| tables(t, rest))
        .collect()
}

/// Every documented key is accepted: each example parses, and each key of each table is set
/// where that table is in one of them.
#[test]
fn the_examples_parse_and_use_every_key() {
    let docs: Vec<toml::Table> = examples(PAGE, "toml")
        .iter()
        .map(|text| {
            Policy::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            text.parse().unwrap()
        })
        .collect();
    assert!(docs.len() >= 2, "the page shows the older spellings too");
    for (table, paths) in [
        ("top", &[&[][..]][..]),
        ("internet", &[&["internet"][..]]),
        ("class", &[&["classes", "*"][..]]),
        ("namespace", &[&["namespaces", "*"][..]]),
        ("cluster", &[&["cluster"][..]]),
        (
            "namespace-limits",
            &[
                &["namespaces", "*", "internet"][..],
                &["namespaces", "*", "classes", "*"],
            ],
        ),
    ] {
        for key in table_keys(PAGE, table) {
            for path in paths {
                assert!(
                    docs.iter()
                        .flat_map(|d| tables(d, path))
                        .any(|t| t.contains_key(&key)),
                    "no example sets {key} in {}",
                    path.join(".")
                );
            }
        }
    }
}

/// What the page says about limits: the older and newer spelling of one limit together are
/// refused naming both, and more than 32 classes are refused naming the key.
#[test]
fn the_rules_the_page_states_hold() {
    for (text, names) in [
        (
            "pod_internet_egress_rate = \"1M\"\n[internet]\npod_egress_rate = \"1M\"\n",
            ["pod_internet_egress_rate", "internet.pod_egress_rate"],
        ),
        (
            "node_internet_egress_cap = \"1M\"\n[internet]\nnode_egress_rate = \"2M\"\n",
            ["node_internet_egress_cap", "internet.node_egress_rate"],
        ),
        (
            "[namespaces.a]\ninternet_egress_rate = \"1M\"\n[namespaces.a.internet]\npod_egress_rate = \"1M\"\n",
            [
                "namespaces.a.internet_egress_rate",
                "namespaces.a.internet.pod_egress_rate",
            ],
        ),
    ] {
        let e = Policy::parse(text).expect_err(text);
        for n in names {
            assert!(e.contains(n), "{e:?} does not name {n}");
        }
    }
    let classes: String = (0..33)
        .map(|i| format!("[classes.c{i}]\ncidrs = [\"203.0.{i}.0/24\"]\n"))
        .collect();
    let e = Policy::parse(&classes).expect_err("33 classes");
    assert!(e.starts_with("classes:") && e.contains("32"), "{e}");
    let classes: String = (0..32)
        .map(|i| format!("[classes.c{i}]\ncidrs = [\"203.0.{i}.0/24\"]\n"))
        .collect();
    Policy::parse(&classes).expect("32 classes");
}
