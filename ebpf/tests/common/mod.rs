//! What the `BPF_PROG_TEST_RUN` tests share: the fixture that loads the programs with
//! private maps and registers a pod, and the packet builders.
//!
//! Test runs use the loopback device of the test's own network namespace as `skb->dev`, so
//! the "pod" is registered under ifindex 1.

// Each test binary uses part of this module.
#![allow(dead_code)]

mod v6;

use std::net::Ipv4Addr;

use aliasnet_ebpf::{abi, bench_datapath_object, datapath_object, maps, programs};
use aya::{
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie, MapData, PerCpuArray},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    Ebpf, EbpfLoader,
};

pub use v6::*;

pub const TC_ACT_UNSPEC: u32 = u32::MAX; // -1
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_OK: u32 = 0;
/// `skb->dev` in BPF_PROG_TEST_RUN is the loopback device unless ctx names another.
pub const TEST_IFINDEX: u32 = 1;
pub const SLOT: u32 = 7;
pub const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 5);

// struct __sk_buff (uapi/linux/bpf.h): the fields a test run may set or read back.
pub const SKB_SIZE: usize = 192;
pub const SKB_PRIORITY: usize = 32;
pub const SKB_INGRESS_IFINDEX: usize = 36;
pub const SKB_CB0: usize = 48;
pub const SKB_GSO_SEGS: usize = 164;
pub const SKB_GSO_SIZE: usize = 176;

/// A test run's `__sk_buff` with `priority` set.
pub fn prio_ctx(priority: u32) -> [u8; SKB_SIZE] {
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_PRIORITY..SKB_PRIORITY + 4].copy_from_slice(&priority.to_ne_bytes());
    ctx
}

/// A test run's `__sk_buff` describing a GSO packet of `segs` segments of `size` bytes.
pub fn gso_ctx(segs: u32, size: u32) -> [u8; SKB_SIZE] {
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_GSO_SEGS..SKB_GSO_SEGS + 4].copy_from_slice(&segs.to_ne_bytes());
    ctx[SKB_GSO_SIZE..SKB_GSO_SIZE + 4].copy_from_slice(&size.to_ne_bytes());
    ctx
}

/// The leaf classid of the pod's own limit of `kind` on its device.
pub const fn pod_leaf(kind: usize, leaf: u32) -> u32 {
    abi::classid(abi::pod_class(kind)) + leaf
}

/// A test run's `__sk_buff` with `priority` set, as if received on `ingress_ifindex`.
pub fn from_ctx(priority: u32, ingress_ifindex: u32) -> [u8; SKB_SIZE] {
    let mut ctx = prio_ctx(priority);
    ctx[SKB_INGRESS_IFINDEX..SKB_INGRESS_IFINDEX + 4]
        .copy_from_slice(&ingress_ifindex.to_ne_bytes());
    ctx
}

/// Sets `m`'s limit of `kind` in `dir` to `rate` bit/s (0: none).
pub fn set_rate(m: &mut abi::PodMeta, dir: abi::Direction, kind: usize, rate: u64) {
    m.limits.set(dir, kind, (rate != 0).then_some(rate));
}

/// `cb[0]` (the gate's mark) a program left.
pub fn cb0_of(ctx: &[u8; SKB_SIZE]) -> u32 {
    u32::from_ne_bytes(ctx[SKB_CB0..SKB_CB0 + 4].try_into().expect("4 bytes"))
}

/// The priority (the HTB class) a program left in a test run's `__sk_buff`.
pub fn prio_of(ctx: &[u8; SKB_SIZE]) -> u32 {
    u32::from_ne_bytes(
        ctx[SKB_PRIORITY..SKB_PRIORITY + 4]
            .try_into()
            .expect("4 bytes"),
    )
}

/// 1 Mbit/s: one full frame takes 12.1 ms, so the model's steps are far above the time a
/// test run takes, and the marking threshold is 2 frames (24.2 ms).
pub const SLOW: u64 = 1_000_000;

/// Loading programs needs root: without it the test fails with this message instead of
/// passing without having run. [`Fixture::new`] checks it first.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "needs root: the eBPF tests load programs (run tests/run.sh, or cargo test as root)"
    );
}

pub struct Fixture {
    pub ebpf: Ebpf,
}

impl Fixture {
    /// Loads the product's object with private maps, all programs, and the pod registered at
    /// SLOT.
    pub fn new() -> Self {
        Self::load(datapath_object().unwrap_or_else(|e| panic!("{e}")))
    }

    /// [`Fixture::new`] with the benchmarks' object, whose programs obey the switches in
    /// `an_config.flags`.
    pub fn bench() -> Self {
        Self::load(bench_datapath_object().unwrap_or_else(|e| panic!("{e}")))
    }

