//! The lease table: a chunked slab of entries indexed by key and by address.

use std::{collections::BTreeMap, hash::BuildHasher};

use hashbrown::HashTable;

use super::*;

/// Why an insert was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The key already holds a lease of the address's family (its id).
    Key(u32),
    /// The address is already leased (the holder's id).
    Addr(u32),
}

type Hasher = foldhash::fast::FixedState;

/// Entries per slab chunk.
const CHUNK: usize = 4096;

/// Slab storage in fixed chunks: it grows 160 KiB at a time, so a big table never has the
/// up-to-half-empty tail (and the copy) of a doubling `Vec`.
#[derive(Default)]
struct Slab {
    chunks: Vec<Box<[Option<LeaseEntry>]>>,
    len: usize,
}

impl Slab {
    fn get(&self, id: u32) -> &Option<LeaseEntry> {
        let i = id as usize;
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    fn get_mut(&mut self, id: u32) -> &mut Option<LeaseEntry> {
        let i = id as usize;
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    fn push(&mut self, e: LeaseEntry) -> u32 {
        if self.len == self.chunks.len() * CHUNK {
            self.chunks.push(
                (0..CHUNK)
                    .map(|_| None)
                    .collect::<Vec<_>>()
                    .into_boxed_slice(),
            );
        }
        let id = self.len as u32;
        self.len += 1;
        *self.get_mut(id) = Some(e);
        id
    }

    fn iter(&self) -> impl Iterator<Item = (u32, &LeaseEntry)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .take(self.len)
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32, e)))
    }
}

/// All leases: a slab of entries, a hash index by (key, family) and an ordered index by
/// address. A key holds at most one lease per family; both hash alike (the family only
/// decides equality), so a dual-stack key costs one extra comparison.
#[derive(Default)]
pub struct LeaseTable {
    slab: Slab,
    vacant: Vec<u32>,
    index: HashTable<u32>,
    /// IPv4 addresses keyed by their 32 bits: half the node size of a `u128`-keyed tree, so
    /// an IPv4 node's table costs what it did before IPv6 existed.
    by_addr4: BTreeMap<u32, u32>,
    by_addr6: BTreeMap<Addr, u32>,
    hasher: Hasher,
}

impl LeaseTable {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            index: HashTable::with_capacity(n),
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.by_addr4.len() + self.by_addr6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_addr4.is_empty() && self.by_addr6.is_empty()
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The id of the lease of `key` (encoded) in `family`.
    pub fn find(&self, key: &[u8], family: Family) -> Option<u32> {
        let h = self.hash(key);
        self.index
            .find(h, |&id| {
                self.slab
                    .get(id)
                    .as_ref()
                    .is_some_and(|e| e.key() == key && e.family() == family)
            })
            .copied()
    }

    /// The ids of the leases of `key` (encoded), IPv4 first.
    pub fn find_all(&self, key: &[u8]) -> impl Iterator<Item = u32> + '_ {
        let h = self.hash(key);
        let mut ids: [Option<u32>; 2] = [None, None];
        for &id in self.index.iter_hash(h) {
            if let Some(e) = self.slab.get(id).as_ref().filter(|e| e.key() == key) {
                ids[usize::from(e.family() == Family::Ipv6)] = Some(id);
            }
        }
        ids.into_iter().flatten()
    }

    pub fn get(&self, id: u32) -> &LeaseEntry {
        self.slab.get(id).as_ref().expect("live lease id")
    }

    pub fn get_mut(&mut self, id: u32) -> &mut LeaseEntry {
        self.slab.get_mut(id).as_mut().expect("live lease id")
    }

    pub fn by_addr(&self, addr: Addr) -> Option<u32> {
        match u32::try_from(addr) {
            Ok(a) => self.by_addr4.get(&a).copied(),
            Err(_) => self.by_addr6.get(&addr).copied(),
        }
    }

    pub fn insert(&mut self, e: LeaseEntry) -> Result<u32, InsertError> {
        // One hash, one probe of each index (loading 200,000 leases is mostly this).
        let h = self.hash(e.key());
        let family = e.family();
        let (slab, hasher) = (&self.slab, &self.hasher);
        let key_slot = match self.index.entry(
            h,
            |&id| {
                slab.get(id)
                    .as_ref()
                    .is_some_and(|x| x.key() == e.key() && x.family() == family)
            },
            |&i| hasher.hash_one(slab.get(i).as_ref().expect("indexed").key()),
        ) {
            hashbrown::hash_table::Entry::Occupied(o) => return Err(InsertError::Key(*o.get())),
            hashbrown::hash_table::Entry::Vacant(v) => v,
        };
        use std::collections::btree_map::Entry;
        enum Slot<'m> {
            V4(std::collections::btree_map::VacantEntry<'m, u32, u32>),
            V6(std::collections::btree_map::VacantEntry<'m, Addr, u32>),
        }
        let addr_slot = match u32::try_from(e.addr) {
            Ok(a) => match self.by_addr4.entry(a) {
                Entry::Occupied(o) => return Err(InsertError::Addr(*o.get())),
                Entry::Vacant(v) => Slot::V4(v),
            },
            Err(_) => match self.by_addr6.entry(e.addr) {
                Entry::Occupied(o) => return Err(InsertError::Addr(*o.get())),
                Entry::Vacant(v) => Slot::V6(v),
            },
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                *self.slab.get_mut(id) = Some(e);
                id
            }
            None => self.slab.push(e),
        };
        key_slot.insert(id);
        match addr_slot {
            Slot::V4(v) => v.insert(id),
            Slot::V6(v) => v.insert(id),
        };
        Ok(id)
    }

    pub fn remove(&mut self, id: u32) -> LeaseEntry {
        let e = self.slab.get_mut(id).take().expect("live lease id");
        let h = self.hash(e.key());
        if let Ok(o) = self.index.find_entry(h, |&i| i == id) {
            o.remove();
        }
        match u32::try_from(e.addr) {
            Ok(a) => self.by_addr4.remove(&a),
            Err(_) => self.by_addr6.remove(&e.addr),
        };
        self.vacant.push(id);
        e
    }

    /// Every lease, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &LeaseEntry)> {
        self.slab.iter()
    }

    /// (address, id) of leases with an address above `after` (all when `None`), ascending.
    pub fn after_addr(&self, after: Option<Addr>) -> impl Iterator<Item = (Addr, u32)> + '_ {
        use std::ops::Bound::{Excluded, Unbounded};
        // IPv4 first, then IPv6.
        let (v4, v6) = match after.map(|a| (a, u32::try_from(a))) {
            None => ((Unbounded, Unbounded), (Unbounded, Unbounded)),
            Some((_, Ok(a))) => ((Excluded(a), Unbounded), (Unbounded, Unbounded)),
            Some((a, Err(_))) => ((Excluded(u32::MAX), Unbounded), (Excluded(a), Unbounded)),
        };
        self.by_addr4
            .range(v4)
            .map(|(a, i)| (Addr::from(*a), *i))
            .chain(self.by_addr6.range(v6).map(|(a, i)| (*a, *i)))
    }
}
