//! The sticky-balanced assignor (the default).
//!
//! 1. Keep: every partition stays with its previous owner if that owner is
//!    still a member and still subscribes to the topic.
//! 2. Place: every partition without an owner goes to the least loaded
//!    subscriber (ties: member order).
//! 3. Balance: while some member owns two or more partitions more than a
//!    member that could take one of them, move one partition from the most
//!    loaded such member to the least loaded one.
//!
//! Each move in step 3 lowers the sum of squared counts, so the loop ends.
//! A member that received a partition in step 2 is never a donor in step 3,
//! and donors only give while they are two above the least loaded, so with a
//! shared subscription the number of kept partitions that move is the
//! minimum balance requires (a property test checks this bound).

use std::collections::BTreeMap;

use super::{Assignment, AssignmentInput};
use crate::id::{MemberId, PartitionIndex, TopicName};

// The steps work on indexes (members in member order, topics in topic
// order), so a partition's subscribers are a lookup, not a search of
// names: a join costs O(partitions + moves x members), where comparing
// names made it about 5 ms at 10,000 partitions and 10 members.

/// A subscribed topic: its name, partition count, and which members
/// (by index) subscribe to it.
struct Topic<'a> {
    name: &'a TopicName,
    partitions: u32,
    subscribers: Vec<usize>,
    subscribed: Vec<bool>,
}

/// A partition: (topic index, partition index).
type Slot = (usize, u32);

pub(super) fn assign(input: AssignmentInput<'_>) -> Assignment {
    let members: Vec<&MemberId> = input.members.keys().collect();
    let member_index: BTreeMap<&MemberId, usize> = members.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let topics: Vec<Topic<'_>> = input
        .topics
        .iter()
        .filter_map(|(name, partitions)| {
            let subscribed: Vec<bool> = input.members.values().map(|topics| topics.contains(name)).collect();
            let subscribers: Vec<usize> = (0..members.len()).filter(|m| subscribed[*m]).collect();
            (!subscribers.is_empty()).then_some(Topic { name, partitions: *partitions, subscribers, subscribed })
        })
        .collect();
    let mut owned: Vec<Vec<Slot>> = vec![Vec::new(); members.len()];

    // 1. Keep.
    let mut unowned: Vec<Slot> = Vec::new();
    for (t, topic) in topics.iter().enumerate() {
        // Each partition's previous owner, by index; consecutive partitions
        // mostly share an owner, so the last one found is tried first.
        let mut previous_owner: Vec<Option<usize>> = vec![None; topic.partitions as usize];
        let mut last: Option<(&MemberId, Option<usize>)> = None;
        for (partition, owner) in input.previous.owners.get(topic.name).into_iter().flatten() {
            let Some(slot) = previous_owner.get_mut(partition.0 as usize) else { break };
            let member = match last {
                Some((seen, member)) if seen == owner => member,
                _ => member_index.get(owner).copied(),
            };
            last = Some((owner, member));
            *slot = member;
        }
        for (partition, owner) in previous_owner.into_iter().enumerate() {
            let partition = partition as u32;
            match owner.filter(|m| topic.subscribed[*m]) {
                Some(member) => owned[member].push((t, partition)),
                None => unowned.push((t, partition)),
            }
        }
    }

    // 2. Place.
    for (t, partition) in unowned {
        let target = *topics[t]
            .subscribers
            .iter()
            .min_by_key(|m| (owned[**m].len(), **m))
            .expect("a subscribed topic has subscribers");
        owned[target].push((t, partition));
    }

    // 3. Balance. The member orders are kept between moves: each move
    // changes two counts by one, so re-sorting them is cheap (a new member
    // of a group of 10,000 partitions takes about 900 moves).
    let mut donors: Vec<usize> = (0..owned.len()).collect();
    let mut receivers = donors.clone();
    while let Some((donor, receiver, position)) = next_move(&owned, &topics, &mut donors, &mut receivers) {
        let slot = owned[donor].remove(position);
        owned[receiver].push(slot);
    }

    let mut owner_of: Vec<Vec<Option<usize>>> = topics.iter().map(|t| vec![None; t.partitions as usize]).collect();
    for (member, slots) in owned.iter().enumerate() {
        for (t, partition) in slots {
            owner_of[*t][*partition as usize] = Some(member);
        }
    }
    let owners = topics
        .iter()
        .zip(owner_of)
        .map(|(topic, owners)| {
            let partitions = owners
                .into_iter()
                .enumerate()
                .map(|(p, m)| (PartitionIndex(p as u32), members[m.expect("every partition placed")].clone()))
                .collect();
            (topic.name.clone(), partitions)
        })
        .collect();
    Assignment { owners }
}

