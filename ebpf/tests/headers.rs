//! The constants and struct sizes of the C headers against their Rust mirrors, by the
//! headers' text: `aliasnet_abi.h` against `abi.rs`, `aliasnet_tuning.h` against
//! `tuning.rs`. Each header's every `#define AN_*` is mirrored, and each constant is in
//! the header it belongs to (layout or tuning).

const ABI_HEADER: &str = include_str!("../include/aliasnet_abi.h");
const TUNING_HEADER: &str = include_str!("../include/aliasnet_tuning.h");

/// The value of `#define name` in a header's text (decimal or hex literal).
fn define(header: &str, file: &str, name: &str) -> u64 {
    let line = header
        .lines()
        .find(|l| l.starts_with("#define") && l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("#define {name} not in {file}"));
    let v = line.split_whitespace().nth(2).expect("value");
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).expect("hex"),
        None => v.parse().expect("decimal"),
    }
}

mod abi_header {
    use super::*;
    use aliasnet_ebpf::abi::*;

    #[test]
    fn constants_match_header() {
        let pairs: &[(&str, u64)] = &[
            ("AN_ABI_VERSION", ABI_VERSION.into()),
            ("AN_MAX_PODS", MAX_PODS.into()),
            ("AN_MAX_PREFIXES", MAX_PREFIXES.into()),
            ("AN_LPM_MAX_ENTRIES", LPM_MAX_ENTRIES.into()),
            ("AN_MAX_NAMESPACES", MAX_NAMESPACES.into()),
            ("AN_CLASS_INTERNAL", CLASS_INTERNAL.into()),
            ("AN_CLASS_INTERNET", CLASS_INTERNET.into()),
            ("AN_CLASS_BLOCKED", CLASS_BLOCKED.into()),
            ("AN_CLASS_OTHER", CLASS_OTHER.into()),
            ("AN_NR_CLASSES", NR_CLASSES as u64),
            ("AN_DIR_EGRESS", DIR_EGRESS as u64),
            ("AN_DIR_INGRESS", DIR_INGRESS as u64),
            ("AN_NR_DIRS", NR_DIRS as u64),
            ("AN_HTB_MAJOR", HTB_MAJOR.into()),
            ("AN_CLASSID_POD_INTERNET", CLASSID_POD_INTERNET.into()),
            ("AN_CLASSID_POD_OTHER", CLASSID_POD_OTHER.into()),
            ("AN_CLASSID_NODE_CAP", CLASSID_NODE_CAP.into()),
            ("AN_CLASSID_POD_INGRESS", CLASSID_POD_INGRESS.into()),
            ("AN_LEAF_SPARSE", LEAF_SPARSE.into()),
            ("AN_LEAF_BULK", LEAF_BULK.into()),
            ("AN_POD_FILTER_CLASSID_BASE", POD_FILTER_CLASSID_BASE.into()),
            ("AN_FLOW_BUCKETS", FLOW_BUCKETS.into()),
            ("AN_POD_INGRESS_LIMIT", POD_INGRESS_LIMIT.into()),
            ("AN_MAX_CONNS", MAX_CONNS.into()),
            ("AN_CONN_SYN_SENT", CONN_SYN_SENT.into()),
            ("AN_CONN_SYNACK_SENT", CONN_SYNACK_SENT.into()),
            ("AN_CONN_ESTABLISHED", CONN_ESTABLISHED.into()),
            ("AN_CONN_SYN_RCVD", CONN_SYN_RCVD.into()),
            ("AN_META_IN_USE", META_IN_USE.into()),
            (
                "AN_META_INTERNET_FROM_POLICY",
                META_INTERNET_FROM_POLICY.into(),
            ),
            ("AN_VQ_PER_POD", VQ_PER_POD.into()),
            ("AN_VQ_INGRESS", VQ_INGRESS.into()),
            ("AN_VQ_EGRESS", VQ_EGRESS.into()),
            ("AN_VQ_INTERNET", VQ_INTERNET.into()),
            ("AN_VQ_POLICE_EGRESS", VQ_POLICE_EGRESS.into()),
            ("AN_VQ_POLICE_INTERNET", VQ_POLICE_INTERNET.into()),
            ("AN_VQ_NODE_CAP", VQ_NODE_CAP.into()),
            ("AN_VQ_ENTRIES", VQ_ENTRIES.into()),
        ];
        for (name, rust) in pairs {
            assert_eq!(
                define(ABI_HEADER, "aliasnet_abi.h", name),
                *rust,
                "{name} differs between aliasnet_abi.h and abi.rs"
            );
        }
        // Every constant of the header is mirrored; AN_FLOW_ENTRIES is an expression, checked
        // through the an_flows map definition in tests/btf_abi.rs.
        let defined = ABI_HEADER
            .lines()
            .filter_map(|l| l.strip_prefix("#define AN_"))
            .filter(|l| !l.starts_with("FLOW_ENTRIES "))
            .count();
        assert_eq!(
            defined,
            pairs.len(),
            "a define of aliasnet_abi.h is not mirrored"
        );
    }

