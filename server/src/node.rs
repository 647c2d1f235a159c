//! A broker node: the metadata group, the partition groups placed here, the
//! Raft transport server and the node's duties as metadata leader.
//!
//! Groups follow the metadata: after every applied metadata batch the
//! reconciler starts the partition groups placed on this broker and stops
//! those no longer placed here. A partition group that was never moved
//! (placement epoch 0) is initialised by every replica placed on it, each
//! with the same membership (the placement), as the metadata group's
//! voters do: so a topic created while one of its brokers is down still
//! gets a leader from the others. A moved placement is never initialised
//! again: its group exists, and a replica that joins it catches up as a
//! learner. A restarted node reopens exactly the groups the metadata places
//! on it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::coordinator::{GroupSessions, HeartbeatError, HeartbeatReply};
use keel_core::metadata::MetadataState;
use keel_core::partition::PartitionState;
use keel_core::{BrokerId, Generation, GroupName, Limits, MemberId, TopicPartition};
use keel_proto::raft::raft_transport_server::RaftTransportServer;
use keel_proto::v1::keel_server::KeelServer;
use openraft::error::RaftError;
use openraft::BasicNode;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::api::KeelService;
use crate::clock::Clock;
use crate::group::GroupId;
use crate::raft::network::{
    ClusterIdentity, GroupDirectory, GroupNetwork, JoinFuture, JoinRequest, Liveness, MoveSettledReport, Peers,
    TransportService, RAFT_MESSAGE_BYTES_MAX,
};
use crate::raft::types::{Command, NodeId, Raft, Request, Response, TypeConfig};
use crate::storage::{GroupState, GroupStateMachine, LogStore, NodeStore, StoreError};

mod append;
mod group_expiry;
mod membership;
mod quiesce;
mod retention;
mod settled;
mod waves;

pub use append::{ENTRIES_IN_FLIGHT_MAX, ENTRY_BATCHES_MAX, ENTRY_BYTES_MAX};
pub use membership::MembershipError;
pub use quiesce::{QuietCounts, LIVENESS_TIMEOUT, QUIET_AFTER_ROUNDS};
pub use waves::{NEW_GROUP_TURN, WAVE_GROUPS};

/// Largest reply of the public API.
pub const API_REPLY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Streams a peer may reset before this broker accepted them, per
/// connection. After a pause or a partition a peer cancels many timed-out
/// Raft calls at once; with h2's default (20) that answers GOAWAY
/// `ENHANCE_YOUR_CALM` ("too_many_resets"), which tonic reports as
/// RESOURCE_EXHAUSTED. Bounded: each such stream holds a little memory
/// until it is accepted and dropped.
pub const RESET_STREAMS_PENDING_MAX: usize = 4096;
/// How often an idle connection is probed (HTTP/2 PING), and how long the
/// probe may go unanswered before the connection is dropped: a peer that
/// vanished behind a partition is noticed within seconds, not after the
/// kernel's backed-off retransmissions.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Concurrent requests (HTTP/2 streams) per connection; a client that opens
/// more waits for one to finish.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 4096;

/// Longest the metadata leader's duties wait for one of their proposals
/// (expiring members, registering itself). Found by the simulation: a
/// proposal made just before a partitioned leader lost the lead was never
/// answered, and the duty loop, stuck on it, expired no member again even
/// after the broker led once more.
pub const DUTY_PROPOSAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a proposal still waiting for its answer checks that this
/// broker still leads the group in the term it was submitted in. openraft
/// 0.9 answers a proposal only when its entry is applied or truncated; a
/// follower that installs a snapshot past its own uncommitted entries purges
/// them without a word, and their callers would wait for ever. Found by the
/// simulation (seed 6000240): a leader paused past an election took two
/// appends, stepped down, installed a snapshot, and its partition's append
/// lane, full of the two, took no write again.
pub const PROPOSAL_LEADERSHIP_CHECK: Duration = Duration::from_millis(100);

/// A background round (a review of every group) that held a worker longer
/// than this is logged: at thousands of groups such rounds delay every
/// Raft message the broker takes in.
pub const SLOW_ROUND: Duration = Duration::from_millis(100);
/// How long a partition group's commit may wait to reach a follower with
/// the next AppendEntries before it is sent alone (openraft's
/// `commit_alone_after`, keel's vendored change). Records one at a time
/// then take two AppendEntries calls per follower, not four: the next
/// record's entry, sent within about a millisecond, carries the commit.
/// A follower learns a commit up to this late, so what it has applied lags
/// its leader by as much: reads go to the leader unless they ask for any
/// replica (`ReadRequest::any_replica`). The metadata group sends every
/// commit at once: each broker acts on its own applied metadata (a new
/// topic's replicas start its group only once they applied it).
pub const PARTITION_COMMIT_ALONE_AFTER: Duration = Duration::from_millis(10);

/// Run one background round, `name`, and log it if it took longer than
/// [`SLOW_ROUND`].
pub(crate) fn timed_round<T>(name: &'static str, round: impl FnOnce() -> T) -> T {
    let began = tokio::time::Instant::now();
    let out = round();
    let took = began.elapsed();
    if took > SLOW_ROUND {
        tracing::warn!(round = name, took_ms = took.as_millis() as u64, "a background round held a worker long");
    }
    out
}

/// A gRPC server with keel's connection settings.
fn server_builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_max_pending_accept_reset_streams(Some(RESET_STREAMS_PENDING_MAX))
        .max_concurrent_streams(Some(STREAMS_PER_CONNECTION_MAX))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
}

