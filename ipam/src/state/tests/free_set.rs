//! Each family's free set (the bitmap of a static IPv4 pool, the intervals of an IPv6 one)
//! against a plain set of addresses.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::{super::pool::Pool, *};

#[derive(Debug, Clone)]
enum Op {
    TakeNext,
    /// Put back the n-th taken address (modulo).
    Put(usize),
    /// Take a given offset from the block's start, free or not.
    Take(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::TakeNext),
        2 => any::<usize>().prop_map(Op::Put),
        1 => any::<u8>().prop_map(Op::Take),
    ]
}

/// 48 addresses from `family`'s test block + 0x100 in two CIDRs and an address, minus scattered
/// exclusions (and, for IPv6, the second CIDR's subnet-router anycast address).
fn pool(family: Family) -> (Pool, Addr) {
    let a = |i: u32| addr(family, 0x100 + i);
    let c = config(
        &format!(
            "cidrs=[\"{}/{}\", \"{}/{}\"]\nips=[\"{}\"]\nexclude=[\"{}\", \"{}\", \"{}\", \"{}\"]",
            a(0),
            if family == Family::Ipv4 { 28 } else { 124 },
            a(0x20),
            if family == Family::Ipv4 { 29 } else { 125 },
            a(0x2a),
            a(0),
            a(7),
            a(0xf),
            a(0x22),
        ),
        "",
    );
    let base = crate::lease::ip_addr(a(0)).unwrap();
    (Pool::new(c.pools[0].clone()), base)
}

fn free_set_behaves_like_a_set(family: Family, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (mut pool, base) = pool(family);
    let mut free: BTreeSet<Addr> = pool
        .spec
        .address_ranges()
        .flat_map(|(first, last)| first..=last)
        .collect();
    let mut taken: Vec<Addr> = Vec::new();
    let mut next = base;
    for op in ops {
        match op {
            Op::TakeNext => {
                let want = free
                    .range(next..)
                    .next()
                    .or_else(|| free.iter().next())
                    .copied();
                let got = pool.free.take_next();
                prop_assert_eq!(got, want);
                if let Some(a) = got {
                    free.remove(&a);
                    taken.push(a);
                    next = a + 1;
                }
            }
            Op::Put(n) if !taken.is_empty() => {
                let a = taken.swap_remove(n % taken.len());
                pool.free.put(a);
                free.insert(a);
            }
            Op::Put(_) => {}
            Op::Take(off) => {
                let a = base + Addr::from(off % 48);
                let was = free.remove(&a);
                prop_assert_eq!(pool.free.take(a), was);
                if was {
                    taken.push(a);
                }
            }
        }
        pool.check();
        prop_assert_eq!(pool.free.count(), free.len() as u64);
        for a in base..base + 48 {
            prop_assert_eq!(pool.free.is_free(a), free.contains(&a), "{}", a - base);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn bitmap_behaves_like_a_set(ops in proptest::collection::vec(op(), 1..200)) {
        free_set_behaves_like_a_set(Family::Ipv4, ops)?;
    }

    #[test]
    fn intervals_behave_like_a_set(ops in proptest::collection::vec(op(), 1..200)) {
        free_set_behaves_like_a_set(Family::Ipv6, ops)?;
    }
}
