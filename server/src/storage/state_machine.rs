//! openraft's `RaftStateMachine` for one group: keel-core's metadata or
//! partition state machine, persisted in the node's database.
//!
//! Apply decodes nothing itself and decides nothing: every outcome comes
//! from keel-core (G7). A command meant for the other kind of group is
//! recorded as `Response::WrongGroup`.

use std::sync::{Arc, Mutex};

use keel_core::metadata::MetadataState;
use keel_core::partition::{PartitionState, RecordLog};
use keel_core::record::StoredRecord;
use keel_core::{Limits, Offset};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{Entry, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder};
use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use super::log_store::io_error;
use super::records::{self, RecordReader, RecordWriter};
use super::snapshot_file::{self, SnapshotFile};
use super::store::{NodeStore, StoreError, SNAPSHOTS, STATE};
use crate::raft::types::{Command, LogId, Response, SnapshotMeta, StorageError, StoredMembership, TypeConfig};

/// The core state machine a group runs, shared behind an `Arc`: readers take
/// it without copying, and apply copies it (once per applied batch) only
/// while a reader still holds the previous one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupState {
    Metadata(Arc<MetadataState>),
    Partition(Arc<PartitionState>),
}

/// What a group's state machine has applied, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: GroupState,
}

/// A group's state, shared with the node (for reads and reconciliation).
/// Locked only for short synchronous sections, never across an `.await`.
pub type SharedGroupState = Arc<Mutex<GroupState>>;

/// One group's state machine.
#[derive(Debug, Clone)]
pub struct GroupStateMachine {
    store: Arc<NodeStore>,
    group: String,
    last_applied: Arc<Mutex<(Option<LogId>, StoredMembership)>>,
    /// The state apply works on, inside the writer's transaction.
    working: SharedGroupState,
    /// The state as of the last committed apply: what readers see, so that
    /// it never runs ahead of the committed records.
    state: SharedGroupState,
    /// Woken after every applied batch (one waiter: the node's reconciler).
    applied_notify: Option<Arc<tokio::sync::Notify>>,
    /// Counts snapshot streams received, for their chunk keys.
    incoming_streams: Arc<std::sync::atomic::AtomicU64>,
}

// A snapshot stream is the `Applied` header, then (for partitions) every
// stored record, each a separate item (see `snapshot_file`).

fn sm_error(verb: ErrorVerb) -> impl FnOnce(StoreError) -> StorageError {
    move |e| io_error(ErrorSubject::StateMachine, verb, e)
}

fn snapshot_error(verb: ErrorVerb) -> impl FnOnce(StoreError) -> StorageError {
    move |e| io_error(ErrorSubject::Snapshot(None), verb, e)
}

impl GroupStateMachine {
    /// Open a group's state machine, starting from `initial` if the store
    /// has none for it yet.
    pub fn open(store: Arc<NodeStore>, group: String, initial: GroupState) -> Result<Self, StoreError> {
        // A snapshot being received when the node stopped is abandoned.
        snapshot_file::remove_incoming(&store, &group)?;
        let stored: Option<Applied> = store.read(|txn| {
            let table = txn.open_table(STATE)?;
            let value = table.get(group.as_str())?;
            Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
        })?;
        let applied =
            stored.unwrap_or(Applied { last_applied: None, membership: StoredMembership::default(), state: initial });
        Ok(GroupStateMachine {
            store,
            group,
            last_applied: Arc::new(Mutex::new((applied.last_applied, applied.membership))),
            working: Arc::new(Mutex::new(applied.state.clone())),
            state: Arc::new(Mutex::new(applied.state)),
            applied_notify: None,
            incoming_streams: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        })
    }

    fn wake_watcher(&self) {
        if let Some(notify) = &self.applied_notify {
            notify.notify_one();
        }
    }

    /// Wake `notify` after every applied batch.
    pub fn notify_on_apply(mut self, notify: Arc<tokio::sync::Notify>) -> Self {
        self.applied_notify = Some(notify);
        self
    }

    /// A metadata state machine with these (cluster-wide) limits.
    pub fn initial_metadata(limits: Limits) -> GroupState {
        GroupState::Metadata(Arc::new(MetadataState::new(limits)))
    }

    /// A partition state machine with these limits.
    pub fn initial_partition(limits: Limits) -> GroupState {
        GroupState::Partition(Arc::new(PartitionState::new(limits)))
    }

    /// The state, shared.
    pub fn state(&self) -> SharedGroupState {
        Arc::clone(&self.state)
    }

