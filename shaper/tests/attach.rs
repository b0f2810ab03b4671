//! Per-pod attach/detach in network namespaces: exact counters on known traffic and blocked
//! destinations in each address family, rollback on bad input, idempotent DEL, GC. Root
//! only.

mod fabric;

use aliasnet_ebpf::{
    abi::{self, Class, Direction},
    netlink::{Hook, Rtnl},
    DatapathError, HookState, Limits, Teardown,
};
use aya::programs::{SchedClassifier, TcAttachType};
use fabric::*;

const POLICY: &str = r#"
internal_cidrs = ["10.0.0.0/8", "100.64.0.0/16", "fd00::/8"]
blocked_cidrs = ["198.51.100.0/24", "2001:db8:bad::/48"]
"#;

/// ICMP echo with 100 bytes of data, as counted at L2: 14 + 20 + 8 + 100.
const PING_FRAME: u64 = 142;

fn c(packets: u64) -> abi::Counter {
    abi::Counter {
        packets,
        bytes: packets * PING_FRAME,
    }
}

/// `packets` ICMP echoes of 100 bytes of data in `fam`, as counted at L2.
fn echoes(fam: Family, packets: u64) -> abi::Counter {
    abi::Counter {
        packets,
        bytes: packets * fam.echo_frame(100),
    }
}

/// What the counters of `class` in `dir` moved by from `before` to `after`.
fn moved(
    before: &abi::PodCounters,
    after: &abi::PodCounters,
    dir: Direction,
    class: Class,
) -> abi::Counter {
    let (b, a) = (before.get(dir, class), after.get(dir, class));
    abi::Counter {
        packets: a.packets - b.packets,
        bytes: a.bytes - b.bytes,
    }
}

/// Programs on `dev`'s clsact `hook` (cls_bpf filter names); asserts that nothing is
/// attached with TCX, which per-pod hooks must not use (an RCU wait under RTNL per attach).
fn programs(f: &Fabric, dev: &str, role: &str, hook: Hook) -> Vec<String> {
    let dev = dev.to_owned();
    aliasnet_netns::run_in(f.ns_path(role), move || {
        let t = match hook {
            Hook::Ingress => TcAttachType::Ingress,
            Hook::Egress => TcAttachType::Egress,
        };
        // No tcx entry at all (ENOENT) or an empty one.
        let tcx = SchedClassifier::query_tcx(&dev, t).map_or(0, |(_, p)| p.len());
        assert_eq!(tcx, 0, "TCX programs on {dev} {hook:?}");
        let ifindex = nix::net::if_::if_nametoindex(dev.as_str()).expect("ifindex");
        Rtnl::new()
            .expect("rtnl")
            .filters(ifindex, hook)
            .expect("list filters")
            .into_iter()
            .map(|p| {
                assert!(p.direct_action, "{p:?}");
                p.name
            })
            .collect()
    })
    .expect("enter netns")
}

/// Only the default root qdisc: no clsact, no HTB left behind.
fn bare(f: &Fabric, role: &str, dev: &str) -> bool {
    let q = f.tc_json(role, "qdisc", dev);
    q.as_array()
        .expect("qdisc list")
        .iter()
        .all(|q| q["kind"] == "noqueue")
}

fn installed() -> Fabric {
    Fabric::installed(Family::V4, POLICY)
}

