//! The checkers: one per guarantee, each a pure function of the recorded
//! history (see `ARCHITECTURE.md` for G1-G8 and L1). They report at most a
//! few violations each, with enough detail to find the events.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::history::{topic_key, Event, EventKind, Seen};

/// A guarantee the simulation checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Guarantee {
    G1,
    G2,
    G3,
    G4,
    G5,
    G6,
    G7,
    G8,
    L1,
    /// Not a broker guarantee: the same seed must run the same way twice.
    Replay,
    /// Bad input gets a clear error and changes nothing: a forged or
    /// malformed request must be refused.
    Refusal,
}

impl fmt::Display for Guarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Guarantee::G1 => "G1 lost write",
            Guarantee::G2 => "G2 inconsistent offsets",
            Guarantee::G3 => "G3 order",
            Guarantee::G4 => "G4 committed offsets",
            Guarantee::G5 => "G5 fencing",
            Guarantee::G6 => "G6 replica agreement",
            Guarantee::G7 => "G7 node failure",
            Guarantee::G8 => "G8 idempotence",
            Guarantee::L1 => "L1 liveness",
            Guarantee::Replay => "replay determinism",
            Guarantee::Refusal => "refusal of hostile requests",
        };
        f.write_str(name)
    }
}

/// One broken guarantee.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub guarantee: Guarantee,
    pub message: String,
}

/// What the checkers found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    /// Records delivered to consumers more than once (allowed).
    pub duplicates: u64,
    /// Records acknowledged to producers.
    pub acknowledged: u64,
    /// Client operations invoked (produce, ack).
    pub operations: u64,
}

/// Most violations reported per guarantee.
const REPORTED_MAX: usize = 5;

struct Findings {
    violations: Vec<Violation>,
    per_guarantee: BTreeMap<Guarantee, usize>,
}

impl Findings {
    fn add(&mut self, guarantee: Guarantee, message: String) {
        let count = self.per_guarantee.entry(guarantee).or_default();
        *count += 1;
        if *count <= REPORTED_MAX {
            self.violations.push(Violation { guarantee, message });
        }
    }
}

type Partition = (String, u32);

/// Run every checker over `events`.
pub fn check(events: &[Event]) -> Verdict {
    let mut findings = Findings { violations: Vec::new(), per_guarantee: BTreeMap::new() };
    let acked = acknowledged(events);
    // Records acknowledged to an incarnation of a topic deleted since are
    // gone with it, by design: only the final incarnations' must survive
    // and be consumed. (A run without a final placement keeps them all.)
    let current: BTreeSet<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Placement { topic, .. } => Some(topic.clone()),
            _ => None,
        })
        .collect();
    let acked_all = acked;
    let acked: Vec<Acked> = if current.is_empty() {
        acked_all
    } else {
        acked_all.into_iter().filter(|a| current.contains(&a.partition.0)).collect()
    };
    // A run cut short by a panic has no final reads: judge only what the
    // history up to the panic shows.
    let complete = events.iter().any(|e| matches!(&e.kind, EventKind::Phase { name } if name == "final"));
    node_failures(events, &mut findings);
    joins_refused(events, &mut findings);
    one_record_per_offset(events, &mut findings);
    order(events, &mut findings);
    committed_offsets(events, &mut findings);
    fencing(events, &mut findings);
    let mut duplicates = 0;
    if complete {
        let canonical = canonical_logs(events, &mut findings);
        // Records retention removed need neither survive nor be consumed.
        let removed_below = removed_below(events);
        let kept: Vec<Acked> = acked.iter().filter_map(|a| a.kept_from(&removed_below)).collect();
        lost_writes(&kept, &canonical, &mut findings);
        on_a_majority(events, &kept, &mut findings);
        no_duplicate_appends(&canonical, &mut findings);
        duplicates = liveness(events, &kept, &mut findings);
        write_probes(events, &canonical, &removed_below, &mut findings);
    }
    findings.violations.sort_by_key(|v| v.guarantee);
    let operations = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ProduceInvoke { .. } | EventKind::AckInvoke { .. }))
        .count() as u64;
    let acknowledged = acked.iter().map(|a| a.values.len() as u64).sum();
    Verdict { violations: findings.violations, duplicates, acknowledged, operations }
}

