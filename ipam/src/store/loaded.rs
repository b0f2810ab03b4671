//! What loading rebuilds from the snapshot and logs, record by record.

use std::{collections::HashMap, net::IpAddr};

use aliasnet_ipam_proto::Family;
use record::{Record, RecordError};

use crate::lease::{
    addr_family, addr_ip, display_key, Addr, InsertError, LeaseEntry, LeaseState, LeaseTable,
};

use super::*;

/// A record that cannot be applied to what came before it in the files.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("too many pool names (at most {})", u16::MAX as usize + 1)]
    TooManyPoolNames,
    #[error("allocation for {key} which already holds an {family} lease")]
    KeyHeld { key: String, family: Family },
    #[error("allocation of {ip} which another key already holds")]
    AddressHeld { ip: IpAddr },
    #[error("release of {key} ({ip}) which holds no such lease")]
    NoSuchLease { key: String, ip: IpAddr },
    #[error("cooling entry for {ip} listed twice or also leased")]
    CoolingTwice { ip: IpAddr },
    /// `record` is the record's debug form.
    #[error("record {record} does not belong in this file")]
    Misplaced { record: String },
}

/// State rebuilt from disk, before it is laid over the configured pools.
#[derive(Default)]
pub struct Loaded {
    /// Pool names as recorded (leases refer to them by index).
    pub names: Vec<Box<str>>,
    name_idx: HashMap<Box<str>, u16>,
    pub leases: LeaseTable,
    /// Released addresses: address -> (release time, link still to tear down).
    pub cooling: HashMap<Addr, (u64, Option<Box<str>>)>,
    /// Log records replayed (for the start-up log line).
    pub replayed: u64,
    /// Bytes of a torn tail that were zeroed out.
    pub truncated: u64,
    /// The latest allocation or release time recorded (the daemon's clock never reads
    /// earlier after a restart).
    pub newest_ms: u64,
}

impl Loaded {
    fn intern(&mut self, name: &str) -> Result<u16, LoadError> {
        // Nearly every record names the same pool as the one before.
        if let Some(last) = self.names.len().checked_sub(1) {
            if *self.names[last] == *name {
                return Ok(last as u16);
            }
        }
        if let Some(i) = self.name_idx.get(name) {
            return Ok(*i);
        }
        let i = u16::try_from(self.names.len()).map_err(|_| LoadError::TooManyPoolNames)?;
        self.names.push(name.into());
        self.name_idx.insert(name.into(), i);
        Ok(i)
    }

    fn apply_alloc(
        &mut self,
        pool: &str,
        data: Box<[u8]>,
        key_len: u16,
        addr: Addr,
        allocated_at_ms: u64,
    ) -> Result<(), LoadError> {
        let pool_name = self.intern(pool)?;
        self.newest_ms = self.newest_ms.max(allocated_at_ms);
        let entry = LeaseEntry {
            data,
            allocated_at_ms,
            addr,
            key_len,
            pool_name,
            state: LeaseState::Committed,
            seen: true,
        };
        match self.leases.insert(entry) {
            Ok(_) => {}
            Err(InsertError::Key(id)) => {
                return Err(LoadError::KeyHeld {
                    key: display_key(self.leases.get(id).key()),
                    family: addr_family(addr),
                })
            }
            Err(InsertError::Addr(_)) => return Err(LoadError::AddressHeld { ip: addr_ip(addr) }),
        }
        if !self.cooling.is_empty() {
            self.cooling.remove(&addr);
        }
        Ok(())
    }

    /// Apply one framed payload (version-2 allocations without an intermediate copy).
    pub(super) fn apply_payload(
        &mut self,
        payload: &[u8],
        in_snapshot: bool,
    ) -> Result<Applied, LoadError> {
        match record::view_alloc(payload) {
            Some(Ok(a)) => {
                self.apply_alloc(a.pool, a.data.into(), a.key_len, a.addr, a.allocated_at_ms)?;
                Ok(Applied::Lease)
            }
            Some(Err(e)) => Err(e.into()),
            None => match record::decode_payload(payload)? {
                Record::End { leases, cooling } if in_snapshot => {
                    Ok(Applied::End { leases, cooling })
                }
                rec => {
                    let kind = match rec {
                        Record::Alloc(_) => Applied::Lease,
                        Record::Cooling(_) => Applied::Cooling,
                        _ => Applied::Change,
                    };
                    self.apply(rec, in_snapshot)?;
                    Ok(kind)
                }
            },
        }
    }

    /// Apply one record, checking it is consistent with what came before.
    fn apply(&mut self, rec: Record, in_snapshot: bool) -> Result<(), LoadError> {
        match rec {
            Record::Alloc(a) => {
                self.apply_alloc(&a.pool, a.data, a.key_len, a.addr, a.allocated_at_ms)?;
            }
            Record::Release(r) if !in_snapshot => {
                match self.leases.find(&r.key, addr_family(r.addr)) {
                    Some(id) if self.leases.get(id).addr == r.addr => {
                        self.leases.remove(id);
                    }
                    _ => {
                        return Err(LoadError::NoSuchLease {
                            key: display_key(&r.key),
                            ip: addr_ip(r.addr),
                        })
                    }
                }
                self.newest_ms = self.newest_ms.max(r.released_at_ms);
                self.cooling.insert(r.addr, (r.released_at_ms, r.teardown));
            }
            Record::Cooling(c) if in_snapshot => {
                self.newest_ms = self.newest_ms.max(c.released_at_ms);
                if self.leases.by_addr(c.addr).is_some()
                    || self
                        .cooling
                        .insert(c.addr, (c.released_at_ms, c.teardown))
                        .is_some()
                {
                    return Err(LoadError::CoolingTwice {
                        ip: addr_ip(c.addr),
                    });
                }
            }
            other => {
                return Err(LoadError::Misplaced {
                    record: format!("{other:?}"),
                })
            }
        }
        Ok(())
    }
}

/// What a loaded record was.
pub(super) enum Applied {
    Lease,
    Cooling,
    Change,
    End { leases: u64, cooling: u64 },
}
