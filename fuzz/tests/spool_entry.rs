//! Fuzz target: release spool entries as ipamd reads them at start (`spool::read_all`), the
//! checks it applies before acting on one (`lease::validate_*`), and the time it maps the
//! entry to (`Clock::spooled_at`).
//!
//! Invariants: no panic; reading one file never allocates more than the entry size limit
//! (whatever the file's size); the reader's verdict is the JSON decoder's; an accepted entry
//! prints and parses back to itself and survives a write and read through the spool; its time
//! on the daemon's clock is never later than now, whatever boot clock or wall time it claims.

use aliasnet_fuzz::{alloc, config, corpus, mutated, scratch, text, JSON_DICT};
use aliasnet_ipam::{clock::Clock, lease};
use aliasnet_ipam_proto::{
    spool::{self, SpoolEntry, MAX_ENTRY_BYTES},
    AttachmentKey,
};
use proptest::prelude::*;
use serde_json::json;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

const TARGET: &str = "spool_entry";

fn clocks() -> &'static [Clock] {
    static C: std::sync::OnceLock<Vec<Clock>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        // Wall clocks of a sane node, one stepped far back and one at the end of time.
        [1_700_000_000_000u64, 0, u64::MAX / 2]
            .into_iter()
            .map(|w| Clock::with_wall(Box::new(move || w)))
            .collect()
    })
}

fn check_file(bytes: &[u8]) {
    let dir = scratch();
    std::fs::write(dir.path().join("0123.json"), bytes).unwrap();
    let (all, usage) = alloc::measure(|| spool::read_all(dir.path()));
    let all = all.expect("a readable spool directory");
    assert_eq!(all.len(), 1);
    let limit = MAX_ENTRY_BYTES as usize;
    assert!(
        usage.largest <= 2 * limit + 4096,
        "reading a {}-byte entry allocated {}",
        bytes.len(),
        usage.largest
    );
    let direct = serde_json::from_slice::<SpoolEntry>(bytes);
    match &all[0].entry {
        Ok(e) => {
            assert!(bytes.len() <= limit);
            assert_eq!(Some(e), direct.as_ref().ok(), "reader and decoder disagree");
            check_entry(e);
        }
        Err(why) => {
            assert!(!why.is_empty());
            assert!(
                bytes.len() > limit || direct.is_err(),
                "refused a valid entry: {why}"
            );
        }
    }
}

/// What the daemon does with an entry that parsed, short of releasing.
fn check_entry(e: &SpoolEntry) {
    let text = serde_json::to_vec(e).expect("prints");
    assert_eq!(&serde_json::from_slice::<SpoolEntry>(&text).unwrap(), e);
    let _ = lease::validate_key(&e.key);
    if let Some(v) = &e.host_veth {
        if lease::validate_ifname("host_veth", v).is_ok() {
            assert!(v.len() <= 15);
        }
    }
    for c in clocks() {
        let at = c.spooled_at(e);
        assert!(at <= c.now_ms(), "{e:?} maps to {at}, after now");
    }
    // Through the writer and the reader again.
    let dir = scratch();
    spool::write(dir.path(), e).expect("write");
    let back = spool::read_all(dir.path()).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].entry.as_ref().ok(), Some(e));
}

#[test]
fn corpus_replays() {
    assert!(alloc::installed());
    for e in corpus(TARGET) {
        let r = std::panic::catch_unwind(|| check_file(&e.bytes));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

#[test]
fn a_huge_entry_is_refused_without_reading_it() {
    let dir = scratch();
    let big = format!(
        r#"{{"key":{{"network":"n","container_id":"c","ifname":"eth0"}},"released_at_ms":1,"x":"{}"}}"#,
        "a".repeat(16 << 20)
    );
    std::fs::write(dir.path().join("big.json"), &big).unwrap();
    drop(big);
    let (all, usage) = alloc::measure(|| spool::read_all(dir.path()).unwrap());
    assert!(all[0].entry.is_err());
    assert!(usage.largest < 4096, "allocated {}", usage.largest);
}

#[test]
fn boot_clock_values_map_to_no_later_than_now() {
    let Some((id, ms)) = spool::boot_clock() else {
        return;
    };
    for boot_ms in [0, 1, ms, ms + 1, ms.saturating_mul(2), u64::MAX] {
        for released_at_ms in [0, u64::MAX] {
            check_entry(&SpoolEntry {
                key: AttachmentKey::new("n", "c", "eth0"),
                host_veth: None,
                released_at_ms,
                boot_id: Some(id.clone()),
                boot_ms: Some(boot_ms),
            });
        }
    }
}

fn entry() -> impl Strategy<Value = serde_json::Value> {
    let ours = spool::boot_clock().map(|b| b.0).unwrap_or_default();
    let time = prop_oneof![
        any::<u64>().prop_map(serde_json::Value::from),
        Just(json!(0)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!("1")),
    ];
    (
        (text(), text(), text()),
        proptest::option::of(prop_oneof!["ali[0-9a-f]{12}", text()]),
        time.clone(),
        proptest::option::of(prop_oneof![Just(ours), text()]),
        proptest::option::of(time),
        proptest::option::of((text(), aliasnet_fuzz::json_value())),
    )
        .prop_map(|((n, c, i), veth, at, boot_id, boot_ms, extra)| {
            let mut o = json!({
                "key": {"network": n, "container_id": c, "ifname": i},
                "released_at_ms": at,
            });
            if let Some(v) = veth {
                o["host_veth"] = json!(v);
            }
            if let Some(b) = boot_id {
                o["boot_id"] = json!(b);
            }
            if let Some(b) = boot_ms {
                o["boot_ms"] = b;
            }
            if let Some((k, v)) = extra {
                o[k] = v;
            }
            o
        })
}

fn dict() -> &'static [&'static [u8]] {
    static D: std::sync::OnceLock<Vec<&'static [u8]>> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        let mut d: Vec<&'static [u8]> = JSON_DICT.to_vec();
        d.extend_from_slice(&[
            b"\"key\":",
            b"\"host_veth\":",
            b"\"released_at_ms\":",
            b"\"boot_id\":",
            b"\"boot_ms\":",
            b"\"network\":\"n\",",
            b"\"container_id\":\"c\",",
            b"\"ifname\":\"eth0\"",
        ]);
        d
    })
}

fn corpus_bytes() -> Vec<Vec<u8>> {
    corpus(TARGET).into_iter().map(|e| e.bytes).collect()
}

proptest! {
    // Each case writes a file or two (on tmpfs when there is one).
    #![proptest_config(config(1500))]

    #[test]
    fn generated_entries(v in entry()) {
        check_file(&serde_json::to_vec(&v).unwrap());
    }

    #[test]
    fn mutated_entries(bytes in mutated(corpus_bytes(), dict())) {
        check_file(&bytes);
    }
}