/// An acknowledged produce: where its records must be.
#[derive(Clone)]
struct Acked {
    partition: Partition,
    base_offset: u64,
    values: Vec<String>,
    producer: u64,
}

impl Acked {
    /// The records of this produce at or past the log start retention
    /// moved its partition to (`None` if retention removed them all).
    fn kept_from(&self, removed_below: &BTreeMap<Partition, u64>) -> Option<Acked> {
        let start = removed_below.get(&self.partition).copied().unwrap_or(0);
        let skip = start.saturating_sub(self.base_offset) as usize;
        (skip < self.values.len()).then(|| Acked {
            partition: self.partition.clone(),
            base_offset: self.base_offset + skip as u64,
            values: self.values[skip..].to_vec(),
            producer: self.producer,
        })
    }
}

/// Per partition, the furthest log start a replica ended with: retention
/// removed the records below it, by design.
fn removed_below(events: &[Event]) -> BTreeMap<Partition, u64> {
    let mut starts: BTreeMap<Partition, u64> = BTreeMap::new();
    for event in events {
        if let EventKind::ReplicaLog { topic, partition, log_start, .. } = &event.kind {
            let start = starts.entry((topic.clone(), *partition)).or_insert(0);
            *start = (*start).max(*log_start);
        }
    }
    starts
}

fn acknowledged(events: &[Event]) -> Vec<Acked> {
    let mut invoked = BTreeMap::new();
    let mut acked = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::ProduceInvoke { op, producer, topic, partition, values } => {
                invoked.insert(*op, ((topic.clone(), *partition), values.clone(), *producer));
            }
            EventKind::ProduceOk { op, base_offset, topic_id, partition: went_to, .. } => {
                if let Some((partition, values, producer)) = invoked.get(op) {
                    let partition: &Partition = partition;
                    acked.push(Acked {
                        partition: (topic_key(&partition.0, *topic_id), went_to.unwrap_or(partition.1)),
                        base_offset: *base_offset,
                        values: values.clone(),
                        producer: *producer,
                    });
                }
            }
            _ => {}
        }
    }
    acked
}

/// G6: per partition, every replica's log must be a prefix of the longest
/// one, which is the canonical committed log.
fn canonical_logs(events: &[Event], findings: &mut Findings) -> BTreeMap<Partition, Vec<Seen>> {
    let mut replicas: BTreeMap<Partition, Vec<(u64, &Vec<Seen>)>> = BTreeMap::new();
    for event in events {
        if let EventKind::ReplicaLog { broker, topic, partition, records, log_start, high_watermark } = &event.kind {
            replicas.entry((topic.clone(), *partition)).or_default().push((*broker, records));
            // A replica holds every offset from its log start to its high
            // watermark: a hole (a record its state says it has) is lost.
            let expected = high_watermark.saturating_sub(*log_start);
            let contiguous = records.iter().enumerate().all(|(i, r)| r.offset == log_start + i as u64);
            if records.len() as u64 != expected || !contiguous {
                let missing = (*log_start..*high_watermark).find(|o| !records.iter().any(|r| r.offset == *o));
                findings.add(
                    Guarantee::G6,
                    format!(
                        "{topic}/{partition}: broker {broker}'s high watermark is {high_watermark} from log start \
                         {log_start}, but it holds {} records (offset {missing:?} is missing)",
                        records.len()
                    ),
                );
            }
        }
    }
    let mut canonical = BTreeMap::new();
    for (partition, logs) in replicas {
        // The longest log reaches furthest; logs may start at different
        // offsets (retention), so they are compared offset by offset.
        let last = |log: &Vec<Seen>| log.last().map_or(0, |r| r.offset + 1);
        let longest = logs.iter().max_by_key(|(broker, log)| (last(log), log.len(), std::cmp::Reverse(*broker)));
        let longest = longest.map(|l| l.1.clone()).unwrap_or_default();
        let by_offset: BTreeMap<u64, &Seen> = longest.iter().map(|r| (r.offset, r)).collect();
        for (broker, log) in &logs {
            let differs = log.iter().enumerate().find_map(|(index, mine)| {
                by_offset.get(&mine.offset).filter(|theirs| **theirs != mine).map(|theirs| (index, mine, *theirs))
            });
            if let Some((index, mine, theirs)) = differs {
                findings.add(
                    Guarantee::G6,
                    format!(
                        "{}/{}: broker {broker}'s log differs from the committed log at position {index}: {mine:?} vs {theirs:?}",
                        partition.0, partition.1
                    ),
                );
            }
        }
        canonical.insert(partition, longest);
    }
    canonical
}

