//! `aliasnet-bench podctl`, a development tool: attach/detach/show a pod by hand (benchmarks
//! and experiments; `aliasnetctl pods` shows attached pods but attaches nothing).
//!
//! ```sh
//! nsenter --net=/run/netns/node aliasnet-bench podctl --pin-root /sys/fs/bpf/aliasnet attach vh1 /run/netns/pod 10.20.0.5 \
//!     [--ingress-rate 10M] [--egress-rate 1G] [--internet-rate 10M]
//! nsenter --net=/run/netns/node aliasnet-bench podctl detach
//! nsenter --net=/run/netns/node aliasnet-bench podctl show
//! ```

use std::path::PathBuf;

use aliasnet_ebpf::{
    abi::{Class, Direction},
    limits::parse_quantity,
    Datapath, Limits, PodAttachment, PodIdentity,
};
use anyhow::{anyhow, Result};
use clap::Subcommand;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = aliasnet_ebpf::DEFAULT_PIN_ROOT)]
    pin_root: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Attach {
        host_ifname: String,
        netns: PathBuf,
        ip: std::net::Ipv4Addr,
        #[arg(long, default_value = "podctl-0")]
        container_id: String,
        #[arg(long, value_parser = rate)]
        ingress_rate: Option<u64>,
        #[arg(long, value_parser = rate)]
        egress_rate: Option<u64>,
        #[arg(long, value_parser = rate)]
        internet_rate: Option<u64>,
    },
    Detach {
        #[arg(long, default_value = "podctl-0")]
        container_id: String,
    },
    Show,
}

fn rate(s: &str) -> Result<u64, String> {
    parse_quantity(s)
}

pub fn run(args: Args) -> Result<()> {
    let mut dp = Datapath::open(&args.pin_root)?;
    match args.cmd {
        Cmd::Attach {
            host_ifname,
            netns,
            ip,
            container_id,
            ingress_rate,
            egress_rate,
            internet_rate,
        } => {
            let limits = Limits {
                ingress_rate,
                egress_rate,
                internet_egress_rate: internet_rate,
                ..Default::default()
            };
            limits.validate()?;
            let a = dp.attach_pod(&PodAttachment {
                host_ifname,
                netns,
                identity: PodIdentity {
                    namespace: "default".into(),
                    name: "podctl".into(),
                    container_id,
                    ifname: "eth0".into(),
                    ipv4: Some(ip),
                    ipv6: None,
                },
                limits,
                pod_mac: None,
            })?;
            eprintln!("{a:#?}");
        }
        Cmd::Detach { container_id } => {
            if !dp.detach_pod(&container_id, "eth0")? {
                return Err(anyhow!("nothing attached for {container_id}"));
            }
        }
        Cmd::Show => {
            for p in dp.pods()? {
                eprintln!(
                    "slot {} {}/{} {} {}",
                    p.slot,
                    p.namespace(),
                    p.name(),
                    p.addresses(),
                    p.host_ifname()
                );
                let names = dp.class_names()?;
                for d in Direction::ALL {
                    for c in (0..aliasnet_ebpf::abi::NR_CLASSES).map(Class::from_index) {
                        let v = p.counters.get(d, c);
                        if v.packets == 0 && matches!(c, Class::Named(_)) {
                            continue;
                        }
                        eprintln!(
                            "  {:7} {:8} packets {:>10} bytes {:>14}",
                            d.name(),
                            aliasnet_ebpf::Datapath::class_label(&names, c),
                            v.packets,
                            v.bytes
                        );
                    }
                }
                eprintln!("  {:?}", dp.shaping_stats(&p)?);
            }
        }
    }
    Ok(())
}
