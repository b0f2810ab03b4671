use super::*;

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(
    a_pod_holds_at_most_its_share_of_the_connection_table,
    the_sweep_removes_silent_closed_and_orphaned_connections,
    a_connection_whose_entry_went_is_learnt_again_and_clamped,
);

// ---- the connection table: each pod's share, resets, the sweep, learning again ----------

fn table(f: &mut Fixture) -> HashMap<aya::maps::MapData, abi::ConnKey, abi::Conn> {
    f.map(maps::CONNS)
}

fn entries(f: &mut Fixture) -> usize {
    table(f).keys().count()
}

fn pod_rt(f: &mut Fixture) -> abi::PodRt {
    let m: aya::maps::Array<_, abi::PodRt> = f.map(maps::POD_RT);
    m.get(&SLOT, 0).expect("pod rt")
}

/// The pod connects from `port`: its SYN out, the server's SYN-ACK back.
fn connect_from(f: &Fixture, fam: Family, port: u16) {
    let syn = |from_pod, flags, window| {
        Seg {
            pod_port: port,
            ..Seg::new(fam, from_pod, flags, window, Some(7))
        }
        .build()
    };
    host_in(f, &syn(true, SYN, 64240));
    host_out(f, &syn(false, SYN | ACK, 65160));
}

/// The sweep program once: how many entries it removed.
fn sweep(f: &Fixture) -> u32 {
    f.run_data(programs::CONNS_SWEEP, &[0u8; 64], None).0
}

/// `bpf_ktime_get_ns()` in the table's time unit.
fn now_units() -> u32 {
    (monotonic_ns() >> abi::CONN_TIME_SHIFT) as u32
}

fn a_pod_holds_at_most_its_share_of_the_connection_table(fam: Family) {
    let mut f = clamping_fixture(10_000_000);
    f.update_config(|c| c.conn_share = 8);
    for port in 0..12 {
        connect_from(&f, fam, 41_000 + port);
    }
    // A pod opening connections fast learns its share and no more: it cannot evict the
    // entries of other pods (the table was one LRU for the node).
    assert_eq!(entries(&mut f), 8);
    let rt = pod_rt(&mut f);
    assert_eq!((rt.conns, rt.conns_refused), (8, 4));
    // The handshake of a connection it holds again (same ports) takes no second place.
    connect_from(&f, fam, 41_000);
    assert_eq!((entries(&mut f), pod_rt(&mut f).conns), (8, 8));
    // A reset, either way, gives its place back at once.
    host_in(&f, &tcp_seg_on(fam, 41_001, true, RST | ACK, 0));
    host_out(&f, &tcp_seg_on(fam, 41_002, false, RST, 0));
    assert_eq!((entries(&mut f), pod_rt(&mut f).conns), (6, 6));
    connect_from(&f, fam, 41_100);
    let rt = pod_rt(&mut f);
    assert_eq!((entries(&mut f), rt.conns, rt.conns_refused), (7, 7, 4));
    // A share too small for the connections a pod holds refuses new ones; it never
    // reclaims what is held.
    f.update_config(|c| c.conn_share = 2);
    connect_from(&f, fam, 41_200);
    assert_eq!((entries(&mut f), pod_rt(&mut f).conns_refused), (7, 5));
    // Shares follow the pods attached, with a floor of AN_CONN_SHARE_MIN pods' worth.
    assert_eq!(abi::conn_share(1), abi::MAX_CONNS / abi::CONN_SHARE_MIN);
    assert_eq!(abi::conn_share(110), abi::MAX_CONNS / 110);
}

