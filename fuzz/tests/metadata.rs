//! Fuzz target: the instance-metadata documents ipamd acts on. Azure IMDS `instance/network`
//! JSON (`imds::parse`) as a metadata pool applies it (`State::apply_metadata_read`), and the
//! delegated-prefix lists node provisioning writes into `node-pools.toml` (`prefixes` pools,
//! `Config::parse`).
//!
//! Invariants: no panic, an error says something; an accepted document's secondaries are
//! sorted and unique, never an interface's primary, and exactly what the document lists after
//! each interface's first address, per family. Applied to a pool, the pool serves exactly the
//! listed secondaries that a pod may hold: a reserved one (loopback, link-local with the pods'
//! gateway, multicast, ...) is refused with why and never handed out, however many pods ask.
//! An accepted prefix list gives a pool of exactly the blocks' addresses that are not
//! reserved, and names every reserved block it lists in a warning; a list of nothing else is
//! refused.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aliasnet_fuzz::{config, corpus, mutated, text, JSON_DICT};
use aliasnet_ipam::{
    config::{reserved, Config},
    imds,
    state::{AllocRequest, AllocStep, State},
};
use aliasnet_ipam_proto::{AttachmentKey, Family, PodRef};
use proptest::prelude::*;

const DOCS: &str = "metadata";
const PREFIXES: &str = "prefix_list";

/// What the document lists, per family: (first address of each interface, the others), read
/// through serde_json's generic values as an independent decoder.
fn listed<A: std::str::FromStr + Ord + Copy>(
    doc: &serde_json::Value,
    family: &str,
) -> (Vec<A>, BTreeSet<A>) {
    let mut primaries = Vec::new();
    let mut others = BTreeSet::new();
    for iface in doc["interface"].as_array().into_iter().flatten() {
        let list = iface[family]["ipAddress"].as_array();
        for (j, e) in list.into_iter().flatten().enumerate() {
            let a: A = match e["privateIpAddress"].as_str().map(|s| s.trim().parse()) {
                Some(Ok(a)) => a,
                _ => panic!("accepted a document with an unparsable {family} address: {e}"),
            };
            if j == 0 {
                primaries.push(a);
            } else {
                others.insert(a);
            }
        }
    }
    for p in &primaries {
        others.remove(p);
    }
    (primaries, others)
}

fn metadata_config() -> &'static Config {
    static C: std::sync::OnceLock<Config> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        Config::parse(
            "[[pool]]\nname = \"nic\"\nsource = \"azure-imds\"\n\
             [[pool]]\nname = \"nic6\"\nsource = \"azure-imds\"\nfamily = \"ipv6\"\n",
            Path::new("/fuzz/ipamd.toml"),
        )
        .expect("metadata pools")
    })
}

/// Applies `secondary` (and `secondary6`) to fresh metadata pools, then allocates until the
/// pool is exhausted: every address handed out is listed and not reserved, and all of those
/// are handed out.
fn check_applied(secondary: &[Ipv4Addr], secondary6: &[Ipv6Addr]) {
    let mut st = State::new(metadata_config());
    for (pool, family) in [("nic", Family::Ipv4), ("nic6", Family::Ipv6)] {
        let target = st.metadata_target(pool).expect("metadata pool");
        let change = st.apply_metadata_read(target, secondary, secondary6, 1_000);
        let listed: BTreeSet<IpAddr> = match family {
            Family::Ipv4 => secondary.iter().map(|a| IpAddr::from(*a)).collect(),
            Family::Ipv6 => secondary6.iter().map(|a| IpAddr::from(*a)).collect(),
        };
        let usable: BTreeSet<IpAddr> = listed
            .iter()
            .copied()
            .filter(|a| reserved(*a).is_none())
            .collect();
        for (a, why) in &change.refused {
            assert!(listed.contains(a), "refused {a}, which was not listed");
            assert!(!why.is_empty());
            if reserved(*a).is_some() {
                assert!(!usable.contains(a));
            }
        }
        for a in listed.iter().filter(|a| reserved(**a).is_some()) {
            assert!(
                change.refused.iter().any(|(r, _)| r == a),
                "reserved {a} not refused: {:?}",
                change.refused
            );
        }
        let added: BTreeSet<IpAddr> = change.added.iter().copied().collect();
        assert_eq!(added, usable, "{pool}: what became usable");

        let families = [family];
        let mut got = BTreeSet::new();
        for i in 0..=usable.len() {
            let key = AttachmentKey::new("fuzz", &format!("{pool}-{i}"), "eth0");
            let pod = PodRef::default();
            let req = AllocRequest {
                key: &key,
                pod: &pod,
                pool: Some(pool),
                host_veth: None,
                families: Some(&families),
            };
            match st.begin_allocate(req, 2_000) {
                Ok(AllocStep::Fresh { leases, records }) => {
                    for r in &records {
                        st.commit(r);
                    }
                    for l in leases {
                        assert!(
                            usable.contains(&l.address),
                            "{pool} handed out {} (reserved: {:?})",
                            l.address,
                            reserved(l.address)
                        );
                        assert!(got.insert(l.address), "{} handed out twice", l.address);
                    }
                }
                Ok(other) => panic!("{other:?}"),
                Err(_) => break,
            }
        }
        assert_eq!(got, usable, "{pool}: every usable address is served");
    }
}