/// How a node is set up.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This broker's id.
    pub id: NodeId,
    /// Where the client API listens.
    pub listen: SocketAddr,
    /// The address clients use to reach this broker (`host:port`).
    pub advertised: String,
    /// Where the internal listener (Raft, joins: broker-to-broker only)
    /// listens.
    pub internal_listen: SocketAddr,
    /// The address other brokers use to reach this one (`host:port`).
    pub internal_advertised: String,
    /// The initial members of the metadata group, by id, with their
    /// internal addresses. Every broker of a new cluster gets the same map.
    pub metadata_voters: BTreeMap<NodeId, String>,
    /// The secret every broker-to-broker request carries: created when the
    /// cluster is bootstrapped and given to every broker that joins it.
    pub cluster_secret: String,
    /// Cluster-wide limits: every broker must be given the same ones.
    pub limits: Limits,
    /// openraft settings (timeouts, snapshot policy).
    pub raft: openraft::Config,
    /// How often the metadata leader does its duties.
    pub duty_interval: Duration,
    /// How many partition groups this broker lets elect and settle at
    /// once, a new group counting for [`NEW_GROUP_TURN`] (see `waves`;
    /// default [`WAVE_GROUPS`]).
    pub wave_groups: usize,
    /// How often each partition leader checks whether records are due to
    /// go under its topic's retention policy (Kafka's
    /// `log.retention.check.interval.ms`).
    pub retention_interval: Duration,
    /// The cluster's identity, carried by every Raft message so brokers of
    /// different clusters never talk. [`NodeConfig::new`] derives it from
    /// the initial voters; a broker joining a running cluster takes it from
    /// the cluster (`DescribeCluster`).
    pub cluster_id: u64,
    /// Whether requests are authorised against the access rules, and who
    /// may do everything.
    pub access: crate::api::AccessSettings,
    /// TLS on every listener and on calls to other brokers; `None`:
    /// plaintext (real builds only: the simulation has no TLS).
    #[cfg(not(madsim))]
    pub tls: Option<Arc<crate::tls::Tls>>,
}

/// The default internal address of a broker whose client address is
/// `address`: the same host, port + 100 (7070 -> 7170).
pub fn default_internal_address(address: &str) -> Option<String> {
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some(format!("{host}:{}", port.checked_add(100)?))
}

/// The identity of a cluster with these initial metadata voters: FNV-1a 64
/// of `id=address;` pairs (the same on every broker of the cluster).
pub fn cluster_id_of(metadata_voters: &BTreeMap<NodeId, String>) -> u64 {
    let voters: String = metadata_voters.iter().map(|(id, address)| format!("{id}={address};")).collect();
    keel_core::routing::fnv1a_64(voters.as_bytes())
}

impl NodeConfig {
    /// A config with keel's defaults for everything but the addresses. The
    /// internal listener defaults to [`default_internal_address`] of the
    /// client one; `metadata_voters` are internal addresses. The cluster
    /// secret starts empty: set it (`keel serve` always does).
    pub fn new(id: NodeId, listen: SocketAddr, advertised: String, metadata_voters: BTreeMap<NodeId, String>) -> Self {
        let raft = openraft::Config {
            cluster_name: "keel".to_string(),
            heartbeat_interval: 100,
            election_timeout_min: 400,
            election_timeout_max: 800,
            install_snapshot_timeout: 2_000,
            // Snapshot chunks on the wire stay well under gRPC's 4 MiB
            // default message limit.
            snapshot_max_chunk_size: 1024 * 1024,
            // Bounds an AppendEntries message (see RAFT_MESSAGE_BYTES_MAX):
            // an entry of coalesced appends is up to ENTRY_BYTES_MAX (1 MiB),
            // a single batch up to 4 MiB. At 64 entries a message reached
            // 64 MiB, whose encoding alone outlasted the call's time limit,
            // so followers were sent the same entries again and again.
            max_payload_entries: 8,
            ..openraft::Config::default()
        };
        let internal_listen = default_internal_address(&listen.to_string())
            .and_then(|a| a.parse().ok())
            .unwrap_or(SocketAddr::new(listen.ip(), 0));
        let internal_advertised = default_internal_address(&advertised).unwrap_or_else(|| internal_listen.to_string());
        NodeConfig {
            cluster_id: cluster_id_of(&metadata_voters),
            id,
            listen,
            advertised,
            internal_listen,
            internal_advertised,
            metadata_voters,
            cluster_secret: String::new(),
            limits: Limits::default(),
            raft,
            duty_interval: Duration::from_millis(200),
            wave_groups: WAVE_GROUPS,
            retention_interval: Duration::from_secs(30),
            access: crate::api::AccessSettings::default(),
            #[cfg(not(madsim))]
            tls: None,
        }
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("openraft settings are invalid: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("openraft failed to start group {group}: {reason}")]
    Raft { group: GroupId, reason: String },
}

/// Why a proposal did not commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    #[error("group {group} is not running on this broker")]
    GroupNotHere { group: GroupId },
    #[error("this broker does not lead group {group}; the leader is {leader:?} at {address:?}")]
    NotLeader { group: GroupId, leader: Option<NodeId>, address: Option<String> },
    #[error("group {group} failed: {reason}")]
    Raft { group: GroupId, reason: String },
    #[error(
        "this broker lost the lead of group {group} (term {term}) before the write was answered: the next \
         leader may still apply it, so retry (an idempotent produce is not applied twice)"
    )]
    LeadershipLost { group: GroupId, term: u64 },
}

/// The claim this leader made or found applied for a group on one
/// partition (soft state: a new leader looks at its applied state, and
/// claims again only if the claim there is not the member's). Reads start
/// where the member says its session is, or at the committed position;
/// never at a position kept here, so a reply lost on the way is read again
/// rather than skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub generation: Generation,
    pub member: MemberId,
    pub member_epoch: u64,
}

/// A command handed to Raft, its answer still to come.
struct Submitted {
    group: GroupId,
    /// The term this broker led the group in when it submitted the command.
    term: u64,
    reply:
        <openraft::impls::OneshotResponder<TypeConfig> as openraft::raft::responder::Responder<TypeConfig>>::Receiver,
}

/// A partition group as the metadata places it (borrowed from the
/// metadata: reconciling runs often and mostly finds nothing to start).
struct PlacedGroup<'m> {
    placement: &'m keel_core::placement::PartitionPlacement,
}

