//! Fuzz target: ipamd's framing (`frame::parse_len`, `read_frame`) and its request decoder
//! (`frame::decode_request`, every operation), plus the checks the daemon applies to a
//! decoded request's names (`lease::validate_*`) and the compact key encoding they feed.
//!
//! Invariants: no panic; a length prefix over `MAX_FRAME` (up to 4 GiB) is refused before
//! any allocation; a reader never consumes past the frame it was told about, so the next
//! frame stays in sync; decoding allocates in proportion to the body, never to what it
//! claims; a decoded request encodes and decodes back to itself and agrees with serde's own
//! decoding of the type; a request whose names pass validation encodes its key losslessly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aliasnet_fuzz::{alloc, config, corpus, mutated, nested, text, Bytes, JSON_DICT};
use aliasnet_ipam::lease;
use aliasnet_ipam_proto::{
    frame::{self, FrameError, MAX_FRAME},
    Attachment, AttachmentKey, Family, LeaseRef, PodRef, Request, Response,
};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

const TARGET: &str = "ipam_frame";

/// Largest single allocation allowed while refusing or reading a frame header.
const HEADER_ALLOC: usize = 64 << 10;

/// Memory a request body of `len` bytes may cost while decoding: the kept strings and lists
/// (a GC list's elements are larger in memory than their shortest JSON, and grow by doubling).
fn decode_budget(len: usize) -> usize {
    4 * len + (16 << 10)
}

fn check_body(body: &[u8]) {
    let (decoded, usage) = alloc::measure(|| frame::decode_request(body));
    assert!(
        usage.peak <= decode_budget(body.len()),
        "decoding {} bytes peaked at {} bytes",
        body.len(),
        usage.peak
    );
    match decoded {
        Err(FrameError::Decode(_) | FrameError::Version { .. }) => {}
        Err(e) => panic!("unexpected error kind: {e:?}"),
        Ok(req) => {
            // Our own encoding of it decodes to it, with both decoders.
            let enc = frame::encode(&req);
            assert_eq!(
                frame::parse_len(enc[..4].try_into().unwrap()).ok(),
                Some(enc.len() - 4)
            );
            assert_eq!(frame::decode_request(&enc[4..]).ok().as_ref(), Some(&req));
            assert_eq!(
                frame::decode::<Request>(&enc[4..]).ok().as_ref(),
                Some(&req)
            );
            // Where serde's (buffering) decoding of the type also accepts the body, both agree.
            if let Ok(reference) = frame::decode::<Request>(body) {
                assert_eq!(reference, req, "decoders disagree");
            }
            check_request(&req);
        }
    }
    // A reply body is decoded by the plugin; it must not panic either.
    let _ = frame::decode::<Response>(body);
}

/// The daemon's checks of a request's names, and the key encoding behind a valid one.
fn check_request(req: &Request) {
    let (key, pod, link) = match req {
        Request::Allocate {
            key,
            pod,
            host_veth,
            ..
        } => (key, Some(pod), host_veth.as_deref()),
        Request::Release { key, teardown_link }
        | Request::ReleaseLease {
            key, teardown_link, ..
        } => (key, None, teardown_link.as_deref()),
        Request::Check { key } => (key, None, None),
        _ => return,
    };
    if let Some(l) = link {
        if lease::validate_ifname("link", l).is_ok() {
            assert!(!l.is_empty() && l.len() <= 15 && !l.contains('/'));
        }
    }
    if lease::validate_key(key).is_err() {
        return;
    }
    let enc = lease::encode_key(key);
    assert!(
        lease::key_is_valid(&enc),
        "valid key {key:?} encodes invalid"
    );
    assert_eq!(&lease::decode_key(&enc), key, "key codec is lossy");
    if let Some(pod) = pod.filter(|p| lease::validate_pod(p).is_ok()) {
        let veth = link.filter(|l| lease::validate_ifname("host_veth", l).is_ok());
        let (data, key_len) = lease::encode_data(key, pod, veth);
        assert_eq!(lease::data_key_len(&data), Some(key_len));
        assert_eq!(&data[..usize::from(key_len)], &enc[..]);
    }
}