fn check_doc(bytes: &[u8]) {
    let parsed = match imds::parse(bytes) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let doc: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        // Valid JSON a generic value cannot hold (1e999) in a field imds ignores.
        Err(e) if e.to_string().starts_with("number out of range") => {
            check_applied(&parsed.secondary, &parsed.secondary6);
            return;
        }
        Err(e) => panic!("imds accepted a document that is not JSON: {e}"),
    };
    let (p4, s4) = listed::<Ipv4Addr>(&doc, "ipv4");
    let (p6, s6) = listed::<Ipv6Addr>(&doc, "ipv6");
    assert!(!p4.is_empty(), "accepted without an IPv4 primary");
    assert_eq!(parsed.primaries, p4);
    assert_eq!(parsed.primaries6, p6);
    assert_eq!(parsed.secondary, s4.into_iter().collect::<Vec<_>>());
    assert_eq!(parsed.secondary6, s6.into_iter().collect::<Vec<_>>());
    check_applied(&parsed.secondary, &parsed.secondary6);
}

/// The first and last address of every reserved block (an oracle written apart from the
/// product's table): a range holds a reserved address only if one of its ends is reserved or
/// it holds one of these.
const EDGES4: [&str; 9] = [
    "0.0.0.0",
    "0.255.255.255",
    "127.0.0.0",
    "127.255.255.255",
    "169.254.0.0",
    "169.254.255.255",
    "224.0.0.0",
    "239.255.255.255",
    "255.255.255.255",
];
const EDGES6: [&str; 8] = [
    "::",
    "::ffff:ffff",
    "::ffff:0:0",
    "::ffff:ffff:ffff",
    "fe80::",
    "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "ff00::",
    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
];

fn assert_none_reserved(pool: &str, first: IpAddr, last: IpAddr) {
    let edges: Vec<IpAddr> = match first {
        IpAddr::V4(_) => EDGES4.iter().map(|e| e.parse().unwrap()).collect(),
        IpAddr::V6(_) => EDGES6.iter().map(|e| e.parse().unwrap()).collect(),
    };
    for a in [first, last]
        .into_iter()
        .chain(edges.into_iter().filter(|e| first <= *e && *e <= last))
    {
        assert_eq!(
            reserved(a),
            None,
            "pool '{pool}' serves {a} ({first}-{last})"
        );
    }
}

/// A config with pools of listed addresses (a node-pools.toml): no pool serves a reserved
/// address, and its size is what its ranges hold.
fn check_prefixes(toml: &str) {
    let parsed = Config::parse(toml, Path::new("/etc/aliasnet/ipamd.toml"));
    let Ok(cfg) = parsed else {
        assert!(!parsed.unwrap_err().to_string().is_empty());
        return;
    };
    for pool in &cfg.pools {
        let mut served = 0u128;
        for r in &pool.ranges {
            let (f, l) = r.ips();
            assert_none_reserved(&pool.name, f, l);
            served = served.saturating_add(r.len());
        }
        assert_eq!(
            u128::from(pool.size),
            served.min(u128::from(u64::MAX)),
            "pool '{}'",
            pool.name
        );
    }
}

