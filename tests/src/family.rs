//! The address family a test runs in: one test body written once and run for IPv4 and IPv6,
//! with what differs between them (the fabric's addresses, header sizes, how tools name the
//! family) asked of a [`Family`].

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr},
};

use crate::fabric::{
    pod_prefix6, pod_range4, router_ip6, uplink_ip6, Node, Pod, Stack, INTERNET_IP, INTERNET_IP2,
    INTERNET_IP6, INTERNET_IP6_2,
};

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of `addr`.
    pub fn of(addr: IpAddr) -> Self {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    /// `ip`'s family switch: `-4` or `-6`.
    pub fn ip_flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }

    /// The nodes' pools serving this family alone.
    pub fn stack(self) -> Stack {
        match self {
            Family::V4 => Stack::Ipv4,
            Family::V6 => Stack::Ipv6,
        }
    }

    /// The prefix length of a pod's own address (`/32`, `/128`).
    pub fn host_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The IP and ICMP headers of an echo request: an echo of `MTU - this` bytes of data
    /// fills the MTU.
    pub fn icmp_overhead(self) -> u32 {
        match self {
            Family::V4 => 20 + 8,
            Family::V6 => 40 + 8,
        }
    }

    /// The fabric's internet host: one address on its link, one behind it.
    pub fn internet(self) -> [IpAddr; 2] {
        match self {
            Family::V4 => [INTERNET_IP.into(), INTERNET_IP2.into()],
            Family::V6 => [INTERNET_IP6.into(), INTERNET_IP6_2.into()],
        }
    }

    /// Node `i`'s uplink address on the fabric.
    pub fn uplink_ip(self, i: usize) -> IpAddr {
        match self {
            Family::V4 => Ipv4Addr::new(10, 100, i as u8, 2).into(),
            Family::V6 => uplink_ip6(i).into(),
        }
    }

    /// The router's address on node `i`'s link.
    pub fn router_ip(self, i: usize) -> IpAddr {
        match self {
            Family::V4 => Ipv4Addr::new(10, 100, i as u8, 1).into(),
            Family::V6 => router_ip6(i).into(),
        }
    }

    /// Node `i`'s pod range, which the fabric routes to the node.
    pub fn pod_range(self, i: usize) -> String {
        match self {
            Family::V4 => pod_range4(i),
            Family::V6 => pod_prefix6(i),
        }
    }

    /// An address inside node `i`'s pod range.
    pub fn pod_range_probe(self, i: usize) -> String {
        match self {
            Family::V4 => format!("10.240.{i}.5"),
            Family::V6 => format!("fd00:240:{i:x}::5"),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

impl Stack {
    /// The families the pools serve, IPv4 first (as results list them).
    pub fn families(self) -> Vec<Family> {
        Family::ALL
            .into_iter()
            .filter(|f| match f {
                Family::V4 => self.has_ipv4(),
                Family::V6 => self.has_ipv6(),
            })
            .collect()
    }
}

impl Pod {
    /// The pod's address of family `f`; panics when it has none.
    #[track_caller]
    pub fn addr(&self, f: Family) -> IpAddr {
        match f {
            Family::V4 => {
                assert!(
                    !self.ip.is_unspecified(),
                    "pod {} has no IPv4 address: {}",
                    self.name,
                    self.result
                );
                self.ip.into()
            }
            Family::V6 => self.v6().into(),
        }
    }

    /// The pod's addresses, IPv4 first.
    pub fn addrs(&self) -> Vec<IpAddr> {
        let mut a = Vec::new();
        if !self.ip.is_unspecified() {
            a.push(self.ip.into());
        }
        a.extend(self.ip6.map(IpAddr::from));
        a
    }
}

impl Node {
    /// This node's uplink address of family `f`.
    pub fn uplink(&self, f: Family) -> IpAddr {
        match f {
            Family::V4 => self.uplink_ip.into(),
            Family::V6 => self.uplink_ip6.into(),
        }
    }
}

/// One `#[test]` per family (or stack) for a test body written once: each named test needs
/// root and calls `body` with its argument, so a failure names the family.
///
/// ```ignore
/// per_family!(verbs: cni_verbs_in_an_ipv4_config => Stack::Ipv4, cni_verbs_in_a_dual_stack_config => Stack::Dual);
/// ```
#[macro_export]
macro_rules! per_family {
    ($body:ident: $($name:ident => $arg:expr),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::require_root();
                $body($arg);
            }
        )+
    };
}