impl PlacedGroup<'_> {
    /// Whether this replica may initialise the group (with
    /// [`Self::members`]) if its log is empty: every replica of a
    /// never-moved placement initialises it with the same membership;
    /// moved replicas join the existing group instead.
    fn may_initialise(&self, me: NodeId) -> bool {
        self.placement.epoch == 0 && self.placement.replicas.contains(&BrokerId(me))
    }

    fn members(&self, metadata: &MetadataState) -> BTreeMap<NodeId, BasicNode> {
        let address = |b: &BrokerId| metadata.brokers().get(b).map(|i| i.internal_address.clone()).unwrap_or_default();
        self.placement.replicas.iter().map(|b| (b.0, BasicNode { addr: address(b) })).collect()
    }
}

#[derive(Clone)]
struct GroupHandle {
    raft: Raft,
    state_machine: GroupStateMachine,
}

struct NodeInner {
    config: NodeConfig,
    raft_config: Arc<openraft::Config>,
    /// The same for partition groups, which start with their election
    /// timers off until their turn (see `waves`).
    partition_raft_config: Arc<openraft::Config>,
    store: Arc<NodeStore>,
    clock: Clock,
    peers: Peers,
    groups: Mutex<BTreeMap<GroupId, GroupHandle>>,
    /// The metadata as it stood when the node shut down: tasks still
    /// finishing read it once the metadata group is gone.
    metadata_at_shutdown: Mutex<Option<Arc<MetadataState>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Member sessions, soft state, meaningful while this broker leads the
    /// metadata group (the group coordinator).
    sessions: Mutex<GroupSessions>,
    was_metadata_leader: Mutex<bool>,
    /// The claim this leader made or found applied per consumer group on
    /// each partition group led here (soft state: see [`Cursor`]). Keyed by
    /// the Raft group, which names the topic's incarnation, so a topic deleted
    /// and created again starts without claims; a stopped group's cursors
    /// are dropped with it.
    cursors: Mutex<BTreeMap<(GroupId, GroupName), Cursor>>,
    /// Partition groups whose leader (this broker) is changing their
    /// membership to follow a move.
    membership_changes: Mutex<BTreeSet<GroupId>>,
    /// Brokers joining or being removed through this broker (as metadata
    /// leader) right now: one change at a time per broker (see
    /// `membership::BrokerChange`). Bounded by the brokers asking.
    broker_changes: membership::BrokerChanges,
    /// Groups led here found to follow their placement (see `membership`).
    converged: Mutex<membership::Converged>,
    /// When retention was last checked on each partition group led here.
    retention_checked: Mutex<BTreeMap<GroupId, keel_core::MonotonicMs>>,
    /// Partition groups with a retention proposal awaiting its outcome (at
    /// most one each).
    retention_proposed: Mutex<BTreeSet<GroupId>>,
    /// Produce requests waiting to share a Raft entry, per partition group.
    lanes: append::Lanes,
    /// Settled reports waiting to share a metadata entry (metadata leader).
    settling: Mutex<settled::Settling>,
    /// Which partition groups are quiet (no heartbeats while idle).
    quiet: quiesce::Quiescence,
    /// Which partition groups may elect now (see `waves`).
    waves: waves::Waves,
    metrics: crate::metrics::Metrics,
    /// Set once the node starts to stop: long-running calls (long polls,
    /// produce streams) end, so that the servers' graceful shutdown does not
    /// wait for them.
    stopping: Stopping,
    /// Tells the servers to stop (one waiter each: the client API server and
    /// the internal one).
    stop_servers: [Arc<Notify>; 2],
    servers: Mutex<Vec<JoinHandle<()>>>,
    /// Why a server could not keep serving (its port taken, say): fatal.
    server_failure: Arc<Mutex<Option<String>>>,
    /// The standard health service's state (real gRPC only).
    #[cfg(not(madsim))]
    health: tonic_health::server::HealthReporter,
}

impl NodeInner {
    fn raft(&self, group: &GroupId) -> Option<Raft> {
        self.groups.lock().expect("groups").get(group).map(|g| g.raft.clone())
    }
}

/// The node as the transport service sees it; weak, so that the server does
/// not keep a stopped node alive.
struct Directory(std::sync::Weak<NodeInner>);

impl Directory {
    /// Run `call` on the node, unless it has stopped.
    fn on_node<F, Fut>(&self, call: F) -> JoinFuture
    where
        F: FnOnce(Node) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), crate::raft::network::JoinRefusal>> + Send + 'static,
    {
        let node = self.0.upgrade().map(|inner| Node { inner });
        Box::pin(async move {
            match node {
                Some(node) => call(node).await,
                None => Err(crate::raft::network::JoinRefusal::Retry("the broker is stopping".into())),
            }
        })
    }
}

impl GroupDirectory for Directory {
    fn raft(&self, group: &GroupId) -> Option<Raft> {
        self.0.upgrade()?.raft(group)
    }

    fn join(&self, request: JoinRequest) -> JoinFuture {
        self.on_node(|node| async move { node.accept_join(request).await })
    }

    fn move_settled(&self, report: MoveSettledReport) -> JoinFuture {
        self.on_node(|node| async move { node.accept_move_settled(report).await })
    }

    fn liveness(&self, report: Liveness) {
        if let Some(inner) = self.0.upgrade() {
            Node { inner }.take_liveness(report);
        }
    }

    fn appended(&self, group: &GroupId) {
        if let Some(inner) = self.0.upgrade() {
            Node { inner }.woken_by_entries(group);
        }
    }

    fn heard_from(&self, peer: NodeId) {
        if let Some(inner) = self.0.upgrade() {
            Node { inner }.heard_from(peer);
        }
    }

    fn vote_refused(&self, group: &GroupId, candidate: NodeId, term: u64) {
        if let Some(inner) = self.0.upgrade() {
            Node { inner }.vote_refused(group, candidate, term);
        }
    }
}

/// A running broker node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

