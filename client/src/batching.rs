//! The batching producer: records are gathered per partition into batches
//! (up to a size, or until a linger time passes, like Kafka's `batch.size`
//! and `linger.ms`) and several batches per partition are kept in flight,
//! each idempotent (G8).
//!
//! Each partition has a worker task that owns its queue, its producer id and
//! its sequence. Batches go out in sequence order; their answers are taken
//! in that order too. A broker that sees a batch before the one ahead of it
//! refuses it as a sequence gap, which means it was not appended: the
//! worker sends it again once the batches ahead are answered. A batch whose
//! outcome stays unknown (the client's retries ran out, or the partition
//! forgot the producer) breaks the sequence: its records are reported
//! [`SendError::Unknown`], the worker takes a new producer id, and batches
//! behind it that were refused as gaps are sent again under the new id,
//! unless an attempt of theirs went unanswered (it may still land under
//! the old id): those are reported unknown too.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use keel_core::routing::{partition_for_key, KeylessSpreader};
use keel_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{
    Client, ClientError, KnownTopics, AFTER_UNANSWERED_METADATA, PRODUCER_LOST_METADATA, SEQUENCE_GAP_METADATA,
    TOPIC_GONE_METADATA,
};

/// How the batching producer gathers and sends.
#[derive(Debug, Clone, Copy)]
pub struct BatchingConfig {
    /// How long a batch waits for more records before it goes.
    pub linger: Duration,
    /// Most records in one batch (the broker's default limit is 10,000).
    pub batch_records: usize,
    /// Most value and key bytes in one batch (the broker's default limit is
    /// 4 MiB); a single larger record goes alone.
    pub batch_bytes: usize,
    /// Batches in flight per partition.
    pub in_flight: usize,
    /// Keyless records stick to one partition for a batch's worth of
    /// records (fewer, fuller batches, like Kafka's sticky partitioner)
    /// rather than going round-robin record by record.
    pub sticky_keyless: bool,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            linger: Duration::from_millis(5),
            batch_records: 1000,
            batch_bytes: 1024 * 1024,
            in_flight: 5,
            sticky_keyless: true,
        }
    }
}

/// Records waiting per partition before [`BatchingProducer::send`] waits for
/// room, in batches.
const QUEUED_BATCHES_MAX: usize = 4;
/// Times a batch refused as a sequence gap is sent again, with every batch
/// ahead of it answered, before the producer gives up on its sequence.
const GAP_RESENDS_MAX: usize = 3;

/// Why a record was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The broker refused the batch: it was not appended.
    #[error("refused: {message} ({code:?})")]
    Refused { code: tonic::Code, message: String },
    /// The record may or may not have been appended.
    #[error(
        "the outcome is unknown ({reason}): send the record again if it must be delivered (it may then be appended twice)"
    )]
    Unknown { reason: String },
}

/// Where an acknowledged record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: u32,
    pub offset: u64,
    /// The incarnation of the topic the record went to.
    pub topic_id: u64,
}

/// The acknowledgement of one record, to wait for.
pub struct Ack(oneshot::Receiver<Result<Delivered, SendError>>);

impl Ack {
    /// Wait until the record is acknowledged or known to have failed.
    pub async fn wait(self) -> Result<Delivered, SendError> {
        self.0.await.unwrap_or_else(|_| Err(SendError::Unknown { reason: "the producer stopped".into() }))
    }
}

/// A partition worker's queue and task.
type WorkerHandle = (mpsc::Sender<Queued>, JoinHandle<()>);

struct Queued {
    record: pb::Record,
    done: oneshot::Sender<Result<Delivered, SendError>>,
}

/// Routing state: partition counts and incarnations, and the sticky
/// partition of keyless records.
struct Routing {
    topics: KnownTopics,
    spreader: KeylessSpreader,
    /// Keyless records stick to one partition until a batch of them went.
    sticky: BTreeMap<String, (u32, usize)>,
}

/// A producer that batches and pipelines. Cheap to share behind an `Arc`;
/// [`BatchingProducer::close`] sends what is queued and waits for it.
pub struct BatchingProducer {
    client: Client,
    config: BatchingConfig,
    routing: tokio::sync::Mutex<Routing>,
    workers: Mutex<BTreeMap<(String, u32), WorkerHandle>>,
}

