//! The client against a real kernel, in two network namespaces this test creates (unshared by
//! its threads; they disappear with them): a veth pair with its peer born in the other
//! namespace, a pod's wiring of both families in one batch, a batch with a failing request,
//! reading it all back, the default route's device, and deleting only veths.

use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr},
    os::fd::AsFd,
    process::Command,
    sync::mpsc,
};

use aliasnet_netlink::{
    addr, link, neigh, netlink_packet_route::route::RouteScope, route, Family, Removed, Rtnl,
};

fn unshare() {
    // SAFETY: plain syscall; only the calling thread's network namespace changes.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        r,
        0,
        "unshare(CLONE_NEWNET) needs root: {}",
        std::io::Error::last_os_error()
    );
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `ip ARGS` in the calling thread's namespace.
fn run_ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A thread in a namespace of its own; `f` gets its socket. The namespace lives until the
/// thread ends; its file is sent back first so that the caller can create links in it.
fn pod_thread(
    f: impl FnOnce(&mut Rtnl) + Send + 'static,
) -> (File, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (ns_tx, ns_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        unshare();
        let ns = File::open("/proc/thread-self/ns/net").unwrap();
        let mut rt = Rtnl::new().unwrap();
        ns_tx.send(ns).unwrap();
        // A dropped sender: the caller only wanted the namespace.
        if go_rx.recv().is_ok() {
            f(&mut rt);
        }
    });
    (ns_rx.recv().unwrap(), go_tx, t)
}

