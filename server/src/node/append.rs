//! Coalesced appends: concurrent produce requests to one partition leader
//! share one Raft entry.
//!
//! openraft 0.9 appends one client write at a time and waits for its
//! storage call, so one entry per request means one log write (and, under
//! load, one fsync) per request. Here each partition has a lane: requests
//! queue in it, and one driver at a time takes everything queued (bounded by
//! batches and bytes) into one [`PartitionCommand::AppendBatches`] and
//! submits it, keeping at most [`ENTRIES_IN_FLIGHT_MAX`] entries in flight.
//! While those commit, the next requests gather. Each request keeps its own
//! outcome, rejection and idempotent sequence check (G8): the state machine
//! applies the batches in order, each exactly as an append of its own.
//!
//! Submissions are made by one driver at a time, in queue order, so the log
//! holds the batches in the order they arrived.

use std::collections::{BTreeMap, VecDeque};

use keel_core::partition::{AppendBatch, PartitionCommand, PartitionOutcome, PartitionResult, APPEND_BATCHES_MAX};
use keel_core::record::Record;
use tokio::sync::oneshot;

use super::{Node, ProposeError};
use crate::group::GroupId;
use crate::raft::types::{Command, Response};

/// Entries of coalesced appends one partition leader keeps in flight. More
/// let entries overlap in the log and on the wire; fewer make each larger.
/// 1, 2, 4, 8 and 16 were measured (one broker and three, 256 requests in
/// flight, 2026-12-01): 1 and 2 did best, within noise of each other; more
/// were slower, each entry costing the writer a transaction and an fsync.
pub const ENTRIES_IN_FLIGHT_MAX: usize = 2;
/// Record bytes gathered into one entry, in bytes. A single batch larger
/// than this still goes, alone.
pub const ENTRY_BYTES_MAX: u64 = 1024 * 1024;
/// Batches gathered into one entry.
pub const ENTRY_BATCHES_MAX: usize = 1024;
const _: () = assert!(ENTRY_BATCHES_MAX <= APPEND_BATCHES_MAX);

/// One request waiting in a lane.
struct Waiting {
    batch: AppendBatch,
    bytes: u64,
    reply: oneshot::Sender<Result<PartitionResult, ProposeError>>,
}

/// One partition group's queue. The queue's size is bounded by the API's
/// admission budget of bytes in flight.
#[derive(Default)]
struct Lane {
    queue: VecDeque<Waiting>,
    /// Entries submitted and not yet answered.
    in_flight: usize,
    /// Whether a driver is running (at most one).
    driving: bool,
}

/// Every lane of a node, by partition group.
#[derive(Default)]
pub(super) struct Lanes(std::sync::Mutex<BTreeMap<GroupId, Lane>>);

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<GroupId, Lane>> {
        self.0.lock().expect("append lanes")
    }
}

