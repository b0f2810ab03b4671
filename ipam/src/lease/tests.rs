use super::*;

fn entry(key: &AttachmentKey, pod: &PodRef, veth: Option<&str>, addr: u32) -> LeaseEntry {
    entry_at(key, pod, veth, Addr::from(addr))
}

fn entry_at(key: &AttachmentKey, pod: &PodRef, veth: Option<&str>, addr: Addr) -> LeaseEntry {
    let (data, key_len) = encode_data(key, pod, veth);
    LeaseEntry {
        data,
        allocated_at_ms: 7,
        addr,
        key_len,
        pool_name: 0,
        state: LeaseState::Committed,
        seen: false,
    }
}

#[test]
fn fields_round_trip_in_every_encoding() {
    let cid = "0123456789abcdef".repeat(4);
    for (c, u) in [
        (cid.as_str(), "123e4567-e89b-12d3-a456-426614174000"),
        ("ABC", "not-a-uuid"),
        ("abc", "123E4567-E89B-12D3-A456-426614174000"),
        ("ab", ""),
        ("recovered:ali1234", "x"),
    ] {
        let key = AttachmentKey::new("net", c, "eth0");
        let pod = PodRef {
            namespace: Some("ns".into()),
            name: None,
            uid: Some(u.into()),
        };
        let e = entry(&key, &pod, Some("ali0123456789ab"), 0x0a00_0001);
        assert_eq!(data_key_len(&e.data), Some(e.key_len));
        let l = e.to_lease("p");
        assert_eq!(l.key, key);
        assert_eq!(l.pod, pod);
        assert_eq!(l.host_veth.as_deref(), Some("ali0123456789ab"));
        assert!(e.host_veth_is("ali0123456789ab"));
        assert!(e.network_is("net") && !e.network_is("ne"));
        assert_eq!(encode_key(&key), e.key());
    }
    // The common case is compact: 64 hex digits take 33 bytes.
    let key = AttachmentKey::new("aliasnet", &cid, "eth0");
    assert_eq!(encode_key(&key).len(), 9 + 34 + 5);
}

#[test]
fn hex_field_compares_without_decoding() {
    let mut b = Vec::new();
    put_field(&mut b, "00ff");
    let mut pos = 0;
    let f = read_field(&b, &mut pos).unwrap();
    assert!(f.eq_str("00ff"));
    assert!(!f.eq_str("00fe") && !f.eq_str("00ff00") && !f.eq_str("00FF"));
}

#[test]
fn non_canonical_bytes_are_rejected() {
    // "ab" written raw instead of hex-packed.
    let mut b = vec![(2 << 2) as u8];
    b.extend_from_slice(b"ab");
    assert!(read_field(&b, &mut 0).is_none());
    assert!(!key_is_valid(b"\x00\x00\x00"), "empty parts");
    assert!(
        data_key_len(&[4, b'a', 4, b'b', 4, b'c', 0x10]).is_none(),
        "bad present bits"
    );
    assert_eq!(data_key_len(&[4, b'g', 4, b'h', 4, b'i', 0]), Some(6));
    // A pod field whose text does not decode loads (its framing is sound) and reads as
    // absent; the fields after it still decode.
    let data: Box<[u8]> = vec![
        4,
        b'g',
        4,
        b'h',
        4,
        b'i',
        HAS_NAME | HAS_VETH,
        8,
        0xff,
        0xfe,
        8,
        b'v',
        b'1',
    ]
    .into();
    assert_eq!(data_key_len(&data), Some(6));
    let e = LeaseEntry {
        data,
        allocated_at_ms: 0,
        addr: 1,
        key_len: 6,
        pool_name: 0,
        state: LeaseState::Committed,
        seen: true,
    };
    let l = e.to_lease("p");
    assert_eq!((l.pod.name, l.host_veth.as_deref()), (None, Some("v1")));
    // Framing errors are refused: a UUID of the wrong length, a field past the end.
    assert!(
        data_key_len(&[4, b'g', 4, b'h', 4, b'i', HAS_UID, (4 << 2) | 2, 1, 2, 3, 4]).is_none()
    );
    assert!(data_key_len(&[4, b'g', 4, b'h', 4, b'i', HAS_NAME, 40, b'x']).is_none());
}

