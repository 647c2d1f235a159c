//! `keel.v1.Keel` on a broker node.

use keel_core::access::{Operation, Permission};
use keel_core::metadata::{
    MetadataCommand, MetadataOutcome, MetadataRejection, MetadataResult, RetentionPolicy, TopicInfo,
};
use keel_core::partition::{AppendBatch, PartitionCommand, PartitionOutcome, ProducerBatch};
use keel_core::placement::PlacementError;
use keel_core::record::{Header, Record, StoredRecord};
use keel_core::{Offset, PartitionIndex, ProducerId, Sequence, TimestampMs, TopicName, TopicPartition};
use keel_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::errors::{
    elsewhere, invalid_name, membership_error, metadata_rejection, not_leader, partition_rejection, with_leader,
};
use crate::group::GroupId;
use crate::node::Node;
use crate::raft::types::{Command, Response as Applied};

/// Records a read or poll returns when the client asks for 0.
pub const READ_RECORDS_DEFAULT: u32 = 500;
/// Bytes of records a read or poll returns when the client asks for 0.
pub const READ_REPLY_BYTES_DEFAULT: u64 = 4 * 1024 * 1024;
/// Most bytes of records one read or poll returns, whatever the client
/// asks (plus at most one record, so a record over the budget is still
/// delivered); well under the API's 64 MiB reply limit.
pub const READ_REPLY_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The record and byte budget of one read or poll: 0 means the server's
/// default, and the byte budget is capped.
pub(super) fn read_budget(max_records: u32, max_bytes: u64) -> (u32, u64) {
    let records = if max_records == 0 { READ_RECORDS_DEFAULT } else { max_records };
    let bytes = if max_bytes == 0 { READ_REPLY_BYTES_DEFAULT } else { max_bytes.min(READ_REPLY_BYTES_MAX) };
    (records, bytes)
}

/// A broker that answered a Raft message this recently counts as live.
const LIVENESS_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);

/// The public API of one broker.
#[derive(Clone)]
pub struct KeelService {
    pub(super) node: Node,
    /// The bound on writes in flight.
    pub(super) admission: super::admission::Admission,
    /// Users' secrets already checked against their credentials.
    pub(super) checked_secrets: std::sync::Arc<super::access::CheckedSecrets>,
}

impl KeelService {
    pub fn new(node: Node) -> Self {
        KeelService {
            node,
            admission: super::admission::Admission::new(super::WRITE_BYTES_IN_FLIGHT_MAX),
            checked_secrets: Default::default(),
        }
    }

    /// Run one RPC and count it, with its status code and latency.
    pub(super) async fn timed<T>(
        &self,
        rpc: &'static str,
        call: impl std::future::Future<Output = Result<Response<T>, Status>>,
    ) -> Result<Response<T>, Status> {
        let started = tokio::time::Instant::now();
        tracing::debug!(rpc, "request");
        // A removed broker's metadata is frozen: answering from it would
        // keep a client on stale groups and placements for good.
        let result = if self.node.removed_from_cluster() {
            Err(Status::unavailable(format!(
                "broker {} was removed from the cluster: ask another broker (and shut this one down)",
                self.node.id()
            )))
        } else {
            call.await
        };
        let code = result.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        tracing::debug!(rpc, ?code, elapsed_ms = started.elapsed().as_millis() as u64, "answered");
        self.node.metrics().observe_request(rpc, code, started.elapsed().as_secs_f64());
        result
    }

    pub(super) async fn propose_metadata(&self, command: MetadataCommand) -> Result<MetadataOutcome, Status> {
        self.propose_metadata_result(command).await?.map_err(metadata_rejection)
    }

    /// Propose a metadata command; its applied result, rejection included.
    async fn propose_metadata_result(&self, command: MetadataCommand) -> Result<MetadataResult, Status> {
        match self.node.propose(&GroupId::Metadata, Command::Metadata(command)).await.map_err(not_leader)? {
            Applied::Metadata(result) => Ok(result),
            other => Err(Status::internal(format!("the metadata group answered {other:?}"))),
        }
    }

