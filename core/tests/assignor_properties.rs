//! Properties of every assignor: ownership, balance, stickiness and
//! independence from input order.

use std::collections::{BTreeMap, BTreeSet};

use keel_core::assignor::{assign, Assignment, AssignmentInput, AssignorKind};
use keel_core::{MemberId, PartitionIndex, TopicName, TopicPartition};
use proptest::prelude::*;

type Topics = BTreeMap<TopicName, u32>;
type Members = BTreeMap<MemberId, BTreeSet<TopicName>>;
type Owners = Vec<Option<usize>>;

const KINDS: [AssignorKind; 3] = [AssignorKind::StickyBalanced, AssignorKind::Range, AssignorKind::RoundRobin];

fn topic(i: usize) -> TopicName {
    TopicName::new(format!("topic-{i}")).unwrap()
}

fn member(i: usize) -> MemberId {
    MemberId::new(format!("member-{i:02}")).unwrap()
}

/// Topics with 1-12 partitions each.
fn topics() -> impl Strategy<Value = BTreeMap<TopicName, u32>> {
    proptest::collection::vec(1u32..12, 1..4)
        .prop_map(|counts| counts.into_iter().enumerate().map(|(i, c)| (topic(i), c)).collect())
}

/// Members (ids drawn from 0..10) each subscribed to a non-empty subset.
fn members(topic_count: usize) -> impl Strategy<Value = BTreeMap<MemberId, BTreeSet<TopicName>>> {
    proptest::collection::btree_map(0usize..10, proptest::collection::btree_set(0..topic_count, 1..=topic_count), 1..8)
        .prop_map(|m| m.into_iter().map(|(id, subs)| (member(id), subs.into_iter().map(topic).collect())).collect())
}

/// Members all subscribed to every topic.
fn shared_members(topics: &BTreeMap<TopicName, u32>, ids: &BTreeSet<usize>) -> BTreeMap<MemberId, BTreeSet<TopicName>> {
    let all: BTreeSet<TopicName> = topics.keys().cloned().collect();
    ids.iter().map(|id| (member(*id), all.clone())).collect()
}

/// An arbitrary previous assignment over members 0..12 (some of whom may
/// have left), owning an arbitrary subset of partitions.
fn previous(topics: &BTreeMap<TopicName, u32>, owners: &[Option<usize>]) -> Assignment {
    let mut assignment = Assignment::default();
    let partitions =
        topics.iter().flat_map(|(t, c)| (0..*c).map(move |i| TopicPartition::new(t.clone(), PartitionIndex(i))));
    for (partition, owner) in partitions.zip(owners.iter().cycle()) {
        if let Some(owner) = owner {
            assignment.set_owner(partition, member(*owner));
        }
    }
    assignment
}

fn check_ownership(
    topics: &BTreeMap<TopicName, u32>,
    members: &BTreeMap<MemberId, BTreeSet<TopicName>>,
    result: &Assignment,
) -> Result<(), TestCaseError> {
    let mut expected = 0usize;
    for (name, count) in topics {
        let subscribed = members.values().any(|s| s.contains(name));
        for index in 0..*count {
            let partition = TopicPartition::new(name.clone(), PartitionIndex(index));
            match result.owner(&partition) {
                Some(owner) => {
                    prop_assert!(subscribed, "{partition} assigned but nobody subscribes");
                    prop_assert!(members[owner].contains(name), "{owner} owns {partition} without subscribing");
                    expected += 1;
                }
                None => prop_assert!(!subscribed, "{partition} has no owner"),
            }
        }
    }
    prop_assert_eq!(result.len(), expected, "assignment names partitions that do not exist");
    Ok(())
}

fn spread(members: &BTreeMap<MemberId, BTreeSet<TopicName>>, result: &Assignment) -> u64 {
    let counts = result.counts();
    let all: Vec<u64> = members.keys().map(|m| counts.get(m).copied().unwrap_or(0)).collect();
    all.iter().max().unwrap() - all.iter().min().unwrap()
}

/// Every partition of a subscribed topic has exactly one owner, who
/// subscribes to it, for every assignor and any previous assignment.
pub fn check_every_partition_has_one_subscribed_owner(
    topics: Topics,
    members: Members,
    owners: Owners,
) -> Result<(), TestCaseError> {
    let previous = previous(&topics, &owners);
    for kind in KINDS {
        let result = assign(kind, AssignmentInput { topics: &topics, members: &members, previous: &previous });
        check_ownership(&topics, &members, &result)?;
    }
    Ok(())
}