#[test]
fn a_pod_wired_in_one_batch_per_side() {
    std::thread::spawn(|| {
        unshare();
        let mut host = Rtnl::new().unwrap();
        let (pod_ns, go, pod) = pod_thread(|_| {});

        // The pair: the host end as the kernel made it, up, the peer in the pod.
        let h = host
            .create_veth("anv0", "eth0", pod_ns.as_fd(), 1400, "create")
            .unwrap();
        assert_eq!(h.name, "anv0");
        assert!(h.is_veth() && h.up && h.mtu == 1400, "{h:?}");
        assert!(h.mac.is_some() && h.peer_index.is_some(), "{h:?}");
        assert_eq!(host.link(h.index).unwrap().as_ref(), Some(&h));
        assert_eq!(host.link_by_name("anv0").unwrap().unwrap().index, h.index);
        assert!(host.link_by_name("nonesuch").unwrap().is_none());
        // A second pair with the same names: EEXIST.
        let e = host
            .create_veth("anv0", "eth0", pod_ns.as_fd(), 1400, "again")
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");
        assert!(e.to_string().starts_with("again: "), "{e}");
        drop((go, pod_ns));
        pod.join().unwrap();
        // The pod's namespace goes with its thread (asynchronously), and the pair with it.
        let start = std::time::Instant::now();
        while host.link(h.index).unwrap().is_some() {
            assert!(start.elapsed().as_secs() < 10, "the pair outlived the pod");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    })
    .join()
    .expect("scenario passed");
}

#[test]
fn batches_run_in_order_and_report_each_request() {
    std::thread::spawn(|| {
        unshare();
        let mut host = Rtnl::new().unwrap();
        let (res_tx, res_rx) = mpsc::channel();
        let (pod_ns, go, pod) = pod_thread(move |pod| {
            wire_and_read(pod);
            res_tx.send(()).unwrap();
        });
        let h = host
            .create_veth("anv2", "eth0", pod_ns.as_fd(), 1500, "create")
            .unwrap();
        *HOST.lock().unwrap() = Some((h.peer_index.unwrap(), h.mac.unwrap()));
        go.send(()).unwrap();
        pod.join().unwrap();
        res_rx.recv().unwrap();

        // The host side: a /32 and a /128 to the pod, fe80::1/64 on the veth.
        let mut b = host.batch();
        b.add(
            addr::add(h.index, ip("fe80::1"), 64),
            "host gateway address",
        );
        b.add(
            route::add_link_route(h.index, ip("10.9.0.5"), 32),
            "host route 4",
        );
        b.add(
            route::add_link_route(h.index, ip("fd00:9::5"), 128),
            "host route 6",
        );
        b.run().unwrap();
        let r4 = host.routes(Family::Ipv4).unwrap();
        assert!(
            r4.iter().any(|r| r.dst == ip("10.9.0.5")
                && r.dst_len == 32
                && r.oif == Some(h.index)
                && r.scope == RouteScope::Link
                && r.in_main_table()),
            "{r4:?}"
        );
        let r6 = host.routes(Family::Ipv6).unwrap();
        assert!(
            r6.iter()
                .any(|r| r.dst == ip("fd00:9::5") && r.dst_len == 128 && r.oif == Some(h.index)),
            "{r6:?}"
        );
        let a6 = host.addrs(h.index, Family::Ipv6).unwrap();
        assert!(
            a6.iter()
                .any(|a| a.ip == ip("fe80::1") && a.len == 64 && a.nodad && !a.tentative),
            "{a6:?}"
        );
        assert!(host.addrs(h.index, Family::Ipv4).unwrap().is_empty());
    })
    .join()
    .expect("scenario passed");
}

/// The pod's index and the host veth's MAC, for the pod's thread.
static HOST: std::sync::Mutex<Option<(u32, [u8; 6])>> = std::sync::Mutex::new(None);

/// The pod side of a dual-stack pod in one batch, a failing request in the middle, then
/// everything read back.
fn wire_and_read(pod: &mut Rtnl) {
    let (pi, mac) = HOST.lock().unwrap().expect("host side first");
    let gw4 = IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1));
    let gw6 = ip("fe80::1");
    let mut b = pod.batch();
    b.add(link::set_up(pi), "up")
        .add(addr::add(pi, ip("10.9.0.5"), 32), "addr 4")
        .add(route::add_link_route(pi, gw4, 32), "gateway route")
        .add(neigh::add_permanent(pi, gw4, &mac), "neigh 4")
        // The default route needs the gateway's link route above: the batch is in order.
        .add(
            route::add_gateway_route(pi, ip("0.0.0.0"), 0, gw4),
            "default 4",
        )
        .add(addr::add(pi, ip("10.9.0.5"), 32), "the same address again")
        .add(addr::add(pi, ip("fd00:9::5"), 128), "addr 6")
        .add(neigh::add_permanent(pi, gw6, &mac), "neigh 6")
        .add(route::add_gateway_route(pi, ip("::"), 0, gw6), "default 6")
        .add(link::get(pi), "get");
    let mut replies = b.replies().unwrap();
    assert_eq!(replies.len(), 10);
    let got = link::link_of(replies.pop().unwrap()).unwrap().unwrap();
    assert!(got.up && got.mac.is_some(), "{got:?}");
    for (i, r) in replies.iter().enumerate() {
        match (i, r) {
            (5, Err(e)) => {
                assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");
                assert!(e.to_string().starts_with("the same address again: "), "{e}");
            }
            (5, Ok(_)) => panic!("a duplicate address was accepted"),
            (_, r) => assert!(r.is_ok(), "request {i}: {r:?}"),
        }
    }
    // run(): the first failure, every request having run.
    let mut b = pod.batch();
    b.add(addr::add(pi, ip("10.9.0.6"), 32), "another address")
        .add(addr::add(pi, ip("10.9.0.5"), 32), "a duplicate")
        .add(addr::add(pi, ip("10.9.0.7"), 32), "a third address");
    let e = b.run().unwrap_err();
    assert!(e.to_string().starts_with("a duplicate: "), "{e}");

    let a4: Vec<IpAddr> = pod
        .addrs(pi, Family::Ipv4)
        .unwrap()
        .iter()
        .map(|a| a.ip)
        .collect();
    assert_eq!(a4, [ip("10.9.0.5"), ip("10.9.0.6"), ip("10.9.0.7")]);
    let a6 = pod.addrs(pi, Family::Ipv6).unwrap();
    let mine = a6.iter().find(|a| a.ip == ip("fd00:9::5")).expect("/128");
    assert!(mine.len == 128 && mine.nodad && !mine.tentative, "{mine:?}");
    for (family, gw) in [(Family::Ipv4, gw4), (Family::Ipv6, gw6)] {
        let n = pod.neighbours(pi, family).unwrap();
        let n = n.iter().find(|n| n.ip == gw).expect("gateway neighbour");
        assert!(
            n.permanent && n.lladdr.as_deref() == Some(&mac[..]),
            "{n:?}"
        );
        let routes = pod.routes(family).unwrap();
        assert!(
            routes.iter().any(|r| r.dst_len == 0
                && r.gateway == Some(gw)
                && r.oif == Some(pi)
                && r.in_main_table()),
            "{routes:?}"
        );
    }
    // The default route's device: the pod's eth0, found by one lookup.
    assert_eq!(pod.default_route_oif().unwrap(), Some(pi));
    assert_eq!(pod.uplink().unwrap().map(|l| l.name), Some("eth0".into()));
}

#[test]
fn only_veths_are_deleted() {
    std::thread::spawn(|| {
        unshare();
        let mut host = Rtnl::new().unwrap();
        run_ip(&["link", "add", "anbr0", "type", "bridge"]);
        run_ip(&[
            "link", "add", "anv3", "type", "veth", "peer", "name", "anv3p",
        ]);
        assert_eq!(
            host.delete_veth("anbr0").unwrap(),
            Removed::NotVeth("bridge".into())
        );
        assert!(host.link_by_name("anbr0").unwrap().is_some());
        assert_eq!(host.delete_veth("anv3").unwrap(), Removed::Deleted);
        assert!(
            host.link_by_name("anv3p").unwrap().is_none(),
            "peer gone too"
        );
        assert_eq!(host.delete_veth("anv3").unwrap(), Removed::NotFound);
        // No default route: no uplink.
        assert_eq!(host.default_route_oif().unwrap(), None);
        let br = host.link_by_name("anbr0").unwrap().unwrap();
        host.delete_link(br.index).unwrap();
        assert!(host.link(br.index).unwrap().is_none());
        host.delete_link(br.index)
            .expect("a missing link is not an error");
    })
    .join()
    .expect("scenario passed");
}