    pub(super) async fn propose_partition(
        &self,
        partition: &TopicPartition,
        command: PartitionCommand,
    ) -> Result<PartitionOutcome, Status> {
        let group = self
            .node
            .partition_group(partition)
            .ok_or_else(|| Status::not_found(format!("partition {partition} does not exist")))?;
        self.propose_partition_in(&group, partition, command).await
    }

    /// Propose to exactly `group` (one incarnation of `partition`'s topic).
    pub(super) async fn propose_partition_in(
        &self,
        group: &GroupId,
        partition: &TopicPartition,
        command: PartitionCommand,
    ) -> Result<PartitionOutcome, Status> {
        if self.node.raft(group).is_none() {
            return Err(self.hosted_elsewhere(partition));
        }
        match self.node.propose(group, Command::Partition(command)).await.map_err(not_leader)? {
            Applied::Partition(result) => result.map_err(partition_rejection),
            other => Err(Status::internal(format!("partition {partition} answered {other:?}"))),
        }
    }

    pub(super) fn hosted_elsewhere(&self, partition: &TopicPartition) -> Status {
        let metadata = self.node.metadata();
        // The partition was there when the request was checked; if this
        // broker's metadata no longer has it, its deletion committed.
        let exists =
            metadata.topic(&partition.topic).is_some_and(|t| (partition.partition.0 as usize) < t.partitions.len());
        if !exists {
            return Status::not_found(format!("partition {partition} does not exist (its topic was deleted)"));
        }
        let replicas = metadata
            .topic(&partition.topic)
            .and_then(|t| t.partitions.get(partition.partition.0 as usize))
            .map(|p| p.replicas.clone())
            .unwrap_or_default();
        let hint = replicas
            .iter()
            .map(|b| format!("{b}@{}", metadata.brokers().get(b).map(|i| i.address.as_str()).unwrap_or("")))
            .collect::<Vec<_>>()
            .join(",");
        elsewhere(
            format!("partition {partition} is not hosted on broker {}; its replicas are {hint}", self.node.id()),
            &hint,
        )
    }

    /// Validate a topic and partition against this broker's metadata.
    pub(super) async fn partition(&self, topic: &str, partition: u32) -> Result<TopicPartition, Status> {
        Ok(self.partition_of(topic, partition, None).await?.0)
    }

    /// [`Self::partition`] of the topic incarnation `topic_id`, if named,
    /// with the Raft group of the incarnation checked: a write the client
    /// means for one incarnation never lands in another.
    pub(super) async fn partition_of(
        &self,
        topic: &str,
        partition: u32,
        topic_id: Option<u64>,
    ) -> Result<(TopicPartition, GroupId), Status> {
        let name = TopicName::new(topic).map_err(invalid_name)?;
        let metadata = self.node.metadata();
        let Some(info) = metadata.topic(&name) else {
            return Err(self.missing(format!("topic {name} does not exist: create it first")).await);
        };
        match topic_id {
            Some(wanted) if wanted > info.id => {
                return Err(Status::unavailable(format!(
                    "broker {} knows topic {name} as incarnation {}, older than the {wanted} you named: its \
                     metadata is behind, retry shortly",
                    self.node.id(),
                    info.id
                )))
            }
            Some(wanted) if wanted < info.id => {
                let status = Status::not_found(format!(
                    "topic {name} incarnation {wanted} was deleted (the topic was created again, as incarnation {}): \
                     look the topic up again",
                    info.id
                ));
                return Err(super::errors::topic_gone(status));
            }
            _ => {}
        }
        if partition as usize >= info.partitions.len() {
            let message = format!(
                "topic {name} has {} partitions, so partition {partition} does not exist",
                info.partitions.len()
            );
            return Err(self.missing(message).await);
        }
        let partition = TopicPartition::new(name, PartitionIndex(partition));
        Ok((partition.clone(), GroupId::Partition(partition, info.id)))
    }

