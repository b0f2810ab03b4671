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
            ("AN_MAX_ENTITIES", MAX_ENTITIES.into()),
            ("AN_NODE_ENTITY", NODE_ENTITY.into()),
            ("AN_MAX_NAMED", MAX_NAMED as u64),
            ("AN_CLASS_INTERNAL", CLASS_INTERNAL.into()),
            ("AN_CLASS_INTERNET", CLASS_INTERNET.into()),
            ("AN_CLASS_BLOCKED", CLASS_BLOCKED.into()),
            ("AN_CLASS_OTHER", CLASS_OTHER.into()),
            ("AN_CLASS_NAMED", CLASS_NAMED.into()),
            ("AN_KIND_TOTAL", KIND_TOTAL as u64),
            ("AN_KIND_INTERNET", KIND_INTERNET as u64),
            ("AN_KIND_NAMED", KIND_NAMED as u64),
            ("AN_DIR_EGRESS", DIR_EGRESS as u64),
            ("AN_DIR_INGRESS", DIR_INGRESS as u64),
            ("AN_NR_DIRS", NR_DIRS as u64),
            ("AN_HTB_MAJOR", HTB_MAJOR.into()),
            ("AN_CLASSID_DIRECT", CLASSID_DIRECT.into()),
            ("AN_LEAF_SPARSE", LEAF_SPARSE.into()),
            ("AN_LEAF_BULK", LEAF_BULK.into()),
            ("AN_AGG_GROUP_MIN", AGG_GROUP_MIN.into()),
            ("AN_AGG_GROUP_MAX", AGG_GROUP_MAX.into()),
            ("AN_GROUP_SPARSE", GROUP_SPARSE.into()),
            ("AN_GROUP_SHARED", GROUP_SHARED.into()),
            ("AN_POD_FILTER_CLASSID_BASE", POD_FILTER_CLASSID_BASE.into()),
            ("AN_CB_NS_STAGE", CB_NS_STAGE.into()),
            ("AN_NS_IN_MAJOR", NS_IN_MAJOR.into()),
            ("AN_DROP_ND", DROP_ND as u64),
            ("AN_DROP_GATEWAY", DROP_GATEWAY as u64),
            ("AN_NR_DROPS", NR_DROPS as u64),
            ("AN_META_IN_USE", META_IN_USE.into()),
            ("AN_META_NS_GATE", META_NS_GATE.into()),
            ("AN_ENTITY_IN_USE", ENTITY_IN_USE.into()),
            ("AN_VQ_POLICE", VQ_POLICE as u64),
            ("AN_FLOW_BUCKETS", FLOW_BUCKETS.into()),
            ("AN_MAX_CONNS", MAX_CONNS.into()),
            ("AN_CONN_SYN_SENT", CONN_SYN_SENT.into()),
            ("AN_CONN_SYNACK_SENT", CONN_SYNACK_SENT.into()),
            ("AN_CONN_ESTABLISHED", CONN_ESTABLISHED.into()),
            ("AN_CONN_SYN_RCVD", CONN_SYN_RCVD.into()),
            ("AN_CONN_SHARE_MIN", CONN_SHARE_MIN.into()),
            ("AN_CONN_F_FIN_POD", CONN_F_FIN_POD.into()),
            ("AN_CONN_F_FIN_REMOTE", CONN_F_FIN_REMOTE.into()),
            ("AN_CONN_F_RELEARNT", CONN_F_RELEARNT.into()),
            ("AN_CONN_HANDSHAKE_TTL_S", CONN_HANDSHAKE_TTL_S.into()),
            ("AN_CONN_CLOSED_TTL_S", CONN_CLOSED_TTL_S.into()),
            ("AN_CONN_IDLE_TTL_S", CONN_IDLE_TTL_S.into()),
            ("AN_CONN_TIME_SHIFT", CONN_TIME_SHIFT.into()),
            ("AN_ND_PPS", ND_PPS),
            ("AN_ND_BURST", ND_BURST),
        ];
        for (name, rust) in pairs {
            assert_eq!(
                define(ABI_HEADER, "aliasnet_abi.h", name),
                *rust,
                "{name} differs between aliasnet_abi.h and abi.rs"
            );
        }
        // Values the header derives are pinned there with a _Static_assert of their number.
        let derived: &[(&str, u64)] = &[
            ("AN_NR_CLASSES == ", NR_CLASSES as u64),
            ("AN_NR_KINDS == ", NR_KINDS as u64),
            ("AN_VQ_AGG_BASE == ", VQ_AGG_BASE.into()),
            ("AN_VQ_ENTRIES == ", VQ_ENTRIES.into()),
            ("AN_FLOW_TABLES == ", FLOW_TABLES.into()),
            ("AN_FLOW_ENTRIES == ", FLOW_ENTRIES.into()),
        ];
        for (lhs, rust) in derived {
            let needle = format!("{lhs}{rust}");
            assert!(
                ABI_HEADER.contains(&needle),
                "missing or different: {needle}"
            );
        }
        // Every constant of the header is mirrored, literally or as derived above; the
        // function-like ones (the HTB class and an_vqueue/an_flows index layouts) are the
        // Rust functions of the same name, which the BPF_PROG_TEST_RUN tests check against
        // what the programs do.
        const FUNCTIONS: [&str; 7] = [
            "POD_CLASS(",
            "AGG_LEAF(",
            "NODE_GROUP(",
            "VQ_POD(",
            "VQ_AGG(",
            "FLOWS_POD(",
            "FLOWS_AGG(",
        ];
        let literal = ABI_HEADER
            .lines()
            .filter_map(|l| l.strip_prefix("#define AN_"))
            .filter(|l| !FUNCTIONS.iter().any(|f| l.starts_with(f)))
            .filter(|l| {
                !l.split_whitespace()
                    .nth(1)
                    .is_some_and(|v| v.starts_with('('))
            })
            .count();
        assert_eq!(
            literal,
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
            ("an_rates", core::mem::size_of::<Rates>()),
            ("an_pod_meta", core::mem::size_of::<PodMeta>()),
            ("an_pod_key", core::mem::size_of::<PodKey>()),
            ("an_entity", core::mem::size_of::<Entity>()),
            ("an_ns_key", core::mem::size_of::<NsKey>()),
            ("an_ns_policy", core::mem::size_of::<NsPolicy>()),
            ("an_class_name", core::mem::size_of::<ClassName>()),
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
