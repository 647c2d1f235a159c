//! What a node has told Raft about its own disk: per group, the last log
//! entry it reported persisted and the last vote it saved, and how many
//! snapshots it built and installed. The simulation reads the marks at a
//! power cut and checks the disk's durable image against them (G1 at every
//! cut: a node must never report an entry persisted, or a vote saved, that
//! a power cut can take away); the metrics endpoint shows the snapshot
//! counts.
//!
//! The writer updates the marks in the order of its jobs, after the sync of
//! the segment log that made a report true: a report raises a group's mark,
//! a truncation lowers it (the entries past it are gone, by design).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::raft::types::{LogId, Vote};

/// The newest entry of one group this node reported persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistedMark {
    /// Log index of the entry.
    pub index: u64,
    /// Its log id; `None` after a truncation (the entry before the cut is
    /// still persisted, whatever its term).
    pub log_id: Option<LogId>,
}

/// A change of one group's mark, applied by the writer in job order.
#[derive(Debug, Clone)]
pub(crate) enum MarkChange {
    /// Entries up to `LogId` were reported persisted.
    Reported(String, LogId),
    /// Entries from index `u64` on were deleted (a Raft log truncation).
    Truncated(String, u64),
    /// The group's rows were deleted (its replica left this broker).
    Forgotten(String),
    /// The group's vote was saved.
    Voted(String, Vote),
}

/// A node's persisted marks and snapshot counts.
#[derive(Debug, Default)]
pub struct Ledger {
    marks: Mutex<BTreeMap<String, PersistedMark>>,
    votes: Mutex<BTreeMap<String, Vote>>,
    snapshots_built: AtomicU64,
    snapshots_installed: AtomicU64,
}

impl Ledger {
    pub(crate) fn apply(&self, change: MarkChange) {
        let mut marks = self.marks.lock().expect("persisted marks");
        match change {
            MarkChange::Reported(group, log_id) => {
                marks.insert(group, PersistedMark { index: log_id.index, log_id: Some(log_id) });
            }
            MarkChange::Truncated(group, from) => {
                let Some(mark) = marks.get(&group).copied() else { return };
                if mark.index >= from {
                    match from.checked_sub(1) {
                        Some(index) => {
                            marks.insert(group, PersistedMark { index, log_id: None });
                        }
                        None => {
                            marks.remove(&group);
                        }
                    }
                }
            }
            MarkChange::Forgotten(group) => {
                self.votes.lock().expect("saved votes").remove(&group);
                marks.remove(&group);
            }
            MarkChange::Voted(group, vote) => {
                self.votes.lock().expect("saved votes").insert(group, vote);
            }
        }
    }

    /// Every group's last saved vote, by group key.
    pub fn saved_votes(&self) -> BTreeMap<String, Vote> {
        self.votes.lock().expect("saved votes").clone()
    }

    /// Every group's mark, by group key.
    pub fn persisted_marks(&self) -> BTreeMap<String, PersistedMark> {
        self.marks.lock().expect("persisted marks").clone()
    }

    pub(crate) fn snapshot_built(&self) {
        self.snapshots_built.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot_installed(&self) {
        self.snapshots_installed.fetch_add(1, Ordering::Relaxed);
    }

    /// Snapshots this node built and installed since it started.
    pub fn snapshot_counts(&self) -> (u64, u64) {
        (self.snapshots_built.load(Ordering::Relaxed), self.snapshots_installed.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn a_truncation_lowers_the_mark_and_a_later_report_raises_it_again() {
        let ledger = Ledger::default();
        ledger.apply(MarkChange::Reported("g".into(), log_id(1, 10)));
        ledger.apply(MarkChange::Truncated("g".into(), 12));
        assert_eq!(ledger.persisted_marks()["g"], PersistedMark { index: 10, log_id: Some(log_id(1, 10)) });
        ledger.apply(MarkChange::Truncated("g".into(), 7));
        assert_eq!(ledger.persisted_marks()["g"], PersistedMark { index: 6, log_id: None });
        ledger.apply(MarkChange::Reported("g".into(), log_id(2, 8)));
        assert_eq!(ledger.persisted_marks()["g"].log_id, Some(log_id(2, 8)));
        ledger.apply(MarkChange::Truncated("g".into(), 0));
        assert!(ledger.persisted_marks().is_empty());
        ledger.apply(MarkChange::Reported("g".into(), log_id(2, 8)));
        ledger.apply(MarkChange::Forgotten("g".into()));
        assert!(ledger.persisted_marks().is_empty());
    }

    #[test]
    fn a_saved_vote_is_kept_until_its_group_is_forgotten() {
        let ledger = Ledger::default();
        ledger.apply(MarkChange::Voted("g".into(), Vote::new(2, 1)));
        ledger.apply(MarkChange::Voted("g".into(), Vote::new_committed(3, 2)));
        ledger.apply(MarkChange::Truncated("g".into(), 0));
        assert_eq!(ledger.saved_votes()["g"], Vote::new_committed(3, 2));
        ledger.apply(MarkChange::Forgotten("g".into()));
        assert!(ledger.saved_votes().is_empty());
    }
}