impl BatchingProducer {
    /// A producer over `client`. `spread_start` seeds the choice of
    /// partitions for keyless records (draw it from your RNG).
    pub fn new(client: Client, config: BatchingConfig, spread_start: u64) -> BatchingProducer {
        let config = BatchingConfig {
            batch_records: config.batch_records.max(1),
            batch_bytes: config.batch_bytes.max(1),
            in_flight: config.in_flight.max(1),
            ..config
        };
        BatchingProducer {
            client,
            config,
            routing: tokio::sync::Mutex::new(Routing {
                topics: KnownTopics::default(),
                spreader: KeylessSpreader::new(spread_start),
                sticky: BTreeMap::new(),
            }),
            workers: Mutex::new(BTreeMap::new()),
        }
    }

    /// Queue `record` for `topic`: to the partition of `record.key` (FNV-1a
    /// 64 modulo the partition count), or, without a key, to the partition
    /// keyless records currently stick to. Waits while the partition's
    /// queue is full. The returned [`Ack`] resolves once the record is
    /// acknowledged.
    pub async fn send(&self, topic: &str, record: pb::Record) -> Result<Ack, ClientError> {
        self.send_routed(topic, None, record).await
    }

    /// Queue `record` for partition `partition` of `topic`, whatever its
    /// key. A partition the topic does not have is refused
    /// (`INVALID_ARGUMENT`).
    pub async fn send_to(&self, topic: &str, partition: u32, record: pb::Record) -> Result<Ack, ClientError> {
        self.send_routed(topic, Some(partition), record).await
    }

    async fn send_routed(&self, topic: &str, to: Option<u32>, record: pb::Record) -> Result<Ack, ClientError> {
        let (partition, topic_id) = {
            let mut routing = self.routing.lock().await;
            // A worker stops once the topic it sent to was deleted: drop it,
            // and look the topic up again (it may exist anew).
            let gone: Vec<(String, u32)> = self
                .workers
                .lock()
                .expect("workers")
                .iter()
                .filter(|((t, _), (_, handle))| t == topic && handle.is_finished())
                .map(|(key, _)| key.clone())
                .collect();
            if !gone.is_empty() {
                let mut workers = self.workers.lock().expect("workers");
                for key in gone {
                    workers.remove(&key);
                }
                routing.topics.forget(topic);
            }
            let (count, topic_id) = routing.topics.get(&self.client, topic).await?;
            let refused = |e: keel_core::routing::RoutingError| {
                ClientError::Refused(tonic::Status::invalid_argument(e.to_string()))
            };
            let partition = match (to, &record.key) {
                (Some(partition), _) if partition < count => partition,
                (Some(partition), _) => {
                    return Err(ClientError::Refused(tonic::Status::invalid_argument(format!(
                        "topic {topic} has partitions 0..{count}, not {partition}"
                    ))))
                }
                (None, Some(key)) => partition_for_key(key, count).map_err(refused)?.0,
                (None, None) if !self.config.sticky_keyless => {
                    routing.spreader.next_partition(count).map_err(refused)?.0
                }
                (None, None) => {
                    let batch_records = self.config.batch_records;
                    let Routing { spreader, sticky, .. } = &mut *routing;
                    match sticky.get_mut(topic) {
                        Some((partition, sent)) if *sent < batch_records => {
                            *sent += 1;
                            *partition
                        }
                        _ => {
                            let partition = spreader.next_partition(count).map_err(refused)?.0;
                            sticky.insert(topic.to_string(), (partition, 1));
                            partition
                        }
                    }
                }
            };
            (partition, topic_id)
        };
        let queue = self.worker(topic, partition, topic_id);
        let (done, ack) = oneshot::channel();
        if let Err(mpsc::error::SendError(queued)) = queue.send(Queued { record, done }).await {
            let _ = queued.done.send(Err(SendError::Unknown { reason: "the partition's worker stopped".into() }));
        }
        Ok(Ack(ack))
    }

