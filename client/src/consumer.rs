//! A consumer-group member: join, heartbeat, poll the assigned partitions,
//! ack, rejoin on a rebalance or when fenced, leave.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_proto::v1 as pb;
use tonic::Code;

use crate::client::{Client, ClientError, Route, FENCED_METADATA};

/// One record as a member receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub topic: String,
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
    generation: u64,
    /// This join's epoch, sent with every request so that an older process
    /// of the same member id is fenced.
    member_epoch: u64,
    /// Whether the last join failed: it may still have committed, giving
    /// this member id a newer epoch than the one held here.
    join_uncertain: bool,
    partitions: Vec<pb::TopicPartition>,
    /// Round-robin over the assignment.
    next_partition: usize,
    last_heartbeat: tokio::time::Instant,
    /// Why this member lost its place since the caller last looked: fenced
    /// on a partition, or removed from the group (see [`Consumer::take_notices`]).
    notices: Vec<String>,
    /// The next offset this session hands on, per partition: a new
    /// partition leader restarts a session's reads at the committed
    /// position, and records already handed on in this session are not
    /// handed on again (G3: offsets strictly increase within a session).
    session_next: BTreeMap<(String, u32), u64>,
    /// The partition and generation of the last poll, if it succeeded.
    last_polled: Option<(pb::TopicPartition, u64)>,
}

impl Consumer {
    /// Join `group` as `member`, subscribed to `topics`.
    pub async fn join(
        client: Client,
        group: &str,
        member: &str,
        topics: Vec<String>,
        session_timeout_ms: u64,
    ) -> Result<Consumer, ClientError> {
        let mut consumer = Consumer {
            client,
            group: group.to_string(),
            member: member.to_string(),
            topics,
            session_timeout_ms,
            generation: 0,
            member_epoch: 0,
            join_uncertain: false,
            partitions: Vec::new(),
            notices: Vec::new(),
            session_next: BTreeMap::new(),
            last_polled: None,
            next_partition: 0,
            last_heartbeat: tokio::time::Instant::now(),
        };
        consumer.rejoin().await?;
        Ok(consumer)
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

    /// The partition and generation of the last poll, if it succeeded
    /// (with or without records): this member's claim on that partition.
    pub fn last_polled(&self) -> Option<(&pb::TopicPartition, u64)> {
        self.last_polled.as_ref().map(|(p, g)| (p, *g))
    }

    /// The partitions assigned to this member.
    pub fn assignment(&self) -> &[pb::TopicPartition] {
        &self.partitions
    }

    /// Join again: fetch the current generation and assignment.
    pub async fn rejoin(&mut self) -> Result<(), ClientError> {
        let request = pb::JoinGroupRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            topics: self.topics.clone(),
            session_timeout_ms: self.session_timeout_ms,
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

    /// Heartbeat if a third of the session has passed; rejoin if the group
    /// moved on or forgot this member.
    async fn heartbeat_if_due(&mut self) -> Result<(), ClientError> {
        if self.last_heartbeat.elapsed() < Duration::from_millis(self.session_timeout_ms / 3) {
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

    /// Poll the next assigned partition (round-robin), waiting up to
    /// `max_wait` for records. Rejoins on a rebalance or a fence.
    pub async fn poll(&mut self, max_records: u32, max_wait: Duration) -> Result<Vec<Delivery>, ClientError> {
        self.last_polled = None;
        self.heartbeat_if_due().await?;
        if self.partitions.is_empty() {
            tokio::time::sleep(max_wait).await;
            return Ok(Vec::new());
        }
        let slot = self.next_partition % self.partitions.len();
        self.next_partition = self.next_partition.wrapping_add(1);
        let assigned = self.partitions[slot].clone();
        // Spread the wait over the assignment so no partition starves.
        let wait = max_wait / self.partitions.len() as u32;
        let slot = (assigned.topic.clone(), assigned.partition);
        // Where this session is: a reply lost on the way is read again.
        let offset = self.session_next.get(&slot).copied();
        #[cfg(madsim)]
        let offset = offset.filter(|_| !keel_core::planted::is_planted(keel_core::planted::Bug::ConsumerNoOrderFilter));
        let request = pb::PollRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            generation: self.generation,
            topic: assigned.topic.clone(),
            partition: assigned.partition,
            max_records,
            max_bytes: 0,
            max_wait_ms: wait.as_millis() as u64,
            offset,
            member_epoch: self.member_epoch,
            topic_id: (assigned.topic_id != 0).then_some(assigned.topic_id),
        };
        let route = Route::Partition(assigned.topic.clone(), assigned.partition);
        match self
            .client
            .call_waiting(route, wait, |mut c| {
                let r = request.clone();
                async move { c.poll(r).await }
            })
            .await
        {
            Ok(response) => {
                self.last_polled = Some((assigned.clone(), self.generation));
                let next = self.session_next.get(&slot).copied().unwrap_or(0);
                if response.high_watermark < next {
                    // A log shorter than this session has read is a new log
                    // (its topic was deleted and created again): read it
                    // from the group's position next time.
                    self.session_next.remove(&slot);
                    return Ok(Vec::new());
                }
                #[cfg(madsim)]
                let next = if keel_core::planted::is_planted(keel_core::planted::Bug::ConsumerNoOrderFilter) {
                    0
                } else {
                    next
                };
                let records: Vec<_> = response.records.into_iter().filter(|r| r.offset >= next).collect();
                if let Some(last) = records.last() {
                    self.session_next.insert(slot, last.offset + 1);
                }
                Ok(records
                    .into_iter()
                    .map(|record| Delivery { topic: assigned.topic.clone(), partition: assigned.partition, record })
                    .collect())
            }
            Err(ClientError::Refused(status)) if status.code() == Code::Aborted => {
                self.notices.push(format!("poll refused, fenced: {}; rejoining", status.message()));
                self.rejoin().await?;
                Ok(Vec::new())
            }
            Err(ClientError::Refused(status)) if status.code() == Code::NotFound => {
                // The topic was deleted under the assignment: the group goes
                // on with the topics that exist.
                self.notices.push(format!("{}; rejoining", status.message()));
                self.rejoin().await?;
                Ok(Vec::new())
            }
            Err(ClientError::Refused(status)) if self.fenced_member(&status).await? => Ok(Vec::new()),
            Err(error) => Err(error),
        }
    }

    /// Commit everything up to and including `offset` on a partition.
    /// `Ok(None)` means this member was fenced (a rebalance moved the
    /// partition): it has rejoined, and the new owner reads on from the last
    /// commit, so these records may be delivered again (at-least-once).
    pub async fn ack(&mut self, topic: &str, partition: u32, offset: u64) -> Result<Option<u64>, ClientError> {
        let request = pb::AckRequest {
            group: self.group.clone(),
            member: self.member.clone(),
            generation: self.generation,
            topic: topic.to_string(),
            partition,
            offset,
            member_epoch: self.member_epoch,
            topic_id: self
                .partitions
                .iter()
                .find(|p| p.topic == topic && p.partition == partition && p.topic_id != 0)
                .map(|p| p.topic_id),
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
