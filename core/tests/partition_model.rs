//! Model test of the partition state machine: random sequences of valid and
//! invalid commands (appends with idempotent producers, claims, commits,
//! resets, retention), each compared with a small reference model; reads
//! compared with the model's log; `check_invariants()` after every step.

use std::collections::BTreeMap;

use keel_core::metadata::RetentionPolicy;
use keel_core::partition::{
    AppendBatch, MemoryLog, PartitionCommand, PartitionOutcome, PartitionRejection, PartitionState, ProducerBatch,
};
use keel_core::record::{Header, Record};
use keel_core::{Generation, GroupName, Limits, Offset, ProducerId, Sequence, TimestampMs};
use proptest::prelude::*;

#[path = "common/mod.rs"]
mod common;

fn limits() -> Limits {
    Limits {
        record_key_bytes_max: 4,
        record_value_bytes_max: 8,
        record_headers_max: 1,
        record_bytes_max: 12,
        batch_records_max: 4,
        batch_bytes_max: 20,
        read_records_max: 5,
        producers_per_partition_max: 2,
        producer_batches_remembered_max: 2,
        groups_per_partition_max: 2,
        retention_records_per_apply_max: 3,
        ..Limits::default()
    }
}

const GROUPS: [&str; 4] = ["g1", "g2", "g3", "bad/group"];
const MEMBERS: [&str; 3] = ["m1", "m2", ""];

/// How a generated command picks a sequence or offset: relative to the
/// model's state, so that valid commands are common.
#[derive(Debug, Clone)]
pub enum SequenceChoice {
    Next,
    Back(u64),
    Ahead(u64),
}

#[derive(Debug, Clone)]
pub enum OffsetChoice {
    Read(u64),
    FromEnd(u64),
    Raw(u64),
}

/// One batch of an `AppendBatches` step: its producer and records.
pub type BatchStep = (Option<(u64, SequenceChoice)>, Vec<Record>);

#[derive(Debug, Clone)]
pub enum Step {
    Append {
        producer: Option<(u64, SequenceChoice)>,
        records: Vec<Record>,
    },
    /// Several appends in one entry (sequences resolved before any applies).
    AppendBatches {
        batches: Vec<BatchStep>,
    },
    Claim {
        group: &'static str,
        member: &'static str,
        generation: u64,
        member_epoch: u64,
    },
    Commit {
        group: &'static str,
        member: &'static str,
        generation: u64,
        member_epoch: u64,
        offset: OffsetChoice,
    },
    Reset {
        group: &'static str,
        position: OffsetChoice,
    },
    Retention {
        max_age_ms: Option<u64>,
        max_bytes: Option<u64>,
    },
    Forget {
        group: &'static str,
    },
}

fn record() -> impl Strategy<Value = Record> {
    (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..6)),
        proptest::collection::vec(any::<u8>(), 0..10),
        proptest::collection::vec(
            (proptest::sample::select(&["h", "hh"][..]), proptest::collection::vec(any::<u8>(), 0..2)),
            0..3,
        ),
    )
        .prop_map(|(key, value, headers)| Record {
            key,
            value,
            headers: headers.into_iter().map(|(k, v)| Header { key: k.to_string(), value: v }).collect(),
            producer_timestamp_ms: None,
        })
}

fn step() -> impl Strategy<Value = Step> {
    let sequence = prop_oneof![6 => Just(SequenceChoice::Next), 2 => (0u64..4).prop_map(SequenceChoice::Back), 1 => (1u64..3).prop_map(SequenceChoice::Ahead)];
    let offset = prop_oneof![4 => (0u64..3).prop_map(OffsetChoice::Read), 2 => (0u64..3).prop_map(OffsetChoice::FromEnd), 1 => (0u64..40).prop_map(OffsetChoice::Raw)];
    let group = proptest::sample::select(&GROUPS[..]);
    let member = proptest::sample::select(&MEMBERS[..]);
    prop_oneof![
        8 => (proptest::option::of((1u64..5, sequence.clone())), proptest::collection::vec(record(), 0..6)).prop_map(|(producer, records)| Step::Append { producer, records }),
        3 => proptest::collection::vec((proptest::option::of((1u64..5, sequence)), proptest::collection::vec(record(), 0..4)), 0..4).prop_map(|batches| Step::AppendBatches { batches }),
        3 => (group.clone(), member.clone(), 0u64..4, 1u64..3).prop_map(|(group, member, generation, member_epoch)| Step::Claim { group, member, generation, member_epoch }),
        5 => (group.clone(), member, 0u64..4, 1u64..3, offset.clone()).prop_map(|(group, member, generation, member_epoch, offset)| Step::Commit { group, member, generation, member_epoch, offset }),
        1 => (group.clone(), offset).prop_map(|(group, position)| Step::Reset { group, position }),
        1 => group.prop_map(|group| Step::Forget { group }),
        2 => (proptest::option::of(0u64..200), proptest::option::of(0u64..60)).prop_map(|(max_age_ms, max_bytes)| Step::Retention { max_age_ms, max_bytes }),
    ]
}

