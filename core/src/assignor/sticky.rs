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
use crate::id::{MemberId, TopicPartition};

pub(super) fn assign(input: AssignmentInput<'_>) -> Assignment {
    let eligible = input.eligible_partitions();
    let mut owned: BTreeMap<&MemberId, Vec<TopicPartition>> = input.members.keys().map(|m| (m, Vec::new())).collect();

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
        let target =
            subscribers.iter().min_by_key(|m| (owned[**m].len(), **m)).expect("eligible partitions have subscribers");
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
