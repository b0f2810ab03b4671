//! `docs/config/plugin.md` against the parser: every key the page documents is read by
//! `NetConf::parse`, and every key the parser reads (`config::KEYS`, enforced by a debug
//! assertion in the parser) is documented.

use std::collections::BTreeSet;

use aliasnet_cni_types::{config::KEYS, NetConf};
use serde_json::{json, Value};

const PAGE: &str = include_str!("../../docs/config/plugin.md");

/// The first column of the table after `<!-- config-keys: NAME -->`.
fn table_keys(page: &str, name: &str) -> Vec<String> {
    let marker = format!("<!-- config-keys: {name} -->");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("{marker} missing from the page"));
    let keys: Vec<String> = page[start + marker.len()..]
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cell = l.split('|').nth(1)?.trim();
            Some(cell.strip_prefix('`')?.strip_suffix('`')?.to_owned())
        })
        .collect();
    assert!(!keys.is_empty(), "{marker}: no `key` rows");
    keys
}

fn documented() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for table in ["aliasnet", "cni"] {
        for k in table_keys(PAGE, table) {
            assert!(all.insert(k.clone()), "{k} is documented twice");
        }
    }
    all
}

#[test]
fn documented_keys_are_the_parsers_keys() {
    let parsed: BTreeSet<String> = KEYS.iter().map(|k| k.to_string()).collect();
    let documented = documented();
    let undocumented: Vec<_> = parsed.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&parsed).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "parsed but not in docs/config/plugin.md: {undocumented:?}; documented but not parsed: {unknown:?}"
    );
}

/// Each documented key really is read: one of a few values no key accepts (serde reads a
/// struct from a sequence, so one shape is not enough) is refused naming that key.
#[test]
fn every_documented_key_is_read_by_the_parser() {
    for key in documented() {
        let refused = [json!([[]]), json!(-1.5)].into_iter().any(|bad| {
            let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "aliasnet"});
            conf[&key] = bad;
            match NetConf::parse(&serde_json::to_vec(&conf).unwrap()) {
                Ok(_) => false,
                Err(e) => {
                    assert_eq!(e.code, 7, "{key}: {}", e.msg);
                    assert!(e.msg.contains(&key), "{key}: {}", e.msg);
                    true
                }
            }
        });
        assert!(
            refused,
            "{key}: every bad value was accepted, so the key is not read"
        );
    }
}

/// The page's example conflist is valid for the parser.
#[test]
fn the_example_parses() {
    let start = PAGE.find("```json").expect("a json example") + "```json".len();
    let end = start + PAGE[start..].find("```").unwrap();
    let list: Value = serde_json::from_str(&PAGE[start..end]).unwrap();
    let mut plugin = list["plugins"][0].clone();
    for k in ["cniVersion", "name"] {
        plugin[k] = list[k].clone();
    }
    NetConf::parse(&serde_json::to_vec(&plugin).unwrap()).unwrap();
}
