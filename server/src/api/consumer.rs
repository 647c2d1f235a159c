//! The consumer-group half of the API: join, heartbeat, leave (on the
//! coordinator, the metadata leader), poll and ack (on the partition's
//! leader).
//!
//! The first poll of a generation claims the partition in its Raft group
//! (the G5 fence); every later poll and ack is checked against the claim
//! this leader has applied, so a member of an older generation is told it
//! was fenced (`ABORTED`) as soon as a newer one has claimed.

use std::time::Duration;

use keel_core::coordinator::{HeartbeatError, HeartbeatReply};
use keel_core::metadata::{MetadataCommand, MetadataOutcome};
use keel_core::partition::{PartitionCommand, PartitionOutcome};
use keel_core::{Generation, GroupName, MemberId, Offset, TopicName, TopicPartition};
use keel_proto::v1 as pb;
use tonic::Status;

use super::errors::{invalid_name, with_leader};
use super::service::{from_record, KeelService};
use crate::node::Cursor;

/// Longest a poll waits for records.
const POLL_WAIT_MS_MAX: u64 = 30_000;
// Waits and deadlines here are durations on the runtime's monotonic clock
// (madsim's simulated one under simulation), deliberately not the node's
// `Clock`: a skewed or jumping wall clock must not stretch or cut a long
// poll. The `Clock` is for timestamps that enter commands and for session
// expiry.

/// How often a waiting poll looks again.
const POLL_RECHECK: Duration = Duration::from_millis(10);

impl KeelService {
    /// Refuse unless this broker coordinates groups (leads the metadata).
    async fn ensure_coordinator(&self) -> Result<(), Status> {
        if self.node.is_metadata_leader().await {
            return Ok(());
        }
        let leader = self.node.metadata_leader().await;
        let message = format!("broker {} is not the group coordinator (the metadata leader)", self.node.id());
        Err(match leader {
            Some((id, address)) => with_leader(Status::failed_precondition(message), id, &address),
            None => Status::unavailable(format!("{message}; no leader is known yet, retry shortly")),
        })
    }

