//! Where a partition's records are stored.

use std::collections::VecDeque;
use std::convert::Infallible;

use serde::{Deserialize, Serialize};

use crate::id::{Offset, TimestampMs};
use crate::record::{Record, StoredRecord};

/// Where a record sits inside the command that appended it: the batch (0
/// for a plain `Append`) and its position in that batch. A store that keeps
/// the Raft log as the partition log finds the record again from its entry
/// with it, instead of storing a second copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordPlace {
    pub batch: u32,
    pub position: u32,
}

/// The record store behind a partition. The partition state machine decides
/// what goes in and out; the store only keeps records by offset.
pub trait RecordLog {
    /// A storage failure. Fatal for the replica: stop, then recover from Raft.
    type Error: std::error::Error + 'static;

    /// Store `record` at `offset`, which is always one past the last, with
    /// its append time; `place` says where it sits in the command applied.
    fn append(
        &mut self,
        offset: Offset,
        append_time_ms: TimestampMs,
        record: &Record,
        place: RecordPlace,
    ) -> Result<(), Self::Error>;

    /// The record at `offset`, if stored.
    fn get(&self, offset: Offset) -> Result<Option<StoredRecord>, Self::Error>;

    /// Drop every record below `offset`.
    fn remove_before(&mut self, offset: Offset) -> Result<(), Self::Error>;

    /// The append time and size ([`Record::size_bytes`]) of each record
    /// from `offset` on, up to `max` of them, in order; fewer where the
    /// stored records end. What retention needs, without the records: a
    /// log that stores records together can answer it without copying
    /// them. By default, each record is read.
    fn sizes_from(&self, offset: Offset, max: u64) -> Result<Vec<(TimestampMs, u64)>, Self::Error> {
        let mut sizes = Vec::new();
        let mut at = offset;
        while (sizes.len() as u64) < max {
            let Some(stored) = self.get(at)? else { break };
            sizes.push((stored.append_time_ms, stored.record.size_bytes()));
            at = at.next();
        }
        Ok(sizes)
    }
}

/// An in-memory record log, for tests, models and small snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLog {
    start: Offset,
    records: VecDeque<StoredRecord>,
}

impl MemoryLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every stored record, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &StoredRecord> {
        self.records.iter()
    }
}

impl RecordLog for MemoryLog {
    type Error = Infallible;

    fn append(
        &mut self,
        offset: Offset,
        append_time_ms: TimestampMs,
        record: &Record,
        _place: RecordPlace,
    ) -> Result<(), Infallible> {
        if self.records.is_empty() {
            self.start = offset;
        }
        self.records.push_back(StoredRecord { offset, append_time_ms, record: record.clone() });
        Ok(())
    }

    fn get(&self, offset: Offset) -> Result<Option<StoredRecord>, Infallible> {
        let Some(position) = offset.0.checked_sub(self.start.0) else {
            return Ok(None);
        };
        Ok(usize::try_from(position).ok().and_then(|p| self.records.get(p)).cloned())
    }

    fn remove_before(&mut self, offset: Offset) -> Result<(), Infallible> {
        while self.records.front().is_some_and(|r| r.offset < offset) {
            self.records.pop_front();
        }
        self.start = self.records.front().map_or(offset, |r| r.offset);
        Ok(())
    }
}
