//! Named-class prefixes that put no address into their class: equal to a prefix of another
//! list that wins (a blocked one), or covered entirely by more specific prefixes of other
//! lists. Such a prefix is valid policy, but the class counts and limits nothing there, which
//! is rarely what the operator meant. Pure functions over the classifier's view, for
//! `aliasnet-shaperd --check` (the policy file) and `aliasnetctl doctor` (the pinned maps).

use std::{collections::BTreeMap, fmt, net::IpAddr, ops::Bound};

use ipnet::IpNet;

use crate::{abi, policy::Dest, Datapath};

/// A class prefix that decides no address for its class, or a class with no prefix at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowedPrefix {
    pub class: String,
    /// `None`: the class has no prefix in the classifier (each one is also blocked, or it
    /// lists none).
    pub prefix: Option<IpNet>,
    /// The prefixes that take its addresses: the one equal to it, or the most general of the
    /// more specific ones of other lists, in address order.
    pub by: Vec<(IpNet, Dest)>,
    /// No prefix of the class decides any address: the class counts and limits nothing.
    pub whole_class: bool,
}

fn dest_name(d: &Dest) -> String {
    match d {
        Dest::Internal => "internal".to_owned(),
        Dest::Blocked => "blocked".to_owned(),
        Dest::Named(n) => format!("class {n}"),
    }
}

impl fmt::Display for ShadowedPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.prefix, self.by.as_slice()) {
            (None, _) => write!(
                f,
                "class {} has no prefix in the classifier: each of its cidrs is also blocked, or it lists none",
                self.class
            )?,
            (Some(p), [(q, d)]) if q == p => write!(
                f,
                "{p} of class {} is also {}: that list wins, so no address of it is in the class",
                self.class,
                dest_name(d)
            )?,
            (Some(p), by) => {
                let by: Vec<String> = by
                    .iter()
                    .map(|(q, d)| format!("{q} {}", dest_name(d)))
                    .collect();
                write!(
                    f,
                    "{p} of class {} is covered entirely by more specific prefixes of other lists ({}): no address of it is in the class",
                    self.class,
                    by.join(", ")
                )?;
            }
        }
        if self.whole_class && self.prefix.is_some() {
            write!(f, "; class {} counts and limits nothing", self.class)?;
        }
        Ok(())
    }
}

/// The classifier's prefixes as [`Datapath::active_prefixes`] returns them, with where they
/// put an address; a named class by its name in `names` ([`Datapath::class_names`]).
pub fn view_of_active(
    active: &[(IpAddr, u8, u32)],
    names: &[Option<String>],
) -> Vec<(IpNet, Dest)> {
    active
        .iter()
        .filter_map(|&(addr, len, class)| {
            let net = IpNet::new(addr, len).ok()?;
            let dest = match class {
                abi::CLASS_INTERNAL => Dest::Internal,
                abi::CLASS_BLOCKED => Dest::Blocked,
                c if c >= abi::CLASS_NAMED && (c as usize) < abi::NR_CLASSES => Dest::Named(
                    Datapath::class_label(names, abi::Class::from_index(c as usize)),
                ),
                // Internet and "other" are what no prefix says.
                _ => return None,
            };
            Some((net, dest))
        })
        .collect()
}

/// Each class of `classes` with its prefixes in `view`.
pub fn classes_in_view(
    view: &[(IpNet, Dest)],
    classes: impl IntoIterator<Item = String>,
) -> Vec<(String, Vec<IpNet>)> {
    classes
        .into_iter()
        .map(|c| {
            let mine = view
                .iter()
                .filter(|(_, d)| matches!(d, Dest::Named(n) if *n == c))
                .map(|(p, _)| *p)
                .collect();
            (c, mine)
        })
        .collect()
}

/// The first and last address of `n` as integers of its family.
fn bounds(n: &IpNet) -> (u128, u128) {
    match n {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
    }
}

/// The last prefix of `p`'s family that starts within `p`, as a range bound.
fn last_within(p: &IpNet) -> IpNet {
    match p {
        IpNet::V4(n) => IpNet::new(IpAddr::V4(n.broadcast()), 32).expect("a /32"),
        IpNet::V6(n) => IpNet::new(IpAddr::V6(n.broadcast()), 128).expect("a /128"),
    }
}