    /// Something named is not in this broker's metadata. Only the metadata
    /// leader says NOT_FOUND for sure: a follower may lag behind a write the
    /// client just made, so it sends the client to the leader.
    pub(super) async fn missing(&self, message: String) -> Status {
        if self.node.is_metadata_leader().await {
            return Status::not_found(message);
        }
        match self.node.metadata_leader().await {
            Some((id, address)) => with_leader(
                Status::failed_precondition(format!("{message} on broker {}; ask the metadata leader", self.node.id())),
                id,
                &address,
            ),
            None => Status::unavailable(format!("{message}; no metadata leader is known yet, retry shortly")),
        }
    }

    fn describe(&self, name: &TopicName, info: &TopicInfo) -> pb::TopicDescription {
        let partitions = info
            .partitions
            .iter()
            .enumerate()
            .map(|(index, placement)| {
                let tp = TopicPartition::new(name.clone(), PartitionIndex(index as u32));
                let state = self.node.partition(&tp);
                let group = GroupId::Partition(tp, info.id);
                let leader = self.node.raft(&group).and_then(|r| r.metrics().borrow().current_leader).unwrap_or(0);
                let voters = self.node.group_voters(&group).unwrap_or_default().into_iter().collect();
                pb::PartitionDescription {
                    partition: index as u32,
                    replicas: placement.replicas.iter().map(|b| b.0).collect(),
                    leader,
                    log_start: state.as_ref().map_or(0, |s| s.log_start().0),
                    high_watermark: state.as_ref().map_or(0, |s| s.high_watermark().0),
                    voters,
                    hosted: state.is_some(),
                }
            })
            .collect();
        pb::TopicDescription {
            name: name.to_string(),
            replication_factor: info.replication_factor,
            partitions,
            id: info.id,
            retention_ms: info.retention.max_age_ms,
            retention_bytes: info.retention.max_bytes,
        }
    }
}

/// A record as the API received it, as the state machine takes it.
pub fn to_record(record: pb::Record) -> Record {
    Record {
        key: record.key,
        value: record.value,
        headers: record.headers.into_iter().map(|h| Header { key: h.key, value: h.value }).collect(),
        producer_timestamp_ms: record.producer_timestamp_ms.map(TimestampMs),
    }
}

pub(super) fn from_record(stored: StoredRecord) -> pb::StoredRecord {
    let record = stored.record;
    pb::StoredRecord {
        offset: stored.offset.0,
        append_time_ms: stored.append_time_ms.0,
        record: Some(pb::Record {
            key: record.key,
            value: record.value,
            headers: record.headers.into_iter().map(|h| pb::Header { key: h.key, value: h.value }).collect(),
            producer_timestamp_ms: record.producer_timestamp_ms.map(|t| t.0),
        }),
    }
}

