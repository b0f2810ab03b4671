//! The `cost` section: ns per packet of the classifier through `BPF_PROG_TEST_RUN`, against
//! a no-op program.

use std::{
    fmt::Write as _,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use aliasnet_ebpf::{abi, maps, programs, DATAPATH_OBJECT};
use anyhow::{Context, Result};
use aya::{
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    EbpfLoader,
};

use super::{loadavg, median};

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

pub fn cost(report: &mut String) -> Result<()> {
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
    let _ = writeln!(
        report,
        "\n### Classification + counting cost (`BPF_PROG_TEST_RUN`)\n\n`an_host_ingress` on a 64-byte IPv4/UDP frame from a registered pod, repeat = {REPEAT}, {RUNS} runs; random /16-/32 internal prefixes. Load average {load0} at the start.\n\n| internal prefixes | hit: best / median ns | miss (internet): best / median ns | minus no-op (hit / miss, medians) |\n|---|---|---|---|"
    );
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let noop_med = median(&noop_ns);
    let mut model_row = String::new();
    for n in [10usize, 1_000, 10_000] {
        let mut ebpf = EbpfLoader::new().load(DATAPATH_OBJECT)?;
        for name in [programs::HOST_INGRESS, programs::HOST_EGRESS] {
            let prog: &mut SchedClassifier =
                ebpf.program_mut(name).context("program")?.try_into()?;
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
        }
        {
            let mut trie: LpmTrie<_, abi::LpmKeyData, abi::LpmValue> =
                LpmTrie::try_from(ebpf.map_mut(maps::PREFIXES).context("prefixes")?)?;
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            trie.insert(
                &Key::new(32 + 16, abi::LpmKeyData::new(0, [10, 77, 0, 0].into())),
                abi::LpmValue::default(),
                0,
            )?;
            let mut inserted = 1;
            while inserted < n {
                let len = 16 + (rng.next() % 17) as u32;
                let addr = (rng.next() as u32) & (u32::MAX << (32 - len));
                // Keep the "miss" address outside every prefix.
                if addr >> 24 == 203 {
                    continue;
                }
                trie.insert(
                    &Key::new(32 + len, abi::LpmKeyData::new(0, addr.into())),
                    abi::LpmValue::default(),
                    0,
                )?;
                inserted += 1;
            }
        }
        {
            // The same number of IPv6 prefixes (random /32-/128) in the IPv6 trie.
            let mut trie: LpmTrie<_, abi::Lpm6KeyData, abi::LpmValue> =
                LpmTrie::try_from(ebpf.map_mut(maps::PREFIXES6).context("prefixes6")?)?;
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            trie.insert(
                &Key::new(
                    32 + 32,
                    abi::Lpm6KeyData::new(
                        0,
                        std::net::Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 0),
                    ),
                ),
                abi::LpmValue::default(),
                0,
            )?;
            let mut inserted = 1;
            while inserted < n {
                let len = 32 + (rng.next() % 97) as u32;
                let bits = (u128::from(rng.next()) << 64 | u128::from(rng.next()))
                    & (u128::MAX << (128 - len));
                // Keep the "miss" address outside every prefix.
                if bits >> 112 == 0x2001 {
                    continue;
                }
                trie.insert(
                    &Key::new(32 + len, abi::Lpm6KeyData::new(0, bits.into())),
                    abi::LpmValue::default(),
                    0,
                )?;
                inserted += 1;
            }
        }
        let prog: &SchedClassifier = ebpf
            .program(programs::HOST_INGRESS)
            .context("program")?
            .try_into()?;
        // IPv4 and IPv6 interleaved, so that drift in the machine's load hits both.
        let hit = test_run_ns(prog, &udp_frame(hit_dst))?;
        let hit6 = test_run_ns(prog, &udp6_frame(hit6_dst))?;
        let miss = test_run_ns(prog, &udp_frame(miss_dst))?;
        let miss6 = test_run_ns(prog, &udp6_frame(miss6_dst))?;
        eprintln!("cost {n} prefixes: hit {hit:?} miss {miss:?} noop {noop_ns:?}");
        eprintln!("cost {n} IPv6 prefixes: hit {hit6:?} miss {miss6:?}");
        if n == 10 {
            // The other direction of a pod with an ingress limit: classification, counting
            // and the queue model with a CE mark (the class is congested after the first
            // few runs, and stays so), on an ECT(0) TCP frame from the internet.
            let mut meta: Array<_, abi::PodMeta> =
                Array::try_from(ebpf.map_mut(maps::POD_META).context("meta")?)?;
            let mut m = abi::PodMeta::default();
            m.limits
                .set(abi::Direction::Ingress, abi::KIND_TOTAL, Some(10_000_000));
            meta.set(0, m, 0)?;
            let prog: &SchedClassifier = ebpf
                .program(programs::HOST_EGRESS)
                .context("program")?
                .try_into()?;
            let mut pkt = udp_frame([10, 20, 0, 5]);
            pkt[14 + 1] = 0x02; // ECT(0)
            pkt[14 + 9] = 6; // TCP
            pkt[14 + 12..14 + 16].copy_from_slice(&[203, 0, 113, 9]);
            let model = test_run_ns(prog, &pkt)?;
            eprintln!("cost an_host_egress with the queue model: {model:?}");
            model_row = format!(
                "| 10, `an_host_egress` of a pod with an ingress limit (queue model, CE mark) | {:.0} / {:.0} | | {:.0} |",
                best(&model),
                median(&model),
                median(&model) - noop_med
            );
        }
        let _ = writeln!(
            report,
            "| {n} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} |",
            best(&hit),
            median(&hit),
            best(&miss),
            median(&miss),
            median(&hit) - noop_med,
            median(&miss) - noop_med
        );
        let _ = writeln!(
            report,
            "| {n} IPv6 (84-byte IPv6/UDP frame, /32-/128) | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} |",
            best(&hit6),
            median(&hit6),
            best(&miss6),
            median(&miss6),
            median(&hit6) - noop_med,
            median(&miss6) - noop_med
        );
    }
    let _ = writeln!(report, "{model_row}");
    let _ = writeln!(
        report,
        "| no-op program (harness) | {:.0} / {:.0} | | |",
        best(&noop_ns),
        noop_med
    );
    Ok(())
}