#[derive(Debug, Clone, Default)]
struct ModelProducer {
    /// Every batch ever appended: (sequence, base offset, count).
    batches: Vec<(u64, u64, u32)>,
    last_append_at: u64,
}

#[derive(Debug, Clone, Default)]
struct ModelGroup {
    /// (generation, member, member epoch)
    claim: Option<(u64, String, u64)>,
    position: Option<u64>,
}

/// The reference model: the whole log as a vector (nothing is really
/// removed, `log_start` just moves), full producer histories, and the rules
/// written out once more.
#[derive(Debug, Clone)]
struct Model {
    limits: Limits,
    log: Vec<(Record, u64)>,
    log_start: u64,
    last_append_at: u64,
    producers: BTreeMap<u64, ModelProducer>,
    groups: BTreeMap<String, ModelGroup>,
}

fn size(record: &Record) -> u64 {
    record.key.as_ref().map_or(0, Vec::len) as u64
        + record.value.len() as u64
        + record.headers.iter().map(|h| (h.key.len() + h.value.len()) as u64).sum::<u64>()
}

impl Model {
    fn high_watermark(&self) -> u64 {
        self.log.len() as u64
    }

    fn bytes(&self) -> u64 {
        self.log[self.log_start as usize..].iter().map(|(r, _)| size(r)).sum()
    }

    fn resolve_sequence(&self, producer: u64, choice: &SequenceChoice) -> u64 {
        let next = self.producers.get(&producer).and_then(|p| p.batches.last()).map_or(0, |b| b.0 + 1);
        match choice {
            SequenceChoice::Next => next,
            SequenceChoice::Back(k) => next.saturating_sub(*k + 1),
            SequenceChoice::Ahead(k) => next + k,
        }
    }

    fn resolve_offset(&self, choice: &OffsetChoice, group: &str) -> u64 {
        let position = self.groups.get(group).and_then(|g| g.position).unwrap_or(self.log_start).max(self.log_start);
        match choice {
            OffsetChoice::Read(k) => position + k,
            OffsetChoice::FromEnd(k) => self.high_watermark().saturating_sub(k + 1),
            OffsetChoice::Raw(o) => *o,
        }
    }

    fn group_position(&self, group: &str) -> u64 {
        self.groups.get(group).and_then(|g| g.position).unwrap_or(self.log_start).max(self.log_start)
    }

    fn room_for(&self, group: &str) -> Result<(), PartitionRejection> {
        if !self.groups.contains_key(group) && self.groups.len() >= self.limits.groups_per_partition_max as usize {
            return Err(PartitionRejection::TooManyGroups { max: self.limits.groups_per_partition_max });
        }
        Ok(())
    }