    #[test]
    fn struct_sizes_match_header() {
        // The header asserts these numbers with _Static_assert; compare the text so both
        // sides are tied to the same literal.
        let sizes: &[(&str, usize)] = &[
            (
                "an_lpm_key",
                core::mem::size_of::<aya::maps::lpm_trie::Key<LpmKeyData>>(),
            ),
            (
                "an_lpm6_key",
                core::mem::size_of::<aya::maps::lpm_trie::Key<Lpm6KeyData>>(),
            ),
            ("an_lpm_value", core::mem::size_of::<LpmValue>()),
            ("an_config", core::mem::size_of::<Config>()),
            ("an_pod", core::mem::size_of::<Pod>()),
            ("an_counter", core::mem::size_of::<Counter>()),
            ("an_pod_counters", core::mem::size_of::<PodCounters>()),
            ("an_node_counters", core::mem::size_of::<NodeCounters>()),
            ("an_pod_meta", core::mem::size_of::<PodMeta>()),
            ("an_pod_key", core::mem::size_of::<PodKey>()),
            ("an_ns_key", core::mem::size_of::<NsKey>()),
            ("an_ns_rate", core::mem::size_of::<NsRate>()),
            ("an_vqueue", core::mem::size_of::<VQueue>()),
            ("an_flow", core::mem::size_of::<Flow>()),
            ("an_conn_key", core::mem::size_of::<ConnKey>()),
            ("an_conn", core::mem::size_of::<Conn>()),
        ];
        for (name, size) in sizes {
            let needle = format!("_Static_assert(sizeof(struct {name}) == {size},");
            assert!(
                ABI_HEADER.contains(&needle),
                "missing or different: {needle}"
            );
        }
    }
}

mod tuning_header {
    use super::*;
    use aliasnet_ebpf::tuning::*;

    #[test]
    fn constants_match_header() {
        let pairs: &[(&str, u64)] = &[
            ("AN_CFG_AQM_OFF", CFG_AQM_OFF.into()),
            ("AN_CFG_FLOWS_OFF", CFG_FLOWS_OFF.into()),
            ("AN_CFG_CLAMP_OFF", CFG_CLAMP_OFF.into()),
            ("AN_MIN_FRAME", MIN_FRAME),
            ("AN_SEG_NS", SEG_NS),
            ("AN_ECN_MARK_MIN_NS", ECN_MARK_MIN_NS),
            ("AN_ECN_MARK_MAX_NS", ECN_MARK_MAX_NS),
            ("AN_ECN_MARK_REF_RATE", ECN_MARK_REF_RATE),
            ("AN_ECN_MARK_FRAMES", ECN_MARK_FRAMES),
            ("AN_DEFAULT_BURST_NS", DEFAULT_BURST_NS),
            ("AN_DEFAULT_BURST_FRAMES", DEFAULT_BURST_FRAMES),
            ("AN_LEAF_BURST_NS", LEAF_BURST_NS),
            ("AN_LEAF_BURST_FRAMES", LEAF_BURST_FRAMES),
            ("AN_LEAF_QUEUE_NS", LEAF_QUEUE_NS),
            ("AN_LEAF_QUEUE_FRAMES", LEAF_QUEUE_FRAMES),
            ("AN_FLOW_BURST_FRAMES", FLOW_BURST_FRAMES),
            ("AN_FLOW_RATE_DIV", FLOW_RATE_DIV),
            ("AN_FLOW_GUARD_FRAMES", FLOW_GUARD_FRAMES),
            ("AN_SPARSE_RATE_DIV", SPARSE_RATE_DIV),
            ("AN_FLOW_EPOCH_NS", FLOW_EPOCH_NS),
            ("AN_POLICE_RATE_PCT", POLICE_RATE_PCT),
            ("AN_POLICE_SLACK_NS", POLICE_SLACK_NS),
            ("AN_POLICE_SLACK_FRAMES", POLICE_SLACK_FRAMES),
            ("AN_POLICE_GSO_CAP", POLICE_GSO_CAP),
            ("AN_WND_QUEUE_NS", WND_QUEUE_NS),
            ("AN_WND_MIN_FRAMES", WND_MIN_FRAMES),
            ("AN_WND_MIN_FLOW_FRAMES", WND_MIN_FLOW_FRAMES),
        ];
        for (name, rust) in pairs {
            assert_eq!(
                define(TUNING_HEADER, "aliasnet_tuning.h", name),
                *rust,
                "{name} differs between aliasnet_tuning.h and tuning.rs"
            );
        }
        // Every constant of the header is mirrored.
        let defined = TUNING_HEADER
            .lines()
            .filter_map(|l| l.strip_prefix("#define AN_"))
            .count();
        assert_eq!(
            defined,
            pairs.len(),
            "a define of aliasnet_tuning.h is not mirrored"
        );
    }
}
