//! The recorded history of a run: every operation's invocation and
//! completion, every fault and heal, and the final reads of every replica,
//! each with its simulated time. The checkers read only this. It is written
//! out as JSON lines, and its hash (simulated times included) is the run's
//! trace hash: the same seed must give the same hash, in any process.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One record as a reader saw it: offset, value, append time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Seen {
    pub offset: u64,
    pub value: String,
    pub append_time_ms: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    Phase {
        name: String,
    },
    Fault {
        kind: String,
        detail: String,
    },
    Heal {
        kind: String,
        detail: String,
    },
    /// A produce of uniquely valued records was sent (`op` pairs it with
    /// its completion). Retries of the same batch are inside one operation.
    ProduceInvoke {
        op: u64,
        producer: u64,
        topic: String,
        partition: u32,
        values: Vec<String>,
    },
    ProduceOk {
        op: u64,
        base_offset: u64,
        count: u32,
        duplicate: bool,
        /// The topic incarnation the records went to (0 in histories from
        /// before topics were deleted and created again in a run).
        #[serde(default)]
        topic_id: u64,
        /// The partition the records went to, where the producer chose it
        /// by key from the partition count it knew (the invocation names
        /// the run's count, which a grown topic leaves behind).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<u32>,
    },
    ProduceFail {
        op: u64,
        error: String,
    },
    /// A member left the group gracefully.
    Left {
        member: String,
    },
    Joined {
        member: String,
        generation: u64,
        partitions: Vec<(String, u32)>,
    },
    PollOk {
        /// The member's group (`g` in histories from before groups had names).
        #[serde(default = "main_group")]
        group: String,
        member: String,
        generation: u64,
        topic: String,
        partition: u32,
        invoked_at_ms: u64,
        records: Vec<Seen>,
    },
    AckInvoke {
        op: u64,
        #[serde(default = "main_group")]
        group: String,
        member: String,
        generation: u64,
        topic: String,
        partition: u32,
        offset: u64,
        hostile: bool,
    },
    AckOk {
        op: u64,
        position: u64,
    },
    /// The ack was refused as fenced; the member rejoined.
    AckFenced {
        op: u64,
    },
    AckFail {
        op: u64,
        error: String,
    },
    /// A consumer group of the run and the topics its members read (every
    /// acknowledged record of them must reach the group, L1).
    Subscribed {
        group: String,
        topics: Vec<String>,
    },
    /// A read by offset outside any group (`topic` is `name@id`): the
    /// records must be the partition's, contiguous from `offset` (G2).
    ReadOk {
        topic: String,
        partition: u32,
        offset: u64,
        records: Vec<Seen>,
    },
    /// An operator reset `group`'s position on a partition to its high
    /// watermark, answered `position`; `kept` is the position a replica
    /// then reported (G4: at least the reset's, the group having no
    /// members to move it back).
    PositionReset {
        group: String,
        topic: String,
        partition: u32,
        position: u64,
        kept: Option<u64>,
    },
    /// A replica's applied state of a partition, sampled during the run
    /// (`incarnation` counts the broker's restarts).
    PositionSample {
        broker: u64,
        incarnation: u64,
        topic: String,
        partition: u32,
        group: String,
        position: u64,
        high_watermark: u64,
    },
    /// A replica's applied claim of a group on a partition, recorded when
    /// it changes: applied, the claim is committed, so `generation` has
    /// claimed the partition by then (G5), whether or not the poll that
    /// made it was answered.
    ClaimSample {
        broker: u64,
        topic: String,
        partition: u32,
        group: String,
        member: String,
        generation: u64,
    },
    /// Everything a replica holds of a partition at the end of the run.
    ReplicaLog {
        broker: u64,
        topic: String,
        partition: u32,
        log_start: u64,
        /// The replica's applied high watermark: `records` must be exactly
        /// the offsets from `log_start` up to it.
        high_watermark: u64,
        records: Vec<Seen>,
    },
    /// The group as the coordinator sees it at the end of the liveness phase.
    GroupSettled {
        #[serde(default = "main_group")]
        group: String,
        generation: u64,
        members: Vec<String>,
        unassigned: Vec<(String, u32)>,
    },
    /// A broker's disk did not reopen after a power cut: what it had
    /// acknowledged as durable is gone (G1).
    DiskLost {
        broker: u64,
        reason: String,
    },
    /// A broker lost power: `groups` persisted marks were checked against
    /// its durable image, and `lost` says which ones it did not hold (G1).
    PowerCut {
        broker: u64,
        groups: u64,
        lost: Vec<String>,
    },
    /// A broker's process was killed (kill -9, page cache kept; also after
    /// its disk filled): `groups` persisted marks were checked against what it
    /// had written, and `lost` says which ones that lacked (G1).
    Killed {
        broker: u64,
        groups: u64,
        lost: Vec<String>,
    },
    /// Raft snapshots a broker built and installed so far in this
    /// incarnation (sampled when they change).
    Snapshots {
        broker: u64,
        incarnation: u64,
        built: u64,
        installed: u64,
    },
    /// Bytes of live log frames a broker's compaction copied out of mostly
    /// dead segments so far in this incarnation (sampled when they change).
    LogCompacted {
        broker: u64,
        incarnation: u64,
        bytes: u64,
    },
    /// After the heal, one record written to a partition to show it takes
    /// writes again: acknowledged at `offset`, or refused with `error`
    /// (L1: write availability).
    WriteProbe {
        topic: String,
        partition: u32,
        value: String,
        offset: Option<u64>,
        error: Option<String>,
    },
    /// An operator's change of the cluster (add, move, drain, remove and
    /// shut down brokers; delete and create topics) and how it went.
    Operator {
        op: String,
        detail: String,
        outcome: String,
    },
    /// The operator deleted `group` (after it acknowledged `acked` times and
    /// left): `positions` were forgotten, and `kept` names the partitions
    /// that still held a position for it afterwards (G4: none may).
    GroupDeleted {
        group: String,
        acked: u32,
        positions: u32,
        kept: Vec<String>,
    },
    /// The hostile client's poll as a member of a generation a partition
    /// leader's metadata still holds although the group has moved on (the
    /// leader restarted, or was cut off from the metadata's leader), served
    /// with `records`: G5 judges it as it judges a member's poll.
    ZombiePoll {
        group: String,
        member: String,
        generation: u64,
        topic: String,
        partition: u32,
        invoked_at_ms: u64,
        records: usize,
    },
    /// A request of the hostile client that must be refused, and whether it
    /// was (`accepted` with what it got back otherwise).
    Hostile {
        attack: String,
        accepted: Option<String>,
    },
    /// A partition's replicas at the end: the voters of its Raft group as
    /// its most advanced live replica sees them (a move the metadata made
    /// may not have finished), else the final metadata's placement.
    Placement {
        topic: String,
        partition: u32,
        replicas: Vec<u64>,
    },
    /// A node failed: a panic, or a fatal error.
    NodeFailure {
        broker: u64,
        reason: String,
    },
    /// `waited_ms` after `broker` crashed while leading `group` (its other
    /// replicas up, the network calm), the group's leader, if any.
    Failover {
        broker: u64,
        group: String,
        leader: Option<u64>,
        waited_ms: u64,
    },
    /// The liveness phase ran out of time.
    LivenessTimeout {
        missing: u64,
    },
}