    /// Apply a command to the model, returning the exact expected result.
    fn apply(&mut self, at: u64, command: &PartitionCommand) -> Result<PartitionOutcome, PartitionRejection> {
        match command {
            PartitionCommand::Append { producer, records } => self.append(at, *producer, records),
            PartitionCommand::AppendBatches { batches } => {
                if batches.is_empty() {
                    return Err(PartitionRejection::EmptyBatch);
                }
                let results = batches.iter().map(|b| self.append(at, b.producer, &b.records)).collect();
                Ok(PartitionOutcome::AppendedBatches { results })
            }
            PartitionCommand::Claim { group, member, generation, member_epoch } => {
                let name = GroupName::new(group.as_str())?;
                keel_core::MemberId::new(member.as_str())?;
                self.room_for(group)?;
                let entry = self.groups.entry(group.clone()).or_default();
                if let Some((g, m, e)) = &entry.claim {
                    if *g > generation.0 || (*g == generation.0 && m != member) {
                        return Err(PartitionRejection::Fenced {
                            group: name,
                            generation: *generation,
                            current: Generation(*g),
                        });
                    }
                    if *g == generation.0 && *e > *member_epoch {
                        return Err(PartitionRejection::EpochFenced {
                            group: name,
                            member: member.clone(),
                            member_epoch: *member_epoch,
                            current: *e,
                        });
                    }
                }
                entry.claim = Some((generation.0, member.clone(), *member_epoch));
                Ok(PartitionOutcome::Claimed { generation: *generation, position: Offset(self.group_position(group)) })
            }
            PartitionCommand::Commit { group, member, generation, member_epoch, offset } => {
                let name = GroupName::new(group.as_str())?;
                keel_core::MemberId::new(member.as_str())?;
                let claim = self.groups.get(group).and_then(|g| g.claim.clone());
                match claim {
                    Some((g, _, _)) if g > generation.0 => {
                        return Err(PartitionRejection::Fenced {
                            group: name,
                            generation: *generation,
                            current: Generation(g),
                        })
                    }
                    Some((g, m, e)) if g == generation.0 && &m == member && e > *member_epoch => {
                        return Err(PartitionRejection::EpochFenced {
                            group: name,
                            member: member.clone(),
                            member_epoch: *member_epoch,
                            current: e,
                        })
                    }
                    Some((g, m, e)) if g == generation.0 && &m == member && e == *member_epoch => {}
                    _ => {
                        return Err(PartitionRejection::NotClaimed {
                            group: name,
                            member: member.clone(),
                            generation: *generation,
                        })
                    }
                }
                if offset.0 >= self.high_watermark() {
                    return Err(PartitionRejection::CommitBeyondHighWatermark {
                        offset: *offset,
                        high_watermark: Offset(self.high_watermark()),
                    });
                }
                let entry = self.groups.get_mut(group).unwrap();
                if let Some(current) = entry.position {
                    if offset.0 + 1 < current {
                        return Err(PartitionRejection::CommitBackwards { offset: *offset, position: Offset(current) });
                    }
                }
                entry.position = Some(offset.0 + 1);
                Ok(PartitionOutcome::Committed { position: Offset(offset.0 + 1) })
            }
            PartitionCommand::ResetPosition { group, position } => {
                GroupName::new(group.as_str())?;
                if position.0 < self.log_start || position.0 > self.high_watermark() {
                    return Err(PartitionRejection::PositionOutOfRange {
                        position: *position,
                        log_start: Offset(self.log_start),
                        high_watermark: Offset(self.high_watermark()),
                    });
                }
                self.room_for(group)?;
                self.groups.entry(group.clone()).or_default().position = Some(position.0);
                Ok(PartitionOutcome::PositionReset { position: *position })
            }
            // Not generated: forgetting idle groups is tested by example
            // in tests/rejections.rs.
            PartitionCommand::ForgetIdleGroup { .. } => unreachable!("not generated"),
            // Not generated either: tested by example in tests/rejections.rs.
            PartitionCommand::FollowPlacement { .. } => unreachable!("not generated"),
            PartitionCommand::ForgetGroup { group } => {
                GroupName::new(group.as_str())?;
                let had_position = self.groups.remove(group).is_some_and(|g| g.position.is_some());
                Ok(PartitionOutcome::GroupForgotten { had_position })
            }
            PartitionCommand::ApplyRetention { policy } => {
                let mut removed = 0u64;
                while self.log_start < self.high_watermark()
                    && removed < u64::from(self.limits.retention_records_per_apply_max)
                {
                    let (_, time) = &self.log[self.log_start as usize];
                    let too_old = policy.max_age_ms.is_some_and(|age| time + age <= at);
                    let too_big = policy.max_bytes.is_some_and(|max| self.bytes() > max);
                    if !too_old && !too_big {
                        break;
                    }
                    self.log_start += 1;
                    removed += 1;
                }
                let groups_behind = self
                    .groups
                    .iter()
                    .filter_map(|(name, g)| {
                        g.position
                            .filter(|p| *p < self.log_start)
                            .map(|p| (GroupName::new(name.as_str()).unwrap(), Offset(p)))
                    })
                    .collect();
                Ok(PartitionOutcome::Retained {
                    log_start: Offset(self.log_start),
                    removed_records: removed,
                    groups_behind,
                })
            }
        }
    }

