//! Max-min fair sharing of one budget by a water level.
//!
//! With demands `d_i` and budget `B`, the level `L` is the largest value with
//! `Σ min(d_i, L) ≤ B`. Each node's share is `min(d_i, L)`: nodes that want less than the
//! level get what they want, the rest get the level, and no node could get more without
//! taking from one that has less. When everything fits (`Σ d_i ≤ B`) the level is `B` itself,
//! so the one published number serves both cases.

/// The result of one computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Share of a node = min(its demand, level); at most the budget.
    pub level: u64,
    /// Σ demands (saturating).
    pub total_demand: u64,
    /// Σ min(demand, level); never above the budget.
    pub total_share: u64,
    /// How many demands were counted.
    pub nodes: u32,
}

/// Computes the water level of `budget` over `demands` (bit/s). Sorts `demands` in place;
/// O(n log n). The level is rounded down, so `total_share ≤ budget` holds exactly.
pub fn allocate(budget: u64, demands: &mut [u64]) -> Allocation {
    demands.sort_unstable();
    let total_demand = demands.iter().fold(0u64, |a, d| a.saturating_add(*d));
    let nodes = u32::try_from(demands.len()).unwrap_or(u32::MAX);
    let mut remaining = budget;
    let mut level = budget;
    for (i, &d) in demands.iter().enumerate() {
        let left = (demands.len() - i) as u64;
        // This demand and every larger one get the even split of what remains, unless this
        // one wants less than that.
        if u128::from(d) * u128::from(left) > u128::from(remaining) {
            level = remaining / left;
            break;
        }
        remaining -= d;
    }
    let total_share = demands
        .iter()
        .fold(0u64, |a, d| a.saturating_add((*d).min(level)));
    Allocation {
        level,
        total_demand,
        total_share,
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        // Everything fits: the level is the budget, shares are the demands.
        let a = allocate(120, &mut [10, 20, 30]);
        assert_eq!((a.level, a.total_share, a.total_demand), (120, 60, 60));
        // Six equal hungry nodes split evenly.
        let a = allocate(120, &mut [1000; 6]);
        assert_eq!((a.level, a.total_share), (20, 120));
        // A small demand keeps its demand; the others share the rest.
        let a = allocate(120, &mut [10, 1000, 1000, 1000, 1000, 1000]);
        assert_eq!((a.level, a.total_share), (22, 120));
        // Nothing to share.
        assert_eq!(allocate(120, &mut []).total_share, 0);
        assert_eq!(allocate(0, &mut [5, 5]).level, 0);
        // No overflow near u64::MAX.
        let a = allocate(u64::MAX, &mut [u64::MAX, u64::MAX, 1]);
        assert_eq!(a.total_demand, u64::MAX);
        assert_eq!(a.level, (u64::MAX - 1) / 2);
    }

    proptest! {
        /// Σ shares ≤ budget; every node below the level is fully served; when not
        /// everything fits, no more than one unit per node is left unshared (rounding), and
        /// raising the level by one would exceed the budget.
        #[test]
        fn level_is_max_min_fair(budget in 0u64..1_000_000_000, mut d in prop::collection::vec(0u64..500_000_000, 0..200)) {
            let a = allocate(budget, &mut d);
            let sum = |l: u64| d.iter().map(|x| u128::from((*x).min(l))).sum::<u128>();
            prop_assert!(u128::from(a.total_share) <= u128::from(budget));
            prop_assert_eq!(u128::from(a.total_share), sum(a.level));
            prop_assert!(a.level <= budget);
            if u128::from(a.total_demand) > u128::from(budget) {
                prop_assert!(sum(a.level + 1) > u128::from(budget));
                prop_assert!(u128::from(budget) - sum(a.level) <= d.len() as u128);
            } else {
                prop_assert_eq!(a.total_share, a.total_demand);
            }
        }
    }
}
