//! openraft's `RaftLogStorage` for one group, over the node's store: its
//! entries are frames of the node's segment log, found through `LOG` rows.
//!
//! An append returns as soon as its entries are queued for the node's
//! writer, before the writer's transaction commits: until then they are
//! read from memory (the group's [`LogTail`], which keeps them a while
//! after too, for apply and replication). So openraft hands the next
//! entries over, and replicates these, while the writer is still busy
//! (typically inside the fsync of earlier ones), and the writer gathers
//! the appends that queue up meanwhile into one transaction and one fsync.
//! Entries are reported persisted only once the segment log's sync covers
//! their frames (a restart replays them), whether their rows committed
//! before that sync or commit after it.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, ErrorSubject, ErrorVerb, RaftLogReader, StorageIOError};
use serde::de::DeserializeOwned;

use super::ledger::MarkChange;
use super::log_tail::LogTail;
use super::records::delete_unused_log;
use super::store::{LogRow, NodeStore, StoreError, COMMITTED, LOG, RAFT_META, RECORD_RUNS, VOTE};
use crate::raft::types::{LogId, StorageError, TypeConfig, Vote};

/// One group's Raft log and vote, in the node's database.
#[derive(Debug, Clone)]
pub struct LogStore {
    store: Arc<NodeStore>,
    group: String,
    /// The newest entries, in memory; shared with every reader of this log.
    tail: LogTail,
    /// This broker's id, if known: a committed vote of its own is read
    /// back uncommitted (see [`RaftLogStorage::read_vote`] below).
    node: Option<crate::raft::types::NodeId>,
}

pub(crate) fn io_error(subject: ErrorSubject<u64>, verb: ErrorVerb, error: StoreError) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::new(&error)).into()
}

fn log_error(verb: ErrorVerb) -> impl FnOnce(StoreError) -> StorageError {
    move |e| io_error(ErrorSubject::Logs, verb, e)
}