/// A generated list of blocks as a prefixes pool: when accepted, the pool holds exactly their
/// addresses that are not reserved, and a warning names each block that holds reserved ones.
fn check_listed_prefixes(blocks: &[String]) {
    let list = blocks
        .iter()
        .map(|b| serde_json::to_string(b).expect("a string prints"))
        .collect::<Vec<_>>()
        .join(", ");
    let toml = format!("[[pool]]\nname = \"blocks\"\nsource = \"prefixes\"\nprefixes = [{list}]\n");
    check_prefixes(&toml);
    let Ok(cfg) = Config::parse(&toml, Path::new("/etc/aliasnet/ipamd.toml")) else {
        return;
    };
    // Accepted: each block parses as a CIDR; count its usable addresses and the warnings.
    let nets: Vec<ipnet::IpNet> = blocks
        .iter()
        .map(|b| b.trim().parse().expect("an accepted block is a CIDR"))
        .collect();
    if nets
        .iter()
        .any(|n| n.max_prefix_len() - n.prefix_len() > 16)
    {
        // Too large to enumerate (only junk text makes one).
        return;
    }
    let mut usable = 0u128;
    let mut reserved_blocks = 0;
    for net in nets {
        let hosts: Vec<IpAddr> = match net {
            ipnet::IpNet::V4(n) => {
                let (f, l) = (u32::from(n.network()), u32::from(n.broadcast()));
                (f..=l).map(|a| IpAddr::from(Ipv4Addr::from(a))).collect()
            }
            ipnet::IpNet::V6(n) => {
                let (f, l) = (u128::from(n.network()), u128::from(n.broadcast()));
                (f..=l).map(|a| IpAddr::from(Ipv6Addr::from(a))).collect()
            }
        };
        let bad = hosts.iter().filter(|a| reserved(**a).is_some()).count();
        usable += (hosts.len() - bad) as u128;
        reserved_blocks += usize::from(bad > 0);
    }
    assert_eq!(u128::from(cfg.pools[0].size), usable, "{toml}");
    assert!(
        cfg.warnings.len() >= reserved_blocks,
        "{reserved_blocks} blocks hold reserved addresses, warnings: {:?}",
        cfg.warnings
    );
}

#[test]
fn corpus_replays() {
    for e in corpus(DOCS) {
        let r = std::panic::catch_unwind(|| check_doc(&e.bytes));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
    for e in corpus(PREFIXES) {
        let text = String::from_utf8_lossy(&e.bytes).into_owned();
        let r = std::panic::catch_unwind(|| check_prefixes(&text));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

#[test]
fn the_reserved_document_serves_only_its_usable_addresses() {
    let e = corpus(DOCS)
        .into_iter()
        .find(|e| e.name() == "reserved.json")
        .expect("reserved.json");
    let p = imds::parse(&e.bytes).unwrap();
    assert_eq!(p.secondary.len(), 7);
    check_doc(&e.bytes);
    let cfg = Config::parse(
        std::str::from_utf8(
            &std::fs::read(aliasnet_fuzz::corpus_dir(PREFIXES).join("reserved-only.toml")).unwrap(),
        )
        .unwrap(),
        Path::new("/x.toml"),
    );
    assert!(cfg.is_err(), "a list of reserved blocks only is refused");
}

fn address4() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<[u8; 4]>().prop_map(|a| Ipv4Addr::from(a).to_string()),
        3 => (0u8..=3, any::<u8>()).prop_map(|(b, c)| format!("10.0.{b}.{c}")),
        3 => proptest::sample::select(vec![
            "0.0.0.0", "0.1.2.3", "127.0.0.1", "127.255.255.255", "169.254.1.1",
            "169.254.169.254", "224.0.0.1", "239.255.255.255", "255.255.255.255",
            "240.0.0.1", "10.0.0.0", " 10.0.0.7 ", "10.0.0.07", "1.2.3", "",
        ])
        .prop_map(str::to_owned),
        1 => text(),
    ]
}

fn address6() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<[u16; 8]>().prop_map(|a| Ipv6Addr::from(a).to_string()),
        3 => (0u16..16).prop_map(|h| format!("fd00:8::{h:x}")),
        3 => proptest::sample::select(vec![
            "::", "::1", "::10.0.8.8", "::ffff:10.0.8.7", "fe80::1", "febf::ff",
            "fec0::1", "ff02::1", "ff00::", "fd00:8::", "2001:db8::1", "fd00:8::1%eth0",
        ])
        .prop_map(str::to_owned),
        1 => text(),
    ]
}

