//! A consumer-group member: join, heartbeat, poll the assigned partitions,
//! ack, rejoin on a rebalance or when fenced, leave.
//!
//! A member keeps one long poll in flight at each broker leading part of its
//! assignment, each waiting the whole poll wait: records on any broker end
//! their poll at once, and an idle member costs each broker one poll per
//! wait, not one per wait and broker.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use keel_proto::v1 as pb;
use tonic::Code;

use crate::client::{hinted_leader, passing, Client, ClientError, Route, FENCED_METADATA};

/// How long a poll that delivered nothing and had a partition refused
/// (an election, a broker behind, a leader hint) pauses before it returns.
const REFUSED_PAUSE: Duration = Duration::from_millis(100);

/// A poll sent to one broker: when it was sent, the partitions asked for,
/// and the answer with the broker that gave it.
type PollAnswer =
    (tokio::time::Instant, Vec<pb::TopicPartition>, Result<(pb::PollPartitionsResponse, String), ClientError>);

/// A poll in flight.
type PollInFlight = Pin<Box<dyn Future<Output = PollAnswer> + Send>>;

/// A poll's task, cancelled when dropped: a rejoin drops the polls of the
/// old join. A task, not a future polled only while `poll()` waits, so
/// that a poll is sent when it is made, whatever the caller does next.
struct PollTask<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for PollTask<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One record as a member receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub topic: String,
    /// The topic's incarnation the record was read from (0: not known):
    /// ack with it ([`Consumer::ack_in`]), so that an offset read before
    /// the topic was deleted and created again never moves the new log's
    /// position.
    pub topic_id: u64,
    pub partition: u32,
    pub record: pb::StoredRecord,
}

/// A member of a consumer group. Not shared: one task drives it.
pub struct Consumer {
    client: Client,
    group: String,
    member: String,
    topics: Vec<String>,
    session_timeout_ms: u64,
    /// The assignor this member asks for (unspecified: the group's own).
    assignor: pb::Assignor,
    /// Most record bytes one poll asks for, in bytes (0: the broker's
    /// default); a poll still gets one record larger than this.
    poll_bytes_max: u64,
    generation: u64,
    /// This join's epoch, sent with every request so that an older process
    /// of the same member id is fenced.
    member_epoch: u64,
    /// Whether the last join failed: it may still have committed, giving
    /// this member id a newer epoch than the one held here.
    join_uncertain: bool,
    partitions: Vec<pb::TopicPartition>,
    /// Polls sent and not answered yet: at most one per assigned partition
    /// (the partitions of [`Consumer::polling`]), each at most
    /// [`keel_proto::POLL_PARTITIONS_MAX`] partitions.
    in_flight: FuturesUnordered<PollInFlight>,
    /// The partitions a poll in flight asks for: none is asked twice at once.
    polling: BTreeSet<(String, u32)>,
    /// How many polls were sent per batch (leader, chunk): rotates each
    /// poll's partition order. At most one entry per broker and chunk.
    rotations: BTreeMap<(Option<String>, usize), usize>,
    /// Whether the last poll was told to rejoin and could not: the next
    /// poll rejoins first.
    rejoin_pending: bool,
    last_heartbeat: tokio::time::Instant,
    /// Why this member lost its place since the caller last looked: fenced
    /// on a partition, or removed from the group (see [`Consumer::take_notices`]).
    notices: Vec<String>,
    /// The next offset this session hands on, per partition: a new
    /// partition leader restarts a session's reads at the committed
    /// position, and records already handed on in this session are not
    /// handed on again (G3: offsets strictly increase within a session).
    session_next: BTreeMap<(String, u32), u64>,
    /// The partitions the last poll served, with the generation: this
    /// member's claims on them.
    last_polled: Vec<(pb::TopicPartition, u64)>,
    /// When the poll answered last was sent (an earlier call may have).
    last_poll_sent: Option<tokio::time::Instant>,
}

impl Consumer {
    /// Join `group` as `member`, subscribed to `topics`, with the group's
    /// assignor (sticky for a new group).
    pub async fn join(
        client: Client,
        group: &str,
        member: &str,
        topics: Vec<String>,
        session_timeout_ms: u64,
    ) -> Result<Consumer, ClientError> {
        Self::join_with_assignor(client, group, member, topics, session_timeout_ms, pb::Assignor::Unspecified).await
    }

