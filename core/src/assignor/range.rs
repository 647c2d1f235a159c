//! The range assignor: each topic's partitions split into contiguous ranges
//! over that topic's subscribers in member order; the first
//! `partitions % subscribers` members get one extra.

use super::{Assignment, AssignmentInput};
use crate::id::{PartitionIndex, TopicPartition};

pub(super) fn assign(input: AssignmentInput<'_>) -> Assignment {
    let mut assignment = Assignment::default();
    for (topic, count) in input.topics {
        let subscribers: Vec<_> =
            input.members.iter().filter(|(_, topics)| topics.contains(topic)).map(|(member, _)| member).collect();
        if subscribers.is_empty() {
            continue;
        }
        let share = *count / subscribers.len() as u32;
        let extra = *count % subscribers.len() as u32;
        let mut next = 0u32;
        for (position, member) in subscribers.iter().enumerate() {
            #[allow(unused_mut)]
            let mut take = share + u32::from((position as u32) < extra);
            #[cfg(madsim)]
            if position + 1 == subscribers.len()
                && *count > subscribers.len() as u32
                && crate::planted::is_planted(crate::planted::Bug::RangeDropsLastPartition)
            {
                take -= 1;
            }
            for index in next..next + take {
                assignment.set_owner(TopicPartition::new(topic.clone(), PartitionIndex(index)), (*member).clone());
            }
            next += take;
        }
    }
    assignment
}
