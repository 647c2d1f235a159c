//! The consumer-group half of the API: join, heartbeat, leave (on the
//! coordinator, the metadata leader), poll and ack (on the partition's
//! leader).
//!
//! The first poll of a generation claims the partition in its Raft group
//! (the G5 fence); every later poll and ack is checked against the claim
//! this leader has applied, so a member of an older generation is told it
//! was fenced (`ABORTED`) as soon as a newer one has claimed.
//!
//! A client's claims are checked, never trusted: before a Claim or Commit
//! is proposed, the member, its member epoch, its generation and its
//! ownership of the partition are checked against this broker's replica of
//! the coordinator's metadata ([`check_member`]). A generation above that
//! replica's is either not applied here yet or forged: the client is told to
//! retry, and no client can raise a group's generation.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use futures_util::StreamExt;
use keel_core::assignor::AssignorKind;
use keel_core::coordinator::{HeartbeatError, HeartbeatReply};
use keel_core::metadata::{MetadataCommand, MetadataOutcome, MetadataState};
use keel_core::partition::{PartitionCommand, PartitionOutcome, PartitionState};
use keel_core::record::StoredRecord;
use keel_core::{Generation, GroupName, MemberId, Offset, TopicName, TopicPartition};
use keel_proto::{v1 as pb, POLL_PARTITIONS_MAX};
use tokio::sync::Notify;
use tonic::Status;

use super::errors::{invalid_name, with_leader};
use super::service::{from_record, KeelService};
use crate::group::GroupId;
use crate::node::Cursor;

/// Longest a poll waits for records.
const POLL_WAIT_MS_MAX: u64 = 30_000;
// Waits and deadlines here are durations on the runtime's monotonic clock
// (madsim's simulated one under simulation), deliberately not the node's
// `Clock`: a skewed or jumping wall clock must not stretch or cut a long
// poll. The `Clock` is for timestamps that enter commands and for session
// expiry.

/// Most partitions one poll claims at once (each claim is a Raft write in
/// the partition's group).
const CLAIMS_IN_FLIGHT_MAX: usize = 16;

/// Who polls: a member of a group in one join.
struct Poller {
    group: GroupName,
    member: MemberId,
    member_epoch: u64,
    generation: Generation,
}

impl Poller {
    fn new(group: &str, member: &str, generation: u64, member_epoch: u64) -> Result<Poller, Status> {
        Ok(Poller {
            group: GroupName::new(group).map_err(invalid_name)?,
            member: MemberId::new(member).map_err(invalid_name)?,
            member_epoch,
            generation: Generation(generation),
        })
    }
}

/// A partition a poll has claimed and waits on.
struct Polling {
    partition: TopicPartition,
    group_id: GroupId,
    /// Where the member's session is (see `PollRequest.offset`).
    offset: Option<u64>,
    /// Woken when the partition applies a batch.
    applied: Arc<Notify>,
}

/// One partition's answer: records and the high watermark, or a refusal.
type Polled = Result<(Vec<StoredRecord>, Offset), Status>;