    /// Join as [`Consumer::join`] does, asking for `assignor`: a new group
    /// (or one with no members) takes it; a group whose members use
    /// another refuses the join.
    pub async fn join_with_assignor(
        client: Client,
        group: &str,
        member: &str,
        topics: Vec<String>,
        session_timeout_ms: u64,
        assignor: pb::Assignor,
    ) -> Result<Consumer, ClientError> {
        let mut consumer = Consumer {
            client,
            group: group.to_string(),
            member: member.to_string(),
            topics,
            session_timeout_ms,
            assignor,
            poll_bytes_max: 0,
            generation: 0,
            member_epoch: 0,
            join_uncertain: false,
            partitions: Vec::new(),
            notices: Vec::new(),
            session_next: BTreeMap::new(),
            last_polled: Vec::new(),
            last_poll_sent: None,
            in_flight: FuturesUnordered::new(),
            polling: BTreeSet::new(),
            rotations: BTreeMap::new(),
            rejoin_pending: false,
            last_heartbeat: tokio::time::Instant::now(),
        };
        consumer.rejoin().await?;
        Ok(consumer)
    }

    /// Ask each later poll for at most `bytes` of records (0: the
    /// broker's default). A poll still gets one record larger than this,
    /// so a small budget slows a member down but never stops it.
    pub fn set_poll_bytes_max(&mut self, bytes: u64) {
        self.poll_bytes_max = bytes;
    }

    /// The generation this member is in.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The member epoch of this member's last join.
    pub fn member_epoch(&self) -> u64 {
        self.member_epoch
    }

    /// What happened to this member's membership since the last call: each
    /// fence or removal it recovered from by rejoining, as a message.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The partitions the last poll served (with or without records), with
    /// the generation: this member's claims on them.
    pub fn last_polled(&self) -> &[(pb::TopicPartition, u64)] {
        &self.last_polled
    }

    /// When the poll the last call answered from was sent: polls stay in
    /// flight across calls, so an earlier call may have sent it. `None` if
    /// the last call answered none.
    pub fn last_poll_sent(&self) -> Option<tokio::time::Instant> {
        self.last_poll_sent
    }

    /// The partitions assigned to this member.
    pub fn assignment(&self) -> &[pb::TopicPartition] {
        &self.partitions
    }

