//! Idempotent producer state kept per partition (G8).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::id::{Offset, Sequence, TimestampMs};

/// A batch a producer appended recently, kept to answer its retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RememberedBatch {
    pub sequence: Sequence,
    pub base_offset: Offset,
    pub count: u32,
}

/// What one partition remembers of one producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    /// The most recent batches, oldest first; the last is the latest sequence.
    pub recent: VecDeque<RememberedBatch>,
    /// When this producer last appended (the leader's time), for eviction.
    pub last_append_at: TimestampMs,
}

impl ProducerState {
    /// The latest sequence appended.
    pub fn last_sequence(&self) -> Option<Sequence> {
        self.recent.back().map(|b| b.sequence)
    }

    /// The remembered batch with this sequence, if any.
    pub fn find(&self, sequence: Sequence) -> Option<&RememberedBatch> {
        self.recent.iter().find(|b| b.sequence == sequence)
    }

    /// Remember a new batch, forgetting the oldest beyond `remembered_max`.
    pub fn remember(&mut self, batch: RememberedBatch, at: TimestampMs, remembered_max: u32) {
        self.recent.push_back(batch);
        while self.recent.len() > remembered_max.max(1) as usize {
            self.recent.pop_front();
        }
        self.last_append_at = at;
    }
}
