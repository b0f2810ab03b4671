//! `docs/config/plugin.md` against the parser: every key the page documents is read by
//! `NetConf::parse`, and every key the parser reads (`config::KEYS`, enforced by a debug
//! assertion in the parser) is documented.

use std::collections::BTreeSet;

use aliasnet_cni_types::{config::KEYS, NetConf};
use serde_json::{json, Value};

#[path = "../../docs/config/doc_tables.rs"]
mod doc_tables;
use doc_tables::{assert_same_keys, example, table_keys};

const PAGE: &str = include_str!("../../docs/config/plugin.md");

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
    let documented: Vec<String> = documented().into_iter().collect();
    assert_same_keys("the network config", &documented, &parsed);
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
    let list: Value = serde_json::from_str(&example(PAGE, "json")).unwrap();
    let mut plugin = list["plugins"][0].clone();
    for k in ["cniVersion", "name"] {
        plugin[k] = list[k].clone();
    }
    NetConf::parse(&serde_json::to_vec(&plugin).unwrap()).unwrap();
}
