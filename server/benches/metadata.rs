//! What one metadata apply costs on a large cluster: the real state
//! machine (`GroupStateMachine` over a `NodeStore` on disk) holding 10,000
//! partitions (RF 3) and 100 groups of 10 members, each subscribed to every
//! topic, with a reader holding the state as the node's request handlers do.
//!
//! Each case applies one command per batch and reports the median and
//! worst of its applies:
//! - a member joins one group in the state machine's core alone (the
//!   assignor, no row written), on a copy of the state;
//! - allocate a producer id (the command changes one counter);
//! - a member joins one group, then leaves (the group is reassigned);
//! - a broker registers again (one broker row).
//!
//! The build of the starting state is timed too (core only, no disk).
//!
//! Then what a request reads of that state, per request (the median of
//! rounds of many calls): routing a produce (topic, partition, replicas and
//! their addresses), a heartbeat through the coordinator's sessions, a
//! poll's check that the member owns the partition in the generation, and
//! the sessions' sync that follows every join.
//! Run with `cargo bench -p keel-server --bench metadata`.

#[allow(dead_code)] // of common, only `full_run` is used here
mod common;

use std::time::{Duration, Instant};

use keel_core::assignor::AssignorKind;
use keel_core::coordinator::GroupSessions;
use keel_core::metadata::{MetadataCommand, MetadataState, RetentionPolicy};
use keel_core::{
    BrokerId, Generation, GroupName, Limits, MemberId, MonotonicMs, PartitionIndex, TimestampMs, TopicName,
    TopicPartition,
};
use keel_server::raft::types::{Command, LogId, Request, Response, TypeConfig};
use keel_server::storage::{GroupState, GroupStateMachine, NodeStore};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload};

const TOPICS: u32 = 10;
const MEMBERS_PER_GROUP: u32 = 10;

fn apply_core(state: &mut MetadataState, command: MetadataCommand) {
    state.apply(TimestampMs(1), &command).unwrap_or_else(|e| panic!("{command:?}: {e}"));
}

/// 3 brokers, `TOPICS` topics of `partitions / TOPICS` partitions, `groups`
/// groups of `MEMBERS_PER_GROUP` members subscribed to every topic.
fn large_state(partitions: u32, groups: u32) -> MetadataState {
    let limits = Limits { groups_max: 1_000_000, ..Limits::default() };
    let mut state = MetadataState::new(limits);
    for broker in 1..=3 {
        apply_core(
            &mut state,
            MetadataCommand::RegisterBroker {
                broker: BrokerId(broker),
                address: format!("127.0.0.1:{}", 9000 + broker),
                internal_address: format!("127.0.0.1:{}", 9100 + broker),
            },
        );
    }
    let topics: Vec<String> = (0..TOPICS).map(|t| format!("topic-{t}")).collect();
    for topic in &topics {
        apply_core(
            &mut state,
            MetadataCommand::CreateTopic {
                topic: topic.clone(),
                partitions: partitions / TOPICS,
                replication_factor: 3,
                retention: RetentionPolicy::default(),
            },
        );
    }
    for group in 0..groups {
        for member in 0..MEMBERS_PER_GROUP {
            apply_core(&mut state, join(group, member, &topics));
        }
    }
    state
}

fn join(group: u32, member: u32, topics: &[String]) -> MetadataCommand {
    MetadataCommand::JoinGroup {
        group: format!("group-{group}"),
        member: format!("member-{member}"),
        topics: topics.to_vec(),
        session_timeout_ms: 10_000,
        assignor: Some(AssignorKind::StickyBalanced),
    }
}

struct Bench {
    machine: GroupStateMachine,
    next_index: u64,
    /// What the node's readers hold between applies.
    _reader: GroupState,
}

impl Bench {
    async fn apply(&mut self, command: MetadataCommand) -> Duration {
        self.next_index += 1;
        let request = Request::new(TimestampMs(2), Command::Metadata(command));
        let entry: Entry<TypeConfig> = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), self.next_index),
            payload: EntryPayload::Normal(request),
        };
        let begun = Instant::now();
        let responses = self.machine.apply([entry]).await.expect("apply");
        let took = begun.elapsed();
        assert!(matches!(&responses[0], Response::Metadata(Ok(_))), "{responses:?}");
        self._reader = self.machine.state().lock().expect("state").clone();
        took
    }
}

fn report(name: &str, took: &mut [Duration]) {
    took.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<44} median {:>9.3} ms   worst {:>9.3} ms   ({} applies)",
        ms(took[took.len() / 2]),
        ms(took[took.len() - 1]),
        took.len()
    );
}

