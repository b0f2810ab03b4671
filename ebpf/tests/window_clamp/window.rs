use super::*;

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(
    the_benchmarks_object_switches_the_clamp_off,
    tcp_windows_of_an_ingress_limited_pod_are_clamped_to_the_path_and_a_short_queue,
    the_node_cap_clamps_the_remote_windows_of_the_pods_internet_connections,
    slow_classes_on_jumbo_frame_devices_ask_for_smaller_segments,
    connections_no_limit_applies_to_keep_their_windows,
    flow_buckets_are_the_ones_user_space_computes,
    the_window_clamp_is_shared_by_the_flows_queued_in_the_class,
    the_window_clamp_floor_is_in_the_classs_segments,
);

fn the_benchmarks_object_switches_the_clamp_off(fam: Family) {
    let rate = 10_000_000;
    let mut f = Fixture::bench_with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate));
    pod_connects(&f, fam, Some(7), Some(9));
    let c = conn(&mut f, fam).expect("conn");
    let want = clamped(rate, &c);
    assert!(want < 65535);
    let ack = tcp_seg(fam, true, ACK, 65535, None);
    assert_eq!(window_of(&host_in(&f, &ack)), want);
    f.update_config(|c| c.flags |= abi::CFG_CLAMP_OFF);
    assert_eq!(window_of(&host_in(&f, &ack)), 65535);
}

fn tcp_windows_of_an_ingress_limited_pod_are_clamped_to_the_path_and_a_short_queue(fam: Family) {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);

    // The pod connects (window scale 7) and the server agrees (it sends the option too).
    let syn = tcp_seg(fam, true, SYN, 64240, Some(7));
    assert_eq!(
        window_of(&host_in(&f, &syn)),
        64240,
        "a SYN is never clamped"
    );
    let c = conn(&mut f, fam).expect("the SYN was learnt");
    assert_eq!((c.state, c.wscale), (abi::CONN_SYN_SENT, 7));
    // Before the handshake completes nothing is clamped.
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 65535, None))),
        65535
    );
    host_out(&f, &tcp_seg(fam, false, SYN | ACK, 65160, Some(9)));
    let c = conn(&mut f, fam).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_ESTABLISHED, 7));
    // 65535 << 7 = 8 MiB advertised: clamped to ~20 kB (10 Mbit/s x (RTT + 16 ms)).
    let want = clamped(rate, &c);
    assert!((150..=170).contains(&want), "{want}");
    let out = host_in(&f, &tcp_seg(fam, true, ACK, 65535, None));
    assert_eq!(window_of(&out), want);
    // A smaller window passes as it is: the clamp only lowers.
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 100, None))),
        100
    );
    // Segments to the pod are never changed.
    let to_pod = tcp_seg(fam, false, ACK, 65535, None);
    assert_eq!(window_of(&host_out(&f, &to_pod)), 65535);

    // The product's object has no switch: the benchmarks' flag changes nothing.
    f.update_config(|c| c.flags |= abi::CFG_CLAMP_OFF);
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 65535, None))),
        want
    );
    f.update_config(|c| c.flags &= !abi::CFG_CLAMP_OFF);

    // The server did not agree to scaling: the pod's windows are plain bytes.
    pod_connects(&f, fam, Some(7), None);
    let c = conn(&mut f, fam).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_ESTABLISHED, 0));
    let want = clamped(rate, &c);
    assert!((19_000..=21_000).contains(&want), "{want}");
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 65535, None))),
        want
    );

    // The pod is the server: its SYN-ACK carries the agreed scale, the next ACK ends the
    // handshake.
    host_out(&f, &tcp_seg(fam, false, SYN, 65160, Some(7)));
    host_in(&f, &tcp_seg(fam, true, SYN | ACK, 65160, Some(9)));
    let c = conn(&mut f, fam).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_SYNACK_SENT, 9));
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 65535, None))),
        65535
    );
    host_out(&f, &tcp_seg(fam, false, ACK, 502, None));
    let c = conn(&mut f, fam).expect("conn");
    assert_eq!(c.state, abi::CONN_ESTABLISHED);
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(fam, true, ACK, 65535, None))),
        clamped(rate, &c)
    );
}