/// Refuse a PollPartitions request that names too many partitions or one
/// twice.
fn check_partition_list(partitions: &[pb::PollPartition]) -> Result<(), Status> {
    if partitions.len() > POLL_PARTITIONS_MAX {
        return Err(Status::invalid_argument(format!(
            "a poll names at most {POLL_PARTITIONS_MAX} partitions, this one {}: split it",
            partitions.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for wanted in partitions {
        if !seen.insert((wanted.topic.as_str(), wanted.partition)) {
            return Err(Status::invalid_argument(format!(
                "partition {}/{} is named twice in one poll: name each partition once",
                wanted.topic, wanted.partition
            )));
        }
    }
    Ok(())
}

/// Whether a partition's refusal is one to hold while the poll waits on
/// its other partitions: the partition is between leaders or this broker is
/// behind, and may serve before the deadline. Any other refusal is answered
/// at once, so that the member reroutes or rejoins.
fn passing(refusal: &Status) -> bool {
    refusal.code() == tonic::Code::Unavailable
}

/// Whether polls are fenced (G5): always, but for the simulation's planted
/// bug that takes the poll's fence away.
fn poll_fenced() -> bool {
    #[cfg(madsim)]
    return !keel_core::planted::is_planted(keel_core::planted::Bug::PollWithoutFence);
    #[cfg(not(madsim))]
    true
}

/// Whether `member`, joined with `member_epoch`, may poll or ack
/// `partition` in `generation`, as `metadata` (this broker's replica of the
/// coordinator's state) knows the group.
pub(super) fn check_member(
    metadata: &MetadataState,
    broker: u64,
    group: &GroupName,
    member: &MemberId,
    member_epoch: u64,
    generation: Generation,
    partition: &TopicPartition,
) -> Result<(), Status> {
    let Some(info) = metadata.group(group) else {
        return Err(Status::unavailable(format!(
            "group {group} is not known on broker {broker} yet: retry shortly, or join the group first"
        )));
    };
    if generation > info.generation {
        return Err(Status::unavailable(format!(
            "group {group} is at generation {} on broker {broker}, behind the {generation} you sent: retry shortly \
             (generations come from JoinGroup; a client cannot choose one)",
            info.generation
        )));
    }
    if generation < info.generation {
        return Err(Status::aborted(format!(
            "group {group} generation {generation} is fenced: the group is at generation {}; rejoin the group",
            info.generation
        )));
    }
    let Some(joined) = info.members.get(member) else {
        return Err(Status::aborted(format!(
            "member {member} is not in group {group} (its session may have expired): rejoin the group"
        )));
    };
    if member_epoch > joined.member_epoch {
        return Err(Status::unavailable(format!(
            "member {member} of group {group} joined with epoch {member_epoch}, newer than broker {broker} knows: \
             retry shortly"
        )));
    }
    if member_epoch < joined.member_epoch {
        return Err(older_epoch(group, member, joined.member_epoch, member_epoch));
    }
    match info.assignment.owner(partition) {
        Some(owner) if owner == member => Ok(()),
        Some(owner) => Err(Status::aborted(format!(
            "{partition} is assigned to member {owner} of group {group} in generation {generation}, not to {member}: \
             rejoin the group and poll the partitions it assigns you"
        ))),
        None => Err(Status::aborted(format!(
            "group {group} assigns {partition} to no member in generation {generation}: rejoin the group"
        ))),
    }
}

/// The assignor a join names ([`pb::Assignor::Unspecified`] is handled
/// before: it means the group's own).
pub(super) fn assignor_kind(named: pb::Assignor) -> AssignorKind {
    match named {
        pb::Assignor::Unspecified | pb::Assignor::Sticky => AssignorKind::StickyBalanced,
        pb::Assignor::Range => AssignorKind::Range,
        pb::Assignor::RoundRobin => AssignorKind::RoundRobin,
    }
}

/// How a group's assignor is named on the wire.
pub(super) fn assignor_name(kind: AssignorKind) -> pb::Assignor {
    match kind {
        AssignorKind::StickyBalanced => pb::Assignor::Sticky,
        AssignorKind::Range => pb::Assignor::Range,
        AssignorKind::RoundRobin => pb::Assignor::RoundRobin,
    }
}

/// The refusal of a process holding member epoch `given` of `member`, after
/// a later join (epoch `current`) of the same member id.
fn older_epoch(group: &GroupName, member: &MemberId, current: u64, given: u64) -> Status {
    super::errors::fenced_member(&HeartbeatError::Fenced {
        group: group.clone(),
        member: member.clone(),
        current,
        given,
    })
}

/// How often a waiting poll looks again even if nothing was applied. A
/// poll wakes when its partition or the metadata applies a batch (new
/// records, a claim, a member fenced or expired, and on a deposed leader the
/// new leader's first entry); this catches what changes without one (a
/// leader cut off from the new one). Each look costs every waiting member a
/// check per partition, so this is not short.
const POLL_RECHECK: Duration = Duration::from_secs(1);

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
        // A subscription none of whose topics exists is almost always a
        // typo: refuse it (the coordinator's metadata is authoritative). A
        // subscribed topic that was deleted is not: the group goes on with
        // the topics that exist, and picks the topic up if it is created
        // again (as Kafka does).
        let metadata = self.node.metadata();
        let mut names = Vec::with_capacity(request.topics.len());
        for topic in &request.topics {
            names.push(TopicName::new(topic.as_str()).map_err(invalid_name)?);
        }
        if !names.is_empty() && names.iter().all(|name| metadata.topic(name).is_none()) {
            let names: Vec<String> = names.iter().map(ToString::to_string).collect();
            return Err(Status::not_found(format!(
                "no subscribed topic exists ({} does not exist): create one first, or subscribe to existing topics",
                names.join(", ")
            )));
        }
        // Unspecified: the group's own, decided when the join applies.
        let assignor = match pb::Assignor::try_from(request.assignor) {
            Ok(pb::Assignor::Unspecified) => None,
            Ok(named) => Some(assignor_kind(named)),
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown assignor {}: use sticky, range or round-robin (or leave it unset for the group's own)",
                    request.assignor
                )))
            }
        };
        let command = MetadataCommand::JoinGroup {
            group: request.group,
            member: request.member,
            topics: request.topics,
            session_timeout_ms: request.session_timeout_ms,
            assignor,
        };
        match self.propose_metadata(command).await? {
            MetadataOutcome::Joined { generation, member_epoch, partitions } => {
                self.node.sync_sessions();
                let metadata = self.node.metadata();
                let partitions = partitions
                    .into_iter()
                    .map(|p| pb::TopicPartition {
                        topic_id: metadata.topic(&p.topic).map_or(0, |t| t.id),
                        topic: p.topic.to_string(),
                        partition: p.partition.0,
                    })
                    .collect();
                Ok(pb::JoinGroupResponse { generation: generation.0, partitions, member_epoch })
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
        match self.node.heartbeat(&group, &member, request.member_epoch, Generation(request.generation)) {
            Ok(HeartbeatReply::Current { generation }) => {
                Ok(pb::HeartbeatResponse { generation: generation.0, rebalance: false })
            }
            Ok(HeartbeatReply::RebalanceRequired { generation }) => {
                Ok(pb::HeartbeatResponse { generation: generation.0, rebalance: true })
            }
            Err(error @ (HeartbeatError::UnknownGroup { .. } | HeartbeatError::UnknownMember { .. })) => {
                Err(Status::not_found(error.to_string()))
            }
            Err(error @ HeartbeatError::Fenced { .. }) => Err(super::errors::fenced_member(&error)),
            Err(error @ HeartbeatError::EpochAhead { .. }) => Err(Status::unavailable(error.to_string())),
        }
    }

    pub(super) async fn leave_group_request(
        &self,
        request: pb::LeaveGroupRequest,
    ) -> Result<pb::LeaveGroupResponse, Status> {
        let group = GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        let member = MemberId::new(request.member.as_str()).map_err(invalid_name)?;
        self.ensure_coordinator().await?;
        // A zombie (an older join of this member id) may not take the
        // current membership with it.
        let metadata = self.node.metadata();
        if let Some(joined) = metadata.group(&group).and_then(|g| g.members.get(&member)) {
            if request.member_epoch < joined.member_epoch {
                return Err(older_epoch(&group, &member, joined.member_epoch, request.member_epoch));
            }
            // No join handed out a later epoch: the request is forged, and
            // must not take a member away from the process that holds it.
            if request.member_epoch > joined.member_epoch {
                return Err(Status::failed_precondition(format!(
                    "member {member} of group {group} holds epoch {}, not {}: only the process that joined may \
                     leave",
                    joined.member_epoch, request.member_epoch
                )));
            }
        }
        self.propose_metadata(MetadataCommand::LeaveGroup { group: request.group, member: request.member }).await?;
        self.node.sync_sessions();
        Ok(pb::LeaveGroupResponse {})
    }

    /// Confirm leadership of a partition's group with a quorum and wait
    /// until this replica has applied up to the read index.
    pub(super) async fn confirm_leadership(&self, partition: &TopicPartition) -> Result<(), Status> {
        let group = self.node.partition_group(partition).ok_or_else(|| self.hosted_elsewhere(partition))?;
        let Some(raft) = self.node.raft(&group) else { return Err(self.hosted_elsewhere(partition)) };
        // A follower names the leader it knows: the read index would only
        // fail here, and the client retry this broker blind.
        let leader = raft.metrics().borrow().current_leader;
        if leader.is_some_and(|leader| leader != self.node.id()) {
            return Err(self.led_elsewhere(group, leader));
        }
        self.applied_to_read_index(&group, &partition.to_string()).await
    }

    /// A refusal from a replica that does not lead `group`, naming the
    /// leader it knows by its client address (from the metadata).
    fn led_elsewhere(&self, group: crate::group::GroupId, leader: Option<crate::raft::types::NodeId>) -> Status {
        super::errors::not_leader(self.node.not_leader(group, leader))
    }

    /// Confirm with a quorum that this broker leads `group` (named `what` in
    /// errors), and wait until it has applied everything committed before
    /// (a read index): what it then reads is current.
    pub(super) async fn applied_to_read_index(&self, group: &GroupId, what: &str) -> Result<(), Status> {
        let raft = self
            .node
            .raft(group)
            .ok_or_else(|| Status::unavailable(format!("{what} is not running on broker {}; retry", self.node.id())))?;
        let (read, _) = raft.get_read_log_id().await.map_err(|error| {
            Status::unavailable(format!("broker {} could not confirm it leads {what}: {error}; retry", self.node.id()))
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
        Err(Status::unavailable(format!("{what} has not applied its committed entries yet; retry")))
    }

    /// [`check_member`] against this broker's metadata replica.
    fn check_member_here(
        &self,
        group: &GroupName,
        member: &MemberId,
        member_epoch: u64,
        generation: Generation,
        partition: &TopicPartition,
    ) -> Result<(), Status> {
        let metadata = self.node.metadata();
        check_member(&metadata, self.node.id(), group, member, member_epoch, generation, partition)
    }

    /// Fenced unless this leader's applied claim is the member's own.
    fn check_claim(
        &self,
        group: &GroupName,
        member: &MemberId,
        member_epoch: u64,
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
            return Err(self.led_elsewhere(group_id.unwrap_or(crate::group::GroupId::Metadata), leader));
        }
        match state.groups().get(group).and_then(|g| g.claim.as_ref()) {
            Some(claim) if claim.generation == generation && claim.member == *member => {
                match claim.member_epoch.cmp(&member_epoch) {
                    std::cmp::Ordering::Equal => Ok(()),
                    std::cmp::Ordering::Greater => Err(older_epoch(group, member, claim.member_epoch, member_epoch)),
                    std::cmp::Ordering::Less => {
                        Err(Status::aborted(format!("group {group} has no claim of yours on {partition}; poll again")))
                    }
                }
            }
            Some(claim) => Err(Status::aborted(format!(
                "group {group} generation {generation} is fenced on {partition}: generation {} member {} holds it; rejoin the group",
                claim.generation, claim.member
            ))),
            None => Err(Status::aborted(format!("group {group} has no claim on {partition}; poll again"))),
        }
    }

    pub(super) async fn poll_request(&self, request: pb::PollRequest) -> Result<pb::PollResponse, Status> {
        let poller = Poller::new(&request.group, &request.member, request.generation, request.member_epoch)?;
        let wanted = pb::PollPartition {
            topic: request.topic,
            partition: request.partition,
            offset: request.offset,
            topic_id: request.topic_id,
        };
        let budget = (request.max_records, request.max_bytes);
        let mut polled = self.poll_partitions(&poller, vec![wanted], budget, request.max_wait_ms).await;
        let (records, high_watermark) = polled.pop().expect("one partition asked for, one answered")?;
        Ok(pb::PollResponse {
            records: records.into_iter().map(from_record).collect(),
            high_watermark: high_watermark.0,
        })
    }

    pub(super) async fn poll_partitions_request(
        &self,
        request: pb::PollPartitionsRequest,
    ) -> Result<pb::PollPartitionsResponse, Status> {
        let poller = Poller::new(&request.group, &request.member, request.generation, request.member_epoch)?;
        check_partition_list(&request.partitions)?;
        let names: Vec<(String, u32)> = request.partitions.iter().map(|p| (p.topic.clone(), p.partition)).collect();
        let budget = (request.max_records, request.max_bytes);
        let polled = self.poll_partitions(&poller, request.partitions, budget, request.max_wait_ms).await;
        let partitions = names
            .into_iter()
            .zip(polled)
            .map(|((topic, partition), polled)| match polled {
                Ok((records, high_watermark)) => pb::PolledPartition {
                    topic,
                    partition,
                    records: records.into_iter().map(from_record).collect(),
                    high_watermark: high_watermark.0,
                    refused: None,
                },
                Err(status) => pb::PolledPartition {
                    topic,
                    partition,
                    records: Vec::new(),
                    high_watermark: 0,
                    refused: Some(pb::Refusal::from(&status)),
                },
            })
            .collect();
        Ok(pb::PollPartitionsResponse { partitions })
    }

    /// Poll `wanted` (partitions this broker should lead) for `poller`:
    /// claim what this generation has not claimed yet, then wait until one
    /// of them has records, one is refused for good (not [`passing`]), or
    /// `max_wait_ms` passes. The
    /// record and byte budget is shared, filled in the order asked. One
    /// answer per partition, in that order.
    async fn poll_partitions(
        &self,
        poller: &Poller,
        wanted: Vec<pb::PollPartition>,
        (max_records, max_bytes): (u32, u64),
        max_wait_ms: u64,
    ) -> Vec<Polled> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(max_wait_ms.min(POLL_WAIT_MS_MAX));
        let (max_records, max_bytes) = super::service::read_budget(max_records, max_bytes);
        // The first poll of a generation claims each partition, a Raft write
        // in its group: a bounded number at once, so that a member of
        // thousands of partitions does not wake thousands of quiet groups in
        // one instant.
        let started: Vec<_> = futures_util::stream::iter(wanted)
            .map(|wanted| self.start_polling(poller, wanted))
            .buffered(CLAIMS_IN_FLIGHT_MAX)
            .collect()
            .await;
        let mut answers: Vec<Option<Polled>> = Vec::with_capacity(started.len());
        let mut polling = Vec::with_capacity(started.len());
        for (slot, started) in started.into_iter().enumerate() {
            match started {
                Ok(partition) => {
                    polling.push((slot, partition));
                    answers.push(None);
                }
                Err(status) => answers.push(Some(Err(status))),
            }
        }
        let refused_at_start = answers.iter().flatten().any(|answer| answer.as_ref().is_err_and(|s| !passing(s)));
        let metadata_applied = self.node.applied_waiters(&GroupId::Metadata).unwrap_or_default();
        while !polling.is_empty() {
            // Armed before looking, so that a batch applied meanwhile wakes
            // the wait below: new records, a claim, a member fenced or
            // expired (the metadata).
            let mut records_or_claim: Vec<_> =
                polling.iter().map(|(_, partition)| Box::pin(partition.applied.notified())).collect();
            for notified in &mut records_or_claim {
                notified.as_mut().enable();
            }
            let mut membership = std::pin::pin!(metadata_applied.notified());
            membership.as_mut().enable();
            let (mut records_left, mut bytes_left) = (max_records, max_bytes);
            let mut reads = Vec::with_capacity(polling.len());
            for (_, partition) in &polling {
                let read = self.look(poller, partition, records_left, bytes_left);
                if let Ok((records, _)) = &read {
                    records_left = records_left.saturating_sub(records.len() as u32);
                    let bytes: u64 = records.iter().map(|r| r.record.size_bytes()).sum();
                    bytes_left = bytes_left.saturating_sub(bytes);
                }
                reads.push(read);
            }
            // A passing refusal is held while other partitions may still
            // serve; with none left to wait on, it is answered.
            let answer_now = refused_at_start
                || reads.iter().all(Result::is_err)
                || reads.iter().any(|read| match read {
                    Ok((records, _)) => !records.is_empty(),
                    Err(refusal) => !passing(refusal),
                });
            // A stopping broker answers what it has, so that its server's
            // graceful shutdown need not wait out the poll.
            if answer_now || tokio::time::Instant::now() >= deadline || self.node.is_stopping() {
                let confirmed =
                    polling.iter().zip(reads).map(|((_, partition), read)| self.confirm(poller, partition, read));
                for ((slot, _), answer) in polling.iter().zip(join_all(confirmed).await) {
                    answers[*slot] = Some(answer);
                }
                break;
            }
            let recheck = tokio::time::Instant::now() + POLL_RECHECK;
            tokio::select! {
                biased;
                _ = select_all(records_or_claim) => {}
                _ = &mut membership => {}
                _ = self.node.stopping() => {}
                _ = tokio::time::sleep_until(recheck.min(deadline)) => {}
            }
        }
        let answers: Vec<Polled> =
            answers.into_iter().map(|answer| answer.expect("every partition answered")).collect();
        let records = answers.iter().filter_map(|answer| answer.as_ref().ok()).map(|(records, _)| records.len() as u64);
        self.node.metrics().polled(records.sum());
        answers
    }

    /// Check `poller` may poll `wanted` here and, on the first poll of its
    /// generation, claim the partition (G5).
    async fn start_polling(&self, poller: &Poller, wanted: pb::PollPartition) -> Result<Polling, Status> {
        let (partition, group_id) = self.partition_of(&wanted.topic, wanted.partition, wanted.topic_id).await?;
        let Poller { group, member, member_epoch, generation } = poller;
        if poll_fenced() {
            self.check_member_here(group, member, *member_epoch, *generation, &partition)?;
        }
        let ours = |c: &Cursor| c.generation == *generation && c.member == *member && c.member_epoch == *member_epoch;
        let mut claimed = self.node.cursor(&group_id, group).is_some_and(|c| ours(&c));
        if !claimed && self.claim_applied(&group_id, group).is_some_and(|c| ours(&c)) {
            // Claimed before, through an earlier leader: the claim this
            // replica applied was committed, so it already fences every
            // older generation. Writing it again would wake the partition's
            // group for nothing, and after a failover that is a write in
            // every group the dead broker led (thousands at once, beside
            // their elections). A newer claim applied later is still
            // caught by `look` and, before records go out, by `confirm`
            // after its read index.
            let cursor = Cursor { generation: *generation, member: member.clone(), member_epoch: *member_epoch };
            self.node.set_cursor(&group_id, group, cursor);
            claimed = true;
        }
        if !claimed {
            let command = PartitionCommand::Claim {
                group: group.to_string(),
                member: member.to_string(),
                generation: *generation,
                member_epoch: *member_epoch,
            };
            match self.propose_partition_in(&group_id, &partition, command).await {
                Ok(PartitionOutcome::Claimed { .. }) => {
                    self.node.metrics().claimed();
                    let cursor =
                        Cursor { generation: *generation, member: member.clone(), member_epoch: *member_epoch };
                    self.node.set_cursor(&group_id, group, cursor)
                }
                Ok(other) => return Err(Status::internal(format!("unexpected outcome {other:?}"))),
                // The planted bug takes a refused claim as made.
                Err(_) if !poll_fenced() => {}
                Err(status) => return Err(status),
            }
        }
        let applied = self.node.applied_waiters(&group_id).ok_or_else(|| self.hosted_elsewhere(&partition))?;
        Ok(Polling { partition, group_id, offset: wanted.offset, applied })
    }

    /// The claim of `group` that this replica has applied in partition
    /// group `group_id` (committed, so in every later leader's log too).
    /// Read by the group the cursor is set on, not by name: a topic
    /// deleted and created again meanwhile is another group.
    fn claim_applied(&self, group_id: &GroupId, group: &GroupName) -> Option<Cursor> {
        let state = self.node.partition_in(group_id)?;
        let claim = state.groups().get(group)?.claim.as_ref()?;
        Some(Cursor { generation: claim.generation, member: claim.member.clone(), member_epoch: claim.member_epoch })
    }

    /// What `partition` holds for `poller` now, at most `max_records`
    /// records and (but for one record) `max_bytes`, unless its claim or
    /// membership moved.
    fn look(&self, poller: &Poller, polling: &Polling, max_records: u32, max_bytes: u64) -> Polled {
        let Poller { group, member, member_epoch, generation } = poller;
        let partition = &polling.partition;
        if poll_fenced() {
            self.check_claim(group, member, *member_epoch, *generation, partition)?;
            // A member fenced or expired while it waits learns it now, not at
            // the poll's deadline.
            self.check_member_here(group, member, *member_epoch, *generation, partition)?;
            if self.node.cursor(&polling.group_id, group).is_none() {
                return Err(Status::aborted("the claim moved; poll again"));
            }
        }
        // The member says where its session is; without that, read from the
        // committed position. Either way a reply lost on the way is read
        // again, never skipped.
        let from = |state: &PartitionState| {
            let next = polling.offset.map_or_else(|| state.group_position(group), Offset);
            next.max(state.log_start()).min(state.high_watermark())
        };
        // Most looks of an idle member find nothing new: answer those
        // without opening the log.
        let state = self.node.partition(partition).ok_or_else(|| self.hosted_elsewhere(partition))?;
        if max_records == 0 || max_bytes == 0 || from(&state) >= state.high_watermark() {
            return Ok((Vec::new(), state.high_watermark()));
        }
        let read: Result<_, String> = self
            .node
            .read_partition(partition, |state, log| {
                let records = state.read(log, from(state), max_records, max_bytes).map_err(|e| e.to_string())?;
                Ok((records, state.high_watermark()))
            })
            .ok_or_else(|| self.hosted_elsewhere(partition))?;
        read.map_err(Status::out_of_range)
    }

    /// `read`, once this broker has confirmed with a quorum that it still
    /// leads and has applied everything committed (a read index) if it
    /// holds records: then the claim it checks is current, and a deposed
    /// leader cannot hand records to a fenced generation (G5). Also when its
    /// log ends before the member's session: the member takes that for a
    /// new log (the topic created again) and starts its session over, which
    /// a deposed leader that is behind must not make it do (G3).
    async fn confirm(&self, poller: &Poller, polling: &Polling, read: Polled) -> Polled {
        let (records, mut high_watermark) = read?;
        let shorter = polling.offset.is_some_and(|offset| offset > high_watermark.0);
        if !records.is_empty() || shorter {
            let Poller { group, member, member_epoch, generation } = poller;
            let partition = &polling.partition;
            #[cfg(madsim)]
            let confirmed = !keel_core::planted::is_planted(keel_core::planted::Bug::PollWithoutReadIndex);
            #[cfg(not(madsim))]
            let confirmed = true;
            if confirmed {
                self.confirm_leadership(partition).await?;
            }
            if poll_fenced() {
                self.check_claim(group, member, *member_epoch, *generation, partition)?;
                self.check_member_here(group, member, *member_epoch, *generation, partition)?;
            }
            if shorter {
                // Applied up to the read index now: the current end.
                let state = self.node.partition(partition).ok_or_else(|| self.hosted_elsewhere(partition))?;
                high_watermark = state.high_watermark();
            }
        }
        Ok((records, high_watermark))
    }

    pub(super) async fn ack_request(&self, request: pb::AckRequest) -> Result<pb::AckResponse, Status> {
        let group = GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        let member = MemberId::new(request.member.as_str()).map_err(invalid_name)?;
        let (partition, group_id) = self.partition_of(&request.topic, request.partition, request.topic_id).await?;
        let generation = Generation(request.generation);
        // The planted bug takes the whole fence away, the edge's share too,
        // so that the G5 checker is shown to catch a broker without it.
        #[cfg(madsim)]
        let fenced = !keel_core::planted::is_planted(keel_core::planted::Bug::CommitWithoutFence);
        #[cfg(not(madsim))]
        let fenced = true;
        if fenced {
            self.check_member_here(&group, &member, request.member_epoch, generation, &partition)?;
        }
        let command = PartitionCommand::Commit {
            group: request.group,
            member: request.member,
            generation: Generation(request.generation),
            member_epoch: request.member_epoch,
            offset: Offset(request.offset),
        };
        match self.propose_partition_in(&group_id, &partition, command).await? {
            PartitionOutcome::Committed { position } => {
                self.node.metrics().acked();
                Ok(pb::AckResponse { position: position.0 })
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use keel_core::assignor::AssignorKind;
    use keel_core::{BrokerId, Limits, PartitionIndex, TimestampMs};

    use super::*;

    /// Two members of group `g` on a two-partition topic `t`.
    fn two_members() -> MetadataState {
        let mut metadata = MetadataState::new(Limits::default());
        let mut apply = |command| metadata.apply(TimestampMs(0), &command).unwrap();
        apply(MetadataCommand::RegisterBroker {
            broker: BrokerId(1),
            address: "b:1".into(),
            internal_address: "b:2".into(),
        });
        apply(MetadataCommand::CreateTopic {
            topic: "t".into(),
            partitions: 2,
            replication_factor: 1,
            retention: Default::default(),
        });
        for member in ["a", "b"] {
            apply(MetadataCommand::JoinGroup {
                group: "g".into(),
                member: member.into(),
                topics: vec!["t".into()],
                session_timeout_ms: 10_000,
                assignor: Some(AssignorKind::StickyBalanced),
            });
        }
        metadata
    }

    #[test]
    fn a_member_may_poll_only_what_the_coordinator_assigned_it() {
        let metadata = two_members();
        let group = GroupName::new("g").unwrap();
        let info = metadata.group(&group).unwrap();
        let (generation, check) = (info.generation, |member: &str, epoch: u64, generation: Generation, p: u32| {
            let partition = TopicPartition::new(TopicName::new("t").unwrap(), PartitionIndex(p));
            check_member(&metadata, 1, &group, &MemberId::new(member).unwrap(), epoch, generation, &partition)
                .map_err(|status| status.code())
        });
        let epoch = |member: &str| info.members[&MemberId::new(member).unwrap()].member_epoch;
        let owner_of_0 = info.assignment.owner(&TopicPartition::new(TopicName::new("t").unwrap(), PartitionIndex(0)));
        let (owner, other) = if owner_of_0.unwrap().as_str() == "a" { ("a", "b") } else { ("b", "a") };
        assert_eq!(check(owner, epoch(owner), generation, 0), Ok(()));
        // Another member's partition, a forged generation, an older one, an
        // older epoch of the owner, and a stranger.
        assert_eq!(check(other, epoch(other), generation, 0), Err(tonic::Code::Aborted));
        assert_eq!(check(owner, epoch(owner), generation.next(), 0), Err(tonic::Code::Unavailable));
        assert_eq!(check(owner, epoch(owner), Generation(generation.0 - 1), 0), Err(tonic::Code::Aborted));
        assert_eq!(check(owner, epoch(owner) - 1, generation, 0), Err(tonic::Code::FailedPrecondition));
        // An epoch newer than this replica knows: not applied here yet.
        assert_eq!(check(owner, epoch(owner) + 1, generation, 0), Err(tonic::Code::Unavailable));
        assert_eq!(check("stranger", 1, generation, 0), Err(tonic::Code::Aborted));
    }
}
