//! The allocator's tests: each behaviour of a pool once per family ([`per_family`]), then what
//! takes both families at once.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aliasnet_ipam_proto::{AttachmentKey, Family, Lease, PodRef};

use super::*;

/// Tests `NAME::ipv4` and `NAME::ipv6` for each `fn NAME(family: Family)`.
macro_rules! per_family {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn ipv4() {
                super::$name(aliasnet_ipam_proto::Family::Ipv4)
            }

            #[test]
            fn ipv6() {
                super::$name(aliasnet_ipam_proto::Family::Ipv6)
            }
        }
    )+};
}

mod dual_stack;
mod free_set;
mod lifecycle;

/// The other family.
fn other(family: Family) -> Family {
    match family {
        Family::Ipv4 => Family::Ipv6,
        Family::Ipv6 => Family::Ipv4,
    }
}

/// Address `i` of `family`'s test block: 10.0.0.0 + i, or fd00:240:: + i.
fn addr(family: Family, i: u32) -> IpAddr {
    match family {
        Family::Ipv4 => Ipv4Addr::from(0x0a00_0000 + i).into(),
        Family::Ipv6 => Ipv6Addr::from(0xfd00_0240_u128 << 96 | u128::from(i)).into(),
    }
}

/// The first `n` addresses of `family`'s test block as a range: "10.0.0.0-10.0.0.3".
fn range(family: Family, n: u32) -> String {
    format!("{}-{}", addr(family, 0), addr(family, n - 1))
}

/// A config with `extra` keys and the `[[pool]]` tables of `pools`.
fn config_of(extra: &str, pools: &str) -> Config {
    Config::parse(&format!("{extra}\n{pools}"), Path::new("/test.toml")).unwrap()
}

/// A config with one static pool "p" of `pool_body`.
fn config(pool_body: &str, extra: &str) -> Config {
    config_of(
        extra,
        &format!("[[pool]]\nname=\"p\"\nsource=\"static\"\n{pool_body}\n"),
    )
}

fn key(c: &str) -> AttachmentKey {
    AttachmentKey::new("net", c, "eth0")
}

/// An Allocate of every family a pool serves (or `families`), without a pool or a veth.
fn request<'a>(
    key: &'a AttachmentKey,
    pod: &'a PodRef,
    families: Option<&'a [Family]>,
) -> AllocRequest<'a> {
    AllocRequest {
        key,
        pod,
        pool: None,
        host_veth: None,
        families,
    }
}

/// Allocate for `c` and commit; the leases (IPv4 first).
fn alloc(
    st: &mut State,
    c: &str,
    families: Option<&[Family]>,
    now: u64,
) -> Result<Vec<Lease>, Refusal> {
    let (k, pod) = (key(c), PodRef::default());
    match st.begin_allocate(request(&k, &pod, families), now)? {
        AllocStep::Fresh { leases, records } => {
            assert_eq!(records.len(), leases.len());
            for r in &records {
                st.commit(r);
            }
            Ok(leases)
        }
        AllocStep::Existing(l) => Ok(l),
        AllocStep::Wait(w) => panic!("wait: {w}"),
    }
}

/// [`alloc`] on a single-family node: its one lease.
fn alloc_one(st: &mut State, c: &str, now: u64) -> Result<Lease, Refusal> {
    let mut leases = alloc(st, c, None, now)?;
    assert_eq!(leases.len(), 1, "{leases:?}");
    Ok(leases.remove(0))
}

/// Release `c` and commit: the address the release names and how many leases went.
fn release(st: &mut State, c: &str, now: u64) -> Option<(IpAddr, usize)> {
    match st.begin_release(&key(c), None, None, now).unwrap() {
        ReleaseStep::Fresh {
            records, address, ..
        } => {
            for r in &records {
                st.commit(r);
            }
            Some((address, records.len()))
        }
        ReleaseStep::NotFound { .. } => None,
        ReleaseStep::Wait(w) => panic!("wait: {w}"),
    }
}

fn free(st: &mut State, pool: &str) -> u64 {
    st.stats(0)
        .into_iter()
        .find(|p| p.name == pool)
        .unwrap()
        .free
}
