//! The broker node's own code under madsim: three simulated hosts on the
//! crash-simulating disk elect, commit, lose a broker (power cut, then
//! restart from what its disk kept) and keep committing. The same seed run
//! twice gives the same trace hash.

#![cfg(madsim)]

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::metadata::{MetadataCommand, RetentionPolicy};
use keel_core::partition::{PartitionCommand, ProducerBatch};
use keel_core::record::Record;
use keel_core::{Offset, PartitionIndex, ProducerId, Sequence, TopicName, TopicPartition};
use keel_server::clock::Clock;
use keel_server::group::GroupId;
use keel_server::node::{MembershipError, Node, NodeConfig, ProposeError};
use keel_server::raft::network::JoinRefusal;
use keel_server::raft::types::{Command, Response};
use keel_server::storage::crash_disk::NodeDisk;
use keel_server::storage::NodeStore;
use madsim::runtime::{Handle, Runtime};

/// One simulated broker: its disk survives restarts; its running node is
/// published for the test driver.
#[derive(Clone)]
struct Broker {
    disk: Arc<Mutex<NodeDisk>>,
    node: Arc<Mutex<Option<Node>>>,
}

fn address(id: u64) -> SocketAddr {
    format!("10.0.0.{id}:7000").parse().unwrap()
}

/// Broker `id`'s internal (Raft) address.
fn internal(id: u64) -> String {
    keel_server::node::default_internal_address(&address(id).to_string()).unwrap()
}

/// Order-sensitive hash of everything the driver observed, with simulated
/// timestamps.
struct Trace {
    hasher: DefaultHasher,
    start: madsim::time::Instant,
}

impl Trace {
    fn new() -> Self {
        Trace { hasher: DefaultHasher::new(), start: madsim::time::Instant::now() }
    }

    fn record(&mut self, event: impl Hash) {
        self.start.elapsed().as_nanos().hash(&mut self.hasher);
        event.hash(&mut self.hasher);
    }

    fn finish(&self) -> u64 {
        self.hasher.finish()
    }
}