/// G1: every acknowledged record is in the committed log where its
/// acknowledgement said.
fn lost_writes(acked: &[Acked], canonical: &BTreeMap<Partition, Vec<Seen>>, findings: &mut Findings) {
    for produce in acked {
        let log = canonical.get(&produce.partition);
        for (i, value) in produce.values.iter().enumerate() {
            let offset = produce.base_offset + i as u64;
            let found = log.and_then(|log| log.iter().find(|r| r.offset == offset));
            if found.map(|r| &r.value) != Some(value) {
                findings.add(
                    Guarantee::G1,
                    format!(
                        "acknowledged record {value:?} at {}/{} offset {offset} is not in the committed log (found {:?})",
                        produce.partition.0,
                        produce.partition.1,
                        found.map(|r| &r.value)
                    ),
                );
            }
        }
    }
}

/// G1 after moves and removals: every acknowledged record is held, at its
/// offset, by a majority of the partition's replicas in the final
/// placement (a record on a minority would be lost with it).
fn on_a_majority(events: &[Event], acked: &[Acked], findings: &mut Findings) {
    let mut placement: BTreeMap<Partition, Vec<u64>> = BTreeMap::new();
    let mut held: BTreeMap<(Partition, u64), BTreeMap<u64, &str>> = BTreeMap::new();
    for event in events {
        match &event.kind {
            EventKind::Placement { topic, partition, replicas } => {
                placement.insert((topic.clone(), *partition), replicas.clone());
            }
            EventKind::ReplicaLog { broker, topic, partition, records, .. } => {
                let by_offset = held.entry(((topic.clone(), *partition), *broker)).or_default();
                for record in records {
                    by_offset.insert(record.offset, record.value.as_str());
                }
            }
            _ => {}
        }
    }
    for produce in acked {
        let Some(replicas) = placement.get(&produce.partition) else { continue };
        let majority = replicas.len() / 2 + 1;
        for (i, value) in produce.values.iter().enumerate() {
            let offset = produce.base_offset + i as u64;
            let holders: Vec<u64> = replicas
                .iter()
                .copied()
                .filter(|b| {
                    held.get(&(produce.partition.clone(), *b)).and_then(|log| log.get(&offset)) == Some(&value.as_str())
                })
                .collect();
            if holders.len() < majority {
                findings.add(
                    Guarantee::G1,
                    format!(
                        "acknowledged record {value:?} at {}/{} offset {offset} is on {} of the current replicas \
                         {replicas:?} ({holders:?}), not on a majority",
                        produce.partition.0,
                        produce.partition.1,
                        holders.len()
                    ),
                );
            }
        }
    }
}

/// G2: every observation of (partition, offset), by consumers and in the
/// replicas' logs, is the same record with the same append time.
fn one_record_per_offset(events: &[Event], findings: &mut Findings) {
    let mut seen: BTreeMap<(String, u32, u64), (String, u64, String)> = BTreeMap::new();
    let mut observe = |topic: &str, partition: u32, record: &Seen, who: String, findings: &mut Findings| {
        let key = (topic.to_string(), partition, record.offset);
        match seen.get(&key) {
            Some((value, time, first)) if *value != record.value || *time != record.append_time_ms => {
                findings.add(
                    Guarantee::G2,
                    format!(
                        "{topic}/{partition} offset {}: {first} saw {value:?} appended at {time}, {who} saw {:?} appended at {}",
                        record.offset, record.value, record.append_time_ms
                    ),
                );
            }
            Some(_) => {}
            None => {
                seen.insert(key, (record.value.clone(), record.append_time_ms, who));
            }
        }
    };
    for event in events {
        match &event.kind {
            EventKind::PollOk { member, topic, partition, records, .. } => {
                for record in records {
                    observe(topic, *partition, record, format!("member {member}"), findings);
                }
            }
            EventKind::ReplicaLog { broker, topic, partition, records, .. } => {
                for record in records {
                    observe(topic, *partition, record, format!("broker {broker}"), findings);
                }
            }
            EventKind::ReadOk { topic, partition, offset, records } => {
                let contiguous = records.iter().enumerate().all(|(i, r)| r.offset == offset + i as u64);
                if !contiguous {
                    let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
                    findings.add(
                        Guarantee::G2,
                        format!("a read of {topic}/{partition} from offset {offset} returned offsets {offsets:?}"),
                    );
                }
                for record in records {
                    observe(topic, *partition, record, "the reader".to_string(), findings);
                }
            }
            _ => {}
        }
    }
}