    /// The queue of a partition's worker, started on first use.
    fn worker(&self, topic: &str, partition: u32, topic_id: u64) -> mpsc::Sender<Queued> {
        let mut workers = self.workers.lock().expect("workers");
        let key = (topic.to_string(), partition);
        if let Some((queue, _)) = workers.get(&key) {
            return queue.clone();
        }
        let (queue, incoming) = mpsc::channel(self.config.batch_records * QUEUED_BATCHES_MAX);
        let worker = Worker {
            client: self.client.clone(),
            config: self.config,
            topic: topic.to_string(),
            partition,
            topic_id,
            producer_id: None,
            next_sequence: 0,
            pending: Vec::new(),
            pending_bytes: 0,
            linger_until: None,
            in_flight: VecDeque::new(),
            resend: VecDeque::new(),
            topic_gone: false,
        };
        let handle = tokio::spawn(worker.run(incoming));
        workers.insert(key, (queue.clone(), handle));
        queue
    }

    /// Send everything queued, wait until every record is answered, and
    /// stop. Records sent after this start are answered as failed.
    pub async fn close(&self) {
        let workers = std::mem::take(&mut *self.workers.lock().expect("workers"));
        for (_, (queue, handle)) in workers {
            drop(queue);
            let _ = handle.await;
        }
    }
}

/// A batch being sent, or to send again.
struct Batch {
    records: Vec<pb::Record>,
    done: Vec<oneshot::Sender<Result<Delivered, SendError>>>,
}

struct InFlight {
    batch: Batch,
    /// (producer id, sequence) it was sent with.
    sent_as: (u64, u64),
    reply: JoinHandle<Result<pb::ProduceResponse, ClientError>>,
}

/// One partition's sender.
struct Worker {
    client: Client,
    config: BatchingConfig,
    topic: String,
    partition: u32,
    topic_id: u64,
    producer_id: Option<u64>,
    next_sequence: u64,
    /// Records gathered for the next batch.
    pending: Vec<Queued>,
    pending_bytes: usize,
    /// When the pending batch goes even if not full.
    linger_until: Option<Instant>,
    in_flight: VecDeque<InFlight>,
    /// Batches refused as gaps after a broken sequence: not appended, sent
    /// again (first) under the next producer id.
    resend: VecDeque<Batch>,
    /// The incarnation of the topic this worker sends to was deleted:
    /// everything still queued is refused, and the worker stops (the
    /// producer starts a new one for the topic's next incarnation).
    topic_gone: bool,
}

enum Event {
    Answered(Result<pb::ProduceResponse, ClientError>),
    Record(Option<Queued>),
    Lingered,
}

fn record_bytes(record: &pb::Record) -> usize {
    record.value.len() + record.key.as_ref().map_or(0, Vec::len)
}

/// Whether a refusal says the batch's sequence is ahead of what the
/// partition expects (not appended): a batch ahead of it had not landed
/// yet, or the partition does not know (or no longer knows) the producer.
fn is_gap(error: &ClientError) -> bool {
    matches!(error, ClientError::Refused(status) if status.metadata().get(SEQUENCE_GAP_METADATA).is_some())
}

/// Whether an earlier attempt of the request that was refused went
/// unanswered: it may still be applied, so the refusal does not settle it.
fn after_unanswered(error: &ClientError) -> bool {
    matches!(error, ClientError::Refused(status) if status.metadata().get(AFTER_UNANSWERED_METADATA).is_some())
}

fn failure(error: &ClientError) -> SendError {
    match error {
        ClientError::Refused(status)
            if status.metadata().get(PRODUCER_LOST_METADATA).is_none() && !after_unanswered(error) =>
        {
            SendError::Refused { code: status.code(), message: status.message().to_string() }
        }
        other => SendError::Unknown { reason: other.to_string() },
    }
}

/// The answer of a send task (a task that failed is an unknown outcome).
async fn send_outcome(
    reply: &mut JoinHandle<Result<pb::ProduceResponse, ClientError>>,
) -> Result<pb::ProduceResponse, ClientError> {
    reply.await.unwrap_or_else(|e| {
        Err(ClientError::GaveUp { deadline: Duration::ZERO, last: format!("the send task failed: {e}") })
    })
}

/// Wait for the oldest batch in flight (never, if none is).
async fn oldest(in_flight: &mut VecDeque<InFlight>) -> Result<pb::ProduceResponse, ClientError> {
    match in_flight.front_mut() {
        Some(sent) => send_outcome(&mut sent.reply).await,
        None => std::future::pending().await,
    }
}