    pub(super) async fn join_group_request(
        &self,
        request: pb::JoinGroupRequest,
    ) -> Result<pb::JoinGroupResponse, Status> {
        GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        MemberId::new(request.member.as_str()).map_err(invalid_name)?;
        self.ensure_coordinator().await?;
        // Subscribing to a topic that does not exist is almost always a typo:
        // refuse it here (the coordinator's metadata is authoritative).
        let metadata = self.node.metadata();
        for topic in &request.topics {
            let name = TopicName::new(topic.as_str()).map_err(invalid_name)?;
            if metadata.topic(&name).is_none() {
                return Err(Status::not_found(format!(
                    "topic {name} does not exist: create it first, or subscribe to existing topics"
                )));
            }
        }
        let command = MetadataCommand::JoinGroup {
            group: request.group,
            member: request.member,
            topics: request.topics,
            session_timeout_ms: request.session_timeout_ms,
            assignor: Default::default(),
        };
        match self.propose_metadata(command).await? {
            MetadataOutcome::Joined { generation, partitions, .. } => {
                self.node.sync_sessions();
                let partitions = partitions
                    .into_iter()
                    .map(|p| pb::TopicPartition { topic: p.topic.to_string(), partition: p.partition.0 })
                    .collect();
                Ok(pb::JoinGroupResponse { generation: generation.0, partitions })
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn heartbeat_request(
        &self,
        request: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, Status> {
        let group = GroupName::new(request.group).map_err(invalid_name)?;
        let member = MemberId::new(request.member).map_err(invalid_name)?;
        self.ensure_coordinator().await?;
        match self.node.heartbeat(&group, &member, Generation(request.generation)) {
            Ok(HeartbeatReply::Current { generation }) => {
                Ok(pb::HeartbeatResponse { generation: generation.0, rebalance: false })
            }
            Ok(HeartbeatReply::RebalanceRequired { generation }) => {
                Ok(pb::HeartbeatResponse { generation: generation.0, rebalance: true })
            }
            Err(error @ (HeartbeatError::UnknownGroup { .. } | HeartbeatError::UnknownMember { .. })) => {
                Err(Status::not_found(error.to_string()))
            }
        }
    }

    pub(super) async fn leave_group_request(
        &self,
        request: pb::LeaveGroupRequest,
    ) -> Result<pb::LeaveGroupResponse, Status> {
        self.ensure_coordinator().await?;
        self.propose_metadata(MetadataCommand::LeaveGroup { group: request.group, member: request.member }).await?;
        self.node.sync_sessions();
        Ok(pb::LeaveGroupResponse {})
    }

    /// Confirm leadership of a partition's group with a quorum and wait
    /// until this replica has applied up to the read index.
    async fn confirm_leadership(&self, partition: &TopicPartition) -> Result<(), Status> {
        let group = self.node.partition_group(partition).ok_or_else(|| self.hosted_elsewhere(partition))?;
        let raft = self.node.raft(&group).ok_or_else(|| self.hosted_elsewhere(partition))?;
        let (read, _) = raft.get_read_log_id().await.map_err(|error| {
            Status::unavailable(format!(
                "broker {} could not confirm it leads {partition}: {error}; retry",
                self.node.id()
            ))
        })?;
        let read = read.map_or(0, |log_id| log_id.index);
        // Polls the metrics rather than waiting on them: a second waiter on
        // openraft's metrics channel breaks determinism in simulation.
        for _ in 0..1_000 {
            if raft.metrics().borrow().last_applied.map_or(0, |log_id| log_id.index) >= read {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(Status::unavailable(format!("{partition} has not applied its committed entries yet; retry")))
    }

    /// Fenced unless this leader's applied claim is the member's own.
    fn check_claim(
        &self,
        group: &GroupName,
        member: &MemberId,
        generation: Generation,
        partition: &TopicPartition,
    ) -> Result<(), Status> {
        let Some(state) = self.node.partition(partition) else { return Err(self.hosted_elsewhere(partition)) };
        // Only the leader serves a claim: a broker that lost leadership may
        // not have applied a newer generation's claim yet.
        let group_id = self.node.partition_group(partition);
        let leader =
            group_id.as_ref().and_then(|g| self.node.raft(g)).and_then(|r| r.metrics().borrow().current_leader);
        if leader != Some(self.node.id()) {
            let address = leader
                .and_then(|id| self.node.metadata().brokers().get(&keel_core::BrokerId(id)).map(|b| b.address.clone()));
            return Err(super::errors::not_leader(crate::node::ProposeError::NotLeader {
                group: group_id.unwrap_or(crate::group::GroupId::Metadata),
                leader,
                address,
            }));
        }
        match state.groups().get(group).and_then(|g| g.claim.as_ref()) {
            Some(claim) if claim.generation == generation && claim.member == *member => Ok(()),
            Some(claim) => Err(Status::aborted(format!(
                "group {group} generation {generation} is fenced on {partition}: generation {} member {} holds it; rejoin the group",
                claim.generation, claim.member
            ))),
            None => Err(Status::aborted(format!("group {group} has no claim on {partition}; poll again"))),
        }
    }

    pub(super) async fn poll_request(&self, request: pb::PollRequest) -> Result<pb::PollResponse, Status> {
        let group = GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        let member = MemberId::new(request.member.as_str()).map_err(invalid_name)?;
        let partition = self.partition(&request.topic, request.partition).await?;
        let generation = Generation(request.generation);
        let claimed =
            self.node.cursor(&group, &partition).is_some_and(|c| c.generation == generation && c.member == member);
        if !claimed {
            // The first poll of a generation claims the partition (G5).
            let command =
                PartitionCommand::Claim { group: request.group.clone(), member: request.member.clone(), generation };
            match self.propose_partition(&partition, command).await? {
                PartitionOutcome::Claimed { .. } => {
                    self.node.set_cursor(&group, &partition, Cursor { generation, member: member.clone() })
                }
                other => return Err(Status::internal(format!("unexpected outcome {other:?}"))),
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(request.max_wait_ms.min(POLL_WAIT_MS_MAX));
        let max_bytes = if request.max_bytes == 0 { u64::MAX } else { request.max_bytes };
        loop {
            self.check_claim(&group, &member, generation, &partition)?;
            if self.node.cursor(&group, &partition).is_none() {
                return Err(Status::aborted("the claim moved; poll again"));
            }
            let read = self
                .node
                .read_partition(&partition, |state, log| {
                    // The member says where its session is; without that,
                    // read from the committed position. Either way a reply
                    // lost on the way is read again, never skipped.
                    let next = request.offset.map_or_else(|| state.group_position(&group), Offset);
                    let from = next.max(state.log_start()).min(state.high_watermark());
                    (
                        state.read(log, from, request.max_records, max_bytes).map_err(|e| e.to_string()),
                        state.high_watermark(),
                    )
                })
                .ok_or_else(|| self.hosted_elsewhere(&partition))?;
            let (records, high_watermark) = match read {
                (Ok(records), high_watermark) => (records, high_watermark),
                (Err(message), _) => return Err(Status::out_of_range(message)),
            };
            if !records.is_empty() || tokio::time::Instant::now() >= deadline {
                if !records.is_empty() {
                    // Confirm with a quorum that this broker still leads and
                    // has applied everything committed (a read index); then
                    // the claim it checks is current, and a deposed leader
                    // cannot hand records to a fenced generation (G5).
                    self.confirm_leadership(&partition).await?;
                    self.check_claim(&group, &member, generation, &partition)?;
                }
                self.node.metrics().polled(records.len() as u64);
                return Ok(pb::PollResponse {
                    records: records.into_iter().map(from_record).collect(),
                    high_watermark: high_watermark.0,
                });
            }
            tokio::time::sleep(POLL_RECHECK).await;
        }
    }

    pub(super) async fn ack_request(&self, request: pb::AckRequest) -> Result<pb::AckResponse, Status> {
        GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        MemberId::new(request.member.as_str()).map_err(invalid_name)?;
        let partition = self.partition(&request.topic, request.partition).await?;
        let command = PartitionCommand::Commit {
            group: request.group,
            member: request.member,
            generation: Generation(request.generation),
            offset: Offset(request.offset),
        };
        match self.propose_partition(&partition, command).await? {
            PartitionOutcome::Committed { position } => {
                self.node.metrics().acked();
                Ok(pb::AckResponse { position: position.0 })
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }
}