async fn propose(brokers: &[Broker], group: &GroupId, command: Command) -> Response {
    for _attempt in 0..2_000 {
        let nodes: Vec<Node> = brokers.iter().filter_map(|b| b.node.lock().unwrap().clone()).collect();
        for node in nodes {
            match node.propose(group, command.clone()).await {
                Ok(response) => return response,
                Err(ProposeError::NotLeader { .. } | ProposeError::GroupNotHere { .. }) => {}
                Err(error) => panic!("{error}"),
            }
        }
        madsim::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader for {group}");
}

/// Three brokers on crash-simulating disks, each on a host of its own.
fn start_brokers(handle: &Handle) -> (Vec<Broker>, Vec<madsim::task::NodeId>) {
    let voters: BTreeMap<u64, String> = (1..=3).map(|id| (id, internal(id))).collect();
    let mut brokers = Vec::new();
    let mut node_ids = Vec::new();
    for id in 1..=3u64 {
        let broker = Broker { disk: Arc::new(Mutex::new(NodeDisk::new())), node: Arc::new(Mutex::new(None)) };
        let (init_broker, voters) = (broker.clone(), voters.clone());
        let node = handle
            .create_node()
            .name(format!("broker-{id}"))
            .ip(address(id).ip())
            .init(move || {
                let (broker, voters) = (init_broker.clone(), voters.clone());
                async move {
                    let disk = broker.disk.lock().unwrap().clone();
                    let store = NodeStore::open_on_disk(&disk, 256 * 1024).expect("store opens");
                    let config = NodeConfig::new(id, address(id), address(id).to_string(), voters);
                    let node = Node::start(config, store, Clock::system()).await.expect("node starts");
                    *broker.node.lock().unwrap() = Some(node);
                    std::future::pending::<()>().await;
                }
            })
            .build();
        node_ids.push(node.id());
        brokers.push(broker);
    }

    (brokers, node_ids)
}

/// Three brokers started, topic `orders` created and `count` records
/// appended to it (each acknowledged); the brokers, hosts and its group.
async fn orders_written(handle: &Handle, count: u64) -> (Vec<Broker>, Vec<madsim::task::NodeId>, GroupId) {
    let (brokers, hosts) = start_brokers(handle);
    let (_, group) = create_orders(&brokers).await;
    for sequence in 0..count {
        propose(&brokers, &group, append(sequence)).await;
    }
    (brokers, hosts, group)
}

/// Run `scenario` in a fresh simulation for each seed.
fn on_seeds<F: std::future::Future<Output = ()>>(seeds: &[u64], scenario: impl Fn(u64) -> F) {
    for &seed in seeds {
        Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(scenario(seed));
    }
}

/// The nodes of the brokers running now.
fn running_nodes(brokers: &[Broker]) -> Vec<Node> {
    brokers.iter().filter_map(|b| b.node.lock().unwrap().clone()).collect()
}

/// A power cut on `broker`: its disk is frozen (madsim's kill runs
/// destructors, which would otherwise close redb cleanly) and keeps only
/// what it kept, and the host is killed.
fn power_cut(handle: &Handle, broker: &Broker, host: madsim::task::NodeId) {
    let crashed = {
        let disk = broker.disk.lock().unwrap();
        disk.freeze();
        disk.crash(madsim::rand::random())
    };
    handle.kill(host);
    *broker.node.lock().unwrap() = None;
    *broker.disk.lock().unwrap() = crashed;
}

/// Create topic `orders` (one partition, replication factor 3) once all
/// three brokers are registered; its Raft group.
async fn create_orders(brokers: &[Broker]) -> (Response, GroupId) {
    let create = MetadataCommand::CreateTopic {
        topic: "orders".into(),
        partitions: 1,
        replication_factor: 3,
        retention: RetentionPolicy::default(),
    };
    loop {
        let registered = brokers[0].node.lock().unwrap().as_ref().map_or(0, |n| n.metadata().brokers().len());
        if registered == 3 {
            break;
        }
        madsim::time::sleep(Duration::from_millis(100)).await;
    }
    let created = propose(brokers, &GroupId::Metadata, Command::Metadata(create)).await;
    let group = loop {
        let known = brokers[1].node.lock().unwrap().as_ref().and_then(|n| n.partition_group(&orders()));
        if let Some(group) = known {
            break group;
        }
        madsim::time::sleep(Duration::from_millis(50)).await;
    };
    (created, group)
}

fn orders() -> TopicPartition {
    TopicPartition::new(TopicName::new("orders").unwrap(), PartitionIndex(0))
}

fn append(sequence: u64) -> Command {
    Command::Partition(PartitionCommand::Append {
        producer: Some(ProducerBatch { producer: ProducerId(1), sequence: Sequence(sequence) }),
        records: vec![Record::from_value(format!("record-{sequence}").into_bytes())],
    })
}

async fn scenario() -> u64 {
    let handle = Handle::current();
    let (brokers, node_ids) = start_brokers(&handle);
    let mut trace = Trace::new();
    let (created, group) = create_orders(&brokers).await;
    trace.record(format!("{created:?}"));
    let partition = orders();
    for sequence in 0..10 {
        trace.record(format!("{:?}", propose(&brokers, &group, append(sequence)).await));
    }

    // Power cut on broker 1.
    power_cut(&handle, &brokers[0], node_ids[0]);
    for sequence in 10..20 {
        trace.record(format!("{:?}", propose(&brokers, &group, append(sequence)).await));
    }

    handle.restart(node_ids[0]);
    for _ in 0..600 {
        let caught_up = brokers[0]
            .node
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|n| n.partition(&partition))
            .is_some_and(|p| p.high_watermark() == Offset(20));
        if caught_up {
            break;
        }
        madsim::time::sleep(Duration::from_millis(50)).await;
    }
    let restarted = brokers[0].node.lock().unwrap().clone().expect("broker 1 restarted");
    let high_watermark = restarted.partition(&partition).map(|p| p.high_watermark());
    assert_eq!(high_watermark, Some(Offset(20)), "the restarted broker caught up");
    trace.record(high_watermark);
    eprintln!("simulated {:?}", trace.start.elapsed());
    trace.finish()
}

fn run(seed: u64) -> u64 {
    let runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
    runtime.block_on(scenario())
}

#[test]
fn three_brokers_commit_through_a_power_cut_and_replay_exactly() {
    for seed in [1, 2, 3] {
        let first = run(seed);
        let second = run(seed);
        assert_eq!(first, second, "seed {seed} did not replay to the same trace");
    }
}