/// `[start, end)` of a range of log indexes.
fn index_bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(i) => *i,
        Bound::Excluded(i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(i) => i.saturating_add(1),
        Bound::Excluded(i) => *i,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl LogStore {
    pub fn new(store: Arc<NodeStore>, group: String) -> Self {
        let tail = LogTail::new(store.tail_bytes());
        LogStore { store, group, tail, node: None }
    }

    /// The log of a group on broker `node`: when it restarts, it never
    /// resumes leading in the term it led before (see `read_vote`).
    pub fn of_node(store: Arc<NodeStore>, group: String, node: crate::raft::types::NodeId) -> Self {
        LogStore { node: Some(node), ..Self::new(store, group) }
    }

    fn read_meta<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, StoreError> {
        self.store.read(|txn| {
            let table = txn.open_table(RAFT_META)?;
            let value = table.get((self.group.as_str(), name))?;
            Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
        })
    }

    fn entries(&self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        if start >= end {
            return Ok(Vec::new());
        }
        // The tail holds every entry from its first on (those not yet
        // stored among them); the database the ones before.
        let (held, first_held) = self.tail.read(start, end);
        let stored_end = first_held.map_or(end, |first| first.min(end));
        if start >= stored_end {
            return Ok(held);
        }
        let mut entries = self.stored_entries(start, stored_end)?;
        entries.extend(held);
        Ok(entries)
    }

    fn stored_entries(&self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        self.store.read(|txn| {
            let table = txn.open_table(LOG)?;
            let group = self.group.as_str();
            let mut entries = Vec::new();
            for row in table.range((group, start)..(group, end))? {
                let (_, value) = row.map_err(redb::Error::from)?;
                let row: LogRow = postcard::from_bytes(value.value())?;
                entries.push(self.store.read_entry(&row)?);
            }
            Ok(entries)
        })
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StoreError> {
        match self.tail.last() {
            Some(last) => Ok(Some(last)),
            None => self.last_stored_id(),
        }
    }

    fn last_stored_id(&self) -> Result<Option<LogId>, StoreError> {
        self.store.read(|txn| {
            let table = txn.open_table(LOG)?;
            let group = self.group.as_str();
            let last = table.range((group, 0)..=(group, u64::MAX))?.next_back();
            match last {
                Some(row) => {
                    let (_, value) = row.map_err(redb::Error::from)?;
                    let row: LogRow = postcard::from_bytes(value.value())?;
                    Ok(Some(row.log_id))
                }
                None => Ok(None),
            }
        })
    }

    /// Delete the entries from index `start` on.
    async fn delete_from(&self, start: u64) -> Result<(), StoreError> {
        self.tail.truncate_from(start);
        self.store.truncate_log(self.group.clone(), start).await
    }

    /// Record the entries up to `purged` as purged, and delete those that
    /// hold no retained record of a partition (the others stay, out of
    /// openraft's sight, until retention passes them), in one transaction.
    async fn purge_up_to(&self, purged: LogId) -> Result<(), StoreError> {
        self.tail.purge_through(purged.index);
        let group = self.group.clone();
        let bytes = postcard::to_stdvec(&purged)?;
        self.store
            .write(false, move |txn| {
                let group = group.as_str();
                txn.open_table(RAFT_META)?.insert((group, "purged"), bytes.as_slice())?;
                delete_unused_log(txn, &txn.open_table(RECORD_RUNS)?, group)
            })
            .await
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let (start, end) = index_bounds(&range);
        self.entries(start, end).map_err(log_error(ErrorVerb::Read))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta("purged").map_err(log_error(ErrorVerb::Read))?;
        // Entries behind the purge point may still be stored (they hold
        // retained records): if the last stored entry is one of them, the
        // purge point is the last log id.
        let last_log_id = self.last_entry_id().map_err(log_error(ErrorVerb::Read))?.max(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        // A vote must be durable before it is acted on. Its frame is synced
        // on the writer that queued every earlier append, so it makes them
        // durable too: the vendored openraft relies on that
        // when a leader that replicated entries before flushing them steps
        // down (vendor/README.md).
        self.store
            .save_vote(self.group.clone(), *vote)
            .await
            .map_err(|e| io_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    /// A committed vote of this broker's own comes back uncommitted, so a
    /// restarted leader stands for election in a new term instead of
    /// resuming the old one (openraft 0.9 resumes a leader whose committed
    /// vote is its own at start-up). The vendored openraft lets a leader
    /// replicate entries before its own flush (vendor/README.md): its
    /// followers may hold, and have committed, entries of that term that
    /// the leader lost in a crash. Resuming the term, it would reuse those
    /// log ids for other entries, and followers that already hold the ids
    /// would take them as matching (two entries under one log id). In a
    /// new term it must win an election first, and voters whose logs hold
    /// the committed entries refuse a candidate whose log lacks them.
    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let vote: Option<Vote> = self.read_meta(VOTE).map_err(|e| io_error(ErrorSubject::Vote, ErrorVerb::Read, e))?;
        Ok(vote.map(|vote| match self.node {
            Some(node) if vote.is_committed() && vote.leader_id().voted_for() == Some(node) => {
                Vote::new(vote.leader_id().term, node)
            }
            _ => vote,
        }))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // A hint for faster recovery; losing it is harmless. Not waited for:
        // openraft calls this on every advance of the commit index, inside
        // its core loop, which would otherwise stall behind the writer.
        let bytes =
            postcard::to_stdvec(&committed).map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Write, e.into()))?;
        self.tail.committed(committed.map(|c| c.index));
        self.store
            .save_committed_hint(self.group.clone(), bytes)
            .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> =
            self.read_meta(COMMITTED).map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        // Encoded here, off the node's writer.
        let encoded: Vec<(LogId, Vec<u8>)> = entries
            .iter()
            .map(|entry| Ok((entry.log_id, crate::encoding::to_sized_vec(entry)?)))
            .collect::<Result<_, StoreError>>()
            .map_err(log_error(ErrorVerb::Write))?;
        let written: Vec<LogId> = entries.iter().map(|e| e.log_id).collect();
        let Some(last) = written.last().copied() else {
            // Nothing to write: persisted already.
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let sizes: Vec<usize> = encoded.iter().map(|(_, bytes)| bytes.len()).collect();
        let appended = self.tail.append(entries.into_iter().zip(sizes));
        // Committed: readable from the database, so the tail may let them go.
        let tail = self.tail.clone();
        let committed = move || tail.stored(&appended);
        self.store
            .queue_append(self.group.clone(), encoded, committed, callback, last)
            .map_err(log_error(ErrorVerb::Write))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // In order with the reports queued before it: entries from here on
        // are no longer persisted on this node.
        self.store.mark(MarkChange::Truncated(self.group.clone(), log_id.index));
        // Index u64::MAX itself is never used by openraft.
        self.delete_from(log_id.index).await.map_err(log_error(ErrorVerb::Delete))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.purge_up_to(log_id).await.map_err(log_error(ErrorVerb::Delete))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_restarted_leader_reads_its_own_committed_vote_back_uncommitted() {
        let store = NodeStore::open_with_backend(redb::backends::InMemoryBackend::new()).expect("store");
        let mut log = LogStore::of_node(store.clone(), "metadata".to_string(), 1);
        // It led term 7: on restart it only voted for itself in term 7.
        log.save_vote(&Vote::new_committed(7, 1)).await.expect("save");
        let read = log.read_vote().await.expect("read").expect("a vote");
        assert_eq!(read, Vote::new(7, 1));
        assert!(!read.is_committed());
        // Another broker's leadership is remembered as it was.
        log.save_vote(&Vote::new_committed(8, 2)).await.expect("save");
        assert_eq!(log.read_vote().await.expect("read"), Some(Vote::new_committed(8, 2)));
        // So is an uncommitted vote for itself.
        log.save_vote(&Vote::new(9, 1)).await.expect("save");
        assert_eq!(log.read_vote().await.expect("read"), Some(Vote::new(9, 1)));
        // A log that does not know its broker (tests, tools) reads votes as stored.
        let mut anonymous = LogStore::new(store, "metadata".to_string());
        anonymous.save_vote(&Vote::new_committed(10, 1)).await.expect("save");
        assert_eq!(anonymous.read_vote().await.expect("read"), Some(Vote::new_committed(10, 1)));
    }

    #[test]
    fn index_bounds_cover_every_range_form() {
        assert_eq!(index_bounds(&(3..7)), (3, 7));
        assert_eq!(index_bounds(&(3..=7)), (3, 8));
        assert_eq!(index_bounds(&(..7)), (0, 7));
        assert_eq!(index_bounds(&(3..)), (3, u64::MAX));
        assert_eq!(index_bounds(&(..)), (0, u64::MAX));
    }
}