    fn load(object: &[u8]) -> Self {
        require_root();
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .expect("load datapath object");
        for name in programs::ALL {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("program {name} missing"))
                .try_into()
                .expect("classifier");
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e:?}"));
        }
        let mut f = Self { ebpf };
        f.set_config(0);
        let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
        pods.insert(
            TEST_IFINDEX,
            abi::Pod {
                slot: SLOT,
                ipv4: POD_IP.octets(),
                ipv6: POD_IP6.octets(),
                ipv6_ll: POD_LL.octets(),
                ..Default::default()
            },
            0,
        )
        .expect("register pod");
        let mut ips: HashMap<_, [u8; 4], u32> = f.map(maps::POD_IPS);
        ips.insert(POD_IP.octets(), SLOT, 0)
            .expect("register pod ip");
        let mut ips6: HashMap<_, [u8; 16], u32> = f.map(maps::POD_IPS6);
        ips6.insert(POD_IP6.octets(), SLOT, 0)
            .expect("register pod IPv6");
        f
    }

    pub fn map<T>(&mut self, name: &str) -> T
    where
        T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
    {
        // A fresh typed handle on the same kernel object each time, so a test can hold
        // several views; the Ebpf keeps the original (and the programs reference it).
        let map = self
            .ebpf
            .map(name)
            .unwrap_or_else(|| panic!("map {name} missing"));
        let (data, wrap): (&MapData, fn(MapData) -> aya::maps::Map) = match map {
            aya::maps::Map::Array(m) => (m, aya::maps::Map::Array),
            aya::maps::Map::HashMap(m) => (m, aya::maps::Map::HashMap),
            aya::maps::Map::LruHashMap(m) => (m, aya::maps::Map::LruHashMap),
            aya::maps::Map::LpmTrie(m) => (m, aya::maps::Map::LpmTrie),
            aya::maps::Map::PerCpuArray(m) => (m, aya::maps::Map::PerCpuArray),
            other => panic!("unexpected map type {other:?}"),
        };
        let id = data.info().expect("map info").id();
        T::try_from(wrap(MapData::from_id(id).expect("reopen map"))).expect("typed map")
    }

    pub fn set_config(&mut self, active_gen: u32) {
        let mut cfg: Array<_, abi::Config> = self.map(maps::CONFIG);
        cfg.set(
            0,
            abi::Config {
                abi_version: abi::ABI_VERSION,
                active_gen,
                ..Default::default()
            },
            0,
        )
        .expect("set config");
    }

    pub fn update_config(&mut self, f: impl FnOnce(&mut abi::Config)) {
        let mut cfg: Array<_, abi::Config> = self.map(maps::CONFIG);
        let mut c = cfg.get(&0, 0).expect("config");
        f(&mut c);
        cfg.set(0, c, 0).expect("set config");
    }

    /// Changes the pod's record (limits) at SLOT.
    pub fn update_meta(&mut self, f: impl FnOnce(&mut abi::PodMeta)) {
        let mut meta: Array<_, abi::PodMeta> = self.map(maps::POD_META);
        let mut m = meta.get(&SLOT, 0).expect("meta");
        f(&mut m);
        meta.set(SLOT, m, 0).expect("set meta");
    }

    pub fn vqueue(&mut self, idx: u32) -> abi::VQueue {
        let vq: Array<_, abi::VQueue> = self.map(maps::VQUEUE);
        vq.get(&idx, 0).expect("vqueue")
    }

    /// Runs `prog` once on `pkt` (with `ctx` as its `__sk_buff`, zero if `None`); returns the
    /// verdict, the packet as the program left it and the `__sk_buff` it left.
    fn test_run(
        &self,
        prog: &str,
        pkt: &[u8],
        ctx: Option<&[u8; SKB_SIZE]>,
    ) -> (u32, Vec<u8>, [u8; SKB_SIZE]) {
        let prog: &SchedClassifier = self
            .ebpf
            .program(prog)
            .expect("program")
            .try_into()
            .expect("classifier");
        let mut out = vec![0u8; pkt.len() + 256];
        let mut ctx_out = [0u8; SKB_SIZE];
        let default_ctx = [0u8; SKB_SIZE];
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(pkt),
                data_out: Some(&mut out),
                ctx_in: Some(ctx.unwrap_or(&default_ctx)),
                ctx_out: Some(&mut ctx_out),
                ..TestRunOptions::new()
            })
            .expect("BPF_PROG_TEST_RUN");
        out.truncate(res.data_size_out as usize);
        (res.return_value, out, ctx_out)
    }

    /// Runs `prog` once on `pkt`; returns the verdict and the packet as the program left it.
    pub fn run_data(&self, prog: &str, pkt: &[u8], ctx: Option<&[u8; SKB_SIZE]>) -> (u32, Vec<u8>) {
        let (ret, out, _) = self.test_run(prog, pkt, ctx);
        (ret, out)
    }

    pub fn prefix(&mut self, gen: u32, cidr: (Ipv4Addr, u32), class: u32) {
        let mut trie: LpmTrie<_, abi::LpmKeyData, abi::LpmValue> = self.map(maps::PREFIXES);
        trie.insert(
            &Key::new(32 + cidr.1, abi::LpmKeyData::new(gen, cidr.0)),
            abi::LpmValue { class, reserved: 0 },
            0,
        )
        .expect("insert prefix");
    }

    /// Runs `prog` once on `pkt`; returns the verdict and the `__sk_buff` it left.
    pub fn run(
        &self,
        prog: &str,
        pkt: &[u8],
        ctx: Option<&[u8; SKB_SIZE]>,
    ) -> (u32, [u8; SKB_SIZE]) {
        let (ret, _, ctx_out) = self.test_run(prog, pkt, ctx);
        (ret, ctx_out)
    }

    /// Runs `pkt` through every program; each passes it untouched (the gate, a classic
    /// filter, does not match it: 0).
    #[track_caller]
    pub fn passes_untouched(&self, pkt: &[u8], what: &str) {
        for prog in programs::PACKET {
            let (ret, out) = self.run_data(prog, pkt, None);
            let pass = if prog == programs::NS_GATE {
                0
            } else {
                TC_ACT_UNSPEC
            };
            assert_eq!(ret, pass, "{prog}: {what}");
            assert_eq!(out, pkt, "{prog} rewrote {what}");
        }
    }

    /// Runs `prog` on each packet in turn, checking each one's verdict.
    #[track_caller]
    pub fn expect_verdicts(&self, prog: &str, cases: &[(&[u8], u32)]) {
        for (i, &(pkt, want)) in cases.iter().enumerate() {
            assert_eq!(self.run(prog, pkt, None).0, want, "{prog}: packet {i}");
        }
    }

    pub fn counters(&mut self) -> abi::PodCounters {
        let arr: PerCpuArray<_, abi::PodCounters> = self.map(maps::COUNTERS);
        let mut total = abi::PodCounters::default();
        for v in arr.get(&SLOT, 0).expect("counters").iter() {
            total += *v;
        }
        total
    }

    /// What the uplink programs put into the node's limits, by direction index.
    pub fn node_counters(&mut self) -> [abi::Counter; abi::NR_DIRS] {
        let arr: PerCpuArray<_, abi::NodeCounters> = self.map(maps::NODE_COUNTERS);
        let mut total = [abi::Counter::default(); abi::NR_DIRS];
        for v in arr.get(&0, 0).expect("node counters").iter() {
            for (t, s) in total.iter_mut().zip(v.staged.iter()) {
                *t += *s;
            }
        }
        total
    }

    /// Sets the pod's limit of `kind` in `dir` at SLOT (`None`: none).
    pub fn set_limit(&mut self, dir: abi::Direction, kind: usize, rate: Option<u64>) {
        self.update_meta(|m| m.limits.set(dir, kind, rate));
    }

    /// Changes aggregate `entity`'s record.
    pub fn update_entity(&mut self, entity: u32, f: impl FnOnce(&mut abi::Entity)) {
        let mut arr: Array<_, abi::Entity> = self.map(maps::ENTITIES);
        let mut e = arr.get(&entity, 0).expect("entity");
        f(&mut e);
        arr.set(entity, e, 0).expect("set entity");
    }

    /// Sets a limit of the node's of `kind` in `dir`, its group published and its device in
    /// use (the loopback stands in for the node's download device).
    pub fn set_node_limit(&mut self, dir: abi::Direction, kind: usize, rate: Option<u64>) {
        self.update_entity(abi::NODE_ENTITY, |e| {
            e.flags = abi::ENTITY_IN_USE;
            e.limits.set(dir, kind, rate);
            e.groups[dir.index()][kind] = rate.map_or(0, |_| abi::node_group(kind) as u16);
        });
        self.update_config(|c| match dir {
            abi::Direction::Egress => c.node_out = 1,
            abi::Direction::Ingress => c.node_in_ifindex = TEST_IFINDEX,
        });
    }

    /// Puts the pod in namespace aggregate `entity` with a limit of `kind` in `dir`, its
    /// group at minor `group`, the namespaces' device of `dir` in use (the loopback).
    pub fn set_ns_limit(
        &mut self,
        entity: u32,
        dir: abi::Direction,
        kind: usize,
        rate: Option<u64>,
        group: u16,
    ) {
        self.update_entity(entity, |e| {
            e.flags = abi::ENTITY_IN_USE;
            e.limits.set(dir, kind, rate);
            e.groups[dir.index()][kind] = rate.map_or(0, |_| group);
        });
        self.update_meta(|m| m.entity = entity);
        self.update_config(|c| match dir {
            abi::Direction::Egress => c.ns_out_ifindex = TEST_IFINDEX,
            abi::Direction::Ingress => c.ns_in_ifindex = TEST_IFINDEX,
        });
    }

    /// The node policy most tests use.
    pub fn with_policy() -> Self {
        Self::new().policy()
    }

    /// [`Fixture::with_policy`] with the benchmarks' object.
    pub fn bench_with_policy() -> Self {
        Self::bench().policy()
    }

    fn policy(self) -> Self {
        let mut f = self;
        f.prefix(0, (Ipv4Addr::new(10, 0, 0, 0), 8), abi::CLASS_INTERNAL);
        f.prefix(
            0,
            (Ipv4Addr::new(169, 254, 169, 254), 32),
            abi::CLASS_BLOCKED,
        );
        f.prefix(0, (Ipv4Addr::new(10, 99, 0, 0), 16), abi::CLASS_BLOCKED);
        f.prefix(0, (Ipv4Addr::new(10, 99, 7, 0), 24), abi::CLASS_INTERNAL);
        f.with_policy6()
    }
}

