//! Fatal is fatal: after a storage failure, or a Raft group whose core
//! panicked, the node reports itself broken (and `keel serve` exits)
//! instead of running on as a zombie.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_core::metadata::MetadataCommand;
use keel_server::clock::Clock;
use keel_server::group::GroupId;
use keel_server::node::{Node, NodeConfig};
use keel_server::raft::types::Command;
use keel_server::storage::crash_disk::NodeDisk;
use keel_server::storage::NodeStore;

/// The node's fatal error, if it reports one within 4 s.
async fn fatal_within(node: &Node) -> Option<String> {
    for _ in 0..200 {
        if let Some(fatal) = node.fatal_error() {
            return Some(fatal);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A port for a node's client listener, whose internal one (+100) is free
/// too, below Linux's ephemeral range (32768-60999): a port from `bind(0)`
/// is released before the node binds it, and an outgoing connection of the
/// other test could take it meanwhile. Distinct per call in this process.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 50) as u16 * 100;
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(port < 32_000, "ran out of test ports");
        let bindable = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if bindable(port) && bindable(port + 100) {
            return port;
        }
    }
}

/// A one-broker node on a simulated disk, once it takes writes.
async fn started(disk: &NodeDisk) -> Node {
    let address = format!("127.0.0.1:{}", free_port());
    let internal = keel_server::node::default_internal_address(&address).unwrap();
    let voters: BTreeMap<u64, String> = [(1, internal)].into_iter().collect();
    let store = NodeStore::open_on_disk(disk, 64 * 1024).unwrap();
    let node = Node::start(NodeConfig::new(1, address.parse().unwrap(), address, voters), store, Clock::system())
        .await
        .unwrap();
    for _ in 0..200 {
        if node.propose(&GroupId::Metadata, Command::Metadata(MetadataCommand::AllocateProducerId)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(node.fatal_error(), None, "a healthy node is not fatal");
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_disk_makes_the_node_report_a_fatal_error() {
    let disk = NodeDisk::new();
    let node = started(&disk).await;

    disk.freeze();
    let failed = tokio::time::timeout(
        Duration::from_secs(10),
        node.propose(&GroupId::Metadata, Command::Metadata(MetadataCommand::AllocateProducerId)),
    )
    .await;
    assert!(!matches!(failed, Ok(Ok(_))), "a write on a failed disk must not succeed");
    assert!(fatal_within(&node).await.is_some(), "the node must report the storage failure");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_group_whose_core_panicked_is_fatal() {
    let node = started(&NodeDisk::new()).await;
    // The vote the transport now refuses as insane (a term openraft's engine
    // cannot take), handed to openraft directly: its core panics.
    let raft = node.raft(&GroupId::Metadata).unwrap();
    // Its last log id is ahead of anything real, so the vote is granted
    // once the leader's lease has run out.
    let last = openraft::LogId::new(openraft::CommittedLeaderId::new(u64::MAX, 9), u64::MAX / 2);
    let forged = openraft::raft::VoteRequest::new(openraft::Vote::new(u64::MAX, 9), Some(last));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), raft.vote(forged)).await;
    let fatal = fatal_within(&node).await.expect("a panicked Raft core must be reported");
    assert!(fatal.contains("metadata"), "{fatal}");
    node.shutdown().await;
}