impl Node {
    /// Append one batch to a partition group led here, sharing a Raft entry
    /// with the batches sent concurrently. Returns the batch's own outcome.
    pub async fn append(&self, group: &GroupId, batch: AppendBatch) -> Result<PartitionResult, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let bytes = batch.records.iter().map(Record::size_bytes).sum();
        let start_driver = {
            let mut lanes = self.inner.lanes.lock();
            let lane = lanes.entry(group.clone()).or_default();
            lane.queue.push_back(Waiting { batch, bytes, reply });
            lane.may_drive()
        };
        if start_driver {
            self.spawn_driver(group.clone());
        }
        answer.await.unwrap_or_else(|_| {
            Err(ProposeError::Raft { group: group.clone(), reason: "the broker is stopping".into() })
        })
    }

    fn spawn_driver(&self, group: GroupId) {
        let node = self.clone();
        tokio::spawn(async move { node.drive(group).await });
    }

    /// Submit entries while requests wait and the in-flight bound allows.
    async fn drive(self, group: GroupId) {
        loop {
            let taken = {
                let mut lanes = self.inner.lanes.lock();
                let Some(lane) = lanes.get_mut(&group) else { return };
                if lane.queue.is_empty() || lane.in_flight >= ENTRIES_IN_FLIGHT_MAX {
                    lane.driving = false;
                    if lane.is_idle() {
                        lanes.remove(&group);
                    }
                    return;
                }
                lane.in_flight += 1;
                lane.take_entry()
            };
            let (batches, replies): (Vec<_>, Vec<_>) = taken.into_iter().map(|w| (w.batch, w.reply)).unzip();
            self.metrics().append_entry(batches.len() as u64);
            let command = Command::Partition(PartitionCommand::AppendBatches { batches });
            tracing::debug!(%group, batches = replies.len(), "submitting an entry of appends");
            match self.submit(&group, command).await {
                Ok(submitted) => {
                    let node = self.clone();
                    let group = group.clone();
                    tokio::spawn(async move {
                        let outcome = node.outcome(submitted).await;
                        tracing::debug!(%group, ok = outcome.is_ok(), "an entry of appends was answered");
                        node.entry_done(&group);
                        answer_each(&group, replies, outcome);
                    });
                }
                Err(error) => {
                    self.entry_done(&group);
                    answer_each(&group, replies, Err(error));
                }
            }
        }
    }

    /// One entry of `group` was answered: start a driver if requests wait.
    fn entry_done(&self, group: &GroupId) {
        let start_driver = {
            let mut lanes = self.inner.lanes.lock();
            let Some(lane) = lanes.get_mut(group) else { return };
            lane.in_flight -= 1;
            if lane.is_idle() {
                lanes.remove(group);
                false
            } else {
                lane.may_drive()
            }
        };
        if start_driver {
            self.spawn_driver(group.clone());
        }
    }
}

impl Lane {
    /// Whether a new driver should start (and mark it started).
    fn may_drive(&mut self) -> bool {
        let start = !self.driving && self.in_flight < ENTRIES_IN_FLIGHT_MAX && !self.queue.is_empty();
        self.driving |= start;
        start
    }

    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.in_flight == 0 && !self.driving
    }

    /// The queued requests of the next entry: at least one, then as many as
    /// fit the bounds.
    fn take_entry(&mut self) -> Vec<Waiting> {
        let mut taken: Vec<Waiting> = Vec::new();
        let mut bytes = 0u64;
        while let Some(next) = self.queue.front() {
            let full = taken.len() >= ENTRY_BATCHES_MAX || (!taken.is_empty() && bytes + next.bytes > ENTRY_BYTES_MAX);
            if full {
                break;
            }
            bytes += next.bytes;
            taken.extend(self.queue.pop_front());
        }
        taken
    }
}

/// Hand each request of an entry its own result.
fn answer_each(
    group: &GroupId,
    replies: Vec<oneshot::Sender<Result<PartitionResult, ProposeError>>>,
    outcome: Result<Response, ProposeError>,
) {
    let results: Vec<Result<PartitionResult, ProposeError>> = match outcome {
        Ok(Response::Partition(Ok(PartitionOutcome::AppendedBatches { results })))
            if results.len() == replies.len() =>
        {
            results.into_iter().map(Ok).collect()
        }
        // The whole entry was refused (never for entries built here).
        Ok(Response::Partition(Err(rejection))) => replies.iter().map(|_| Ok(Err(rejection.clone()))).collect(),
        Ok(other) => {
            let reason = format!("an entry of appends was answered {other:?}");
            replies.iter().map(|_| Err(ProposeError::Raft { group: group.clone(), reason: reason.clone() })).collect()
        }
        Err(error) => replies.iter().map(|_| Err(error.clone())).collect(),
    };
    for (reply, result) in replies.into_iter().zip(results) {
        // A request whose caller went away needs no answer.
        let _ = reply.send(result);
    }
}