/// G3: within one member session (member, generation) the offsets polled
/// from a partition strictly increase; one producer's acknowledged batches
/// to a partition sit in the order it sent them.
fn order(events: &[Event], findings: &mut Findings) {
    let mut last_polled: BTreeMap<(String, u64, String, u32), u64> = BTreeMap::new();
    let mut invoked = BTreeMap::new();
    let mut last_produced: BTreeMap<(u64, String, u32), u64> = BTreeMap::new();
    for event in events {
        match &event.kind {
            EventKind::PollOk { member, generation, topic, partition, records, .. } => {
                for record in records {
                    let key = (member.clone(), *generation, topic.clone(), *partition);
                    if let Some(last) = last_polled.get(&key) {
                        if record.offset <= *last {
                            findings.add(
                                Guarantee::G3,
                                format!(
                                    "member {member} generation {generation} polled {topic}/{partition} offset {} after offset {last}",
                                    record.offset
                                ),
                            );
                        }
                    }
                    last_polled.insert(key, record.offset);
                }
            }
            EventKind::ProduceInvoke { op, producer, topic, partition, .. } => {
                invoked.insert(*op, (*producer, topic.clone(), *partition));
            }
            EventKind::ProduceOk { op, base_offset, topic_id, partition: went_to, .. } => {
                if let Some((producer, topic, partition)) = invoked.get(op) {
                    let key = &(*producer, topic_key(topic, *topic_id), went_to.unwrap_or(*partition));
                    if let Some(last) = last_produced.get(key) {
                        if *base_offset <= *last {
                            findings.add(
                                Guarantee::G3,
                                format!(
                                    "producer {} batch at {}/{} offset {base_offset} landed before its earlier batch at {last}",
                                    key.0, key.1, key.2
                                ),
                            );
                        }
                    }
                    last_produced.insert(key.clone(), *base_offset);
                }
            }
            _ => {}
        }
    }
}

/// G4: a group's committed position never goes backwards on a replica
/// (within one run of that broker) and never passes the high watermark;
/// a hostile ack (backwards or past the high watermark) never succeeds.
fn committed_offsets(events: &[Event], findings: &mut Findings) {
    let mut last: BTreeMap<(u64, u64, String, u32, String), u64> = BTreeMap::new();
    let mut hostile = BTreeMap::new();
    for event in events {
        match &event.kind {
            EventKind::PositionSample { broker, incarnation, topic, partition, group, position, high_watermark } => {
                if position > high_watermark {
                    findings.add(
                        Guarantee::G4,
                        format!(
                            "broker {broker}: group {group} position {position} on {topic}/{partition} is past the high watermark {high_watermark}"
                        ),
                    );
                }
                let key = (*broker, *incarnation, topic.clone(), *partition, group.clone());
                // The raw-entries lane forgets its own groups and makes them
                // again: their positions start over.
                let made_again = group.starts_with(crate::history::FILL_GROUP_PREFIX);
                if let Some(previous) = last.get(&key).filter(|_| !made_again) {
                    if position < previous {
                        findings.add(
                            Guarantee::G4,
                            format!(
                                "broker {broker}: group {group} position on {topic}/{partition} went back from {previous} to {position}"
                            ),
                        );
                    }
                }
                last.insert(key, *position);
            }
            EventKind::AckInvoke { op, member, topic, partition, offset, hostile: true, .. } => {
                hostile.insert(*op, format!("member {member}'s hostile ack of {topic}/{partition} offset {offset}"));
            }
            EventKind::AckOk { op, position } => {
                if let Some(what) = hostile.get(op) {
                    findings.add(Guarantee::G4, format!("{what} succeeded (position {position})"));
                }
            }
            _ => {}
        }
    }
}