// ---- packet builders ------------------------------------------------------------------

pub const ETH_HLEN: usize = 14;

pub fn eth(ethertype: u16) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
    p.extend_from_slice(&ethertype.to_be_bytes());
    p
}

pub fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub struct Ip {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// DSCP and ECN.
    pub tos: u8,
    pub proto: u8,
    pub options: Vec<u8>,
    /// (more fragments, offset in 8-byte units)
    pub frag: (bool, u16),
    pub payload: Vec<u8>,
}

impl Ip {
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        // ICMP echo request with 100 bytes of data, as `ping -s 100` sends.
        let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
        icmp.extend(std::iter::repeat_n(0xab, 100));
        let c = csum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        Self {
            src,
            dst,
            tos: 0,
            proto: 1,
            options: Vec::new(),
            frag: (false, 0),
            payload: icmp,
        }
    }

    pub fn build(&self) -> Vec<u8> {
        assert_eq!(self.options.len() % 4, 0);
        let ihl = 5 + self.options.len() / 4;
        let total = ihl * 4 + self.payload.len();
        let frag = (u16::from(self.frag.0) << 13) | self.frag.1;
        let mut h = vec![(4 << 4) | ihl as u8, self.tos];
        h.extend_from_slice(&(total as u16).to_be_bytes());
        h.extend_from_slice(&[0x4a, 0x11]);
        h.extend_from_slice(&frag.to_be_bytes());
        h.extend_from_slice(&[64, self.proto, 0, 0]);
        h.extend_from_slice(&self.src.octets());
        h.extend_from_slice(&self.dst.octets());
        h.extend_from_slice(&self.options);
        let c = csum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        let mut p = eth(0x0800);
        p.extend(h);
        p.extend_from_slice(&self.payload);
        p
    }
}