/// Pings in `fam` to the internet host and the internal peer, and from the peer, are
/// counted exactly, per direction and class, in the record of the pod (IPv4, or dual-stack
/// for IPv6); neighbour discovery passes the programs without being taken for spoofing.
fn counters_match_pings_exactly(fam: Family) {
    let f = Fabric::installed(fam, POLICY);
    let mut dp = f.open();
    let attached = f.attach_in(fam, &mut dp, Limits::default());
    assert_eq!(attached.ingress, None);
    assert_eq!(
        attached.internet_egress, None,
        "no limit anywhere: nothing shaped"
    );
    assert_eq!(
        programs(&f, "vh1", "node", Hook::Ingress),
        ["an_host_ingress"]
    );
    assert_eq!(
        programs(&f, "vh1", "node", Hook::Egress),
        ["an_host_egress"]
    );
    assert!(
        bare(&f, "pod", "eth0"),
        "no egress limit: nothing on the pod side"
    );
    let before = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap().counters;

    assert_eq!(f.ping("pod", fam.internet_ip(), 10, 100, &[]), 10);
    assert_eq!(f.ping("pod", fam.internal(), 5, 100, &[]), 5);
    // The internal peer pings the pod: requests are ingress, replies egress, both internal.
    assert_eq!(
        f.ping("peer", fam.pod_ip(), 3, 100, &["-I", fam.internal()]),
        3
    );
    // IPv4 still works beside IPv6.
    if fam == Family::V6 {
        assert_eq!(f.ping("pod", INTERNET, 2, 100, &[]), 2);
    }

    let rec = dp
        .pod(CONTAINER_ID, "eth0")
        .expect("read")
        .expect("attached");
    assert_eq!(rec.namespace(), "team-a");
    assert_eq!(rec.name(), "trainer-0");
    match fam {
        Family::V4 => assert_eq!(rec.addresses(), POD_IP),
        Family::V6 => {
            assert_eq!(rec.ipv6(), Some(POD_IP6.parse().unwrap()));
            assert_eq!(rec.addresses(), format!("{POD_IP},{POD_IP6}"));
        }
    }
    assert_eq!(rec.host_ifname(), "vh1");
    let k = rec.counters;
    let d = |dir, class| moved(&before, &k, dir, class);
    // The internet pings, and the IPv4 ones beside IPv6.
    let mut internet = echoes(fam, 10);
    if fam == Family::V6 {
        internet += c(2);
    }
    assert_eq!(d(Direction::Egress, Class::Internet), internet);
    assert_eq!(d(Direction::Ingress, Class::Internet), internet);
    assert_eq!(d(Direction::Egress, Class::Internal), echoes(fam, 5 + 3));
    assert_eq!(d(Direction::Ingress, Class::Internal), echoes(fam, 5 + 3));
    assert_eq!(d(Direction::Egress, Class::Blocked), c(0));
    assert_eq!(d(Direction::Ingress, Class::Blocked), c(0));
    // Neighbour discovery went through the programs as class "other", never spoofed.
    assert_eq!(k.spoofed.packets, 0);
}

per_family!(counters_match_pings_exactly:
    counters_match_pings_exactly_ipv4 => Family::V4,
    counters_match_pings_exactly_ipv6 => Family::V6,
);

/// Blocked destinations and the cloud metadata endpoint of `fam`, reachable before the
/// datapath is attached, are dropped after, both ways, and counted as blocked.
fn blocked_destinations_are_unreachable_and_counted(fam: Family) {
    let f = Fabric::installed(fam, POLICY);
    // Reachable before the datapath is attached: the drops below are ours.
    assert_eq!(f.ping("pod", fam.blocked(), 1, 100, &[]), 1);
    assert_eq!(f.ping("pod", fam.metadata(), 1, 100, &[]), 1);

    let mut dp = f.open();
    f.attach_in(fam, &mut dp, Limits::default());
    let before = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap().counters;
    assert_eq!(f.ping("pod", fam.blocked(), 3, 100, &[]), 0);
    assert_eq!(f.ping("pod", fam.metadata(), 2, 100, &[]), 0);
    // From a blocked source towards the pod: dropped on the way in.
    assert_eq!(
        f.ping("inet", fam.pod_ip(), 4, 100, &["-I", fam.blocked()]),
        0
    );
    // Other traffic is unaffected.
    assert_eq!(f.ping("pod", fam.internet_ip(), 2, 100, &[]), 2);

    let k = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap().counters;
    let d = |dir, class| moved(&before, &k, dir, class);
    assert_eq!(d(Direction::Egress, Class::Blocked), echoes(fam, 3 + 2));
    assert_eq!(d(Direction::Ingress, Class::Blocked), echoes(fam, 4));
    assert_eq!(d(Direction::Egress, Class::Internet), echoes(fam, 2));
    assert_eq!(d(Direction::Ingress, Class::Internet), echoes(fam, 2));
}

