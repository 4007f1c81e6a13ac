//! Tests of placement: determinism, spread over nodes and failure domains,
//! balance within the stated tolerance, minimal movement, versions and
//! diffs.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// `nodes` members with ids `1..=nodes`, each in its own domain.
fn flat(nodes: u64) -> Vec<Member> {
    (1..=nodes).map(|id| Member { id, failure_domain: format!("d{id}") }).collect()
}

/// Members from `(id, domain)` pairs.
fn members(pairs: &[(NodeId, &str)]) -> Vec<Member> {
    pairs.iter().map(|&(id, domain)| Member { id, failure_domain: domain.to_owned() }).collect()
}

/// `count` groups over a few queues.
fn groups(count: u32) -> Vec<GroupId> {
    (0..count).map(|n| GroupId::new(1 + n % 7, n / 7)).collect()
}

/// A seeded sequence of well-mixed numbers (SplitMix64).
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
}

/// (min, max) of `counts` over `nodes` as a share of `mean` (a node absent
/// from `counts` counts 0).
fn spread(counts: &BTreeMap<NodeId, usize>, nodes: &[NodeId], mean: f64) -> (f64, f64) {
    let values: Vec<f64> =
        nodes.iter().map(|node| *counts.get(node).unwrap_or(&0) as f64 / mean).collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// Every group's replicas are distinct nodes of `members`; spread over
/// distinct domains when there are enough, else as evenly as the domains'
/// sizes allow.
fn assert_spread(table: &PlacementTable, members: &[Member], factor: usize) {
    let domain_of: BTreeMap<NodeId, &str> =
        members.iter().map(|member| (member.id, member.failure_domain.as_str())).collect();
    let mut domain_sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for member in members {
        *domain_sizes.entry(member.failure_domain.as_str()).or_insert(0) += 1;
    }
    for (group, replicas) in table.iter() {
        assert_eq!(replicas.len(), factor, "{group:?}");
        let distinct: BTreeSet<NodeId> = replicas.iter().copied().collect();
        assert_eq!(distinct.len(), factor, "{group:?}: {replicas:?}");
        let mut uses: BTreeMap<&str, usize> = domain_sizes.keys().map(|d| (*d, 0)).collect();
        for node in replicas {
            *uses.get_mut(domain_of[node]).unwrap() += 1;
        }
        if domain_sizes.len() >= factor {
            assert!(uses.values().all(|&n| n <= 1), "{group:?}: {uses:?}");
        }
        for (a, &used_a) in &uses {
            for (b, &used_b) in &uses {
                // b is short of a by two or more only when b has no node left.
                if used_a > used_b + 1 {
                    assert_eq!(used_b, domain_sizes[b], "{group:?}: {a} {uses:?}");
                }
            }
        }
    }
}

// Goal: the hashes and the walk are pinned, so a later release computes the
// same placement (a change here moves every group of a running cluster);
// method: known answers for a few groups on five nodes.
#[test]
fn placement_is_pinned_by_known_answers() {
    let placer = Placer::new(&flat(5), 3).unwrap();
    let answers: Vec<Vec<NodeId>> =
        [(1, 0), (1, 1), (2, 0), (7, 9)].map(|(q, p)| placer.place(GroupId::new(q, p))).into();
    assert_eq!(answers, KNOWN_ANSWERS);
}

const KNOWN_ANSWERS: [[NodeId; 3]; 4] = [[1, 3, 5], [2, 5, 4], [3, 2, 4], [5, 3, 4]];

// Goal: the table is a function of the set of members, not their order;
// method: the same members forward, reversed and rotated.
#[test]
fn placement_ignores_the_order_of_members() {
    let forward = members(&[(4, "a"), (9, "b"), (2, "a"), (17, "c"), (5, "b"), (11, "c")]);
    let mut reversed = forward.clone();
    reversed.reverse();
    let mut rotated = forward.clone();
    rotated.rotate_left(2);
    let groups = groups(500);
    let table = PlacementTable::place(&forward, 3, &groups).unwrap();
    assert_eq!(table, PlacementTable::place(&reversed, 3, &groups).unwrap());
    assert_eq!(table, PlacementTable::place(&rotated, 3, &groups).unwrap());
    assert_eq!(table.len(), 500);
    assert_spread(&table, &forward, 3);
}

// Goal: the stated tolerance holds at 5 nodes × 1,000 groups, factor 3:
// replicas per node within ±10 % of the mean, preferred leaders within
// ±25 %; method: ids 1..=5, then 20 seeded sets of random ids.
#[test]
fn replicas_and_leaders_are_balanced_within_the_tolerance() {
    let groups = groups(1000);
    let mut id_sets: Vec<Vec<Member>> = vec![flat(5)];
    let mut rng = Seeded(7);
    for _ in 0..20 {
        let ids: BTreeSet<NodeId> =
            std::iter::from_fn(|| Some(rng.next() % 1_000_000 + 1)).take(5).collect();
        id_sets
            .push(ids.iter().map(|&id| Member { id, failure_domain: format!("d{id}") }).collect());
    }
    let (mut replicas_worst, mut leaders_worst) = ((1.0f64, 1.0f64), (1.0f64, 1.0f64));
    for set in id_sets.iter().filter(|set| set.len() == 5) {
        let table = PlacementTable::place(set, 3, &groups).unwrap();
        let ids: Vec<NodeId> = set.iter().map(|member| member.id).collect();
        let (min, max) = spread(&table.replicas_per_node(), &ids, 600.0);
        assert!(min >= 0.9 && max <= 1.1, "replicas {ids:?}: {min:.3}..{max:.3}");
        replicas_worst = (replicas_worst.0.min(min), replicas_worst.1.max(max));
        let (min, max) = spread(&table.leaders_per_node(), &ids, 200.0);
        assert!(min >= 0.75 && max <= 1.25, "leaders {ids:?}: {min:.3}..{max:.3}");
        leaders_worst = (leaders_worst.0.min(min), leaders_worst.1.max(max));
    }
    eprintln!(
        "5 nodes x 1000 groups, r=3: replicas/mean {:.3}..{:.3}, leaders/mean {:.3}..{:.3}",
        replicas_worst.0, replicas_worst.1, leaders_worst.0, leaders_worst.1
    );
}

// Goal: equal domains balance like single nodes, one replica per domain;
// method: 6 nodes in 3 racks of 2, 3,000 groups, factor 3.
#[test]
fn equal_domains_balance_and_each_holds_one_replica() {
    let set = members(&[(1, "r1"), (2, "r1"), (3, "r2"), (4, "r2"), (5, "r3"), (6, "r3")]);
    let groups = groups(3000);
    let table = PlacementTable::place(&set, 3, &groups).unwrap();
    assert_spread(&table, &set, 3);
    let ids: Vec<NodeId> = (1..=6).collect();
    let (min, max) = spread(&table.replicas_per_node(), &ids, 1500.0);
    assert!(min >= 0.9 && max <= 1.1, "replicas: {min:.3}..{max:.3}");
    let (min, max) = spread(&table.leaders_per_node(), &ids, 500.0);
    assert!(min >= 0.75 && max <= 1.25, "leaders: {min:.3}..{max:.3}");
    eprintln!("6 nodes in 3 racks x 3000 groups: leaders/mean {min:.3}..{max:.3}");
}

// Goal: fewer domains than replicas spread as evenly as the domains allow;
// method: 5 nodes in 2 domains (4 + 1) at factor 5 and 3, 3 nodes in one.
#[test]
fn too_few_domains_spread_as_evenly_as_they_can() {
    let set = members(&[(1, "a"), (2, "a"), (3, "a"), (4, "a"), (5, "b")]);
    for factor in [3, 5] {
        let table = PlacementTable::place(&set, factor, &groups(300)).unwrap();
        assert_spread(&table, &set, factor);
        // The lone node of "b" is in every group.
        assert_eq!(table.replicas_per_node()[&5], 300);
    }
    let set = members(&[(1, "a"), (2, "a"), (3, "b"), (4, "b")]);
    let table = PlacementTable::place(&set, 3, &groups(300)).unwrap();
    assert_spread(&table, &set, 3);
    let one = members(&[(1, "x"), (2, "x"), (3, "x")]);
    let table = PlacementTable::place(&one, 3, &groups(10)).unwrap();
    assert_spread(&table, &one, 3);
}

/// Removes `gone` from `set`, re-places, and checks that only the groups
/// holding it moved, that those lost exactly `gone` when `survivors_stay`,
/// and that the version and diff say so. Returns the groups moved.
fn check_removal(set: &[Member], factor: usize, gone: NodeId, survivors_stay: bool) -> usize {
    let groups = groups(1000);
    let before = PlacementTable::place(set, factor, &groups).unwrap();
    let rest: Vec<Member> = set.iter().filter(|member| member.id != gone).cloned().collect();
    let after = before.recompute(&rest, factor, &groups).unwrap();
    let moves = diff(&before, &after);
    let holders: Vec<GroupId> = before
        .iter()
        .filter(|(_, replicas)| replicas.contains(&gone))
        .map(|(group, _)| group)
        .collect();
    let moved: Vec<GroupId> = moves.iter().map(|moved| moved.group).collect();
    assert_eq!(moved, holders, "removing {gone}");
    for moved in &moves {
        assert_eq!(moved.removed(), vec![gone], "{moved:?}");
        assert_eq!(moved.added().len(), 1, "{moved:?}");
        if survivors_stay {
            let kept: Vec<NodeId> =
                moved.before.iter().copied().filter(|node| *node != gone).collect();
            let still: Vec<NodeId> =
                moved.after.iter().copied().filter(|node| kept.contains(node)).collect();
            assert_eq!(kept, still, "survivors keep their order: {moved:?}");
        }
    }
    assert_eq!(after.version(), before.version() + u64::from(!moves.is_empty()));
    assert_spread(&after, &rest, factor);
    moves.len()
}

// Goal: removing a node moves only the groups it held (each loses just
// that node); method: remove each of 5 flat nodes, and each of 6 nodes in
// 3 racks.
#[test]
fn removing_a_node_moves_only_its_groups() {
    for gone in 1..=5 {
        let moved = check_removal(&flat(5), 3, gone, true);
        assert!((480..=720).contains(&moved), "{gone}: {moved}");
    }
    let racks = members(&[(1, "r1"), (2, "r1"), (3, "r2"), (4, "r2"), (5, "r3"), (6, "r3")]);
    for gone in 1..=6 {
        check_removal(&racks, 3, gone, false);
    }
}

// Goal: adding a node moves only the groups it is taken into, about r/N of
// them, each giving up one replica to it; method: 5 → 6 flat nodes, 1,000
// groups, factor 3 (expected 500, bound 1.25 × that).
#[test]
fn adding_a_node_moves_a_bounded_share() {
    let groups = groups(1000);
    let before = PlacementTable::place(&flat(5), 3, &groups).unwrap();
    let after = before.recompute(&flat(6), 3, &groups).unwrap();
    let moves = diff(&before, &after);
    for moved in &moves {
        assert_eq!(moved.added(), vec![6], "{moved:?}");
        assert_eq!(moved.removed().len(), 1, "{moved:?}");
    }
    let takers = after.iter().filter(|(_, replicas)| replicas.contains(&6)).count();
    assert_eq!(moves.len(), takers);
    assert!(moves.len() <= 625, "{} groups moved", moves.len());
    eprintln!("5 -> 6 nodes: {} of 1000 groups moved (expected 500)", moves.len());
}

// Goal: the version moves only with a change; diff names new, gone and
// re-ordered groups; method: recompute unchanged, add and drop groups,
// change the factor, and exhaust the version.
#[test]
fn versions_and_diffs_follow_changes() {
    let set = flat(5);
    let empty = PlacementTable::empty();
    assert_eq!((empty.version(), empty.len(), empty.is_empty()), (0, 0, true));
    let first = PlacementTable::place(&set, 3, &groups(10)).unwrap();
    assert_eq!(first.version(), 1);
    assert_eq!(first.replication_factor(), 3);
    let same = first.recompute(&set, 3, &groups(10)).unwrap();
    assert_eq!(same, first);
    assert!(diff(&first, &same).is_empty());

    let grown = first.recompute(&set, 3, &groups(12)).unwrap();
    assert_eq!(grown.version(), 2);
    let moves = diff(&first, &grown);
    assert_eq!(moves.len(), 2);
    assert!(moves.iter().all(|moved| moved.before.is_empty() && moved.leader_changed()));
    assert_eq!(diff(&grown, &first).iter().filter(|moved| moved.after.is_empty()).count(), 2);

    let five = grown.recompute(&set, 5, &groups(12)).unwrap();
    assert_eq!(five.version(), 3);
    let moves = diff(&grown, &five);
    assert_eq!(moves.len(), 12);
    // Widening keeps the first three and the leader (the walk's prefix).
    for moved in &moves {
        assert_eq!(&moved.after[..3], moved.before.as_slice());
        assert!(!moved.leader_changed());
        assert_eq!(moved.added().len(), 2);
    }
    let group = GroupId::new(1, 0);
    assert_eq!(five.preferred_leader(group), five.replicas(group).map(|r| r[0]));
    assert_eq!(five.replicas(GroupId::new(99, 0)), None);

    let last = PlacementTable { version: u64::MAX, ..five.clone() };
    assert_eq!(last.recompute(&set, 5, &groups(12)).unwrap(), last);
    assert_eq!(
        last.recompute(&set, 3, &groups(12)),
        Err(PlacementError::VersionExhausted { version: u64::MAX })
    );
}

// Goal: bad inputs are errors, not panics or silent placements; method: one
// of each.
#[test]
fn bad_inputs_are_refused() {
    let one_group = [GroupId::new(1, 0)];
    assert_eq!(PlacementTable::place(&[], 1, &one_group), Err(PlacementError::NoNodes));
    assert_eq!(
        PlacementTable::place(&flat(3), 0, &one_group),
        Err(PlacementError::ReplicationFactor { factor: 0, nodes: 3 })
    );
    assert_eq!(
        PlacementTable::place(&flat(3), 4, &one_group),
        Err(PlacementError::ReplicationFactor { factor: 4, nodes: 3 })
    );
    let twice = members(&[(1, "a"), (2, "b"), (1, "c")]);
    assert_eq!(
        PlacementTable::place(&twice, 1, &one_group),
        Err(PlacementError::DuplicateNode { id: 1 })
    );
    let zero = members(&[(0, "a"), (2, "b")]);
    assert_eq!(PlacementTable::place(&zero, 1, &one_group), Err(PlacementError::NodeIdZero));
    let no_domain = members(&[(1, ""), (2, "b")]);
    assert!(matches!(
        PlacementTable::place(&no_domain, 1, &one_group),
        Err(PlacementError::FailureDomain { id: 1, .. })
    ));
    let many = flat(CLUSTER_NODES_MAX as u64 + 1);
    assert!(matches!(
        PlacementTable::place(&many, 3, &one_group),
        Err(PlacementError::TooManyNodes { .. })
    ));
}

/// Up to 12 members with distinct random ids in up to 5 domains, and a
/// factor within their count.
fn cluster() -> impl Strategy<Value = (Vec<Member>, usize)> {
    proptest::collection::btree_map(1u64..10_000, 0u8..5, 1..=12).prop_flat_map(|ids| {
        let members: Vec<Member> = ids
            .into_iter()
            .map(|(id, domain)| Member { id, failure_domain: format!("zone-{domain}") })
            .collect();
        let nodes = members.len();
        (Just(members), 1..=nodes)
    })
}

// Goal: a replacement never takes a node that stays, is down or leaves,
// prefers a failure domain the staying replicas do not use, and is the
// same on every node; method: five nodes in three domains, every group of
// a few hundred with its first replica down.
#[test]
fn a_replacement_is_outside_the_set_and_spreads_domains() {
    let set = members(&[(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")]);
    let placer = Placer::new(&set, 3).unwrap();
    let domain =
        |id: NodeId| set.iter().find(|member| member.id == id).unwrap().failure_domain.clone();
    let mut chosen = BTreeMap::new();
    for group in groups(300) {
        let replicas = placer.place(group);
        let (gone, keep) = (replicas[0], &replicas[1..]);
        let to = placer.replacement(group, keep, &[gone]).unwrap();
        assert!(!replicas.contains(&to));
        let free_domain = set.iter().any(|member| {
            member.id != gone
                && !replicas.contains(&member.id)
                && keep.iter().all(|kept| domain(*kept) != member.failure_domain)
        });
        if free_domain {
            assert!(keep.iter().all(|kept| domain(*kept) != domain(to)), "{group:?}");
        }
        *chosen.entry(to).or_insert(0) += 1;
        assert_eq!(placer.replacement(group, keep, &[gone]), Some(to));
    }
    // Spread over more than one node, not always the same spare.
    assert!(chosen.len() >= 2, "{chosen:?}");
    // No node left: three nodes, factor three.
    let three = Placer::new(&flat(3), 3).unwrap();
    assert_eq!(three.replacement(GroupId::new(1, 0), &[2, 3], &[1]), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    // Goal: for any members, factor and order, the table is the same and
    // every group is spread; method: random clusters, shuffled.
    #[test]
    fn any_cluster_is_deterministic_and_spread(
        (set, factor) in cluster(),
        shuffle in any::<u64>(),
        count in 1u32..300,
    ) {
        let groups = groups(count);
        let table = PlacementTable::place(&set, factor, &groups).unwrap();
        let mut shuffled = set.clone();
        let mut rng = Seeded(shuffle);
        for index in (1..shuffled.len()).rev() {
            shuffled.swap(index, (rng.next() % (index as u64 + 1)) as usize);
        }
        prop_assert_eq!(&table, &PlacementTable::place(&shuffled, factor, &groups).unwrap());
        assert_spread(&table, &set, factor);
    }

    // Goal: removing any node changes only the groups that held it; method:
    // random clusters, a random node removed (factor kept within the rest).
    #[test]
    fn any_removal_moves_only_the_groups_of_the_node(
        (set, factor) in cluster(),
        pick in any::<prop::sample::Index>(),
    ) {
        prop_assume!(set.len() >= 2);
        let factor = factor.min(set.len() - 1);
        let gone = set[pick.index(set.len())].id;
        let groups = groups(200);
        let before = PlacementTable::place(&set, factor, &groups).unwrap();
        let rest: Vec<Member> = set.iter().filter(|member| member.id != gone).cloned().collect();
        let after = before.recompute(&rest, factor, &groups).unwrap();
        for moved in diff(&before, &after) {
            prop_assert!(moved.before.contains(&gone), "{:?}", moved);
        }
        assert_spread(&after, &rest, factor);
    }

    // Goal: adding any node changes only the groups it is taken into;
    // method: random clusters, a node with a fresh id in a random domain
    // (maybe a new one) added.
    #[test]
    fn any_addition_moves_only_the_groups_that_take_the_node(
        (set, factor) in cluster(),
        domain in 0u8..6,
    ) {
        prop_assume!(set.len() < CLUSTER_NODES_MAX);
        let new = set.iter().map(|member| member.id).max().unwrap() + 1;
        let mut grown = set.clone();
        grown.push(Member { id: new, failure_domain: format!("zone-{domain}") });
        let groups = groups(200);
        let before = PlacementTable::place(&set, factor, &groups).unwrap();
        let after = before.recompute(&grown, factor, &groups).unwrap();
        for moved in diff(&before, &after) {
            prop_assert!(moved.after.contains(&new), "{:?}", moved);
        }
        assert_spread(&after, &grown, factor);
    }
}
