//! Several brokers in one process on loopback, each with its own data
//! directory: for tests and benchmarks on real tokio and real sockets.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::group::GroupId;
use crate::node::{default_internal_address, Node, NodeConfig, ProposeError, StartError};
use crate::raft::types::{Command, NodeId, Response};
use crate::storage::NodeStore;

/// Brokers `1..=n` on loopback; a slot is `None` while its broker is down.
pub struct LocalCluster {
    dirs: Vec<PathBuf>,
    /// Client addresses; each broker's internal one is port + 100.
    addresses: BTreeMap<NodeId, String>,
    /// The metadata voters by internal address.
    voters: BTreeMap<NodeId, String>,
    adjust: fn(&mut NodeConfig),
    pub nodes: Vec<Option<Node>>,
}

/// Why a cluster operation gave up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("could not start broker {id}: {source}")]
    Start { id: NodeId, source: Box<StartError> },
    #[error("could not find a free loopback port: {0}")]
    Port(std::io::Error),
    #[error("gave up after {0:?}: {1}")]
    Timeout(Duration, String),
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

/// A loopback client port no other cluster of this process was given, with
/// its internal port (+ 100) free too. Ports from `bind(0)` are released
/// before the broker binds them, so two clusters started at once could both
/// be handed the same one and talk to each other's brokers; a process-wide
/// counter rules that out. Client ports come in blocks of 100 with a block
/// left free above each, for the internal ports.
fn free_port() -> Result<u16, ClusterError> {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 100) as u16 * 200;
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..10_000 {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        if !(20_000..65_000).contains(&port) || (port - 20_000) / 100 % 2 == 1 {
            continue;
        }
        let bindable = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if bindable(port) && bindable(port + 100) {
            return Ok(port);
        }
    }
    Err(ClusterError::Port(std::io::Error::other("no free loopback port")))
}

impl LocalCluster {
    /// Start `n` brokers with data under `root`; `adjust` changes each
    /// broker's config before it starts.
    pub async fn start(root: PathBuf, n: u64, adjust: fn(&mut NodeConfig)) -> Result<LocalCluster, ClusterError> {
        let mut addresses = BTreeMap::new();
        for id in 1..=n {
            addresses.insert(id, format!("127.0.0.1:{}", free_port()?));
        }
        let voters = addresses
            .iter()
            .map(|(id, a)| (*id, default_internal_address(a).expect("a loopback port below 65436")))
            .collect();
        let dirs = (1..=n).map(|id| root.join(format!("broker-{id}"))).collect();
        let mut cluster = LocalCluster { dirs, addresses, voters, adjust, nodes: (1..=n).map(|_| None).collect() };
        for id in 1..=n {
            cluster.restart(id).await?;
        }
        Ok(cluster)
    }

    /// Start broker `id` (again) from its data directory.
    pub async fn restart(&mut self, id: NodeId) -> Result<Node, ClusterError> {
        let address = self.addresses[&id].clone();
        let listen = address.parse().expect("loopback address");
        let mut config = NodeConfig::new(id, listen, address, self.voters.clone());
        (self.adjust)(&mut config);
        let slot = id as usize - 1;
        let store =
            NodeStore::open(&self.dirs[slot]).map_err(|e| ClusterError::Start { id, source: Box::new(e.into()) })?;
        let node = Node::start(config, store, Clock::system())
            .await
            .map_err(|e| ClusterError::Start { id, source: Box::new(e) })?;
        self.nodes[slot] = Some(node.clone());
        Ok(node)
    }

    /// Stop broker `id`.
    pub async fn stop(&mut self, id: NodeId) {
        if let Some(node) = self.nodes[id as usize - 1].take() {
            node.shutdown().await;
        }
    }

    /// Broker `id`, if it is up.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes[id as usize - 1].as_ref()
    }

    /// The live brokers.
    pub fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().flatten()
    }

    /// Propose on whichever live broker leads `group`, retrying through
    /// elections for up to `deadline`.
    pub async fn propose(
        &self,
        group: &GroupId,
        command: Command,
        deadline: Duration,
    ) -> Result<Response, ClusterError> {
        let started = tokio::time::Instant::now();
        loop {
            for node in self.live() {
                match node.propose(group, command.clone()).await {
                    Ok(response) => return Ok(response),
                    // A lost lead leaves the outcome open: tests propose
                    // idempotent commands, so trying again is safe.
                    Err(
                        ProposeError::NotLeader { .. }
                        | ProposeError::GroupNotHere { .. }
                        | ProposeError::LeadershipLost { .. },
                    ) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            if started.elapsed() > deadline {
                return Err(ClusterError::Timeout(deadline, format!("no leader for {group}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until `check` holds, for up to `deadline`.
    pub async fn eventually(
        &self,
        what: &str,
        deadline: Duration,
        check: impl Fn(&LocalCluster) -> bool,
    ) -> Result<(), ClusterError> {
        let started = tokio::time::Instant::now();
        while !check(self) {
            if started.elapsed() > deadline {
                return Err(ClusterError::Timeout(deadline, what.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Stop every broker.
    pub async fn shutdown(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            self.stop(id).await;
        }
    }
}