per_family!(blocked_destinations_are_unreachable_and_counted:
    blocked_destinations_are_unreachable_and_counted_ipv4 => Family::V4,
    blocked_destinations_are_unreachable_and_counted_ipv6 => Family::V6,
);

#[test]
fn bad_input_attaches_nothing() {
    require_root();
    let f = installed();
    let mut dp = f.open();
    let nothing_attached = |f: &Fabric, dp: &aliasnet_ebpf::Datapath| {
        assert!(dp.pods().unwrap().is_empty(), "no pod recorded");
        assert!(
            dp.pod(CONTAINER_ID, "eth0").unwrap().is_none(),
            "no index entry"
        );
        assert!(bare(f, "node", "vh1"), "no clsact or htb on the host veth");
        assert!(bare(f, "pod", "eth0"), "no clsact or htb on the pod side");
        assert!(
            !f.pin_root().join("pods").exists(),
            "nothing pinned per pod"
        );
    };

    let bad_rate = f.attachment(Limits {
        egress_rate: Some(0),
        ..Limits::default()
    });
    match f.in_node(|| dp.attach_pod(&bad_rate)) {
        Err(DatapathError::Limit(e)) => assert_eq!(e.field, "egress_rate"),
        other => panic!("expected a limit error, got {other:?}"),
    }
    nothing_attached(&f, &dp);

    let mut no_dev = f.attachment(Limits::default());
    no_dev.host_ifname = "nosuchdev0".to_owned();
    let e = f.in_node(|| dp.attach_pod(&no_dev)).unwrap_err();
    assert!(e.to_string().contains("nosuchdev0"), "{e}");
    nothing_attached(&f, &dp);

    // Fails late (the pod netns does not exist) after the host side was set up, with an
    // ingress limit so that a qdisc was installed too: everything must be rolled back.
    let mut late = f.attachment(Limits {
        ingress_rate: Some(50_000_000),
        internet_egress_rate: Some(10_000_000),
        ..Limits::default()
    });
    late.netns = "/run/netns/does-not-exist".into();
    let e = f.in_node(|| dp.attach_pod(&late)).unwrap_err();
    assert!(e.to_string().contains("does-not-exist"), "{e}");
    nothing_attached(&f, &dp);

    // Something long for a fixed-size field.
    let mut long = f.attachment(Limits::default());
    long.identity.namespace = "n".repeat(64);
    match f.in_node(|| dp.attach_pod(&long)) {
        Err(DatapathError::InvalidArgument { field, .. }) => assert_eq!(field, "namespace"),
        other => panic!("expected an argument error, got {other:?}"),
    }
    nothing_attached(&f, &dp);
}