/// An IMDS-shaped document with hostile addresses and structure around them.
fn document() -> impl Strategy<Value = String> {
    let entry = |a: BoxedStrategy<String>| {
        (a, any::<bool>()).prop_map(|(a, public)| {
            let a = serde_json::to_string(&a).unwrap();
            if public {
                format!(r#"{{"privateIpAddress":{a},"publicIpAddress":"20.1.2.3"}}"#)
            } else {
                format!(r#"{{"privateIpAddress":{a}}}"#)
            }
        })
    };
    let list =
        |a: BoxedStrategy<String>| proptest::option::of(proptest::collection::vec(entry(a), 0..6));
    let iface = (list(address4().boxed()), list(address6().boxed()), any::<bool>()).prop_map(
        |(v4, v6, mac)| {
            let mut parts = Vec::new();
            if let Some(v4) = v4 {
                parts.push(format!(
                    r#""ipv4":{{"ipAddress":[{}],"subnet":[{{"address":"10.0.0.0","prefix":"16"}}]}}"#,
                    v4.join(",")
                ));
            }
            if let Some(v6) = v6 {
                parts.push(format!(r#""ipv6":{{"ipAddress":[{}]}}"#, v6.join(",")));
            }
            if mac {
                parts.push(r#""macAddress":"000D3A328570""#.to_owned());
            }
            format!("{{{}}}", parts.join(","))
        },
    );
    proptest::collection::vec(iface, 0..4)
        .prop_map(|ifaces| format!(r#"{{"interface":[{}]}}"#, ifaces.join(",")))
}

/// A delegated block: small IPv4 and IPv6 CIDRs, biased towards the reserved ranges and
/// their edges, and junk.
fn block() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (any::<[u8; 4]>(), 24u8..=32).prop_map(|(a, l)| {
            let n = u32::from_be_bytes(a) & u32::MAX.checked_shl(32 - u32::from(l)).unwrap_or(0);
            format!("{}/{l}", Ipv4Addr::from(n))
        }),
        4 => (proptest::sample::select(vec![
            [0u8, 0, 0, 0], [127, 0, 0, 0], [169, 254, 1, 0], [169, 254, 255, 0], [169, 253, 255, 0],
            [224, 0, 0, 0], [239, 255, 255, 0], [255, 255, 255, 0], [126, 255, 255, 0], [10, 64, 0, 0],
        ]), 24u8..=32).prop_map(|(a, l)| {
            let n = u32::from_be_bytes(a) & u32::MAX.checked_shl(32 - u32::from(l)).unwrap_or(0);
            format!("{}/{l}", Ipv4Addr::from(n))
        }),
        3 => (proptest::sample::select(vec![
            "fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ff00", "ff02::", "fd00:9::",
            "2001:db8:1:2:3::", "::ffff:10.0.0.0", "fec0::",
        ]), 116u8..=128).prop_map(|(a, l)| {
            let n = u128::from(a.parse::<Ipv6Addr>().unwrap()) & u128::MAX.checked_shl(128 - u32::from(l)).unwrap_or(0);
            format!("{}/{l}", Ipv6Addr::from(n))
        }),
        1 => text(),
    ]
}

proptest! {
    #![proptest_config(config(1500))]

    #[test]
    fn generated_documents(doc in document()) {
        check_doc(doc.as_bytes());
    }

    #[test]
    fn mutated_documents(bytes in mutated(corpus(DOCS).into_iter().map(|e| e.bytes).collect(), JSON_DICT)) {
        check_doc(&bytes);
    }

    #[test]
    fn generated_prefix_lists(blocks in proptest::collection::vec(block(), 1..6)) {
        check_listed_prefixes(&blocks);
    }

    #[test]
    fn mutated_prefix_lists(bytes in mutated(corpus(PREFIXES).into_iter().map(|e| e.bytes).collect(), TOML_DICT)) {
        check_prefixes(&String::from_utf8_lossy(&bytes));
    }
}

/// Tokens of TOML and of address syntax.
const TOML_DICT: &[&[u8]] = &[
    b"[",
    b"]",
    b"\"",
    b",",
    b"=",
    b"\n",
    b"/",
    b":",
    b"::",
    b".",
    b"0",
    b"32",
    b"128",
    b"255",
    b"169.254.",
    b"127.",
    b"224.",
    b"fe80::",
    b"ff02::",
    b"[[pool]]\n",
    b"source = \"static\"\n",
    b"exclude = [\"10.64.0.1\"]\n",
];