/// With a shared subscription, member counts differ by at most one for
/// the sticky and round-robin assignors, and per topic for range.
pub fn check_shared_subscriptions_are_balanced(
    topics: Topics,
    ids: BTreeSet<usize>,
    owners: Owners,
) -> Result<(), TestCaseError> {
    let members = shared_members(&topics, &ids);
    let previous = previous(&topics, &owners);
    for kind in [AssignorKind::StickyBalanced, AssignorKind::RoundRobin] {
        let result = assign(kind, AssignmentInput { topics: &topics, members: &members, previous: &previous });
        prop_assert!(spread(&members, &result) <= 1, "{:?}: {:?}", kind, result.counts());
    }
    let result =
        assign(AssignorKind::Range, AssignmentInput { topics: &topics, members: &members, previous: &previous });
    for name in topics.keys() {
        let only: BTreeMap<TopicName, u32> =
            topics.iter().filter(|(t, _)| *t == name).map(|(t, c)| (t.clone(), *c)).collect();
        let mut per_topic = Assignment::default();
        for (partition, owner) in result.iter().filter(|(p, _)| &p.topic == name) {
            per_topic.set_owner(partition, owner.clone());
        }
        prop_assert!(spread(&members, &per_topic) <= 1, "range on {}: {:?}", name, per_topic.counts());
        check_ownership(&only, &members, &per_topic)?;
    }
    Ok(())
}

/// On a membership change with a shared subscription, the sticky
/// assignor moves exactly as many kept partitions as balance requires:
/// members sorted by what they kept, the largest `n mod m` may keep
/// `ceil(n/m)`, the rest `floor(n/m)`, and everything above that moves.
pub fn check_sticky_moves_only_what_balance_requires(
    topics: Topics,
    before: BTreeSet<usize>,
    after: BTreeSet<usize>,
    owners: Owners,
    start_balanced: bool,
) -> Result<(), TestCaseError> {
    let previous = if start_balanced {
        let members = shared_members(&topics, &before);
        assign(
            AssignorKind::StickyBalanced,
            AssignmentInput { topics: &topics, members: &members, previous: &Assignment::default() },
        )
    } else {
        previous(&topics, &owners)
    };
    let members = shared_members(&topics, &after);
    let result = assign(
        AssignorKind::StickyBalanced,
        AssignmentInput { topics: &topics, members: &members, previous: &previous },
    );

    let partitions: u64 = topics.values().map(|c| u64::from(*c)).sum();
    let member_count = members.len() as u64;
    let (floor, extra) = (partitions / member_count, partitions % member_count);
    let mut kept: Vec<u64> = members.keys().map(|m| previous.partitions_of(m).len() as u64).collect();
    kept.sort_unstable_by(|a, b| b.cmp(a));
    let required: u64 =
        kept.iter().enumerate().map(|(i, k)| k.saturating_sub(floor + u64::from((i as u64) < extra))).sum();
    let moved =
        previous.iter().filter(|(p, owner)| members.contains_key(*owner) && result.owner(p) != Some(owner)).count()
            as u64;
    prop_assert_eq!(moved, required, "previous {:?} result {:?}", previous.counts(), result.counts());
    Ok(())
}

/// With different subscriptions the sticky assignor still leaves no
/// move that would improve balance: no member owns two or more partitions
/// more than a member that subscribes to one of them.
pub fn check_sticky_balances_mixed_subscriptions_locally(
    topics: Topics,
    members: Members,
    owners: Owners,
) -> Result<(), TestCaseError> {
    let previous = previous(&topics, &owners);
    let result = assign(
        AssignorKind::StickyBalanced,
        AssignmentInput { topics: &topics, members: &members, previous: &previous },
    );
    let counts = result.counts();
    let count = |m: &MemberId| counts.get(m).copied().unwrap_or(0);
    for (partition, owner) in result.iter() {
        for (other, subscriptions) in &members {
            if subscriptions.contains(&partition.topic) {
                prop_assert!(
                    count(owner) <= count(other) + 1,
                    "{owner} ({}) could give {partition} to {other} ({})",
                    count(owner),
                    count(other)
                );
            }
        }
    }
    Ok(())
}

/// The result depends on the inputs, not on the order they were built in.
pub fn check_result_does_not_depend_on_input_order(
    topics: Topics,
    members: Members,
    owners: Owners,
    rotation: usize,
) -> Result<(), TestCaseError> {
    let previous = previous(&topics, &owners);
    let mut member_list: Vec<_> = members.clone().into_iter().collect();
    member_list.reverse();
    let shift = rotation % member_list.len();
    member_list.rotate_left(shift);
    let shuffled_members: BTreeMap<_, _> = member_list.into_iter().collect();
    let shuffled_topics: BTreeMap<_, _> = topics.clone().into_iter().rev().collect();
    let mut shuffled_previous = Assignment::default();
    let mut entries: Vec<_> = previous.iter().map(|(p, m)| (p, m.clone())).collect();
    entries.reverse();
    for (partition, owner) in entries {
        shuffled_previous.set_owner(partition, owner);
    }
    for kind in KINDS {
        let a = assign(kind, AssignmentInput { topics: &topics, members: &members, previous: &previous });
        let b = assign(
            kind,
            AssignmentInput { topics: &shuffled_topics, members: &shuffled_members, previous: &shuffled_previous },
        );
        prop_assert_eq!(a, b);
    }
    Ok(())
}

