//! The idempotent producer (G8).

use std::collections::BTreeMap;

use keel_core::routing::{partition_for_key, KeylessSpreader};
use keel_proto::v1 as pb;

use crate::client::{Client, ClientError, KnownTopics, PRODUCER_LOST_METADATA, TOPIC_GONE_METADATA};

/// Where a batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub partition: u32,
    pub base_offset: u64,
    pub count: u32,
    /// The batch had been appended by an earlier attempt.
    pub duplicate: bool,
    /// The incarnation of the topic the batch went to.
    pub topic_id: u64,
}

/// An idempotent producer. Batches to one partition go one at a time, each
/// with the next sequence. The client retries a batch (same sequence)
/// through elections and lost replies, so a retry is answered with the
/// original offsets instead of being appended twice. If a send still fails,
/// its outcome is unknown: the batch is kept and resent, with its own
/// sequence, before the next batch to that partition, so neither a
/// duplicate nor a sequence gap can follow.
///
/// A partition may forget a producer (it remembers a bounded number). Then
/// the resent batch's outcome cannot be known: the producer takes a new id,
/// starts every partition afresh, and reports
/// [`ClientError::ProducerReset`], so the caller decides whether to send
/// that batch again.
pub struct Producer {
    client: Client,
    producer_id: u64,
    /// Next sequence per (topic, partition).
    sequences: BTreeMap<(String, u32), u64>,
    /// Partition count and incarnation (topic id) per topic, learned from
    /// the metadata leader on first use: every batch names the
    /// incarnation, so none lands in a topic deleted under the producer.
    topics: KnownTopics,
    spreader: KeylessSpreader,
    /// A batch whose send failed, per partition: (sequence, records).
    unresolved: BTreeMap<(String, u32), (u64, Vec<pb::Record>)>,
}

impl Producer {
    /// A producer with a fresh id from the cluster. `spread_start` seeds the
    /// round-robin of keyless batches (draw it from your RNG).
    pub async fn new(client: Client, spread_start: u64) -> Result<Producer, ClientError> {
        let producer_id = client.allocate_producer_id().await?;
        Ok(Producer {
            client,
            producer_id,
            sequences: BTreeMap::new(),
            topics: KnownTopics::default(),
            spreader: KeylessSpreader::new(spread_start),
            unresolved: BTreeMap::new(),
        })
    }

    pub fn producer_id(&self) -> u64 {
        self.producer_id
    }

    async fn topic(&mut self, topic: &str) -> Result<(u32, u64), ClientError> {
        self.topics.get(&self.client, topic).await
    }

    /// The partition for a record: the key's partition if `key` is given
    /// (FNV-1a 64 of the key modulo the partition count), else the next one
    /// round-robin.
    pub async fn partition_for(&mut self, topic: &str, key: Option<&[u8]>) -> Result<u32, ClientError> {
        let (count, _) = self.topic(topic).await?;
        let partition = match key {
            Some(key) => partition_for_key(key, count),
            None => self.spreader.next_partition(count),
        }
        .map_err(|e| ClientError::Refused(tonic::Status::invalid_argument(e.to_string())))?;
        Ok(partition.0)
    }

    /// Send `records` to `topic`, to the partition [`Self::partition_for`]
    /// picks for `key`.
    pub async fn send(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        records: Vec<pb::Record>,
    ) -> Result<Sent, ClientError> {
        let partition = self.partition_for(topic, key).await?;
        self.send_to(topic, partition, records).await
    }

    /// Send `records` to one partition.
    pub async fn send_to(
        &mut self,
        topic: &str,
        partition: u32,
        records: Vec<pb::Record>,
    ) -> Result<Sent, ClientError> {
        let slot = (topic.to_string(), partition);
        if let Some((sequence, earlier)) = self.unresolved.get(&slot).cloned() {
            match self.attempt(&slot, sequence, earlier).await {
                Ok(_) => {}
                // This call's records were not sent: say so.
                Err(ClientError::ProducerReset { old_producer_id, new_producer_id, reason, unknown, .. }) => {
                    return Err(ClientError::ProducerReset {
                        old_producer_id,
                        new_producer_id,
                        reason,
                        unknown,
                        unsent: records,
                    })
                }
                Err(error) => return Err(error),
            }
        }
        let sequence = self.sequences.get(&slot).copied().unwrap_or(0);
        self.attempt(&slot, sequence, records).await
    }

    /// Send again the batch to one partition whose send failed (its
    /// outcome unknown), under its own sequence: answered with its offsets
    /// whether this attempt or the failed one appended it. `Ok(None)` if no
    /// batch to that partition is unresolved. A caller that wants a failed
    /// batch delivered once calls this rather than sending the records
    /// again, which would append them a second time if the failed send had.
    pub async fn resend_unresolved(&mut self, topic: &str, partition: u32) -> Result<Option<Sent>, ClientError> {
        let slot = (topic.to_string(), partition);
        let Some((sequence, records)) = self.unresolved.get(&slot).cloned() else { return Ok(None) };
        self.attempt(&slot, sequence, records).await.map(Some)
    }

    /// The partition forgot this producer: continue under a new id. Every
    /// partition starts again at sequence 0; batches of other partitions
    /// whose outcome is unknown are resent under the new id (so they may be
    /// appended twice, never lost); the refused one goes back to the caller.
    async fn reset(&mut self, slot: &(String, u32), status: &tonic::Status, records: Vec<pb::Record>) -> ClientError {
        let old_producer_id = self.producer_id;
        match self.client.allocate_producer_id().await {
            Ok(id) => self.producer_id = id,
            Err(error) => return error,
        }
        self.sequences.clear();
        self.unresolved.remove(slot);
        for (sequence, _) in self.unresolved.values_mut() {
            *sequence = 0;
        }
        ClientError::ProducerReset {
            old_producer_id,
            new_producer_id: self.producer_id,
            reason: status.message().to_string(),
            unknown: records,
            unsent: Vec::new(),
        }
    }

    async fn attempt(
        &mut self,
        slot: &(String, u32),
        sequence: u64,
        records: Vec<pb::Record>,
    ) -> Result<Sent, ClientError> {
        let (topic, partition) = (slot.0.clone(), slot.1);
        let (_, topic_id) = self.topic(&topic).await?;
        let request = pb::ProduceRequest {
            topic,
            partition,
            records: records.clone(),
            idempotent: true,
            producer_id: self.producer_id,
            sequence,
            topic_id: Some(topic_id),
        };
        match self.client.produce(request).await {
            Ok(response) => {
                self.unresolved.remove(slot);
                self.sequences.insert(slot.clone(), sequence + 1);
                Ok(Sent {
                    partition,
                    base_offset: response.base_offset,
                    count: response.count,
                    duplicate: response.duplicate,
                    topic_id,
                })
            }
            Err(ClientError::Refused(status)) if status.metadata().get(PRODUCER_LOST_METADATA).is_some() => {
                Err(self.reset(slot, &status, records).await)
            }
            Err(ClientError::Refused(status)) if status.metadata().get(TOPIC_GONE_METADATA).is_some() => {
                // The incarnation this producer knew was deleted: forget it,
                // so that the next send looks the topic up again.
                self.topics.forget(&slot.0);
                self.sequences.retain(|(topic, _), _| *topic != slot.0);
                self.unresolved.retain(|(topic, _), _| *topic != slot.0);
                Err(ClientError::Refused(status))
            }
            Err(error) => {
                self.unresolved.insert(slot.clone(), (sequence, records));
                Err(error)
            }
        }
    }
}