    /// Join again: fetch the current generation and assignment.
    pub async fn rejoin(&mut self) -> Result<(), ClientError> {
        // Polls sent under the old join are dropped (cancelled): their
        // answers speak for a generation or epoch this member leaves.
        self.in_flight = FuturesUnordered::new();
        self.polling.clear();
        self.rotations.clear();
        let request = pb::JoinGroupRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            topics: self.topics.clone(),
            session_timeout_ms: self.session_timeout_ms,
            assignor: self.assignor.into(),
        };
        let joined = self
            .client
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.join_group(r).await }
            })
            .await;
        self.join_uncertain = joined.is_err();
        let joined = joined?;
        self.rejoin_pending = false;
        self.member_epoch = joined.member_epoch;
        if joined.generation != self.generation {
            // A new session: the new generation's reads start afresh.
            self.session_next.clear();
        }
        self.generation = joined.generation;
        self.partitions = joined.partitions;
        self.last_heartbeat = tokio::time::Instant::now();
        Ok(())
    }

    /// Whether a refusal says a later join of this member id fenced this
    /// one. If this member's own last join failed, that join may be the
    /// later one: rejoin. Otherwise another process took the member id and
    /// this one stops (rejoining would fence that one in turn).
    async fn fenced_member(&mut self, status: &tonic::Status) -> Result<bool, ClientError> {
        if status.metadata().get(FENCED_METADATA).is_none() {
            return Ok(false);
        }
        if !self.join_uncertain {
            return Err(ClientError::Refused(status.clone()));
        }
        self.notices
            .push(format!("{}; the last join of this member may have been the later one: rejoining", status.message()));
        self.rejoin().await?;
        Ok(true)
    }

    /// How often this member heartbeats: a third of its session.
    fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms / 3)
    }

    /// Heartbeat if a third of the session has passed; rejoin if the group
    /// moved on or forgot this member.
    async fn heartbeat_if_due(&mut self) -> Result<(), ClientError> {
        if self.last_heartbeat.elapsed() < self.heartbeat_interval() {
            return Ok(());
        }
        let request = pb::HeartbeatRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            generation: self.generation,
            member_epoch: self.member_epoch,
        };
        match self
            .client
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.heartbeat(r).await }
            })
            .await
        {
            Ok(reply) if !reply.rebalance => {
                self.last_heartbeat = tokio::time::Instant::now();
                Ok(())
            }
            Ok(_) => self.rejoin().await,
            Err(ClientError::Refused(status)) if status.code() == Code::NotFound => {
                self.notices.push(format!(
                    "member {} was removed from group {}: {}; rejoining",
                    self.member,
                    self.group,
                    status.message()
                ));
                self.rejoin().await
            }
            Err(ClientError::Refused(status)) if self.fenced_member(&status).await? => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Wait up to `max_wait` for the first answer of the polls in flight,
    /// after sending one to each broker leading assigned partitions that no
    /// poll asks for yet (each waits up to `max_wait` for records, and asks
    /// for at most `max_records`). Hands on that answer's records; rejoins
    /// on a rebalance or a fence. Returns early when a heartbeat is due.
    pub async fn poll(&mut self, max_records: u32, max_wait: Duration) -> Result<Vec<Delivery>, ClientError> {
        self.last_polled.clear();
        self.last_poll_sent = None;
        if self.rejoin_pending {
            self.rejoin().await?;
        }
        self.heartbeat_if_due().await?;
        if self.partitions.is_empty() {
            tokio::time::sleep(max_wait).await;
            return Ok(Vec::new());
        }
        self.send_polls(max_records, max_wait);
        // Back in time for the next heartbeat: polls in flight go on waiting.
        let heartbeat_due = self.heartbeat_interval().saturating_sub(self.last_heartbeat.elapsed());
        let Ok(Some((sent, batch, answer))) =
            tokio::time::timeout(max_wait.min(heartbeat_due), self.in_flight.next()).await
        else {
            return Ok(Vec::new());
        };
        for assigned in &batch {
            self.polling.remove(&(assigned.topic.clone(), assigned.partition));
        }
        self.last_poll_sent = Some(sent);
        let (response, answered) = answer?;
        let mut polled = Vec::with_capacity(batch.len());
        let (mut fenced, mut moved, mut refused, mut any_refused) = (None, None, None, false);
        for (assigned, answer) in batch.into_iter().zip(response.partitions) {
            if answer.topic != assigned.topic || answer.partition != assigned.partition {
                continue;
            }
            let route = Route::Partition(assigned.topic.clone(), assigned.partition);
            let Some(refusal) = answer.refused else {
                self.client.learn(&route, &answered);
                polled.push((assigned, answer.records, answer.high_watermark));
                continue;
            };
            any_refused = true;
            let status = refusal.into_status();
            if status.metadata().get(FENCED_METADATA).is_some() {
                fenced.get_or_insert(status);
            } else if matches!(status.code(), Code::Aborted | Code::NotFound) {
                // Fenced by a newer generation, or the topic was deleted
                // under the assignment (the group goes on with the topics
                // that exist): rejoin.
                moved.get_or_insert(status);
            } else if let Some(leader) = hinted_leader(&status, &answered) {
                self.client.learn(&route, &leader);
            } else if passing(&status) {
                // Between leaders, or the broker is behind: ask any broker
                // next time, in case the one asked no longer leads.
                self.client.forget(&route);
            } else {
                refused.get_or_insert(status);
            }
        }
        if let Some(status) = fenced {
            self.fenced_member(&status).await?;
            return Ok(Vec::new());
        }
        if let Some(status) = refused {
            if polled.is_empty() {
                return Err(ClientError::Refused(status));
            }
            // The others are served; this one is reported.
            self.notices.push(format!("poll refused: {} ({:?})", status.message(), status.code()));
        }
        let mut deliveries = Vec::new();
        for (assigned, records, high_watermark) in polled {
            deliveries.extend(self.accept(&assigned, records, high_watermark));
            self.last_polled.push((assigned, self.generation));
        }
        if let Some(status) = moved {
            self.notices.push(format!("poll refused: {}; rejoining", status.message()));
            if deliveries.is_empty() {
                self.rejoin().await?;
            } else {
                // Hand on what was read, acknowledged under this join; the
                // next poll rejoins first.
                self.rejoin_pending = true;
            }
        }
        if any_refused && deliveries.is_empty() {
            // Ask again after a pause, not at once: brokers between leaders
            // or pointing at each other must not be polled in a tight loop.
            tokio::time::sleep(REFUSED_PAUSE).await;
        }
        Ok(deliveries)
    }

    /// Send a poll for the assigned partitions no poll in flight asks for:
    /// one per broker known to lead some of them, and one for those whose
    /// leader is not known yet (asked of any broker, which names the
    /// leaders). At most [`keel_proto::POLL_PARTITIONS_MAX`] in each.
    fn send_polls(&mut self, max_records: u32, max_wait: Duration) {
        let mut by_leader: BTreeMap<Option<String>, Vec<pb::TopicPartition>> = BTreeMap::new();
        for assigned in &self.partitions {
            if self.polling.contains(&(assigned.topic.clone(), assigned.partition)) {
                continue;
            }
            let leader = self.client.leader(&Route::Partition(assigned.topic.clone(), assigned.partition));
            by_leader.entry(leader).or_default().push(assigned.clone());
        }
        for (leader, partitions) in by_leader {
            for (chunk_index, chunk) in partitions.chunks(keel_proto::POLL_PARTITIONS_MAX).enumerate() {
                let mut batch = chunk.to_vec();
                // The record budget is filled in the order asked: rotate it
                // each time this batch is sent, so that no partition always
                // comes last.
                let sent = self.rotations.entry((leader.clone(), chunk_index)).or_default();
                let first = *sent % batch.len();
                batch.rotate_left(first);
                *sent = sent.wrapping_add(1);
                self.send_poll(leader.clone(), batch, max_records, max_wait);
            }
        }
    }

    /// Send one poll for `batch` to `leader` (any broker if not known).
    fn send_poll(&mut self, leader: Option<String>, batch: Vec<pb::TopicPartition>, max_records: u32, wait: Duration) {
        let request = pb::PollPartitionsRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            generation: self.generation,
            member_epoch: self.member_epoch,
            partitions: batch
                .iter()
                .map(|assigned| pb::PollPartition {
                    topic: assigned.topic.clone(),
                    partition: assigned.partition,
                    offset: self.session_offset(assigned),
                    topic_id: (assigned.topic_id != 0).then_some(assigned.topic_id),
                })
                .collect(),
            max_records,
            max_bytes: self.poll_bytes_max,
            max_wait_ms: wait.as_millis() as u64,
        };
        for assigned in &batch {
            self.polling.insert((assigned.topic.clone(), assigned.partition));
        }
        let client = self.client.clone();
        let route = leader.map_or(Route::Any, Route::Broker);
        // Boxed: the call's future is several KiB, and a runtime moves a
        // spawned future more than once before it first runs.
        let mut task = PollTask(tokio::spawn(Box::pin(async move {
            let sent = tokio::time::Instant::now();
            let answer = client
                .call_answered(route, wait, |mut c| {
                    let r = request.clone();
                    async move { c.poll_partitions(r).await }
                })
                .await;
            (sent, answer)
        })));
        self.in_flight.push(Box::pin(async move {
            let (sent, answer) =
                (&mut task.0).await.expect("a poll task does not panic, and is aborted only when dropped");
            (sent, batch, answer)
        }));
    }

    /// Where this session is on a partition: a reply lost on the way is
    /// read again.
    fn session_offset(&self, assigned: &pb::TopicPartition) -> Option<u64> {
        let offset = self.session_next.get(&(assigned.topic.clone(), assigned.partition)).copied();
        #[cfg(madsim)]
        let offset = offset.filter(|_| !keel_core::planted::is_planted(keel_core::planted::Bug::ConsumerNoOrderFilter));
        offset
    }

    /// The records of one partition's answer this session has not handed
    /// on yet, in order.
    fn accept(
        &mut self,
        assigned: &pb::TopicPartition,
        records: Vec<pb::StoredRecord>,
        high_watermark: u64,
    ) -> Vec<Delivery> {
        let slot = (assigned.topic.clone(), assigned.partition);
        let next = self.session_next.get(&slot).copied().unwrap_or(0);
        if high_watermark < next {
            // A log shorter than this session has read is a new log (its
            // topic was deleted and created again): read it from the
            // group's position next time.
            self.session_next.remove(&slot);
            return Vec::new();
        }
        #[cfg(madsim)]
        let next =
            if keel_core::planted::is_planted(keel_core::planted::Bug::ConsumerNoOrderFilter) { 0 } else { next };
        let records: Vec<_> = records.into_iter().filter(|r| r.offset >= next).collect();
        if let Some(last) = records.last() {
            self.session_next.insert(slot, last.offset + 1);
        }
        records
            .into_iter()
            .map(|record| Delivery {
                topic: assigned.topic.clone(),
                topic_id: assigned.topic_id,
                partition: assigned.partition,
                record,
            })
            .collect()
    }

    /// Commit everything up to and including `offset` on a partition.
    /// `Ok(None)` means this member was fenced (a rebalance moved the
    /// partition): it has rejoined, and the new owner reads on from the last
    /// commit, so these records may be delivered again (at-least-once).
    ///
    /// The offset counts in the topic's incarnation this member is
    /// assigned now; an offset read earlier (before a rebalance, say) may
    /// come from one deleted since: ack those with [`Consumer::ack_in`].
    pub async fn ack(&mut self, topic: &str, partition: u32, offset: u64) -> Result<Option<u64>, ClientError> {
        let topic_id = self
            .partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition && p.topic_id != 0)
            .map_or(0, |p| p.topic_id);
        self.ack_in(topic, topic_id, partition, offset).await
    }

    /// [`Consumer::ack`] of an offset read from incarnation `topic_id` of
    /// the topic (a [`Delivery`]'s; 0: whichever is current). Refused if
    /// that incarnation was deleted, as when fenced (`Ok(None)`, the member
    /// rejoins): its offsets say nothing of the new log (simulation seed
    /// 160000093: a slow member
    /// acked, after the topic was created again, an offset it had read
    /// before the deletion, and the group skipped the new log's first
    /// record).
    pub async fn ack_in(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        offset: u64,
    ) -> Result<Option<u64>, ClientError> {
        let request = pb::AckRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            generation: self.generation,
            topic: topic.to_string(),
            partition,
            offset,
            member_epoch: self.member_epoch,
            topic_id: (topic_id != 0).then_some(topic_id),
        };
        let route = Route::Partition(topic.to_string(), partition);
        let acked = self
            .client
            .call(route, |mut c| {
                let r = request.clone();
                async move { c.ack(r).await }
            })
            .await;
        match acked {
            Ok(acked) => Ok(Some(acked.position)),
            Err(ClientError::Refused(status)) if status.code() == Code::Aborted => {
                self.notices.push(format!(
                    "ack of {topic}/{partition} offset {offset} refused, fenced: {}; rejoining (these records may be delivered again)",
                    status.message()
                ));
                self.rejoin().await?;
                Ok(None)
            }
            Err(ClientError::Refused(status)) if status.code() == Code::NotFound => {
                self.notices.push(format!("ack of {topic}/{partition} refused: {}; rejoining", status.message()));
                self.rejoin().await?;
                Ok(None)
            }
            Err(ClientError::Refused(status)) if self.fenced_member(&status).await? => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Leave the group: its partitions are handed on at once.
    pub async fn leave(self) -> Result<(), ClientError> {
        let request = pb::LeaveGroupRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            member_epoch: self.member_epoch,
        };
        self.client
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.leave_group(r).await }
            })
            .await?;
        Ok(())
    }
}
