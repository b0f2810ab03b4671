//! Destination classes as the commands show them: the named classes in force, limits by
//! class, and counters by class.

use std::collections::BTreeMap;

use aliasnet_ebpf::{
    abi::{self, Class, Counter, Direction, PodCounters},
    Datapath,
};
use serde::Serialize;

use crate::output::{rate, si};

/// The named classes in force, by index, with their names ([`Datapath::class_names`]).
pub fn named(names: &[Option<String>]) -> Vec<(Class, String)> {
    names
        .iter()
        .enumerate()
        .filter_map(|(k, n)| Some((Class::Named(u8::try_from(k).ok()?), n.clone()?)))
        .collect()
}

/// One level's limits in bit/s by direction, each by class: `all` (every packet of the
/// direction), `internet` (the named classes included) or a class's name. Only limits that
/// are set are present.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClassLimits {
    pub ingress: BTreeMap<String, u64>,
    pub egress: BTreeMap<String, u64>,
}

impl ClassLimits {
    pub fn of(names: &[Option<String>], r: &abi::Rates) -> Self {
        let mut out = Self::default();
        for dir in Direction::ALL {
            for k in 0..abi::NR_KINDS {
                if let (Some(v), Some(label)) = (r.get(dir, k), Datapath::kind_label(names, k)) {
                    out.dir_mut(dir).insert(label, v);
                }
            }
        }
        out
    }

    fn dir_mut(&mut self, dir: Direction) -> &mut BTreeMap<String, u64> {
        match dir {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }

    pub fn get(&self, dir: Direction, class: &str) -> Option<u64> {
        match dir {
            Direction::Ingress => self.ingress.get(class).copied(),
            Direction::Egress => self.egress.get(class).copied(),
        }
    }

    /// `in: internet 1.0Gbit/s, mirrors 500.0Mbit/s; out: internet 100.0Mbit/s`, or `-`.
    pub fn human(&self) -> String {
        let part = |name: &str, m: &BTreeMap<String, u64>| {
            (!m.is_empty()).then(|| {
                let v: Vec<String> = m
                    .iter()
                    .map(|(c, r)| format!("{c} {}", rate(Some(*r))))
                    .collect();
                format!("{name}: {}", v.join(", "))
            })
        };
        let parts: Vec<String> = [part("in", &self.ingress), part("out", &self.egress)]
            .into_iter()
            .flatten()
            .collect();
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    pub packets: u64,
    pub bytes: u64,
}

impl From<Counter> for Count {
    fn from(c: Counter) -> Self {
        Self {
            packets: c.packets,
            bytes: c.bytes,
        }
    }
}

/// Counters of one direction by class. `internet` is all internet traffic, the named
/// classes included (what internet limits count); `classes` has each named class's part.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ByClass {
    pub internal: Count,
    pub internet: Count,
    pub blocked: Count,
    pub other: Count,
    pub classes: BTreeMap<String, Count>,
}

impl ByClass {
    pub fn of(c: &PodCounters, dir: Direction, named: &[(Class, String)]) -> Self {
        Self {
            internal: c.get(dir, Class::Internal).into(),
            internet: c.internet(dir).into(),
            blocked: c.get(dir, Class::Blocked).into(),
            other: c.get(dir, Class::Other).into(),
            classes: named
                .iter()
                .map(|(cl, name)| (name.clone(), c.get(dir, *cl).into()))
                .collect(),
        }
    }
}

/// Bytes for a table cell: `12.3kB`.
pub fn bytes(c: Count) -> String {
    format!("{}B", si(c.bytes as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<Option<String>> {
        let mut n = vec![None; abi::MAX_NAMED];
        n[1] = Some("mirrors".to_owned());
        n
    }

    #[test]
    fn limits_by_class_name_every_kind() {
        let mut r = abi::Rates::default();
        r.set(Direction::Ingress, abi::KIND_TOTAL, Some(1_000_000_000));
        r.set(Direction::Ingress, abi::KIND_INTERNET, Some(100_000_000));
        r.set(Direction::Ingress, abi::KIND_NAMED + 1, Some(20_000_000));
        // An index without a name now is not shown.
        r.set(Direction::Egress, abi::KIND_NAMED + 5, Some(1_000_000));
        let l = ClassLimits::of(&names(), &r);
        assert_eq!(l.get(Direction::Ingress, "all"), Some(1_000_000_000));
        assert_eq!(l.get(Direction::Ingress, "mirrors"), Some(20_000_000));
        assert!(l.egress.is_empty());
        assert_eq!(
            l.human(),
            "in: all 1.0Gbit/s, internet 100.0Mbit/s, mirrors 20.0Mbit/s"
        );
        assert_eq!(ClassLimits::default().human(), "-");
    }

    #[test]
    fn internet_counts_include_the_named_classes() {
        let mut c = PodCounters::default();
        c.dir[abi::DIR_INGRESS][Class::Internet.index()] = Counter {
            packets: 1,
            bytes: 100,
        };
        c.dir[abi::DIR_INGRESS][Class::Named(1).index()] = Counter {
            packets: 2,
            bytes: 200,
        };
        let named = named(&names());
        assert_eq!(named, vec![(Class::Named(1), "mirrors".to_owned())]);
        let b = ByClass::of(&c, Direction::Ingress, &named);
        assert_eq!(
            b.internet,
            Count {
                packets: 3,
                bytes: 300
            }
        );
        assert_eq!(
            b.classes["mirrors"],
            Count {
                packets: 2,
                bytes: 200
            }
        );
    }
}