fn the_node_cap_clamps_the_remote_windows_of_the_pods_internet_connections(fam: Family) {
    // No ingress limit: only the node's internet cap, whose senders are the pods.
    let rate = 10_000_000;
    let mut f = Fixture::with_policy();
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(rate));
    f.update_config(|c| c.uplink_frame = 1514);
    // The pod connects (scale 7); the server answers with scale 9.
    pod_connects(&f, fam, Some(7), Some(9));
    let c = conn(&mut f, fam).expect("learnt for the node cap");
    assert_eq!(
        (c.state, c.wscale, c.remote_wscale),
        (abi::CONN_ESTABLISHED, 7, 9)
    );
    // The server's windows to the pod are capped at the cap's rate x (RTT + 16 ms), in its
    // own scale; the pod's windows are not touched (no ingress limit).
    let to_pod =
        |f: &Fixture, win: u16| window_of(&host_out(f, &tcp_seg(fam, false, ACK, win, None)));
    let want = {
        let remote = abi::Conn {
            wscale: c.remote_wscale,
            ..c
        };
        clamped_with(rate, &remote, 1, 1514)
    };
    assert!(want < 65535 && want > 0, "{want}");
    assert_eq!(to_pod(&f, 65535), want);
    assert_eq!(to_pod(&f, 1), 1, "only lowered");
    let out = host_in(&f, &tcp_seg(fam, true, ACK, 65535, None));
    assert_eq!(window_of(&out), 65535, "the pod's own windows stay");

    // The pod as the server: the remote's scale comes from its SYN.
    host_out(&f, &tcp_seg(fam, false, SYN, 64240, Some(5)));
    host_in(&f, &tcp_seg(fam, true, SYN | ACK, 65160, Some(7)));
    host_out(&f, &tcp_seg(fam, false, ACK, 502, None));
    let c = conn(&mut f, fam).expect("conn");
    assert_eq!(
        (c.state, c.wscale, c.remote_wscale),
        (abi::CONN_ESTABLISHED, 7, 5)
    );

    // Without a cap nothing is clamped.
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, None);
    assert_eq!(to_pod(&f, 65535), 65535);
}

fn slow_classes_on_jumbo_frame_devices_ask_for_smaller_segments(fam: Family) {
    // A pod with a 10 Mbit/s ingress limit on a 9000-byte MTU: its SYN's MSS (8960, 8940
    // over IPv6) becomes a 1500-byte network's (1460, 1440), so senders into its class use
    // 1514-byte frames.
    let (jumbo, mss) = (fam.mss(9014), fam.mss(1514));
    let mut f = clamping_fixture(10_000_000);
    f.update_meta(|m| m.frame = 9014);
    let out = host_in(&f, &tcp_seg_mss(fam, true, SYN, 64240, Some(7), jumbo));
    assert_eq!(mss_of(&out), mss);
    // The window clamp's floor is then in those frames too: 2 x 1514 per flow, not 2 x 9014.
    host_out(&f, &tcp_seg_mss(fam, false, SYN | ACK, 65160, Some(7), mss));
    let c = conn(&mut f, fam).expect("conn");
    let out = host_in(&f, &tcp_seg(fam, true, ACK, 65535, None));
    assert_eq!(window_of(&out), clamped_with(10_000_000, &c, 1, 1514));
    // From ~72 Mbit/s a jumbo segment takes under 1 ms: the pod's MSS passes as it is. A
    // smaller MSS is never raised.
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, 100_000_000));
    let out = host_in(&f, &tcp_seg_mss(fam, true, SYN, 64240, Some(7), jumbo));
    assert_eq!(mss_of(&out), jumbo);
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, 10_000_000));
    let out = host_in(&f, &tcp_seg_mss(fam, true, SYN, 64240, Some(7), 1200));
    assert_eq!(mss_of(&out), 1200);

    // A pod with only an egress limit: the remote's MSS in its SYN-ACK bounds what the pod's
    // own TCP sends into its egress class; no connection is tracked for it.
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        set_rate(m, abi::Direction::Egress, abi::KIND_TOTAL, 10_000_000);
        m.frame = 9014;
    });
    assert_eq!(remote_mss_after_handshake(&f, fam, jumbo), mss);
    assert!(conn(&mut f, fam).is_none(), "nothing to clamp: not tracked");

    // The node cap: the remote's MSS in its SYN-ACK to a pod bounds what the pod sends.
    let mut f = Fixture::with_policy();
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(10_000_000));
    f.update_config(|c| c.uplink_frame = 9014);
    assert_eq!(remote_mss_after_handshake(&f, fam, jumbo), mss);
}