/// G5: once a member of generation g has polled a partition (which claims
/// it), or a replica applied g's claim (committed, whoever made it), no
/// poll of an older generation invoked later hands on records, and no ack
/// of one succeeds.
fn fencing(events: &[Event], findings: &mut Findings) {
    // Per group and partition: the earliest completion time of a poll per
    // generation (generations are a group's own).
    type Claims = BTreeMap<(String, Partition), BTreeMap<u64, u64>>;
    let mut claimed: Claims = BTreeMap::new();
    let mut acks = BTreeMap::new();
    let check = |key: &(String, Partition),
                 generation: u64,
                 invoked_at: u64,
                 what: String,
                 claimed: &Claims,
                 findings: &mut Findings| {
        let newer = claimed.get(key).and_then(|claims| {
            claims.range(generation + 1..).find(|(_, claimed_at)| **claimed_at < invoked_at).map(|(g, t)| (*g, *t))
        });
        if let Some((newer, at)) = newer {
            let (group, partition) = key;
            findings.add(
                Guarantee::G5,
                format!(
                    "{what} of group {group} generation {generation} on {}/{} succeeded although generation {newer} \
                     claimed it at {at} ms",
                    partition.0, partition.1
                ),
            );
        }
    };
    for event in events {
        match &event.kind {
            EventKind::PollOk { group, member, generation, topic, partition, invoked_at_ms, records, .. } => {
                let key = (group.clone(), (topic.clone(), *partition));
                // An empty answer hands nothing on (a broker answers one
                // without its read index: nothing to confirm).
                if !records.is_empty() {
                    check(&key, *generation, *invoked_at_ms, format!("a poll by {member}"), &claimed, findings);
                }
                claimed.entry(key).or_default().entry(*generation).or_insert(event.at_ms);
            }
            EventKind::ClaimSample { group, topic, partition, generation, .. } => {
                let key = (group.clone(), (topic.clone(), *partition));
                claimed.entry(key).or_default().entry(*generation).or_insert(event.at_ms);
            }
            EventKind::ZombiePoll { group, member, generation, topic, partition, invoked_at_ms, .. } => {
                let key = (group.clone(), (topic.clone(), *partition));
                check(&key, *generation, *invoked_at_ms, format!("a zombie poll as {member}"), &claimed, findings);
            }
            EventKind::AckInvoke { op, group, member, generation, topic, partition, .. } => {
                acks.insert(
                    *op,
                    ((group.clone(), (topic.clone(), *partition)), *generation, event.at_ms, member.clone()),
                );
            }
            EventKind::AckOk { op, .. } => {
                if let Some((partition, generation, invoked_at, member)) = acks.get(op) {
                    check(partition, *generation, *invoked_at, format!("an ack by {member}"), &claimed, findings);
                }
            }
            _ => {}
        }
    }
}

/// L1: a broker joins unless the operator removed it. A join refused as
/// "removed" for a broker the operator never set out to remove (no drain
/// or removal of it, whatever their outcome) leaves it outside the cluster
/// for good (sim seed 220008084: its learner entry was lost in a power
/// cut, and its own log made it look like a member).
fn joins_refused(events: &[Event], findings: &mut Findings) {
    let mut removing = BTreeSet::new();
    for event in events {
        let EventKind::Operator { op, detail, outcome } = &event.kind else { continue };
        let broker = detail.strip_prefix("broker ").and_then(|rest| rest.split(' ').next()).unwrap_or("");
        match op.as_str() {
            "drain" | "remove" => {
                removing.insert(broker.to_string());
            }
            "joined" if outcome.contains("was removed from the cluster") && !removing.contains(broker) => findings
                .add(Guarantee::L1, format!("broker {broker} was never removed, but its join was refused: {outcome}")),
            _ => {}
        }
    }
}