    fn append(
        &mut self,
        at: u64,
        producer: Option<ProducerBatch>,
        records: &[Record],
    ) -> Result<PartitionOutcome, PartitionRejection> {
        let l = &self.limits;
        if records.is_empty() {
            return Err(PartitionRejection::EmptyBatch);
        }
        if records.len() > l.batch_records_max as usize {
            return Err(PartitionRejection::TooManyRecords { count: records.len() as u64, max: l.batch_records_max });
        }
        for (index, record) in records.iter().enumerate() {
            if let Err(error) = record.validate(l) {
                return Err(PartitionRejection::InvalidRecord { index: index as u32, error });
            }
        }
        let bytes: u64 = records.iter().map(size).sum();
        if bytes > u64::from(l.batch_bytes_max) {
            return Err(PartitionRejection::BatchTooLarge { bytes, max: l.batch_bytes_max });
        }
        if let Some(ProducerBatch { producer, sequence }) = producer {
            match self.producers.get(&producer.0) {
                None if sequence.0 != 0 => return Err(PartitionRejection::UnknownProducer { producer, got: sequence }),
                None => {}
                Some(state) => {
                    let last = state.batches.last().unwrap().0;
                    if sequence.0 > last + 1 {
                        return Err(PartitionRejection::SequenceGap {
                            producer,
                            expected: Sequence(last + 1),
                            got: sequence,
                        });
                    }
                    if sequence.0 <= last {
                        let window =
                            state.batches.len().saturating_sub(self.limits.producer_batches_remembered_max as usize);
                        return match state.batches[window..].iter().find(|b| b.0 == sequence.0) {
                            Some((_, base, count)) => Ok(PartitionOutcome::Appended {
                                base_offset: Offset(*base),
                                count: *count,
                                duplicate: true,
                            }),
                            None => Err(PartitionRejection::SequenceTooOld { producer, got: sequence }),
                        };
                    }
                }
            }
        }
        let base = self.high_watermark();
        let time = at.max(self.last_append_at);
        self.last_append_at = time;
        self.log.extend(records.iter().map(|r| (r.clone(), time)));
        if let Some(ProducerBatch { producer, sequence }) = producer {
            let entry = self.producers.entry(producer.0).or_default();
            entry.batches.push((sequence.0, base, records.len() as u32));
            entry.last_append_at = time;
            while self.producers.len() > self.limits.producers_per_partition_max as usize {
                let oldest = *self.producers.iter().min_by_key(|(id, p)| (p.last_append_at, **id)).unwrap().0;
                self.producers.remove(&oldest);
            }
        }
        Ok(PartitionOutcome::Appended { base_offset: Offset(base), count: records.len() as u32, duplicate: false })
    }
}

/// Steps and reads for the model test and the fuzzer.
pub type Inputs = (Vec<(Step, u64, u8)>, Vec<(u64, u32, u64)>);

/// Steps (with clock advances and skews) and reads to check after each.
pub fn inputs() -> impl Strategy<Value = Inputs> {
    (
        proptest::collection::vec((step(), 0u64..40, 0u8..10), 1..80),
        proptest::collection::vec((0u64..30, 0u32..7, 0u64..40), 80),
    )
}

