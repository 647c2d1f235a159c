//! The partition state and its apply function.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::command::{
    AppendBatch, PartitionCommand, PartitionOutcome, PartitionRejection, PartitionResult, ProducerBatch, ReadError,
    APPEND_BATCHES_MAX,
};
use super::log::{RecordLog, RecordPlace};
use super::producer::{ProducerState, RememberedBatch};
use crate::id::{Generation, GroupName, MemberId, Offset, ProducerId, Sequence, TimestampMs};
use crate::invariant::{ensure, InvariantViolation};
use crate::limits::Limits;
use crate::metadata::RetentionPolicy;
use crate::record::{Record, StoredRecord};

/// Records whose sizes retention asks the log for at once (16 bytes each
/// in memory).
const RETENTION_SCAN_RECORDS: u64 = 4096;

/// The member of a group that holds this partition, and in which generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub generation: Generation,
    pub member: MemberId,
    /// The epoch of the member's join: a later join of the same member id
    /// (another process) claims with a higher one and fences this one.
    pub member_epoch: u64,
}

/// What this partition knows of one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GroupPosition {
    /// The latest claim; older generations are fenced.
    pub claim: Option<Claim>,
    /// The next offset the group reads; `None` until the first commit or
    /// reset (the group then starts at the log start).
    pub position: Option<Offset>,
    /// When a claim, commit or reset last changed this (the leader's
    /// stamp): a group gone from the metadata is forgotten here once this
    /// is older than the cluster's `group_retention_ms`.
    pub touched_at: TimestampMs,
}

/// Everything a partition replica knows besides its records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    limits: Limits,
    /// The first offset still stored.
    log_start: Offset,
    /// The next offset to be assigned; every offset below it is committed
    /// in Raft (the state machine only sees committed entries).
    high_watermark: Offset,
    /// Sum of [`Record::size_bytes`] over stored records.
    log_bytes: u64,
    /// Append times never go backwards, even if a new leader's clock does.
    last_append_at: TimestampMs,
    producers: BTreeMap<ProducerId, ProducerState>,
    groups: BTreeMap<GroupName, GroupPosition>,
    /// The newest placement epoch the group's membership has followed
    /// ([`PartitionCommand::FollowPlacement`]).
    placement_epoch: u64,
    applied_commands: u64,
    rejected_commands: u64,
}

