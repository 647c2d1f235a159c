//! The metadata state machine keeps its state as rows (one per broker,
//! topic and group, and a head), and an apply writes only the rows it
//! changed. Whatever commands run, what a reopened state machine reads back
//! must be exactly the state in memory; so must a snapshot built from the
//! rows and installed on another node (which replaces every row).

use keel_core::assignor::AssignorKind;
use keel_core::metadata::{MetadataCommand, RetentionPolicy};
use keel_core::{BrokerId, Limits, PartitionIndex, TimestampMs};
use keel_server::raft::types::{Command, LogId, Request, TypeConfig};
use keel_server::storage::{GroupState, GroupStateMachine, NodeStore};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, RaftSnapshotBuilder};

const GROUP: &str = "metadata";

/// splitmix64: the test's only source of choices, from the seed.
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }

    fn name(&mut self, kind: &str, of: u64) -> String {
        format!("{kind}{}", self.below(of))
    }
}

/// A command from small pools of names, so that commands meet: topics are
/// created and deleted under groups that subscribe to them, brokers are
/// drained and removed, groups emptied and deleted. Many are rejected.
fn command(choices: &mut Choices) -> MetadataCommand {
    let broker = BrokerId(1 + choices.below(4));
    match choices.below(12) {
        0 | 1 => MetadataCommand::RegisterBroker {
            broker,
            address: format!("127.0.0.1:{}", 9000 + broker.0),
            internal_address: format!("127.0.0.1:{}", 9100 + broker.0),
        },
        2 => MetadataCommand::CreateTopic {
            topic: choices.name("t", 4),
            partitions: 1 + choices.below(4) as u32,
            replication_factor: 1 + choices.below(2) as u32,
            retention: RetentionPolicy::default(),
        },
        3 => MetadataCommand::DeleteTopic { topic: choices.name("t", 4) },
        4 => MetadataCommand::AlterTopic {
            topic: choices.name("t", 4),
            partitions: Some(1 + choices.below(6) as u32),
            retention: Some(RetentionPolicy { max_age_ms: Some(choices.below(1000)), max_bytes: None }),
        },
        5..=7 => MetadataCommand::JoinGroup {
            group: choices.name("g", 3),
            member: choices.name("m", 4),
            topics: (0..1 + choices.below(3)).map(|_| choices.name("t", 4)).collect(),
            session_timeout_ms: 10_000,
            assignor: Some(AssignorKind::StickyBalanced),
        },
        8 => MetadataCommand::LeaveGroup { group: choices.name("g", 3), member: choices.name("m", 4) },
        9 => MetadataCommand::ExpireMembers {
            group: choices.name("g", 3),
            members: vec![(choices.name("m", 4), choices.below(20))],
        },
        10 => match choices.below(4) {
            0 => MetadataCommand::DeleteGroup { group: choices.name("g", 3) },
            1 => MetadataCommand::DrainBroker { broker },
            2 => MetadataCommand::RemoveBroker { broker },
            _ => MetadataCommand::MoveReplicas {
                topic: choices.name("t", 4),
                partition: PartitionIndex(choices.below(3) as u32),
                replicas: vec![broker],
            },
        },
        _ => MetadataCommand::AllocateProducerId,
    }
}

fn entry(index: u64, command: MetadataCommand) -> Entry<TypeConfig> {
    let request = Request::new(TimestampMs(index), Command::Metadata(command));
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) }
}

fn open(store: &std::sync::Arc<NodeStore>) -> GroupStateMachine {
    GroupStateMachine::open(store.clone(), GROUP.into(), GroupStateMachine::initial_metadata(Limits::default()))
        .expect("open the metadata state machine")
}

fn state(machine: &GroupStateMachine) -> GroupState {
    machine.state().lock().expect("state").clone()
}

#[tokio::test]
async fn reopened_and_installed_metadata_equals_what_was_applied() {
    for seed in 0..8u64 {
        let mut choices = Choices(seed);
        let dir = tempfile::TempDir::new().unwrap();
        let store = NodeStore::open(dir.path()).unwrap();
        let mut machine = open(&store);
        let mut index = 0;
        let mut applied_commands = 0;
        for _batch in 0..60 {
            let entries: Vec<_> = (0..1 + choices.below(3))
                .map(|_| {
                    index += 1;
                    entry(index, command(&mut choices))
                })
                .collect();
            machine.apply(entries).await.unwrap();
            let reopened = open(&store);
            assert_eq!(state(&reopened), state(&machine), "seed {seed}: rows read back differ after entry {index}");
            assert_eq!(reopened.clone().applied_state().await.unwrap().0.map(|l| l.index), Some(index));
        }
        let GroupState::Metadata(metadata) = state(&machine) else { panic!("a metadata group") };
        applied_commands += metadata.command_counts().0;
        assert!(!metadata.topics().is_empty() && !metadata.brokers().is_empty(), "seed {seed}: {metadata:?}");
        assert!(applied_commands > 20, "seed {seed}: too few commands applied to test anything");

        // A snapshot of the rows, installed on another node over rows of
        // its own, replaces them all.
        let snapshot = machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let other_dir = tempfile::TempDir::new().unwrap();
        let other_store = NodeStore::open(other_dir.path()).unwrap();
        let mut other = open(&other_store);
        let mut other_choices = Choices(seed + 1000);
        let entries: Vec<_> = (1..=20).map(|i| entry(i, command(&mut other_choices))).collect();
        other.apply(entries).await.unwrap();
        let mut file = other.begin_receiving_snapshot().await.unwrap();
        let mut source = snapshot.snapshot;
        tokio::io::copy(&mut *source, &mut *file).await.unwrap();
        tokio::io::AsyncWriteExt::shutdown(&mut *file).await.unwrap();
        other.install_snapshot(&snapshot.meta, file).await.unwrap();
        assert_eq!(state(&other), state(&machine), "seed {seed}: installed snapshot differs");
        assert_eq!(state(&open(&other_store)), state(&machine), "seed {seed}: installed rows read back differ");
    }
}
