//! Forgetting empty consumer groups: while this broker leads the metadata
//! group, each duty round proposes `ForgetGroup` for groups that have had
//! no members for `group_retention_ms` (Kafka's
//! `offsets.retention.minutes`), at most `GROUPS_FORGOTTEN_PER_ROUND` a
//! round. Without it, every group ever joined stays until deleted, and
//! once `groups_max` of them exist no new group can join.
//!
//! The decision is the state machine's: it checks the leader's stamp on
//! the command against the group's `empty_since`, so a group joined again
//! in between is kept. A group forgotten raises the floor a later group of
//! its name starts from, as a deleted one does, so its old generations
//! are never handed out again.
//!
//! Its positions on partitions stay (a group of that name joined later
//! resumes from them). `PartitionCommand::ForgetIdleGroup` and the
//! partition's `touched_at` are there to forget them, but nothing proposes
//! it yet: a partition leader judging "gone from the metadata" by its own
//! replica of the metadata may be behind, and would wipe a live group's
//! position and the claim that fences its older generations. It needs
//! evidence that cannot be stale, such as a tombstone the metadata keeps
//! for each forgotten group with the generation it reached.

use keel_core::metadata::MetadataCommand;
use keel_core::GroupName;

use super::{Node, DUTY_PROPOSAL_TIMEOUT};
use crate::group::GroupId;
use crate::raft::types::Command;

/// Most groups one duty round proposes to forget, in groups. The round
/// proposes them all at once (they share Raft entries and fsyncs) and waits
/// for every answer, within `DUTY_PROPOSAL_TIMEOUT`.
const GROUPS_FORGOTTEN_PER_ROUND: usize = 1_000;

impl Node {
    /// Propose to forget the groups empty past their retention (call only
    /// while leading the metadata group).
    pub(super) async fn forget_expired_groups(&self) {
        let metadata = self.metadata();
        let now = self.inner.clock.now();
        let retention = metadata.limits().group_retention_ms;
        let due: Vec<(GroupName, keel_core::TimestampMs)> = metadata
            .groups()
            .iter()
            .filter_map(|(name, info)| Some((name, info.members.is_empty().then_some(info.empty_since)??)))
            .filter(|(_, since)| now.0 >= since.0.saturating_add(retention))
            .take(GROUPS_FORGOTTEN_PER_ROUND)
            .map(|(name, since)| (name.clone(), since))
            .collect();
        // Polled in order (join_all), so a simulated run stays the same.
        let proposals = due.into_iter().map(|(group, empty_since)| async move {
            let command = MetadataCommand::ForgetGroup { group: group.to_string(), empty_since };
            let proposed = self.propose(&GroupId::Metadata, Command::Metadata(command));
            match tokio::time::timeout(DUTY_PROPOSAL_TIMEOUT, proposed).await {
                Ok(Ok(_)) => tracing::debug!(%group, "forgot a group empty past group_retention_ms"),
                Ok(Err(error)) => tracing::debug!(%error, %group, "could not forget an empty group yet"),
                Err(_) => tracing::debug!(%group, "forgetting an empty group got no answer in time; retrying"),
            }
        });
        futures_util::future::join_all(proposals).await;
    }
}