/// How events name one incarnation of a topic: `name@id`. Every event
/// after the invocation of a produce names topics so (a topic deleted and
/// created again under the same name is another log, starting at 0); a
/// produce's invocation names the topic, its acknowledgement the id.
pub fn topic_key(topic: &str, topic_id: u64) -> String {
    if topic_id == 0 {
        topic.to_string()
    } else {
        format!("{topic}@{topic_id}")
    }
}

/// The consumer group every run has, reading every topic.
pub fn main_group() -> String {
    MAIN_GROUP.to_string()
}

pub const MAIN_GROUP: &str = "g";

/// The names of the groups the raw-entries lane fills a partition with (and
/// commits past its end with): it forgets them and makes them again, so
/// their positions may start over.
pub const FILL_GROUP_PREFIX: &str = "zz-raw-fill-";

/// An event with its simulated time since the run began.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Event {
    pub at_ms: u64,
    /// Who did it: `broker-N`, `producer-N`, `consumer-N`, `faults`, `driver`.
    pub process: String,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// The history being recorded; cheap to clone, shared by every simulated
/// process of one run.
#[derive(Clone, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    next_op: Arc<Mutex<u64>>,
}

impl Recorder {
    pub fn record(&self, at_ms: u64, process: &str, kind: EventKind) {
        self.events.lock().expect("history").push(Event { at_ms, process: process.to_string(), kind });
    }

    /// A fresh operation id.
    pub fn op(&self) -> u64 {
        let mut next = self.next_op.lock().expect("op counter");
        *next += 1;
        *next
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("history").clone()
    }
}

/// The history as JSON lines.
pub fn to_json_lines(events: &[Event]) -> String {
    events.iter().map(|e| serde_json::to_string(e).expect("events serialise") + "\n").collect()
}

/// Order-sensitive hash of the whole history, simulated times included.
pub fn trace_hash(events: &[Event]) -> u64 {
    let mut hasher = DefaultHasher::new();
    events.hash(&mut hasher);
    hasher.finish()
}