impl Worker {
    async fn run(mut self, mut incoming: mpsc::Receiver<Queued>) {
        let mut open = true;
        loop {
            if self.topic_gone {
                return self.refuse_everything(incoming).await;
            }
            // After a broken sequence, nothing new goes until every batch sent
            // under the old producer id is answered, so records stay in order.
            let settled = self.in_flight.iter().all(|f| Some(f.sent_as.0) == self.producer_id);
            let room = self.in_flight.len() < self.config.in_flight && settled;
            let full = self.pending.len() >= self.config.batch_records || self.pending_bytes >= self.config.batch_bytes;
            let lingered = self.linger_until.is_some_and(|t| t <= Instant::now());
            if room && !self.resend.is_empty() {
                let batch = self.resend.pop_front().expect("a batch to resend");
                self.send(batch).await;
                continue;
            }
            if room && !self.pending.is_empty() && (full || lingered || !open) {
                let pending = std::mem::take(&mut self.pending);
                self.pending_bytes = 0;
                self.linger_until = None;
                let (records, done) = pending.into_iter().map(|q| (q.record, q.done)).unzip();
                self.send(Batch { records, done }).await;
                continue;
            }
            if !open && self.pending.is_empty() && self.in_flight.is_empty() && self.resend.is_empty() {
                return;
            }
            let linger_until = self.linger_until;
            let event = tokio::select! {
                biased;
                answer = oldest(&mut self.in_flight) => Event::Answered(answer),
                record = incoming.recv(), if open && !full => Event::Record(record),
                _ = tokio::time::sleep_until(linger_until.unwrap_or_else(Instant::now)), if room && linger_until.is_some() => Event::Lingered,
            };
            match event {
                Event::Answered(answer) => {
                    #[allow(unused_mut)]
                    let mut sent = self.in_flight.pop_front().expect("the batch answered");
                    #[cfg(madsim)]
                    if keel_core::planted::is_planted(keel_core::planted::Bug::BatchingAnswersNewest) {
                        if let Some(newest) = self.in_flight.back_mut() {
                            std::mem::swap(&mut sent.batch, &mut newest.batch);
                        }
                    }
                    self.answered(sent, answer).await;
                }
                Event::Record(Some(queued)) => {
                    if self.pending.is_empty() {
                        self.linger_until = Some(Instant::now() + self.config.linger);
                    }
                    self.pending_bytes += record_bytes(&queued.record);
                    self.pending.push(queued);
                }
                Event::Record(None) => open = false,
                Event::Lingered => {}
            }
        }
    }

    /// The topic was deleted: answer every record queued here, and those
    /// in flight once they come back, as refused.
    async fn refuse_everything(mut self, mut incoming: mpsc::Receiver<Queued>) {
        incoming.close();
        let gone = SendError::Refused {
            code: tonic::Code::NotFound,
            message: format!("topic {} was deleted (the incarnation this producer sent to)", self.topic),
        };
        while let Some(queued) = incoming.recv().await {
            let _ = queued.done.send(Err(gone.clone()));
        }
        for queued in std::mem::take(&mut self.pending) {
            let _ = queued.done.send(Err(gone.clone()));
        }
        for batch in std::mem::take(&mut self.resend) {
            finish(batch, Err(gone.clone()));
        }
        while let Some(mut sent) = self.in_flight.pop_front() {
            let answer = send_outcome(&mut sent.reply).await;
            let outcome = match answer {
                Ok(response) => Ok(response),
                Err(_) => Err(gone.clone()),
            };
            match outcome {
                Ok(response) => {
                    let (partition, topic_id) = (self.partition, self.topic_id);
                    for (done, offset) in sent.batch.done.into_iter().zip(response.base_offset..) {
                        let _ = done.send(Ok(Delivered { partition, offset, topic_id }));
                    }
                }
                Err(error) => finish(sent.batch, Err(error)),
            }
        }
    }

    /// Send `batch` with the next sequence of this worker's producer id.
    async fn send(&mut self, batch: Batch) {
        let producer_id = match self.producer_id {
            Some(id) => id,
            None => match self.client.allocate_producer_id().await {
                Ok(id) => {
                    self.producer_id = Some(id);
                    self.next_sequence = 0;
                    id
                }
                Err(error) => {
                    let failed = SendError::Refused { code: tonic::Code::Unavailable, message: error.to_string() };
                    finish(batch, Err(failed));
                    return;
                }
            },
        };
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let reply = self.spawn_send(&batch.records, producer_id, sequence);
        self.in_flight.push_back(InFlight { batch, sent_as: (producer_id, sequence), reply });
    }