/// G7: no node panicked or failed fatally. A disk that does not reopen
/// after a power cut lost what it acknowledged (G1).
fn node_failures(events: &[Event], findings: &mut Findings) {
    for event in events {
        match &event.kind {
            EventKind::NodeFailure { broker, reason } => {
                findings.add(Guarantee::G7, format!("broker {broker} failed: {reason}"))
            }
            EventKind::DiskLost { broker, reason } => findings
                .add(Guarantee::G1, format!("broker {broker}'s disk did not reopen after a power cut: {reason}")),
            EventKind::PositionReset { group, topic, partition, position, kept: Some(kept) } if kept < position => {
                findings.add(
                    Guarantee::G4,
                    format!(
                        "group {group}'s position on {topic}/{partition} was reset to {position} with no member \
                         left, but stayed at {kept}"
                    ),
                )
            }
            EventKind::GroupDeleted { group, kept, .. } if !kept.is_empty() => findings.add(
                Guarantee::G4,
                format!("group {group} was deleted with its positions, but these stayed: {}", kept.join(", ")),
            ),
            EventKind::Hostile { attack, accepted: Some(answer) } => {
                findings.add(Guarantee::Refusal, format!("a hostile request was accepted: {attack}; answer {answer}"))
            }
            EventKind::PowerCut { broker, lost, .. } => {
                for lost in lost {
                    findings.add(Guarantee::G1, format!("broker {broker} lost what it reported durable: {lost}"));
                }
            }
            EventKind::Killed { broker, lost, .. } => {
                for lost in lost {
                    findings.add(
                        Guarantee::G1,
                        format!("broker {broker}, killed after its disk filled, never wrote what it reported durable: {lost}"),
                    );
                }
            }
            _ => {}
        }
    }
}

/// L1 for writes: after the heal every partition takes a write again (the
/// probe), and G1 for the probe's record once acknowledged.
fn write_probes(
    events: &[Event],
    canonical: &BTreeMap<Partition, Vec<Seen>>,
    removed_below: &BTreeMap<Partition, u64>,
    findings: &mut Findings,
) {
    for event in events {
        let EventKind::WriteProbe { topic, partition, value, offset, error } = &event.kind else { continue };
        // Retention (by age, say) may remove a probe before the final
        // reads, as any record (sim seed 160006250).
        let start = removed_below.get(&(topic.clone(), *partition)).copied().unwrap_or(0);
        match (offset, error) {
            (Some(offset), _) if *offset < start => {}
            (Some(offset), _) => {
                let found = canonical
                    .get(&(topic.clone(), *partition))
                    .and_then(|log| log.iter().find(|r| r.offset == *offset));
                if found.map(|r| &r.value) != Some(value) {
                    findings.add(
                        Guarantee::G1,
                        format!(
                            "the write probe {value:?} acknowledged at {topic}/{partition} offset {offset} is not in the \
                             committed log (found {:?})",
                            found.map(|r| &r.value)
                        ),
                    );
                }
            }
            (None, error) => findings.add(
                Guarantee::L1,
                format!(
                    "{topic}/{partition} takes no writes after the heal: the probe {value:?} failed: {}",
                    error.as_deref().unwrap_or("no answer")
                ),
            ),
        }
    }
}

/// G8: no record (all values are unique per produce) sits at two offsets.
fn no_duplicate_appends(canonical: &BTreeMap<Partition, Vec<Seen>>, findings: &mut Findings) {
    for (partition, log) in canonical {
        let mut at: BTreeMap<&str, u64> = BTreeMap::new();
        for record in log {
            if let Some(first) = at.insert(&record.value, record.offset) {
                findings.add(
                    Guarantee::G8,
                    format!(
                        "record {:?} was appended twice to {}/{}: offsets {first} and {}",
                        record.value, partition.0, partition.1, record.offset
                    ),
                );
            }
        }
    }
}