/// The RPCs answered in this file; consumer and group RPCs live in
/// `consumer.rs` and `groups.rs`.
impl KeelService {
    pub(super) async fn allocate_producer_id_call(
        &self,
        _request: Request<pb::AllocateProducerIdRequest>,
    ) -> Result<Response<pb::AllocateProducerIdResponse>, Status> {
        match self.propose_metadata(MetadataCommand::AllocateProducerId).await? {
            MetadataOutcome::ProducerIdAllocated { producer } => {
                Ok(Response::new(pb::AllocateProducerIdResponse { producer_id: producer.0 }))
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn produce_call(
        &self,
        request: Request<pb::ProduceRequest>,
    ) -> Result<Response<pb::ProduceResponse>, Status> {
        let request = request.into_inner();
        let metadata = self.node.metadata();
        let (partition, group) = self.partition_of(&request.topic, request.partition, request.topic_id).await?;
        let limits = metadata.limits();
        if request.records.is_empty() {
            return Err(Status::invalid_argument("the batch is empty: send at least one record"));
        }
        if request.records.len() as u64 > u64::from(limits.batch_records_max) {
            return Err(Status::resource_exhausted(format!(
                "the batch has {} records; the limit is {}: split it",
                request.records.len(),
                limits.batch_records_max
            )));
        }
        let records: Vec<Record> = request.records.into_iter().map(to_record).collect();
        for (index, record) in records.iter().enumerate() {
            record.validate(limits).map_err(|e| Status::resource_exhausted(format!("record {index}: {e}")))?;
        }
        let producer = request.idempotent.then_some(ProducerBatch {
            producer: ProducerId(request.producer_id),
            sequence: Sequence(request.sequence),
        });
        let bytes: u64 = records.iter().map(|r| (r.value.len() + r.key.as_ref().map_or(0, |k| k.len())) as u64).sum();
        let _admitted = self.admission.admit(self.node.id(), records.iter().map(Record::size_bytes).sum())?;
        if self.node.raft(&group).is_none() {
            return Err(self.hosted_elsewhere(&partition));
        }
        #[cfg(madsim)]
        if keel_core::planted::is_planted(keel_core::planted::Bug::RefuseProducesAfterFailover)
            && self.node.raft(&group).is_some_and(|raft| raft.metrics().borrow().current_term > 1)
        {
            return Err(Status::failed_precondition("planted bug: this partition refuses produces after a failover"));
        }
        let appended = self.node.append(&group, AppendBatch { producer, records }).await.map_err(not_leader)?;
        match appended.map_err(partition_rejection)? {
            PartitionOutcome::Appended { base_offset, count, duplicate } => {
                if !duplicate {
                    self.node.metrics().produced(u64::from(count), bytes);
                }
                Ok(Response::new(pb::ProduceResponse { base_offset: base_offset.0, count, duplicate }))
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn read_call(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let request = request.into_inner();
        let partition = self.partition(&request.topic, request.partition).await?;
        // A follower may not have learned the last commits yet (its leader
        // tells it with the next AppendEntries, within 10 ms):
        // only the leader, confirmed by a quorum, holds every acknowledged
        // record for sure.
        if !request.any_replica {
            self.confirm_leadership(&partition).await?;
        }
        let (max_records, max_bytes) = read_budget(request.max_records, request.max_bytes);
        let result = self
            .node
            .read_partition(&partition, |state, log| {
                (
                    state.read(log, Offset(request.offset), max_records, max_bytes).map_err(|e| e.to_string()),
                    state.high_watermark(),
                )
            })
            .ok_or_else(|| self.hosted_elsewhere(&partition))?;
        match result {
            #[allow(unused_mut)]
            (Ok(mut records), high_watermark) => {
                #[cfg(madsim)]
                if records.len() > 1 && keel_core::planted::is_planted(keel_core::planted::Bug::ReadSkipsFirstRecord) {
                    records.remove(0);
                }
                Ok(Response::new(pb::ReadResponse {
                    records: records.into_iter().map(from_record).collect(),
                    high_watermark: high_watermark.0,
                }))
            }
            (Err(message), _) => Err(Status::out_of_range(message)),
        }
    }

    pub(super) async fn create_topic_call(
        &self,
        request: Request<pb::CreateTopicRequest>,
    ) -> Result<Response<pb::CreateTopicResponse>, Status> {
        let request = request.into_inner();
        let name = TopicName::new(request.topic.as_str()).map_err(invalid_name)?;
        let retention = RetentionPolicy { max_age_ms: request.retention_ms, max_bytes: request.retention_bytes };
        let command = MetadataCommand::CreateTopic {
            topic: request.topic,
            partitions: request.partitions,
            replication_factor: request.replication_factor,
            retention,
        };
        if let Err(rejection) = self.propose_metadata_result(command).await? {
            // Brokers register once the metadata group has a leader: a
            // topic created right after the brokers started may find too
            // few. While fewer than the metadata voters are registered, the
            // cluster is still forming: the client retries.
            let too_few = matches!(rejection, MetadataRejection::Placement(PlacementError::NotEnoughBrokers { .. }));
            return Err(match self.still_forming() {
                Some((registered, voters)) if too_few => Status::unavailable(format!(
                    "the cluster is still forming ({registered} of its {voters} brokers have registered): retry shortly"
                )),
                _ => metadata_rejection(rejection),
            });
        }
        let metadata = self.node.metadata();
        let info = metadata.topic(&name).ok_or_else(|| Status::internal("the created topic is missing"))?;
        Ok(Response::new(pb::CreateTopicResponse { topic: Some(self.describe(&name, info)) }))
    }

    pub(super) async fn delete_topic_call(
        &self,
        request: Request<pb::DeleteTopicRequest>,
    ) -> Result<Response<pb::DeleteTopicResponse>, Status> {
        let topic = request.into_inner().topic;
        TopicName::new(topic.as_str()).map_err(invalid_name)?;
        self.propose_metadata(MetadataCommand::DeleteTopic { topic }).await?;
        Ok(Response::new(pb::DeleteTopicResponse {}))
    }

    /// `(registered brokers, metadata voters)` while fewer brokers have
    /// registered than the metadata group has voters.
    fn still_forming(&self) -> Option<(usize, usize)> {
        let registered = self.node.metadata().brokers().len();
        let voters = self.node.group_voters(&GroupId::Metadata).unwrap_or_default().len();
        (registered < voters).then_some((registered, voters))
    }

    pub(super) async fn alter_topic_call(
        &self,
        request: Request<pb::AlterTopicRequest>,
    ) -> Result<Response<pb::AlterTopicResponse>, Status> {
        let request = request.into_inner();
        let name = TopicName::new(request.topic.as_str()).map_err(invalid_name)?;
        // A retention change keeps the other retention setting as this
        // broker's metadata has it (0 removes a limit).
        let retention = match (request.retention_ms, request.retention_bytes) {
            (None, None) => None,
            (age, bytes) => {
                let metadata = self.node.metadata();
                let Some(current) = metadata.topic(&name).map(|t| t.retention) else {
                    return Err(self.missing(format!("topic {name} does not exist")).await);
                };
                let change = |given: Option<u64>, now: Option<u64>| given.map_or(now, |v| (v > 0).then_some(v));
                Some(RetentionPolicy {
                    max_age_ms: change(age, current.max_age_ms),
                    max_bytes: change(bytes, current.max_bytes),
                })
            }
        };
        let command = MetadataCommand::AlterTopic { topic: request.topic, partitions: request.partitions, retention };
        self.propose_metadata(command).await?;
        let metadata = self.node.metadata();
        let info = metadata.topic(&name).ok_or_else(|| Status::internal("the altered topic is missing"))?;
        Ok(Response::new(pb::AlterTopicResponse { topic: Some(self.describe(&name, info)) }))
    }

    /// The topics `caller` may describe.
    pub(super) async fn list_topics_call(
        &self,
        caller: &super::Caller,
        request: Request<pb::ListTopicsRequest>,
    ) -> Result<Response<pb::ListTopicsResponse>, Status> {
        if request.into_inner().leader_only {
            self.fresh_metadata().await?;
        }
        let metadata = self.node.metadata();
        let topics = metadata
            .topics()
            .iter()
            .filter(|(name, _)| self.may(caller, &Permission::topic(name.as_str(), Operation::Describe)))
            .map(|(name, info)| self.describe(name, info))
            .collect();
        Ok(Response::new(pb::ListTopicsResponse { topics }))
    }

    /// Refuse unless this broker leads the metadata group (naming the
    /// leader), then catch up with everything committed: a leader just
    /// elected may not have applied what its predecessor committed (a
    /// deletion, a creation).
    async fn fresh_metadata(&self) -> Result<(), Status> {
        if !self.node.is_metadata_leader().await {
            let message = format!("broker {} does not lead the metadata group", self.node.id());
            return Err(match self.node.metadata_leader().await {
                Some((id, address)) => with_leader(Status::failed_precondition(message), id, &address),
                None => Status::unavailable(format!("{message}; no leader is known yet, retry shortly")),
            });
        }
        self.applied_to_read_index(&GroupId::Metadata, "the metadata group").await
    }

    pub(super) async fn describe_topic_call(
        &self,
        request: Request<pb::DescribeTopicRequest>,
    ) -> Result<Response<pb::DescribeTopicResponse>, Status> {
        let request = request.into_inner();
        let name = TopicName::new(request.topic).map_err(invalid_name)?;
        if request.leader_only {
            self.fresh_metadata().await?;
        }
        let metadata = self.node.metadata();
        let Some(info) = metadata.topic(&name) else {
            return Err(self.missing(format!("topic {name} does not exist")).await);
        };
        Ok(Response::new(pb::DescribeTopicResponse { topic: Some(self.describe(&name, info)) }))
    }

    pub(super) async fn describe_cluster_call(
        &self,
        request: Request<pb::DescribeClusterRequest>,
    ) -> Result<Response<pb::DescribeClusterResponse>, Status> {
        if request.into_inner().leader_only {
            self.fresh_metadata().await?;
        }
        let metadata = self.node.metadata();
        let brokers = metadata
            .brokers()
            .iter()
            .map(|(id, info)| {
                let since = self.node.since_peer_answer(id.0);
                pb::BrokerDescription {
                    id: id.0,
                    address: info.address.clone(),
                    live: id.0 == self.node.id() || since.is_some_and(|s| s <= LIVENESS_WINDOW),
                    last_contact_ms: since.map(|s| s.as_millis() as u64),
                    internal_address: info.internal_address.clone(),
                    replicas: metadata.replicas_on(*id),
                    draining: info.draining,
                }
            })
            .collect();
        let metadata_leader =
            self.node.raft(&GroupId::Metadata).and_then(|r| r.metrics().borrow().current_leader).unwrap_or(0);
        let metadata_voters = self.node.group_voters(&GroupId::Metadata).unwrap_or_default().into_iter().collect();
        Ok(Response::new(pb::DescribeClusterResponse {
            brokers,
            metadata_leader,
            cluster_id: self.node.cluster_id(),
            metadata_voters,
        }))
    }

    pub(super) fn describe_cluster_config_call(&self) -> pb::DescribeClusterConfigResponse {
        let metadata = self.node.metadata();
        let settings = metadata
            .limits()
            .settings()
            .into_iter()
            .map(|s| pb::ClusterSetting { name: s.name.to_string(), value: s.value, scope: s.scope.as_str().into() })
            .collect();
        pb::DescribeClusterConfigResponse { settings }
    }

    pub(super) async fn set_cluster_config_call(
        &self,
        request: Request<pb::SetClusterConfigRequest>,
    ) -> Result<Response<pb::SetClusterConfigResponse>, Status> {
        let pb::SetClusterConfigRequest { name, value } = request.into_inner();
        match self.propose_metadata(MetadataCommand::SetLimit { name, value }).await? {
            MetadataOutcome::LimitSet { previous, value, .. } => {
                Ok(Response::new(pb::SetClusterConfigResponse { previous, value }))
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn remove_broker_call(
        &self,
        request: Request<pb::RemoveBrokerRequest>,
    ) -> Result<Response<pb::RemoveBrokerResponse>, Status> {
        // Its refusals (not registered, still holding replicas) are checked
        // on the leader's metadata: everything committed applied first.
        self.fresh_metadata().await?;
        self.node.remove_broker(request.into_inner().broker).await.map_err(membership_error)?;
        Ok(Response::new(pb::RemoveBrokerResponse {}))
    }

    pub(super) async fn drain_broker_call(
        &self,
        request: Request<pb::DrainBrokerRequest>,
    ) -> Result<Response<pb::DrainBrokerResponse>, Status> {
        let broker = keel_core::BrokerId(request.into_inner().broker);
        match self.propose_metadata(MetadataCommand::DrainBroker { broker }).await? {
            MetadataOutcome::BrokerDrained { moved, .. } => Ok(Response::new(pb::DrainBrokerResponse { moved })),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn move_partition_call(
        &self,
        request: Request<pb::MovePartitionRequest>,
    ) -> Result<Response<pb::MovePartitionResponse>, Status> {
        let request = request.into_inner();
        let name = TopicName::new(request.topic.as_str()).map_err(invalid_name)?;
        let command = MetadataCommand::MoveReplicas {
            topic: request.topic,
            partition: PartitionIndex(request.partition),
            replicas: request.replicas.into_iter().map(keel_core::BrokerId).collect(),
        };
        self.propose_metadata(command).await?;
        let metadata = self.node.metadata();
        let info = metadata.topic(&name).ok_or_else(|| Status::internal("the moved partition's topic is missing"))?;
        let partition = self.describe(&name, info).partitions.into_iter().nth(request.partition as usize);
        Ok(Response::new(pb::MovePartitionResponse { partition }))
    }
}
