//! Fatal is fatal: after a storage failure the node reports itself broken
//! (and `keel serve` exits) instead of running on as a zombie.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_core::metadata::MetadataCommand;
use keel_server::clock::Clock;
use keel_server::group::GroupId;
use keel_server::node::{Node, NodeConfig};
use keel_server::raft::types::Command;
use keel_server::storage::crash_disk::CrashDisk;
use keel_server::storage::NodeStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_disk_makes_the_node_report_a_fatal_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let voters: BTreeMap<u64, String> = [(1, address.clone())].into_iter().collect();
    let disk = CrashDisk::new();
    let store = NodeStore::open_with_backend(disk.clone()).unwrap();
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

    disk.freeze();
    let failed = tokio::time::timeout(
        Duration::from_secs(10),
        node.propose(&GroupId::Metadata, Command::Metadata(MetadataCommand::AllocateProducerId)),
    )
    .await;
    assert!(!matches!(failed, Ok(Ok(_))), "a write on a failed disk must not succeed");
    let mut fatal = None;
    for _ in 0..200 {
        fatal = node.fatal_error();
        if fatal.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fatal.is_some(), "the node must report the storage failure");
    node.shutdown().await;
}