/// The pod connects (a jumbo frame's MSS); returns the MSS of the server's SYN-ACK (`mss`)
/// as it reaches the pod.
fn remote_mss_after_handshake(f: &Fixture, fam: Family, mss: u16) -> u16 {
    host_in(
        f,
        &tcp_seg_mss(fam, true, SYN, 64240, Some(7), fam.mss(9014)),
    );
    let out = host_out(f, &tcp_seg_mss(fam, false, SYN | ACK, 65160, Some(7), mss));
    mss_of(&out)
}

fn connections_no_limit_applies_to_keep_their_windows(fam: Family) {
    // Limits on traffic to the pod, but none that this connection's traffic meets: a named
    // class's (another destination) and an egress one. The connection is not even learnt.
    let mut f = Fixture::with_policy();
    f.prefix(
        0,
        (
            fam.addr("198.51.100.0", "2001:db8:5100::"),
            fam.pick(24, 48),
        ),
        abi::CLASS_NAMED,
    );
    f.update_meta(|m| {
        set_rate(m, abi::Direction::Ingress, abi::KIND_NAMED, 10_000_000);
        set_rate(m, abi::Direction::Egress, abi::KIND_NAMED, 10_000_000);
    });
    pod_connects(&f, fam, Some(7), Some(7));
    assert!(conn(&mut f, fam).is_none());
    let out = host_in(&f, &tcp_seg(fam, true, ACK, 65535, None));
    assert_eq!(window_of(&out), 65535);
    // The internet's download limit covers it.
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_INTERNET, 10_000_000));
    pod_connects(&f, fam, Some(7), Some(7));
    assert!(conn(&mut f, fam).is_some());
}

/// `abi::flow_bucket` is the programs' hash: each flow's bulk packets set the bit it predicts
/// in the class's bulk-flow bitmap (TCP and UDP with ports, ICMP and fragments without).
fn flow_buckets_are_the_ones_user_space_computes(fam: Family) {
    let mut f = clamping_fixture(10_000_000);
    let remote = remote(fam);
    let mut expected = 0u64;
    let mut flows = Vec::new();
    for (i, sport) in [40000u16, 40001, 51234, 65535, 1].into_iter().enumerate() {
        let mut seg = tcp(remote, fam.pod(), 1448);
        seg.payload[0..2].copy_from_slice(&sport.to_be_bytes());
        seg.payload[2..4].copy_from_slice(&(5201 + i as u16).to_be_bytes());
        flows.push((seg.build(), 6, Some((sport, 5201 + i as u16))));
    }
    let mut udp = tcp(remote, fam.pod(), 1448);
    udp.proto = 17;
    udp.payload[0..4].copy_from_slice(&[0x30, 0x39, 0x00, 0x35]);
    flows.push((udp.build(), 17, Some((12345, 53))));
    let mut frag = tcp(remote, fam.pod(), 1448);
    frag.frag = (true, 0);
    flows.push((frag.build(), 6, None));
    let mut echo = Ip::new(remote, fam.pod());
    echo.payload.resize(1400, 0xab);
    flows.push((echo.build(), fam.icmp(), None));
    for (pkt, proto, ports) in &flows {
        let bucket = abi::flow_bucket(remote, fam.pod(), *proto, *ports);
        // Past the flow's sparse budget: bulk.
        for _ in 0..4 {
            host_out(&f, pkt);
        }
        let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
        assert_ne!(
            q.flows_cur & (1 << bucket),
            0,
            "proto {proto} ports {ports:?}: {q:?}"
        );
        expected |= 1 << bucket;
    }
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert_eq!(q.flows_cur, expected, "{q:?}");
}

