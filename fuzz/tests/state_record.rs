//! Fuzz target: ipamd's state records (`store::record`: frames, payloads of every type and
//! version, batch markers, file headers). Whole state directories: `state_log.rs`.
//!
//! Invariants, per frame: no panic; a frame is never read past its declared length or the
//! buffer; a decoded record re-encodes to a frame that decodes to the same record (byte for
//! byte for the current types); the zero-copy readers (`view_alloc`, `peek_alloc`,
//! `peek_release`) agree with the full decoder; a decoded allocation or release holds a key
//! (and pod fields) that the in-memory codec accepts; decoding allocates in proportion to the
//! payload.

mod common;

use aliasnet_fuzz::{alloc, config, corpus, corpus_dir, mutation, Bytes};
use aliasnet_ipam::{
    lease,
    store::{
        self,
        record::{self, AllocRec, CoolRec, Frame, Record, ReleaseRec, FRAME_HEADER},
    },
};
use common::{link, valid_key, valid_pod};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// Frame `payload` with a valid length and checksum.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; FRAME_HEADER];
    out.extend_from_slice(payload);
    record::seal(&mut out, 0);
    out
}

fn check_record(rec: &Record) {
    match rec {
        Record::Alloc(a) => {
            assert_eq!(
                lease::data_key_len(&a.data),
                Some(a.key_len),
                "alloc data {}",
                a.data.escape_ascii()
            );
            assert!(
                lease::key_is_valid(a.key()),
                "alloc key {}",
                a.key().escape_ascii()
            );
        }
        Record::Release(r) => {
            assert!(
                lease::key_is_valid(&r.key),
                "release key {}",
                r.key.escape_ascii()
            );
            if let Some(t) = &r.teardown {
                assert!(lease::validate_ifname("teardown", t).is_ok());
            }
        }
        Record::Cooling(c) => {
            if let Some(t) = &c.teardown {
                assert!(lease::validate_ifname("teardown", t).is_ok());
            }
        }
        Record::End { .. } => {}
    }
}

/// Everything that must hold of the bytes at the start of a log or snapshot region.
fn check_frame(buf: &[u8]) {
    let (frame, usage) = alloc::measure(|| record::read_frame(buf));
    assert!(
        usage.peak <= 4 * buf.len() + 4096,
        "{} bytes decoded with a peak of {}",
        buf.len(),
        usage.peak
    );
    let declared = buf
        .get(..4)
        .map(|h| u32::from_le_bytes(h.try_into().unwrap()) as usize);
    match &frame {
        Frame::Incomplete => {
            assert!(buf.len() < FRAME_HEADER || buf.len() < FRAME_HEADER + declared.unwrap());
        }
        Frame::Bad(_) => {}
        Frame::Ok(rec, n) => {
            assert_eq!(Some(*n), declared.map(|d| d + FRAME_HEADER));
            assert!(*n <= buf.len() && *n > FRAME_HEADER);
            assert!(matches!(record::check_frame(buf), Ok(l) if l + FRAME_HEADER == *n));
            check_record(rec);
            let mut again = Vec::new();
            record::encode(&mut again, rec);
            match record::read_frame(&again) {
                Frame::Ok(back, m) => {
                    assert_eq!(&back, rec);
                    assert_eq!(m, again.len());
                }
                other => panic!("our own encoding of {rec:?} reads as {other:?}"),
            }
            if matches!(buf[FRAME_HEADER], 3..=6) {
                assert_eq!(
                    &again[..],
                    &buf[..*n],
                    "current-format record not canonical"
                );
            }
        }
    }
    if let Ok(len) = record::check_frame(buf) {
        check_payload(&buf[FRAME_HEADER..FRAME_HEADER + len]);
    }
    for off in 0..buf.len().min(3) {
        if let Some(end) = record::verified_batch(buf, off) {
            assert!(end <= buf.len() && end > off);
        }
    }
    let _ = record::peek_batch(buf);
    for magic in [record::LOG_MAGIC, record::SNAPSHOT_MAGIC] {
        if let Ok((_, v)) = record::decode_header_version(buf, magic) {
            assert!((record::OLDEST_READABLE..=record::FORMAT_VERSION).contains(&v));
        }
    }
}

