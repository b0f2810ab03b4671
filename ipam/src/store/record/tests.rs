use super::*;

fn samples() -> Vec<Record> {
    let key = AttachmentKey::new("n", "c", "eth0");
    let pod = PodRef {
        namespace: Some("ns".into()),
        ..PodRef::default()
    };
    let (data, key_len) = encode_data(&key, &pod, Some("ali1"));
    vec![
        Record::Alloc(AllocRec {
            data,
            key_len,
            addr: 0x0a00_0001,
            allocated_at_ms: 123,
            pool: "p".into(),
        }),
        Record::Release(ReleaseRec {
            key: crate::lease::encode_key(&key).into(),
            addr: 0x0a00_0001,
            released_at_ms: 456,
            teardown: Some("ali1".into()),
        }),
        Record::Cooling(CoolRec {
            addr: 7,
            released_at_ms: 8,
            teardown: None,
        }),
        Record::End {
            leases: 1,
            cooling: 2,
        },
    ]
}

/// A version-1 record as the first format wrote it.
fn v1_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; FRAME_HEADER];
    out.extend_from_slice(payload);
    seal(&mut out, 0);
    out
}

#[test]
fn version_1_records_are_read() {
    let mut p = vec![1u8];
    p.extend_from_slice(&0x0a00_0001u32.to_le_bytes());
    p.extend_from_slice(&123u64.to_le_bytes());
    p.push(crate::lease::HAS_NAMESPACE | crate::lease::HAS_VETH);
    put_str(&mut p, "n\0c\0eth0");
    put_str(&mut p, "p");
    put_str(&mut p, "ns\0ali1\0");
    let Frame::Ok(rec, _) = read_frame(&v1_frame(&p)) else {
        panic!()
    };
    assert_eq!(rec, samples()[0]);
    let mut p = vec![2u8];
    p.extend_from_slice(&0x0a00_0001u32.to_le_bytes());
    p.extend_from_slice(&456u64.to_le_bytes());
    put_str(&mut p, "n\0c\0eth0");
    put_opt(&mut p, Some("ali1"));
    let Frame::Ok(rec, _) = read_frame(&v1_frame(&p)) else {
        panic!()
    };
    assert_eq!(rec, samples()[1]);
    // A malformed v1 key is refused.
    let mut p = vec![2u8];
    p.extend_from_slice(&[0; 12]);
    put_str(&mut p, "n\0c");
    put_opt(&mut p, None);
    assert!(matches!(read_frame(&v1_frame(&p)), Frame::Bad(_)));
}

#[test]
fn round_trip() {
    let mut buf = Vec::new();
    for r in samples() {
        encode(&mut buf, &r);
    }
    let mut off = 0;
    for want in samples() {
        match read_frame(&buf[off..]) {
            Frame::Ok(r, n) => {
                assert_eq!(r, want);
                off += n;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(off, buf.len());
}

#[test]
fn damage_is_detected() {
    let mut buf = Vec::new();
    encode(&mut buf, &samples()[0]);
    assert!(matches!(
        read_frame(&buf[..buf.len() - 1]),
        Frame::Incomplete
    ));
    assert!(matches!(read_frame(&buf[..5]), Frame::Incomplete));
    let mut flipped = buf.clone();
    flipped[12] ^= 1;
    assert!(matches!(read_frame(&flipped), Frame::Bad(_)));
    let zeros = vec![0u8; 64];
    assert!(matches!(read_frame(&zeros), Frame::Bad(_)));
}

#[test]
fn header_checks() {
    let mut h = Vec::new();
    encode_header(&mut h, LOG_MAGIC, 42);
    assert_eq!(h.len(), HEADER_LEN);
    assert_eq!(decode_header(&h, LOG_MAGIC).unwrap(), 42);
    assert!(decode_header(&h, SNAPSHOT_MAGIC).is_err());
    let mut v9 = h.clone();
    v9[8] = 9;
    assert!(decode_header(&v9, LOG_MAGIC).is_err());
    assert!(decode_header(&h[..10], LOG_MAGIC).is_err());
}
