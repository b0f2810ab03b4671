//! Reading the key tables of the pages in this directory, for the tests that check each page
//! against its parser (`cni-types/tests/config_doc.rs`, `ipam/tests/config_doc.rs`,
//! `shaper/tests/config_doc.rs` include this file with `#[path]`).
//!
//! A key table follows a `<!-- config-keys: NAME -->` line; its rows start with `|` and the
//! first cell of a key row is the key in backticks.

#![allow(dead_code)]

use std::collections::BTreeSet;

/// The keys of the table `name` of `page`, in order; panics if the table is missing or empty.
pub fn table_keys(page: &str, name: &str) -> Vec<String> {
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

/// The text of the first fenced block of `lang` in `page`.
pub fn example(page: &str, lang: &str) -> String {
    let fence = format!("```{lang}\n");
    let start = page
        .find(&fence)
        .unwrap_or_else(|| panic!("no {lang} example on the page"))
        + fence.len();
    let end = start + page[start..].find("```").expect("an unterminated example");
    page[start..end].to_owned()
}

/// The text of every fenced block of `lang` in `page`, in order.
pub fn examples(page: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(i) = rest.find(&fence) {
        let body = &rest[i + fence.len()..];
        let end = body.find("```").expect("an unterminated example");
        out.push(body[..end].to_owned());
        rest = &body[end + 3..];
    }
    out
}

/// The field names serde lists in its unknown-field error ("unknown field `x`, expected one
/// of `a`, `b`" or "expected `a`"): the parser's own list of the keys it accepts.
pub fn expected_fields(message: &str) -> BTreeSet<String> {
    let rest = message
        .split_once("expected one of ")
        .or_else(|| message.split_once("expected "))
        .unwrap_or_else(|| panic!("not serde's unknown-field error: {message}"))
        .1;
    let list = rest.lines().next().unwrap_or_default();
    list.split(", ")
        .filter_map(|f| f.trim().strip_prefix('`')?.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Panics with both differences unless `documented` and `parsed` are the same set.
pub fn assert_same_keys(what: &str, documented: &[String], parsed: &BTreeSet<String>) {
    let doc: BTreeSet<String> = documented.iter().cloned().collect();
    assert_eq!(
        doc.len(),
        documented.len(),
        "{what}: a key is documented twice"
    );
    let undocumented: Vec<_> = parsed.difference(&doc).collect();
    let unknown: Vec<_> = doc.difference(parsed).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "{what}: accepted by the parser but not documented: {undocumented:?}; documented but not accepted: {unknown:?}"
    );
}
