//! The kernel ABI, checked mechanically: every struct of `ebpf/include/aliasnet_abi.h` as the
//! compiled object's BTF lays it out (size, and each field's name, offset and size) against
//! its Rust mirror in `abi.rs` (`size_of`, `offset_of!`), and every map definition in the
//! object (type, key and value type and size, max entries, flags) against `abi::MAPS`.
//!
//! Needs no privileges: it only reads the embedded object.

mod btf;

use core::mem::{offset_of, size_of};

use aliasnet_ebpf::{abi, datapath_object};
use btf::{Btf, Member};

const HEADER: &str = include_str!("../include/aliasnet_abi.h");

/// The Rust side of one shared struct.
struct Mirror {
    c_name: &'static str,
    size: usize,
    fields: Vec<Member>,
}

/// `size_of` of the field that `get` projects to.
fn field_size<T, F>(_get: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// A mirror whose Rust fields are named as the C members.
macro_rules! mirror {
    ($c_name:literal, $t:ty, [$($field:ident),+ $(,)?]) => {
        Mirror {
            c_name: $c_name,
            size: size_of::<$t>(),
            fields: vec![$(Member {
                name: stringify!($field).to_owned(),
                offset: offset_of!($t, $field),
                size: field_size(|s: &$t| &s.$field),
            }),+],
        }
    };
}

fn member(name: &str, offset: usize, size: usize) -> Member {
    Member {
        name: name.to_owned(),
        offset,
        size,
    }
}

/// `struct an_lpm_key` and `an_lpm6_key` are aya's `lpm_trie::Key<_>`, whose fields are
/// private: the offsets are found by writing distinct bytes through its constructor.
fn lpm_key_mirror<K: aya::Pod>(c_name: &'static str, data: K, addr_len: usize) -> Mirror {
    use aya::maps::lpm_trie::Key;

    let key = Key::new(u32::from_ne_bytes([1, 1, 1, 1]), data);
    // SAFETY: Key<K> is repr(C, packed) plain data of size_of bytes.
    let bytes: &[u8] = unsafe {
        core::slice::from_raw_parts((&key as *const Key<K>).cast::<u8>(), size_of::<Key<K>>())
    };
    let at = |marker: u8, len: usize| {
        let offset = bytes
            .iter()
            .position(|&b| b == marker)
            .expect("field written");
        assert!(bytes[offset..offset + len].iter().all(|&b| b == marker));
        offset
    };
    Mirror {
        c_name,
        size: bytes.len(),
        fields: vec![
            member("prefixlen", at(1, 4), 4),
            member("gen", at(2, 4), 4),
            member("addr", at(3, addr_len), addr_len),
        ],
    }
}

fn mirrors() -> Vec<Mirror> {
    vec![
        lpm_key_mirror(
            "an_lpm_key",
            abi::LpmKeyData {
                gen: u32::from_ne_bytes([2, 2, 2, 2]),
                addr: [3; 4],
            },
            4,
        ),
        lpm_key_mirror(
            "an_lpm6_key",
            abi::Lpm6KeyData {
                gen: u32::from_ne_bytes([2, 2, 2, 2]),
                addr: [3; 16],
            },
            16,
        ),
        mirror!("an_lpm_value", abi::LpmValue, [class, reserved]),
        mirror!(
            "an_config",
            abi::Config,
            [
                abi_version,
                active_gen,
                policy_epoch,
                pods_epoch,
                uplink_ifindex,
                flags,
                uplink_frame,
                uplink_gso_max,
                ns_in_ifindex,
                ns_out_ifindex,
                node_in_ifindex,
                node_out,
                prefix_hash,
                conn_share,
                reserved32,
                reserved,
            ]
        ),
        mirror!(
            "an_pod",
            abi::Pod,
            [slot, flags, ipv4, reserved, ipv6, ipv6_ll]
        ),
        mirror!("an_counter", abi::Counter, [packets, bytes]),
        mirror!(
            "an_pod_counters",
            abi::PodCounters,
            [dir, spoofed, policed, dropped]
        ),
        mirror!("an_node_counters", abi::NodeCounters, [staged, reserved]),
        mirror!("an_rates", abi::Rates, [rate]),
        mirror!(
            "an_pod_meta",
            abi::PodMeta,
            [
                flags,
                host_ifindex,
                ipv4,
                pod_ifindex,
                entity,
                frame,
                gso_max,
                reserved0,
                limits,
                burst,
                own_total,
                own_internet,
                own_burst,
                agg_leaves,
                attached_unix_ns,
                netns_dev,
                netns_ino,
                k8s_namespace,
                k8s_name,
                container_id,
                ifname,
                host_ifname,
                netns,
                ipv6,
                ipv6_ll,
            ]
        ),
        mirror!("an_pod_key", abi::PodKey, [container_id, ifname]),
        mirror!(
            "an_entity",
            abi::Entity,
            [flags, pods, limits, groups, name]
        ),
        mirror!(
            "an_vqueue",
            abi::VQueue,
            [t_empty, ce_marked, dropped, flows_cur, flows_prev, t_epoch]
        ),
        mirror!("an_flow", abi::Flow, [t_bulk, t_sparse]),
        mirror!(
            "an_conn_key",
            abi::ConnKey,
            [pod_addr, remote_addr, pod_port, remote_port]
        ),
        mirror!(
            "an_conn",
            abi::Conn,
            [
                t_handshake,
                rtt_ns,
                wscale,
                state,
                remote_wscale,
                flags,
                slot,
                gen,
                t_last,
                reserved
            ]
        ),
        mirror!(
            "an_pod_rt",
            abi::PodRt,
            [
                nd_tat,
                conns,
                conns_refused,
                conns_relearnt,
                tcp_rtt_ns,
                tcp_wscale,
                tcp_known,
                reserved,
                reserved2
            ]
        ),
        mirror!("an_ns_key", abi::NsKey, [name]),
        mirror!("an_ns_policy", abi::NsPolicy, [pod, ns]),
        mirror!("an_class_name", abi::ClassName, [name]),
    ]
}

fn object_btf() -> Btf {
    let object = datapath_object().unwrap_or_else(|e| panic!("{e}"));
    Btf::parse(btf::elf_section(object, ".BTF").expect(".BTF section in the object"))
}

#[test]
fn every_header_struct_has_a_mirror() {
    let declared: Vec<&str> = HEADER
        .lines()
        .filter_map(|l| l.strip_prefix("struct ")?.strip_suffix(" {"))
        .collect();
    let mirrored: Vec<&str> = mirrors().iter().map(|m| m.c_name).collect();
    assert_eq!(declared, mirrored, "structs of aliasnet_abi.h, in order");
}

#[test]
fn struct_layouts_match_btf() {
    let btf = object_btf();
    let mut fields = 0;
    for m in mirrors() {
        let (size, members) = btf
            .struct_layout(m.c_name)
            .unwrap_or_else(|| panic!("struct {} is not in the object's BTF", m.c_name));
        assert_eq!(size, m.size, "size of struct {}", m.c_name);
        assert_eq!(members, m.fields, "fields of struct {}", m.c_name);
        // Explicit padding only: the fields tile the struct.
        let mut end = 0;
        for f in &members {
            assert_eq!(f.offset, end, "{}.{}: implicit padding", m.c_name, f.name);
            end += f.size;
        }
        assert_eq!(end, size, "struct {}: implicit tail padding", m.c_name);
        fields += members.len();
    }
    eprintln!("{} structs, {fields} fields checked", mirrors().len());
}

/// The C key and value types of each map, so that two structs of one size cannot swap.
const MAP_TYPES: [(&str, &str, &str); 17] = [
    ("an_prefixes", "struct an_lpm_key", "struct an_lpm_value"),
    ("an_config", "__u32", "struct an_config"),
    ("an_pods", "__u32", "struct an_pod"),
    ("an_pod_ips", "__u32", "__u32"),
    ("an_counters", "__u32", "struct an_pod_counters"),
    ("an_node_ctrs", "__u32", "struct an_node_counters"),
    ("an_pod_meta", "__u32", "struct an_pod_meta"),
    ("an_vqueue", "__u32", "struct an_vqueue"),
    ("an_flows", "__u32", "struct an_flow"),
    ("an_conns", "struct an_conn_key", "struct an_conn"),
    ("an_prefixes6", "struct an_lpm6_key", "struct an_lpm_value"),
    ("an_pod_ips6", "__u32[4]", "__u32"),
    ("an_policy", "struct an_ns_key", "struct an_ns_policy"),
    ("an_entities", "__u32", "struct an_entity"),
    ("an_entity_ids", "struct an_ns_key", "__u32"),
    ("an_classes", "__u32", "struct an_class_name"),
    ("an_pod_rt", "__u32", "struct an_pod_rt"),
];

#[test]
fn map_definitions_match_btf() {
    let btf = object_btf();
    let maps = btf.maps();
    let mut in_object: Vec<&str> = maps.keys().map(String::as_str).collect();
    let mut in_table: Vec<&str> = abi::MAPS.iter().map(|m| m.name).collect();
    in_object.sort_unstable();
    in_table.sort_unstable();
    assert_eq!(in_object, in_table, "maps in the object vs abi::MAPS");
    for want in abi::MAPS {
        let got = &maps[want.name];
        let name = want.name;
        assert_eq!(got.kind, want.kind as u32, "{name}: map type");
        assert_eq!(got.key_size, want.key as usize, "{name}: key size");
        assert_eq!(got.value_size, want.value as usize, "{name}: value size");
        assert_eq!(got.max_entries, want.max_entries, "{name}: max_entries");
        assert_eq!(got.flags, want.flags, "{name}: map_flags");
        let (_, key, value) = MAP_TYPES
            .iter()
            .find(|(n, _, _)| *n == name)
            .unwrap_or_else(|| panic!("{name}: key and value types not listed"));
        assert_eq!(
            (got.key_type.as_str(), got.value_type.as_str()),
            (*key, *value)
        );
    }
    eprintln!("{} maps checked", abi::MAPS.len());
}

#[test]
fn pod_keys_index_matches_btf() {
    let btf = object_btf();
    let (key_size, _) = btf.struct_layout("an_pod_key").expect("struct an_pod_key");
    assert_eq!(abi::POD_KEYS.key as usize, key_size);
    assert_eq!(abi::POD_KEYS.value as usize, size_of::<u32>());
    assert_eq!(abi::POD_KEYS.max_entries, abi::MAX_PODS);
    // Its key is the metadata's identity fields, byte for byte.
    let (_, meta) = btf
        .struct_layout("an_pod_meta")
        .expect("struct an_pod_meta");
    let (_, key) = btf.struct_layout("an_pod_key").expect("struct an_pod_key");
    for k in &key {
        let m = meta.iter().find(|m| m.name == k.name).expect("meta field");
        assert_eq!(m.size, k.size, "an_pod_key.{} vs an_pod_meta", k.name);
    }
}