fn the_sweep_removes_silent_closed_and_orphaned_connections(fam: Family) {
    let mut f = clamping_fixture(10_000_000);
    f.update_meta(|m| m.flags = abi::META_IN_USE);
    for port in 0..5 {
        connect_from(&f, fam, 42_000 + port);
    }
    // 42000 established and active; 42001 closed by both sides a while ago; 42002 silent
    // past the idle time; 42003 a handshake that never completed; 42004 of an earlier
    // attachment of the slot.
    host_in(&f, &tcp_seg_on(fam, 42_001, true, FIN | ACK, 64240));
    host_out(&f, &tcp_seg_on(fam, 42_001, false, FIN | ACK, 65160));
    let now = now_units();
    let mut t = table(&mut f);
    let keys: Vec<abi::ConnKey> = t.keys().map(|k| k.expect("key")).collect();
    assert_eq!(keys.len(), 5);
    for k in &keys {
        let mut c = t.get(k, 0).expect("entry");
        match u16::from_be_bytes(k.pod_port) {
            42_000 => {}
            42_001 => {
                assert_eq!(
                    c.flags & (abi::CONN_F_FIN_POD | abi::CONN_F_FIN_REMOTE),
                    abi::CONN_F_FIN_POD | abi::CONN_F_FIN_REMOTE
                );
                c.t_last = now - abi::CONN_CLOSED_TTL_S - 1;
            }
            42_002 => c.t_last = now - abi::CONN_IDLE_TTL_S - 1,
            42_003 => {
                c.state = abi::CONN_SYN_SENT;
                c.t_last = now - abi::CONN_HANDSHAKE_TTL_S - 1;
            }
            _ => c.gen = c.gen.wrapping_add(1),
        }
        t.insert(k, c, 0).expect("age entry");
    }
    assert_eq!(sweep(&f), 4);
    let left: Vec<u16> = table(&mut f)
        .keys()
        .map(|k| u16::from_be_bytes(k.expect("key").pod_port))
        .collect();
    assert_eq!(left, [42_000]);
    // Each removal gave its place back to its pod's share; the orphan's pod was another
    // attachment, whose count this one does not carry.
    assert_eq!(pod_rt(&mut f).conns, 2);
    assert_eq!(sweep(&f), 0);
    // A pod that is gone loses all its entries at the next sweep.
    f.update_meta(|m| m.flags = 0);
    assert_eq!(sweep(&f), 1);
    assert_eq!(entries(&mut f), 0);
}

fn a_connection_whose_entry_went_is_learnt_again_and_clamped(fam: Family) {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    f.update_meta(|m| m.flags = abi::META_IN_USE);
    pod_connects(&f, fam, Some(7), Some(7));
    host_in(&f, &tcp_seg(fam, true, ACK, 64240, None));
    let c = conn(&mut f, fam).expect("learnt");
    assert_eq!(c.state, abi::CONN_ESTABLISHED);
    let clamped_window = window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 64240, None)));
    assert_eq!(clamped_window, clamped(rate, &c));
    // The entry goes (idle past its time to live), the connection goes on.
    let mut t = table(&mut f);
    let key = t.keys().next().expect("one entry").expect("key");
    let mut aged = c;
    aged.t_last = now_units() - abi::CONN_IDLE_TTL_S - 1;
    t.insert(key, aged, 0).expect("age entry");
    assert_eq!(sweep(&f), 1);
    assert!(conn(&mut f, fam).is_none());
    // Its next packet learns it again with the pod's handshake (window scale and round
    // trip), so its windows are clamped again; the remote's scale is unknown.
    let first = host_in(&f, &tcp_seg(fam, true, ACK, 64240, None));
    assert_eq!(window_of(&first), 64240, "clamped from the next packet on");
    let again = conn(&mut f, fam).expect("learnt again");
    assert_eq!(again.flags & abi::CONN_F_RELEARNT, abi::CONN_F_RELEARNT);
    assert_eq!((again.wscale, again.rtt_ns), (c.wscale, c.rtt_ns));
    let rt = pod_rt(&mut f);
    assert_eq!((rt.conns, rt.conns_relearnt), (1, 1));
    let w = window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 64240, None)));
    assert_eq!(w, clamped(rate, &again));
    // Of a pod at its share, a packet of a connection without an entry is not learnt and
    // not counted again and again as refused.
    f.update_config(|c| c.conn_share = 1);
    host_in(&f, &tcp_seg_on(fam, 43_000, true, ACK, 64240));
    host_in(&f, &tcp_seg_on(fam, 43_000, true, ACK, 64240));
    let rt = pod_rt(&mut f);
    assert_eq!((rt.conns, rt.conns_refused, entries(&mut f)), (1, 0, 1));
}