/// A partition leader that loses power and comes back before anyone else
/// stands, with a committed index read back stale: a read after the read
/// index of whichever broker then leads must see every record acknowledged
/// before the cut (sim seed 300001775: a leader that resumed its term took
/// its read index from the stale committed index, and a reset "to latest"
/// moved a group position back past an acknowledged commit). A restarted
/// leader no longer resumes its term (`LogStore::of_node`): it stands for
/// election in a new one, and its blank entry commits everything before.
#[test]
fn a_leader_restarted_in_its_term_reads_everything_it_answered() {
    let runtime = Runtime::with_seed_and_config(1, madsim::Config::default());
    runtime.block_on(async {
        let handle = Handle::current();
        let (brokers, hosts) = start_brokers(&handle);
        let (_, group) = create_orders(&brokers).await;
        for sequence in 0..10 {
            propose(&brokers, &group, append(sequence)).await;
        }
        let leader = loop {
            let mut led = None;
            for (index, broker) in brokers.iter().enumerate() {
                let Some(node) = broker.node.lock().unwrap().clone() else { continue };
                if node.raft(&group).unwrap().current_leader().await == Some(node.id()) {
                    led = Some(index);
                }
            }
            if let Some(index) = led {
                break index;
            }
            madsim::time::sleep(Duration::from_millis(10)).await;
        };
        power_cut(&handle, &brokers[leader], hosts[leader]);
        handle.restart(hosts[leader]);
        // The group runs once the broker's metadata names it again: the
        // metadata it applied may be replayed only after the cut (a
        // broker's applied state is not synced; its log is).
        let (node, raft) = loop {
            if let Some(node) = brokers[leader].node.lock().unwrap().clone() {
                if let Some(raft) = node.raft(&group) {
                    break (node, raft);
                }
            }
            madsim::time::sleep(Duration::from_millis(1)).await;
        };
        assert!(
            raft.current_leader().await != Some(node.id()),
            "broker {} resumed its term: a leader that replicates before its own flush must not",
            node.id()
        );
        // Whichever broker leads next answers a read after its read index.
        let (node, raft) = loop {
            let mut ready = None;
            for broker in &brokers {
                let Some(node) = broker.node.lock().unwrap().clone() else { continue };
                let raft = node.raft(&group).unwrap();
                if raft.current_leader().await == Some(node.id()) && raft.ensure_linearizable().await.is_ok() {
                    ready = Some((node, raft));
                }
            }
            if let Some(ready) = ready {
                break ready;
            }
            madsim::time::sleep(Duration::from_millis(10)).await;
        };
        drop(raft);
        let high_watermark = node.partition(&orders()).map(|p| p.high_watermark());
        assert_eq!(high_watermark, Some(Offset(10)), "a read after the read index missed acknowledged records");
    });
}

/// A simulated broker takes thousands of calls a second, as a real one
/// does: every simulated call is a connection of its own, and madsim's
/// accept takes at least 1 ms, so a server with one accept loop answered
/// at most 1,000 calls a second; past that, calls waited for their accept
/// longer than the 75 ms Raft limit, were retried and never caught up (sim
/// seed 230001136: a broker restarted under 100 partition leaders).
#[test]
fn a_simulated_broker_accepts_thousands_of_calls_a_second() {
    const CALLS: usize = 2_000;
    let runtime = Runtime::with_seed_and_config(7, madsim::Config::default());
    runtime.block_on(async {
        let handle = Handle::current();
        let voters: BTreeMap<u64, String> = [(1, internal(1))].into();
        let node: Arc<Mutex<Option<Node>>> = Arc::new(Mutex::new(None));
        let published = node.clone();
        handle
            .create_node()
            .name("broker-1")
            .ip(address(1).ip())
            .init(move || {
                let (node, voters) = (published.clone(), voters.clone());
                async move {
                    let store = NodeStore::open_on_disk(&NodeDisk::new(), 256 * 1024).expect("store opens");
                    let config = NodeConfig::new(1, address(1), address(1).to_string(), voters);
                    *node.lock().unwrap() = Some(Node::start(config, store, Clock::system()).await.expect("starts"));
                    std::future::pending::<()>().await;
                }
            })
            .build();
        let client_host = handle.create_node().name("client").ip("10.0.1.1".parse().unwrap()).build();
        let answered = client_host
            .spawn(async move {
                let policy = keel_client::RetryPolicy { jitter_seed: Some(1), ..Default::default() };
                let client = keel_client::Client::new(vec![address(1).to_string()], policy).unwrap();
                // Up and registered before the burst.
                while !client.describe_cluster().await.is_ok_and(|c| c.brokers.len() == 1) {
                    madsim::time::sleep(Duration::from_millis(100)).await;
                }
                let started = madsim::time::Instant::now();
                let calls: Vec<_> = (0..CALLS)
                    .map(|_| {
                        let client = client.clone();
                        madsim::task::spawn(async move { client.describe_cluster().await.map(|_| started.elapsed()) })
                    })
                    .collect();
                let mut slowest = Duration::ZERO;
                for call in calls {
                    slowest = slowest.max(call.await.unwrap().expect("answered"));
                }
                slowest
            })
            .await
            .unwrap();
        // 2,000 accepts one after another would take at least 2 s.
        assert!(answered < Duration::from_millis(500), "the last of {CALLS} calls was answered after {answered:?}");
    });
}