fn the_window_clamp_is_shared_by_the_flows_queued_in_the_class(fam: Family) {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    pod_connects(&f, fam, Some(7), Some(7));
    let c = conn(&mut f, fam).expect("established");
    // Data for the connection: it now counts as one flow of the class.
    let mut data = tcp(remote(fam), fam.pod(), 1448);
    data.payload[0..2].copy_from_slice(&REMOTE_PORT.to_be_bytes());
    data.payload[2..4].copy_from_slice(&POD_PORT.to_be_bytes());
    host_out(&f, &data.build());
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert_eq!(q.flows_cur.count_ones(), 1, "{q:?}");
    let ack = tcp_seg(fam, true, ACK, 65535, None);
    let out = host_in(&f, &ack);
    assert_eq!(window_of(&out), clamped(rate, &c));

    // Three more downloads into the pod (other remote ports, from 444 on those whose flows
    // hash apart) queue bulk data.
    let flow = |sport| abi::flow_bucket(remote(fam), fam.pod(), 6, Some((sport, 443)));
    let mut buckets = vec![flow(REMOTE_PORT)];
    let ports: Vec<u16> = (444..)
        .filter(|&p| {
            let new = !buckets.contains(&flow(p));
            buckets.push(flow(p));
            new
        })
        .take(3)
        .collect();
    for port in ports {
        let mut seg = tcp(remote(fam), fam.pod(), 1448);
        seg.payload[0..2].copy_from_slice(&port.to_be_bytes());
        let pkt = seg.build();
        for _ in 0..3 {
            host_out(&f, &pkt);
        }
    }
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    let flows = u64::from((q.flows_cur | q.flows_prev).count_ones());
    // Four flows in 64 buckets; these four hash apart.
    assert_eq!(flows, 4, "{q:?}");
    let out = host_in(&f, &ack);
    assert_eq!(window_of(&out), clamped_among(rate, &c, flows));
    assert!(clamped_among(rate, &c, flows) < clamped(rate, &c) / 3);
}

fn the_window_clamp_floor_is_in_the_classs_segments(fam: Family) {
    // 1 Mbit/s on a 9000-byte MTU: rate x (RTT + 16 ms) is 2 kB, below one segment; the
    // floor is WND_MIN_FRAMES of the segments the class asks for (1514-byte frames here, see
    // the MSS test), not of the device's 9014-byte frames, which would overflow its queue.
    let rate = SLOW;
    let mut f = clamping_fixture(rate);
    f.update_meta(|m| m.frame = 9014);
    pod_connects(&f, fam, Some(7), Some(7));
    let c = conn(&mut f, fam).expect("conn");
    assert_eq!(c.state, abi::CONN_ESTABLISHED);
    let want = clamped_with(rate, &c, 1, 1514);
    assert_eq!(
        u64::from(want) << c.wscale,
        (abi::WND_MIN_FRAMES * 1514).next_multiple_of(1 << c.wscale)
    );
    let out = host_in(&f, &tcp_seg(fam, true, ACK, 65535, None));
    assert_eq!(window_of(&out), want);
}

// ---- IPv6 only: segments behind extension headers -----------------------------------------

#[test]
fn windows_behind_ipv6_extension_headers_are_clamped_with_a_valid_checksum() {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    pod_connects(&f, Family::Ipv6, Some(7), Some(9));
    let c = conn(&mut f, Family::Ipv6).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_ESTABLISHED, 7));
    // Behind a hop-by-hop and a destination-options header (8 + 16 bytes) the TCP header is
    // found, the window clamped and the checksum still valid; the extensions are untouched.
    let ack = Seg {
        ext: vec![ext_opts(NEXTHDR_HOP, 1), ext_opts(NEXTHDR_DEST, 2)],
        ..Seg::new(Family::Ipv6, true, ACK, 65535, None)
    }
    .build();
    let out = host_in(&f, &ack);
    assert_eq!(window_of(&out), clamped(rate, &c));
    assert_eq!(out[..ETH_HLEN + 40 + 24], ack[..ETH_HLEN + 40 + 24]);
}

#[test]
fn ipv6_syns_behind_extension_headers_get_the_mss_of_ipv6_frames() {
    // A 10 Mbit/s ingress limit on a jumbo-frame device: segments of a 1514-byte frame,
    // which carries 1514 - 14 - 40 - 20 = 1440 bytes of TCP payload over IPv6 (1460 over
    // IPv4), with extension headers or without.
    let mut f = clamping_fixture(10_000_000);
    f.update_meta(|m| m.frame = 9014);
    for ext in [vec![], vec![ext_opts(NEXTHDR_DEST, 1)]] {
        let syn = |mss| {
            Seg {
                mss,
                ext: ext.clone(),
                ..Seg::new(Family::Ipv6, true, SYN, 64240, Some(7))
            }
            .build()
        };
        let n = ext.len();
        assert_eq!(
            mss_of(&host_in(&f, &syn(8940))),
            1440,
            "{n} extension headers"
        );
        // An MSS already below it stays.
        assert_eq!(mss_of(&host_in(&f, &syn(1200))), 1200);
    }
}
