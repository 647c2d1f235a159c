//! Retention: each partition leader proposes `ApplyRetention` with its
//! topic's policy when records are due to go (older than the age limit, or
//! beyond the byte limit), checked once per retention interval. Applying it
//! moves the log start on every replica, and the log entries behind it are
//! deleted (the records live in them: see `storage::records`).
//!
//! The current snapshot keeps the records it covers (a follower may need
//! them), so once the log start has passed them, each replica builds a new
//! snapshot (of state only: cheap) and the disk space goes with it.
//!
//! The decision to remove is the state machine's, on the time the leader
//! stamped on the command and the records' (monotonic) append times, so
//! every replica removes the same records.

use keel_core::metadata::RetentionPolicy;
use keel_core::partition::{PartitionCommand, PartitionOutcome};
use keel_core::{TimestampMs, TopicPartition};

use super::{Node, DUTY_PROPOSAL_TIMEOUT};
use crate::group::GroupId;
use crate::raft::types::{Command, Response};

impl Node {
    /// Propose retention on every partition led here that has records due.
    pub(super) fn enforce_retention(&self) {
        let metadata = self.metadata();
        let now = self.inner.clock.monotonic();
        let interval_ms = self.inner.config.retention_interval.as_millis() as u64;
        // Only partitions whose topic has a retention policy (a broker may
        // host thousands of groups; copying every handle each round cost a
        // tenth of an idle broker's CPU at 10,000 partitions).
        let has_policy = |group: &GroupId| match group {
            GroupId::Partition(partition, topic_id) => metadata.topic(&partition.topic).is_some_and(|t| {
                t.id == *topic_id && (t.retention.max_age_ms.is_some() || t.retention.max_bytes.is_some())
            }),
            GroupId::Metadata => false,
        };
        let hosted: Vec<(GroupId, super::GroupHandle)> = {
            let groups = self.inner.groups.lock().expect("groups");
            groups.iter().filter(|(group, _)| has_policy(group)).map(|(g, h)| (g.clone(), h.clone())).collect()
        };
        for (group, handle) in hosted {
            let GroupId::Partition(partition, topic_id) = &group else { continue };
            let Some(topic) = metadata.topic(&partition.topic).filter(|t| t.id == *topic_id) else { continue };
            let policy = topic.retention;
            if policy.max_age_ms.is_none() && policy.max_bytes.is_none() {
                continue;
            }
            {
                let mut checked = self.inner.retention_checked.lock().expect("retention checks");
                if checked.get(&group).is_some_and(|at| now.0.saturating_sub(at.0) < interval_ms) {
                    continue;
                }
                checked.insert(group.clone(), now);
            }
            // On every replica: once the log start has passed what the
            // current snapshot keeps (or there is none yet), a new snapshot
            // lets the disk go. Without it nothing is purged before
            // openraft's own snapshot, every 5,000 entries: with coalesced
            // entries that can be gigabytes beyond the retention limit.
            let log_start = self.partition(partition).map(|p| p.log_start());
            let due =
                log_start.is_some_and(|start| handle.state_machine.snapshot_due_for_retention(start).unwrap_or(false));
            if due {
                let raft = handle.raft.clone();
                self.spawn(async move {
                    let _ = raft.trigger().snapshot().await;
                });
            }
            if handle.raft.metrics().borrow().current_leader != Some(self.id()) {
                continue;
            }
            if !self.retention_due(partition, policy, self.inner.clock.now()) {
                continue;
            }
            if !self.inner.retention_proposed.lock().expect("retention proposals").insert(group.clone()) {
                continue;
            }
            let node = self.clone();
            self.spawn(async move {
                node.apply_retention(group.clone(), policy).await;
                node.inner.retention_proposed.lock().expect("retention proposals").remove(&group);
            });
        }
    }

    /// Whether this replica holds records `policy` removes at `now`.
    fn retention_due(&self, partition: &TopicPartition, policy: RetentionPolicy, now: TimestampMs) -> bool {
        let first = self.read_partition(partition, |state, log| {
            let too_big = policy.max_bytes.is_some_and(|max| state.log_bytes() > max);
            let oldest = state.read(log, state.log_start(), 1, u64::MAX).ok().and_then(|r| r.into_iter().next());
            (too_big, oldest.map(|r| r.append_time_ms))
        });
        let Some((too_big, oldest)) = first else { return false };
        let too_old = policy.max_age_ms.zip(oldest).is_some_and(|(age, appended)| appended.plus_ms(age) <= now);
        too_big || too_old
    }

    async fn apply_retention(&self, group: GroupId, policy: RetentionPolicy) {
        let command = Command::Partition(PartitionCommand::ApplyRetention { policy });
        match tokio::time::timeout(DUTY_PROPOSAL_TIMEOUT, self.propose(&group, command)).await {
            Ok(Ok(Response::Partition(Ok(PartitionOutcome::Retained {
                log_start,
                removed_records,
                groups_behind,
            })))) => {
                tracing::info!(%group, %log_start, removed_records, "retention moved the log start");
                for (consumer_group, position) in groups_behind {
                    tracing::warn!(
                        %group, %consumer_group, %position, %log_start,
                        "a consumer group's position fell behind the log start; it resumes from the log start"
                    );
                }
                // One apply removes a bounded number of records: if it
                // removed that many, check again at the next duty round.
                let per_apply = u64::from(self.inner.config.limits.retention_records_per_apply_max);
                if removed_records >= per_apply {
                    self.inner.retention_checked.lock().expect("retention checks").remove(&group);
                }
            }
            Ok(Ok(other)) => tracing::debug!(%group, ?other, "retention was not applied"),
            Ok(Err(error)) => tracing::debug!(%group, %error, "could not apply retention yet"),
            Err(_) => tracing::debug!(%group, "retention got no answer in time; retrying next interval"),
        }
    }
}