/// The most general prefixes strictly inside `p` whose destination is not `class`, if they
/// cover every address of `p`.
fn covering(view: &BTreeMap<IpNet, Dest>, p: &IpNet, class: &str) -> Option<Vec<(IpNet, Dest)>> {
    let (start, end) = bounds(p);
    let mut cursor = start;
    let mut out: Vec<(IpNet, Dest)> = Vec::new();
    // Ordered by address, then length: a prefix comes before the ones inside it.
    let inside = view
        .range((Bound::Included(*p), Bound::Included(last_within(p))))
        .filter(|(q, d)| {
            q.prefix_len() > p.prefix_len() && !matches!(d, Dest::Named(n) if n == class)
        });
    let mut covered_to: Option<u128> = None;
    for (q, d) in inside {
        let (qs, qe) = bounds(q);
        if covered_to.is_some_and(|e| qs <= e) {
            continue; // inside the previous one
        }
        if qs != cursor {
            return None; // a gap before q
        }
        out.push((*q, d.clone()));
        covered_to = Some(qe);
        if qe == end {
            return Some(out);
        }
        cursor = qe + 1;
    }
    None
}

/// The prefixes of `classes` (each class with the prefixes it lists) that decide no address
/// for their class under `view` (every prefix of the classifier with where it puts an address:
/// the most specific one of the address's family wins). A class with no prefix is reported
/// once, with `prefix: None`.
pub fn shadowed_class_prefixes(
    view: &[(IpNet, Dest)],
    classes: &[(String, Vec<IpNet>)],
) -> Vec<ShadowedPrefix> {
    let view: BTreeMap<IpNet, Dest> = view.iter().cloned().collect();
    let mut out = Vec::new();
    for (class, prefixes) in classes {
        if prefixes.is_empty() {
            out.push(ShadowedPrefix {
                class: class.clone(),
                prefix: None,
                by: Vec::new(),
                whole_class: true,
            });
            continue;
        }
        let mut found = Vec::new();
        for p in prefixes {
            let by = match view.get(p) {
                Some(Dest::Named(n)) if n == class => covering(&view, p, class),
                // Another list has this very prefix and wins (blocked over anything).
                Some(d) => Some(vec![(*p, d.clone())]),
                None => None,
            };
            if let Some(by) = by {
                found.push(ShadowedPrefix {
                    class: class.clone(),
                    prefix: Some(*p),
                    by,
                    whole_class: false,
                });
            }
        }
        if found.len() == prefixes.len() {
            for f in &mut found {
                f.whole_class = true;
            }
        }
        out.extend(found);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn named(n: &str) -> Dest {
        Dest::Named(n.to_owned())
    }

    fn classes(view: &[(IpNet, Dest)], names: &[&str]) -> Vec<(String, Vec<IpNet>)> {
        classes_in_view(view, names.iter().map(|n| (*n).to_owned()))
    }

    #[test]
    fn a_class_prefix_covered_by_more_specific_ones_of_other_lists_is_shadowed() {
        let view = vec![
            (net("10.0.0.0/8"), Dest::Internal),
            (net("203.0.113.0/24"), named("mirrors")),
            (net("203.0.113.0/25"), Dest::Internal),
            (net("203.0.113.128/26"), Dest::Blocked),
            (net("203.0.113.192/26"), named("datasets")),
            // Inside a covering prefix: not part of the cover's outline.
            (net("203.0.113.200/29"), Dest::Internal),
            (net("198.51.100.0/24"), named("mirrors")),
        ];
        let got = shadowed_class_prefixes(&view, &classes(&view, &["mirrors", "datasets"]));
        assert_eq!(
            got,
            vec![ShadowedPrefix {
                class: "mirrors".into(),
                prefix: Some(net("203.0.113.0/24")),
                by: vec![
                    (net("203.0.113.0/25"), Dest::Internal),
                    (net("203.0.113.128/26"), Dest::Blocked),
                    (net("203.0.113.192/26"), named("datasets")),
                ],
                whole_class: false,
            }]
        );
        let text = got[0].to_string();
        assert!(text.contains("203.0.113.0/24 of class mirrors"), "{text}");
        assert!(text.contains("203.0.113.128/26 blocked"), "{text}");
    }

    #[test]
    fn partial_cover_and_the_class_own_prefixes_do_not_shadow() {
        let view = vec![
            (net("203.0.113.0/24"), named("mirrors")),
            (net("203.0.113.0/25"), Dest::Internal),
            // A gap at .128/26.
            (net("203.0.113.192/26"), Dest::Blocked),
            (net("198.51.100.0/24"), named("mirrors")),
            // The class's own more specific prefix fills half: still the class's.
            (net("198.51.100.0/25"), named("mirrors")),
            (net("198.51.100.128/25"), Dest::Internal),
            // Other families never cover each other.
            (net("2001:db8::/32"), named("mirrors")),
            (net("0.0.0.0/0"), Dest::Blocked),
        ];
        assert_eq!(
            shadowed_class_prefixes(&view, &classes(&view, &["mirrors"])),
            vec![]
        );
    }

    #[test]
    fn a_prefix_equal_to_a_blocked_one_and_a_class_with_no_prefix_left() {
        // As a policy file lists them: the blocked one took the prefix in the classifier.
        let view = vec![
            (net("203.0.113.0/24"), Dest::Blocked),
            (net("2001:db8::/32"), Dest::Blocked),
            (net("198.51.100.0/24"), named("datasets")),
        ];
        let listed = vec![
            (
                "mirrors".to_owned(),
                vec![net("203.0.113.0/24"), net("2001:db8::/32")],
            ),
            ("datasets".to_owned(), vec![net("198.51.100.0/24")]),
        ];
        let got = shadowed_class_prefixes(&view, &listed);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|s| s.class == "mirrors" && s.whole_class));
        assert_eq!(got[1].by, vec![(net("2001:db8::/32"), Dest::Blocked)]);
        assert!(got[0].to_string().contains("is also blocked"), "{}", got[0]);
        assert!(got[0].to_string().ends_with("counts and limits nothing"));
        // As the pinned maps show it: the class has no prefix left.
        let got = shadowed_class_prefixes(&view, &classes(&view, &["mirrors"]));
        assert_eq!(
            got,
            vec![ShadowedPrefix {
                class: "mirrors".into(),
                prefix: None,
                by: vec![],
                whole_class: true,
            }]
        );
        assert!(got[0].to_string().contains("has no prefix"));
    }

    #[test]
    fn whole_address_spaces_are_handled() {
        // ::/0 and 0.0.0.0/0 as class prefixes, covered by their two halves.
        let view = vec![
            (net("::/0"), named("all6")),
            (net("::/1"), Dest::Internal),
            (net("8000::/1"), Dest::Blocked),
            (net("0.0.0.0/0"), named("all4")),
            (net("0.0.0.0/1"), Dest::Internal),
            (net("128.0.0.0/2"), Dest::Internal),
        ];
        let got = shadowed_class_prefixes(&view, &classes(&view, &["all6", "all4"]));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].prefix, Some(net("::/0")));
        assert!(got[0].whole_class);
    }

    #[test]
    fn the_view_of_the_maps_names_classes_by_index() {
        let names = vec![None, Some("mirrors".to_owned())];
        let active = vec![
            (
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)),
                8,
                abi::CLASS_INTERNAL,
            ),
            (
                IpAddr::V4(Ipv4Addr::new(203, 0, 113, 0)),
                24,
                abi::CLASS_NAMED + 1,
            ),
            (
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0)),
                32,
                abi::CLASS_NAMED,
            ),
            (
                IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
                32,
                abi::CLASS_BLOCKED,
            ),
        ];
        assert_eq!(
            view_of_active(&active, &names),
            vec![
                (net("10.0.0.0/8"), Dest::Internal),
                (net("203.0.113.0/24"), named("mirrors")),
                (net("2001:db8::/32"), named("class0")),
                (net("169.254.169.254/32"), Dest::Blocked),
            ]
        );
    }
}