#[test]
fn detach_is_idempotent_and_gc_removes_vanished_pods() {
    require_root();
    let f = installed();
    let mut dp = f.open();
    let att = f.attachment(Limits {
        ingress_rate: Some(100_000_000),
        internet_egress_rate: Some(10_000_000),
        ..Limits::default()
    });
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(f.tc_json("node", "qdisc", "vh1")[0]["kind"], "htb");
    assert_eq!(programs(&f, "eth0", "pod", Hook::Egress), ["an_pod_egress"]);
    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap();
    let hooks = f.in_node(|| dp.hooks_of(&rec));
    assert!(
        matches!(hooks.host_ingress, HookState::Attached { prog_id } if prog_id != 0),
        "{hooks:?}"
    );
    assert!(
        hooks.host_egress.is_ok() && hooks.pod_egress.is_ok(),
        "{hooks:?}"
    );
    assert!(hooks.problems(&rec).is_empty());
    assert_eq!(f.ping("pod", INTERNET, 3, 100, &[]), 3);

    // ADD again with the same key (a runtime retry): one attachment, fresh counters.
    let again = f.in_node(|| dp.attach_pod(&att)).expect("re-attach");
    let pods = dp.pods().unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].slot, again.slot);
    // Fresh counters (only IPv6 housekeeping, class "other", may have arrived since).
    for d in Direction::ALL {
        for k in [Class::Internal, Class::Internet, Class::Blocked] {
            assert_eq!(pods[0].counters.get(d, k), c(0), "{d:?} {k:?}");
        }
    }
    assert_eq!(
        programs(&f, "vh1", "node", Hook::Ingress),
        ["an_host_ingress"]
    );

    assert!(f.in_node(|| dp.detach_pod(CONTAINER_ID, "eth0")).unwrap());
    assert!(
        !f.in_node(|| dp.detach_pod(CONTAINER_ID, "eth0")).unwrap(),
        "second DEL finds nothing"
    );
    assert!(!f.in_node(|| dp.detach_pod("never-seen", "eth0")).unwrap());
    assert!(dp.pods().unwrap().is_empty());
    assert!(
        bare(&f, "node", "vh1"),
        "full detach: no filter or qdisc left"
    );
    assert!(
        bare(&f, "pod", "eth0"),
        "full detach: no filter or qdisc left"
    );
    assert_eq!(
        f.ping("pod", BLOCKED, 1, 100, &[]),
        1,
        "detached: no longer enforced"
    );

    // A pod whose veth vanished without DEL is found by GC.
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    ip(&["-n", &f.ns("node"), "link", "del", "vh1"]);
    let removed = f.in_node(|| dp.gc()).unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].container_id(), CONTAINER_ID);
    assert!(dp.pods().unwrap().is_empty());
    assert!(dp.pod(CONTAINER_ID, "eth0").unwrap().is_none());
    // DEL after the veth (and netns) are gone still succeeds.
    assert!(!f.in_node(|| dp.detach_pod(CONTAINER_ID, "eth0")).unwrap());
}

#[test]
fn open_before_shaperd_ran_is_a_clear_error() {
    require_root();
    let f = Fabric::new();
    let root = f.pin_root();
    let e = f
        .in_node(|| aliasnet_ebpf::Datapath::open(root))
        .err()
        .expect("not initialised");
    assert!(matches!(e, DatapathError::NotInitialised { .. }), "{e}");
    assert!(
        e.to_string().contains("aliasnet-shaperd must run once"),
        "{e}"
    );
}

#[test]
fn maps_only_detach_leaves_the_device_to_the_veth_delete() {
    require_root();
    let f = installed();
    let mut dp = f.open();
    let att = f.attachment(Limits {
        ingress_rate: Some(100_000_000),
        internet_egress_rate: Some(10_000_000),
        ..Limits::default()
    });
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(f.ping("pod", INTERNET, 2, 100, &[]), 2);

    // CNI DEL: the veth is deleted right after, so only the map entries go.
    assert!(f
        .in_node(|| dp.detach_pod_with(CONTAINER_ID, "eth0", Teardown::MapsOnly))
        .unwrap());
    assert!(dp.pods().unwrap().is_empty());
    assert!(dp.pod(CONTAINER_ID, "eth0").unwrap().is_none());
    assert!(!f
        .in_node(|| dp.detach_pod_with(CONTAINER_ID, "eth0", Teardown::MapsOnly))
        .unwrap());
    // The filters stay until the veth goes: still enforcing, no longer counting.
    assert_eq!(
        programs(&f, "vh1", "node", Hook::Ingress),
        ["an_host_ingress"]
    );
    assert_eq!(f.ping("pod", BLOCKED, 1, 100, &[]), 0);

    // A new attachment on the same veth (an ADD retried after DEL) starts clean.
    let again = f.in_node(|| dp.attach_pod(&att)).expect("re-attach");
    assert_eq!(dp.pods().unwrap().len(), 1);
    assert_eq!(
        programs(&f, "vh1", "node", Hook::Egress),
        ["an_host_egress"]
    );
    assert_eq!(programs(&f, "eth0", "pod", Hook::Egress), ["an_pod_egress"]);
    assert_eq!(f.ping("pod", INTERNET, 3, 100, &[]), 3);
    let k = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap().counters;
    assert_eq!(k.get(Direction::Egress, Class::Internet), c(3));
    assert_eq!(again.slot, dp.pods().unwrap()[0].slot);

    f.in_node(|| dp.detach_pod_with(CONTAINER_ID, "eth0", Teardown::MapsOnly))
        .unwrap();
    ip(&["-n", &f.ns("node"), "link", "del", "vh1"]);
    assert!(dp.pods().unwrap().is_empty());
}

