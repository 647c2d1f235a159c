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
//! Its positions go too: every `IDLE_GROUP_SCAN_INTERVAL`, each partition
//! leader proposes `ForgetIdleGroup` for groups its partitions track that
//! the metadata no longer has and that nothing claimed, committed or reset
//! there for `group_retention_ms`. The partition's state machine checks the
//! idle time against its own record (leader-stamped), so a group of that
//! name created again and used in between keeps its position.

use keel_core::metadata::MetadataCommand;
use keel_core::partition::PartitionCommand;
use keel_core::GroupName;

use super::{Node, DUTY_PROPOSAL_TIMEOUT};
use crate::group::GroupId;
use crate::raft::types::Command;

/// Most groups one duty round proposes to forget, in groups. The round
/// proposes them all at once (they share Raft entries and fsyncs) and waits
/// for every answer, within `DUTY_PROPOSAL_TIMEOUT`.
const GROUPS_FORGOTTEN_PER_ROUND: usize = 1_000;

/// How often partition leaders look for positions of forgotten groups, in
/// milliseconds: a scan reads every partition led here.
const IDLE_GROUP_SCAN_INTERVAL_MS: u64 = 10_000;

/// Most positions one scan proposes to forget, in (partition, group) pairs.
const POSITIONS_FORGOTTEN_PER_SCAN: usize = 1_000;

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

impl Node {
    /// Every `IDLE_GROUP_SCAN_INTERVAL_MS`, on the partitions led here,
    /// propose to forget positions of groups the metadata no longer has
    /// that have been idle for `group_retention_ms` (in a task of its own,
    /// one scan at a time).
    pub(super) fn forget_positions_of_forgotten_groups(&self) {
        let now = self.inner.clock.monotonic();
        {
            let mut scanned = self.inner.idle_groups_scanned.lock().expect("idle group scans");
            let recent = scanned.0.is_some_and(|at| now.0.saturating_sub(at.0) < IDLE_GROUP_SCAN_INTERVAL_MS);
            if recent || scanned.1 {
                return;
            }
            *scanned = (Some(now), true);
        }
        let metadata = self.metadata();
        let (wall, retention) = (self.inner.clock.now(), metadata.limits().group_retention_ms);
        let hosted: Vec<(GroupId, super::GroupHandle)> = {
            let groups = self.inner.groups.lock().expect("groups");
            groups.iter().filter(|(g, _)| **g != GroupId::Metadata).map(|(g, h)| (g.clone(), h.clone())).collect()
        };
        let mut due: Vec<(GroupId, GroupName)> = Vec::new();
        for (group, handle) in hosted {
            let GroupId::Partition(partition, _) = &group else { continue };
            if handle.raft.metrics().borrow().current_leader != Some(self.id()) {
                continue;
            }
            let Some(state) = self.partition(partition) else { continue };
            for (name, entry) in state.groups() {
                let idle = wall.0.saturating_sub(entry.touched_at.0) >= retention;
                if idle && metadata.group(name).is_none() && due.len() < POSITIONS_FORGOTTEN_PER_SCAN {
                    due.push((group.clone(), name.clone()));
                }
            }
        }
        if due.is_empty() {
            self.inner.idle_groups_scanned.lock().expect("idle group scans").1 = false;
            return;
        }
        let node = self.clone();
        self.spawn(async move {
            for (group, name) in due {
                let command = PartitionCommand::ForgetIdleGroup { group: name.to_string(), idle_ms: retention };
                let proposed = node.propose(&group, Command::Partition(command));
                match tokio::time::timeout(DUTY_PROPOSAL_TIMEOUT, proposed).await {
                    Ok(Ok(outcome)) => tracing::debug!(%group, %name, ?outcome, "forgot a forgotten group's position"),
                    Ok(Err(error)) => tracing::debug!(%error, %group, %name, "could not forget a position yet"),
                    Err(_) => tracing::debug!(%group, %name, "forgetting a position got no answer in time"),
                }
            }
            node.inner.idle_groups_scanned.lock().expect("idle group scans").1 = false;
        });
    }
}
