//! What the `BPF_PROG_TEST_RUN` tests share: the fixture that loads the programs with
//! private maps and registers a pod, and the packet builders.
//!
//! Test runs use the loopback device of the test's own network namespace as `skb->dev`, so
//! the "pod" is registered under ifindex 1.

// Each test binary uses part of this module.
#![allow(dead_code)]

mod packets;

use std::net::IpAddr;

use aliasnet_ebpf::{abi, bench_datapath_object, datapath_object, maps, programs};
use aya::{
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie, MapData, PerCpuArray},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    Ebpf, EbpfLoader,
};

pub use packets::*;

pub const TC_ACT_UNSPEC: u32 = u32::MAX; // -1
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_OK: u32 = 0;
/// `skb->dev` in BPF_PROG_TEST_RUN is the loopback device unless ctx names another.
pub const TEST_IFINDEX: u32 = 1;
pub const SLOT: u32 = 7;

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

    /// Puts `cidr` in the node policy of generation `gen` (the trie of its family).
    pub fn prefix(&mut self, gen: u32, cidr: (impl Into<IpAddr>, u32), class: u32) {
        let value = abi::LpmValue { class, reserved: 0 };
        match cidr.0.into() {
            IpAddr::V4(a) => {
                let mut trie: LpmTrie<_, abi::LpmKeyData, abi::LpmValue> = self.map(maps::PREFIXES);
                trie.insert(
                    &Key::new(32 + cidr.1, abi::LpmKeyData::new(gen, a)),
                    value,
                    0,
                )
            }
            IpAddr::V6(a) => {
                let mut trie: LpmTrie<_, abi::Lpm6KeyData, abi::LpmValue> =
                    self.map(maps::PREFIXES6);
                trie.insert(
                    &Key::new(32 + cidr.1, abi::Lpm6KeyData::new(gen, a)),
                    value,
                    0,
                )
            }
        }
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

    /// 10/8 internal, the metadata endpoint and 10.99/16 blocked, 10.99.7/24 internal; in
    /// IPv6 the same: fd00::/8 internal, AWS's metadata endpoint and fd00:99::/32 blocked,
    /// fd00:99:7::/48 internal.
    fn policy(self) -> Self {
        let mut f = self;
        for (v4, v6, class) in [
            (("10.0.0.0", 8), ("fd00::", 8), abi::CLASS_INTERNAL),
            (
                ("169.254.169.254", 32),
                ("fd00:ec2::254", 128),
                abi::CLASS_BLOCKED,
            ),
            (("10.99.0.0", 16), ("fd00:99::", 32), abi::CLASS_BLOCKED),
            (("10.99.7.0", 24), ("fd00:99:7::", 48), abi::CLASS_INTERNAL),
        ] {
            f.prefix(0, (ip(v4.0), v4.1), class);
            f.prefix(0, (ip6(v6.0), v6.1), class);
        }
        f
    }
}

/// Tests `NAME::ipv4` and `NAME::ipv6` for each `fn NAME(fam: Family)` named, so that a
/// failure names its family (as ipamd's allocator tests do).
#[allow(unused_macros)]
macro_rules! per_family {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn ipv4() {
                super::$name(super::Family::Ipv4)
            }

            #[test]
            fn ipv6() {
                super::$name(super::Family::Ipv6)
            }
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use per_family;

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns()`, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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