/// The next balancing move: the most loaded member that can give a
/// partition to a member holding at least two fewer, the least loaded such
/// receiver, and the position of the partition to move (its latest one that
/// the receiver subscribes to). Ties go to member order. `donors` and
/// `receivers` hold every member, in any order (sorted here).
fn next_move(
    owned: &[Vec<Slot>],
    topics: &[Topic<'_>],
    donors: &mut [usize],
    receivers: &mut [usize],
) -> Option<(usize, usize, usize)> {
    // Keys are unique (member order breaks ties): unstable sorts order as
    // stable ones would.
    donors.sort_unstable_by_key(|m| (std::cmp::Reverse(owned[*m].len()), *m));
    receivers.sort_unstable_by_key(|m| (owned[*m].len(), *m));
    for donor in donors.iter() {
        let given = &owned[*donor];
        for receiver in receivers.iter() {
            if owned[*receiver].len() + 1 >= given.len() {
                break;
            }
            if let Some(position) = given.iter().rposition(|(t, _)| topics[*t].subscribed[*receiver]) {
                return Some((*donor, *receiver, position));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    //! The assignor as first written (names compared in every step), kept
    //! to show that the indexed one assigns exactly as it did.

    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::super::{Assignment, AssignmentInput};
    use crate::id::{MemberId, TopicName, TopicPartition};

    fn reference(input: AssignmentInput<'_>) -> Assignment {
        let eligible = input.eligible_partitions();
        let mut owned: BTreeMap<&MemberId, Vec<TopicPartition>> =
            input.members.keys().map(|m| (m, Vec::new())).collect();

        // 1. Keep.
        let mut unowned = Vec::new();
        for (partition, subscribers) in &eligible {
            match input.previous.owner(partition) {
                Some(previous) if subscribers.contains(&previous) => {
                    owned.get_mut(previous).expect("subscribers are members").push(partition.clone());
                }
                _ => unowned.push((partition, subscribers)),
            }
        }

        // 2. Place.
        for (partition, subscribers) in unowned {
            let target = subscribers
                .iter()
                .min_by_key(|m| (owned[**m].len(), **m))
                .expect("eligible partitions have subscribers");
            owned.get_mut(*target).expect("subscribers are members").push(partition.clone());
        }

        // 3. Balance.
        let subscribers_of: BTreeMap<&TopicPartition, &Vec<&MemberId>> = eligible.iter().map(|(p, s)| (p, s)).collect();
        while let Some((donor, receiver, position)) = next_move(&owned, &subscribers_of) {
            let partition = owned.get_mut(donor).expect("donor is a member").remove(position);
            owned.get_mut(receiver).expect("receiver is a member").push(partition);
        }

        let mut assignment = Assignment::default();
        for (member, partitions) in owned {
            for partition in partitions {
                assignment.set_owner(partition, member.clone());
            }
        }
        assignment
    }

    /// The next balancing move: the most loaded member that can give a
    /// partition to a member holding at least two fewer, the least loaded such
    /// receiver, and the position of the partition to move (its latest one that
    /// the receiver subscribes to).
    fn next_move<'m>(
        owned: &BTreeMap<&'m MemberId, Vec<TopicPartition>>,
        subscribers_of: &BTreeMap<&TopicPartition, &Vec<&MemberId>>,
    ) -> Option<(&'m MemberId, &'m MemberId, usize)> {
        let mut donors: Vec<_> = owned.iter().collect();
        donors.sort_by_key(|(member, partitions)| (std::cmp::Reverse(partitions.len()), **member));
        let mut receivers: Vec<_> = owned.iter().collect();
        receivers.sort_by_key(|(member, partitions)| (partitions.len(), **member));
        for (donor, given) in &donors {
            for (receiver, taken) in &receivers {
                if taken.len() + 1 >= given.len() {
                    break;
                }
                let movable = given.iter().rposition(|p| subscribers_of[p].contains(receiver));
                if let Some(position) = movable {
                    return Some((donor, receiver, position));
                }
            }
        }
        None
    }

    /// Partition counts, subscriptions, and a previous assignment (owners
    /// that may have left, of partitions that may no longer exist).
    type Parts = (BTreeMap<TopicName, u32>, BTreeMap<MemberId, BTreeSet<TopicName>>, Vec<(TopicPartition, MemberId)>);

    fn input_parts() -> impl Strategy<Value = Parts> {
        let topic = || (0..4u8).prop_map(|t| TopicName::new(format!("t{t}")).unwrap());
        let member = || (0..6u8).prop_map(|m| MemberId::new(format!("m{m}")).unwrap());
        (
            proptest::collection::btree_map(topic(), 1..40u32, 0..4),
            proptest::collection::btree_map(member(), proptest::collection::btree_set(topic(), 0..4), 0..6),
            proptest::collection::vec(((topic(), 0..45u32), member()), 0..120),
        )
            .prop_map(|(topics, members, previous)| {
                let previous = previous
                    .into_iter()
                    .map(|((t, p), m)| (TopicPartition::new(t, crate::id::PartitionIndex(p)), m))
                    .collect();
                (topics, members, previous)
            })
    }

    proptest! {
        #[test]
        fn assigns_exactly_as_the_reference((topics, members, previous) in input_parts()) {
            let mut before = Assignment::default();
            for (partition, member) in previous {
                before.set_owner(partition, member);
            }
            let input = AssignmentInput { topics: &topics, members: &members, previous: &before };
            let first = super::assign(input);
            prop_assert_eq!(&first, &reference(input));
            // And again from its own output (a sticky second round).
            let input = AssignmentInput { topics: &topics, members: &members, previous: &first };
            prop_assert_eq!(super::assign(input), reference(input));
        }
    }
}
