//! Fuzz target: ipamd's state directories as `Store::open` loads them at start (a log of
//! batches behind their markers, torn, damaged or mutated).
//!
//! Invariants: `Store::open` returns or refuses, never panics; what it accepted loads again
//! unchanged, with no torn tail left behind; a log cut at any byte (a power cut, the rest
//! zeros or nothing) loads exactly the batches that were complete before the cut.

mod common;

use std::collections::BTreeMap;

use aliasnet_fuzz::{config, corpus, corpus_dir, mutation, scratch, Mutation};
use aliasnet_ipam::{
    lease,
    store::{
        self,
        record::{self, AllocRec, Record, LOG_MAGIC},
        Store,
    },
};
use common::{link, valid_key, valid_pod};
use proptest::prelude::*;

/// A history: allocations of distinct keys and addresses, and releases of some of them, in
/// group commits (batches).
#[derive(Debug, Clone)]
struct History {
    batches: Vec<Vec<Record>>,
}

type Summary = (BTreeMap<u128, Vec<u8>>, BTreeMap<u128, u64>);

impl History {
    /// Leases (address -> data) and cooling addresses (-> release time) after `n` batches.
    fn state_after(&self, n: usize) -> Summary {
        let mut leases = BTreeMap::new();
        let mut cooling = BTreeMap::new();
        for b in &self.batches[..n] {
            for r in b {
                match r {
                    Record::Alloc(a) => {
                        cooling.remove(&a.addr);
                        leases.insert(a.addr, a.data.to_vec());
                    }
                    Record::Release(r) => {
                        leases.remove(&r.addr);
                        cooling.insert(r.addr, r.released_at_ms);
                    }
                    _ => unreachable!(),
                }
            }
        }
        (leases, cooling)
    }

    /// The log file: header, then each batch behind its marker.
    fn log(&self) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        record::encode_header(&mut out, LOG_MAGIC, 0);
        let mut ends = Vec::new();
        for b in &self.batches {
            record::encode_batch(&mut out, &store::encode_records(b));
            ends.push(out.len());
        }
        (out, ends)
    }
}

fn history() -> impl Strategy<Value = History> {
    (
        proptest::collection::vec((valid_key(), valid_pod(), link()), 1..12),
        proptest::collection::vec(any::<bool>(), 12),
        proptest::collection::vec(1usize..4, 1..8),
    )
        .prop_map(|(keys, release, sizes)| {
            let mut recs = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for (i, (k, pod, veth)) in keys.into_iter().enumerate() {
                if !seen.insert(lease::encode_key(&k)) {
                    continue;
                }
                // Both families: IPv4 and IPv6 records interleave in one log.
                let addr = if i % 2 == 0 {
                    0x0a00_0000 + i as u128
                } else {
                    0xfd00_0240_u128 << 96 | i as u128
                };
                let (data, key_len) = lease::encode_data(&k, &pod, veth.as_deref());
                recs.push(Record::Alloc(AllocRec {
                    data,
                    key_len,
                    addr,
                    allocated_at_ms: 1_000 + i as u64,
                    pool: "p".into(),
                }));
                if release[i] {
                    recs.push(store::release_record(
                        lease::encode_key(&k).into(),
                        addr,
                        2_000 + i as u64,
                        veth.map(Into::into),
                    ));
                }
            }
            let mut batches = Vec::new();
            let mut it = recs.into_iter().peekable();
            let mut s = sizes.into_iter().cycle();
            while it.peek().is_some() {
                let n = s.next().unwrap_or(1);
                batches.push(it.by_ref().take(n).collect());
            }
            History { batches }
        })
}

fn summary(l: &store::Loaded) -> Summary {
    let leases = l
        .leases
        .iter()
        .map(|(_, e)| (e.addr, e.data.to_vec()))
        .collect();
    let cooling = l.cooling.iter().map(|(a, (t, _))| (*a, *t)).collect();
    (leases, cooling)
}

