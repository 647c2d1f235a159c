//! The newest entries of one group's Raft log, kept in memory so that
//! replication and apply read them without going back to the segment log.
//!
//! Every appended entry goes in. It must stay while its `LOG` row is not
//! committed (the database cannot find it yet); once stored it is only a
//! copy, dropped from the front once openraft has read it for apply or
//! when the group or the node is over its byte budget. The held entries are
//! therefore always a suffix of the log: every index from the first held
//! one to the last appended one, so a read from there on needs no database.
//!
//! Without it, each replica read back and decoded every entry it had just
//! appended in order to apply it (18.6% of a follower's request threads at
//! R3, 256 in flight), and a leader did so once per follower too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use openraft::Entry;

use crate::raft::types::{LogId, TypeConfig};

/// Most bytes (encoded entries) one group keeps once stored.
pub(crate) const GROUP_TAIL_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Most bytes (encoded entries) every group of a node keeps together once
/// stored. Entries not yet stored are held whatever the budget: the writer
/// stores each in its next transaction.
pub(crate) const NODE_TAIL_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Bytes held by every group's tail on one node.
pub(crate) type NodeTailBytes = Arc<AtomicUsize>;

/// One group's tail, shared by its log store and every reader of it.
#[derive(Debug, Clone)]
pub(crate) struct LogTail {
    inner: Arc<Mutex<Held>>,
}

#[derive(Debug)]
struct Held {
    entries: BTreeMap<u64, HeldEntry>,
    /// The encoded size of `entries`.
    bytes: usize,
    node_bytes: NodeTailBytes,
    /// Entries up to here have been read for apply: openraft reads the
    /// entries up to a commit right after saving it, so by the next save
    /// those of the previous one are applied.
    applied_through: Option<u64>,
    /// The last commit saved.
    last_commit: Option<u64>,
    /// The id of the next append.
    next_append: u64,
}

#[derive(Debug)]
struct HeldEntry {
    entry: Entry<TypeConfig>,
    bytes: usize,
    /// Its `LOG` row is committed: the database has it too.
    stored: bool,
    /// The append that held it. An entry truncated and appended again
    /// with the same log id (a leader's resend) is another append, whose
    /// row is not committed when the first one's is.
    append: u64,
}