/// The fast readers agree with the full decoder on one payload.
fn check_payload(p: &[u8]) {
    let full = record::decode_payload(p);
    if let Ok(rec) = &full {
        check_record(rec);
    }
    match (p.first(), &full) {
        (Some(5 | 8), Ok(Record::Alloc(a))) => {
            let v = record::view_alloc(p)
                .expect("type 5 or 8")
                .expect("decodes fully");
            assert_eq!(
                (v.addr, v.allocated_at_ms, v.pool, v.data, v.key_len),
                (a.addr, a.allocated_at_ms, &*a.pool, &*a.data, a.key_len)
            );
            assert_eq!(record::peek_alloc(p), Some((a.addr, a.key())));
        }
        (Some(5 | 8), Err(_)) => {
            assert!(matches!(record::view_alloc(p), Some(Err(_))));
        }
        (Some(6 | 9), Ok(Record::Release(r))) => {
            assert_eq!(
                record::peek_release(p),
                Some((r.addr, r.released_at_ms, &*r.key, r.teardown.as_deref()))
            );
        }
        (Some(6 | 9), Err(_)) => assert_eq!(record::peek_release(p), None),
        _ => {
            assert!(record::view_alloc(p).is_none());
            assert!(record::peek_release(p).is_none());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Generators

/// An allocator address: IPv4 (below 2^32) or IPv6 (from 2^32 up).
fn addr() -> impl Strategy<Value = u128> {
    prop_oneof![
        any::<u32>().prop_map(u128::from),
        ((1u128 << 32)..=u128::MAX),
    ]
}

fn record_strategy() -> impl Strategy<Value = Record> {
    prop_oneof![
        (
            valid_key(),
            valid_pod(),
            link(),
            addr(),
            any::<u64>(),
            "[a-z]{0,8}"
        )
            .prop_map(|(k, pod, veth, addr, at, pool)| {
                let (data, key_len) = lease::encode_data(&k, &pod, veth.as_deref());
                Record::Alloc(AllocRec {
                    data,
                    key_len,
                    addr,
                    allocated_at_ms: at,
                    pool: pool.into(),
                })
            }),
        (valid_key(), addr(), any::<u64>(), link()).prop_map(|(k, addr, at, t)| {
            Record::Release(ReleaseRec {
                key: lease::encode_key(&k).into(),
                addr,
                released_at_ms: at,
                teardown: t.map(Into::into),
            })
        }),
        (addr(), any::<u64>(), link()).prop_map(|(addr, at, t)| {
            Record::Cooling(CoolRec {
                addr,
                released_at_ms: at,
                teardown: t.map(Into::into),
            })
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(leases, cooling)| Record::End { leases, cooling }),
    ]
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len().min(usize::from(u16::MAX)) as u16).to_le_bytes());
    out.extend_from_slice(&s[..s.len().min(usize::from(u16::MAX))]);
}

/// Payloads of the version-1 types (1 and 2), with hostile strings: what an old daemon
/// wrote, or what a damaged file with a matching checksum holds.
fn v1_payload() -> impl Strategy<Value = Vec<u8>> {
    let s = prop_oneof![
        3 => "[a-z0-9]{1,8}".prop_map(String::into_bytes),
        1 => aliasnet_fuzz::text().prop_map(String::into_bytes),
        1 => (1000usize..1100).prop_map(|n| vec![b'x'; n]),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ];
    let packed = (s.clone(), s.clone(), s.clone(), any::<bool>()).prop_map(|(a, b, c, two)| {
        let mut k = a;
        k.push(0);
        k.extend_from_slice(&b);
        if !two {
            k.push(0);
            k.extend_from_slice(&c);
        }
        k
    });
    let extra = proptest::collection::vec(s.clone(), 0..5).prop_map(|fields| {
        let mut e = Vec::new();
        for f in fields {
            e.extend_from_slice(&f);
            e.push(0);
        }
        e
    });
    prop_oneof![
        (
            any::<u32>(),
            any::<u64>(),
            any::<u8>(),
            packed.clone(),
            s.clone(),
            extra
        )
            .prop_map(|(addr, at, present, key, pool, extra)| {
                let mut p = vec![1u8];
                p.extend_from_slice(&addr.to_le_bytes());
                p.extend_from_slice(&at.to_le_bytes());
                p.push(present & 0x1f);
                put_str(&mut p, &key);
                put_str(&mut p, &pool);
                put_str(&mut p, &extra);
                p
            }),
        (any::<u32>(), any::<u64>(), packed, proptest::option::of(s)).prop_map(
            |(addr, at, key, teardown)| {
                let mut p = vec![2u8];
                p.extend_from_slice(&addr.to_le_bytes());
                p.extend_from_slice(&at.to_le_bytes());
                put_str(&mut p, &key);
                match teardown {
                    None => p.push(0),
                    Some(t) => {
                        p.push(1);
                        put_str(&mut p, &t);
                    }
                }
                p
            }
        ),
    ]
}

/// A payload: a valid record's, a version-1 one, or random bytes after a type byte; then
/// mutated and sealed with a valid checksum, so the content is what is under attack.
fn sealed_payload() -> impl Strategy<Value = Bytes> {
    let base = prop_oneof![
        3 => record_strategy().prop_map(|r| {
            let mut b = Vec::new();
            record::encode(&mut b, &r);
            b[FRAME_HEADER..].to_vec()
        }),
        2 => v1_payload(),
        1 => (0u8..12, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(t, mut b)| {
            b.insert(0, t);
            b
        }),
    ];
    (base, proptest::collection::vec(mutation(), 0..4)).prop_map(|(mut p, muts)| {
        for m in &muts {
            m.apply(&mut p, &[], &[]);
        }
        if p.is_empty() {
            p.push(4);
        }
        Bytes(framed(&p))
    })
}

// ---------------------------------------------------------------------------------------

#[test]
fn corpus_replays() {
    assert!(alloc::installed());
    for e in corpus("state_record") {
        let r = std::panic::catch_unwind(|| {
            check_frame(&e.bytes);
            if let Ok(len) = record::check_frame(&e.bytes) {
                check_payload(&e.bytes[FRAME_HEADER..FRAME_HEADER + len]);
            }
        });
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

/// Inputs the fuzzer found accepted though they broke an invariant: refused now.
#[test]
fn found_inputs_are_refused() {
    let found: Vec<_> = corpus("state_record")
        .into_iter()
        .filter(|e| e.name().starts_with("found-"))
        .collect();
    assert!(!found.is_empty());
    for e in found {
        assert!(
            matches!(record::read_frame(&e.bytes), Frame::Bad(_)),
            "{}",
            e.name()
        );
    }
}

/// Regenerate the seed entries (valid records of every type and version) after a format
/// change:
/// `cargo test -p aliasnet-fuzz --test state_record -- --ignored write_seed_corpus`.
#[test]
#[ignore]
fn write_seed_corpus() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let dir = corpus_dir("state_record");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..12 {
        let r = record_strategy().new_tree(&mut runner).unwrap().current();
        let mut b = Vec::new();
        record::encode(&mut b, &r);
        std::fs::write(dir.join(format!("seed-{i:02}.rec")), b).unwrap();
    }
    for i in 0..6 {
        let p = v1_payload().new_tree(&mut runner).unwrap().current();
        std::fs::write(dir.join(format!("seed-v1-{i:02}.rec")), framed(&p)).unwrap();
    }
    let mut batch = Vec::new();
    record::encode_batch(
        &mut batch,
        &store::encode_records(&[Record::End {
            leases: 0,
            cooling: 0,
        }]),
    );
    std::fs::write(dir.join("seed-batch.rec"), batch).unwrap();
}

fn corpus_bytes() -> Vec<Vec<u8>> {
    corpus("state_record")
        .into_iter()
        .map(|e| e.bytes)
        .collect()
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn sealed_payloads(frame in sealed_payload()) {
        check_frame(&frame);
    }

    #[test]
    fn mutated_frames(bytes in aliasnet_fuzz::mutated(corpus_bytes(), &[b"\x07", b"\x05", b"\x06", b"\xff\xff", b"\x00\x00\x00\x00"])) {
        check_frame(&bytes);
    }

    #[test]
    fn valid_keys_encode_losslessly(k in valid_key(), pod in valid_pod(), veth in link()) {
        let enc = lease::encode_key(&k);
        prop_assert!(lease::key_is_valid(&enc));
        prop_assert_eq!(lease::decode_key(&enc), k.clone());
        let (data, key_len) = lease::encode_data(&k, &pod, veth.as_deref());
        prop_assert_eq!(lease::data_key_len(&data), Some(key_len));
        prop_assert_eq!(&data[..usize::from(key_len)], &enc[..]);
    }
}