/// Open a state directory holding `log`; whatever it holds, no panic, and what loads once
/// loads again the same. Returns the loaded summary.
fn open_twice(log: &[u8]) -> Result<Summary, String> {
    let dir = scratch();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join(store::log_name(0)), log).unwrap();
    let first = match Store::open(&state) {
        Ok((s, l)) => {
            drop(s);
            summary(&l)
        }
        Err(e) => return Err(e.to_string()),
    };
    let (s, l) = Store::open(&state).expect("a state that loaded once loads again");
    drop(s);
    assert_eq!(l.truncated, 0, "the first open left a torn tail behind");
    assert_eq!(summary(&l), first, "second load differs");
    Ok(first)
}

#[test]
fn corpus_replays() {
    for e in corpus("state_log") {
        let r = std::panic::catch_unwind(|| {
            let _ = open_twice(&e.bytes);
        });
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

/// Regenerate the seed entries (logs of a few batches) after a format change:
/// `cargo test -p aliasnet-fuzz --test state_log -- --ignored write_seed_corpus`.
#[test]
#[ignore]
fn write_seed_corpus() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let dir = corpus_dir("state_log");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..6 {
        let h = history().new_tree(&mut runner).unwrap().current();
        let (mut log, _) = h.log();
        log.resize(log.len() + 4096, 0);
        std::fs::write(dir.join(format!("seed-{i:02}.log")), log).unwrap();
    }
}

fn corpus_bytes() -> Vec<Vec<u8>> {
    corpus("state_log").into_iter().map(|e| e.bytes).collect()
}

/// A log-level mutation: the byte mutations, plus a zeroed page (a page the power cut lost).
fn log_mutation() -> impl Strategy<Value = (Option<Mutation>, Option<(usize, usize)>)> {
    prop_oneof![
        3 => mutation().prop_map(|m| (Some(m), None)),
        1 => (any::<usize>(), 1usize..64).prop_map(|(at, len)| (None, Some((at, len)))),
    ]
}

proptest! {
    // Each case writes and opens a state directory twice: fewer cases.
    #![proptest_config(config(300))]

    #[test]
    fn a_log_cut_anywhere_loads_the_complete_batches(h in history(), cut in any::<proptest::sample::Index>(), zeros in 0usize..3) {
        let (log, ends) = h.log();
        let at = record::HEADER_LEN + cut.index(log.len() - record::HEADER_LEN + 1);
        let mut torn = log[..at].to_vec();
        // The rest of a pre-allocated log is zeros (or the file ends at the cut).
        torn.resize(at + zeros * 1000, 0);
        // Complete: every byte of the batch survived (a cut inside trailing zero bytes of the
        // last record, refilled with zeros, loses nothing).
        let complete = ends.iter().filter(|e| torn.get(..**e) == Some(&log[..**e])).count();
        let got = open_twice(&torn).map_err(|e| TestCaseError::fail(format!("cut at {at}: {e}")))?;
        prop_assert_eq!(got, h.state_after(complete));
    }

    #[test]
    fn damaged_logs_load_or_are_refused(
        h in history(),
        muts in proptest::collection::vec(log_mutation(), 1..4),
    ) {
        let (mut log, _) = h.log();
        log.resize(log.len() + 512, 0);
        for m in &muts {
            match m {
                (Some(m), _) => m.apply(&mut log, &[], &[]),
                (None, Some((at, len))) => {
                    let n = log.len();
                    if n > 0 {
                        let at = at % n;
                        let end = (at + len * 8).min(n);
                        log[at..end].fill(0);
                    }
                }
                _ => {}
            }
        }
        let _ = open_twice(&log);
    }

    #[test]
    fn mutated_logs(bytes in aliasnet_fuzz::mutated(corpus_bytes(), &[b"\x00\x00\x00\x00\x00\x00\x00\x00"])) {
        let _ = open_twice(&bytes);
    }
}