    /// Read records of this (partition) group: `read` gets a record reader.
    pub fn with_records<T>(
        &self,
        read: impl FnOnce(&PartitionState, &RecordReader<'_>) -> T,
    ) -> Result<Option<T>, StoreError> {
        // The state first, then the transaction: the transaction then sees
        // at least every record that state has committed.
        let GroupState::Partition(partition) = self.state.lock().expect("group state").clone() else { return Ok(None) };
        self.store.read(|txn| {
            let reader = RecordReader::new(txn, self.group.as_str())?;
            Ok(Some(read(&partition, &reader)))
        })
    }

    fn applied(&self) -> Applied {
        let (last_applied, membership) = self.last_applied.lock().expect("applied").clone();
        Applied { last_applied, membership, state: self.working.lock().expect("group state").clone() }
    }

    async fn apply_entries(&self, entries: Vec<Entry<TypeConfig>>) -> Result<Vec<Response>, StoreError> {
        let (group, state, last_applied) = (self.group.clone(), self.working.clone(), self.last_applied.clone());
        // Runs in the node writer's transaction; not synced (the log replays it).
        let (responses, committed) = self
            .store
            .write(false, move |txn| {
                let group = group.as_str();
                let mut state = state.lock().expect("group state");
                let mut log = match &*state {
                    GroupState::Partition(_) => Some(RecordWriter::new(txn, group)?),
                    GroupState::Metadata(_) => None,
                };
                let mut applied = last_applied.lock().expect("applied");
                let mut responses = Vec::with_capacity(entries.len());
                for entry in entries {
                    applied.0 = Some(entry.log_id);
                    if let Some(log) = &mut log {
                        log.entry(entry.log_id.index)?;
                    }
                    let response = match entry.payload {
                        EntryPayload::Blank => Response::None,
                        EntryPayload::Membership(membership) => {
                            applied.1 = StoredMembership::new(Some(entry.log_id), membership);
                            Response::None
                        }
                        EntryPayload::Normal(request) => match (&mut *state, &request.command) {
                            (GroupState::Metadata(metadata), Command::Metadata(command)) => {
                                Response::Metadata(Arc::make_mut(metadata).apply(applied_at(&request), command))
                            }
                            (GroupState::Partition(partition), Command::Partition(command)) => {
                                let log = log.as_mut().expect("a partition group has a record writer");
                                let partition = Arc::make_mut(partition);
                                Response::Partition(partition.apply(log, applied_at(&request), command)?)
                            }
                            _ => Response::WrongGroup,
                        },
                    };
                    responses.push(response);
                }
                if let Some(log) = log {
                    log.finish()?;
                }
                let row = Applied { last_applied: applied.0, membership: applied.1.clone(), state: state.clone() };
                txn.open_table(STATE)?.insert(group, postcard::to_stdvec(&row)?.as_slice())?;
                Ok((responses, row.state))
            })
            .await?;
        // Readers see the new state only now that its records are committed.
        *self.state.lock().expect("group state") = committed;
        Ok(responses)
    }

    async fn build(&self) -> Result<Snapshot<TypeConfig>, StoreError> {
        // The log may be purged up to this snapshot: make the state durable.
        self.store.flush().await?;
        // The state and the records as of one committed transaction, so the
        // snapshot is consistent with its own last_log_id.
        let view = self.store.db()?.begin_read()?;
        let row = view.open_table(STATE)?.get(self.group.as_str())?.map(|v| v.value().to_vec());
        let applied: Applied = match row {
            Some(bytes) => postcard::from_bytes(&bytes)?,
            None => self.applied(),
        };
        let snapshot_id = match applied.last_applied {
            Some(log_id) => format!("{}-{}", log_id.leader_id, log_id.index),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id,
        };
        let key = format!("{}/snapshot-{}", self.group, meta.snapshot_id);
        let mut file = SnapshotFile::create(self.store.clone(), key)?;
        file.write_item(&applied)?;
        if let GroupState::Partition(partition) = &applied.state {
            // One record in memory at a time.
            let reader = RecordReader::new(&view, self.group.as_str())?;
            let mut offset = partition.log_start();
            #[allow(unused_mut)]
            let mut end = partition.high_watermark();
            #[cfg(madsim)]
            if keel_core::planted::is_planted(keel_core::planted::Bug::SnapshotDropsLastRecord) && end > offset {
                end = Offset(end.0 - 1);
            }
            while offset < end {
                if let Some(record) = reader.get(offset)? {
                    file.write_item(&record)?;
                }
                offset = Offset(offset.0 + 1);
            }
        }
        drop(view);
        file.finish()?;
        self.make_current(&meta, file.key()).await?;
        self.store.ledger().snapshot_built();
        file.rewind();
        Ok(Snapshot { meta, snapshot: Box::new(file) })
    }

    /// Record `key` as this group's current snapshot (durably), unless the
    /// current one is newer (a build can finish after an install); drop
    /// whichever snapshot lost.
    async fn make_current(&self, meta: &SnapshotMeta, key: &str) -> Result<(), StoreError> {
        let (group, saved, key_owned, last) =
            (self.group.clone(), postcard::to_stdvec(&(meta, key))?, key.to_string(), meta.last_log_id);
        let loser = self
            .store
            .write(true, move |txn| {
                let mut table = txn.open_table(SNAPSHOTS)?;
                let current: Option<(SnapshotMeta, String)> =
                    table.get(group.as_str())?.map(|v| postcard::from_bytes(v.value())).transpose()?;
                match current {
                    // A newer snapshot is current: this build lost.
                    Some((current_meta, current_key)) if current_meta.last_log_id > last => {
                        Ok((key_owned != current_key).then_some(key_owned))
                    }
                    current => {
                        table.insert(group.as_str(), saved.as_slice())?;
                        Ok(current.map(|(_, k)| k).filter(|k| *k != key_owned))
                    }
                }
            })
            .await?;
        if let Some(loser) = loser {
            snapshot_file::remove(&self.store, &loser)?;
        }
        Ok(())
    }

    fn current_key(&self) -> Result<Option<(SnapshotMeta, String)>, StoreError> {
        self.store.read(|txn| {
            let value = txn.open_table(SNAPSHOTS)?.get(self.group.as_str())?;
            Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
        })
    }

    /// A fresh key for a snapshot being received (one per stream).
    fn incoming_key(&self) -> String {
        let stream = self.incoming_streams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        format!("{}{stream}", snapshot_file::incoming_prefix(&self.group))
    }

    async fn install(&self, meta: &SnapshotMeta, mut file: SnapshotFile) -> Result<(), StoreError> {
        // Check the whole stream before touching anything: a malformed
        // snapshot is refused here, not half-applied in the shared writer.
        file.rewind();
        let applied: Applied = file.read_item()?.ok_or_else(|| StoreError::Snapshot("the snapshot is empty".into()))?;
        while file.read_item::<StoredRecord>()?.is_some() {}
        let received = file.key().to_string();
        let key = format!("{}/snapshot-{}", self.group, meta.snapshot_id);
        snapshot_file::copy(&self.store, &received, &key)?;
        let mut reader = SnapshotFile::open(self.store.clone(), key.clone())?;
        reader.read_item::<Applied>()?;
        let (group, row, saved) =
            (self.group.clone(), postcard::to_stdvec(&applied)?, postcard::to_stdvec(&(meta, &key))?);
        // One durable transaction replaces the records and the state and
        // makes this snapshot current; the records are read a chunk at a time.
        let previous = self
            .store
            .write(true, move |txn| {
                let group = group.as_str();
                records::replace_with_copies(txn, group, || reader.read_item::<StoredRecord>())?;
                txn.open_table(STATE)?.insert(group, row.as_slice())?;
                let mut snapshots = txn.open_table(SNAPSHOTS)?;
                let previous: Option<(SnapshotMeta, String)> =
                    snapshots.get(group)?.map(|v| postcard::from_bytes(v.value())).transpose()?;
                snapshots.insert(group, saved.as_slice())?;
                Ok(previous.map(|(_, k)| k))
            })
            .await?;
        for stale in previous.into_iter().filter(|k| *k != key).chain([received]) {
            snapshot_file::remove(&self.store, &stale)?;
        }
        self.store.ledger().snapshot_installed();
        *self.last_applied.lock().expect("applied") = (applied.last_applied, applied.membership);
        *self.working.lock().expect("group state") = applied.state.clone();
        *self.state.lock().expect("group state") = applied.state;
        self.wake_watcher();
        Ok(())
    }

    fn current(&self) -> Result<Option<Snapshot<TypeConfig>>, StoreError> {
        let Some((meta, key)) = self.current_key()? else { return Ok(None) };
        let file = SnapshotFile::open(self.store.clone(), key)?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(file) }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for GroupStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        self.build().await.map_err(snapshot_error(ErrorVerb::Write))
    }
}

impl RaftStateMachine<TypeConfig> for GroupStateMachine {
    type SnapshotBuilder = GroupStateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self.last_applied.lock().expect("applied").clone())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let responses = self.apply_entries(entries.into_iter().collect()).await.map_err(sm_error(ErrorVerb::Write))?;
        self.wake_watcher();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        snapshot_file::remove_incoming(&self.store, &self.group).map_err(snapshot_error(ErrorVerb::Write))?;
        let file =
            SnapshotFile::create(self.store.clone(), self.incoming_key()).map_err(snapshot_error(ErrorVerb::Write))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<SnapshotFile>) -> Result<(), StorageError> {
        self.install(meta, *snapshot).await.map_err(snapshot_error(ErrorVerb::Write))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        self.current().map_err(snapshot_error(ErrorVerb::Read))
    }
}

/// The time a command applies with: the leader's stamp (G7). In simulation
/// builds the planted bug `WallClockApply` reads this replica's clock
/// instead, which the simulation must catch.
fn applied_at(request: &crate::raft::types::Request) -> keel_core::TimestampMs {
    #[cfg(madsim)]
    if keel_core::planted::is_planted(keel_core::planted::Bug::WallClockApply) {
        return crate::clock::Clock::system().now();
    }
    request.at
}
