//! The `cost` section: ns per packet of the classifier and of the download path through
//! `BPF_PROG_TEST_RUN`, against a no-op program, by the number of prefixes and named
//! classes.

use std::{
    fmt::Write as _,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use aliasnet_ebpf::{abi, maps, programs, DATAPATH_OBJECT};
use anyhow::{Context, Result};
use aya::{
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    Ebpf, EbpfLoader,
};

use super::{fmt_rate, loadavg, median};

/// A 64-byte IPv4/UDP frame from the pod to `dst`.
fn udp_frame(dst: [u8; 4]) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
    let total: u16 = 64 - 14;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 1, 0, 0, 64, 17, 0, 0]);
    h.extend_from_slice(&[10, 20, 0, 5]);
    h.extend_from_slice(&dst);
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p.extend(h);
    p.extend_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0, 30, 0, 0]);
    p.resize(64, 0xab);
    p
}

/// The IPv6/UDP frame of the same payload as [`udp_frame`] (84 bytes) from the pod to `dst`.
fn udp6_frame(dst: std::net::Ipv6Addr) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x86, 0xdd];
    p.extend_from_slice(&[0x60, 0, 0, 0, 0, 30, 17, 64]);
    p.extend_from_slice(&std::net::Ipv6Addr::new(0xfd00, 0x240, 0, 0, 0, 0, 0, 5).octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0, 30, 0, 0]);
    p.resize(84, 0xab);
    p
}

/// xorshift64*: reproducible prefixes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