#[test]
fn key_index_survives_loss_and_stale_entries() {
    require_root();
    let f = installed();
    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    drop(dp);

    // Pins from a build without the index: the next open rebuilds it from the metadata.
    std::fs::remove_file(f.pin_root().join("maps/an_pod_keys")).unwrap();
    let mut dp = f.open();
    assert!(f.pin_root().join("maps/an_pod_keys").exists());
    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().expect("found again");
    assert_eq!(rec.slot, a.slot);

    // A second pod on another veth gets its own slot; both are found by key.
    ip(&[
        "-n",
        &f.ns("node"),
        "link",
        "add",
        "vh2",
        "type",
        "veth",
        "peer",
        "name",
        "vp2",
    ]);
    let mut other = f.attachment(Limits::default());
    other.host_ifname = "vh2".to_owned();
    other.identity.container_id = "second".to_owned();
    other.identity.ipv4 = Some("10.20.0.6".parse().unwrap());
    let b = f.in_node(|| dp.attach_pod(&other)).expect("attach second");
    assert_ne!(a.slot, b.slot);
    assert_eq!(dp.pod("second", "eth0").unwrap().unwrap().slot, b.slot);
    assert_eq!(dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap().slot, a.slot);
    assert!(dp.pod("second", "eth1").unwrap().is_none());
    assert!(dp.pod(&"x".repeat(200), "eth0").unwrap().is_none());

    // GC repairs the index: the entries of live pods stay, nothing else is removed.
    assert!(f.in_node(|| dp.gc()).unwrap().is_empty());
    assert_eq!(dp.pods().unwrap().len(), 2);
    assert!(f.in_node(|| dp.detach_pod("second", "eth0")).unwrap());
    assert!(programs(&f, "vh2", "node", Hook::Ingress).is_empty());
    assert_eq!(dp.pods().unwrap().len(), 1);
}

/// A pod that takes a freed slot starts with an empty queue model: no drain time, CE marks or
/// drops of the previous occupant carry over.
#[test]
fn a_reused_slot_starts_with_an_empty_queue_model() {
    require_root();
    let f = installed();
    let mut dp = f.open();
    let att = f.attachment(Limits {
        ingress_rate: Some(10_000_000),
        ..Limits::default()
    });
    let slot = f.in_node(|| dp.attach_pod(&att)).expect("attach").slot;
    let dirty = aliasnet_ebpf::abi::VQueue {
        t_empty: u64::MAX / 2,
        ce_marked: 7,
        dropped: 9,
        flows_cur: 0b1011,
        flows_prev: 1,
        t_epoch: u64::MAX / 2,
    };
    {
        use aya::maps::{Array, Map, MapData};
        let path = f.pin_root().join("maps").join(aliasnet_ebpf::maps::VQUEUE);
        let mut m: Array<MapData, aliasnet_ebpf::abi::VQueue> =
            Array::try_from(Map::Array(MapData::from_pin(path).unwrap())).unwrap();
        m.set(
            abi::vq_pod(slot, abi::DIR_INGRESS, abi::KIND_TOTAL),
            dirty,
            0,
        )
        .unwrap();
    }
    assert!(f.in_node(|| dp.detach_pod(CONTAINER_ID, "eth0")).unwrap());
    let again = f.in_node(|| dp.attach_pod(&att)).expect("attach again");
    assert_eq!(again.slot, slot, "the freed slot is taken again");
    // The models of the limits the new pod has start empty.
    assert_eq!(
        f.vqueue(abi::vq_pod(slot, abi::DIR_INGRESS, abi::KIND_TOTAL)),
        aliasnet_ebpf::abi::VQueue::default()
    );
    // And the pod is shaped from an empty queue: its pings go through at once.
    assert_eq!(f.ping("pod", INTERNET, 3, 100, &[]), 3);
}