/// Everything the properties take, drawn at once (for the fuzzer, which
/// checks all of them on one case).
pub type Case = (Topics, Members, BTreeSet<usize>, BTreeSet<usize>, Owners, bool, usize);

pub fn any_case() -> impl Strategy<Value = Case> {
    (
        topics().prop_flat_map(|t| {
            let n = t.len();
            (Just(t), members(n))
        }),
        proptest::collection::btree_set(0usize..10, 1..8),
        proptest::collection::btree_set(0usize..10, 1..8),
        proptest::collection::vec(proptest::option::of(0usize..12), 1..20),
        any::<bool>(),
        0usize..8,
    )
        .prop_map(|((topics, members), before, after, owners, balanced, rotation)| {
            (topics, members, before, after, owners, balanced, rotation)
        })
}

/// Every property on one case.
pub fn check_case((topics, members, before, after, owners, balanced, rotation): Case) -> Result<(), TestCaseError> {
    check_every_partition_has_one_subscribed_owner(topics.clone(), members.clone(), owners.clone())?;
    check_shared_subscriptions_are_balanced(topics.clone(), before.clone(), owners.clone())?;
    check_sticky_moves_only_what_balance_requires(topics.clone(), before, after, owners.clone(), balanced)?;
    check_sticky_balances_mixed_subscriptions_locally(topics.clone(), members.clone(), owners.clone())?;
    check_result_does_not_depend_on_input_order(topics, members, owners, rotation)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_partition_has_one_subscribed_owner(
        (topics, members) in topics().prop_flat_map(|t| { let n = t.len(); (Just(t), members(n)) }),
        owners in proptest::collection::vec(proptest::option::of(0usize..12), 1..20),
    ) {
        check_every_partition_has_one_subscribed_owner(topics, members, owners)?;
    }

    #[test]
    fn shared_subscriptions_are_balanced(
        topics in topics(),
        ids in proptest::collection::btree_set(0usize..10, 1..8),
        owners in proptest::collection::vec(proptest::option::of(0usize..12), 1..20),
    ) {
        check_shared_subscriptions_are_balanced(topics, ids, owners)?;
    }

    #[test]
    fn sticky_moves_only_what_balance_requires(
        topics in topics(),
        before in proptest::collection::btree_set(0usize..10, 1..8),
        after in proptest::collection::btree_set(0usize..10, 1..8),
        owners in proptest::collection::vec(proptest::option::of(0usize..12), 1..20),
        start_balanced in any::<bool>(),
    ) {
        check_sticky_moves_only_what_balance_requires(topics, before, after, owners, start_balanced)?;
    }

    #[test]
    fn sticky_balances_mixed_subscriptions_locally(
        (topics, members) in topics().prop_flat_map(|t| { let n = t.len(); (Just(t), members(n)) }),
        owners in proptest::collection::vec(proptest::option::of(0usize..12), 1..20),
    ) {
        check_sticky_balances_mixed_subscriptions_locally(topics, members, owners)?;
    }

    #[test]
    fn result_does_not_depend_on_input_order(
        (topics, members) in topics().prop_flat_map(|t| { let n = t.len(); (Just(t), members(n)) }),
        owners in proptest::collection::vec(proptest::option::of(0usize..12), 1..20),
        rotation in 0usize..8,
    ) {
        check_result_does_not_depend_on_input_order(topics, members, owners, rotation)?;
    }
}

#[test]
fn sticky_keeps_everything_when_nothing_changes() {
    let topics: BTreeMap<TopicName, u32> = [(topic(0), 7), (topic(1), 5)].into_iter().collect();
    let members = shared_members(&topics, &[1, 2, 3].into_iter().collect());
    let first = assign(
        AssignorKind::StickyBalanced,
        AssignmentInput { topics: &topics, members: &members, previous: &Assignment::default() },
    );
    let second =
        assign(AssignorKind::StickyBalanced, AssignmentInput { topics: &topics, members: &members, previous: &first });
    assert_eq!(first, second);
    assert_eq!(first.counts().values().copied().collect::<Vec<_>>(), vec![4, 4, 4]);
}

#[test]
fn range_and_round_robin_match_their_definitions() {
    let topics: BTreeMap<TopicName, u32> = [(topic(0), 5)].into_iter().collect();
    let members = shared_members(&topics, &[0, 1].into_iter().collect());
    let input = AssignmentInput { topics: &topics, members: &members, previous: &Assignment::default() };
    let owners = |a: Assignment| a.iter().map(|(_, m)| m.as_str().to_string()).collect::<Vec<_>>();
    assert_eq!(
        owners(assign(AssignorKind::Range, input)),
        ["member-00", "member-00", "member-00", "member-01", "member-01"]
    );
    assert_eq!(
        owners(assign(AssignorKind::RoundRobin, input)),
        ["member-00", "member-01", "member-00", "member-01", "member-00"]
    );
}