/// L1: the liveness phase ended in time with the group settled, and every
/// acknowledged record was delivered to a consumer. Returns the number of
/// duplicate deliveries.
fn liveness(events: &[Event], acked: &[Acked], findings: &mut Findings) -> u64 {
    // Each group's topics (a history without them has group g reading all).
    let mut subscribed: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut delivered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut duplicates = 0;
    for event in events {
        match &event.kind {
            EventKind::Subscribed { group, topics } => {
                subscribed.insert(group.clone(), Some(topics.iter().cloned().collect()));
            }
            EventKind::PollOk { group, records, .. } => {
                for record in records {
                    if !delivered.insert((group.clone(), record.value.clone())) {
                        duplicates += 1;
                    }
                }
            }
            EventKind::Failover { broker, group, leader: None, waited_ms } => findings.add(
                Guarantee::L1,
                format!(
                    "{group} had no leader {waited_ms} ms after broker {broker}, its leader, crashed, although its \
                     other replicas were up and the network calm"
                ),
            ),
            EventKind::LivenessTimeout { missing } => {
                // Every group as last described (one event each at the end).
                let groups: BTreeMap<&str, String> = events
                    .iter()
                    .filter_map(|e| match &e.kind {
                        EventKind::GroupSettled { group, generation, members, unassigned } => Some((
                            group.as_str(),
                            format!("{group}: generation {generation}, members {members:?}, unassigned {unassigned:?}"),
                        )),
                        _ => None,
                    })
                    .collect();
                let group = (!groups.is_empty()).then(|| groups.into_values().collect::<Vec<_>>().join("; "));
                findings.add(
                    Guarantee::L1,
                    format!(
                        "not settled at the bound: {missing} acknowledged records unconsumed; group: {}",
                        group.unwrap_or_else(|| "not described".into())
                    ),
                );
            }
            _ => {}
        }
    }
    if subscribed.is_empty() {
        subscribed.insert(crate::history::main_group(), None);
    }
    for (group, topics) in &subscribed {
        let reads = |a: &&Acked| {
            let name = a.partition.0.split('@').next().unwrap_or_default();
            topics.as_ref().is_none_or(|topics| topics.contains(name))
        };
        let missing: Vec<&String> = acked
            .iter()
            .filter(reads)
            .flat_map(|a| &a.values)
            .filter(|value| !delivered.contains(&(group.clone(), value.to_string())))
            .collect();
        if !missing.is_empty() {
            findings.add(
                Guarantee::L1,
                format!(
                    "{} acknowledged records were never consumed by group {group}, e.g. {:?} (producer {})",
                    missing.len(),
                    missing[0],
                    acked.iter().find(|a| a.values.contains(missing[0])).map_or(0, |a| a.producer)
                ),
            );
        }
    }
    duplicates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(at_ms: u64, op: &str, detail: &str, outcome: &str) -> Event {
        Event {
            at_ms,
            process: "operator".into(),
            kind: EventKind::Operator { op: op.into(), detail: detail.into(), outcome: outcome.into() },
        }
    }

    #[test]
    fn a_join_refused_is_a_finding_only_for_a_broker_never_removed() {
        let refused = "refused: Refused(\"broker 4 was removed from the cluster\")";
        let mut findings = Findings { violations: Vec::new(), per_guarantee: BTreeMap::new() };
        joins_refused(&[operator(9_000, "joined", "broker 4 through 10.0.0.1:7100", refused)], &mut findings);
        assert_eq!(findings.violations.len(), 1, "{:?}", findings.violations);
        assert_eq!(findings.violations[0].guarantee, Guarantee::L1);

        let mut findings = Findings { violations: Vec::new(), per_guarantee: BTreeMap::new() };
        let events = [
            operator(3_000, "joined", "broker 4 through 10.0.0.1:7100", "ok"),
            operator(5_000, "drain", "broker 4", "ok: 2 moved"),
            operator(9_000, "joined", "broker 4 through 10.0.0.1:7100", refused),
        ];
        joins_refused(&events, &mut findings);
        assert!(findings.violations.is_empty(), "{:?}", findings.violations);

        // Refused for another reason: not this checker's finding.
        let mut findings = Findings { violations: Vec::new(), per_guarantee: BTreeMap::new() };
        let full = "refused: Refused(\"the cluster holds 3 brokers, its limit\")";
        joins_refused(&[operator(9_000, "joined", "broker 4 through 10.0.0.1:7100", full)], &mut findings);
        assert!(findings.violations.is_empty(), "{:?}", findings.violations);
    }
}