/// A broker whose own log names it only as a learner, by an entry that
/// never committed, joins as a new broker; it is not refused as removed.
/// The metadata leader adds broker 4 as a learner while cut off from the
/// other voters, broker 4 stores the entry, and the leader dies; the new
/// leader never heard of it (sim seed 220008084: a power cut in the middle
/// of the join, and the broker was turned away for good).
#[test]
fn a_broker_whose_learner_entry_was_lost_joins_again() {
    let joined = learner_entry_lost(false);
    assert!(joined.is_ok(), "broker 4 was turned away: {joined:?}");
}

/// The same broker, removed by the operator before it joins again (its
/// registration gone), is refused as removed: a join that races the
/// removal does not add it back (sim seed 280003187).
#[test]
fn a_removed_broker_whose_learner_entry_was_lost_stays_out() {
    let joined = learner_entry_lost(true);
    let refused = matches!(&joined, Err(JoinRefusal::Refused(reason)) if reason.contains("was removed"));
    assert!(refused, "broker 4 was not refused as removed: {joined:?}");
}

/// A broker's node, set once its host has started it.
type NodeSlot = Arc<Mutex<Option<Node>>>;

/// Brokers 1-3 voting in the metadata group and broker 4 started as
/// `keel serve --join` starts it (no voters of its own), each on its host:
/// their nodes and hosts.
fn four_brokers_one_joining(handle: &Handle) -> (Vec<NodeSlot>, Vec<madsim::task::NodeId>) {
    let voters: BTreeMap<u64, String> = (1..=3).map(|id| (id, internal(id))).collect();
    let mut nodes: Vec<NodeSlot> = Vec::new();
    let mut hosts = Vec::new();
    for id in 1..=4u64 {
        let slot: NodeSlot = Arc::new(Mutex::new(None));
        let (published, voters) = (slot.clone(), voters.clone());
        let host = handle
            .create_node()
            .name(format!("broker-{id}"))
            .ip(address(id).ip())
            .init(move || {
                let (slot, voters) = (published.clone(), voters.clone());
                async move {
                    let store = NodeStore::open_on_disk(&NodeDisk::new(), 256 * 1024).expect("store opens");
                    // Broker 4 starts as `keel serve --join` does: no voters of its own.
                    let mut config = if id == 4 {
                        NodeConfig::new(id, address(id), address(id).to_string(), BTreeMap::new())
                    } else {
                        NodeConfig::new(id, address(id), address(id).to_string(), voters.clone())
                    };
                    config.cluster_id = keel_server::node::cluster_id_of(&voters);
                    *slot.lock().unwrap() = Some(Node::start(config, store, Clock::system()).await.expect("starts"));
                    std::future::pending::<()>().await;
                }
            })
            .build();
        nodes.push(slot);
        hosts.push(host.id());
    }
    (nodes, hosts)
}

/// `joiner` asks to join the cluster through broker `through`, from its
/// own host (the test's task has no address).
fn join_from(
    handle: &Handle,
    host: madsim::task::NodeId,
    joiner: Node,
    through: u64,
) -> madsim::task::JoinHandle<Result<(), JoinRefusal>> {
    handle.get_node(host).expect("the joiner's host").spawn(async move { joiner.join_cluster(internal(through)).await })
}

