//! One simulated run: the real broker code on madsim hosts, real client
//! library on client hosts, faults from the seed, and the history the
//! checkers read. Simulation builds only.
//!
//! Fault bounds, and why every guarantee must still hold under them:
//! - Every disk honours fsync: a power cut loses only unsynced writes (kept,
//!   dropped or torn per sector, chosen by the seed). The node-fault lane
//!   takes down (crashes or pauses) one broker at a time, or cuts the power
//!   of a majority or of every broker at once: fsync is honoured, so every
//!   entry a majority acknowledged survives even then. At every power cut
//!   the broker's durable image must hold every entry it reported
//!   persisted (G1 at the cut). Network faults can stack on top: they cut
//!   brokers off but never touch disks, so they may stall a group but never
//!   cost it data.
//! - The lying disk (a negative control) breaks the first bound on purpose.
//! - Clock faults skew and jump each broker's own clock; the simulation's
//!   global time (timeouts, elections) is untouched, as on real machines.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_client::pb;
use keel_client::{BatchingConfig, BatchingProducer, Client, Consumer, Producer, RetryPolicy};
use keel_core::planted::Bug;
use keel_core::{PartitionIndex, TopicName, TopicPartition};
use keel_server::clock::{Clock, Skew};
use keel_server::group::GroupId;
use keel_server::node::{Node, NodeConfig};
use keel_server::raft::types::{Command, Response as Applied, Vote};
use keel_server::storage::crash_disk::NodeDisk;
use keel_server::storage::sim_sync_latency;
use keel_server::storage::{NodeStore, PersistedMark};
use madsim::net::NetSim;
use madsim::rand::Rng;
use madsim::runtime::{Handle, Runtime};
use madsim::task::NodeId as HostId;
use madsim::time::Instant;

use crate::checkers::{check, Verdict};
use crate::history::{topic_key, trace_hash, EventKind, Recorder, Seen, FILL_GROUP_PREFIX, MAIN_GROUP};
use crate::scenario::{AssignorChoice, FaultKind, Scenario, TopicSpec};

/// A deliberate bug, for the negative controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// Disks acknowledge fsync without making anything durable: every
    /// acknowledged write is at the mercy of the next crash (G1).
    LyingDisk,
    /// A bug planted in the broker, the state machines or the client.
    Bug(Bug),
    /// The harness carries state from one run to the next (a process-wide
    /// count of runs reaches the history), so the same seed runs
    /// differently the second time (the replay check).
    StateAcrossRuns,
}

/// Runs started in this process (read only by [`Plant::StateAcrossRuns`]).
static RUNS_STARTED: AtomicU64 = AtomicU64::new(0);

impl Plant {
    pub fn name(self) -> &'static str {
        match self {
            Plant::LyingDisk => "lying-disk",
            Plant::Bug(bug) => bug.name(),
            Plant::StateAcrossRuns => "state-across-runs",
        }
    }

    pub fn all() -> Vec<Plant> {
        std::iter::once(Plant::LyingDisk)
            .chain(Bug::ALL.iter().map(|b| Plant::Bug(*b)))
            .chain([Plant::StateAcrossRuns])
            .collect()
    }

    pub fn parse(name: &str) -> Option<Plant> {
        Plant::all().into_iter().find(|p| p.name() == name)
    }

    /// The guarantee whose checker exists to catch this bug.
    pub fn caught_by(self) -> crate::checkers::Guarantee {
        use crate::checkers::Guarantee::*;
        match self {
            Plant::LyingDisk => G1,
            Plant::StateAcrossRuns => Replay,
            Plant::Bug(Bug::WallClockApply) => G6,
            Plant::Bug(Bug::ConsumerNoOrderFilter) => G3,
            Plant::Bug(Bug::CommitUnchecked) => G4,
            Plant::Bug(Bug::CommitWithoutFence) => G5,
            Plant::Bug(Bug::PanicOnBadCommit) => G7,
            Plant::Bug(Bug::NoIdempotence) => G8,
            Plant::Bug(Bug::NeverExpireMembers) => L1,
            Plant::Bug(Bug::BatchingAnswersNewest) => G1,
            Plant::Bug(Bug::PersistedBeforeSync) => G1,
            Plant::Bug(Bug::SnapshotDropsLastRecord) => G6,
            Plant::Bug(Bug::RefuseProducesAfterFailover) => L1,
            Plant::Bug(Bug::ForgetKeepsPositions) => G4,
            Plant::Bug(Bug::WriteErrorsIgnored) => G1,
            Plant::Bug(Bug::AclIgnored) => Refusal,
            Plant::Bug(Bug::QuietForever) => L1,
            Plant::Bug(Bug::RangeDropsLastPartition) => L1,
            Plant::Bug(Bug::ResetAnsweredNotApplied) => G4,
            Plant::Bug(Bug::ReadSkipsFirstRecord) => G2,
            Plant::Bug(Bug::EmptyBatchApplied) => Refusal,
            Plant::Bug(Bug::PollWithoutFence) => G5,
            Plant::Bug(Bug::CommitAtHighWatermark) => G4,
            Plant::Bug(Bug::DuplicateAnswersNewest) => G1,
            Plant::Bug(Bug::PollWithoutReadIndex) => G5,
            Plant::Bug(Bug::VotesNotReplayed) => G1,
            Plant::Bug(Bug::BatchAnswersMisrouted) => G7,
        }
    }

    /// Faults the bug needs to show.
    fn needs(self) -> &'static [FaultKind] {
        match self {
            Plant::LyingDisk => &[FaultKind::Crash, FaultKind::LeaderCrash],
            Plant::Bug(Bug::NoIdempotence) => &[FaultKind::PacketLoss, FaultKind::LeaderCrash, FaultKind::Delay],
            Plant::Bug(Bug::ConsumerNoOrderFilter) => &[FaultKind::LeaderCrash],
            Plant::Bug(Bug::CommitWithoutFence) => &[FaultKind::ConsumerPause],
            Plant::Bug(Bug::NeverExpireMembers) => &[FaultKind::ConsumerCrash],
            Plant::Bug(Bug::PersistedBeforeSync) | Plant::Bug(Bug::VotesNotReplayed) => {
                &[FaultKind::Crash, FaultKind::PowerLossMidWrite]
            }
            Plant::Bug(Bug::SnapshotDropsLastRecord) => &[FaultKind::PartitionMinority, FaultKind::Crash],
            Plant::Bug(Bug::RefuseProducesAfterFailover) => &[FaultKind::LeaderCrash],
            Plant::Bug(Bug::WriteErrorsIgnored) => &[FaultKind::DiskFull],
            Plant::Bug(Bug::QuietForever) => &[FaultKind::LeaderCrash],
            Plant::Bug(Bug::PollWithoutReadIndex) => &[FaultKind::PartitionBrokers],
            Plant::Bug(Bug::BatchAnswersMisrouted) => &[FaultKind::LeaderCrash, FaultKind::Crash],
            Plant::Bug(_) | Plant::StateAcrossRuns => &[],
        }
    }
}

/// How to run a seed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Enable every fault kind (otherwise the seed draws a swarm subset).
    pub all_faults: bool,
    pub plant: Option<Plant>,
}

/// Whether runs check their own determinism: `MADSIM_TEST_CHECK_DETERMINISM`
/// set (as for madsim's own tests) runs every seed twice and compares.
pub fn check_determinism_requested() -> bool {
    std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some()
}

/// Everything a run produced.
pub struct RunReport {
    pub scenario: Scenario,
    pub events: Vec<crate::history::Event>,
    pub verdict: Verdict,
    pub trace_hash: u64,
    pub simulated_ms: u64,
    /// Faults injected, per kind.
    pub faults: BTreeMap<String, u64>,
    /// Raft snapshots built and installed, over every broker and restart.
    pub snapshots: (u64, u64),
    /// Bytes of live log frames compaction copied, over every broker and
    /// restart.
    pub compacted_bytes: u64,
    /// Rejections the state machines recorded, by kind (`metadata:Kind`
    /// or `partition:Kind`), over every replica's apply.
    pub rejections: BTreeMap<String, u64>,
    /// Whether anything of the run outlived its runtime: a task left
    /// waiting on a host that was not killed keeps its cluster (disks,
    /// stores, Raft groups) alive through its wakers, and a sweep's worker
    /// then grows with every seed it runs (see `release_hosts`).
    pub world_retained: bool,
}

/// The name under which [`RunReport::faults`] counts the slow-disk lane's
/// fsync stalls.
pub const FSYNC_STALL: &str = "fsync-stall";

/// The scenario a run of `seed` with `options` uses.
pub fn scenario_for(seed: u64, options: RunOptions) -> Scenario {
    let mut scenario = Scenario::from_seed(seed, options.all_faults);
    if let Some(plant) = options.plant {
        // Records retention removes are exempt from the checks a plant must
        // trip: no retention in negative controls.
        scenario.retention_bytes = None;
        scenario.retention_ms = None;
        // Nor slow disks nor eager batches (but for the plant about
        // batches): the controls keep the traces their seeds (and seed
        // bounds) were chosen on.
        scenario.disk_latency = None;
        scenario.eager_batching = plant == Plant::Bug(Bug::BatchAnswersMisrouted);
        // Nor access control, unless the plant is about it: the controls
        // keep the runs their seeds were chosen for.
        scenario.access_control = plant == Plant::Bug(Bug::AclIgnored);
        scenario.enable(plant.needs());
        // Make the trigger frequent.
        scenario.fault_interval_ms = 800;
        if plant == Plant::Bug(Bug::CommitUnchecked) || plant == Plant::Bug(Bug::PanicOnBadCommit) {
            scenario.hostile_ack_every = 3;
        }
        if plant == Plant::Bug(Bug::BatchingAnswersNewest) {
            scenario.batching_producers = true;
        }
        if plant == Plant::Bug(Bug::SnapshotDropsLastRecord) {
            scenario.snapshot_every = Some(scenario.snapshot_every.unwrap_or(10).min(10));
        }
        if plant == Plant::Bug(Bug::AclIgnored)
            || plant == Plant::Bug(Bug::EmptyBatchApplied)
            || plant == Plant::Bug(Bug::PollWithoutReadIndex)
        {
            scenario.hostile_clients = true;
        }
        if plant == Plant::Bug(Bug::QuietForever) {
            // Leaders crash, and nothing else: the check of failover wants a
            // calm network, and groups go quiet once the producers are done.
            scenario.faults = vec![FaultKind::LeaderCrash];
            scenario.membership = false;
            scenario.topic_lifecycle = false;
            scenario.batches_per_producer = scenario.batches_per_producer.min(8);
        }
        if plant == Plant::Bug(Bug::ConsumerNoOrderFilter) {
            scenario.ack_every_polls = scenario.ack_every_polls.max(2);
        }
        // The shape lane's plants need its parts: the range assignor on
        // group g, the operator's reset, the reader.
        let shape = scenario.shape.clone().unwrap_or_else(crate::scenario::Shape::first);
        if plant == Plant::Bug(Bug::RangeDropsLastPartition) {
            scenario.shape = Some(crate::scenario::Shape { assignor: AssignorChoice::Range, ..shape.clone() });
        }
        if plant == Plant::Bug(Bug::ResetAnsweredNotApplied) {
            scenario.shape = Some(shape.clone());
            scenario.topic_lifecycle = true;
        }
        if plant == Plant::Bug(Bug::ReadSkipsFirstRecord) {
            scenario.shape = Some(crate::scenario::Shape { reader: true, ..shape });
            scenario.topic_lifecycle = false;
        }
    }
    scenario
}

/// Run one seed to its verdict (twice, compared, if
/// [`check_determinism_requested`]).
pub fn run_seed(seed: u64, options: RunOptions) -> RunReport {
    run_scenario(scenario_for(seed, options), options.plant, check_determinism_requested())
}

/// Run `scenario` (its seed drives everything it leaves to chance) with
/// `plant`. With `check_determinism`, run it a second time and report a
/// violation if the two histories differ.
pub fn run_scenario(scenario: Scenario, plant: Option<Plant>, check_determinism: bool) -> RunReport {
    let mut report = run_once(scenario.clone(), plant);
    if check_determinism {
        let again = run_once(scenario, plant);
        if again.trace_hash != report.trace_hash {
            let diverged = report.events.iter().zip(&again.events).position(|(a, b)| a != b);
            let at = diverged.unwrap_or(report.events.len().min(again.events.len()));
            let show = |events: &[crate::history::Event]| {
                events.get(at).map_or_else(|| "the end of the history".to_string(), |e| format!("{e:?}"))
            };
            report.verdict.violations.push(crate::checkers::Violation {
                guarantee: crate::checkers::Guarantee::Replay,
                message: format!(
                    "two runs of seed {} differ (trace hashes {:016x} and {:016x}) from event {at}: {} vs {}",
                    report.scenario.seed,
                    report.trace_hash,
                    again.trace_hash,
                    show(&report.events),
                    show(&again.events)
                ),
            });
        }
    }
    report
}