/// Which entries one append held: its id and their indexes.
#[derive(Debug, Clone)]
pub(crate) struct Appended {
    id: u64,
    indexes: std::ops::RangeInclusive<u64>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.node_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl LogTail {
    pub(crate) fn new(node_bytes: NodeTailBytes) -> Self {
        let held = Held {
            entries: BTreeMap::new(),
            bytes: 0,
            node_bytes,
            applied_through: None,
            last_commit: None,
            next_append: 0,
        };
        LogTail { inner: Arc::new(Mutex::new(held)) }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.lock().expect("log tail")
    }

    /// Hold appended entries (each with its encoded size), not yet stored.
    /// They follow every entry held already (openraft truncates before it
    /// appends over a conflict).
    /// Returns what to hand [`LogTail::stored`] once their rows commit.
    pub(crate) fn append(&self, entries: impl IntoIterator<Item = (Entry<TypeConfig>, usize)>) -> Appended {
        let mut held = self.held();
        let id = held.next_append;
        held.next_append += 1;
        let (mut first, mut last) = (u64::MAX, 0);
        for (entry, bytes) in entries {
            let index = entry.log_id.index;
            (first, last) = (first.min(index), last.max(index));
            held.add(index, HeldEntry { entry, bytes, stored: false, append: id });
        }
        Appended { id, indexes: first..=last }
    }

    /// The `LOG` rows of an append's entries committed: each is stored
    /// unless a later append replaced it meanwhile.
    pub(crate) fn stored(&self, appended: &Appended) {
        let mut held = self.held();
        // An append of no entries held none (and its range is empty).
        if appended.indexes.is_empty() {
            return;
        }
        for (_, entry) in held.entries.range_mut(appended.indexes.clone()) {
            if entry.append == appended.id {
                entry.stored = true;
            }
        }
        held.trim();
    }

    /// openraft saved a commit up to `index`, and is about to read the
    /// entries up to it for apply.
    pub(crate) fn committed(&self, index: Option<u64>) {
        let mut held = self.held();
        // The entries of the commit saved before were read for apply then:
        // no longer needed here.
        held.applied_through = std::mem::replace(&mut held.last_commit, index).max(held.applied_through);
        held.trim();
    }

    /// Copies of the held entries in `[start, end)`, and the first index
    /// held (every later one up to the last appended is held too).
    pub(crate) fn read(&self, start: u64, end: u64) -> (Vec<Entry<TypeConfig>>, Option<u64>) {
        let held = self.held();
        let first = held.entries.first_key_value().map(|(index, _)| *index);
        let entries = held.entries.range(start..end).map(|(_, e)| e.entry.clone()).collect();
        (entries, first)
    }

    /// The last entry appended, if held.
    pub(crate) fn last(&self) -> Option<LogId> {
        self.held().entries.last_key_value().map(|(_, e)| e.entry.log_id)
    }

    /// Forget the entries from `start` on (truncated).
    pub(crate) fn truncate_from(&self, start: u64) {
        let mut held = self.held();
        let removed = held.entries.split_off(&start);
        held.forget(removed.values().map(|e| e.bytes).sum());
    }

    /// Forget the entries up to `index` (purged).
    pub(crate) fn purge_through(&self, index: u64) {
        let mut held = self.held();
        let kept = held.entries.split_off(&(index + 1));
        let removed = std::mem::replace(&mut held.entries, kept);
        held.forget(removed.values().map(|e| e.bytes).sum());
    }

    #[cfg(test)]
    fn indexes(&self) -> Vec<u64> {
        self.held().entries.keys().copied().collect()
    }
}

impl Held {
    fn add(&mut self, index: u64, entry: HeldEntry) {
        self.bytes += entry.bytes;
        self.node_bytes.fetch_add(entry.bytes, Ordering::Relaxed);
        if let Some(replaced) = self.entries.insert(index, entry) {
            self.forget(replaced.bytes);
        }
    }