pub fn arp_request() -> Vec<u8> {
    let mut p = eth(0x0806);
    p.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    p.extend_from_slice(&POD_IP.octets());
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&[169, 254, 1, 1]);
    p
}

/// A TCP segment with a 32-byte header (timestamps) and `len` bytes of payload.
pub fn tcp(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> Ip {
    let mut seg = vec![0u8; 32 + len];
    seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
    seg[2..4].copy_from_slice(&443u16.to_be_bytes());
    seg[12] = 8 << 4; // data offset: 8 words
    seg[13] = 0x10; // ACK
    seg[20..22].copy_from_slice(&[1, 1]); // NOP NOP
    seg[22..24].copy_from_slice(&[8, 10]); // timestamp option header
    Ip {
        proto: 6,
        payload: seg,
        ..Ip::new(src, dst)
    }
}

pub fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("address")
}

pub fn c(packets: u64, bytes: usize) -> abi::Counter {
    abi::Counter {
        packets,
        bytes: bytes as u64,
    }
}

/// Counters with exactly the given (direction, class) cells set.
pub fn expect(cells: &[(abi::Direction, abi::Class, abi::Counter)]) -> abi::PodCounters {
    let mut out = abi::PodCounters::default();
    for &(d, k, v) in cells {
        out.dir[d.index()][k.index()] += v;
    }
    out
}