/// Read frames from `stream` until it ends or fails, as a client reads replies.
fn check_stream(stream: &[u8]) {
    let mut rest = stream;
    while !rest.is_empty() {
        let before = rest.len();
        let declared = rest
            .get(..4)
            .map(|h| u32::from_be_bytes(h.try_into().unwrap()) as usize);
        let (r, usage) = alloc::measure(|| frame::read_frame::<_, Request>(&mut rest));
        let consumed = before - rest.len();
        match (&r, declared) {
            (Err(FrameError::TooLarge { len, max }), Some(d)) => {
                assert_eq!((*len, *max), (d, MAX_FRAME));
                assert!(d > MAX_FRAME);
                assert!(
                    usage.largest <= HEADER_ALLOC,
                    "refused {d} bytes after allocating {}",
                    usage.largest
                );
                return;
            }
            (Err(FrameError::Io(_)), _) => {
                assert!(consumed <= before);
                return;
            }
            (_, Some(d)) => {
                assert!(d <= MAX_FRAME);
                assert_eq!(consumed, 4 + d, "reader out of sync");
                if let Ok(req) = &r {
                    check_request(req);
                }
            }
            (other, None) => panic!("frame without a header: {other:?}"),
        }
        // The body as the server decodes it.
        check_body(&stream[stream.len() - before + 4..stream.len() - rest.len()]);
    }
}

#[test]
fn corpus_replays() {
    assert!(alloc::installed());
    for e in corpus(TARGET) {
        let r = std::panic::catch_unwind(|| check_stream(&e.bytes));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

#[test]
fn a_4_gib_length_prefix_is_refused_without_allocating() {
    for len in [u32::MAX, 1 << 31, MAX_FRAME as u32 + 1] {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(br#"{"v":1,"op":"list"}"#);
        let (r, usage) = alloc::measure(|| frame::read_frame::<_, Request>(&mut &bytes[..]));
        assert!(
            matches!(r, Err(FrameError::TooLarge { .. })),
            "{len}: {r:?}"
        );
        assert!(usage.largest < 1024, "{len}: allocated {}", usage.largest);
        assert!(frame::parse_len(len.to_be_bytes()).is_err());
    }
    assert_eq!(
        frame::parse_len((MAX_FRAME as u32).to_be_bytes()).unwrap(),
        MAX_FRAME
    );
}

#[test]
fn deep_nesting_is_skipped_in_place_or_refused() {
    let deep = format!(
        r#"{{"v":1,"op":"list","x":{}}}"#,
        nested("[", "]", 1 << 20, "")
    );
    let (r, usage) = alloc::measure(|| frame::decode_request(deep.as_bytes()));
    assert_eq!(r.unwrap(), Request::List);
    // Skipping keeps one byte per open level, never the values.
    assert!(usage.peak <= deep.len() / 2 + 4096, "peak {}", usage.peak);
    let kept = format!(
        r#"{{"v":1,"op":"check","key":{}}}"#,
        nested("{\"a\":", "}", 1 << 16, "1")
    );
    assert!(matches!(
        frame::decode_request(kept.as_bytes()),
        Err(FrameError::Decode(_))
    ));
}

fn key() -> impl Strategy<Value = AttachmentKey> {
    let name = prop_oneof![3 => "[a-z][a-z0-9-]{0,12}", 2 => text()];
    let id = prop_oneof![2 => "[0-9a-f]{64}", 1 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", 2 => text()];
    let ifname = prop_oneof![3 => "eth[0-9]", 2 => text()];
    (name, id, ifname).prop_map(|(network, container_id, ifname)| AttachmentKey {
        network,
        container_id,
        ifname,
    })
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(text())
}

fn veth() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![3 => "ali[0-9a-f]{12}", 1 => text()])
}

fn addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
    ]
}

fn families() -> impl Strategy<Value = Option<Vec<Family>>> {
    proptest::option::of(proptest::collection::vec(
        prop_oneof![Just(Family::Ipv4), Just(Family::Ipv6)],
        0..3,
    ))
}

