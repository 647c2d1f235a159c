//! The round-robin assignor: every partition, in (topic, index) order, goes
//! to the next member in member order that subscribes to its topic.

use super::{Assignment, AssignmentInput};

pub(super) fn assign(input: AssignmentInput<'_>) -> Assignment {
    let members: Vec<_> = input.members.keys().collect();
    let mut assignment = Assignment::default();
    let mut cursor = 0usize;
    for (partition, subscribers) in input.eligible_partitions() {
        // The next member at or after the cursor that subscribes; there is
        // at least one, so this terminates within one lap.
        for step in 0..members.len() {
            let candidate = members[(cursor + step) % members.len()];
            if subscribers.contains(&candidate) {
                assignment.set_owner(partition, candidate.clone());
                cursor = (cursor + step + 1) % members.len();
                break;
            }
        }
    }
    assignment
}