/// A two-instruction SCHED_CLS program (`r0 = -1; exit`): the harness baseline.
fn load_noop() -> Result<OwnedFd> {
    // mov64 r0, -1 (BPF_ALU64 | BPF_MOV | BPF_K = 0xb7), exit (0x95)
    let insns: [u64; 2] = [0xffff_ffff_0000_00b7, 0x95];
    let license = c"GPL";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // SAFETY: bpf(BPF_PROG_LOAD) with a zeroed attr of sufficient size whose pointers
    // reference live locals for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("load no-op program");
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_PROG_TEST_RUN` repetitions per measurement, and measurements per point (`cost`).
const REPEAT: u32 = 1_000_000;
const RUNS: usize = 5;

/// `RUNS` measurements of `prog` on `pkt`: the average ns per run the kernel reports for each.
fn test_run_ns(prog: &SchedClassifier, pkt: &[u8]) -> Result<Vec<f64>> {
    let mut out = vec![0u8; pkt.len() + 256];
    (0..RUNS)
        .map(|_| {
            let r = prog.test_run(TestRunOptions {
                data_in: Some(pkt),
                data_out: Some(&mut out),
                repeat: REPEAT,
                ..TestRunOptions::new()
            })?;
            Ok(r.duration.as_nanos() as f64)
        })
        .collect()
}

/// Average ns per run the kernel reports for `repeat` runs.
fn test_run_raw(fd: &OwnedFd, pkt: &[u8], repeat: u32) -> Result<u32> {
    let mut out = vec![0u8; pkt.len() + 256];
    let mut attr = [0u8; 80];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&(pkt.len() as u32).to_ne_bytes());
    attr[12..16].copy_from_slice(&(out.len() as u32).to_ne_bytes());
    attr[16..24].copy_from_slice(&(pkt.as_ptr() as u64).to_ne_bytes());
    attr[24..32].copy_from_slice(&(out.as_mut_ptr() as u64).to_ne_bytes());
    attr[32..36].copy_from_slice(&repeat.to_ne_bytes());
    // SAFETY: bpf(BPF_PROG_TEST_RUN) on a program we own; buffers outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_PROG_TEST_RUN");
    }
    Ok(u32::from_ne_bytes(
        attr[36..40].try_into().expect("4 bytes"),
    ))
}

/// The internet limit of the download rows, and its named class's (a quarter of it).
const DOWNLOAD_RATE: u64 = 100_000_000;

/// The class the prefix numbered `i` of a trie names with `classes` named classes: internal
/// and the named classes in turn; the hit prefix (`i` = 0) names the last named class.
fn class_of(i: usize, classes: usize) -> u32 {
    match classes {
        0 => abi::CLASS_INTERNAL,
        c if i == 0 => abi::CLASS_NAMED + c as u32 - 1,
        c => match i % (c + 1) {
            0 => abi::CLASS_INTERNAL,
            k => abi::CLASS_NAMED + k as u32 - 1,
        },
    }
}

/// The datapath object loaded for test runs, with `n` prefixes in each family's trie over
/// `classes` named classes: random /16-/32 (IPv4) and /32-/128 (IPv6) prefixes, plus the
/// hit prefixes 10.77.0.0/16 and fd00:77::/32; the miss addresses (203.0.113.9, 2001:db8::9)
/// in none. The pod (slot 0) is loopback, the device of a test run.
fn load(n: usize, classes: usize) -> Result<Ebpf> {
    let mut ebpf = EbpfLoader::new().load(DATAPATH_OBJECT)?;
    for name in [
        programs::HOST_INGRESS,
        programs::HOST_EGRESS,
        programs::UPLINK_IN,
    ] {
        let prog: &mut SchedClassifier = ebpf.program_mut(name).context("program")?.try_into()?;
        prog.load()?;
    }
    {
        let mut cfg: Array<_, abi::Config> =
            Array::try_from(ebpf.map_mut(maps::CONFIG).context("config")?)?;
        cfg.set(
            0,
            abi::Config {
                abi_version: abi::ABI_VERSION,
                ..Default::default()
            },
            0,
        )?;
    }
    {
        let mut pods: HashMap<_, u32, abi::Pod> =
            HashMap::try_from(ebpf.map_mut(maps::PODS).context("pods")?)?;
        // skb->dev of a test run is the loopback device of this namespace.
        pods.insert(
            1,
            abi::Pod {
                slot: 0,
                ..Default::default()
            },
            0,
        )?;
        let mut ips: HashMap<_, u32, u32> =
            HashMap::try_from(ebpf.map_mut(maps::POD_IPS).context("pod ips")?)?;
        ips.insert(u32::from_ne_bytes(POD_IP4), 0, 0)?;
    }
    let value = |i: usize| abi::LpmValue {
        class: class_of(i, classes),
        reserved: 0,
    };
    {
        let mut trie: LpmTrie<_, abi::LpmKeyData, abi::LpmValue> =
            LpmTrie::try_from(ebpf.map_mut(maps::PREFIXES).context("prefixes")?)?;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        trie.insert(
            &Key::new(32 + 16, abi::LpmKeyData::new(0, [10, 77, 0, 0].into())),
            value(0),
            0,
        )?;
        let mut inserted = 1;
        while inserted < n {
            let len = 16 + (rng.next() % 17) as u32;
            let addr = (rng.next() as u32) & (u32::MAX << (32 - len));
            // Keep the "miss" address outside every prefix, and the hit prefix as it is.
            if addr >> 24 == 203 || addr >> 16 == 0x0a4d {
                continue;
            }
            trie.insert(
                &Key::new(32 + len, abi::LpmKeyData::new(0, addr.into())),
                value(inserted),
                0,
            )?;
            inserted += 1;
        }
    }
    {
        let mut trie: LpmTrie<_, abi::Lpm6KeyData, abi::LpmValue> =
            LpmTrie::try_from(ebpf.map_mut(maps::PREFIXES6).context("prefixes6")?)?;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        trie.insert(
            &Key::new(
                32 + 32,
                abi::Lpm6KeyData::new(0, std::net::Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 0)),
            ),
            value(0),
            0,
        )?;
        let mut inserted = 1;
        while inserted < n {
            let len = 32 + (rng.next() % 97) as u32;
            let bits = (u128::from(rng.next()) << 64 | u128::from(rng.next()))
                & (u128::MAX << (128 - len));
            if bits >> 112 == 0x2001 || bits >> 96 == 0xfd00_0077 {
                continue;
            }
            trie.insert(
                &Key::new(32 + len, abi::Lpm6KeyData::new(0, bits.into())),
                value(inserted),
                0,
            )?;
            inserted += 1;
        }
    }
    Ok(ebpf)
}

/// The pod's IPv4 address in the test frames (10.20.0.5).
const POD_IP4: [u8; 4] = [10, 20, 0, 5];

/// A TCP frame, ECT(0), from `src` to the pod: a download's data segment.
fn download_frame(src: [u8; 4]) -> Vec<u8> {
    let mut pkt = udp_frame(POD_IP4);
    pkt[14 + 1] = 0x02; // ECT(0)
    pkt[14 + 9] = 6; // TCP
    pkt[14 + 12..14 + 16].copy_from_slice(&src);
    pkt
}

fn program<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a SchedClassifier> {
    Ok(ebpf.program(name).context("program")?.try_into()?)
}

/// The download limits of the rows: the internet's, and the class's when there is one.
fn download_rates(classes: usize) -> abi::Rates {
    let mut r = abi::Rates::default();
    r.set(
        abi::Direction::Ingress,
        abi::KIND_INTERNET,
        Some(DOWNLOAD_RATE),
    );
    if classes > 0 {
        r.set(
            abi::Direction::Ingress,
            abi::KIND_NAMED + classes - 1,
            Some(DOWNLOAD_RATE / 4),
        );
    }
    r
}

/// An aggregate's record with `rates` and a group of each limit of downloads at `group0`,
/// `group0` + 3, ...; and the mask of the pod's own leaves in them.
fn aggregate(rates: abi::Rates, group0: u32) -> (abi::Entity, u64) {
    let mut e = abi::Entity {
        flags: abi::ENTITY_IN_USE,
        limits: rates,
        ..Default::default()
    };
    let mut mask = 0;
    let mut g = group0;
    for k in abi::KIND_INTERNET..abi::NR_KINDS {
        if rates.get(abi::Direction::Ingress, k).is_some() {
            e.groups[abi::DIR_INGRESS][k] = g as u16;
            mask |= 1 << k;
            g += 3;
        }
    }
    (e, mask)
}

/// The download rows of one loaded object: `an_host_egress` with the pod's own download
/// limits, the same with its namespace's too, and `an_uplink_in` with the node's; ns per
/// packet of each (`RUNS` runs).
fn download_costs(ebpf: &mut Ebpf, classes: usize) -> Result<[Vec<f64>; 3]> {
    let src = if classes > 0 {
        [10, 77, 1, 2]
    } else {
        [203, 0, 113, 9]
    };
    let pkt = download_frame(src);
    let rates = download_rates(classes);
    let (ns_rec, ns_mask) = aggregate(rates, abi::AGG_GROUP_MIN);
    let (node_rec, node_mask) = aggregate(rates, abi::node_group(abi::KIND_INTERNET));
    {
        let mut meta: Array<_, abi::PodMeta> =
            Array::try_from(ebpf.map_mut(maps::POD_META).context("meta")?)?;
        let mut m = abi::PodMeta {
            limits: rates,
            ..Default::default()
        };
        m.agg_leaves[0][abi::DIR_INGRESS] = ns_mask;
        m.agg_leaves[1][abi::DIR_INGRESS] = node_mask;
        meta.set(0, m, 0)?;
    }
    let pod = test_run_ns(program(ebpf, programs::HOST_EGRESS)?, &pkt)?;
    {
        let mut ents: Array<_, abi::Entity> =
            Array::try_from(ebpf.map_mut(maps::ENTITIES).context("entities")?)?;
        ents.set(1, ns_rec, 0)?;
        ents.set(abi::NODE_ENTITY, node_rec, 0)?;
        let mut meta: Array<_, abi::PodMeta> =
            Array::try_from(ebpf.map_mut(maps::POD_META).context("meta")?)?;
        let mut m = meta.get(&0, 0)?;
        m.entity = 1;
        meta.set(0, m, 0)?;
        let mut cfg: Array<_, abi::Config> =
            Array::try_from(ebpf.map_mut(maps::CONFIG).context("config")?)?;
        let mut c = cfg.get(&0, 0)?;
        // Any device: a test run redirects nothing.
        c.ns_in_ifindex = 1;
        c.node_in_ifindex = 1;
        cfg.set(0, c, 0)?;
    }
    let with_ns = test_run_ns(program(ebpf, programs::HOST_EGRESS)?, &pkt)?;
    let node = test_run_ns(program(ebpf, programs::UPLINK_IN)?, &pkt)?;
    Ok([pod, with_ns, node])
}

/// One measured configuration of the table.
struct CostRow {
    prefixes: usize,
    classes: usize,
    /// hit, miss, IPv6 hit, IPv6 miss, download (pod), download (pod + namespace), node.
    ns: [Vec<f64>; 7],
}

pub fn cost(prefix_counts: &[usize], class_counts: &[usize], report: &mut String) -> Result<()> {
    let load0 = loadavg();
    let hit_dst = [10, 77, 1, 2];
    let miss_dst = [203, 0, 113, 9];
    let hit6_dst = std::net::Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);
    let miss6_dst = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9);
    let noop = load_noop()?;
    let pkt = udp_frame(miss_dst);
    let noop_ns: Vec<f64> = (0..RUNS)
        .map(|_| test_run_raw(&noop, &pkt, REPEAT).map(f64::from))
        .collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for &n in prefix_counts {
        for &classes in class_counts {
            anyhow::ensure!(
                classes <= abi::MAX_NAMED,
                "at most {} named classes",
                abi::MAX_NAMED
            );
            let mut ebpf = load(n, classes)?;
            let prog = program(&ebpf, programs::HOST_INGRESS)?;
            // IPv4 and IPv6 interleaved, so that drift in the machine's load hits both.
            let hit = test_run_ns(prog, &udp_frame(hit_dst))?;
            let hit6 = test_run_ns(prog, &udp6_frame(hit6_dst))?;
            let miss = test_run_ns(prog, &udp_frame(miss_dst))?;
            let miss6 = test_run_ns(prog, &udp6_frame(miss6_dst))?;
            let [pod, with_ns, node] = download_costs(&mut ebpf, classes)?;
            eprintln!(
                "cost {n} prefixes, {classes} classes: hit {hit:?} miss {miss:?} hit6 {hit6:?} miss6 {miss6:?} download {pod:?} +ns {with_ns:?} node {node:?} noop {noop_ns:?}"
            );
            rows.push(CostRow {
                prefixes: n,
                classes,
                ns: [hit, miss, hit6, miss6, pod, with_ns, node],
            });
        }
    }
    let noop_med = median(&noop_ns);
    let net = |v: &[f64]| median(v) - noop_med;
    let _ = writeln!(
        report,
        "\n### Classification + counting cost (`BPF_PROG_TEST_RUN`)\n\n\
         ns per packet, median of {RUNS} runs of {REPEAT} repetitions, minus the no-op program's median ({noop_med:.0} ns; best {:.0}); load average {load0} at the start, {} at the end. \
         Prefixes per family's trie: random /16-/32 (IPv4) and /32-/128 (IPv6), spread over internal and the named classes in turn. \
         Classification: `an_host_ingress` on a 64-byte IPv4/UDP (84-byte IPv6/UDP) frame from a registered pod; hit = a listed prefix (the last named class when there are classes, else internal), miss = plain internet. \
         Downloads: an ECT(0) TCP frame from the internet (from the named class when there are classes) to the pod; `an_host_egress` with the pod's own download limits (internet {}, the class a quarter of it), then with its namespace's too; `an_uplink_in` with the node's.\n\n\
         | prefixes | named classes | IPv4 hit / miss | IPv6 hit / miss | download, pod limits | download, pod + namespace limits | `an_uplink_in`, node limits |\n|---|---|---|---|---|---|---|",
        noop_ns.iter().copied().fold(f64::INFINITY, f64::min),
        loadavg(),
        fmt_rate(DOWNLOAD_RATE),
    );
    for r in &rows {
        let v: Vec<f64> = r.ns.iter().map(|x| net(x)).collect();
        let _ = writeln!(
            report,
            "| {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {:.0} | {:.0} |",
            r.prefixes, r.classes, v[0], v[1], v[2], v[3], v[4], v[5], v[6]
        );
    }
    // The target: 32 classes and 64k prefixes against today's 10k internal prefixes.
    let find = |n: usize, c: usize| rows.iter().find(|r| r.prefixes == n && r.classes == c);
    if let (Some(today), Some(full)) = (
        find(10_000, 0),
        find(abi::MAX_PREFIXES as usize, abi::MAX_NAMED),
    ) {
        let ratio = |i: usize| 100.0 * (net(&full.ns[i]) / net(&today.ns[i]) - 1.0);
        let _ = writeln!(
            report,
            "\n{} named classes and {} prefixes against 10000 internal prefixes and no class, \
             classification: IPv4 hit {:+.1} %, miss {:+.1} %; IPv6 hit {:+.1} %, miss {:+.1} % (target: at most +10 %).",
            abi::MAX_NAMED,
            abi::MAX_PREFIXES,
            ratio(0),
            ratio(1),
            ratio(2),
            ratio(3),
        );
    }
    Ok(())
}