impl Node {
    /// Start a node on an opened store: the flusher, the metadata group,
    /// the transport server, the reconciler and the leader duties.
    pub async fn start(config: NodeConfig, store: Arc<NodeStore>, clock: Clock) -> Result<Node, StartError> {
        let raft_config = Arc::new(config.raft.clone().validate()?);
        let partition_raft_config = Arc::new(openraft::Config {
            enable_elect: false,
            enable_tick: false,
            commit_alone_after: PARTITION_COMMIT_ALONE_AFTER.as_millis() as u64,
            ..(*raft_config).clone()
        });
        let identity = ClusterIdentity { cluster_id: config.cluster_id, secret: config.cluster_secret.clone() };
        let metrics = crate::metrics::Metrics::new();
        #[cfg(not(madsim))]
        let peers = Peers::new(identity.clone()).with_tls(config.tls.clone());
        #[cfg(madsim)]
        let peers = Peers::new(identity.clone());
        let peers = peers.with_call_latency(metrics.raft_call_latency());
        #[cfg(not(madsim))]
        let (health, health_service) = tonic_health::server::health_reporter();
        let inner = Arc::new(NodeInner {
            config,
            raft_config,
            partition_raft_config,
            store: store.clone(),
            clock,
            peers,
            groups: Mutex::new(BTreeMap::new()),
            metadata_at_shutdown: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
            sessions: Mutex::new(GroupSessions::new()),
            was_metadata_leader: Mutex::new(false),
            cursors: Mutex::new(BTreeMap::new()),
            membership_changes: Mutex::new(BTreeSet::new()),
            broker_changes: membership::BrokerChanges::default(),
            converged: Mutex::default(),
            retention_checked: Mutex::new(BTreeMap::new()),
            retention_proposed: Mutex::new(BTreeSet::new()),
            lanes: append::Lanes::default(),
            settling: Mutex::new(settled::Settling::default()),
            quiet: quiesce::Quiescence::default(),
            waves: waves::Waves::default(),
            metrics,
            stopping: Stopping::default(),
            stop_servers: [Arc::new(Notify::new()), Arc::new(Notify::new())],
            servers: Mutex::new(Vec::new()),
            server_failure: Arc::new(Mutex::new(None)),
            #[cfg(not(madsim))]
            health,
        });
        let node = Node { inner };

        let applied = Arc::new(Notify::new());
        let initial = GroupStateMachine::initial_metadata(node.inner.config.limits.clone());
        let metadata_sm =
            GroupStateMachine::open(store, GroupId::Metadata.key(), initial)?.notify_on_apply(applied.clone());
        let metadata = node.start_group(GroupId::Metadata, metadata_sm).await?;

        let transport_service = TransportService::new(Arc::new(Directory(Arc::downgrade(&node.inner))), identity);
        // With TLS, every peer proves the broker id it claims with its
        // certificate.
        #[cfg(not(madsim))]
        let transport_service = transport_service.requiring_certified_peers(node.inner.config.tls.is_some());
        let transport = RaftTransportServer::new(transport_service)
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        // A produce request holds at most one batch; a read reply is bounded
        // by its byte budget (plus one record). Requests up to twice the
        // batch limit are decoded, so that an oversized batch is refused by
        // validation (RESOURCE_EXHAUSTED, saying to split it); only beyond
        // that does gRPC itself refuse the message (OUT_OF_RANGE).
        let limits = &node.inner.config.limits;
        let request_bytes_max =
            2 * limits.batch_bytes_max as usize + limits.batch_records_max as usize * 64 + 64 * 1024;
        let api = KeelServer::new(KeelService::new(node.clone()))
            .max_decoding_message_size(request_bytes_max)
            .max_encoding_message_size(API_REPLY_BYTES_MAX);
        // Clients and brokers use different listeners: nothing a client can
        // send reaches openraft.
        let internal = server_builder().add_service(transport);
        node.serve("internal", node.inner.config.internal_listen, 1, internal);
        let public = server_builder().add_service(api);
        // The standard health and reflection services, so grpcurl and load
        // balancers work (real gRPC only; the simulation has none).
        #[cfg(not(madsim))]
        let public = {
            node.inner.health.set_serving::<KeelServer<KeelService>>().await;
            // Reflection lists keel's API and the health service, in both
            // protocol versions: many clients speak only v1alpha.
            let reflection = || {
                tonic_reflection::server::Builder::configure()
                    .register_encoded_file_descriptor_set(keel_proto::FILE_DESCRIPTOR_SET)
                    .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            };
            let public = public.add_service(health_service);
            match (reflection().build_v1(), reflection().build_v1alpha()) {
                (Ok(v1), Ok(v1alpha)) => public.add_service(v1).add_service(v1alpha),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, "gRPC reflection is unavailable");
                    public
                }
            }
        };
        node.serve("client", node.inner.config.listen, 0, public);

        if node.inner.config.metadata_voters.contains_key(&node.id()) {
            let voters: BTreeMap<NodeId, BasicNode> = node
                .inner
                .config
                .metadata_voters
                .iter()
                .map(|(id, address)| (*id, BasicNode { addr: address.clone() }))
                .collect();
            // Every voter of a new cluster proposes the same initial
            // membership; a restarted broker's log is already initialised.
            if !metadata.is_initialized().await.unwrap_or(true) {
                if let Err(error) = metadata.initialize(voters).await {
                    tracing::debug!(%error, "metadata group already initialised");
                }
            }
        }
        let reconciler = node.clone();
        node.spawn(async move { reconciler.reconcile_forever(applied).await });
        let duties = node.clone();
        node.spawn(async move { duties.leader_duties_forever().await });
        let watchdog = node.clone();
        node.spawn(async move { watchdog.watch_for_fatal_errors().await });
        let quiescer = node.clone();
        node.spawn(async move { quiescer.quiesce_forever().await });
        let waves = node.clone();
        node.spawn(async move { waves.waves_forever().await });
        Ok(node)
    }

    /// This broker's TLS settings, if it uses TLS.
    #[cfg(not(madsim))]
    pub fn tls(&self) -> Option<Arc<crate::tls::Tls>> {
        self.inner.config.tls.clone()
    }

    /// Read the TLS files again (`keel serve` does on SIGHUP): connections
    /// made from now on, to and from this broker, use them. Returns whether
    /// this broker uses TLS at all.
    #[cfg(not(madsim))]
    pub fn reload_tls(&self) -> Result<bool, crate::tls::TlsError> {
        let Some(tls) = &self.inner.config.tls else { return Ok(false) };
        tls.reload()?;
        self.inner.peers.reconnect();
        Ok(true)
    }

    /// Serve `router` on `listen` until the node stops; a server that fails
    /// (its port is taken, say) is a fatal error of the node.
    fn serve(&self, name: &'static str, listen: SocketAddr, stop: usize, router: tonic::transport::server::Router) {
        let stop = self.inner.stop_servers[stop].clone();
        let failure = self.inner.server_failure.clone();
        #[cfg(not(madsim))]
        let tls = self.inner.config.tls.clone().map(|tls| {
            let kind = if name == "internal" { crate::tls::Listener::Internal } else { crate::tls::Listener::Client };
            (tls, kind)
        });
        let server = tokio::spawn(async move {
            let stopped = async move { stop.notified().await };
            #[cfg(not(madsim))]
            let served = match tls {
                Some((tls, kind)) => match tokio::net::TcpListener::bind(listen).await {
                    Ok(listener) => {
                        let mut incoming = tls.accept(listener, kind);
                        let incoming = futures_util::stream::poll_fn(move |cx| {
                            incoming.poll_recv(cx).map(|stream| stream.map(Ok::<_, std::io::Error>))
                        });
                        router.serve_with_incoming_shutdown(incoming, stopped).await
                    }
                    Err(error) => {
                        let reason = format!("the {name} listener on {listen} failed: {error} (is the port taken?)");
                        tracing::error!(%listen, "{reason}");
                        failure.lock().expect("server failure").get_or_insert(reason);
                        return;
                    }
                },
                None => router.serve_with_shutdown(listen, stopped).await,
            };
            #[cfg(madsim)]
            let served = router.serve_with_shutdown(listen, stopped).await;
            if let Err(error) = served {
                tracing::error!(%error, %listen, "the {name} server stopped");
                let reason = format!("the {name} listener on {listen} failed: {error} (is the port taken?)");
                failure.lock().expect("server failure").get_or_insert(reason);
            }
        });
        self.inner.servers.lock().expect("servers").push(server);
    }

    /// Once the node can no longer work, say so on the health service, so
    /// that load balancers and supervisors see it (`keel serve` exits too).
    async fn watch_for_fatal_errors(&self) {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Some(fatal) = self.fatal_error() {
                tracing::error!(%fatal, "the broker can no longer serve");
                #[cfg(not(madsim))]
                {
                    self.inner.health.set_not_serving::<KeelServer<KeelService>>().await;
                    self.inner.health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
                }
                return;
            }
        }
    }

    /// Whether the node has begun to stop ([`Node::shutdown`]).
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.is_set()
    }

    /// Resolves once the node begins to stop (at once if it has).
    pub async fn stopping(&self) {
        self.inner.stopping.wait().await
    }

    /// This broker's id.
    pub fn id(&self) -> NodeId {
        self.inner.config.id
    }

    /// The broker's metrics.
    /// The settings this node was started with.
    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.metrics
    }

    /// Every metric in the Prometheus (OpenMetrics) text format.
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render(self)
    }

    /// The broker's own metrics, without a series per Raft group or
    /// partition: cheap however many partitions it holds.
    pub fn render_node_metrics(&self) -> String {
        self.inner.metrics.render_node(self)
    }

    /// How long ago `peer` last answered a Raft message from this broker
    /// (`None`: never, since this broker started).
    pub fn since_peer_answer(&self, peer: NodeId) -> Option<Duration> {
        self.inner.peers.since_answer(peer)
    }

    /// Every peer this broker has called, with whether its calls reach it.
    pub fn peer_health(&self) -> BTreeMap<NodeId, crate::raft::network::PeerHealth> {
        self.inner.peers.health()
    }

    /// The node's clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Run `task` until it ends or the node shuts down. Handles of tasks
    /// that ended are dropped here, so the list holds only running ones
    /// (the duties spawn some every round).
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        // Boxed: a duty's task (a peer's liveness report, say) is several
        // KiB, and the runtime moves a spawned future more than once.
        let handle = tokio::spawn(Box::pin(task));
        let mut tasks = self.inner.tasks.lock().expect("tasks");
        tasks.retain(|task| !task.is_finished());
        tasks.push(handle);
    }

    async fn start_group(&self, group: GroupId, state_machine: GroupStateMachine) -> Result<Raft, StartError> {
        let log = LogStore::of_node(self.inner.store.clone(), group.key(), self.id());
        let network = GroupNetwork::new(&group, self.inner.peers.clone());
        let config = match group {
            GroupId::Metadata => self.inner.raft_config.clone(),
            GroupId::Partition(..) => self.inner.partition_raft_config.clone(),
        };
        let raft = Raft::new(self.id(), config, network, log, state_machine.clone())
            .await
            .map_err(|e| StartError::Raft { group: group.clone(), reason: e.to_string() })?;
        self.inner.groups.lock().expect("groups").insert(group, GroupHandle { raft: raft.clone(), state_machine });
        Ok(raft)
    }

    /// The Raft handle of a group running here.
    pub fn raft(&self, group: &GroupId) -> Option<Raft> {
        self.inner.raft(group)
    }

    /// How many of the Raft groups running here (the metadata group and
    /// partitions) this broker leads.
    pub fn groups_led(&self) -> usize {
        let groups = self.inner.groups.lock().expect("groups");
        groups.values().filter(|g| g.raft.metrics().borrow().state == openraft::ServerState::Leader).count()
    }

    /// The groups running here.
    pub fn groups(&self) -> Vec<GroupId> {
        self.inner.groups.lock().expect("groups").keys().cloned().collect()
    }

    /// This replica's metadata state as of its last applied batch (shared,
    /// not copied).
    pub fn metadata(&self) -> Arc<MetadataState> {
        let groups = self.inner.groups.lock().expect("groups");
        let Some(metadata) = groups.get(&GroupId::Metadata) else {
            // Shut down: the groups are stopped, so answer from the last state.
            let last = self.inner.metadata_at_shutdown.lock().expect("metadata at shutdown").clone();
            return last.unwrap_or_else(|| Arc::new(MetadataState::new(self.inner.config.limits.clone())));
        };
        let state = metadata.state_machine.state();
        let state = state.lock().expect("metadata state");
        match &*state {
            GroupState::Metadata(metadata) => metadata.clone(),
            GroupState::Partition(_) => {
                unreachable!("the metadata group runs the metadata state machine")
            }
        }
    }

    /// Whether this broker leads the metadata group (is the coordinator).
    pub async fn is_metadata_leader(&self) -> bool {
        match self.raft(&GroupId::Metadata) {
            Some(raft) => raft.current_leader().await == Some(self.id()),
            None => false,
        }
    }

    /// The metadata leader's id and address, if known.
    pub async fn metadata_leader(&self) -> Option<(NodeId, String)> {
        let leader = self.raft(&GroupId::Metadata)?.current_leader().await?;
        let address = self.metadata().brokers().get(&BrokerId(leader)).map(|b| b.address.clone())?;
        Some((leader, address))
    }

    /// A heartbeat, on the coordinator.
    pub fn heartbeat(
        &self,
        group: &GroupName,
        member: &MemberId,
        member_epoch: u64,
        generation: Generation,
    ) -> Result<HeartbeatReply, HeartbeatError> {
        let now = self.inner.clock.monotonic();
        let metadata = self.metadata();
        self.inner.sessions.lock().expect("sessions").heartbeat(&metadata, group, member, member_epoch, generation, now)
    }

    /// Follow the metadata in the coordinator's sessions (after a join).
    pub fn sync_sessions(&self) {
        let now = self.inner.clock.monotonic();
        let metadata = self.metadata();
        self.inner.sessions.lock().expect("sessions").sync(&metadata, now);
    }

    /// A consumer group's cursor on a partition group led here.
    pub fn cursor(&self, partition: &GroupId, group: &GroupName) -> Option<Cursor> {
        self.inner.cursors.lock().expect("cursors").get(&(partition.clone(), group.clone())).cloned()
    }

    pub fn set_cursor(&self, partition: &GroupId, group: &GroupName, cursor: Cursor) {
        self.inner.cursors.lock().expect("cursors").insert((partition.clone(), group.clone()), cursor);
    }

    /// How many cursors this broker keeps (for tests of their pruning).
    pub fn cursor_count(&self) -> usize {
        self.inner.cursors.lock().expect("cursors").len()
    }

    /// Raft snapshots this node built and installed since it started.
    pub fn snapshot_counts(&self) -> (u64, u64) {
        self.inner.store.ledger().snapshot_counts()
    }

    /// What this node's segment log holds and has done.
    pub fn log_usage(&self) -> crate::storage::LogUsage {
        self.inner.store.log_usage()
    }

    /// Why this node can no longer work, if it cannot: a storage error, or
    /// a Raft group stopped by a fatal error. Fatal is fatal: the process
    /// should exit and be restarted from disk.
    pub fn fatal_error(&self) -> Option<String> {
        if self.inner.store.is_poisoned() {
            return Some("a storage error stopped the store".to_string());
        }
        if let Some(failure) = self.inner.server_failure.lock().expect("server failure").clone() {
            return Some(failure);
        }
        let groups: Vec<(GroupId, Raft)> =
            self.inner.groups.lock().expect("groups").iter().map(|(g, h)| (g.clone(), h.raft.clone())).collect();
        groups.into_iter().find_map(|(group, raft)| {
            let metrics = raft.metrics();
            if let Err(fatal) = &metrics.borrow().running_state {
                return Some(format!("Raft group {group} stopped: {fatal}"));
            }
            // A core that panicked drops its metrics sender without a word.
            metrics.has_changed().is_err().then(|| format!("Raft group {group} stopped: its core panicked"))
        })
    }

    /// The Raft group of a partition of a topic as it exists now.
    pub fn partition_group(&self, partition: &TopicPartition) -> Option<GroupId> {
        let metadata = self.metadata();
        let topic = metadata.topic(&partition.topic)?;
        (partition.partition.0 < topic.partitions.len() as u32).then(|| GroupId::Partition(partition.clone(), topic.id))
    }

    fn group_handle(&self, partition: &TopicPartition) -> Option<GroupHandle> {
        let group = self.partition_group(partition)?;
        self.inner.groups.lock().expect("groups").get(&group).cloned()
    }

    /// Woken after every batch applied to `group` here (see
    /// [`GroupStateMachine::applied_waiters`]).
    pub fn applied_waiters(&self, group: &GroupId) -> Option<Arc<Notify>> {
        self.inner.groups.lock().expect("groups").get(group).map(|handle| handle.state_machine.applied_waiters())
    }

    /// This replica's state of a partition, if it is hosted here (shared,
    /// not copied).
    pub fn partition(&self, partition: &TopicPartition) -> Option<Arc<PartitionState>> {
        self.partition_in(&self.partition_group(partition)?)
    }

    /// The applied state of partition group `group` (one incarnation of a
    /// topic's partition), if it runs here.
    pub fn partition_in(&self, group: &GroupId) -> Option<Arc<PartitionState>> {
        let handle = self.inner.groups.lock().expect("groups").get(group).cloned()?;
        let state = handle.state_machine.state();
        let state = state.lock().expect("partition state");
        match &*state {
            GroupState::Partition(partition) => Some(Arc::clone(partition)),
            GroupState::Metadata(_) => None,
        }
    }

    /// Read committed records of a partition hosted here.
    pub fn read_partition<T>(
        &self,
        partition: &TopicPartition,
        read: impl FnOnce(&PartitionState, &crate::storage::RecordReader<'_>) -> T,
    ) -> Option<T> {
        let handle = self.group_handle(partition)?;
        handle.state_machine.with_records(read).ok().flatten()
    }

    /// Propose a command to a group this broker leads; the leader stamps its
    /// own time on it. Returns the applied outcome.
    pub async fn propose(&self, group: &GroupId, command: Command) -> Result<Response, ProposeError> {
        let submitted = self.submit(group, command).await?;
        self.outcome(submitted).await
    }

    /// Hand a command to a group's Raft (stamped with the leader's time)
    /// without waiting for it: commands submitted one after another enter
    /// the log in that order.
    async fn submit(&self, group: &GroupId, command: Command) -> Result<Submitted, ProposeError> {
        let raft = self.raft(group).ok_or_else(|| ProposeError::GroupNotHere { group: group.clone() })?;
        let request = Request::new(self.inner.clock.now(), command);
        let term = raft.metrics().borrow().current_term;
        match raft.client_write_ff(request).await {
            Ok(reply) => Ok(Submitted { group: group.clone(), term, reply }),
            Err(fatal) => Err(self.leader_address(membership::write_error(group, RaftError::Fatal(fatal)))),
        }
    }

    /// Wait for a submitted command's applied outcome, or until this broker
    /// no longer leads the group in the term it was submitted in.
    async fn outcome(&self, submitted: Submitted) -> Result<Response, ProposeError> {
        let Submitted { group, term, mut reply } = submitted;
        let answer = loop {
            tokio::select! {
                biased;
                answer = &mut reply => break answer,
                () = tokio::time::sleep(PROPOSAL_LEADERSHIP_CHECK) => {
                    let Some(raft) = self.raft(&group) else {
                        return Err(ProposeError::Raft { group, reason: "the group stopped before answering".into() });
                    };
                    let leads = {
                        let metrics = raft.metrics();
                        let metrics = metrics.borrow();
                        metrics.current_term == term && metrics.current_leader == Some(self.id())
                    };
                    if !leads {
                        return Err(ProposeError::LeadershipLost { group, term });
                    }
                }
            }
        };
        match answer {
            Ok(Ok(written)) => Ok(written.data),
            Ok(Err(error)) => Err(self.leader_address(membership::write_error(&group, RaftError::APIError(error)))),
            // openraft drops a write's answer when its leader steps down
            // before committing it: the next leader may still apply it.
            Err(_) if self.raft(&group).is_some() => Err(ProposeError::LeadershipLost { group, term }),
            Err(_) => Err(ProposeError::Raft { group, reason: "the group stopped before answering".into() }),
        }
    }

    /// Raft knows the leader's internal address; clients need its client
    /// address, from the metadata.
    fn leader_address(&self, error: ProposeError) -> ProposeError {
        match error {
            ProposeError::NotLeader { group, leader: Some(leader), .. } => self.not_leader(group, Some(leader)),
            other => other,
        }
    }

    /// The refusal of a replica that does not lead `group`, naming the
    /// leader it knows by its client address (from the metadata).
    pub(crate) fn not_leader(&self, group: GroupId, leader: Option<NodeId>) -> ProposeError {
        let address = leader.and_then(|id| self.metadata().brokers().get(&BrokerId(id)).map(|b| b.address.clone()));
        ProposeError::NotLeader { group, leader, address }
    }

    /// The partition groups the metadata places on this broker.
    fn placed_here(metadata: &MetadataState, me: NodeId) -> BTreeMap<GroupId, PlacedGroup<'_>> {
        let me = BrokerId(me);
        let mut placed = BTreeMap::new();
        for (topic, info) in metadata.topics().iter() {
            for (index, placement) in info.partitions.iter().enumerate() {
                // A broker moved off a partition keeps its replica open (a
                // restart reopens it) until the group no longer names it.
                if !placement.replicas.contains(&me) && !placement.leaving.contains(&me) {
                    continue;
                }
                let tp = TopicPartition::new(topic.clone(), keel_core::PartitionIndex(index as u32));
                placed.insert(GroupId::Partition(tp, info.id), PlacedGroup { placement });
            }
        }
        placed
    }

    async fn reconcile_forever(&self, applied: Arc<Notify>) {
        loop {
            if let Err(error) = self.reconcile().await {
                tracing::error!(%error, "could not start a partition group");
            }
            // Also look again now and then: a replica moved away stops once
            // its own group's membership drops it, which no metadata
            // change announces.
            tokio::select! {
                biased;
                _ = applied.notified() => {}
                _ = tokio::time::sleep(self.inner.config.duty_interval) => {}
            }
        }
    }

    /// Start the partition groups placed here that are not running; stop
    /// those running here that are no longer placed here.
    async fn reconcile(&self) -> Result<(), StartError> {
        let metadata = self.metadata();
        let (placed, running) = timed_round("reconcile", || {
            let placed = Self::placed_here(&metadata, self.id());
            let running: BTreeSet<GroupId> = self.groups().into_iter().filter(|g| *g != GroupId::Metadata).collect();
            (placed, running)
        });
        let (began, mut started) = (tokio::time::Instant::now(), 0usize);
        for (group, placement) in &placed {
            if running.contains(group) {
                continue;
            }
            started += 1;
            let limits = metadata.limits().clone();
            let state_machine = GroupStateMachine::open(
                self.inner.store.clone(),
                group.key(),
                GroupStateMachine::initial_partition(limits),
            )?;
            self.start_group(group.clone(), state_machine).await?;
            // Its election timer is off until its turn (see `waves`).
            let initialise = placement.may_initialise(self.id()).then(|| placement.members(&metadata));
            let preferred = placement.placement.preferred_leader().map(|b| b.0);
            let rank = placement.placement.replicas.iter().position(|b| b.0 == self.id()).unwrap_or(usize::MAX);
            self.wait_for_turn(group.clone(), waves::Start { initialise, preferred, rank });
        }
        if started > 0 {
            tracing::info!(started, elapsed_ms = began.elapsed().as_millis() as u64, "partition groups started");
            // Their first turns now, not at the next round.
            timed_round("waves", || self.wave_round());
        }
        let latest = self.metadata();
        for group in running.iter().filter(|group| !placed.contains_key(*group)) {
            let Some(raft) = self.raft(group) else { continue };
            if !membership::may_stop(&latest, group, &raft, self.id()) || self.placement_lags(&latest, group) {
                continue;
            }
            let topic_gone = Self::placement_of(&latest, group).is_none();
            let handle = self.inner.groups.lock().expect("groups").remove(group);
            self.inner.cursors.lock().expect("cursors").retain(|(partition, _), _| partition != group);
            if let Some(handle) = handle {
                let _ = handle.raft.shutdown().await;
                // Only a deleted topic's data goes (a topic created again
                // gets new groups). A replica moved away keeps its vote and
                // log, and a move back reopens them: a member that has not
                // yet seen the configuration without this broker still
                // counts it as a voter, and an emptied replica would grant
                // that member's vote on any log, letting it overwrite
                // committed entries (seed 2000379).
                if topic_gone {
                    if let Err(error) = self.inner.store.remove_group(&group.key()).await {
                        tracing::error!(%error, %group, "could not remove a deleted partition's data");
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether this broker's metadata is behind the placement `group` itself
    /// has followed (`FollowPlacement`): a restarted broker catching up on
    /// its metadata passes through placements older than the group's, and
    /// must not stop a replica that a newer move put here. (Seed 530000112:
    /// a partition of replication factor 1 moved to broker 2 was stopped
    /// there, its only replica and leader, while broker 2 applied the
    /// metadata of the move before, after a crash.)
    fn placement_lags(&self, metadata: &MetadataState, group: &GroupId) -> bool {
        let Some(placement) = Self::placement_of(metadata, group) else { return false };
        let Some(handle) = self.inner.groups.lock().expect("groups").get(group).cloned() else { return false };
        let state = handle.state_machine.state();
        let state = state.lock().expect("partition state");
        matches!(&*state, GroupState::Partition(partition) if partition.placement_epoch() > placement.epoch)
    }

    /// Every duty interval: move the membership of partition groups led
    /// here towards their placement; while this broker leads the metadata
    /// group, keep member sessions, expire lapsed members and register the
    /// configured brokers that are not registered yet.
    async fn leader_duties_forever(&self) {
        loop {
            self.leader_duties().await;
            tokio::time::sleep(self.inner.config.duty_interval).await;
        }
    }

    async fn leader_duties(&self) {
        timed_round("memberships", || self.converge_partition_memberships());
        timed_round("retention", || self.enforce_retention());
        let Some(metadata) = self.raft(&GroupId::Metadata) else { return };
        let leading = metadata.current_leader().await == Some(self.id());
        self.keep_registration(&metadata, leading).await;
        let was_leading = std::mem::replace(&mut *self.inner.was_metadata_leader.lock().expect("leader flag"), leading);
        if !leading {
            return;
        }
        self.finish_joint_membership(&metadata);
        // Session deadlines are monotonic: a step of the wall clock neither
        // keeps a dead member nor expires the live ones.
        let now = self.inner.clock.monotonic();
        let expired = {
            let state = self.metadata();
            let mut sessions = self.inner.sessions.lock().expect("sessions");
            if was_leading {
                sessions.sync(&state, now);
            } else {
                // A new coordinator gives every member a fresh session.
                sessions.grant_fresh_sessions(&state, now);
            }
            sessions.expired(now)
        };
        #[cfg(madsim)]
        let expired = if keel_core::planted::is_planted(keel_core::planted::Bug::NeverExpireMembers) {
            Vec::new()
        } else {
            expired
        };
        for command in expired {
            // Bounded: a proposal made just before this broker lost the
            // lead may never be answered, and the duties must go on (they
            // are retried next round).
            match tokio::time::timeout(
                DUTY_PROPOSAL_TIMEOUT,
                self.propose(&GroupId::Metadata, Command::Metadata(command)),
            )
            .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(%error, "could not expire members yet"),
                Err(_) => tracing::debug!("expiring members got no answer in time; retrying"),
            }
        }
        self.forget_expired_groups().await;
    }

    /// Stop the node: its groups, the server and every task. The store is
    /// released once the last handle is dropped.
    pub async fn shutdown(&self) {
        // End long polls and produce streams, which would otherwise hold
        // their connections (and so the servers' graceful shutdown) for up
        // to a poll's longest wait, or for ever.
        self.inner.stopping.stop();
        // Stop the servers first, closing their connections, so that peers
        // reconnect to whatever runs on these addresses next.
        for stop in &self.inner.stop_servers {
            stop.notify_one();
        }
        let servers = std::mem::take(&mut *self.inner.servers.lock().expect("servers"));
        for server in servers {
            if tokio::time::timeout(Duration::from_secs(5), server).await.is_err() {
                tracing::warn!(node = self.id(), "a server did not stop within 5 s");
            }
        }
        // Stop the reconciler and duties first, so no group starts after
        // the groups are stopped.
        for task in self.inner.tasks.lock().expect("tasks").drain(..) {
            task.abort();
        }
        let metadata = self.metadata();
        *self.inner.metadata_at_shutdown.lock().expect("metadata at shutdown") = Some(metadata);
        let groups: Vec<GroupHandle> =
            std::mem::take(&mut *self.inner.groups.lock().expect("groups")).into_values().collect();
        // All at once: one after another, a broker holding 10,000 groups
        // took minutes to stop on SIGTERM.
        futures_util::future::join_all(groups.iter().map(|group| group.raft.shutdown())).await;
        // Stopped Raft workers may still hold the store: close the database
        // under them, and wait for in-flight operations to finish, so the
        // files can be opened again at once.
        let database = self.inner.store.close();
        for _ in 0..500 {
            if database.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::warn!(node = self.id(), "node stopped but its store is still in use");
    }
}

/// A one-way flag many tasks can wait on: set once, when the node begins to
/// stop. A `Notify` (woken in the order its waiters came) beside the flag,
/// not a watch channel, whose many waiters wake in no fixed order.
#[derive(Default)]
struct Stopping {
    set: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl Stopping {
    fn stop(&self) {
        self.set.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn wait(&self) {
        let notified = self.notify.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the flag is read, so a stop in between wakes it.
        notified.as_mut().enable();
        if self.is_set() {
            return;
        }
        notified.await
    }
}