fn main() {
    let full = common::full_run();
    let (partitions, groups, rounds) = if full { (10_000, 100, 21) } else { (100, 3, 3) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let begun = Instant::now();
        let state = large_state(partitions, groups);
        println!(
            "metadata of {partitions} partitions (RF 3) x {groups} groups of {MEMBERS_PER_GROUP} members built in {:.1} s",
            begun.elapsed().as_secs_f64()
        );
        // The state machine's share of a join (the assignor), without the
        // row written: each on a copy of the state (a persistent map's copy
        // is O(1)).
        let mut core_joins = Vec::new();
        let topic_names: Vec<String> = (0..TOPICS).map(|t| format!("topic-{t}")).collect();
        for round in 0..rounds {
            let mut copy = state.clone();
            let begun = Instant::now();
            apply_core(&mut copy, join(round % groups, MEMBERS_PER_GROUP, &topic_names));
            core_joins.push(begun.elapsed());
        }
        report("a member joins a group (core apply only)", &mut core_joins);
        let dir = tempfile::TempDir::new().unwrap();
        let store = NodeStore::open(dir.path()).unwrap();
        let initial = GroupState::Metadata(std::sync::Arc::new(state));
        let machine = GroupStateMachine::open(store, "metadata".into(), initial.clone()).unwrap();
        let mut bench = Bench { machine, next_index: 0, _reader: initial };
        let topics: Vec<String> = (0..TOPICS).map(|t| format!("topic-{t}")).collect();

        let mut took = Vec::new();
        for _ in 0..rounds {
            took.push(bench.apply(MetadataCommand::AllocateProducerId).await);
        }
        report("allocate a producer id", &mut took);

        let (mut joins, mut leaves) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let group = round % groups;
            joins.push(bench.apply(join(group, MEMBERS_PER_GROUP, &topics)).await);
            let leave =
                MetadataCommand::LeaveGroup { group: format!("group-{group}"), member: format!("member-{MEMBERS_PER_GROUP}") };
            leaves.push(bench.apply(leave).await);
        }
        report("a member joins a group (sticky)", &mut joins);
        report("a member leaves a group (sticky)", &mut leaves);

        let mut took = Vec::new();
        for _ in 0..rounds {
            let register = MetadataCommand::RegisterBroker {
                broker: BrokerId(2),
                address: "127.0.0.1:9002".into(),
                internal_address: "127.0.0.1:9102".into(),
            };
            took.push(bench.apply(register).await);
        }
        report("a broker registers again", &mut took);

        let GroupState::Metadata(state) = bench.machine.state().lock().expect("state").clone() else {
            unreachable!("the bench runs the metadata state machine")
        };
        requests(&state, partitions, groups, rounds);
    });
}

/// Calls per round of a per-request measurement.
const CALLS_PER_ROUND: u32 = 10_000;

/// Time `CALLS_PER_ROUND` calls of `call`, `rounds` times, and report the
/// cost of one call.
fn per_call(name: &str, rounds: u32, mut call: impl FnMut(u32) -> usize) {
    let mut took = Vec::new();
    let mut touched = 0usize;
    for _ in 0..rounds {
        let begun = Instant::now();
        for i in 0..CALLS_PER_ROUND {
            touched = touched.wrapping_add(call(i));
        }
        took.push(begun.elapsed() / CALLS_PER_ROUND);
    }
    took.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{name:<44} median {:>9.3} us   worst {:>9.3} us   per request ({rounds} rounds of {CALLS_PER_ROUND}; {touched})",
        us(took[took.len() / 2]),
        us(took[took.len() - 1]),
    );
}

/// What the request handlers read of the metadata, per request.
fn requests(state: &std::sync::Arc<MetadataState>, partitions: u32, groups: u32, rounds: u32) {
    let per_topic = partitions / TOPICS;
    let topics: Vec<TopicName> = (0..TOPICS).map(|t| TopicName::new(format!("topic-{t}")).unwrap()).collect();
    let group_names: Vec<GroupName> = (0..groups).map(|g| GroupName::new(format!("group-{g}")).unwrap()).collect();
    let members: Vec<MemberId> =
        (0..MEMBERS_PER_GROUP).map(|m| MemberId::new(format!("member-{m}")).unwrap()).collect();

    // A produce: the handler takes the state (an `Arc`), finds the topic and
    // the partition, and (when not hosted here) names the replicas.
    per_call("a produce's routing", rounds, |i| {
        let metadata = std::sync::Arc::clone(state);
        let topic = metadata.topic(&topics[(i % TOPICS) as usize]).expect("topic");
        let partition = &topic.partitions[(i % per_topic) as usize];
        partition.replicas.iter().filter_map(|b| metadata.brokers().get(b)).map(|b| b.address.len()).sum()
    });

    let mut sessions = GroupSessions::new();
    sessions.grant_fresh_sessions(state, MonotonicMs(0));
    per_call("a heartbeat (coordinator sessions)", rounds, |i| {
        let group = &group_names[(i % groups) as usize];
        let member = &members[(i % MEMBERS_PER_GROUP) as usize];
        let generation = state.group(group).expect("group").generation;
        let epoch = state.group(group).and_then(|g| g.members.get(member)).expect("member").member_epoch;
        let reply = sessions.heartbeat(state, group, member, epoch, generation, MonotonicMs(u64::from(i)));
        usize::from(reply.is_ok())
    });

    // A poll: the member must own the partition in the group's generation.
    per_call("a poll's ownership check", rounds, |i| {
        let metadata = std::sync::Arc::clone(state);
        let group = metadata.group(&group_names[(i % groups) as usize]).expect("group");
        let partition = TopicPartition::new(topics[(i % TOPICS) as usize].clone(), PartitionIndex(i % per_topic));
        let owner = group.assignment.owner(&partition);
        usize::from(owner.is_some() && group.generation != Generation(0))
    });

    per_call("the sessions' sync after a join", rounds.min(3), |i| {
        sessions.sync(state, MonotonicMs(u64::from(i)));
        1
    });
}