/// The metadata group's leader as `observer` knows it, once it knows one.
async fn metadata_leader(observer: &Node) -> u64 {
    loop {
        if let Some(leader) = observer.raft(&GroupId::Metadata).and_then(|r| r.metrics().borrow().current_leader) {
            return leader;
        }
        madsim::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Four brokers on `handle`, the fourth not yet a member, two simulated
/// seconds in: their slots, their hosts, and the metadata leader.
async fn four_brokers_two_seconds_in(handle: &Handle) -> (Vec<NodeSlot>, Vec<madsim::task::NodeId>, u64) {
    let (nodes, hosts) = four_brokers_one_joining(handle);
    madsim::time::sleep(Duration::from_secs(2)).await;
    let leader = metadata_leader(&started(&nodes, 1)).await;
    (nodes, hosts, leader)
}

/// Broker `id`'s node, once started.
fn started(nodes: &[NodeSlot], id: u64) -> Node {
    nodes[id as usize - 1].lock().unwrap().clone().expect("the broker started")
}

fn learner_entry_lost(removed_first: bool) -> Result<(), JoinRefusal> {
    let runtime = Runtime::with_seed_and_config(11, madsim::Config::default());
    runtime.block_on(async {
        let handle = Handle::current();
        let (nodes, hosts, leader) = four_brokers_two_seconds_in(&handle).await;
        let node = |id: u64| started(&nodes, id);
        // Broker 4 registered (committed), then its learner entry appended
        // on a leader cut off from the other voters.
        let register = MetadataCommand::RegisterBroker {
            broker: keel_core::BrokerId(4),
            address: address(4).to_string(),
            internal_address: internal(4),
        };
        node(leader).propose(&GroupId::Metadata, Command::Metadata(register)).await.expect("registered");
        let net = madsim::net::NetSim::current();
        for other in (1..=3u64).filter(|id| *id != leader) {
            net.clog_link(hosts[leader as usize - 1], hosts[other as usize - 1]);
            net.clog_link(hosts[other as usize - 1], hosts[leader as usize - 1]);
        }
        let raft = node(leader).raft(&GroupId::Metadata).unwrap();
        let learner = openraft::BasicNode { addr: internal(4) };
        madsim::task::spawn(async move {
            let _ = raft.add_learner(4, learner, false).await;
        });
        let mut stored = false;
        for _ in 0..100 {
            stored = node(4).raft(&GroupId::Metadata).is_some_and(|r| {
                r.metrics().borrow().membership_config.membership().learner_ids().any(|learner| learner == 4)
            });
            if stored {
                break;
            }
            madsim::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(stored, "broker 4 stored its learner entry");
        // The leader dies; the others elect a leader without the entry.
        handle.kill(hosts[leader as usize - 1]);
        let through = (1..=3u64).find(|id| *id != leader).unwrap();
        if removed_first {
            // The operator removes it (its registration; no membership names
            // it), through whichever survivor leads once one does.
            let remove = Command::Metadata(MetadataCommand::RemoveBroker { broker: keel_core::BrokerId(4) });
            'removed: for _ in 0..100 {
                for id in (1..=3u64).filter(|id| *id != leader) {
                    if let Ok(Response::Metadata(result)) = node(id).propose(&GroupId::Metadata, remove.clone()).await {
                        assert!(result.is_ok(), "{result:?}");
                        break 'removed;
                    }
                }
                madsim::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let joined = join_from(&handle, hosts[3], node(4), through).await.unwrap();
        if joined.is_ok() {
            let members = node(through).raft(&GroupId::Metadata).unwrap().metrics().borrow().membership_config.clone();
            assert!(members.membership().voter_ids().any(|voter| voter == 4), "broker 4 votes: {members:?}");
        }
        joined
    })
}

/// A broker whose join got far enough to register it and add it as a
/// learner, and whose answer was lost (it is cut off until its attempt
/// times out), retries; meanwhile the operator removed it. The retry must
/// not add it back: it says it was a member (it holds the metadata log;
/// asked anew at each attempt), and the leader refuses it as removed.
/// Sim seed 9100049 (all faults, on 8ec06d0): the retry, 3 ms after the
/// removal, still said "new broker", registered broker 4 again, and a topic
/// created later placed replicas on it after it had shut down for good.
/// With the question asked once, as before, broker 4 is registered again.
#[test]
fn a_join_retried_after_its_broker_was_removed_is_refused() {
    let runtime = Runtime::with_seed_and_config(12, madsim::Config::default());
    runtime.block_on(async {
        let handle = Handle::current();
        let (nodes, hosts, leader) = four_brokers_two_seconds_in(&handle).await;
        let node = |id: u64| started(&nodes, id);
        let join = join_from(&handle, hosts[3], node(4), leader);
        // Broker 4 has applied its registration and stored its learner
        // entry: cut it off, so that the join's answer is lost.
        let mut added = false;
        for _ in 0..500 {
            let four = node(4);
            let registered = four.metadata().brokers().contains_key(&keel_core::BrokerId(4));
            let learner = four
                .raft(&GroupId::Metadata)
                .is_some_and(|r| r.metrics().borrow().membership_config.membership().get_node(&4).is_some());
            if registered && learner {
                added = true;
                break;
            }
            madsim::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(added, "broker 4 was never registered and added as a learner");
        let net = madsim::net::NetSim::current();
        for other in 0..3 {
            net.clog_link(hosts[3], hosts[other]);
            net.clog_link(hosts[other], hosts[3]);
        }
        // The operator removes it while its join retries.
        let mut removed = Err(MembershipError::LastBroker { broker: 0 });
        for _ in 0..100 {
            removed = node(leader).remove_broker(4).await;
            if removed.is_ok() {
                break;
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
        removed.expect("broker 4 removed");
        // The join's first attempt times out (after `CATCH_UP_TIMEOUT` + 5 s,
        // 13 s) while broker 4 is cut off, and it retries.
        madsim::time::sleep(Duration::from_secs(14)).await;
        for other in 0..3 {
            net.unclog_link(hosts[3], hosts[other]);
            net.unclog_link(hosts[other], hosts[3]);
        }
        let joined = join.await.unwrap();
        let registered = node(leader).metadata().brokers().contains_key(&keel_core::BrokerId(4));
        let refused = matches!(&joined, Err(JoinRefusal::Refused(reason)) if reason.contains("was removed"));
        assert!(refused, "broker 4's retried join was not refused as removed: {joined:?}");
        assert!(!registered, "broker 4 is registered again after its removal");
    })
}

/// A removal cut short after its membership change (its caller went away,
/// or the metadata leader lost the lead) leaves the broker registered but
/// out of the membership, as a joiner whose learner entry was lost looks
/// (sim seed 220008084, who must be let back). The removal marks the broker
/// draining first, so the removed broker's restart, asking to join again,
/// is refused as removed rather than added back as a voter.
#[test]
fn a_broker_whose_removal_was_cut_short_is_not_added_back() {
    let runtime = Runtime::with_seed_and_config(13, madsim::Config::default());
    runtime.block_on(async {
        let handle = Handle::current();
        let (nodes, hosts, leader) = four_brokers_two_seconds_in(&handle).await;
        let node = |id: u64| started(&nodes, id);
        let join_from_4 = || join_from(&handle, hosts[3], node(4), leader);
        join_from_4().await.unwrap().expect("broker 4 joins");
        // What `remove_broker` does before it unregisters the broker.
        let drain = Command::Metadata(MetadataCommand::DrainBroker { broker: keel_core::BrokerId(4) });
        node(leader).propose(&GroupId::Metadata, drain).await.expect("drained");
        let raft = node(leader).raft(&GroupId::Metadata).unwrap();
        let remove = openraft::ChangeMembers::RemoveVoters(std::collections::BTreeSet::from([4]));
        raft.change_membership(remove, false).await.expect("broker 4 voted out");
        let joined = join_from_4().await.unwrap();
        let refused = matches!(&joined, Err(JoinRefusal::Refused(reason)) if reason.contains("was removed"));
        assert!(refused, "broker 4 was not refused as removed: {joined:?}");
        let voters = node(leader).group_voters(&GroupId::Metadata).unwrap();
        assert!(!voters.contains(&4), "broker 4 votes again: {voters:?}");
    })
}

/// Every replica of a partition loses power at once, and the leader's disk
/// loses the entries it appended last, which its followers flushed and
/// which were acknowledged (with pipelined replication a leader's own flush
/// may come last). After the restart the followers name the old leader,
/// whose broker is heard, and wait for it; it stands in a new term and
/// cannot win, its log being shorter. They refuse it their votes, and that
/// ends their wait: a leader within a few election timeouts, not after
/// their patience (`waves::FOLLOWER_PATIENCE`, 10 s). Measured: led again
/// 1.3-1.5 s after the restart; 10.8-11.7 s without the refusal rule
/// (seeds 1, 2 and 4; seed 3's cut kept the leader's tail). Since votes
/// stopped being checkpoints (8f61a17, found by bisecting; they no longer
/// checkpoint the applied metadata on the way, so a restart starts from
/// older metadata): 2.5-2.9 s, and 2.7-3.1 s once a
/// simulated call stopped making a handshake connection first (its
/// timings moved). The bound, 5 s, still tells a refusal from patience.
#[test]
fn followers_that_refuse_their_restarted_leader_elect_without_waiting_out_their_patience() {
    on_seeds(&[1, 2, 3, 4], leader_lost_its_tail);
}

async fn leader_lost_its_tail(seed: u64) {
    let handle = Handle::current();
    let (brokers, hosts, group) = orders_written(&handle, 5).await;
    let nodes = || running_nodes(&brokers);
    let leading = |node: &Node| {
        node.raft(&group).and_then(|raft| {
            let metrics = raft.metrics().borrow().clone();
            (metrics.state == openraft::ServerState::Leader).then_some(metrics.last_log_index)
        })
    };
    let leader = (0..3)
        .find(|i| brokers[*i].node.lock().unwrap().as_ref().is_some_and(|n| leading(n).is_some()))
        .expect("a leader");
    brokers[leader].disk.lock().unwrap().set_lie_about_sync(true);
    for sequence in 5..10 {
        propose(&brokers, &group, append(sequence)).await;
    }
    let acknowledged = leading(&nodes()[leader]).flatten().expect("the leader's last index");
    for (broker, host) in brokers.iter().zip(&hosts) {
        power_cut(&handle, broker, *host);
    }
    brokers[leader].disk.lock().unwrap().set_lie_about_sync(false);
    madsim::time::sleep(Duration::from_secs(1)).await;
    for host in &hosts {
        handle.restart(*host);
    }
    let restarted = madsim::time::Instant::now();
    loop {
        if nodes().iter().any(|node| leading(node).flatten().is_some_and(|last| last >= acknowledged)) {
            break;
        }
        let waited = restarted.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "seed {seed}: no leader holding the acknowledged entries {waited:?} after the restart"
        );
        madsim::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A broker that follows the partition (and leads none) loses power while
/// the group is quiet, and comes back: the leader left it out while it was
/// down, so the group stayed quiet; on its return the group wakes for it
/// (`quiesce::REJOIN_WAKE`), heartbeats tell it what was committed (its
/// commit point was not synced), and the group goes quiet again with the
/// same leader in the same term. Without the wake, a follower that has not
/// applied its whole log never goes quiet, waits out its patience and
/// stands for election: the term moves.
#[test]
fn a_follower_back_from_a_power_cut_settles_without_an_election() {
    on_seeds(&[1, 2, 3, 4], follower_back_from_a_power_cut);
}

async fn follower_back_from_a_power_cut(seed: u64) {
    let handle = Handle::current();
    let (brokers, hosts, group) = orders_written(&handle, 10).await;
    let nodes = || running_nodes(&brokers);
    // The group quiet on all three brokers: one leader, two followers.
    let quiet = |nodes: &[Node]| {
        let counts = nodes.iter().map(|n| n.quiet_counts()).fold((0, 0), |(l, f), q| (l + q.led, f + q.followed));
        nodes.len() == 3 && counts == (1, 2)
    };
    let settled = |nodes: &[Node]| {
        let metrics: Vec<_> = nodes.iter().map(|n| n.raft(&group).unwrap().metrics().borrow().clone()).collect();
        let leader = metrics.iter().find(|m| m.state == openraft::ServerState::Leader)?;
        let all_applied = metrics.iter().all(|m| m.last_applied.map(|l| l.index) == leader.last_log_index);
        (quiet(nodes) && all_applied).then_some((leader.id, leader.current_term))
    };
    let mut waited = 0;
    let (leader, term) = loop {
        if let Some(found) = settled(&nodes()) {
            break found;
        }
        waited += 1;
        assert!(waited < 600, "seed {seed}: the group did not go quiet");
        madsim::time::sleep(Duration::from_millis(100)).await;
    };
    let follower = (0..3).find(|i| brokers[*i].node.lock().unwrap().as_ref().unwrap().id() != leader).unwrap();
    power_cut(&handle, &brokers[follower], hosts[follower]);
    madsim::time::sleep(Duration::from_secs(3)).await;
    handle.restart(hosts[follower]);
    // Past the follower's patience (`waves::FOLLOWER_PATIENCE`, 10 s).
    madsim::time::sleep(Duration::from_secs(20)).await;
    let back = settled(&nodes());
    assert_eq!(back, Some((leader, term)), "seed {seed}: the group elected again, or is not quiet and applied");
}