/// Apply the steps to the state machine and to the model side by side,
/// checking outcomes, invariants, reads and round trips after every step.
pub fn check_steps((steps, reads): Inputs) -> Result<(), TestCaseError> {
    let mut state = PartitionState::new(limits());
    let mut log = MemoryLog::new();
    let mut model = Model {
        limits: limits(),
        log: Vec::new(),
        log_start: 0,
        last_append_at: 0,
        producers: BTreeMap::new(),
        groups: BTreeMap::new(),
    };
    let mut clock = 1_000u64;
    for (index, ((step, advance, skew), (read_from, read_records, read_bytes))) in
        steps.into_iter().zip(reads).enumerate()
    {
        // A leader's clock mostly moves forward; sometimes a new leader's
        // clock is behind.
        clock = if skew == 0 { clock.saturating_sub(advance * 3) } else { clock + advance };
        let command = match step {
            Step::Append { producer, records } => PartitionCommand::Append {
                producer: producer.map(|(p, choice)| ProducerBatch {
                    producer: ProducerId(p),
                    sequence: Sequence(model.resolve_sequence(p, &choice)),
                }),
                records,
            },
            Step::AppendBatches { batches } => PartitionCommand::AppendBatches {
                batches: batches
                    .into_iter()
                    .map(|(producer, records)| AppendBatch {
                        producer: producer.map(|(p, choice)| ProducerBatch {
                            producer: ProducerId(p),
                            sequence: Sequence(model.resolve_sequence(p, &choice)),
                        }),
                        records,
                    })
                    .collect(),
            },
            Step::Claim { group, member, generation, member_epoch } => PartitionCommand::Claim {
                group: group.into(),
                member: member.into(),
                generation: Generation(generation),
                member_epoch,
            },
            Step::Commit { group, member, generation, member_epoch, offset } => PartitionCommand::Commit {
                group: group.into(),
                member: member.into(),
                generation: Generation(generation),
                member_epoch,
                offset: Offset(model.resolve_offset(&offset, group)),
            },
            Step::Reset { group, position } => PartitionCommand::ResetPosition {
                group: group.into(),
                position: Offset(model.resolve_offset(&position, group)),
            },
            Step::Retention { max_age_ms, max_bytes } => {
                PartitionCommand::ApplyRetention { policy: RetentionPolicy { max_age_ms, max_bytes } }
            }
            Step::Forget { group } => PartitionCommand::ForgetGroup { group: group.into() },
        };
        let before = state.clone();
        let expected = model.apply(clock, &command);
        let result = state.apply(&mut log, TimestampMs(clock), &command).unwrap();
        prop_assert_eq!(&result, &expected, "step {} {:?}", index, command);
        common::round_trip(&command)?;
        common::round_trip(&result)?;
        common::round_trip(&state)?;
        common::round_trip(&log)?;
        if result.is_err() {
            prop_assert_eq!(state.high_watermark(), before.high_watermark());
            prop_assert_eq!(state.log_start(), before.log_start());
            prop_assert_eq!(state.groups(), before.groups());
            prop_assert_eq!(state.producers(), before.producers());
        }
        state.check_invariants(&log).map_err(|e| TestCaseError::fail(format!("step {index} {command:?}: {e}")))?;
        prop_assert_eq!(state.high_watermark(), Offset(model.high_watermark()));
        prop_assert_eq!(state.log_start(), Offset(model.log_start));
        prop_assert_eq!(state.log_bytes(), model.bytes());
        for (name, group) in &model.groups {
            let real = &state.groups()[&GroupName::new(name.as_str()).unwrap()];
            prop_assert_eq!(real.position.map(|p| p.0), group.position);
            prop_assert_eq!(
                real.claim.as_ref().map(|c| (c.generation.0, c.member.to_string(), c.member_epoch)),
                group.claim.clone()
            );
        }
        // Reads return exactly the model's records, bounded by count and
        // bytes (at least one record when any is there).
        let read = state.read(&log, Offset(read_from), read_records, read_bytes);
        if read_from < model.log_start || read_from > model.high_watermark() {
            prop_assert!(read.is_err());
        } else {
            let records = read.unwrap();
            let cap = read_records.min(limits().read_records_max) as usize;
            let mut expected = Vec::new();
            let mut bytes = 0;
            for (offset, (record, time)) in model.log.iter().enumerate().skip(read_from as usize).take(cap) {
                if !expected.is_empty() && bytes + size(record) > read_bytes {
                    break;
                }
                bytes += size(record);
                expected.push((offset as u64, record.clone(), *time));
            }
            let got: Vec<_> = records.into_iter().map(|r| (r.offset.0, r.record, r.append_time_ms.0)).collect();
            prop_assert_eq!(got, expected);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn partition_matches_the_model(inputs in inputs()) {
        check_steps(inputs)?;
    }
}