impl PartitionState {
    /// An empty partition with these limits (the same on every replica).
    pub fn new(limits: Limits) -> Self {
        PartitionState {
            limits,
            log_start: Offset(0),
            high_watermark: Offset(0),
            log_bytes: 0,
            last_append_at: TimestampMs(0),
            producers: BTreeMap::new(),
            groups: BTreeMap::new(),
            placement_epoch: 0,
            applied_commands: 0,
            rejected_commands: 0,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn log_start(&self) -> Offset {
        self.log_start
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    pub fn producers(&self) -> &BTreeMap<ProducerId, ProducerState> {
        &self.producers
    }

    pub fn groups(&self) -> &BTreeMap<GroupName, GroupPosition> {
        &self.groups
    }

    /// Where a group reads next: its position, or the log start.
    pub fn group_position(&self, group: &GroupName) -> Offset {
        let position = self.groups.get(group).and_then(|g| g.position).unwrap_or(self.log_start);
        position.max(self.log_start)
    }

    /// The newest placement epoch the group's membership has followed.
    pub fn placement_epoch(&self) -> u64 {
        self.placement_epoch
    }

    /// Commands applied and commands rejected so far.
    pub fn command_counts(&self) -> (u64, u64) {
        (self.applied_commands, self.rejected_commands)
    }

    /// Apply one committed command, stamped by the leader at `at`.
    ///
    /// The outer `Err` is a storage failure of `log` (fatal); the inner
    /// result is the command's recorded outcome or rejection.
    pub fn apply<L: RecordLog>(
        &mut self,
        log: &mut L,
        at: TimestampMs,
        command: &PartitionCommand,
    ) -> Result<PartitionResult, L::Error> {
        let result = match command {
            PartitionCommand::Append { producer, records } => self.append(log, at, 0, *producer, records)?,
            // Each batch is counted as a command of its own.
            PartitionCommand::AppendBatches { batches } => return self.append_batches(log, at, batches),
            PartitionCommand::Claim { group, member, generation, member_epoch } => {
                self.claim(at, group, member, *generation, *member_epoch)
            }
            PartitionCommand::Commit { group, member, generation, member_epoch, offset } => {
                self.commit(at, group, member, *generation, *member_epoch, *offset)
            }
            PartitionCommand::ResetPosition { group, position } => self.reset_position(at, group, *position),
            PartitionCommand::ApplyRetention { policy } => Ok(self.apply_retention(log, at, *policy)?),
            PartitionCommand::ForgetGroup { group } => self.forget_group(group),
            PartitionCommand::ForgetIdleGroup { group, idle_ms } => self.forget_idle_group(at, group, *idle_ms),
            PartitionCommand::FollowPlacement { epoch } => self.follow_placement(*epoch),
        };
        self.count(&result);
        Ok(result)
    }

    /// Count a command's outcome (and, in simulation, its rejection kind).
    fn count(&mut self, result: &PartitionResult) {
        match result {
            Ok(_) => self.applied_commands += 1,
            Err(_rejection) => {
                self.rejected_commands += 1;
                #[cfg(madsim)]
                crate::planted::note_rejection("partition", _rejection.kind());
            }
        }
    }

    fn append_batches<L: RecordLog>(
        &mut self,
        log: &mut L,
        at: TimestampMs,
        batches: &[AppendBatch],
    ) -> Result<PartitionResult, L::Error> {
        if batches.is_empty() {
            let rejected = Err(PartitionRejection::EmptyBatch);
            self.count(&rejected);
            return Ok(rejected);
        }
        if batches.len() > APPEND_BATCHES_MAX {
            let (count, max) = (batches.len() as u64, APPEND_BATCHES_MAX as u64);
            let rejected = Err(PartitionRejection::TooManyBatches { count, max });
            self.count(&rejected);
            return Ok(rejected);
        }
        let mut results = Vec::with_capacity(batches.len());
        for (index, batch) in batches.iter().enumerate() {
            // At most APPEND_BATCHES_MAX batches: the index fits.
            let result = self.append(log, at, index as u32, batch.producer, &batch.records)?;
            self.count(&result);
            results.push(result);
        }
        Ok(Ok(PartitionOutcome::AppendedBatches { results }))
    }

    fn append<L: RecordLog>(
        &mut self,
        log: &mut L,
        at: TimestampMs,
        batch_index: u32,
        producer: Option<ProducerBatch>,
        records: &[Record],
    ) -> Result<PartitionResult, L::Error> {
        if let Err(rejection) = self.validate_batch(records) {
            return Ok(Err(rejection));
        }
        #[cfg(madsim)]
        let check = !crate::planted::is_planted(crate::planted::Bug::NoIdempotence);
        #[cfg(not(madsim))]
        let check = true;
        if let Some(batch) = producer.filter(|_| check) {
            match self.check_sequence(batch) {
                Err(rejection) => return Ok(Err(rejection)),
                Ok(Some(original)) => {
                    return Ok(Ok(PartitionOutcome::Appended {
                        base_offset: original.base_offset,
                        count: original.count,
                        duplicate: true,
                    }));
                }
                Ok(None) => {}
            }
        }
        let count = records.len() as u64;
        let Some(end) = self.high_watermark.0.checked_add(count) else {
            return Ok(Err(PartitionRejection::OffsetOverflow));
        };
        let base_offset = self.high_watermark;
        let append_time = at.max(self.last_append_at);
        for (position, record) in records.iter().enumerate() {
            let offset = Offset(base_offset.0 + position as u64);
            let place = RecordPlace { batch: batch_index, position: position as u32 };
            log.append(offset, append_time, record, place)?;
            self.log_bytes += record.size_bytes();
        }
        self.high_watermark = Offset(end);
        self.last_append_at = append_time;
        if let Some(batch) = producer {
            self.remember_batch(
                batch,
                RememberedBatch { sequence: batch.sequence, base_offset, count: count as u32 },
                append_time,
            );
        }
        Ok(Ok(PartitionOutcome::Appended { base_offset, count: count as u32, duplicate: false }))
    }

    fn validate_batch(&self, records: &[Record]) -> Result<(), PartitionRejection> {
        #[cfg(madsim)]
        let refuse_empty = !crate::planted::is_planted(crate::planted::Bug::EmptyBatchApplied);
        #[cfg(not(madsim))]
        let refuse_empty = true;
        if records.is_empty() && refuse_empty {
            return Err(PartitionRejection::EmptyBatch);
        }
        if records.len() as u64 > u64::from(self.limits.batch_records_max) {
            return Err(PartitionRejection::TooManyRecords {
                count: records.len() as u64,
                max: self.limits.batch_records_max,
            });
        }
        for (index, record) in records.iter().enumerate() {
            record
                .validate(&self.limits)
                .map_err(|error| PartitionRejection::InvalidRecord { index: index as u32, error })?;
        }
        let bytes: u64 = records.iter().map(Record::size_bytes).sum();
        if bytes > u64::from(self.limits.batch_bytes_max) {
            return Err(PartitionRejection::BatchTooLarge { bytes, max: self.limits.batch_bytes_max });
        }
        Ok(())
    }

    /// `Ok(Some(batch))` for a retry of a remembered batch, `Ok(None)` for
    /// the next batch in sequence, or why the sequence is refused.
    fn check_sequence(&self, batch: ProducerBatch) -> Result<Option<RememberedBatch>, PartitionRejection> {
        let ProducerBatch { producer, sequence } = batch;
        let Some(state) = self.producers.get(&producer) else {
            return if sequence == Sequence(0) {
                Ok(None)
            } else {
                Err(PartitionRejection::UnknownProducer { producer, got: sequence })
            };
        };
        let last = state.last_sequence().unwrap_or(Sequence(0));
        if sequence.0 == last.0.wrapping_add(1) {
            return Ok(None);
        }
        if sequence > last {
            return Err(PartitionRejection::SequenceGap { producer, expected: Sequence(last.0 + 1), got: sequence });
        }
        let original =
            state.find(sequence).copied().ok_or(PartitionRejection::SequenceTooOld { producer, got: sequence })?;
        #[cfg(madsim)]
        if crate::planted::is_planted(crate::planted::Bug::DuplicateAnswersNewest) {
            return Ok(Some(state.find(last).copied().unwrap_or(original)));
        }
        Ok(Some(original))
    }

    fn remember_batch(&mut self, batch: ProducerBatch, remembered: RememberedBatch, at: TimestampMs) {
        let remembered_max = self.limits.producer_batches_remembered_max;
        let state = self
            .producers
            .entry(batch.producer)
            .or_insert_with(|| ProducerState { recent: VecDeque::new(), last_append_at: at });
        state.remember(remembered, at, remembered_max);
        // Forget the least recently active producer beyond the limit.
        while self.producers.len() as u64 > u64::from(self.limits.producers_per_partition_max.max(1)) {
            let oldest = self.producers.iter().min_by_key(|(id, s)| (s.last_append_at, **id)).map(|(id, _)| *id);
            match oldest {
                Some(id) => self.producers.remove(&id),
                None => break,
            };
        }
    }

    fn claim(
        &mut self,
        at: TimestampMs,
        group: &str,
        member: &str,
        generation: Generation,
        member_epoch: u64,
    ) -> PartitionResult {
        let group = GroupName::new(group)?;
        let member = MemberId::new(member)?;
        self.ensure_room_for(&group)?;
        let entry = self.groups.entry(group.clone()).or_default();
        if let Some(current) = &entry.claim {
            let other_member_same_generation = current.generation == generation && current.member != member;
            if current.generation > generation || other_member_same_generation {
                return Err(PartitionRejection::Fenced { group, generation, current: current.generation });
            }
            if current.generation == generation && current.member == member && current.member_epoch > member_epoch {
                return Err(PartitionRejection::EpochFenced {
                    group,
                    member: member.to_string(),
                    member_epoch,
                    current: current.member_epoch,
                });
            }
        }
        entry.claim = Some(Claim { generation, member, member_epoch });
        entry.touched_at = entry.touched_at.max(at);
        Ok(PartitionOutcome::Claimed { generation, position: self.group_position(&group) })
    }

    fn ensure_room_for(&self, group: &GroupName) -> Result<(), PartitionRejection> {
        let max = self.limits.groups_per_partition_max;
        if !self.groups.contains_key(group) && self.groups.len() as u64 >= u64::from(max) {
            return Err(PartitionRejection::TooManyGroups { max });
        }
        Ok(())
    }

    fn commit(
        &mut self,
        at: TimestampMs,
        group: &str,
        member: &str,
        generation: Generation,
        member_epoch: u64,
        offset: Offset,
    ) -> PartitionResult {
        let group = GroupName::new(group)?;
        let member_id = MemberId::new(member)?;
        let claim = self.groups.get(&group).and_then(|g| g.claim.as_ref());
        // Planted: every commit looks as if its own member held the claim.
        #[cfg(madsim)]
        let fenceless = Claim { generation, member: member_id.clone(), member_epoch };
        #[cfg(madsim)]
        let claim =
            if crate::planted::is_planted(crate::planted::Bug::CommitWithoutFence) { Some(&fenceless) } else { claim };
        match claim {
            Some(current) if current.generation > generation => {
                return Err(PartitionRejection::Fenced { group, generation, current: current.generation });
            }
            Some(current) if current.generation == generation && current.member == member_id => {
                if current.member_epoch > member_epoch {
                    return Err(PartitionRejection::EpochFenced {
                        group,
                        member: member.to_string(),
                        member_epoch,
                        current: current.member_epoch,
                    });
                }
                if current.member_epoch < member_epoch {
                    return Err(PartitionRejection::NotClaimed { group, member: member.to_string(), generation });
                }
            }
            _ => return Err(PartitionRejection::NotClaimed { group, member: member.to_string(), generation }),
        }
        let Some(position) = offset.0.checked_add(1).map(Offset) else {
            return Err(PartitionRejection::CommitBeyondHighWatermark { offset, high_watermark: self.high_watermark });
        };
        #[cfg(madsim)]
        if position > self.high_watermark && crate::planted::is_planted(crate::planted::Bug::PanicOnBadCommit) {
            panic!("planted poison pill: commit of {offset} beyond the high watermark {}", self.high_watermark);
        }
        #[cfg(madsim)]
        let checked = !crate::planted::is_planted(crate::planted::Bug::CommitUnchecked);
        #[cfg(not(madsim))]
        let checked = true;
        #[cfg(madsim)]
        let bound = if crate::planted::is_planted(crate::planted::Bug::CommitAtHighWatermark) {
            Offset(self.high_watermark.0.saturating_add(1))
        } else {
            self.high_watermark
        };
        #[cfg(not(madsim))]
        let bound = self.high_watermark;
        if checked && position > bound {
            return Err(PartitionRejection::CommitBeyondHighWatermark { offset, high_watermark: self.high_watermark });
        }
        let entry = self.groups.entry(group.clone()).or_default();
        if let Some(current) = entry.position.filter(|_| checked) {
            if position < current {
                return Err(PartitionRejection::CommitBackwards { offset, position: current });
            }
        }
        entry.position = Some(position);
        entry.touched_at = entry.touched_at.max(at);
        Ok(PartitionOutcome::Committed { position })
    }

    fn forget_group(&mut self, group: &str) -> PartitionResult {
        let group = GroupName::new(group)?;
        #[cfg(madsim)]
        if crate::planted::is_planted(crate::planted::Bug::ForgetKeepsPositions) {
            return Ok(PartitionOutcome::GroupForgotten { had_position: false });
        }
        let had_position = self.groups.remove(&group).is_some_and(|g| g.position.is_some());
        Ok(PartitionOutcome::GroupForgotten { had_position })
    }

    fn follow_placement(&mut self, epoch: u64) -> PartitionResult {
        // The same epoch again is a retry of a change that did not finish.
        if epoch < self.placement_epoch {
            return Err(PartitionRejection::StalePlacement { epoch, current: self.placement_epoch });
        }
        self.placement_epoch = epoch;
        Ok(PartitionOutcome::PlacementFollowed { epoch })
    }

    fn forget_idle_group(&mut self, at: TimestampMs, group: &str, idle_ms: u64) -> PartitionResult {
        let group = GroupName::new(group)?;
        let Some(entry) = self.groups.get(&group) else {
            return Ok(PartitionOutcome::GroupForgotten { had_position: false });
        };
        let idle_ms_ago = at.0.saturating_sub(entry.touched_at.0);
        if idle_ms_ago < idle_ms {
            return Err(PartitionRejection::GroupActive { group, idle_ms_ago, idle_ms });
        }
        let had_position = self.groups.remove(&group).is_some_and(|g| g.position.is_some());
        Ok(PartitionOutcome::GroupForgotten { had_position })
    }

    fn reset_position(&mut self, at: TimestampMs, group: &str, position: Offset) -> PartitionResult {
        let group = GroupName::new(group)?;
        if position < self.log_start || position > self.high_watermark {
            return Err(PartitionRejection::PositionOutOfRange {
                position,
                log_start: self.log_start,
                high_watermark: self.high_watermark,
            });
        }
        self.ensure_room_for(&group)?;
        let entry = self.groups.entry(group).or_default();
        entry.position = Some(position);
        entry.touched_at = entry.touched_at.max(at);
        Ok(PartitionOutcome::PositionReset { position })
    }

    fn apply_retention<L: RecordLog>(
        &mut self,
        log: &mut L,
        at: TimestampMs,
        policy: RetentionPolicy,
    ) -> Result<PartitionOutcome, L::Error> {
        let mut new_start = self.log_start;
        let mut bytes = self.log_bytes;
        let mut removed = 0u64;
        let removed_max = u64::from(self.limits.retention_records_per_apply_max);
        // Sizes a chunk at a time (a log reads them run by run, without
        // the records: one record at a time, an apply of 100,000 held the
        // partition's applies back for 200 ms).
        'scan: while new_start < self.high_watermark && removed < removed_max {
            let wanted = (removed_max - removed).min(RETENTION_SCAN_RECORDS).min(self.high_watermark.0 - new_start.0);
            let sizes = log.sizes_from(new_start, wanted)?;
            let short = (sizes.len() as u64) < wanted;
            for (append_time_ms, size) in sizes {
                let too_old = policy.max_age_ms.is_some_and(|age| append_time_ms.plus_ms(age) <= at);
                let too_big = policy.max_bytes.is_some_and(|max| bytes > max);
                if !too_old && !too_big {
                    break 'scan;
                }
                bytes -= size;
                new_start = new_start.next();
                removed += 1;
            }
            if short {
                break;
            }
        }
        if removed > 0 {
            log.remove_before(new_start)?;
            self.log_start = new_start;
            self.log_bytes = bytes;
        }
        let groups_behind = self
            .groups
            .iter()
            .filter_map(|(name, g)| g.position.filter(|p| *p < new_start).map(|p| (name.clone(), p)))
            .collect();
        Ok(PartitionOutcome::Retained { log_start: new_start, removed_records: removed, groups_behind })
    }

    /// Read up to `max_records` records from `from`, stopping before the
    /// record that would take the total past `max_bytes` (but always
    /// returning at least one record if any is there, so a consumer never
    /// stalls on a record larger than its byte budget).
    pub fn read<L: RecordLog>(
        &self,
        log: &L,
        from: Offset,
        max_records: u32,
        max_bytes: u64,
    ) -> Result<Vec<StoredRecord>, ReadError<L::Error>> {
        if from < self.log_start || from > self.high_watermark {
            return Err(ReadError::OffsetOutOfRange {
                requested: from,
                log_start: self.log_start,
                high_watermark: self.high_watermark,
            });
        }
        let max_records = u64::from(max_records.min(self.limits.read_records_max));
        let mut records = Vec::new();
        let mut bytes = 0u64;
        let mut offset = from;
        while offset < self.high_watermark && (records.len() as u64) < max_records {
            let Some(stored) = log.get(offset).map_err(ReadError::Storage)? else {
                break;
            };
            let size = stored.record.size_bytes();
            if !records.is_empty() && bytes + size > max_bytes {
                break;
            }
            bytes += size;
            records.push(stored);
            offset = offset.next();
        }
        Ok(records)
    }

    /// Check every invariant, including that `log` holds exactly the
    /// offsets `[log_start, high_watermark)` at its ends.
    pub fn check_invariants<L: RecordLog>(&self, log: &L) -> Result<(), InvariantViolation> {
        let (start, end) = (self.log_start, self.high_watermark);
        ensure(start <= end, || format!("log start {start} is past the high watermark {end}"))?;
        ensure(start != end || self.log_bytes == 0, || format!("empty log holds {} bytes", self.log_bytes))?;
        ensure(self.producers.len() as u64 <= u64::from(self.limits.producers_per_partition_max.max(1)), || {
            "too many producers".into()
        })?;
        for (id, producer) in &self.producers {
            let remembered = producer.recent.len() as u64;
            ensure(
                remembered >= 1 && remembered <= u64::from(self.limits.producer_batches_remembered_max.max(1)),
                || format!("producer {id} remembers {remembered} batches"),
            )?;
            let in_order = producer
                .recent
                .iter()
                .zip(producer.recent.iter().skip(1))
                .all(|(a, b)| b.sequence.0 == a.sequence.0 + 1 && b.base_offset >= a.base_offset);
            ensure(in_order, || format!("producer {id}'s batches are out of order"))?;
            ensure(producer.recent.iter().all(|b| b.base_offset.0 + u64::from(b.count) <= end.0), || {
                format!("producer {id} remembers offsets past the log")
            })?;
        }
        for (name, group) in &self.groups {
            if let Some(position) = group.position {
                ensure(position <= end, || {
                    format!("group {name} position {position} is past the high watermark {end}")
                })?;
            }
        }
        let stored = |offset: Offset| log.get(offset).map_err(|e| InvariantViolation(format!("log read failed: {e}")));
        if start < end {
            ensure(stored(start)?.is_some_and(|r| r.offset == start), || format!("log start {start} is not stored"))?;
            let last = Offset(end.0 - 1);
            ensure(stored(last)?.is_some_and(|r| r.offset == last), || format!("last offset {last} is not stored"))?;
        }
        ensure(stored(end)?.is_none(), || format!("offset {end} at the high watermark is stored"))?;
        if start.0 > 0 {
            ensure(stored(Offset(start.0 - 1))?.is_none(), || "a record below the log start is stored".into())?;
        }
        Ok(())
    }
}