    fn spawn_send(
        &self,
        records: &[pb::Record],
        producer_id: u64,
        sequence: u64,
    ) -> JoinHandle<Result<pb::ProduceResponse, ClientError>> {
        let request = pb::ProduceRequest {
            topic: self.topic.clone(),
            partition: self.partition,
            records: records.to_vec(),
            idempotent: true,
            producer_id,
            sequence,
            topic_id: Some(self.topic_id),
        };
        let client = self.client.clone();
        // Boxed, as a poll's call (`consumer.rs`).
        tokio::spawn(Box::pin(async move { client.produce(request).await }))
    }

    /// The oldest batch in flight was answered: every batch ahead of it is
    /// settled.
    async fn answered(&mut self, mut sent: InFlight, mut answer: Result<pb::ProduceResponse, ClientError>) {
        let (producer_id, sequence) = sent.sent_as;
        // Refused as a gap with nothing ahead of it in flight: the batch ahead
        // landed after it was checked. Send it again, now that it is next.
        let mut resends = 0;
        while answer.as_ref().is_err_and(is_gap) && self.producer_id == Some(producer_id) && resends < GAP_RESENDS_MAX {
            resends += 1;
            answer = send_outcome(&mut self.spawn_send(&sent.batch.records, producer_id, sequence)).await;
        }
        match answer {
            Ok(response) => {
                let (partition, topic_id) = (self.partition, self.topic_id);
                let offsets = response.base_offset..;
                for (done, offset) in std::mem::take(&mut sent.batch.done).into_iter().zip(offsets) {
                    let _ = done.send(Ok(Delivered { partition, offset, topic_id }));
                }
            }
            // Sent under a producer id given up since: not appended (it was
            // refused as a gap); send it again under the new one. Unless an
            // attempt of it went unanswered: that one may still land under
            // the old id once the batches ahead of it do (sim seed
            // 320001270: sent again, it was appended twice), so its outcome
            // is unknown.
            Err(error) if is_gap(&error) && !after_unanswered(&error) && self.producer_id != Some(producer_id) => {
                self.resend.push_back(sent.batch)
            }
            Err(ClientError::Refused(status)) if status.metadata().get(TOPIC_GONE_METADATA).is_some() => {
                self.topic_gone = true;
                let failed = SendError::Refused { code: status.code(), message: status.message().to_string() };
                finish(sent.batch, Err(failed));
            }
            Err(error) => {
                let failed = failure(&error);
                // The sequence is broken (the outcome of this batch is not
                // known, or the partition forgot the producer): continue
                // under a new producer id.
                if matches!(failed, SendError::Unknown { .. }) || is_gap(&error) {
                    self.producer_id = None;
                }
                finish(sent.batch, Err(failed));
            }
        }
    }
}

fn finish(batch: Batch, outcome: Result<Delivered, SendError>) {
    for done in batch.done {
        let _ = done.send(outcome.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(after_unanswered: bool) -> ClientError {
        let mut status = tonic::Status::failed_precondition("producer 2 sent sequence 12 but 10 was next");
        status.metadata_mut().insert(SEQUENCE_GAP_METADATA, "true".parse().unwrap());
        if after_unanswered {
            status.metadata_mut().insert(AFTER_UNANSWERED_METADATA, "true".parse().unwrap());
        }
        ClientError::Refused(status)
    }

    /// A gap refusal settles a batch (not appended, safe to send again
    /// under a new producer id) only if no attempt of it went unanswered:
    /// such an attempt may land later (sim seed 320001270).
    #[test]
    fn a_gap_after_an_unanswered_attempt_leaves_the_outcome_unknown() {
        assert!(is_gap(&gap(false)) && !after_unanswered(&gap(false)));
        assert!(matches!(failure(&gap(false)), SendError::Refused { .. }));
        assert!(after_unanswered(&gap(true)));
        assert!(matches!(failure(&gap(true)), SendError::Unknown { .. }));
    }
}