#[test]
fn table_indexes_by_key_and_address() {
    let mut t = LeaseTable::default();
    let pod = PodRef::default();
    let ka = AttachmentKey::new("n", "a", "eth0");
    let kb = AttachmentKey::new("n", "b", "eth0");
    let a = t.insert(entry(&ka, &pod, None, 5)).unwrap();
    let b = t.insert(entry(&kb, &pod, None, 3)).unwrap();
    assert_eq!(
        t.insert(entry(&ka, &pod, None, 9)),
        Err(InsertError::Key(a))
    );
    let kc = AttachmentKey::new("n", "c", "eth0");
    assert_eq!(
        t.insert(entry(&kc, &pod, None, 3)),
        Err(InsertError::Addr(b))
    );
    assert_eq!(t.find(&encode_key(&kb), Family::Ipv4), Some(b));
    assert_eq!(t.find(&encode_key(&kb), Family::Ipv6), None);
    assert_eq!(t.after_addr(None).collect::<Vec<_>>(), vec![(3, b), (5, a)]);
    assert_eq!(t.after_addr(Some(3)).collect::<Vec<_>>(), vec![(5, a)]);
    t.remove(b);
    assert_eq!(t.find(&encode_key(&kb), Family::Ipv4), None);
    assert_eq!(t.len(), 1);
    // The vacant slot is reused.
    assert_eq!(t.insert(entry(&kc, &pod, None, 3)).unwrap(), b);
    for i in 0..1000u32 {
        let k = AttachmentKey::new("n", &format!("k{i}"), "eth0");
        t.insert(entry(&k, &pod, None, 100 + i)).unwrap();
    }
    for i in 0..1000u32 {
        let k = AttachmentKey::new("n", &format!("k{i}"), "eth0");
        let id = t.find(&encode_key(&k), Family::Ipv4).unwrap();
        assert_eq!(t.get(id).addr, Addr::from(100 + i));
    }
}

#[test]
fn validation() {
    assert!(validate_key(&AttachmentKey::new("n", "", "eth0")).is_err());
    assert!(validate_key(&AttachmentKey::new("n", "c\0", "eth0")).is_err());
    assert!(validate_key(&AttachmentKey::new("n", &"x".repeat(2000), "eth0")).is_err());
    assert!(validate_key(&AttachmentKey::new("n", "c", "eth0")).is_ok());
    assert!(validate_ifname("host_veth", "ali0123456789ab").is_ok());
    assert!(validate_ifname("host_veth", "ali0123456789abc").is_err());
    assert!(validate_ifname("host_veth", "a/b").is_err());
}

#[test]
fn a_key_holds_one_lease_per_family() {
    let mut t = LeaseTable::default();
    let pod = PodRef::default();
    let k = AttachmentKey::new("n", "a", "eth0");
    let v6: Addr = u128::from("fd00:240::5".parse::<std::net::Ipv6Addr>().unwrap());
    let a = t.insert(entry(&k, &pod, None, 7)).unwrap();
    let b = t.insert(entry_at(&k, &pod, None, v6)).unwrap();
    assert_eq!(
        t.insert(entry_at(&k, &pod, None, v6 + 1)),
        Err(InsertError::Key(b))
    );
    let key = encode_key(&k);
    assert_eq!(t.find(&key, Family::Ipv4), Some(a));
    assert_eq!(t.find(&key, Family::Ipv6), Some(b));
    assert_eq!(t.find_all(&key).collect::<Vec<_>>(), vec![a, b]);
    // IPv4 sorts first; paging continues from an IPv4 address into the IPv6 ones.
    assert_eq!(
        t.after_addr(None).collect::<Vec<_>>(),
        vec![(7, a), (v6, b)]
    );
    assert_eq!(t.after_addr(Some(7)).collect::<Vec<_>>(), vec![(v6, b)]);
    assert_eq!(addr_ip(v6), "fd00:240::5".parse::<IpAddr>().unwrap());
    assert_eq!(ip_addr(addr_ip(v6)), Some(v6));
    assert_eq!(ip_addr("::5".parse().unwrap()), None, "::/96 is no pool's");
    t.remove(a);
    assert_eq!(t.find_all(&key).collect::<Vec<_>>(), vec![b]);
}