fn request() -> impl Strategy<Value = Request> {
    let u64s = prop_oneof![any::<u64>(), Just(0u64), Just(u64::MAX)];
    let u32s = prop_oneof![any::<u32>(), Just(0u32), Just(u32::MAX)];
    prop_oneof![
        (
            key(),
            opt_text(),
            opt_text(),
            opt_text(),
            opt_text(),
            veth(),
            families()
        )
            .prop_map(|(key, namespace, name, uid, pool, host_veth, families)| {
                Request::Allocate {
                    key,
                    pod: PodRef {
                        namespace,
                        name,
                        uid,
                    },
                    pool,
                    host_veth,
                    families,
                }
            }),
        (key(), veth()).prop_map(|(key, teardown_link)| Request::Release { key, teardown_link }),
        (key(), veth(), addr(), u64s.clone()).prop_map(|(key, teardown_link, address, at)| {
            Request::ReleaseLease {
                key,
                teardown_link,
                lease: LeaseRef {
                    address,
                    allocated_at_ms: at,
                },
            }
        }),
        key().prop_map(|key| Request::Check { key }),
        Just(Request::List),
        (
            proptest::option::of(addr()),
            proptest::option::of(u32s.clone())
        )
            .prop_map(|(after, limit)| Request::ListPage { after, limit }),
        (text(), proptest::collection::vec((text(), text()), 0..20)).prop_map(|(network, v)| {
            Request::Gc {
                network,
                valid: v
                    .into_iter()
                    .map(|(container_id, ifname)| Attachment {
                        container_id,
                        ifname,
                    })
                    .collect(),
            }
        }),
        (opt_text(), families()).prop_map(|(pool, families)| Request::Status { pool, families }),
        Just(Request::Stats),
        (text(), u32s, u64s).prop_map(|(verb, code, duration_us)| Request::RecordOp {
            verb,
            code,
            duration_us,
        }),
    ]
}

/// A request as a client might send it: our encoding, with unknown members added anywhere
/// in the top level and the members in any order.
fn request_body() -> impl Strategy<Value = (Request, Vec<u8>)> {
    (
        request(),
        proptest::collection::vec((text(), aliasnet_fuzz::json_value()), 0..4),
        any::<proptest::sample::Index>(),
    )
        .prop_map(|(req, extra, rot)| {
            let enc = frame::encode(&req);
            let v: serde_json::Value = serde_json::from_slice(&enc[4..]).unwrap();
            let mut members: Vec<(String, serde_json::Value)> =
                v.as_object().unwrap().clone().into_iter().collect();
            for (k, v) in extra {
                // Unknown keys only: a known key with another value is another request.
                if ![
                    "v",
                    "op",
                    "key",
                    "pod",
                    "pool",
                    "host_veth",
                    "teardown_link",
                    "lease",
                    "after",
                    "limit",
                    "network",
                    "valid",
                    "verb",
                    "code",
                    "duration_us",
                ]
                .contains(&k.as_str())
                {
                    members.push((k, v));
                }
            }
            let n = members.len();
            members.rotate_left(rot.index(n));
            let text = format!(
                "{{{}}}",
                members
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::json!(k), v))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            (req, text.into_bytes())
        })
}

fn dict() -> &'static [&'static [u8]] {
    static D: std::sync::OnceLock<Vec<&'static [u8]>> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        let mut d: Vec<&'static [u8]> = JSON_DICT.to_vec();
        d.extend_from_slice(&[
            b"\xff\xff\xff\xff",
            b"\x00\x80\x00\x00",
            b"\x00\x80\x00\x01",
            b"\x00\x00\x00\x00",
            b"\"v\":1,",
            b"\"op\":\"gc\",",
            b"\"op\":\"release_lease\",",
            b"\"key\":{\"network\":\"n\",\"container_id\":\"c\",\"ifname\":\"eth0\"},",
            b"\"lease\":{\"address\":\"10.0.0.1\",\"allocated_at_ms\":1},",
            b"\"valid\":[{\"container_id\":\"c\",\"ifname\":\"eth0\"}],",
            b"\"after\":\"255.255.255.255\",",
        ]);
        d
    })
}

fn corpus_bytes() -> Vec<Vec<u8>> {
    corpus(TARGET).into_iter().map(|e| e.bytes).collect()
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn every_request_type_round_trips((req, body) in request_body()) {
        let got = frame::decode_request(&body).expect("a well-formed request decodes");
        prop_assert_eq!(&got, &req);
        check_body(&body);
        let mut framed = (body.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&body);
        check_stream(&framed);
    }

    #[test]
    fn mutated_frames(bytes in mutated(corpus_bytes(), dict())) {
        check_stream(&bytes);
        // The same bytes as a body whatever their header says (the server's second read).
        check_body(bytes.get(4..).unwrap_or_default());
    }

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes)) {
        check_stream(&bytes);
        check_body(&bytes);
    }
}