    fn forget(&mut self, bytes: usize) {
        self.bytes -= bytes;
        self.node_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Drop stored entries from the front while they were read for apply
    /// or the group or the node is over budget. Stops at the first entry
    /// not yet stored, so the held entries stay a suffix of the log.
    fn trim(&mut self) {
        while let Some(first) = self.entries.first_entry() {
            let applied = self.applied_through.is_some_and(|through| *first.key() <= through);
            let over =
                self.bytes > GROUP_TAIL_BYTES_MAX || self.node_bytes.load(Ordering::Relaxed) > NODE_TAIL_BYTES_MAX;
            if !first.get().stored || !(applied || over) {
                break;
            }
            let bytes = first.remove().bytes;
            self.forget(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry { log_id: log_id(term, index), payload: EntryPayload::Blank }
    }

    fn append(tail: &LogTail, term: u64, indexes: std::ops::RangeInclusive<u64>, bytes: usize) -> Appended {
        tail.append(indexes.map(|i| (entry(term, i), bytes)))
    }

    #[test]
    fn entries_stay_until_stored_and_read_for_apply() {
        let node = NodeTailBytes::default();
        let tail = LogTail::new(node.clone());
        let first = append(&tail, 1, 1..=3, 100);
        // Committed before stored: held, as the database cannot find them.
        tail.committed(Some(3));
        tail.committed(Some(3));
        assert_eq!(tail.indexes(), vec![1, 2, 3]);
        tail.stored(&first);
        // Stored, and read for apply after the save before the last.
        assert_eq!(tail.indexes(), Vec::<u64>::new());
        assert_eq!(node.load(Ordering::Relaxed), 0);

        let second = append(&tail, 1, 4..=6, 100);
        tail.stored(&second);
        // Stored but not yet committed: kept for apply.
        assert_eq!(tail.indexes(), vec![4, 5, 6]);
        // A commit up to 5 is about to be read: kept until the next save.
        tail.committed(Some(5));
        assert_eq!(tail.indexes(), vec![4, 5, 6]);
        tail.committed(Some(6));
        assert_eq!(tail.indexes(), vec![6]);
        let (read, first_held) = tail.read(0, u64::MAX);
        assert_eq!(read.iter().map(|e| e.log_id).collect::<Vec<_>>(), vec![log_id(1, 6)]);
        assert_eq!(first_held, Some(6));
        assert_eq!(tail.last(), Some(log_id(1, 6)));
        assert_eq!(node.load(Ordering::Relaxed), 100);
    }

    /// An entry truncated and appended again with the same log id is not
    /// stored when the first append's rows commit: its own row is not yet
    /// (the truncation deleted the first one's).
    #[test]
    fn an_entry_appended_again_is_stored_only_by_its_own_append() {
        let tail = LogTail::new(NodeTailBytes::default());
        let first = append(&tail, 1, 3..=3, 10);
        tail.truncate_from(3);
        let again = append(&tail, 1, 3..=3, 10);
        tail.stored(&first);
        tail.committed(Some(3));
        tail.committed(Some(3));
        assert_eq!(tail.indexes(), vec![3], "an entry whose row is not committed was let go");
        tail.stored(&again);
        assert_eq!(tail.indexes(), Vec::<u64>::new());
        // An append of no entries marks nothing.
        let none = tail.append([]);
        tail.stored(&none);
    }

    #[test]
    fn a_replaced_entry_is_not_taken_for_stored_and_truncation_forgets_its_bytes() {
        let node = NodeTailBytes::default();
        let tail = LogTail::new(node.clone());
        let old = append(&tail, 1, 1..=4, 10);
        tail.truncate_from(3);
        assert_eq!(node.load(Ordering::Relaxed), 20);
        append(&tail, 2, 3..=3, 10);
        // The rows of the old entries commit: the new entry at 3 is not stored.
        tail.stored(&old);
        tail.committed(Some(3));
        tail.committed(Some(3));
        assert_eq!(tail.indexes(), vec![3]);
        assert_eq!(tail.last(), Some(log_id(2, 3)));
        tail.purge_through(3);
        assert_eq!(tail.indexes(), Vec::<u64>::new());
        assert_eq!(node.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn stored_entries_go_from_the_front_over_budget_but_never_unstored_ones() {
        let node = NodeTailBytes::default();
        let tail = LogTail::new(node.clone());
        let half = GROUP_TAIL_BYTES_MAX / 2;
        let stored = append(&tail, 1, 1..=2, half);
        let later = append(&tail, 1, 3..=4, half);
        // Over the group's budget, but nothing stored yet: all held.
        assert_eq!(tail.indexes(), vec![1, 2, 3, 4]);
        tail.stored(&stored);
        assert_eq!(tail.indexes(), vec![3, 4]);

        // Another group over the node's budget makes this one let go of its
        // stored entries (its own are all it can drop).
        let other = LogTail::new(node.clone());
        let big = append(&other, 1, 1..=1, NODE_TAIL_BYTES_MAX);
        other.stored(&big);
        assert_eq!(other.indexes(), Vec::<u64>::new());
        let filler = LogTail::new(node.clone());
        append(&filler, 1, 1..=1, NODE_TAIL_BYTES_MAX);
        tail.stored(&later);
        assert_eq!(tail.indexes(), Vec::<u64>::new());
        // A dropped tail gives its bytes back.
        drop(filler);
        drop(tail);
        drop(other);
        assert_eq!(node.load(Ordering::Relaxed), 0);
    }
}