/// One run.
///
/// Each run gets a fresh OS thread (outside the simulation): std seeds the
/// hash maps of a thread once, and madsim can seed them from the run's seed
/// only on a thread that never made one. On a reused thread a run would
/// depend on the runs before it.
fn run_once(scenario: Scenario, plant: Option<Plant>) -> RunReport {
    let seed = scenario.seed;
    let options = RunOptions { all_faults: false, plant };
    let bugs: Vec<Bug> = match options.plant {
        Some(Plant::Bug(bug)) => vec![bug],
        _ => Vec::new(),
    };
    let recorder = Recorder::default();
    let lying = options.plant == Some(Plant::LyingDisk);
    let runs_before = RUNS_STARTED.fetch_add(1, Ordering::SeqCst);
    if options.plant == Some(Plant::StateAcrossRuns) {
        recorder.record(0, "driver", EventKind::Phase { name: format!("after {runs_before} runs") });
    }
    let (run_scenario, run_recorder) = (scenario.clone(), recorder.clone());
    let outcome = std::thread::spawn(move || {
        keel_core::planted::plant(&bugs);
        let mut runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
        // A backstop: the driver bounds every phase itself.
        runtime.set_time_limit(Duration::from_millis(run_scenario.safety_ms + run_scenario.liveness_ms + 120_000));
        keel_core::planted::take_rejections();
        keel_server::raft::batch::sim_batching::set(run_scenario.eager_batching);
        sim_sync_latency::set(run_scenario.disk_latency.map(|disk| sim_sync_latency::SyncLatency {
            us: disk.sync_us,
            stall_one_in: disk.stall_one_in,
            stall_ms: disk.stall_ms,
        }));
        let (ms, world) = runtime.block_on(simulate(run_scenario, run_recorder, lying));
        drop(runtime);
        let world_retained = world.strong_count() > 0;
        (ms, keel_core::planted::take_rejections(), sim_sync_latency::take_stalls(), world_retained)
    })
    .join();
    let mut rejections = BTreeMap::new();
    let mut stalls = 0;
    let mut world_retained = false;
    let simulated_ms = match outcome {
        Ok((ms, counted, stalled, retained)) => {
            stalls = stalled;
            world_retained = retained;
            rejections = counted.into_iter().map(|((machine, kind), n)| (format!("{machine}:{kind}"), n)).collect();
            ms
        }
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_string());
            let last = recorder.events().last().map_or(0, |e| e.at_ms);
            recorder.record(last, "driver", EventKind::NodeFailure { broker: 0, reason: format!("panic: {reason}") });
            last
        }
    };
    let events = recorder.events();
    let verdict = check(&events);
    let mut faults = BTreeMap::new();
    for event in &events {
        if let EventKind::Fault { kind, .. } = &event.kind {
            *faults.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    if stalls > 0 {
        faults.insert(FSYNC_STALL.to_string(), stalls);
    }
    // The counts restart with each incarnation: sum each one's last sample.
    let mut snapshot_samples = BTreeMap::new();
    for event in &events {
        if let EventKind::Snapshots { broker, incarnation, built, installed } = &event.kind {
            snapshot_samples.insert((*broker, *incarnation), (*built, *installed));
        }
    }
    let snapshots = snapshot_samples.values().fold((0, 0), |(b, i), (built, installed)| (b + built, i + installed));
    let mut compacted_samples = BTreeMap::new();
    for event in &events {
        if let EventKind::LogCompacted { broker, incarnation, bytes } = &event.kind {
            compacted_samples.insert((*broker, *incarnation), *bytes);
        }
    }
    let compacted_bytes = compacted_samples.values().sum();
    RunReport {
        trace_hash: trace_hash(&events),
        scenario,
        events,
        verdict,
        simulated_ms,
        faults,
        snapshots,
        compacted_bytes,
        rejections,
        world_retained,
    }
}

fn broker_address(id: u64) -> SocketAddr {
    SocketAddr::new(IpAddr::from([10, 0, 0, id as u8]), 7000)
}

/// One simulated broker: its disk and clock survive restarts.
#[derive(Clone)]
struct SimBroker {
    id: u64,
    host: HostId,
    disk: Arc<Mutex<NodeDisk>>,
    node: Arc<Mutex<Option<Node>>>,
    /// The store of the running incarnation (its persisted marks).
    store: Arc<Mutex<Option<Arc<NodeStore>>>>,
    clock: Clock,
    incarnation: Arc<AtomicU64>,
    /// Set while the disk is made to fail: the broker stopping on its I/O
    /// error is then what it must do, not a failure to report.
    disk_failing: Arc<AtomicBool>,
    /// Not one of the initial brokers: it joins when the membership lane
    /// says so.
    spare: bool,
    /// The spare was told to join (it does, and again after each restart).
    joining: Arc<AtomicBool>,
    /// Removed from the cluster and shut down for good: no lane restarts it.
    decommissioned: Arc<AtomicBool>,
}

impl SimBroker {
    fn node(&self) -> Option<Node> {
        self.node.lock().expect("node slot").clone()
    }
}

/// Shared state of one run.
#[derive(Clone)]
struct World {
    scenario: Arc<Scenario>,
    recorder: Recorder,
    start: Instant,
    brokers: Vec<SimBroker>,
    producer_hosts: Vec<HostId>,
    consumer_hosts: Vec<HostId>,
    /// Producers that have sent all their batches.
    producers_done: Arc<AtomicU64>,
    /// Faults the lanes may still inject (the scenario's `max_faults`).
    faults_left: Arc<AtomicU64>,
    /// Links clogged by the network lane: (from, to).
    clogged: Arc<Mutex<BTreeSet<(HostId, HostId)>>>,
    /// Network faults begun and healed so far (odd while one is on): the
    /// failover check asks for a calm network.
    network_faults: Arc<AtomicU64>,
    /// A leader crash is being checked for failover: the network lane
    /// starts no new fault.
    failover_window: Arc<AtomicBool>,
    /// Brokers-only splits begun so far, and whether one is on: the hostile
    /// lane moves the main group on once per split, so that a deposed
    /// leader's stale claim meets a newer generation (see
    /// [`FaultKind::PartitionBrokers`]).
    brokers_splits: Arc<AtomicU64>,
    brokers_split_on: Arc<AtomicBool>,
    /// The brokers cut off by the latest brokers-only split.
    brokers_split_small: Arc<Mutex<Vec<u64>>>,
    /// Tasks the driver left running on its own host (which cannot be
    /// killed), aborted when the run ends ([`release_hosts`]).
    detached: Arc<Mutex<Vec<madsim::task::JoinHandle<()>>>>,
    /// Held by every clone of the world: gone once the run freed them all.
    lifetime: Arc<()>,
}

impl World {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn record(&self, process: &str, kind: EventKind) {
        self.recorder.record(self.now_ms(), process, kind);
    }

    fn client(&self) -> Client {
        let brokers = (1..=self.scenario.brokers).map(|id| broker_address(id).to_string()).collect();
        let policy = RetryPolicy {
            deadline: Duration::from_secs(8),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            jitter_seed: Some(madsim::rand::random()),
            request_timeout: Duration::from_secs(2),
            give_up_when_unreachable: false,
        };
        self.as_user(Client::new(brokers, policy).expect("broker addresses"), APP_USER, APP_SECRET)
    }

    /// `client` authenticating as `user` when the run authorises requests.
    fn as_user(&self, client: Client, user: &str, secret: &str) -> Client {
        if !self.scenario.access_control {
            return client;
        }
        let credentials = keel_client::Credentials::user(user, secret).expect("printable credentials");
        client.with_credentials(credentials).expect("a new client")
    }

    /// The brokers running, but for one being stopped (its groups gone).
    fn live_nodes(&self) -> Vec<Node> {
        self.brokers.iter().filter_map(SimBroker::node).filter(|node| !node.is_stopping()).collect()
    }
}

/// Start a broker host whose init opens its disk and starts the node.
fn start_broker(
    handle: &Handle,
    id: u64,
    scenario: &Scenario,
    recorder: Recorder,
    start: Instant,
    lying: bool,
    spare: bool,
) -> SimBroker {
    let voters: BTreeMap<u64, String> = (1..=scenario.brokers)
        .map(|b| (b, keel_server::node::default_internal_address(&broker_address(b).to_string()).expect("port")))
        .collect();
    let disk = if lying { NodeDisk::new_lying() } else { NodeDisk::new() };
    let slot = BrokerSlot {
        disk: Arc::new(Mutex::new(disk)),
        node: Arc::new(Mutex::new(None)),
        store: Arc::new(Mutex::new(None)),
        clock: Clock::system(),
        incarnation: Arc::new(AtomicU64::new(0)),
        joining: Arc::new(AtomicBool::new(false)),
        decommissioned: Arc::new(AtomicBool::new(false)),
    };
    let snapshot_every = scenario.snapshot_every;
    let access_control = scenario.access_control;
    // The raw-entries lane (with the hostile clients) fills a partition up
    // to its groups limit, which a cluster sets once for good: low enough
    // to fill, above what the workload's own groups need.
    let groups_per_partition_max = scenario.hostile_clients.then_some(RAW_GROUPS_PER_PARTITION);
    let init_slot = slot.clone();
    let host = handle
        .create_node()
        .name(format!("broker-{id}"))
        .ip(broker_address(id).ip())
        .init(move || {
            let (slot, voters, recorder) = (init_slot.clone(), voters.clone(), recorder.clone());
            async move {
                if spare && !slot.joining.load(Ordering::SeqCst) {
                    // A machine set aside: nothing runs until it is added.
                    std::future::pending::<()>().await;
                }
                slot.incarnation.fetch_add(1, Ordering::SeqCst);
                let disk = slot.disk.lock().expect("disk").clone();
                let opened = std::panic::catch_unwind(AssertUnwindSafe(|| open_store(&disk)));
                let store = match opened {
                    Ok(Ok(store)) => store,
                    failed => {
                        let reason = match failed {
                            Ok(Err(error)) => error.to_string(),
                            _ => "redb panicked while opening it".to_string(),
                        };
                        let at = start.elapsed().as_millis() as u64;
                        recorder.record(at, &format!("broker-{id}"), EventKind::DiskLost { broker: id, reason });
                        // Carry on with an empty disk, as an operator would.
                        let fresh = if lying { NodeDisk::new_lying() } else { NodeDisk::new() };
                        *slot.disk.lock().expect("disk") = fresh.clone();
                        open_store(&fresh).expect("an empty disk opens")
                    }
                };
                *slot.store.lock().expect("store slot") = Some(store.clone());
                let address = broker_address(id);
                let mut config = if spare {
                    // Like `keel serve --join`: no voters of its own; the
                    // cluster's id comes from the cluster.
                    let mut config = NodeConfig::new(id, address, address.to_string(), BTreeMap::new());
                    config.cluster_id = keel_server::node::cluster_id_of(&voters);
                    config
                } else {
                    NodeConfig::new(id, address, address.to_string(), voters.clone())
                };
                config.retention_interval = Duration::from_secs(1);
                if let Some(max) = groups_per_partition_max {
                    config.limits.groups_per_partition_max = max;
                }
                if access_control {
                    config.access = keel_server::api::AccessSettings {
                        authorize: true,
                        super_users: [keel_core::Principal::new(SUPER_USER).expect("a principal")].into(),
                    };
                }
                if let Some(every) = snapshot_every {
                    config.raft.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(every);
                    // Purge right behind each snapshot: a replica that falls
                    // behind catches up by snapshot install.
                    config.raft.max_in_snapshot_log_to_keep = 0;
                }
                match Node::start(config, store, slot.clock.clone()).await {
                    Ok(node) => {
                        *slot.node.lock().expect("node slot") = Some(node.clone());
                        if spare && !slot.decommissioned.load(Ordering::SeqCst) {
                            let (recorder, through) = (recorder.clone(), voters.values().cloned().collect());
                            madsim::task::spawn(join_until_member(node, id, through, recorder, start));
                        }
                    }
                    Err(error) => {
                        let at = start.elapsed().as_millis() as u64;
                        recorder.record(
                            at,
                            &format!("broker-{id}"),
                            EventKind::NodeFailure { broker: id, reason: format!("did not start: {error}") },
                        );
                    }
                }
                std::future::pending::<()>().await;
            }
        })
        .build();
    SimBroker {
        id,
        host: host.id(),
        disk: slot.disk,
        node: slot.node,
        store: slot.store,
        clock: slot.clock,
        incarnation: slot.incarnation,
        disk_failing: Arc::new(AtomicBool::new(false)),
        spare,
        joining: slot.joining,
        decommissioned: slot.decommissioned,
    }
}

/// A spare broker's join, through each initial broker in turn, until it
/// is a member (or refused for good).
async fn join_until_member(node: Node, id: u64, through: Vec<String>, recorder: Recorder, start: Instant) {
    let process = format!("broker-{id}");
    for round in 0.. {
        let address = through[round % through.len()].clone();
        let (op, detail) = ("joined".to_string(), format!("broker {id} through {address}"));
        match node.join_cluster(address).await {
            Ok(()) => {
                let at = start.elapsed().as_millis() as u64;
                recorder.record(at, &process, EventKind::Operator { op, detail, outcome: "ok".into() });
                return;
            }
            Err(refusal @ keel_server::raft::network::JoinRefusal::Refused(_)) => {
                let at = start.elapsed().as_millis() as u64;
                let outcome = format!("refused: {refusal:?}");
                recorder.record(at, &process, EventKind::Operator { op, detail, outcome });
                return;
            }
            Err(_) => madsim::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// What a broker host's init needs: the parts of a broker that outlive
/// its restarts.
#[derive(Clone)]
struct BrokerSlot {
    disk: Arc<Mutex<NodeDisk>>,
    node: Arc<Mutex<Option<Node>>>,
    store: Arc<Mutex<Option<Arc<NodeStore>>>>,
    clock: Clock,
    incarnation: Arc<AtomicU64>,
    joining: Arc<AtomicBool>,
    decommissioned: Arc<AtomicBool>,
}

/// The whole run; returns the simulated milliseconds it took and a handle
/// that tells whether the run's [`World`] outlived it.
async fn simulate(scenario: Scenario, recorder: Recorder, lying: bool) -> (u64, std::sync::Weak<()>) {
    let handle = Handle::current();
    let start = Instant::now();
    let mut brokers: Vec<SimBroker> = (1..=scenario.brokers)
        .map(|id| start_broker(&handle, id, &scenario, recorder.clone(), start, lying, false))
        .collect();
    if scenario.membership {
        let id = scenario.brokers + 1;
        brokers.push(start_broker(&handle, id, &scenario, recorder.clone(), start, lying, true));
    }
    let scenario = Arc::new(scenario);
    let mut world = World {
        scenario: scenario.clone(),
        recorder: recorder.clone(),
        start,
        brokers,
        producer_hosts: Vec::new(),
        consumer_hosts: Vec::new(),
        producers_done: Arc::new(AtomicU64::new(0)),
        faults_left: Arc::new(AtomicU64::new(scenario.max_faults.unwrap_or(u64::MAX))),
        clogged: Arc::new(Mutex::new(BTreeSet::new())),
        network_faults: Arc::new(AtomicU64::new(0)),
        failover_window: Arc::new(AtomicBool::new(false)),
        brokers_splits: Arc::new(AtomicU64::new(0)),
        brokers_split_on: Arc::new(AtomicBool::new(false)),
        brokers_split_small: Arc::new(Mutex::new(Vec::new())),
        detached: Arc::new(Mutex::new(Vec::new())),
        lifetime: Arc::new(()),
    };
    world.record("driver", EventKind::Phase { name: "setup".into() });
    // The driver's own host has no address: client calls run on an admin host.
    let admin = handle.create_node().name("admin").ip(IpAddr::from([10, 0, 3, 1])).build();
    world.producer_hosts.push(admin.id());
    let w = world.clone();
    admin.spawn(async move { setup_topics(&w).await }).await.expect("setup runs");

    world.record("driver", EventKind::Phase { name: "safety".into() });
    for p in 0..scenario.producers {
        let host = handle.create_node().name(format!("producer-{p}")).ip(IpAddr::from([10, 0, 1, p as u8 + 1])).build();
        world.producer_hosts.push(host.id());
        let w = world.clone();
        host.spawn(async move { produce(w, p).await });
    }
    let consumer_incarnations = Arc::new(AtomicU64::new(0));
    // Members are numbered across groups: consumer-N is one host.
    let plans = group_plans(&scenario);
    for plan in &plans {
        world.record("driver", EventKind::Subscribed { group: plan.name.clone(), topics: plan.topics.clone() });
    }
    let members = plans.iter().flat_map(|plan| (0..plan.members).map(move |_| plan.clone()));
    for (c, plan) in (0u32..).zip(members) {
        let (w, incarnations, plan) = (world.clone(), consumer_incarnations.clone(), Arc::new(plan));
        let host = handle
            .create_node()
            .name(format!("consumer-{c}"))
            .ip(IpAddr::from([10, 0, 2, c as u8 + 1]))
            .init(move || {
                let world = w.clone();
                let incarnations = incarnations.clone();
                let plan = plan.clone();
                async move { consume(world, plan, c, incarnations).await }
            })
            .build();
        world.consumer_hosts.push(host.id());
    }
    let sampler = {
        let w = world.clone();
        madsim::task::spawn(async move { sample_positions(w).await })
    };
    // Reads by offset name a topic, not its incarnation: the reader runs
    // only where topics keep theirs.
    if scenario.shape.as_ref().is_some_and(|shape| shape.reader) && !scenario.topic_lifecycle {
        let host = handle.create_node().name("reader").ip(IpAddr::from([10, 0, 3, 4])).build();
        world.producer_hosts.push(host.id());
        let w = world.clone();
        host.spawn(async move { read_by_offset(w).await });
    }

    let safety_over = Arc::new(AtomicBool::new(false));
    let mut lanes: Vec<_> = [lane_nodes as LaneFn, lane_network, lane_clocks, lane_clients, lane_raw_entries]
        .into_iter()
        .map(|lane| {
            let (w, over) = (world.clone(), safety_over.clone());
            madsim::task::spawn(async move { lane(w, over).await })
        })
        .collect();
    if scenario.hostile_clients {
        let hostile = handle.create_node().name("hostile").ip(IpAddr::from([10, 0, 3, 3])).build();
        world.producer_hosts.push(hostile.id());
        let (w, over) = (world.clone(), safety_over.clone());
        lanes.push(hostile.spawn(async move { lane_hostile(w, over).await }));
    }
    if scenario.membership || scenario.topic_lifecycle {
        // The operator is a client host like any other (network faults reach it).
        let operator = handle.create_node().name("operator").ip(IpAddr::from([10, 0, 3, 2])).build();
        world.producer_hosts.push(operator.id());
        let (w, over) = (world.clone(), safety_over.clone());
        lanes.push(operator.spawn(async move { lane_membership(w, over).await }));
        let (w, over) = (world.clone(), safety_over.clone());
        lanes.push(operator.spawn(async move { lane_topics(w, over).await }));
    }
    madsim::time::sleep(Duration::from_millis(scenario.safety_ms)).await;
    safety_over.store(true, Ordering::SeqCst);
    for lane in lanes {
        let _ = lane.await;
    }

    world.record("driver", EventKind::Phase { name: "liveness".into() });
    heal_everything(&world);
    let w = world.clone();
    admin.spawn(async move { await_liveness(&w).await }).await.expect("the liveness check runs");
    let w = world.clone();
    admin.spawn(async move { probe_writes(&w).await }).await.expect("the write probes run");
    sampler.abort();
    world.record("driver", EventKind::Phase { name: "final".into() });
    final_reads(&world).await;
    let simulated_ms = world.now_ms();
    release_hosts(&world).await;
    (simulated_ms, Arc::downgrade(&world.lifetime))
}

/// Kills every host of the run and aborts the driver's detached tasks, so
/// that the runtime drops their futures. madsim frees a task only when it
/// runs it or kills its node: a task left waiting when the run ends is held
/// by the wakers in its peers' channels and in the timer queue, which it
/// holds in turn (a sleep holds the timer queue). Without this a sweep's
/// worker kept every finished seed's cluster (its disks, stores and Raft
/// groups: 75 MB for a 42-partition seed) until it exited
/// ([`RunReport::world_retained`]).
async fn release_hosts(world: &World) {
    let handle = Handle::current();
    let brokers = world.brokers.iter().map(|broker| broker.host);
    for host in brokers.chain(world.producer_hosts.iter().copied()).chain(world.consumer_hosts.iter().copied()) {
        handle.kill(host);
    }
    for task in world.detached.lock().expect("detached").drain(..) {
        task.abort();
    }
    // The killed and aborted tasks were woken; the executor drops them
    // before it polls this task again.
    madsim::task::yield_now().await;
}

/// The workload's user, whose rules grant everything the workload does.
const APP_USER: &str = "app";
const APP_SECRET: &str = "app-secret";
/// The intruder of the hostile lane: it may describe topics, nothing more.
const INTRUDER: &str = "mallory";
const INTRUDER_SECRET: &str = "mallory-secret";
/// A super user no client authenticates as (the brokers are told of one,
/// as an operator's would be).
const SUPER_USER: &str = "sim-admin";

/// With access control: the run's users and rules, proposed straight to the
/// metadata leader before any client runs (as an operator's first
/// administrator would create them; the simulation has no TLS, so no
/// certificate could).
async fn bootstrap_access(world: &World) {
    use keel_core::access::{Acl, Credential, Operation, PatternKind, ResourceKind};
    use keel_core::metadata::MetadataCommand;
    if !world.scenario.access_control {
        return;
    }
    let mut rng = madsim::rand::thread_rng();
    let mut commands = Vec::new();
    for (user, secret) in [(APP_USER, APP_SECRET), (INTRUDER, INTRUDER_SECRET)] {
        let salt: [u8; 16] = rng.gen();
        // Few rounds: the simulation runs debug builds too.
        let credential = Credential::derive(secret.as_bytes(), salt.to_vec(), 16);
        commands.push(MetadataCommand::SetUser { user: user.into(), credential, replace: true });
    }
    let grant = |principal: &str, resource: ResourceKind, operation: Operation| MetadataCommand::AddAcl {
        acl: Acl {
            principal: principal.into(),
            resource,
            pattern: if resource == ResourceKind::Cluster { PatternKind::Literal } else { PatternKind::Prefix },
            name: String::new(),
            operation,
        },
    };
    for operation in [Operation::Produce, Operation::Consume, Operation::Create, Operation::Delete, Operation::Alter] {
        commands.push(grant(APP_USER, ResourceKind::Topic, operation));
    }
    for operation in [Operation::Join, Operation::Reset, Operation::Delete] {
        commands.push(grant(APP_USER, ResourceKind::Group, operation));
    }
    commands.push(grant(APP_USER, ResourceKind::Cluster, Operation::Brokers));
    commands.push(grant(INTRUDER, ResourceKind::Topic, Operation::Describe));
    for command in commands {
        'applied: loop {
            for node in world.live_nodes() {
                let proposed = node.propose(&GroupId::Metadata, Command::Metadata(command.clone())).await;
                if let Ok(Applied::Metadata(Ok(_))) = proposed {
                    break 'applied;
                }
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn setup_topics(world: &World) {
    bootstrap_access(world).await;
    let client = world.client();
    // Every broker registers itself on the metadata leader first.
    loop {
        if let Ok(cluster) = client.describe_cluster().await {
            if cluster.brokers.len() as u64 == world.scenario.brokers && cluster.metadata_leader != 0 {
                break;
            }
        }
        madsim::time::sleep(Duration::from_millis(100)).await;
    }
    for topic in &world.scenario.topics {
        let request = pb::CreateTopicRequest {
            topic: topic.name.clone(),
            partitions: topic.partitions,
            replication_factor: topic.replication_factor,
            retention_bytes: world.scenario.retention_bytes,
            retention_ms: world.scenario.retention_ms,
        };
        while client.create_topic(request.clone()).await.is_err() {
            // AlreadyExists after a lost reply is fine too.
            if client.describe_topic(&topic.name).await.is_ok() {
                break;
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One idempotent producer: batches of uniquely valued records.
async fn produce(world: World, p: u32) {
    if world.scenario.batching_producers {
        return produce_batching(world, p).await;
    }
    let process = format!("producer-{p}");
    let client = world.client();
    let mut rng = madsim::rand::thread_rng();
    let mut producer = loop {
        match Producer::new(client.clone(), u64::from(p)).await {
            Ok(producer) => break producer,
            Err(_) => madsim::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let scenario = &world.scenario;
    for b in 0..scenario.batches_per_producer {
        let topic = &scenario.topics[rng.gen_range(0..scenario.topics.len())];
        let partition = rng.gen_range(0..topic.partitions);
        let count = rng.gen_range(1..=scenario.batch_records_max);
        let values: Vec<String> = (0..count).map(|r| format!("p{p}-b{b}-r{r}")).collect();
        let records =
            values.iter().map(|v| pb::Record { value: v.clone().into_bytes(), ..Default::default() }).collect();
        let op = world.recorder.op();
        world.record(
            &process,
            EventKind::ProduceInvoke {
                op,
                producer: producer.producer_id(),
                topic: topic.name.clone(),
                partition,
                values,
            },
        );
        match producer.send_to(&topic.name, partition, records).await {
            Ok(sent) => world.record(
                &process,
                EventKind::ProduceOk {
                    op,
                    base_offset: sent.base_offset,
                    count: sent.count,
                    duplicate: sent.duplicate,
                    topic_id: sent.topic_id,
                    partition: None,
                },
            ),
            Err(error) => world.record(&process, EventKind::ProduceFail { op, error: error.to_string() }),
        }
        madsim::time::sleep(Duration::from_millis(scenario.produce_pace_ms())).await;
    }
    world.producers_done.fetch_add(1, Ordering::SeqCst);
}

/// The producer id a batching producer's records are recorded under: its
/// partition workers each take their own ids from the cluster, so the
/// history names the harness's producer instead (ids the cluster hands out
/// are small; no run mixes the two kinds).
fn batching_producer_id(p: u32) -> u64 {
    (1 << 40) | u64::from(p)
}

/// One batching producer: the same batches of uniquely valued records, sent
/// without waiting (several batches in flight per partition), each record
/// keyed by its value and acknowledged on its own. Acknowledgements are
/// recorded in send order, so G3 checks that the producer kept its records
/// in order on each partition.
async fn produce_batching(world: World, p: u32) {
    let process = format!("producer-{p}");
    let config = BatchingConfig {
        linger: Duration::from_millis(2),
        batch_records: 3,
        in_flight: 4,
        sticky_keyless: false,
        ..BatchingConfig::default()
    };
    let producer = BatchingProducer::new(world.client(), config, u64::from(p));
    let mut rng = madsim::rand::thread_rng();
    let scenario = world.scenario.clone();
    // At most batches_per_producer x batch_records_max (160) records wait.
    let (acks, mut answered) = tokio::sync::mpsc::unbounded_channel::<(u64, keel_client::Ack)>();
    let recorder = {
        let (world, process) = (world.clone(), process.clone());
        madsim::task::spawn(async move {
            while let Some((op, ack)) = answered.recv().await {
                match ack.wait().await {
                    Ok(delivered) => world.record(
                        &process,
                        EventKind::ProduceOk {
                            op,
                            base_offset: delivered.offset,
                            count: 1,
                            duplicate: false,
                            topic_id: delivered.topic_id,
                            partition: Some(delivered.partition),
                        },
                    ),
                    Err(error) => world.record(&process, EventKind::ProduceFail { op, error: error.to_string() }),
                }
            }
        })
    };
    for b in 0..scenario.batches_per_producer {
        let topic = &scenario.topics[rng.gen_range(0..scenario.topics.len())];
        let count = rng.gen_range(1..=scenario.batch_records_max);
        for r in 0..count {
            let value = format!("p{p}-b{b}-r{r}");
            let partition = keel_core::routing::partition_for_key(value.as_bytes(), topic.partitions)
                .expect("topics have partitions")
                .0;
            let op = world.recorder.op();
            world.record(
                &process,
                EventKind::ProduceInvoke {
                    op,
                    producer: batching_producer_id(p),
                    topic: topic.name.clone(),
                    partition,
                    values: vec![value.clone()],
                },
            );
            let record =
                pb::Record { key: Some(value.clone().into_bytes()), value: value.into_bytes(), ..Default::default() };
            match producer.send(&topic.name, record).await {
                Ok(ack) => {
                    let _ = acks.send((op, ack));
                }
                Err(error) => world.record(&process, EventKind::ProduceFail { op, error: error.to_string() }),
            }
        }
        // The one-at-a-time pace: batches overlap in flight while faults
        // hold them up (four at most).
        madsim::time::sleep(Duration::from_millis(scenario.produce_pace_ms())).await;
    }
    producer.close().await;
    drop(acks);
    let _ = recorder.await;
    world.producers_done.fetch_add(1, Ordering::SeqCst);
}

fn seen(record: &pb::StoredRecord) -> Seen {
    Seen {
        offset: record.offset,
        value: String::from_utf8_lossy(&record.record.as_ref().map(|r| r.value.clone()).unwrap_or_default())
            .to_string(),
        append_time_ms: record.append_time_ms,
    }
}

/// One consumer-group member: poll, "process", and every few polls ack
/// what it polled; now and then a hostile ack that must be refused.
async fn consume(world: World, plan: Arc<GroupPlan>, c: u32, incarnations: Arc<AtomicU64>) {
    // A member now and then leaves the group gracefully and a new one
    // (another id) joins in its place.
    loop {
        let incarnation = incarnations.fetch_add(1, Ordering::SeqCst);
        let member = format!("c{c}-{incarnation}");
        let consumer = member_life(&world, &plan, c, &member).await;
        world.record(&format!("consumer-{c}"), EventKind::Left { member: member.clone() });
        let _ = consumer.leave().await;
    }
}

/// A consumer group of the run: `g` reads every topic; the shape lane may
/// add a second group with its own topics and assignor.
#[derive(Debug, Clone)]
struct GroupPlan {
    name: String,
    topics: Vec<String>,
    assignor: pb::Assignor,
    members: u32,
    /// Most bytes a poll asks for (0: the broker's default).
    poll_bytes_max: u64,
}

fn wire_assignor(choice: AssignorChoice) -> pb::Assignor {
    match choice {
        AssignorChoice::Sticky => pb::Assignor::Sticky,
        AssignorChoice::Range => pb::Assignor::Range,
        AssignorChoice::RoundRobin => pb::Assignor::RoundRobin,
    }
}

fn group_plans(scenario: &Scenario) -> Vec<GroupPlan> {
    let shape = scenario.shape.as_ref();
    let poll_bytes_max = shape.map_or(0, |s| s.poll_bytes_max);
    let mut plans = vec![GroupPlan {
        name: MAIN_GROUP.into(),
        topics: scenario.topics.iter().map(|t| t.name.clone()).collect(),
        // Seeds from before the shape lane let the group take its own.
        assignor: shape.map_or(pb::Assignor::Unspecified, |s| wire_assignor(s.assignor)),
        members: scenario.consumers,
        poll_bytes_max,
    }];
    if let Some(second) = shape.and_then(|s| s.second_group.as_ref()) {
        plans.push(GroupPlan {
            name: second.name.clone(),
            topics: second.topics.clone(),
            assignor: wire_assignor(second.assignor),
            members: second.members,
            poll_bytes_max,
        });
    }
    plans
}

/// One member from its join until it decides to leave; returns it then.
async fn member_life(world: &World, plan: &GroupPlan, c: u32, member: &str) -> Consumer {
    let member = member.to_string();
    let process = format!("consumer-{c}");
    let scenario = world.scenario.clone();
    let group = plan.name.clone();
    let mut rng = madsim::rand::thread_rng();
    let mut consumer = loop {
        let joined = Consumer::join_with_assignor(
            world.client(),
            &group,
            &member,
            plan.topics.clone(),
            scenario.session_timeout_ms,
            plan.assignor,
        )
        .await;
        match joined {
            Ok(consumer) => break consumer,
            Err(_) => madsim::time::sleep(Duration::from_millis(200)).await,
        }
    };
    consumer.set_poll_bytes_max(plan.poll_bytes_max);
    let mut acks = 0u32;
    let mut polls = 0u32;
    let mut positions: BTreeMap<(String, u32), u64> = BTreeMap::new();
    // The last offset polled per partition since the last acks.
    let mut pending: BTreeMap<(String, u32), (u64, u64)> = BTreeMap::new();
    // Partitions polled (even empty) per generation: the first poll claims.
    let mut claimed: BTreeSet<(u64, String, u32)> = BTreeSet::new();
    loop {
        if world.now_ms() < scenario.safety_ms && rng.gen_ratio(1, 200) {
            return consumer;
        }
        // The slow member (lane `slow_consumer`): few records a poll, long
        // processing, through the safety phase only.
        let slow = (group == MAIN_GROUP && c == 0 && world.now_ms() < scenario.safety_ms)
            .then_some(scenario.slow_consumer.as_ref())
            .flatten();
        let records_max = slow.map_or(100, |slow| slow.records_per_poll);
        let deliveries = match consumer.poll(records_max, Duration::from_millis(300)).await {
            Ok(deliveries) => deliveries,
            Err(_) => {
                madsim::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Polls stay in flight across calls: the one answered may have been
        // sent by an earlier call, and G5 judges it by when it was sent.
        let invoked_at_ms = consumer
            .last_poll_sent()
            .map_or_else(|| world.now_ms(), |sent| sent.duration_since(world.start).as_millis() as u64);
        // One poll serves the partitions one broker leads: record each.
        for (polled, generation) in consumer.last_polled() {
            let (topic, topic_id, partition) = (&polled.topic, polled.topic_id, polled.partition);
            let key = topic_key(topic, topic_id);
            let delivered: Vec<_> =
                deliveries.iter().filter(|d| d.topic == *topic && d.partition == partition).collect();
            // Record every partition polled with records, and the first
            // (claiming) poll of a generation on a partition even when empty.
            if !delivered.is_empty() || claimed.insert((*generation, key.clone(), partition)) {
                world.record(
                    &process,
                    EventKind::PollOk {
                        group: group.clone(),
                        member: member.clone(),
                        generation: *generation,
                        topic: key,
                        partition,
                        invoked_at_ms,
                        records: delivered.iter().map(|d| seen(&d.record)).collect(),
                    },
                );
            }
            if let Some(last) = delivered.last() {
                pending.insert((topic.clone(), partition), (last.record.offset, topic_id));
            }
        }
        if let Some(slow) = slow {
            madsim::time::sleep(Duration::from_millis(slow.pause_ms)).await;
        }
        polls += 1;
        if polls % scenario.ack_every_polls != 0 || pending.is_empty() {
            continue;
        }
        // Processing takes a while: a pause landing here makes a zombie.
        madsim::time::sleep(Duration::from_millis(rng.gen_range(0..200))).await;
        for ((topic, partition), (offset, topic_id)) in std::mem::take(&mut pending) {
            let ack = |offset: u64, hostile: bool, generation: u64| {
                let op = world.recorder.op();
                world.record(
                    &process,
                    EventKind::AckInvoke {
                        op,
                        group: group.clone(),
                        member: member.clone(),
                        generation,
                        topic: topic_key(&topic, topic_id),
                        partition,
                        offset,
                        hostile,
                    },
                );
                op
            };
            let op = ack(offset, false, consumer.generation());
            match consumer.ack_in(&topic, topic_id, partition, offset).await {
                Ok(Some(position)) => {
                    positions.insert((topic.clone(), partition), position);
                    world.record(&process, EventKind::AckOk { op, position });
                }
                Ok(None) => world.record(&process, EventKind::AckFenced { op }),
                Err(error) => world.record(&process, EventKind::AckFail { op, error: error.to_string() }),
            }
            acks += 1;
            if acks % scenario.hostile_ack_every == 0 {
                let position = positions.get(&(topic.clone(), partition)).copied().unwrap_or(0);
                let hostile = if rng.gen_bool(0.5) && position >= 2 { position - 2 } else { offset + 1_000 };
                let op = ack(hostile, true, consumer.generation());
                match consumer.ack_in(&topic, topic_id, partition, hostile).await {
                    Ok(Some(position)) => world.record(&process, EventKind::AckOk { op, position }),
                    Ok(None) => world.record(&process, EventKind::AckFenced { op }),
                    Err(error) => world.record(&process, EventKind::AckFail { op, error: error.to_string() }),
                }
            }
        }
    }
}

/// The shape lane's reader: through the safety phase, reads a random
/// partition from a random offset up to the high watermark it last saw,
/// with small record and byte budgets, and records what came back (G2
/// holds it against every other observer of those offsets).
async fn read_by_offset(world: World) {
    let client = world.client();
    let mut rng = madsim::rand::thread_rng();
    let topics = world.scenario.topics.clone();
    let mut high_watermarks: BTreeMap<(String, u32), u64> = BTreeMap::new();
    while world.now_ms() < world.scenario.safety_ms {
        madsim::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
        let topic = &topics[rng.gen_range(0..topics.len())];
        let partition = rng.gen_range(0..topic.partitions);
        let known = high_watermarks.get(&(topic.name.clone(), partition)).copied().unwrap_or(0);
        let offset = rng.gen_range(0..=known);
        let request = pb::ReadRequest {
            topic: topic.name.clone(),
            partition,
            offset,
            max_records: rng.gen_range(1..=20),
            max_bytes: if rng.gen_bool(0.5) { rng.gen_range(16..=256) } else { 0 },
            // Half from whichever replica the client asks (G2 holds what
            // a lagging follower serves too), half from the leader.
            any_replica: rng.gen_bool(0.5),
        };
        // Below the log start (retention) or a broker behind: refused.
        let Ok(read) = client.read(request).await else { continue };
        high_watermarks.insert((topic.name.clone(), partition), read.high_watermark);
        world.record(
            "reader",
            EventKind::ReadOk {
                topic: topic_key(&topic.name, topic_id_now(&world, &topic.name)),
                partition,
                offset,
                records: read.records.iter().map(seen).collect(),
            },
        );
    }
}

/// Every 200 ms, each live replica's committed group positions (for G4)
/// and claims (for G5), recorded when they change.
async fn sample_positions(world: World) {
    // Per (broker, replica life, topic, partition, group).
    type PerGroup<T> = BTreeMap<(u64, u64, String, u32, String), T>;
    // (position, high watermark)
    type Sampled = PerGroup<(u64, u64)>;
    let mut last = Sampled::new();
    // A replica moved off a broker and later back starts afresh: count the
    // replicas each broker incarnation had of a partition, so positions
    // are compared within one replica's life. (broker, topic, partition) ->
    // (replica number, present at the last sample)
    let mut replicas: BTreeMap<(u64, String, u32), (u64, bool)> = BTreeMap::new();
    let mut last_snapshots: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    let mut last_compacted: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    // The claim last recorded: member and generation.
    let mut last_claims: PerGroup<(String, u64)> = BTreeMap::new();
    loop {
        for broker in &world.brokers {
            let Some(node) = broker.node() else { continue };
            if let Some(fatal) = node.fatal_error() {
                if !broker.disk_failing.load(Ordering::SeqCst) {
                    world.record(
                        &format!("broker-{}", broker.id),
                        EventKind::NodeFailure { broker: broker.id, reason: fatal },
                    );
                    *broker.node.lock().expect("node slot") = None;
                }
                continue;
            }
            let incarnation = broker.incarnation.load(Ordering::SeqCst);
            let (built, installed) = node.snapshot_counts();
            let key = (broker.id, incarnation);
            if last_snapshots.get(&key).copied().unwrap_or((0, 0)) != (built, installed) {
                last_snapshots.insert(key, (built, installed));
                world.record(
                    &format!("broker-{}", broker.id),
                    EventKind::Snapshots { broker: broker.id, incarnation, built, installed },
                );
            }
            let compacted = node.log_usage().compacted_bytes;
            if last_compacted.get(&key).copied().unwrap_or(0) != compacted {
                last_compacted.insert(key, compacted);
                world.record(
                    &format!("broker-{}", broker.id),
                    EventKind::LogCompacted { broker: broker.id, incarnation, bytes: compacted },
                );
            }
            for topic in &world.scenario.topics {
                for partition in 0..topic.partitions {
                    let tp = TopicPartition::new(
                        TopicName::new(topic.name.as_str()).expect("topic name"),
                        PartitionIndex(partition),
                    );
                    let replica = replicas.entry((broker.id, topic.name.clone(), partition)).or_insert((0, false));
                    let (Some(state), Some(GroupId::Partition(_, topic_id))) =
                        (node.partition(&tp), node.partition_group(&tp))
                    else {
                        replica.1 = false;
                        continue;
                    };
                    let key_topic = topic_key(&topic.name, topic_id);
                    if !replica.1 {
                        *replica = (replica.0 + 1, true);
                    }
                    // Each replica's life is its own incarnation for G4.
                    let life = incarnation * 1_000 + replica.0;
                    for (group, held) in state.groups() {
                        // The lane's own fill groups claim with made-up
                        // generations; the workload's claims are G5's.
                        if let Some(claim) =
                            held.claim.as_ref().filter(|_| !group.as_str().starts_with(FILL_GROUP_PREFIX))
                        {
                            let key = (broker.id, life, key_topic.clone(), partition, group.to_string());
                            let now = (claim.member.to_string(), claim.generation.0);
                            if last_claims.get(&key) != Some(&now) {
                                world.record(
                                    &format!("broker-{}", broker.id),
                                    EventKind::ClaimSample {
                                        broker: broker.id,
                                        topic: key_topic.clone(),
                                        partition,
                                        group: group.to_string(),
                                        member: now.0.clone(),
                                        generation: now.1,
                                    },
                                );
                                last_claims.insert(key, now);
                            }
                        }
                        let position = state.group_position(group).0;
                        let high_watermark = state.high_watermark().0;
                        let key = (broker.id, life, key_topic.clone(), partition, group.to_string());
                        if last.insert(key, (position, high_watermark)) != Some((position, high_watermark)) {
                            world.record(
                                &format!("broker-{}", broker.id),
                                EventKind::PositionSample {
                                    broker: broker.id,
                                    incarnation: life,
                                    topic: key_topic.clone(),
                                    partition,
                                    group: group.to_string(),
                                    position,
                                    high_watermark,
                                },
                            );
                        }
                    }
                }
            }
        }
        madsim::time::sleep(Duration::from_millis(200)).await;
    }
}

type LaneFn = fn(World, Arc<AtomicBool>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

fn pick_fault(world: &World, rng: &mut impl Rng, lane: fn(FaultKind) -> bool) -> Option<FaultKind> {
    let kinds: Vec<FaultKind> = world.scenario.faults.iter().copied().filter(|k| lane(*k)).collect();
    (!kinds.is_empty()).then(|| kinds[rng.gen_range(0..kinds.len())])
}

/// A lane's next fault, after a pause drawn around the scenario's
/// interval; `None` once the safety phase is over or the lane has no kind.
async fn next_fault(
    world: &World,
    over: &AtomicBool,
    rng: &mut impl Rng,
    lane: fn(FaultKind) -> bool,
) -> Option<FaultKind> {
    if over.load(Ordering::SeqCst) {
        return None;
    }
    let interval = world.scenario.fault_interval_ms;
    madsim::time::sleep(Duration::from_millis(rng.gen_range(interval / 2..=interval * 3 / 2))).await;
    let kind = pick_fault(world, rng, lane)?;
    if over.load(Ordering::SeqCst) {
        return None;
    }
    // The run's fault budget, shared by every lane.
    world.faults_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).ok()?;
    Some(kind)
}

fn fault_duration(world: &World, rng: &mut impl Rng) -> Duration {
    let (low, high) = world.scenario.fault_duration_ms;
    Duration::from_millis(rng.gen_range(low..=high))
}

/// Segments of a simulated broker's log: small, so that runs roll them
/// and remove them.
const SIM_SEGMENT_BYTES: u64 = 256 * 1024;

/// Open a broker's store on its simulated disk.
fn open_store(disk: &NodeDisk) -> Result<Arc<NodeStore>, keel_server::storage::StoreError> {
    NodeStore::open_on_disk(disk, SIM_SEGMENT_BYTES)
}

/// Power cut: freeze the disk (madsim's kill runs destructors, which would
/// close redb cleanly), keep what the disk kept, kill the host. Then check
/// the kept image against what the broker reported persisted (G1 at the cut).
fn power_cut(world: &World, broker: &SimBroker, seed: u64) {
    let handle = Handle::current();
    let kept = {
        let mut disk = broker.disk.lock().expect("disk");
        disk.freeze();
        // Frozen: nothing more can be reported persisted.
        let image = disk.crash(seed);
        // Two exact copies of the image (nothing is pending on it): one to
        // restart from, one to inspect.
        *disk = image.crash(0);
        image.crash(1)
    };
    let marks = broker.store.lock().expect("store slot").take().map(|s| reported_durable(&s));
    handle.kill(broker.host);
    *broker.node.lock().expect("node slot") = None;
    if let Some((marks, votes)) = marks {
        let lost = persisted_but_lost(kept, &marks, &votes);
        world.record(
            &format!("broker-{}", broker.id),
            EventKind::PowerCut { broker: broker.id, groups: marks.len() as u64, lost },
        );
    }
}

/// Wait until `broker` stops on its failing disk (its node reports a
/// fatal error), at most `duration`.
async fn until_fatal(world: &World, broker: &SimBroker, duration: Duration) {
    let until = world.now_ms() + duration.as_millis() as u64;
    while world.now_ms() < until && broker.node().is_none_or(|n| n.fatal_error().is_none()) {
        madsim::time::sleep(Duration::from_millis(10)).await;
    }
}

/// After a disk fault: a moment later the disk works again (space freed,
/// device back) and the broker restarts, unless it left the cluster.
async fn restart_after_disk_fault(handle: &Handle, broker: &SimBroker, rng: &mut impl Rng) {
    madsim::time::sleep(Duration::from_millis(rng.gen_range(100..1_000))).await;
    broker.disk_failing.store(false, Ordering::SeqCst);
    if !broker.decommissioned.load(Ordering::SeqCst) {
        handle.restart(broker.host);
    }
}

/// kill -9, then check that what the process had written (page cache
/// included) holds every entry it reported persisted (G1 at the kill: a
/// store that reports what it never wrote). A restart that trusts
/// unsynced bytes shows only at a later power cut.
fn kill_and_check(world: &World, broker: &SimBroker) {
    let marks = broker.store.lock().expect("store slot").as_deref().map(reported_durable);
    let written = process_kill(broker);
    if let Some((marks, votes)) = marks {
        let lost = persisted_but_lost(written, &marks, &votes);
        world.record(
            &format!("broker-{}", broker.id),
            EventKind::Killed { broker: broker.id, groups: marks.len() as u64, lost },
        );
    }
}

/// kill -9: the process dies and the page cache keeps every write it
/// issued, synced or not; the broker restarts from that. Returns a copy of
/// what the process had written (page cache included),
/// to inspect.
fn process_kill(broker: &SimBroker) -> NodeDisk {
    let written = {
        let mut disk = broker.disk.lock().expect("disk");
        // Freezes the old handles: the dying process's destructors cannot
        // write (madsim's kill runs them).
        let killed = disk.kill();
        // A frozen handle still copies: one copy to restart from, one to
        // inspect.
        *disk = killed.kill();
        killed.kill()
    };
    broker.store.lock().expect("store slot").take();
    Handle::current().kill(broker.host);
    *broker.node.lock().expect("node slot") = None;
    written
}

/// What a store told Raft is durable: each group's entries reported
/// persisted and its last saved vote.
fn reported_durable(store: &NodeStore) -> (BTreeMap<String, PersistedMark>, BTreeMap<String, Vote>) {
    (store.ledger().persisted_marks(), store.ledger().saved_votes())
}

/// The groups whose entry the broker reported persisted is not in its
/// durable image (neither at its index nor purged behind a snapshot), or
/// whose saved vote the image holds no vote as new as.
fn persisted_but_lost(
    image: NodeDisk,
    marks: &BTreeMap<String, PersistedMark>,
    votes: &BTreeMap<String, Vote>,
) -> Vec<String> {
    if marks.is_empty() && votes.is_empty() {
        return Vec::new();
    }
    let opened = std::panic::catch_unwind(AssertUnwindSafe(|| open_store(&image)));
    let store = match opened {
        Ok(Ok(store)) => store,
        // DiskLost reports it when the broker restarts.
        _ => return Vec::new(),
    };
    let mut lost = Vec::new();
    if let Err(error) = store.check_live_bytes() {
        lost.push(format!("the durable image's segment accounting is off: {error}"));
    }
    for (group, mark) in marks {
        let (at, purged) = match store.log_entry_at(group, mark.index) {
            Ok(found) => found,
            Err(error) => {
                lost.push(format!("group {group}: the durable image does not read: {error}"));
                continue;
            }
        };
        let covered = purged.is_some_and(|p| p.index >= mark.index);
        let held = match mark.log_id {
            Some(log_id) => at == Some(log_id),
            None => at.is_some(),
        };
        if !(covered || held) {
            lost.push(format!(
                "group {group}: reported {} persisted, but the durable image holds {} at index {} (purged up to {})",
                mark.log_id.map_or_else(|| format!("index {}", mark.index), |l| l.to_string()),
                at.map_or_else(|| "nothing".to_string(), |l| l.to_string()),
                mark.index,
                purged.map_or_else(|| "none".to_string(), |p| p.to_string()),
            ));
        }
    }
    for (group, vote) in votes {
        match store.saved_vote(group) {
            Ok(Some(held)) if held >= *vote => {}
            Ok(held) => lost.push(format!(
                "group {group}: saved vote {vote}, but the durable image holds {}",
                held.map_or_else(|| "none".to_string(), |v| v.to_string())
            )),
            Err(error) => lost.push(format!("group {group}: the durable image's vote does not read: {error}")),
        }
    }
    store.close();
    lost
}

/// The leader of a random group (metadata or a partition), as any live
/// broker knows it.
fn some_leader(world: &World, rng: &mut impl Rng) -> Option<u64> {
    let nodes = world.live_nodes();
    let node = nodes.first()?;
    let groups = node.groups();
    // The first live broker may host no group at this instant.
    let group = groups.get(rng.gen_range(0..groups.len().max(1)));
    let leader =
        group.and_then(|g| nodes.iter().find_map(|n| n.raft(g).and_then(|r| r.metrics().borrow().current_leader)));
    leader.or_else(|| node.raft(&GroupId::Metadata).and_then(|r| r.metrics().borrow().current_leader))
}

/// The leader of a partition group drawn at random, if it has one.
/// The broker that leads, in its own view, a partition group drawn from
/// those the live brokers host, if it has one.
fn partition_leader(world: &World, rng: &mut impl Rng) -> Option<u64> {
    let nodes = world.live_nodes();
    let groups: Vec<GroupId> = nodes
        .iter()
        .flat_map(|n| n.groups())
        .filter(|g| matches!(g, GroupId::Partition(..)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let group = groups.get(rng.gen_range(0..groups.len().max(1)))?;
    let leads = |n: &&Node| n.raft(group).is_some_and(|r| r.metrics().borrow().current_leader == Some(n.id()));
    nodes.iter().find(leads).map(|n| n.id())
}

/// Crashes and pauses of one broker at a time, and power cuts of many.
fn lane_nodes(world: World, over: Arc<AtomicBool>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut rng = madsim::rand::thread_rng();
        let handle = Handle::current();
        let n = world.scenario.brokers;
        while let Some(kind) = next_fault(&world, &over, &mut rng, FaultKind::is_node_fault).await {
            let target = match kind {
                FaultKind::LeaderCrash => some_leader(&world, &mut rng).unwrap_or(1),
                _ => rng.gen_range(1..=n),
            };
            let duration = match kind {
                // Long enough for the current network fault to heal, then
                // for the failover check.
                FaultKind::LeaderCrash => {
                    fault_duration(&world, &mut rng) + FAILOVER_BOUND + Duration::from_millis(500)
                }
                _ => fault_duration(&world, &mut rng),
            };
            let up = members(&world);
            let targets: Vec<u64> = match kind {
                FaultKind::PowerLossMajority => {
                    let mut ids = up.clone();
                    for i in (1..ids.len()).rev() {
                        ids.swap(i, rng.gen_range(0..=i));
                    }
                    ids.truncate(up.len() / 2 + 1);
                    ids.sort();
                    ids
                }
                FaultKind::PowerLossAll => up,
                _ if !up.contains(&target) => continue,
                _ => vec![target],
            };
            let detail = match targets.as_slice() {
                [one] => format!("broker {one}"),
                many => format!("brokers {many:?}"),
            };
            world.record("faults", EventKind::Fault { kind: kind.name().into(), detail: detail.clone() });
            let brokers: Vec<SimBroker> = targets.iter().map(|t| world.brokers[*t as usize - 1].clone()).collect();
            match kind {
                FaultKind::Pause => {
                    handle.pause(brokers[0].host);
                    madsim::time::sleep(duration).await;
                    if !brokers[0].decommissioned.load(Ordering::SeqCst) {
                        handle.resume(brokers[0].host);
                    }
                }
                FaultKind::PowerLossMidWrite => {
                    let broker = &brokers[0];
                    // The power goes after a few more writes; the broker must
                    // stop on the failed write (or sync) rather than go on.
                    broker.disk_failing.store(true, Ordering::SeqCst);
                    broker.disk.lock().expect("disk").fail_after_writes(rng.gen_range(0..40));
                    let until = world.now_ms() + duration.as_millis() as u64;
                    while !broker.disk.lock().expect("disk").is_frozen() && world.now_ms() < until {
                        madsim::time::sleep(Duration::from_millis(1)).await;
                    }
                    power_cut(&world, broker, rng.gen());
                    restart_after_disk_fault(&handle, broker, &mut rng).await;
                }
                FaultKind::DiskFull => {
                    let broker = &brokers[0];
                    // The broker must stop on the failed write; nothing it
                    // reported persisted may be missing once it restarts
                    // from its disk (page cache intact, space freed).
                    broker.disk_failing.store(true, Ordering::SeqCst);
                    broker.disk.lock().expect("disk").fill();
                    until_fatal(&world, broker, duration).await;
                    // A store that went on past the failed write reports
                    // entries it never wrote.
                    kill_and_check(&world, broker);
                    restart_after_disk_fault(&handle, broker, &mut rng).await;
                }
                FaultKind::DiskFailure => {
                    let broker = &brokers[0];
                    // The broker must stop on the failed write or fsync;
                    // what it had not synced is gone (the failed fsync
                    // forgot it), so it restarts from its durable image,
                    // checked against what it reported persisted.
                    broker.disk_failing.store(true, Ordering::SeqCst);
                    broker.disk.lock().expect("disk").fail();
                    until_fatal(&world, broker, duration).await;
                    power_cut(&world, broker, rng.gen());
                    restart_after_disk_fault(&handle, broker, &mut rng).await;
                }
                FaultKind::Restart => {
                    let broker = &brokers[0];
                    // Stopped from its own host, as SIGTERM would: a stop
                    // that never ends holds this lane, and the run fails
                    // its liveness bound.
                    if let (Some(node), Some(host)) = (broker.node(), handle.get_node(broker.host)) {
                        let _ = host.spawn(async move { node.shutdown().await }).await;
                    }
                    // A clean stop closed the store: a power cut now keeps
                    // everything it reported persisted (G1 at the cut).
                    power_cut(&world, broker, rng.gen());
                    madsim::time::sleep(duration).await;
                    if !broker.decommissioned.load(Ordering::SeqCst) {
                        handle.restart(broker.host);
                    }
                }
                FaultKind::Kill => {
                    let broker = &brokers[0];
                    kill_and_check(&world, broker);
                    madsim::time::sleep(duration).await;
                    if !broker.decommissioned.load(Ordering::SeqCst) {
                        handle.restart(broker.host);
                    }
                }
                FaultKind::LeaderCrash => {
                    // The failover experiment: the network lane starts no
                    // new fault meanwhile, so that once the current one
                    // heals, the other replicas have a calm network to
                    // elect in.
                    let broker = &brokers[0];
                    let led = led_groups(broker);
                    world.failover_window.store(true, Ordering::SeqCst);
                    power_cut(&world, broker, rng.gen());
                    let until = world.now_ms() + duration.as_millis() as u64;
                    while world.network_faults.load(Ordering::SeqCst) % 2 == 1 && world.now_ms() < until {
                        madsim::time::sleep(Duration::from_millis(50)).await;
                    }
                    let calm_since = world.network_faults.load(Ordering::SeqCst);
                    if !led.is_empty() && world.now_ms() + (FAILOVER_BOUND.as_millis() as u64) < until {
                        madsim::time::sleep(FAILOVER_BOUND).await;
                        check_failover(&world, broker.id, &led, calm_since);
                    }
                    world.failover_window.store(false, Ordering::SeqCst);
                    madsim::time::sleep(Duration::from_millis(until.saturating_sub(world.now_ms()))).await;
                    if !broker.decommissioned.load(Ordering::SeqCst) {
                        handle.restart(broker.host);
                    }
                }
                _ => {
                    for broker in &brokers {
                        power_cut(&world, broker, rng.gen());
                    }
                    madsim::time::sleep(duration).await;
                    for broker in brokers.iter().filter(|b| !b.decommissioned.load(Ordering::SeqCst)) {
                        handle.restart(broker.host);
                    }
                }
            }
            world.record("faults", EventKind::Heal { kind: kind.name().into(), detail });
        }
    })
}

/// How soon the other replicas of a group must elect a leader after the
/// broker leading it crashed, with a calm network. openraft waits its
/// leader lease (0.8 s) and its election timeout (0.4-0.8 s) after the last
/// heartbeat, and 1.6 s more on a replica that has seen a longer log than
/// its own in an earlier election: up to 3.2 s, plus a 150 ms tick. A quiet
/// group's follower gives a silent broker up after 0.8 s, noticed within a
/// 250 ms round, waits at most 0.4 s more, one more round and then the same
/// timer, long expired. A lagging replica's candidacy, which the others
/// refuse, can cost one more timeout (found by seed 32000958, where no
/// group was quiet and the election took 3.3 s). A leader crash lasts
/// longer than this, so that every one is checked.
const FAILOVER_BOUND: Duration = Duration::from_secs(8);

/// The groups `broker` leads now, with their voters.
fn led_groups(broker: &SimBroker) -> Vec<(GroupId, BTreeSet<u64>)> {
    let Some(node) = broker.node() else { return Vec::new() };
    node.groups()
        .into_iter()
        .filter_map(|group| {
            let raft = node.raft(&group)?;
            let m = raft.metrics().borrow().clone();
            let voters = m.membership_config.membership().voter_ids().collect();
            (m.state == openraft::ServerState::Leader).then_some((group, voters))
        })
        .filter(|(_, voters): &(GroupId, BTreeSet<u64>)| voters.len() >= 3)
        .collect()
}

/// Failure detection: `FAILOVER_BOUND` after `crashed` went down leading
/// `led`, each group whose other replicas are all up, with the same voters
/// and a network calm since the crash, has a leader again.
fn check_failover(world: &World, crashed: u64, led: &[(GroupId, BTreeSet<u64>)], calm_since: u64) {
    let faults = world.network_faults.load(Ordering::SeqCst);
    if faults != calm_since || faults % 2 == 1 {
        return;
    }
    let up = members(world);
    let nodes = world.live_nodes();
    for (group, voters) in led {
        let others_up = voters.iter().filter(|v| **v != crashed).all(|v| up.contains(v));
        let replicas: Vec<(u64, openraft::RaftMetrics<u64, openraft::BasicNode>)> =
            nodes.iter().filter_map(|n| n.raft(group).map(|r| (n.id(), r.metrics().borrow().clone()))).collect();
        let same_voters = replicas.len() + 1 == voters.len()
            && replicas
                .iter()
                .all(|(_, m)| m.membership_config.membership().voter_ids().collect::<BTreeSet<_>>() == *voters);
        // Without the crashed voter, every configuration (two while a move
        // is under way) must keep a majority to elect: a group of one or
        // two voters does not (replication factors 1 and 2).
        let majority_left = replicas.first().is_some_and(|(_, m)| {
            m.membership_config.membership().get_joint_config().iter().all(|config| {
                let left = config.iter().filter(|v| **v != crashed).count();
                left * 2 > config.len()
            })
        });
        // A group whose topic was deleted since (or deleted and created
        // again, which makes new groups) is stopped, not failed over.
        let still_placed = match group {
            GroupId::Partition(partition, _) => {
                nodes.iter().all(|n| n.partition_group(partition).as_ref() == Some(group))
            }
            GroupId::Metadata => true,
        };
        if !others_up || !same_voters || !majority_left || !still_placed {
            continue;
        }
        let leader = replicas.iter().find(|(_, m)| m.state == openraft::ServerState::Leader).map(|(id, _)| *id);
        world.record(
            "driver",
            EventKind::Failover {
                broker: crashed,
                group: group.to_string(),
                leader,
                waited_ms: FAILOVER_BOUND.as_millis() as u64,
            },
        );
    }
}

/// Brokers that belong to the cluster now: the initial ones not shut down
/// for good, and the spare once told to join.
fn members(world: &World) -> Vec<u64> {
    world
        .brokers
        .iter()
        .filter(|b| !b.decommissioned.load(Ordering::SeqCst) && (!b.spare || b.joining.load(Ordering::SeqCst)))
        .map(|b| b.id)
        .collect()
}

/// Shut a removed broker down for good.
fn decommission(broker: &SimBroker) {
    broker.decommissioned.store(true, Ordering::SeqCst);
    Handle::current().kill(broker.host);
    *broker.node.lock().expect("node slot") = None;
    *broker.store.lock().expect("store slot") = None;
}

/// An operator at work: add the spare broker, then now and then move a
/// partition to other brokers, or drain a broker, remove it and shut it
/// down (while at least three brokers stay), all under the other lanes'
/// faults. Partitions are moved to replicas chosen at random among the
/// members, so a move replaces one replica or all of them.
fn lane_membership(
    world: World,
    over: Arc<AtomicBool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if !world.scenario.membership {
            return;
        }
        let mut rng = madsim::rand::thread_rng();
        let handle = Handle::current();
        let client = world.client();
        let record = |op: &str, detail: String, outcome: String| {
            world.record("operator", EventKind::Operator { op: op.into(), detail, outcome });
        };
        let outcome = |result: Result<String, keel_client::ClientError>| match result {
            Ok(ok) => ok,
            Err(error) => format!("failed: {error}"),
        };
        madsim::time::sleep(Duration::from_millis(rng.gen_range(1_000..4_000))).await;
        if let Some(spare) = world.brokers.iter().find(|b| b.spare) {
            spare.joining.store(true, Ordering::SeqCst);
            handle.restart(spare.host);
            record("add", format!("broker {}", spare.id), "started, joining".into());
        }
        let interval = world.scenario.fault_interval_ms;
        while !over.load(Ordering::SeqCst) {
            madsim::time::sleep(Duration::from_millis(rng.gen_range(interval..=interval * 3))).await;
            if over.load(Ordering::SeqCst) {
                break;
            }
            let Ok(cluster) = client.describe_cluster().await else { continue };
            let registered: Vec<u64> = cluster.brokers.iter().map(|b| b.id).collect();
            let up: Vec<u64> = members(&world).into_iter().filter(|b| registered.contains(b)).collect();
            // A removal leaves at least three brokers, and enough for the
            // widest topic to be created again (as an operator would).
            let widest = world.scenario.topics.iter().map(|t| t.replication_factor as usize).max().unwrap_or(3);
            if rng.gen_bool(0.6) || up.len() <= widest.max(3) {
                let topic = &world.scenario.topics[rng.gen_range(0..world.scenario.topics.len())];
                let partition = rng.gen_range(0..topic.partitions);
                let mut chosen = up.clone();
                for i in (1..chosen.len()).rev() {
                    chosen.swap(i, rng.gen_range(0..=i));
                }
                chosen.truncate(topic.replication_factor as usize);
                if chosen.len() < topic.replication_factor as usize {
                    continue;
                }
                let result = client.move_partition(&topic.name, partition, chosen.clone()).await;
                let detail = format!("{}/{partition} to brokers {chosen:?}", topic.name);
                record("move", detail, outcome(result.map(|p| format!("ok: replicas {:?}", p.replicas))));
            } else {
                let target = up[rng.gen_range(0..up.len())];
                let drained = client.drain_broker(target).await;
                record("drain", format!("broker {target}"), outcome(drained.map(|moved| format!("ok: {moved} moved"))));
                // Removal waits until every move off the broker settled.
                let deadline = world.now_ms() + 20_000;
                loop {
                    let removed = match client.remove_broker(target).await {
                        Ok(()) => Ok("ok; shut down for good".to_string()),
                        // Unknown to the metadata leader: an earlier
                        // attempt removed it and its answer was lost.
                        Err(keel_client::ClientError::Refused(status)) if status.code() == tonic::Code::NotFound => {
                            Ok(format!("ok (already removed: {}); shut down for good", status.message()))
                        }
                        // The answer to an earlier attempt may have been lost:
                        // the cluster says whether the broker is still in it.
                        // Asked of the metadata leader: a broker that lags
                        // (restarted, say) may not know the target yet, and
                        // it would be shut down while still a voter of a
                        // partition (sim seed 130006998: an acknowledged
                        // record left on one replica).
                        Err(error) => match client.describe_cluster_fresh().await {
                            Ok(cluster) if !cluster.brokers.iter().any(|b| b.id == target) => {
                                Ok("ok (an earlier attempt's answer was lost); shut down for good".to_string())
                            }
                            _ => Err(error),
                        },
                    };
                    match removed {
                        Ok(outcome) => {
                            record("remove", format!("broker {target}"), outcome);
                            decommission(&world.brokers[target as usize - 1]);
                            break;
                        }
                        Err(error) if world.now_ms() >= deadline || over.load(Ordering::SeqCst) => {
                            record("remove", format!("broker {target}"), format!("gave up: {error}"));
                            break;
                        }
                        Err(_) => madsim::time::sleep(Duration::from_millis(500)).await,
                    }
                }
            }
        }
    })
}

/// Entries no client could send: every so often a command that the
/// brokers' API would refuse at the edge is proposed straight to a group's
/// Raft log (as a bug, or another version of keel, could write it). The
/// state machines must record each as a rejection on every replica and
/// change nothing: a Hostile event whose `accepted` names any outcome that
/// applied (checked as a refusal). Under the other lanes' faults; this is
/// also how rejection kinds that the API edge keeps from the state
/// machines occur in the campaign.
///
/// Some rejections need a state to meet: a producer that has moved on, a
/// claim of a later member epoch, a limit already reached. Those entries
/// are built from the state the group's leader has applied, and an
/// operator's steps make the rest (a limit lowered to what the cluster
/// holds, then raised back; a group of the lane's own with a member).
fn lane_raw_entries(
    world: World,
    over: Arc<AtomicBool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if !world.scenario.hostile_clients {
            return;
        }
        let mut rng = madsim::rand::thread_rng();
        let entries = RawEntries::new(&world.scenario);
        let interval = world.scenario.fault_interval_ms;
        let mut filled = false;
        while !over.load(Ordering::SeqCst) {
            madsim::time::sleep(Duration::from_millis(rng.gen_range(interval..=interval * 2))).await;
            if over.load(Ordering::SeqCst) {
                break;
            }
            entries.clear_fills(&world).await;
            match rng.gen_range(0..17) {
                0..=6 => {
                    let (name, command) = entries.metadata[rng.gen_range(0..entries.metadata.len())].clone();
                    propose_raw(&world, &GroupId::Metadata, name, Command::Metadata(command)).await;
                }
                7..=11 => {
                    let tp = entries.partition_zero();
                    let Some(group) = world.live_nodes().iter().find_map(|node| node.partition_group(&tp)) else {
                        continue;
                    };
                    let (name, command) = if rng.gen_bool(0.5) {
                        entries.partition[rng.gen_range(0..entries.partition.len())].clone()
                    } else {
                        let Some(leader) = leader_of(&world, &group).await else { continue };
                        // The same incarnation of the topic as the group's.
                        if leader.partition_group(&tp).as_ref() != Some(&group) {
                            continue;
                        }
                        let Some(state) = leader.partition(&tp) else { continue };
                        match entries.against_partition_state(&state, &mut rng) {
                            Some(entry) => entry,
                            None => continue,
                        }
                    };
                    propose_raw(&world, &group, name, Command::Partition(command)).await;
                }
                12 => entries.commit_at_the_end(&world).await,
                13 => entries.held_group(&world, &over).await,
                14..=15 => entries.limit_reached(&world, &over, &mut rng).await,
                _ => {
                    filled = true;
                    entries.partition_groups_reached(&world, &over).await
                }
            }
        }
        if filled {
            let detached = world.detached.clone();
            let clearing = madsim::task::spawn(async move {
                for _ in 0..CLEAR_ROUNDS_AFTER {
                    entries.clear_fills(&world).await;
                    madsim::time::sleep(Duration::from_millis(500)).await;
                }
            });
            detached.lock().expect("detached").push(clearing);
        }
    })
}

/// What the raw-entries lane proposes.
struct RawEntries {
    topic: String,
    /// Refused in any state (bar the conditions each names).
    metadata: Vec<(&'static str, keel_core::metadata::MetadataCommand)>,
    partition: Vec<(&'static str, keel_core::partition::PartitionCommand)>,
    /// Registered brokers and topics stay as set up (no membership or
    /// topic lane), so a limit lowered to them is met for certain.
    fixed_brokers: bool,
    fixed_topics: bool,
}

impl RawEntries {
    fn new(scenario: &Scenario) -> Self {
        use keel_core::metadata::{MetadataCommand, RetentionPolicy};
        use keel_core::partition::PartitionCommand;
        use keel_core::record::{Header, Record};
        let topic = scenario.topics[0].name.clone();
        let topics = || vec![topic.clone()];
        let create = |name: &str, partitions: u32, replication_factor: u32| MetadataCommand::CreateTopic {
            topic: name.into(),
            partitions,
            replication_factor,
            retention: RetentionPolicy::default(),
        };
        let join = |topics: Vec<String>, session_timeout_ms: u64| MetadataCommand::JoinGroup {
            group: "zz-raw".into(),
            member: "raw-member".into(),
            topics,
            session_timeout_ms,
            assignor: None,
        };
        let limits = keel_core::Limits::default();
        let mut metadata: Vec<(&str, MetadataCommand)> = vec![
            ("a topic with an invalid name", create("bad name!", 1, 1)),
            ("a topic of 0 partitions", create("zz-raw-none", 0, 1)),
            ("a topic of replication factor 8", create("zz-raw-wide", 1, 8)),
            // At most 5 brokers and a spare: 7 replicas cannot be placed.
            ("a topic of more replicas than brokers", create("zz-raw-placed", 1, limits.replication_factor_max)),
            (
                "a broker at an unusable address",
                MetadataCommand::RegisterBroker {
                    broker: keel_core::BrokerId(200),
                    address: "no where:7000".into(),
                    internal_address: "no where:7100".into(),
                },
            ),
            (
                "a move of a partition that does not exist",
                MetadataCommand::MoveReplicas {
                    topic: topic.clone(),
                    partition: PartitionIndex(5_000),
                    replicas: vec![keel_core::BrokerId(1)],
                },
            ),
            (
                "a move to no replica",
                MetadataCommand::MoveReplicas { topic: topic.clone(), partition: PartitionIndex(0), replicas: vec![] },
            ),
            ("a join with no subscription", join(vec![], 10_000)),
            ("a join to 65 topics", join((0..65).map(|i| format!("t{i}")).collect(), 10_000)),
            ("a join with a 1 ms session", join(topics(), 1)),
            ("an unknown setting", MetadataCommand::SetLimit { name: "no_such_setting".into(), value: 1 }),
            // Three or more brokers are registered from the setup on.
            ("brokers_max below the brokers held", MetadataCommand::SetLimit { name: "brokers_max".into(), value: 1 }),
            ("a group deletion of an invalid name", MetadataCommand::DeleteGroup { group: "bad name!".into() }),
            (
                "1,025 settled moves in one report",
                MetadataCommand::MovesSettled {
                    topic: topic.clone(),
                    topic_id: 1,
                    partitions: (0..1_025).map(|p| (PartitionIndex(p), 1)).collect(),
                },
            ),
            // No group was ever empty since the end of time.
            (
                "a forget of a group not empty since",
                MetadataCommand::ForgetGroup {
                    group: MAIN_GROUP.into(),
                    empty_since: keel_core::TimestampMs(u64::MAX),
                },
            ),
            ("a deletion of a user that does not exist", MetadataCommand::DeleteUser { user: "zz-raw-nobody".into() }),
        ];
        // Every broker holds every partition of a topic as wide as the
        // cluster, so broker 1's replicas have nowhere to go (while no
        // broker is added, and the topic is not deleted).
        let fixed_brokers = !scenario.membership;
        let fixed_topics = !scenario.topic_lifecycle;
        let as_wide_as_the_cluster =
            scenario.topics.iter().any(|t| u64::from(t.replication_factor) == scenario.brokers);
        if fixed_brokers && fixed_topics && as_wide_as_the_cluster {
            metadata
                .push(("a drain with nowhere to go", MetadataCommand::DrainBroker { broker: keel_core::BrokerId(1) }));
        }
        let many_headers = Record {
            headers: (0..65).map(|i| Header { key: format!("h{i}"), value: Vec::new() }).collect(),
            ..Record::from_value(b"raw".to_vec())
        };
        let one_record = || vec![Record::from_value(b"raw".to_vec())];
        // Records each within the record limit, together over the batch's.
        let value_max = limits.record_value_bytes_max as usize;
        let large = (0..=limits.batch_bytes_max as usize / value_max).map(|_| Record::from_value(vec![0; value_max]));
        let partition: Vec<(&str, PartitionCommand)> = vec![
            ("an empty batch", PartitionCommand::Append { producer: None, records: vec![] }),
            (
                "a batch of one record more than the limit",
                PartitionCommand::Append {
                    producer: None,
                    records: vec![Record::default(); limits.batch_records_max as usize + 1],
                },
            ),
            (
                "a batch of more bytes than the limit",
                PartitionCommand::Append { producer: None, records: large.collect() },
            ),
            (
                "an entry of one batch more than the limit",
                PartitionCommand::AppendBatches {
                    batches: (0..=keel_core::partition::APPEND_BATCHES_MAX)
                        .map(|_| keel_core::partition::AppendBatch { producer: None, records: one_record() })
                        .collect(),
                },
            ),
            ("a record of 65 headers", PartitionCommand::Append { producer: None, records: vec![many_headers] }),
            (
                "a reset of a group with an invalid name",
                PartitionCommand::ResetPosition { group: "bad name!".into(), position: keel_core::Offset(0) },
            ),
            (
                "a reset far beyond the log",
                PartitionCommand::ResetPosition { group: "zz-raw".into(), position: keel_core::Offset(1 << 40) },
            ),
        ];
        RawEntries { topic, metadata, partition, fixed_brokers, fixed_topics }
    }

    fn partition_zero(&self) -> TopicPartition {
        TopicPartition::new(
            TopicName::new(&self.topic).expect("the scenario's topic names are valid"),
            PartitionIndex(0),
        )
    }

    /// An entry refused given what the partition's leader has applied (and
    /// anything applied after it): an old sequence of a producer that has
    /// moved on, or a commit by the claiming member under an older epoch.
    fn against_partition_state(
        &self,
        state: &keel_core::partition::PartitionState,
        rng: &mut impl Rng,
    ) -> Option<(&'static str, keel_core::partition::PartitionCommand)> {
        use keel_core::partition::{PartitionCommand, ProducerBatch};
        use keel_core::record::Record;
        use keel_core::Sequence;
        let pick = rng.gen_range(0..3);
        if pick == 0 {
            // Every tracked group was used since the start of time; one not
            // tracked any more is forgotten again, changing nothing.
            let group = state.groups().keys().next()?;
            let command = PartitionCommand::ForgetIdleGroup { group: group.to_string(), idle_ms: u64::MAX };
            return Some(("a forget of a group in use", command));
        }
        if pick == 1 {
            // Sequence 1 is neither next (the last is beyond) nor remembered
            // (the last few are): too old, or the producer was forgotten
            // meanwhile (unknown at a sequence other than 0).
            let remembered = u64::from(state.limits().producer_batches_remembered_max);
            let (producer, _) = state
                .producers()
                .iter()
                .find(|(_, s)| s.last_sequence().is_some_and(|last| last.0 > remembered + 2))?;
            let producer = Some(ProducerBatch { producer: *producer, sequence: Sequence(1) });
            let records = vec![Record::from_value(b"raw".to_vec())];
            return Some(("a producer's old sequence resent", PartitionCommand::Append { producer, records }));
        }
        // The claim's member under epoch 0 (below every join's), or in the
        // generation before the claim's; the offset is beyond any log.
        let (group, claim) = state.groups().iter().find_map(|(g, p)| p.claim.as_ref().map(|c| (g, c)))?;
        let older_generation = rng.gen_bool(0.5) && claim.generation.0 > 0;
        let (name, generation, member_epoch) = if older_generation {
            ("a commit of an older generation", keel_core::Generation(claim.generation.0 - 1), claim.member_epoch)
        } else {
            ("a commit under an older member epoch", claim.generation, 0)
        };
        let member = claim.member.as_str().to_string();
        let offset = keel_core::Offset(u64::MAX);
        Some((name, PartitionCommand::Commit { group: group.to_string(), member, generation, member_epoch, offset }))
    }

    /// A group of the lane's own with a member: it may not be deleted or
    /// forgotten, nor joined with another assignor, while the member lasts
    /// (its session may lapse meanwhile under faults and clock steps, so
    /// each step may also apply). Then the member leaves and the group goes.
    async fn held_group(&self, world: &World, over: &AtomicBool) {
        use keel_core::assignor::AssignorKind;
        use keel_core::metadata::MetadataCommand;
        let group = "zz-raw-held";
        let join = |member: &str, assignor| MetadataCommand::JoinGroup {
            group: group.into(),
            member: member.into(),
            topics: vec![self.topic.clone()],
            session_timeout_ms: 60_000,
            assignor,
        };
        let steps = [
            join("raw-holder", None),
            MetadataCommand::DeleteGroup { group: group.into() },
            join("raw-other", Some(AssignorKind::Range)),
            MetadataCommand::LeaveGroup { group: group.into(), member: "raw-other".into() },
            MetadataCommand::LeaveGroup { group: group.into(), member: "raw-holder".into() },
            MetadataCommand::DeleteGroup { group: group.into() },
        ];
        // The faults heal only once the lanes end: no step past that.
        for step in steps {
            if over.load(Ordering::SeqCst) {
                return;
            }
            propose_to_leader(world, &GroupId::Metadata, &Command::Metadata(step)).await;
        }
    }

    /// An operator lowers a limit to what the cluster holds, an entry then
    /// goes beyond it, the limit is raised back and what the lane added is
    /// taken out. The count of brokers and of topics is fixed in some
    /// scenarios: there the entry must be refused. Groups and members come
    /// and go, so one beyond the limit may be admitted (members and groups
    /// the limit holds out meanwhile join again: clients retry).
    async fn limit_reached(&self, world: &World, over: &AtomicBool, rng: &mut impl Rng) {
        use keel_core::metadata::{MetadataCommand, RetentionPolicy};
        let Some(leader) = leader_of(world, &GroupId::Metadata).await else { return };
        let state = leader.metadata();
        let join = |group: &str, member: String| MetadataCommand::JoinGroup {
            group: group.into(),
            member,
            topics: vec![self.topic.clone()],
            session_timeout_ms: 60_000,
            assignor: None,
        };
        let leave = |group: &str, member: String| MetadataCommand::LeaveGroup { group: group.into(), member };
        // (setting, what the cluster holds, steps to get there, the entry
        // beyond, what to take out after, whether it must be refused)
        let (setting, held, before, beyond, after, must_refuse) = match rng.gen_range(0..4) {
            0 if self.fixed_brokers && state.brokers().len() as u64 == world.scenario.brokers => (
                "brokers_max",
                state.brokers().len() as u64,
                vec![],
                MetadataCommand::RegisterBroker {
                    broker: keel_core::BrokerId(200),
                    address: "10.9.9.9:7000".into(),
                    internal_address: "10.9.9.9:7100".into(),
                },
                vec![MetadataCommand::RemoveBroker { broker: keel_core::BrokerId(200) }],
                true,
            ),
            1 if self.fixed_topics && state.topics().len() == world.scenario.topics.len() => (
                "topics_max",
                state.topics().len() as u64,
                vec![],
                MetadataCommand::CreateTopic {
                    topic: "zz-raw-over".into(),
                    partitions: 1,
                    replication_factor: 1,
                    retention: RetentionPolicy::default(),
                },
                vec![MetadataCommand::DeleteTopic { topic: "zz-raw-over".into() }],
                true,
            ),
            2 => (
                "groups_max",
                state.groups().len() as u64,
                vec![],
                join("zz-raw-over", "raw-member".into()),
                vec![
                    leave("zz-raw-over", "raw-member".into()),
                    MetadataCommand::DeleteGroup { group: "zz-raw-over".into() },
                ],
                false,
            ),
            3 => {
                // A group of the lane's own, larger than any the workload
                // makes (its consumers all in one), so that only the lane's
                // own join meets the limit.
                let held = state.groups().values().map(|g| g.members.len() as u64).max().unwrap_or(0);
                let largest = held.max(u64::from(world.scenario.consumers) + 1);
                if largest > 8 {
                    return;
                }
                let crowd = |i: u64| format!("raw-crowd-{i}");
                let mut after: Vec<_> = (0..=largest).map(|i| leave("zz-raw-crowd", crowd(i))).collect();
                after.push(MetadataCommand::DeleteGroup { group: "zz-raw-crowd".into() });
                (
                    "members_per_group_max",
                    largest,
                    (0..largest).map(|i| join("zz-raw-crowd", crowd(i))).collect(),
                    join("zz-raw-crowd", crowd(largest)),
                    after,
                    false,
                )
            }
            _ => return,
        };
        // Raised back to the default, which no other lane changes where
        // these run (the topic lane's topics_max runs without fixed topics):
        // a leader cut off from the rest may still show a lowered value.
        let Some(previous) = keel_core::Limits::default().setting(setting) else { return };
        for command in before {
            if over.load(Ordering::SeqCst) {
                return;
            }
            propose_to_leader(world, &GroupId::Metadata, &Command::Metadata(command)).await;
        }
        let lower = Command::Metadata(MetadataCommand::SetLimit { name: setting.into(), value: held });
        let lowered = propose_to_leader(world, &GroupId::Metadata, &lower).await;
        world.record(
            "raw-entries",
            EventKind::Operator {
                op: "set-config".into(),
                detail: format!("{setting} {held}"),
                outcome: format!("{lowered:?}"),
            },
        );
        if matches!(lowered, Some(Applied::Metadata(Ok(_)))) {
            let applied = propose_to_leader(world, &GroupId::Metadata, &Command::Metadata(beyond)).await;
            if must_refuse {
                let accepted = match &applied {
                    Some(Applied::Metadata(Ok(outcome))) => Some(format!("{outcome:?}")),
                    _ => None,
                };
                let attack = format!("raw entry: one beyond {setting} = {held}");
                world.record("raw-entries", EventKind::Hostile { attack, accepted });
            }
        }
        // Raised back whatever came of the rest (a lowering whose answer
        // was lost may still apply), until some leader applies it, or a
        // lower limit would keep the workload's groups out for good.
        // The lanes end (and the faults heal) only once this lane returns,
        // so past the end of the safety phase the rest is left to a task.
        let raise = Command::Metadata(MetadataCommand::SetLimit { name: setting.into(), value: previous });
        let applied = |raised: Option<Applied>| matches!(raised, Some(Applied::Metadata(Ok(_))));
        while !applied(propose_to_leader(world, &GroupId::Metadata, &raise).await) {
            if over.load(Ordering::SeqCst) {
                let raiser = world.clone();
                let raising = madsim::task::spawn(async move {
                    for _ in 0..RAISE_ATTEMPTS {
                        if applied(propose_to_leader(&raiser, &GroupId::Metadata, &raise).await) {
                            break;
                        }
                        madsim::time::sleep(Duration::from_millis(500)).await;
                    }
                });
                world.detached.lock().expect("detached").push(raising);
                return;
            }
            madsim::time::sleep(Duration::from_millis(500)).await;
        }
        for command in after {
            if over.load(Ordering::SeqCst) {
                return;
            }
            propose_to_leader(world, &GroupId::Metadata, &Command::Metadata(command)).await;
        }
    }

    /// The partition's groups limit, which the cluster sets once for good
    /// ([`RAW_GROUPS_PER_PARTITION`] here): claims by groups of the lane's
    /// own fill partition 0 of the first topic up to it, one more is
    /// refused (unless a group went meanwhile), and the lane's groups are
    /// forgotten again, as they would keep any new group of the workload
    /// out.
    /// A commit of the offset at the high watermark (one past the last
    /// record) by a claiming member of the lane's own group, which must be
    /// refused unless records came meanwhile. A position found past the
    /// leader's high watermark after the commit applied was past it when
    /// it applied (the high watermark only grows): accepted, it must not
    /// be. The group is one of the lane's fill groups, cleared with them.
    async fn commit_at_the_end(&self, world: &World) {
        use keel_core::partition::{PartitionCommand, PartitionOutcome};
        let tp = self.partition_zero();
        let Some(group) = world.live_nodes().iter().find_map(|node| node.partition_group(&tp)) else { return };
        let current = |node: &Node| node.partition(&tp).filter(|_| node.partition_group(&tp).as_ref() == Some(&group));
        let Some(leader) = leader_of(world, &group).await else { return };
        let Some(state) = current(&leader) else { return };
        let name = format!("{FILL_GROUP_PREFIX}hw");
        let (generation, member_epoch) = (keel_core::Generation(1), 1);
        let claim = PartitionCommand::Claim { group: name.clone(), member: "raw-hw".into(), generation, member_epoch };
        if !matches!(
            propose_to_leader(world, &group, &Command::Partition(claim)).await,
            Some(Applied::Partition(Ok(PartitionOutcome::Claimed { .. })))
        ) {
            return;
        }
        let offset = state.high_watermark();
        let commit =
            PartitionCommand::Commit { group: name.clone(), member: "raw-hw".into(), generation, member_epoch, offset };
        let applied = propose_to_leader(world, &group, &Command::Partition(commit)).await;
        let Some(Applied::Partition(Ok(PartitionOutcome::Committed { position }))) = applied else {
            world.record(
                "raw-entries",
                EventKind::Hostile { attack: "raw entry: a commit at the high watermark".into(), accepted: None },
            );
            return;
        };
        // Judged on a replica that has applied the commit: its high
        // watermark is at least what it was when the commit applied (a
        // replica behind, such as a leader just restarted, could show less).
        let Ok(group_name) = keel_core::GroupName::new(&name) else { return };
        let accepted = world.live_nodes().iter().filter_map(current).find_map(|state| {
            let applied = state.groups().get(&group_name).and_then(|g| g.position)?;
            (applied == position && position > state.high_watermark())
                .then(|| format!("position {position} past the high watermark {}", state.high_watermark()))
        });
        world.record(
            "raw-entries",
            EventKind::Hostile { attack: "raw entry: a commit at the high watermark".into(), accepted },
        );
    }

    async fn partition_groups_reached(&self, world: &World, over: &AtomicBool) {
        use keel_core::partition::{PartitionCommand, PartitionRejection};
        let tp = self.partition_zero();
        let Some(group) = world.live_nodes().iter().find_map(|node| node.partition_group(&tp)) else { return };
        let Some(leader) = leader_of(world, &group).await else { return };
        let Some(state) = leader.partition(&tp).filter(|_| leader.partition_group(&tp).as_ref() == Some(&group)) else {
            return;
        };
        let room = (state.limits().groups_per_partition_max as usize).saturating_sub(state.groups().len());
        if room > RAW_GROUPS_PER_PARTITION as usize {
            return;
        }
        for i in 0..=room {
            if over.load(Ordering::SeqCst) {
                break;
            }
            let claim = PartitionCommand::Claim {
                group: format!("{FILL_GROUP_PREFIX}{i}"),
                member: "raw-filler".into(),
                generation: keel_core::Generation(1),
                member_epoch: 1,
            };
            let applied = propose_to_leader(world, &group, &Command::Partition(claim)).await;
            if matches!(applied, Some(Applied::Partition(Err(PartitionRejection::TooManyGroups { .. })))) {
                break;
            }
        }
        // A claim whose answer was lost may still apply after its group
        // was forgotten: the lane clears its groups again each round, and
        // for a while after the faults end (`clear_fills`).
        while !over.load(Ordering::SeqCst) && !self.clear_fills(world).await {
            madsim::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Forget every group the lane filled a partition with that its
    /// leader still tracks: whether it tracks none now.
    async fn clear_fills(&self, world: &World) -> bool {
        let tp = self.partition_zero();
        let Some(group) = world.live_nodes().iter().find_map(|node| node.partition_group(&tp)) else { return true };
        let Some(leader) = leader_of(world, &group).await else { return false };
        let Some(state) = leader.partition(&tp).filter(|_| leader.partition_group(&tp).as_ref() == Some(&group)) else {
            return false;
        };
        let fills: Vec<String> =
            state.groups().keys().map(|g| g.to_string()).filter(|g| g.starts_with(FILL_GROUP_PREFIX)).collect();
        let mut cleared = true;
        for fill in fills {
            let forget = Command::Partition(keel_core::partition::PartitionCommand::ForgetGroup { group: fill });
            cleared &= matches!(propose_to_leader(world, &group, &forget).await, Some(Applied::Partition(Ok(_))));
        }
        cleared
    }
}

/// How often the raw-entries lane asks for a lowered limit to be raised
/// back, 500 ms apart (past the end of the faults, it takes one).
const RAISE_ATTEMPTS: u32 = 600;

/// The groups a partition may track (`groups_per_partition_max`) in a
/// cluster with the raw-entries lane: the workload's own groups on one
/// partition are fewer than half of it (the main group, the audit group, a
/// second group and the hostile clients' forgeries, which are refused
/// before they claim).
pub const RAW_GROUPS_PER_PARTITION: u32 = 12;

/// How often, 500 ms apart, the raw-entries lane clears the groups it
/// filled a partition with once the faults have ended (a claim whose answer
/// was lost may apply late, while the cluster settles): a minute.
const CLEAR_ROUNDS_AFTER: u32 = 120;

/// The live node that leads `group`, as it sees itself.
async fn leader_of(world: &World, group: &GroupId) -> Option<Node> {
    for node in world.live_nodes() {
        let Some(raft) = node.raft(group) else { continue };
        if raft.current_leader().await == Some(node.id()) {
            return Some(node);
        }
    }
    None
}

/// Propose `command` to `group`'s leader, wherever it is (none during an
/// election): what it applied, if a leader answered within 2 s.
async fn propose_to_leader(world: &World, group: &GroupId, command: &Command) -> Option<Applied> {
    for node in world.live_nodes() {
        let proposed = node.propose(group, command.clone());
        if let Ok(Ok(applied)) = madsim::time::timeout(Duration::from_secs(2), proposed).await {
            return Some(applied);
        }
    }
    None
}

/// Propose an entry that must be refused, and record what came of it.
async fn propose_raw(world: &World, group: &GroupId, name: &str, command: Command) {
    let Some(applied) = propose_to_leader(world, group, &command).await else { return };
    let accepted = match applied {
        Applied::Metadata(Err(_)) | Applied::Partition(Err(_)) => None,
        // Forgetting a group that is not tracked changes nothing.
        Applied::Partition(Ok(keel_core::partition::PartitionOutcome::GroupForgotten { had_position: false })) => None,
        other => Some(format!("{other:?}")),
    };
    world.record("raw-entries", EventKind::Hostile { attack: format!("raw entry: {name}"), accepted });
}

/// A client that lies: every so often one request that must be refused
/// (a forged ack or poll, or a malformed produce). Forged acks are
/// recorded as hostile acks, so G4 also checks that none moved a position.
fn lane_hostile(
    world: World,
    over: Arc<AtomicBool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        use keel_client::Route;
        let mut rng = madsim::rand::thread_rng();
        // Short deadlines: a refusal comes at once, and the lane goes on.
        let policy = RetryPolicy {
            deadline: Duration::from_secs(2),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            jitter_seed: Some(rng.gen()),
            request_timeout: Duration::from_secs(1),
            give_up_when_unreachable: false,
        };
        let brokers = (1..=world.scenario.brokers).map(|id| broker_address(id).to_string()).collect();
        let brokers: Vec<String> = brokers;
        // One client per identity: a client's credentials are its own.
        let new_client = || Client::new(brokers.clone(), policy).expect("broker addresses");
        let client = world.as_user(new_client(), APP_USER, APP_SECRET);
        let intruders = Intruders {
            intruder: world.as_user(new_client(), INTRUDER, INTRUDER_SECRET),
            wrong_secret: world.as_user(new_client(), APP_USER, "not-the-secret"),
            anonymous: new_client(),
        };
        let process = "hostile";
        // One client per broker, for a zombie's poll where that broker's
        // metadata lags.
        let at_broker: BTreeMap<u64, Client> = (1..=world.scenario.brokers)
            .map(|id| {
                (
                    id,
                    world.as_user(
                        Client::new(vec![broker_address(id).to_string()], policy).expect("an address"),
                        APP_USER,
                        APP_SECRET,
                    ),
                )
            })
            .collect();
        // The brokers-only split the group was last moved on in.
        let mut moved_on_in = 0;
        while !over.load(Ordering::SeqCst) {
            madsim::time::sleep(Duration::from_millis(rng.gen_range(300..1_500))).await;
            let split = world.brokers_splits.load(Ordering::SeqCst);
            if world.brokers_split_on.load(Ordering::SeqCst)
                && split != moved_on_in
                && move_the_group_on(&world, &client).await
            {
                moved_on_in = split;
            }
            zombie_poll(&world, &at_broker).await;
            let topic = world.scenario.topics[rng.gen_range(0..world.scenario.topics.len())].clone();
            let partition = rng.gen_range(0..topic.partitions);
            if world.scenario.access_control && rng.gen_bool(0.4) {
                let (attack, accepted) = intrude(&intruders, &topic, partition, &mut rng).await;
                world.record(process, EventKind::Hostile { attack, accepted });
                continue;
            }
            let Ok(group) = client.describe_group("g").await else { continue };
            let real = group.members.first().map(|m| m.member.clone());
            // Who the forgery claims to be: a stranger, or a real member
            // without its epoch.
            let (member, member_epoch) = match (&real, rng.gen_bool(0.5)) {
                (Some(real), true) => (real.clone(), u64::MAX / 2),
                _ => (format!("intruder-{}", rng.gen_range(0..3)), 1),
            };
            // The generation it claims: one the group has left behind (a
            // zombie that missed a rebalance, what G5 is about), the
            // current one, or one not reached yet.
            let generation = match rng.gen_range(0..10) {
                0..=2 => group.generation.saturating_sub(1),
                3..=6 => group.generation,
                _ => group.generation + 1,
            };
            let route = Route::Partition(topic.name.clone(), partition);
            match rng.gen_range(0..5) {
                4 => {
                    // A second process with a real member's id: its join
                    // fences the first (a new member epoch), which must
                    // then rejoin; it polls but never acknowledges (what it
                    // reads is delivered again), then walks away.
                    let Some(real) = real else { continue };
                    let topics: Vec<String> = world.scenario.topics.iter().map(|t| t.name.clone()).collect();
                    let session = world.scenario.session_timeout_ms;
                    let outcome = match Consumer::join(client.clone(), "g", &real, topics, session).await {
                        Ok(mut impostor) => {
                            let mut polled = 0;
                            for _ in 0..rng.gen_range(1..4) {
                                if let Ok(records) = impostor.poll(10, Duration::from_millis(200)).await {
                                    polled += records.len();
                                }
                            }
                            format!("joined at epoch {}, polled {polled} records", impostor.member_epoch())
                        }
                        Err(error) => format!("not joined: {error}"),
                    };
                    world.record(
                        process,
                        EventKind::Operator { op: "impostor".into(), detail: format!("member {real} of g"), outcome },
                    );
                }
                0 => {
                    let position = client.group_position("g", &topic.name, partition).await.ok();
                    let offset = position.map_or(0, |p| p.high_watermark.saturating_sub(1));
                    let op = world.recorder.op();
                    world.record(
                        process,
                        EventKind::AckInvoke {
                            op,
                            group: MAIN_GROUP.into(),
                            member: member.clone(),
                            generation,
                            topic: topic_key(&topic.name, topic_id_now(&world, &topic.name)),
                            partition,
                            offset,
                            hostile: true,
                        },
                    );
                    let request = pb::AckRequest {
                        group: "g".into(),
                        member: member.clone(),
                        generation,
                        topic: topic.name.clone(),
                        partition,
                        offset,
                        member_epoch,
                        topic_id: None,
                    };
                    let answer = client
                        .call(route, |mut c| {
                            let r = request.clone();
                            async move { c.ack(r).await }
                        })
                        .await;
                    match answer {
                        Ok(reply) => world.record(process, EventKind::AckOk { op, position: reply.position }),
                        Err(error) => world.record(process, EventKind::AckFail { op, error: error.to_string() }),
                    }
                }
                1 => {
                    let request = pb::PollRequest {
                        group: "g".into(),
                        member: member.clone(),
                        generation,
                        topic: topic.name.clone(),
                        partition,
                        max_records: 10,
                        max_bytes: 1 << 20,
                        max_wait_ms: 0,
                        offset: None,
                        member_epoch,
                        ..Default::default()
                    };
                    let answer = client
                        .call(route, |mut c| {
                            let r = request.clone();
                            async move { c.poll(r).await }
                        })
                        .await;
                    let attack = format!(
                        "poll of {}/{partition} as {member} (epoch {member_epoch}, generation {generation})",
                        topic.name
                    );
                    let accepted = answer.ok().map(|reply| format!("{} records", reply.records.len()));
                    world.record(process, EventKind::Hostile { attack, accepted });
                }
                kind => {
                    let (attack, records) = if kind == 2 {
                        ("produce of an empty batch".to_string(), Vec::new())
                    } else {
                        let limit = keel_core::Limits::default().record_value_bytes_max as usize;
                        let huge = pb::Record { value: vec![b'x'; limit + 1], ..Default::default() };
                        ("produce of a record over the size limit".to_string(), vec![huge])
                    };
                    let request =
                        pb::ProduceRequest { topic: topic.name.clone(), partition, records, ..Default::default() };
                    let answer = client.produce(request).await;
                    let accepted = answer.ok().map(|reply| format!("appended at {}", reply.base_offset));
                    world.record(
                        process,
                        EventKind::Hostile { attack: format!("{attack} to {}/{partition}", topic.name), accepted },
                    );
                }
            }
        }
    })
}

/// Move the main group on while brokers are split, once a broker cut off
/// still leads a partition in its own view: a second process with the id
/// of the member that broker's metadata says owns it joins and leaves.
/// Each changes the assignment if the member is still in the group (a new
/// epoch fences the member itself, which rejoins) and the partition then
/// usually goes to another member, which claims it at the large side's
/// new leader in a newer generation; the broker cut off still holds the
/// old claim and the old generation, which [`zombie_poll`] then asks it to
/// serve. Returns whether the join was answered (else the next round
/// tries again).
async fn move_the_group_on(world: &World, client: &Client) -> bool {
    let group = keel_core::GroupName::new(MAIN_GROUP).expect("a group name");
    let small = world.brokers_split_small.lock().expect("split").clone();
    let owner = world.live_nodes().iter().filter(|node| small.contains(&node.id())).find_map(|node| {
        let metadata = node.metadata();
        let info = metadata.group(&group)?;
        led_and_owned(world, node, info).into_iter().next().map(|(_, _, owner)| owner.to_string())
    });
    let Some(owner) = owner else { return false };
    let topics: Vec<String> = world.scenario.topics.iter().map(|t| t.name.clone()).collect();
    let session = world.scenario.session_timeout_ms;
    let Ok(second) = Consumer::join(client.clone(), MAIN_GROUP, &owner, topics, session).await else { return false };
    // If the leave is lost, the session expires the member (a join whose
    // answer was lost leaves it to the session too).
    let _ = second.leave().await;
    true
}

/// The partitions of the run's topics that `node` leads in its own view,
/// each with the member its metadata (`info`, of the main group) says owns
/// it.
fn led_and_owned<'a>(
    world: &'a World,
    node: &Node,
    info: &keel_core::metadata::GroupInfo,
) -> Vec<(&'a TopicSpec, TopicPartition, keel_core::MemberId)> {
    let mut led = Vec::new();
    for topic in &world.scenario.topics {
        for partition in 0..topic.partitions {
            let Ok(name) = TopicName::new(&topic.name) else { continue };
            let tp = TopicPartition::new(name, PartitionIndex(partition));
            let leads = node
                .partition_group(&tp)
                .and_then(|g| node.raft(&g))
                .is_some_and(|raft| raft.metrics().borrow().current_leader == Some(node.id()));
            if let Some(owner) = info.assignment.owner(&tp).filter(|_| leads) {
                led.push((topic, tp, owner.clone()));
            }
        }
    }
    led
}

/// A zombie's poll, where a partition leader's metadata lags the group's
/// newest generation (a broker restarted, or cut off from the metadata's
/// leader): as the member that leader's metadata says holds the partition,
/// in the generation it knows. The member check passes there; only the
/// partition's claim (checked again after a read index, before records are
/// served) fences it, and records served go to the G5 checker.
async fn zombie_poll(world: &World, at_broker: &BTreeMap<u64, Client>) {
    let group = keel_core::GroupName::new(MAIN_GROUP).expect("a group name");
    let nodes = world.live_nodes();
    let generation_at = |node: &Node| node.metadata().group(&group).map(|g| g.generation.0);
    let Some(newest) = nodes.iter().filter_map(generation_at).max() else { return };
    for node in &nodes {
        let metadata = node.metadata();
        let Some(info) = metadata.group(&group).filter(|info| info.generation.0 < newest) else { continue };
        for (topic, tp, owner) in led_and_owned(world, node, info) {
            let owner = &owner;
            let partition = tp.partition.0;
            // The incarnation of the topic that leader knows (its
            // metadata may be from before the topic was created again):
            // G5 judges the poll against that incarnation's claims.
            let Some(topic_id) = metadata.topic(&tp.topic).map(|t| t.id) else { continue };
            // Only once a newer generation's claim applied on a replica
            // of that incarnation (a deposed leader's claim is then
            // stale): before that, the old claim is the partition's own.
            let newer = nodes.iter().find_map(|other| {
                let Some(GroupId::Partition(_, id)) = other.partition_group(&tp) else { return None };
                let state = other.partition(&tp).filter(|_| id == topic_id)?;
                let claim = state.groups().get(&group).and_then(|g| g.claim.clone())?;
                (claim.generation > info.generation).then(|| (other.id(), claim))
            });
            let Some((holder, claim)) = newer else { continue };
            // The checker learns of it now, not at the next sample.
            world.record(
                &format!("broker-{holder}"),
                EventKind::ClaimSample {
                    broker: holder,
                    topic: topic_key(&topic.name, topic_id),
                    partition,
                    group: MAIN_GROUP.into(),
                    member: claim.member.to_string(),
                    generation: claim.generation.0,
                },
            );
            let Some(joined) = info.members.get(owner) else { continue };
            let Some(client) = at_broker.get(&node.id()) else { return };
            let request = pb::PollRequest {
                group: MAIN_GROUP.into(),
                member: owner.to_string(),
                generation: info.generation.0,
                topic: topic.name.clone(),
                partition,
                max_records: 10,
                max_bytes: 1 << 20,
                max_wait_ms: 0,
                // From the log's start: records to serve even if the member had
                // read all its partition held when it was cut off.
                offset: Some(0),
                member_epoch: joined.member_epoch,
                topic_id: Some(topic_id),
            };
            let invoked_at_ms = world.now_ms();
            let route = keel_client::Route::Partition(topic.name.clone(), partition);
            let answer = client
                .call(route, |mut c| {
                    let r = request.clone();
                    async move { c.poll(r).await }
                })
                .await;
            if let Some(reply) = answer.ok().filter(|reply| !reply.records.is_empty()) {
                world.record(
                    "hostile",
                    EventKind::ZombiePoll {
                        group: MAIN_GROUP.into(),
                        member: owner.to_string(),
                        generation: info.generation.0,
                        topic: topic_key(&topic.name, topic_id),
                        partition,
                        invoked_at_ms,
                        records: reply.records.len(),
                    },
                );
            }
            // One a round: the lane goes on.
            return;
        }
    }
}

/// The callers of the hostile lane that must not be served.
struct Intruders {
    /// Authenticated, with a rule to describe topics only.
    intruder: Client,
    /// The workload's user with a wrong secret.
    wrong_secret: Client,
    /// No credentials at all.
    anonymous: Client,
}

/// One request from a caller without the permission it needs: what was
/// tried, and the answer if it was served (which it must not be).
async fn intrude(
    intruders: &Intruders,
    topic: &TopicSpec,
    partition: u32,
    rng: &mut impl Rng,
) -> (String, Option<String>) {
    let served = |what: &str| Some(what.to_string());
    let Intruders { intruder, wrong_secret, anonymous } = intruders;
    let name = topic.name.as_str();
    // Values no producer of the run makes: a consumer reading one would also
    // show that the produce was served.
    let produce = pb::ProduceRequest {
        topic: name.to_string(),
        partition,
        records: vec![pb::Record {
            value: format!("intruder-{}", rng.gen::<u32>()).into_bytes(),
            ..Default::default()
        }],
        ..Default::default()
    };
    match rng.gen_range(0..10) {
        0 => (
            format!("{INTRUDER} produces to {name}/{partition}"),
            intruder.produce(produce).await.ok().map(|r| format!("appended at {}", r.base_offset)),
        ),
        1 => (
            format!("{INTRUDER} deletes topic {name}"),
            intruder.delete_topic(name).await.ok().and_then(|()| served("deleted")),
        ),
        2 => {
            let request = pb::CreateTopicRequest {
                topic: "intruded".into(),
                partitions: 1,
                replication_factor: 1,
                ..Default::default()
            };
            (
                format!("{INTRUDER} creates a topic"),
                intruder.create_topic(request).await.ok().map(|t| format!("created {}", t.name)),
            )
        }
        3 => {
            let request = pb::JoinGroupRequest {
                group: "g".into(),
                member: "intruder".into(),
                topics: vec![name.to_string()],
                session_timeout_ms: 3_000,
                ..Default::default()
            };
            let joined = intruder
                .call(keel_client::Route::Metadata, |mut c| {
                    let r = request.clone();
                    async move { c.join_group(r).await }
                })
                .await;
            (format!("{INTRUDER} joins group g"), joined.ok().map(|j| format!("joined at generation {}", j.generation)))
        }
        4 => {
            let request = pb::ResetGroupPositionRequest {
                group: "g".into(),
                topic: name.to_string(),
                partition,
                to: Some(pb::reset_group_position_request::To::Earliest(true)),
            };
            (
                format!("{INTRUDER} resets group g on {name}/{partition}"),
                intruder.reset_group_position(request).await.ok().map(|p| format!("reset to {p}")),
            )
        }
        5 => {
            let acl = pb::Acl {
                principal: INTRUDER.into(),
                resource: "topic".into(),
                name: String::new(),
                prefix: true,
                operation: "produce".into(),
            };
            (
                format!("{INTRUDER} grants itself produce"),
                intruder.add_acl(acl).await.ok().map(|added| format!("added: {added}")),
            )
        }
        6 => {
            let credential = keel_core::access::Credential::derive(b"x", vec![1; 16], 1);
            (
                format!("{INTRUDER} replaces {APP_USER}'s secret"),
                intruder.set_user(APP_USER, &credential, true).await.ok().map(|r| format!("replaced: {r}")),
            )
        }
        7 => (
            format!("{INTRUDER} removes broker 1"),
            intruder.remove_broker(1).await.ok().and_then(|()| served("removed")),
        ),
        8 => (
            format!("a wrong secret produces to {name}/{partition}"),
            wrong_secret.produce(produce).await.ok().map(|r| format!("appended at {}", r.base_offset)),
        ),
        _ => (
            format!("an anonymous caller produces to {name}/{partition}"),
            anonymous.produce(produce).await.ok().map(|r| format!("appended at {}", r.base_offset)),
        ),
    }
}

/// The id of `topic`'s current incarnation, as the most advanced live
/// metadata replica knows it (0 if none does).
fn topic_id_now(world: &World, topic: &str) -> u64 {
    let name = TopicName::new(topic).expect("a topic name");
    newest_metadata(world).and_then(|m| m.topic(&name).map(|t| t.id)).unwrap_or(0)
}

/// The metadata of the live replica that applied the most of it.
fn newest_metadata(world: &World) -> Option<Arc<keel_core::metadata::MetadataState>> {
    let applied =
        |n: &Node| n.raft(&GroupId::Metadata).and_then(|r| r.metrics().borrow().last_applied.map(|l| l.index));
    world.live_nodes().iter().max_by_key(|n| applied(n)).map(Node::metadata)
}

/// Most topic deletions (each followed by a re-creation) in one run.
const TOPIC_DELETIONS_MAX: u32 = 1;

/// An operator deletes a topic that producers and the group use, then
/// creates it again under the same name and shape (a new incarnation,
/// starting at offset 0), retrying until it exists, brokers down or not.
/// What was acknowledged to the deleted incarnation is gone by design.
fn lane_topics(world: World, over: Arc<AtomicBool>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if !world.scenario.topic_lifecycle {
            return;
        }
        let mut rng = madsim::rand::thread_rng();
        let client = world.client();
        let record = |op: &str, detail: String, outcome: String| {
            world.record("operator", EventKind::Operator { op: op.into(), detail, outcome });
        };
        for _ in 0..TOPIC_DELETIONS_MAX {
            madsim::time::sleep(Duration::from_millis(rng.gen_range(3_000..8_000))).await;
            if over.load(Ordering::SeqCst) {
                return;
            }
            let topic = world.scenario.topics[rng.gen_range(0..world.scenario.topics.len())].clone();
            // While producers still write to it.
            audit_group(&world, &client, &topic).await;
            let deleted = match client.delete_topic(&topic.name).await {
                Ok(()) => "ok".to_string(),
                Err(error) => format!("failed: {error}"),
            };
            record("delete-topic", topic.name.clone(), deleted);
            madsim::time::sleep(Duration::from_millis(rng.gen_range(200..3_000))).await;
            let request = pb::CreateTopicRequest {
                topic: topic.name.clone(),
                partitions: topic.partitions,
                replication_factor: topic.replication_factor,
                retention_bytes: world.scenario.retention_bytes,
                retention_ms: world.scenario.retention_ms,
            };
            // Re-created even after the safety phase: the workload needs it.
            let deadline = world.now_ms() + 30_000;
            let created = loop {
                match client.create_topic(request.clone()).await {
                    Ok(created) => break format!("ok: id {}", created.id),
                    Err(error) if world.now_ms() >= deadline => break format!("gave up: {error}"),
                    Err(error) => {
                        // An earlier attempt's lost answer: the topic exists.
                        if let Ok(found) = client.describe_topic_fresh(&topic.name).await {
                            break format!("ok: id {} (after {error})", found.id);
                        }
                        madsim::time::sleep(Duration::from_millis(300)).await;
                    }
                }
            };
            record("create-topic", topic.name.clone(), created);
            alter_topic(&world, &client, &topic, &mut rng).await;
        }
    })
}

/// The operator grows `topic` by a partition (the group reading it
/// rebalances onto it), then asks to shrink it, which must be refused.
async fn alter_topic(world: &World, client: &Client, topic: &TopicSpec, rng: &mut impl Rng) {
    madsim::time::sleep(Duration::from_millis(rng.gen_range(500..3_000))).await;
    let grow = pb::AlterTopicRequest {
        topic: topic.name.clone(),
        partitions: Some(topic.partitions + 1),
        ..Default::default()
    };
    let grown = match client.alter_topic(grow).await {
        Ok(described) => format!("ok: {} partitions", described.partitions.len()),
        Err(error) => format!("failed: {error}"),
    };
    world.record(
        "operator",
        EventKind::Operator {
            op: "alter-topic".into(),
            detail: format!("{} to {} partitions", topic.name, topic.partitions + 1),
            outcome: grown,
        },
    );
    let Ok(now) = client.describe_topic_fresh(&topic.name).await else { return };
    let count = now.partitions.len() as u32;
    if count < 2 {
        return;
    }
    let shrink = pb::AlterTopicRequest { topic: topic.name.clone(), partitions: Some(count - 1), ..Default::default() };
    let accepted = client.alter_topic(shrink).await.ok().map(|d| format!("{} partitions", d.partitions.len()));
    world.record(
        "operator",
        EventKind::Hostile {
            attack: format!("alter of {} from {count} to {} partitions", topic.name, count - 1),
            accepted,
        },
    );
    change_settings(world, client, rng).await;
}

/// The operator changes a cluster setting (a metadata command under the
/// faults), then asks for settings that must be refused: a value below
/// what the cluster holds (`topic` has at least 2 partitions), an invalid
/// one, and one fixed in each partition.
async fn change_settings(world: &World, client: &Client, rng: &mut impl Rng) {
    let topics_max = rng.gen_range(1_000..10_000u64);
    let changed = match client.set_cluster_config("topics_max", topics_max).await {
        Ok(previous) => format!("ok: was {previous}"),
        Err(error) => format!("failed: {error}"),
    };
    world.record(
        "operator",
        EventKind::Operator { op: "set-config".into(), detail: format!("topics_max {topics_max}"), outcome: changed },
    );
    for (name, value) in [("partitions_per_topic_max", 1), ("groups_max", 0), ("batch_bytes_max", 1)] {
        let accepted = client.set_cluster_config(name, value).await.ok().map(|previous| format!("was {previous}"));
        world.record("operator", EventKind::Hostile { attack: format!("cluster setting {name} = {value}"), accepted });
    }
}

/// With the shape lane: the operator moves `group`'s position (no member
/// left) on one partition to its high watermark, then asks replicas for the
/// position until one has applied the reset (G4: it is kept).
/// Asks, a second apart, for the position after a reset before judging it.
const RESET_CHECKS: u32 = 30;

async fn reset_to_latest(world: &World, client: &Client, group: &str, topic: &TopicSpec) {
    if world.scenario.shape.is_none() {
        return;
    }
    let partition = 0;
    let request = pb::ResetGroupPositionRequest {
        group: group.into(),
        topic: topic.name.clone(),
        partition,
        to: Some(pb::reset_group_position_request::To::Latest(true)),
    };
    // Refused while the member's session lasts (a lost leave answer).
    let deadline = world.now_ms() + 30_000;
    let position = loop {
        match client.reset_group_position(request.clone()).await {
            Ok(position) => break position,
            Err(_) if world.now_ms() >= deadline => return,
            Err(_) => madsim::time::sleep(Duration::from_millis(500)).await,
        }
    };
    // A replica that has not applied the reset yet catches up (given time
    // for faults of the safety phase to pass: they follow each other).
    let mut kept = None;
    for _ in 0..RESET_CHECKS {
        if let Ok(found) = client.group_position(group, &topic.name, partition).await {
            kept = kept.max(Some(found.position));
            if found.position >= position {
                break;
            }
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
    let topic = topic_key(&topic.name, topic_id_now(world, &topic.name));
    world.record("operator", EventKind::PositionReset { group: group.into(), topic, partition, position, kept });
}

/// A second group reads `topic` a little, acknowledges what it read and
/// leaves; the operator deletes it (positions first, then the group), and
/// no partition may still hold a position for it.
async fn audit_group(world: &World, client: &Client, topic: &TopicSpec) {
    const GROUP: &str = "audit";
    let topics = vec![topic.name.clone()];
    let Ok(mut consumer) =
        Consumer::join(world.client(), GROUP, "auditor", topics, world.scenario.session_timeout_ms).await
    else {
        return;
    };
    let mut acked = 0u32;
    for _ in 0..20 {
        let Ok(deliveries) = consumer.poll(100, Duration::from_millis(300)).await else { continue };
        if let Some(last) = deliveries.last() {
            let (name, partition) = (last.topic.clone(), last.partition);
            if matches!(consumer.ack_in(&name, last.topic_id, partition, last.record.offset).await, Ok(Some(_))) {
                acked += 1;
            }
        }
        if acked >= 2 {
            break;
        }
    }
    // A lost leave answer leaves the member until its session lapses: the
    // deletion is refused until then.
    let _ = consumer.leave().await;
    reset_to_latest(world, client, GROUP, topic).await;
    let deadline = world.now_ms() + 30_000;
    let deleted = loop {
        match client.delete_group(GROUP).await {
            Ok(positions) => break Ok(positions),
            Err(error) if world.now_ms() >= deadline => break Err(error),
            Err(_) => madsim::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let positions = match deleted {
        Ok(positions) => positions,
        Err(error) => {
            world.record(
                "operator",
                EventKind::Operator {
                    op: "delete-group".into(),
                    detail: GROUP.into(),
                    outcome: format!("gave up: {error}"),
                },
            );
            return;
        }
    };
    // The leader answers after a read index, so a position it reports is
    // current; asked again for a while all the same (a late ack or reset
    // could still be on its way). A partition with no leader is asked
    // again too, and is not judged if it never answers.
    let count = client.describe_topic_fresh(&topic.name).await.map_or(topic.partitions, |d| d.partitions.len() as u32);
    // The whole check is bounded (30 s of simulated time): a partition that
    // cannot answer past it is not judged, and the lane goes on.
    let check_ends_at = world.now_ms() + 30_000;
    let mut kept = Vec::new();
    for partition in 0..count {
        for attempt in 0..10 {
            match client.group_position(GROUP, &topic.name, partition).await {
                Ok(found) if found.committed && attempt == 9 => {
                    kept.push(format!("{}/{partition} at {}", topic.name, found.position))
                }
                Ok(found) if !found.committed => break,
                Err(keel_client::ClientError::Refused(status)) if status.code() == tonic::Code::NotFound => break,
                Err(_) if world.now_ms() >= check_ends_at => break,
                _ => madsim::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }
    world.record("operator", EventKind::GroupDeleted { group: GROUP.into(), acked, positions, kept });
}

fn all_hosts(world: &World) -> (Vec<HostId>, Vec<HostId>) {
    let brokers = world.brokers.iter().map(|b| b.host).collect();
    let clients = world.producer_hosts.iter().chain(&world.consumer_hosts).copied().collect();
    (brokers, clients)
}

fn clog_between(world: &World, a: &[HostId], b: &[HostId]) {
    let net = NetSim::current();
    let mut clogged = world.clogged.lock().expect("clogged");
    for x in a {
        for y in b {
            net.clog_link(*x, *y);
            net.clog_link(*y, *x);
            clogged.insert((*x, *y));
            clogged.insert((*y, *x));
        }
    }
}

fn unclog_all(world: &World) {
    let net = NetSim::current();
    let links = std::mem::take(&mut *world.clogged.lock().expect("clogged"));
    for (x, y) in links {
        net.unclog_link(x, y);
    }
}

/// Partitions, loss and delay, one at a time.
fn lane_network(
    world: World,
    over: Arc<AtomicBool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut rng = madsim::rand::thread_rng();
        let n = world.scenario.brokers as usize;
        while let Some(kind) = next_fault(&world, &over, &mut rng, FaultKind::is_network_fault).await {
            while world.failover_window.load(Ordering::SeqCst) && !over.load(Ordering::SeqCst) {
                madsim::time::sleep(Duration::from_millis(100)).await;
            }
            let (brokers, clients) = all_hosts(&world);
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            let minority = rng.gen_range(1..=(n - 1) / 2);
            let (small, large): (Vec<HostId>, Vec<HostId>) = (
                order[..minority].iter().map(|i| brokers[*i]).collect(),
                order[minority..].iter().map(|i| brokers[*i]).collect(),
            );
            let ids = |hosts: &[HostId]| -> Vec<u64> {
                world.brokers.iter().filter(|b| hosts.contains(&b.host)).map(|b| b.id).collect()
            };
            let detail = match kind {
                FaultKind::PartitionMinority => {
                    let rest: Vec<HostId> = large.iter().chain(&clients).copied().collect();
                    clog_between(&world, &small, &rest);
                    format!("brokers {:?} cut off", ids(&small))
                }
                FaultKind::PartitionMajority => {
                    let rest: Vec<HostId> = small.iter().chain(&clients).copied().collect();
                    clog_between(&world, &large, &rest);
                    format!("clients reach only brokers {:?}", ids(&small))
                }
                FaultKind::PartitionOneWay => {
                    let (from, to) = (brokers[order[0]], brokers[order[1]]);
                    NetSim::current().clog_link(from, to);
                    world.clogged.lock().expect("clogged").insert((from, to));
                    format!("broker {:?} -> broker {:?} dropped", ids(&[from]), ids(&[to]))
                }
                FaultKind::PartitionBridge => {
                    let bridge = brokers[order[0]];
                    let rest: Vec<HostId> = order[1..].iter().map(|i| brokers[*i]).collect();
                    let half = rest.len() / 2;
                    clog_between(&world, &rest[..half], &rest[half..]);
                    format!(
                        "halves {:?} and {:?} meet only at broker {:?}",
                        ids(&rest[..half]),
                        ids(&rest[half..]),
                        ids(&[bridge])
                    )
                }
                FaultKind::PacketLoss => {
                    let rate = rng.gen_range(0.05..0.3);
                    NetSim::current().update_config(|c| c.packet_loss_rate = rate);
                    format!("{:.0}% of connections refused", rate * 100.0)
                }
                FaultKind::Delay => {
                    NetSim::current()
                        .update_config(|c| c.send_latency = Duration::from_millis(10)..Duration::from_millis(200));
                    "messages take 10-200 ms".to_string()
                }
                FaultKind::ClientSplit => {
                    // Producers (and the admin) reach `small`, consumers
                    // `large`; the brokers reach each other.
                    let producers: Vec<HostId> =
                        clients.iter().copied().filter(|h| !world.consumer_hosts.contains(h)).collect();
                    clog_between(&world, &producers, &large);
                    clog_between(&world, &world.consumer_hosts, &small);
                    format!("producers reach only brokers {:?}, consumers only {:?}", ids(&small), ids(&large))
                }
                FaultKind::PartitionBrokers => {
                    // The leader of a partition, where there is one: what
                    // it serves once deposed is the point.
                    let leader = partition_leader(&world, &mut rng)
                        .and_then(|id| world.brokers.iter().find(|b| b.id == id))
                        .map(|b| vec![b.host]);
                    let small = leader.unwrap_or(small);
                    let large: Vec<HostId> = brokers.iter().filter(|h| !small.contains(h)).copied().collect();
                    clog_between(&world, &small, &large);
                    *world.brokers_split_small.lock().expect("split") = ids(&small);
                    world.brokers_splits.fetch_add(1, Ordering::SeqCst);
                    world.brokers_split_on.store(true, Ordering::SeqCst);
                    format!("brokers {:?} cut off from the other brokers; clients reach every broker", ids(&small))
                }
                FaultKind::Duplication => {
                    let percent = rng.gen_range(5..=50);
                    keel_server::raft::network::sim_duplication::set(percent);
                    format!("{percent}% of Raft messages delivered again 1-300 ms later")
                }
                _ => unreachable!("not a network fault"),
            };
            world.network_faults.fetch_add(1, Ordering::SeqCst);
            world.record("faults", EventKind::Fault { kind: kind.name().into(), detail: detail.clone() });
            let mut lasts = fault_duration(&world, &mut rng);
            if kind == FaultKind::PartitionBrokers {
                lasts = lasts.max(BROKERS_SPLIT_MIN);
            }
            madsim::time::sleep(lasts).await;
            heal_network(&world);
            world.brokers_split_on.store(false, Ordering::SeqCst);
            world.network_faults.fetch_add(1, Ordering::SeqCst);
            world.record("faults", EventKind::Heal { kind: kind.name().into(), detail });
        }
    })
}

/// The shortest brokers-only split: long enough for the small side's
/// leaders to be replaced, the hostile lane to move the group on, the
/// members to claim their partitions anew at the new leaders, and a zombie
/// to poll a deposed one.
const BROKERS_SPLIT_MIN: Duration = Duration::from_secs(6);

fn heal_network(world: &World) {
    unclog_all(world);
    keel_server::raft::network::sim_duplication::set(0);
    NetSim::current().update_config(|c| {
        c.packet_loss_rate = 0.0;
        c.send_latency = Duration::from_millis(1)..Duration::from_millis(10);
    });
}

/// Per-broker clock offsets, drift and jumps.
fn lane_clocks(world: World, over: Arc<AtomicBool>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut rng = madsim::rand::thread_rng();
        while let Some(kind) = next_fault(&world, &over, &mut rng, FaultKind::is_clock_fault).await {
            let target = match kind {
                // The coordinator or a partition leader: where time decides
                // sessions, retention and append times.
                FaultKind::ClockStepHours => some_leader(&world, &mut rng).unwrap_or(1),
                _ => rng.gen_range(1..=world.scenario.brokers),
            };
            let clock = &world.brokers[target as usize - 1].clock;
            let detail = match kind {
                FaultKind::ClockSkew => {
                    let skew = Skew {
                        offset_ms: rng.gen_range(-5_000..=5_000),
                        drift_ppm: rng.gen_range(-50_000..=50_000),
                        drift_since_ms: keel_server::clock::Clock::system().now().0,
                    };
                    clock.set_skew(skew);
                    format!("broker {target} offset {} ms, drift {} ppm", skew.offset_ms, skew.drift_ppm)
                }
                FaultKind::ClockJump => {
                    let delta: i64 = rng.gen_range(-30_000..=30_000);
                    clock.jump(delta);
                    format!("broker {target} jumps {delta} ms")
                }
                FaultKind::ClockStepHours => {
                    let hours: i64 = rng.gen_range(1..=6) * if rng.gen_bool(0.5) { 1 } else { -1 };
                    let delta = hours * 3_600_000;
                    clock.jump(delta);
                    format!("broker {target} jumps {delta} ms ({hours} h)")
                }
                _ => unreachable!("not a clock fault"),
            };
            world.record("faults", EventKind::Fault { kind: kind.name().into(), detail });
        }
    })
}

/// Consumer crashes (a new member takes over) and pauses past the session.
fn lane_clients(
    world: World,
    over: Arc<AtomicBool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut rng = madsim::rand::thread_rng();
        let handle = Handle::current();
        while let Some(kind) = next_fault(&world, &over, &mut rng, FaultKind::is_client_fault).await {
            let c = rng.gen_range(0..world.consumer_hosts.len());
            let host = world.consumer_hosts[c];
            let detail = format!("consumer {c}");
            world.record("faults", EventKind::Fault { kind: kind.name().into(), detail: detail.clone() });
            match kind {
                FaultKind::ConsumerCrash => {
                    handle.kill(host);
                    madsim::time::sleep(fault_duration(&world, &mut rng)).await;
                    handle.restart(host);
                }
                _ => {
                    handle.pause(host);
                    // Long enough for the coordinator to expire it and for
                    // another member to claim its partitions.
                    let past_session = world.scenario.session_timeout_ms + rng.gen_range(1_000..6_000);
                    madsim::time::sleep(Duration::from_millis(past_session)).await;
                    handle.resume(host);
                }
            }
            world.record("faults", EventKind::Heal { kind: kind.name().into(), detail });
        }
    })
}

/// End of the safety phase: every fault healed (lanes heal their own; this
/// resets what has no heal of its own, the clocks).
fn heal_everything(world: &World) {
    heal_network(world);
    sim_sync_latency::calm();
    for broker in &world.brokers {
        broker.clock.set_skew(Skew::default());
    }
    world.record("faults", EventKind::Heal { kind: "all".into(), detail: "network, clocks".into() });
}

/// The topics' current incarnations (`name@id`), as the most advanced
/// live replica of the metadata knows them.
fn current_topics(world: &World) -> BTreeSet<String> {
    let Some(metadata) = newest_metadata(world) else { return BTreeSet::new() };
    metadata.topics().iter().map(|(name, info)| topic_key(name.as_str(), info.id)).collect()
}

/// Acknowledged values (of the topics' current incarnations) not yet
/// delivered to any consumer; `None` while no live broker has metadata to
/// tell the current incarnations by. (Found by seed 20008303: just after a
/// power loss of every broker none had restarted yet, no topic was
/// current, nothing counted as unconsumed, and the liveness phase ended at
/// once with four records not yet delivered.)
fn unconsumed(world: &World) -> Option<u64> {
    newest_metadata(world)?;
    let events = world.recorder.events();
    let current = current_topics(world);
    let log_starts = log_starts(world);
    let plans = group_plans(&world.scenario);
    let mut values = BTreeMap::new();
    // (group, value) for every group reading the record's topic.
    let mut acked = BTreeSet::new();
    let mut delivered = BTreeSet::new();
    for event in &events {
        match &event.kind {
            EventKind::ProduceInvoke { op, values: v, topic, partition, .. } => {
                values.insert(*op, (topic.clone(), *partition, v.clone()));
            }
            EventKind::ProduceOk { op, topic_id, base_offset, partition: went_to, .. } => {
                if let Some((topic, partition, v)) = values.get(op) {
                    let partition = &went_to.unwrap_or(*partition);
                    let key = topic_key(topic, *topic_id);
                    // Retention may remove records before anyone consumes them.
                    let start = log_starts.get(&(key.clone(), *partition)).copied().unwrap_or(0);
                    if current.contains(&key) {
                        for plan in plans.iter().filter(|plan| plan.topics.contains(topic)) {
                            let kept = v.iter().enumerate().filter(|(i, _)| base_offset + *i as u64 >= start);
                            acked.extend(kept.map(|(_, value)| (plan.name.clone(), value.clone())));
                        }
                    }
                }
            }
            EventKind::PollOk { group, records, .. } => {
                delivered.extend(records.iter().map(|r| (group.clone(), r.value.clone())))
            }
            _ => {}
        }
    }
    Some(acked.difference(&delivered).count() as u64)
}

/// The furthest log start any live replica has, per partition of the
/// topics' current incarnations (`name@id`, partition).
fn log_starts(world: &World) -> BTreeMap<(String, u32), u64> {
    let mut starts = BTreeMap::new();
    let Some(metadata) = newest_metadata(world) else { return starts };
    for node in world.live_nodes() {
        for (name, info) in metadata.topics().iter() {
            for index in 0..info.partitions.len() as u32 {
                let partition = TopicPartition::new(name.clone(), PartitionIndex(index));
                if node.partition_group(&partition) != Some(GroupId::Partition(partition.clone(), info.id)) {
                    continue;
                }
                if let Some(state) = node.partition(&partition) {
                    let start = starts.entry((topic_key(name.as_str(), info.id), index)).or_insert(0);
                    *start = (*start).max(state.log_start().0);
                }
            }
        }
    }
    starts
}

/// L1: within the bound, producers finish, every acknowledged record is
/// consumed, and the group settles: one live member per consumer, every
/// partition assigned.
async fn await_liveness(world: &World) {
    let deadline = world.now_ms() + world.scenario.liveness_ms;
    let client = world.client();
    loop {
        let done = world.producers_done.load(Ordering::SeqCst) == u64::from(world.scenario.producers);
        let missing = unconsumed(world).unwrap_or(u64::MAX);
        let mut settled = true;
        let mut events = Vec::new();
        for plan in group_plans(&world.scenario) {
            let Ok(group) = client.describe_group(&plan.name).await else {
                settled = false;
                continue;
            };
            let assigned: BTreeSet<(String, u32)> = group
                .members
                .iter()
                .flat_map(|m| m.partitions.iter().map(|p| (p.topic.clone(), p.partition)))
                .collect();
            let unassigned: Vec<(String, u32)> = world
                .scenario
                .topics
                .iter()
                .filter(|t| plan.topics.contains(&t.name))
                .flat_map(|t| (0..t.partitions).map(|p| (t.name.clone(), p)))
                .filter(|p| !assigned.contains(p))
                .collect();
            settled &= unassigned.is_empty() && group.members.len() as u32 == plan.members;
            events.push(EventKind::GroupSettled {
                group: plan.name.clone(),
                generation: group.generation,
                members: group.members.iter().map(|m| m.member.clone()).collect(),
                unassigned,
            });
        }
        if done && missing == 0 && settled {
            for event in events {
                world.record("driver", event);
            }
            break;
        }
        if world.now_ms() >= deadline {
            world.record("driver", EventKind::LivenessTimeout { missing });
            for event in events {
                world.record("driver", event);
            }
            break;
        }
        madsim::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long a write probe may take to be acknowledged after the heal.
const WRITE_PROBE_BOUND: Duration = Duration::from_secs(20);

/// Write availability: one record to every partition, all at once, each
/// retried until acknowledged or out of time.
async fn probe_writes(world: &World) {
    let probes: Vec<_> = world
        .scenario
        .topics
        .iter()
        .flat_map(|t| (0..t.partitions).map(move |p| (t.name.clone(), p)))
        .enumerate()
        .map(|(i, (topic, partition))| {
            let world = world.clone();
            madsim::task::spawn(async move {
                let value = format!("probe-{topic}-{partition}");
                let deadline = world.now_ms() + WRITE_PROBE_BOUND.as_millis() as u64;
                let mut last_error = None;
                let mut offset = None;
                let mut topic_id = 0;
                // One idempotent producer for every attempt: a retry of an
                // answer lost on the way is not appended twice.
                let mut producer = None;
                while offset.is_none() && world.now_ms() < deadline {
                    if producer.is_none() {
                        match Producer::new(world.client(), 1_000 + i as u64).await {
                            Ok(created) => producer = Some(created),
                            Err(error) => last_error = Some(error.to_string()),
                        }
                    }
                    if let Some(producer) = producer.as_mut() {
                        // After a failed attempt the probe may be in the log
                        // already: resend that batch, not a new one.
                        let sent = match producer.resend_unresolved(&topic, partition).await {
                            Ok(None) => {
                                let record = pb::Record { value: value.clone().into_bytes(), ..Default::default() };
                                producer.send_to(&topic, partition, vec![record]).await
                            }
                            resent => resent.map(|sent| sent.expect("a resent batch")),
                        };
                        match sent {
                            Ok(sent) => {
                                offset = Some(sent.base_offset);
                                topic_id = sent.topic_id;
                            }
                            Err(error) => last_error = Some(error.to_string()),
                        }
                    }
                    if offset.is_none() {
                        madsim::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                let error = if offset.is_some() { None } else { last_error };
                let topic = topic_key(&topic, topic_id);
                world.record("driver", EventKind::WriteProbe { topic, partition, value, offset, error });
            })
        })
        .collect();
    for probe in probes {
        let _ = probe.await;
    }
}

/// Give replicas a moment to converge, then read every replica's whole log.
async fn final_reads(world: &World) {
    // The operator may have grown topics: read every partition they have.
    let counts: Vec<(String, u32)> = {
        let metadata = newest_metadata(world);
        world
            .scenario
            .topics
            .iter()
            .map(|topic| {
                let name = TopicName::new(topic.name.as_str()).expect("name");
                let now = metadata.as_ref().and_then(|m| m.topic(&name)).map_or(0, |info| info.partitions.len() as u32);
                (topic.name.clone(), now.max(topic.partitions))
            })
            .collect()
    };
    for _ in 0..40 {
        let converged = counts.iter().all(|(topic, partitions)| {
            (0..*partitions).all(|p| {
                let tp = TopicPartition::new(TopicName::new(topic.as_str()).expect("name"), PartitionIndex(p));
                let nodes = world.live_nodes();
                let marks: BTreeSet<u64> =
                    nodes.iter().filter_map(|n| n.partition(&tp)).map(|s| s.high_watermark().0).collect();
                // And a replica leads with its whole log applied: a replica
                // that restarted just before (all its replicas, say the one
                // of replication factor 1) holds entries it has not applied
                // again until it is elected (sim seed 770004340: read 135
                // ms after its restart, the records it held were judged
                // lost). None running: nothing to wait for.
                let groups: Vec<_> = nodes
                    .iter()
                    .filter_map(|n| n.partition_group(&tp).and_then(|g| n.raft(&g)))
                    .map(|raft| raft.metrics().borrow().clone())
                    .collect();
                let applied_leader = groups.is_empty()
                    || groups.iter().any(|m| {
                        m.state == openraft::ServerState::Leader && m.last_applied.map(|l| l.index) == m.last_log_index
                    });
                marks.len() <= 1 && applied_leader
            })
        });
        if converged {
            break;
        }
        madsim::time::sleep(Duration::from_millis(250)).await;
    }
    // The placement the most advanced replica of the metadata knows. (Not
    // the one that names itself leader: after a restart a broker names the
    // leader of its last committed vote, itself perhaps, while its metadata
    // may be from before a topic was re-created. Found by seed 30000129:
    // no placement was recorded, and the records of the deleted
    // incarnation were judged lost.)
    if let Some(metadata) = newest_metadata(world) {
        for topic in &world.scenario.topics {
            let name = TopicName::new(topic.name.as_str()).expect("name");
            let Some(info) = metadata.topic(&name) else { continue };
            for (p, placement) in info.partitions.iter().enumerate() {
                // Where the records must be is the group's voters: a move
                // the metadata has made but Raft has not finished yet keeps
                // them on the old replicas (as the most advanced replica of
                // the group sees its membership, both sides while joint).
                let tp = TopicPartition::new(name.clone(), PartitionIndex(p as u32));
                let group = GroupId::Partition(tp, info.id);
                let voters = world
                    .live_nodes()
                    .iter()
                    .filter_map(|node| node.raft(&group).map(|raft| raft.metrics().borrow().clone()))
                    .max_by_key(|m| m.last_applied.map(|id| id.index))
                    .map(|m| m.membership_config.membership().voter_ids().collect::<Vec<u64>>());
                world.record(
                    "driver",
                    EventKind::Placement {
                        topic: topic_key(&topic.name, info.id),
                        partition: p as u32,
                        replicas: voters.unwrap_or_else(|| placement.replicas.iter().map(|b| b.0).collect()),
                    },
                );
            }
        }
    }
    for broker in &world.brokers {
        let Some(node) = broker.node() else { continue };
        if let Some(fatal) = node.fatal_error() {
            world.record(&format!("broker-{}", broker.id), EventKind::NodeFailure { broker: broker.id, reason: fatal });
            continue;
        }
        for (topic, partitions) in &counts {
            for p in 0..*partitions {
                let tp = TopicPartition::new(TopicName::new(topic.as_str()).expect("name"), PartitionIndex(p));
                let Some(GroupId::Partition(_, topic_id)) = node.partition_group(&tp) else { continue };
                let read = node.read_partition(&tp, |state, log| {
                    let records = state.read(log, state.log_start(), u32::MAX, u64::MAX).unwrap_or_default();
                    (state.log_start().0, state.high_watermark().0, records)
                });
                let Some((log_start, high_watermark, records)) = read else { continue };
                let records = records
                    .iter()
                    .map(|r| Seen {
                        offset: r.offset.0,
                        value: String::from_utf8_lossy(&r.record.value).to_string(),
                        append_time_ms: r.append_time_ms.0,
                    })
                    .collect();
                world.record(
                    &format!("broker-{}", broker.id),
                    EventKind::ReplicaLog {
                        broker: broker.id,
                        topic: topic_key(topic, topic_id),
                        partition: p,
                        log_start,
                        high_watermark,
                        records,
                    },
                );
            }
        }
    }
}
