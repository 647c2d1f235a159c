//! The Raft transport between brokers: one gRPC service carries every
//! group's AppendEntries, Vote and snapshot chunks, over one channel per
//! peer, with the group named in each request. While a few partition-group
//! calls are in flight to a peer, the next ones go together in one `Batch`
//! RPC ([`super::batch`]); each is served here as if it came alone.
//!
//! Each RPC carries openraft's deadline (`RPCOption::hard_ttl`), so a
//! partitioned peer costs a group one timeout per attempt, then openraft's
//! backoff; other groups replicate over their own requests and are not held
//! up. A request for a group that is not running here (yet) fails with
//! `NotFound`, which the sender treats as unreachable and retries later.
//!
//! The transport is served on the broker's internal listener only. Every
//! request carries the cluster id and the cluster secret, checked before a
//! group sees the request; terms, indexes and entry sequences from the wire
//! are checked for sanity ([`sane_vote`], [`sane_append`],
//! [`sane_snapshot`]) so that no message can drive openraft into one of its
//! assertions. The same service carries `Join`: a broker asking the
//! metadata leader to register it and make it a voter.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::raft::raft_transport_client::RaftTransportClient;
use keel_proto::raft::raft_transport_server::RaftTransport;
use keel_proto::raft::{RaftBatch, RaftCall, RaftCallReply, RaftReply, RaftRequest, RaftRpc};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};

use super::batch::{call_alone, Destination, PeerBatches, BATCH_CALLS_ACCEPTED_MAX};
use super::types::{NodeId, Raft, TypeConfig};
use crate::group::GroupId;

/// Largest Raft message on the wire. AppendEntries requests larger than
/// this are not sent: openraft is told the payload is too large and retries
/// with fewer entries (one entry is at most a 4 MiB batch).
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Largest term a Raft message may carry. Real terms grow by one per
/// election; a term near `u64::MAX` can only be forged, and would overflow
/// inside openraft.
pub const WIRE_TERM_MAX: u64 = 1 << 48;
/// Largest log index (or snapshot offset) a Raft message may carry.
pub const WIRE_INDEX_MAX: u64 = 1 << 56;

/// What a broker proves to its peers: the cluster it belongs to and the
/// cluster's secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterIdentity {
    pub cluster_id: u64,
    pub secret: String,
}

impl std::fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("ClusterIdentity").field("cluster_id", &self.cluster_id).finish_non_exhaustive()
    }
}

/// Equal secrets, compared in time independent of where they differ.
fn secrets_match(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    let differ = given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    given.len() == expected.len() && differ == 0
}

/// What a broker tells each peer every liveness interval: that it is
/// alive, and which partition groups shared with that peer it leads and has
/// let go quiet (see `node::quiesce`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    pub broker: NodeId,
    /// Bounded by the groups placed on the sender.
    pub quiet: Vec<QuietGroup>,
    /// Groups the recipient listed quiet in its last report that the
    /// sender follows there but cannot match (it does not know the
    /// recipient as its leader, or has not applied the whole log): the
    /// recipient wakes them for a while, so that heartbeats tell the
    /// follower what it is missing, rather than the follower standing for
    /// election once its patience runs out. Bounded like `quiet`. (The
    /// last field: a broker of the version before it decodes the report
    /// without it.)
    pub wake: Vec<String>,
}

/// A liveness report as a broker of the version before `Liveness::wake`
/// sends it.
#[derive(Serialize, Deserialize)]
struct LivenessWithoutWake {
    broker: NodeId,
    quiet: Vec<QuietGroup>,
}

impl Liveness {
    /// Decode a report, from a broker of this version or of the one before.
    fn decode(payload: &[u8]) -> Result<Liveness, postcard::Error> {
        postcard::from_bytes(payload).or_else(|_| {
            let LivenessWithoutWake { broker, quiet } = postcard::from_bytes(payload)?;
            Ok(Liveness { broker, quiet, wake: Vec::new() })
        })
    }
}

/// A group its leader let go quiet: in `term`, with `last_index` its last
/// log index, every voter on a broker it hears having all of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuietGroup {
    pub group: String,
    pub term: u64,
    pub last_index: Option<u64>,
}

/// A broker's request to join the cluster (or to update its addresses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    pub broker: NodeId,
    /// Where clients reach it.
    pub address: String,
    /// Where brokers reach it.
    pub internal_address: String,
    /// The broker was a member before (its own metadata log names it as a
    /// voter, or its committed membership names it): the leader takes it
    /// back only while its membership still names it, so a broker removed while it was down or cut off (its own
    /// log never heard of the removal) cannot add itself back by restarting
    /// with `--join`.
    pub rejoin: bool,
}

/// A partition leader's word that its group's membership is exactly the
/// placement of `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveSettledReport {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub epoch: u64,
}

/// Why the metadata leader did not take a join or a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum JoinRefusal {
    #[error("this broker does not lead the metadata group; the leader is {leader:?} at {internal_address:?}")]
    NotLeader { leader: Option<NodeId>, internal_address: Option<String> },
    #[error("{0}")]
    Refused(String),
    #[error("{0}; retry")]
    Retry(String),
}

/// Channels to peers, one per peer address, shared by every group; and
/// when each peer last answered a Raft message (its liveness as this broker
/// sees it, on the runtime's monotonic clock; for reporting only).
#[derive(Debug, Clone)]
pub struct Peers {
    identity: Arc<ClusterIdentity>,
    /// Each peer address's channel, and when it was made.
    channels: Arc<Mutex<BTreeMap<String, (Channel, tokio::time::Instant)>>>,
    /// Each peer's permits for partition groups' Raft calls in flight
    /// ([`PEER_CALLS_IN_FLIGHT_MAX`]).
    admission: Arc<Mutex<BTreeMap<NodeId, Arc<tokio::sync::Semaphore>>>>,
    /// Each peer's (at each address) partition-group calls in flight, and
    /// those queued to go together (see [`super::batch`]).
    batches: Arc<Mutex<BatchesByPeer>>,
    answered: Arc<Mutex<BTreeMap<NodeId, tokio::time::Instant>>>,
    /// Peers that just failed to answer, and until when no group on this
    /// broker tries them again (a call waits until then): a down peer costs
    /// one attempt per [`PEER_RETRY_AFTER`], not one per group per
    /// heartbeat.
    resting: Arc<Mutex<BTreeMap<NodeId, tokio::time::Instant>>>,
    /// Each peer's reachability as this broker's calls find it: logged
    /// when it changes, not on every failed call of every group.
    health: Arc<Mutex<BTreeMap<NodeId, PeerHealth>>>,
    /// Latency of the calls answered, by RPC (registered by the node's
    /// metrics; unregistered, it is only counted).
    call_latency: crate::metrics::RaftCallLatency,
    /// TLS for calls to peers (`None`: plaintext).
    #[cfg(not(madsim))]
    tls: Option<Arc<crate::tls::Tls>>,
}

/// Each peer's batches, by its id and address.
type BatchesByPeer = BTreeMap<(NodeId, String), Arc<PeerBatches>>;

/// One peer's reachability, for logs and metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerHealth {
    /// Since when no call reached it, if none does now.
    pub down_since: Option<tokio::time::Instant>,
    /// Calls to it that failed to reach it, since this broker started.
    pub failed_calls: u64,
    /// Raft calls sent to it (answered or not; not those held back while
    /// it rests), since this broker started.
    pub calls: u64,
    /// Batch RPCs sent to it, each carrying several of those calls.
    pub batches: u64,
}

/// How long a peer that did not answer rests before the next attempt.
pub const PEER_RETRY_AFTER: Duration = Duration::from_millis(200);

/// Raft calls of partition groups one broker has in flight to one peer, at
/// most (the metadata group's are not counted: they are few, and must not
/// wait behind the partitions'; nor are snapshot chunks). A call that finds no room before its time
/// limit fails as if the peer were unreachable, and its group backs off.
/// Without a bound, thousands of groups woken at once (a restart) each sent
/// their peers a call at the same instant: the peers answered them later
/// than their 75 ms time limit, the calls were sent again, and the queue
/// never drained (at 10,000 partitions a second restart never converged).
/// 128 calls are what a peer on these machines answers in well under that
/// limit.
pub const PEER_CALLS_IN_FLIGHT_MAX: usize = 128;

/// The youngest channel to a peer that a timed-out call may drop (so that
/// the next call connects anew): at most one new connection per peer per
/// this long.
pub const CHANNEL_MIN_AGE: Duration = crate::node::KEEPALIVE_TIMEOUT;

/// A transport failure before the peer answered.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer address {address:?} is not usable: {reason}")]
    BadAddress { address: String, reason: String },
    #[error("the peer answered {0}")]
    Status(#[from] tonic::Status),
    #[error("a message did not encode or decode: {0}")]
    Codec(#[from] postcard::Error),
    #[error("a {bytes}-byte message is over the {RAFT_MESSAGE_BYTES_MAX}-byte limit")]
    TooLarge { bytes: usize },
    #[error("the peer did not answer a moment ago; it is tried again shortly")]
    Resting,
    #[error("the peer did not answer within the call's time limit")]
    TimedOut,
    #[error("{PEER_CALLS_IN_FLIGHT_MAX} calls to the peer are in flight already; the group tries again shortly")]
    Busy,
}

impl Peers {
    /// No channels yet; requests carry `identity`.
    pub fn new(identity: ClusterIdentity) -> Peers {
        Peers {
            identity: Arc::new(identity),
            channels: Arc::default(),
            admission: Arc::default(),
            batches: Arc::default(),
            answered: Arc::default(),
            resting: Arc::default(),
            health: Arc::default(),
            call_latency: crate::metrics::raft_call_latency(),
            #[cfg(not(madsim))]
            tls: None,
        }
    }

    /// Observe the latency of answered calls in `call_latency` (the
    /// node's metrics).
    pub fn with_call_latency(self, call_latency: crate::metrics::RaftCallLatency) -> Peers {
        Peers { call_latency, ..self }
    }

    /// Call peers over TLS with `tls`'s certificates (read anew for each
    /// connection made: a reload reaches new connections).
    #[cfg(not(madsim))]
    pub fn with_tls(self, tls: Option<Arc<crate::tls::Tls>>) -> Peers {
        Peers { tls, ..self }
    }

    /// Drop every open channel: the next call to each peer connects anew
    /// (with reloaded certificates, say).
    pub fn reconnect(&self) {
        self.channels.lock().expect("peer channels").clear();
    }

    /// The identity this broker proves to its peers.
    pub fn identity(&self) -> &ClusterIdentity {
        &self.identity
    }

    /// Ask the broker at `internal_address` (the metadata leader) to take
    /// `request`: register it and make it a metadata voter. Waits until it
    /// has caught up, up to `timeout`.
    pub async fn join(
        &self,
        internal_address: &str,
        request: &JoinRequest,
        timeout: Duration,
    ) -> Result<Result<(), JoinRefusal>, TransportError> {
        let (mut client, message) = self.admin_call(internal_address, request, timeout)?;
        let reply = client.join(message).await?;
        Ok(postcard::from_bytes(&reply.into_inner().payload)?)
    }

    /// A client and a request (carrying this broker's identity) for one of
    /// the transport's broker-to-broker admin calls.
    fn admin_call(
        &self,
        internal_address: &str,
        payload: &impl Serialize,
        timeout: Duration,
    ) -> Result<(RaftTransportClient<Channel>, tonic::Request<RaftRequest>), TransportError> {
        let client = RaftTransportClient::new(self.channel(internal_address)?);
        let mut message = tonic::Request::new(RaftRequest {
            group: String::new(),
            payload: postcard::to_stdvec(payload)?,
            cluster_id: self.identity.cluster_id,
            secret: self.identity.secret.clone(),
        });
        message.set_timeout(timeout);
        Ok((client, message))
    }

    /// Tell the metadata leader at `internal_address` that a partition's
    /// moves have settled.
    pub async fn report_settled(
        &self,
        internal_address: &str,
        report: &MoveSettledReport,
    ) -> Result<Result<(), JoinRefusal>, TransportError> {
        let (mut client, message) = self.admin_call(internal_address, report, Duration::from_secs(5))?;
        let reply = client.move_settled(message).await?;
        Ok(postcard::from_bytes(&reply.into_inner().payload)?)
    }

    /// Tell `peer` at `internal_address` that this broker is alive, and
    /// which groups it let go quiet.
    pub async fn liveness(
        &self,
        peer: NodeId,
        internal_address: &str,
        report: &Liveness,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let (mut client, message) = self.admin_call(internal_address, report, timeout)?;
        client.liveness(message).await?;
        self.answered.lock().expect("peer answers").insert(peer, tokio::time::Instant::now());
        self.reached(peer);
        Ok(())
    }

    /// The peers that answered a call of this broker's at some time.
    pub fn answered_peers(&self) -> Vec<NodeId> {
        self.answered.lock().expect("peer answers").keys().copied().collect()
    }

    /// How long ago `peer` last answered a Raft message from this broker.
    pub fn since_answer(&self, peer: NodeId) -> Option<Duration> {
        self.answered.lock().expect("peer answers").get(&peer).map(|at| at.elapsed())
    }

    /// Every peer called so far, with its reachability.
    pub fn health(&self) -> BTreeMap<NodeId, PeerHealth> {
        self.health.lock().expect("peer health").clone()
    }

    /// A call to `peer` at `address` could not reach it (`reason`). The
    /// first failure after it answered is logged; the rest are counted.
    fn unreachable(&self, peer: NodeId, address: &str, reason: &TransportError) {
        let mut health = self.health.lock().expect("peer health");
        let entry = health.entry(peer).or_default();
        entry.failed_calls += 1;
        if entry.down_since.is_none() {
            entry.down_since = Some(tokio::time::Instant::now());
            tracing::warn!(
                peer,
                %address,
                %reason,
                "broker {peer} does not answer; its groups retry it every {} ms (counted in \
                 keel_peer_failed_calls_total; logged again when it answers)",
                PEER_RETRY_AFTER.as_millis()
            );
        }
    }

    /// A Raft call was sent to `peer`.
    fn count_call(&self, peer: NodeId) {
        self.health.lock().expect("peer health").entry(peer).or_default().calls += 1;
    }

    /// A batch of calls was sent to `peer`.
    pub(super) fn count_batch(&self, peer: NodeId) {
        self.health.lock().expect("peer health").entry(peer).or_default().batches += 1;
    }

    /// A call to `peer` reached it.
    fn reached(&self, peer: NodeId) {
        let mut health = self.health.lock().expect("peer health");
        let entry = health.entry(peer).or_default();
        if let Some(since) = entry.down_since.take() {
            tracing::warn!(peer, down_ms = since.elapsed().as_millis() as u64, "broker {peer} answers again");
        }
    }

    /// The calls in flight to `peer` at `address`, and its queue.
    fn batches(&self, peer: NodeId, address: &str) -> Arc<PeerBatches> {
        let mut batches = self.batches.lock().expect("peer batches");
        if let Some(found) = batches.get(&(peer, address.to_string())) {
            return found.clone();
        }
        let made = Arc::new(PeerBatches::default());
        batches.insert((peer, address.to_string()), made.clone());
        made
    }

    pub(super) fn channel(&self, address: &str) -> Result<Channel, TransportError> {
        let mut channels = self.channels.lock().expect("peer channels");
        if let Some((channel, _)) = channels.get(address) {
            return Ok(channel.clone());
        }
        #[cfg(not(madsim))]
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        #[cfg(madsim)]
        let scheme = "http";
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| TransportError::BadAddress { address: address.to_string(), reason: e.to_string() })?;
        #[cfg(not(madsim))]
        let endpoint = match &self.tls {
            Some(tls) => endpoint
                .tls_config(tls.outgoing())
                .map_err(|e| TransportError::BadAddress { address: address.to_string(), reason: e.to_string() })?,
            None => endpoint,
        };
        let endpoint = endpoint
            .connect_timeout(Duration::from_millis(500))
            // Probe the connection, so that one left dead by a partition
            // is dropped (and the next call reconnects) within seconds.
            .http2_keep_alive_interval(crate::node::KEEPALIVE_INTERVAL)
            .keep_alive_timeout(crate::node::KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_keepalive(Some(crate::node::KEEPALIVE_INTERVAL));
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), (channel.clone(), tokio::time::Instant::now()));
        Ok(channel)
    }

    /// Forget the channel to `address`: a call on it timed out, and its
    /// connection may be dead without knowing it; the next call connects
    /// anew. A channel younger than [`CHANNEL_MIN_AGE`] is kept: every call
    /// in flight on a dead connection times out, and each forgetting it
    /// made a connection per call (hundreds to an overloaded peer, each
    /// one more for it to accept: a restarted cluster of 10,000 partitions
    /// never recovered).
    fn forget_channel(&self, address: &str) {
        let mut channels = self.channels.lock().expect("peer channels");
        if channels.get(address).is_some_and(|(_, made)| made.elapsed() >= CHANNEL_MIN_AGE) {
            channels.remove(address);
        }
    }

    /// Wait, until `give_up` at the latest, for a permit to call `peer` on
    /// behalf of a partition group (see [`PEER_CALLS_IN_FLIGHT_MAX`]).
    async fn admit(
        &self,
        peer: NodeId,
        give_up: tokio::time::Instant,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, TransportError> {
        let permits = self
            .admission
            .lock()
            .expect("peer admission")
            .entry(peer)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(PEER_CALLS_IN_FLIGHT_MAX)))
            .clone();
        // `timeout`, not `timeout_at`: madsim 0.2.34's time has no `timeout_at`.
        let wait = give_up.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(wait, permits.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) | Err(_) => Err(TransportError::Busy),
        }
    }
}

/// Builds per-peer clients for one group.
#[derive(Debug, Clone)]
pub struct GroupNetwork {
    group: String,
    peers: Peers,
}

impl GroupNetwork {
    pub fn new(group: &GroupId, peers: Peers) -> Self {
        GroupNetwork { group: group.key(), peers }
    }
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            group: self.group.clone(),
            bounded: self.group != GroupId::Metadata.key(),
            peers: self.peers.clone(),
            target,
            address: node.addr.clone(),
        }
    }
}

/// One group's client for one peer.
#[derive(Debug)]
pub struct PeerClient {
    group: String,
    /// Whether its calls take one of the peer's permits (a partition
    /// group's do; the metadata group's do not).
    bounded: bool,
    peers: Peers,
    target: NodeId,
    address: String,
}

/// Which RPC to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl Rpc {
    fn label(self) -> crate::metrics::RaftRpc {
        match self {
            Rpc::AppendEntries => crate::metrics::RaftRpc::AppendEntries,
            Rpc::Vote => crate::metrics::RaftRpc::Vote,
            Rpc::InstallSnapshot => crate::metrics::RaftRpc::InstallSnapshot,
        }
    }
}

/// The simulation's duplicating network (madsim delivers each message once
/// and, per connection, in order): while on, a share of the Raft messages
/// a broker sends that were answered is delivered a second time, 1-300 ms
/// later, so that peers see duplicates, and stale copies after newer
/// messages. Applies to every broker of the run (one simulation runs on one
/// thread).
#[cfg(madsim)]
pub mod sim_duplication {
    use std::cell::Cell;
    use std::time::Duration;

    use madsim::rand::Rng;

    thread_local! {
        static PERCENT: Cell<u32> = const { Cell::new(0) };
    }

    /// Deliver `percent` of answered Raft messages again (0: none).
    pub fn set(percent: u32) {
        PERCENT.with(|p| p.set(percent.min(100)));
    }

    /// Whether to deliver this message again, and after how long.
    pub(super) fn draw() -> Option<Duration> {
        let percent = PERCENT.with(Cell::get);
        if percent == 0 {
            return None;
        }
        let mut rng = madsim::rand::thread_rng();
        rng.gen_ratio(percent, 100).then(|| Duration::from_millis(rng.gen_range(1..=300)))
    }
}

impl PeerClient {
    async fn call<Req: Serialize, Resp: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        rpc: Rpc,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Result<Resp, RaftError<NodeId, E>>, TransportError> {
        // Wait out the peer's rest, but no longer than the RPC's soft time
        // limit, then fail: failing at once would let openraft retry in the
        // same instant, forever; waiting longer would delay heartbeats.
        let give_up = tokio::time::Instant::now() + option.soft_ttl();
        let resting_until = self.peers.resting.lock().expect("resting peers").get(&self.target).copied();
        if let Some(until) = resting_until {
            tokio::time::sleep_until(until.min(give_up)).await;
            if until > give_up {
                return Err(TransportError::Resting);
            }
        }
        // Snapshot chunks take no permit: one may hold it for seconds, and
        // a few streams would starve every group's heartbeats and votes.
        let permit = match self.bounded && !matches!(rpc, Rpc::InstallSnapshot) {
            true => Some(self.peers.admit(self.target, give_up).await?),
            false => None,
        };
        // The call ends at the soft time limit, here rather than by openraft
        // dropping it at the hard one, so that a timeout is seen.
        let left = give_up.saturating_duration_since(tokio::time::Instant::now());
        // Admitted with too little time left to be answered: not sent, as
        // it would only time out (and might count against the peer).
        if permit.is_some() && left < option.soft_ttl() / 4 {
            return Err(TransportError::Busy);
        }
        let sent = tokio::time::Instant::now();
        let result = match tokio::time::timeout(left, self.call_peer(rpc, request, option)).await {
            Ok(result) => result,
            Err(_) => Err(TransportError::TimedOut),
        };
        if result.is_ok() {
            let labels = crate::metrics::RaftCallLabels { rpc: rpc.label() };
            self.peers.call_latency.get_or_create(&labels).observe(sent.elapsed().as_secs_f64());
        }
        // A call timed out and nothing else came back from the peer lately:
        // its connection may be dead without knowing it (a partition drops
        // packets; TCP retransmits with back-off).
        if result.as_ref().err().is_some_and(|e| timed_out(e) && self.silent()) {
            self.peers.forget_channel(&self.address);
        }
        if !matches!(result, Err(TransportError::Resting)) {
            self.peers.count_call(self.target);
        }
        match &result {
            Ok(_) => self.peers.reached(self.target),
            Err(error) if self.unreachable(error) => self.peers.unreachable(self.target, &self.address, error),
            Err(_) => {}
        }
        let mut resting = self.peers.resting.lock().expect("resting peers");
        match &result {
            // Only a peer that could not be reached rests: one slow call
            // (a timed-out snapshot chunk, say) says nothing of the others.
            Err(TransportError::Status(status)) if status.code() == tonic::Code::Unavailable => {
                resting.insert(self.target, tokio::time::Instant::now() + PEER_RETRY_AFTER);
            }
            _ => {
                resting.remove(&self.target);
            }
        }
        result
    }

    async fn call_peer<Req: Serialize, Resp: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        rpc: Rpc,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Result<Resp, RaftError<NodeId, E>>, TransportError> {
        let payload = crate::encoding::to_sized_vec(request)?;
        if payload.len() > RAFT_MESSAGE_BYTES_MAX - 1024 {
            return Err(TransportError::TooLarge { bytes: payload.len() });
        }
        #[cfg(madsim)]
        let copy = sim_duplication::draw().map(|after| (after, payload.clone()));
        let to = Destination { peers: self.peers.clone(), peer: self.target, address: self.address.clone() };
        // A partition group's AppendEntries and votes may go together with
        // other groups' (snapshot chunks and the metadata group's calls
        // always go alone: they must not wait behind the partitions').
        // Boxed: the calls' futures are large, and inline they made every
        // caller's future large too, copied each time openraft moves it
        // (into its time limit, then into its replication task's state).
        let reply = match self.bounded && rpc != Rpc::InstallSnapshot {
            true => {
                let batches = self.peers.batches(self.target, &self.address);
                Box::pin(batches.call(&to, rpc, &self.group, payload, option.hard_ttl())).await?
            }
            false => Box::pin(call_alone(&to, rpc, &self.group, payload, option.hard_ttl())).await?,
        };
        self.peers.answered.lock().expect("peer answers").insert(self.target, tokio::time::Instant::now());
        #[cfg(madsim)]
        if let Some((after, copy)) = copy {
            // The simulation's duplicating network: the same message again,
            // alone and later (after messages sent since), its answer
            // dropped.
            let (group, ttl) = (self.group.clone(), option.hard_ttl());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = call_alone(&to, rpc, &group, copy, ttl).await;
            });
        }
        Ok(postcard::from_bytes(&reply)?)
    }

    // openraft's error types are large; they are its API, not ours.
    #[allow(clippy::result_large_err)]
    fn to_rpc_error<T, E: std::error::Error>(
        &self,
        result: Result<Result<T, RaftError<NodeId, E>>, TransportError>,
    ) -> RpcResult<T, E> {
        match result {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(self.target, remote))),
            // openraft's replication sends again at once after any other
            // error. Against a peer that is down or cut off, each of the
            // thousands of groups a broker leads would do so once per call
            // time limit, reading its entries each time: at 10,000
            // partitions that kept a restarted cluster's brokers too busy to
            // hear each other, and no group could go quiet. (The back-off's
            // `select!` is `biased` in the vendored openraft, so it replays.)
            Err(e) if self.unreachable(&e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }

    /// Whether a failed call says the peer cannot be reached now (rather
    /// than that this one call failed): it could not be connected to, or
    /// it timed out with nothing heard from the peer lately. One answer
    /// for the peer's health report and for openraft's back-off, but for
    /// `Busy` (returned before a call is sent, so never in the report).
    fn unreachable(&self, error: &TransportError) -> bool {
        match error {
            // Not the peer's doing, but the group backs off all the same: a
            // group retrying at once would read its entries again each
            // time, and the calls waiting for room are what overloads.
            TransportError::Resting | TransportError::Busy => true,
            TransportError::Status(status) if status.code() == tonic::Code::Unavailable => true,
            error => timed_out(error) && self.silent(),
        }
    }

    /// Nothing came back from the peer lately (one slow call among
    /// answered ones says nothing of the connection).
    fn silent(&self) -> bool {
        self.peers.since_answer(self.target).is_none_or(|since| since > crate::node::KEEPALIVE_TIMEOUT)
    }
}

/// Whether a call ran out of time (here, or by the peer's deadline).
fn timed_out(error: &TransportError) -> bool {
    match error {
        TransportError::TimedOut => true,
        TransportError::Status(status) => status.code() == tonic::Code::DeadlineExceeded,
        _ => false,
    }
}

/// Whether a status says the message was over a size limit (gRPC's own
/// "message length too large"), rather than anything else that shares its
/// codes: an HTTP/2 GOAWAY `ENHANCE_YOUR_CALM` ("too_many_resets") also
/// arrives as RESOURCE_EXHAUSTED, and fewer entries would not help it.
fn message_too_large(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::ResourceExhausted | tonic::Code::OutOfRange)
        && status.message().contains("message length too large")
}

type RpcResult<T, E = openraft::error::Infallible> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

/// The first pause before a group's replication tries an unreachable peer
/// again; each further failure doubles it, up to
/// [`UNREACHABLE_BACKOFF_MAX`].
pub const UNREACHABLE_BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest such pause: a follower back after a failure is reached
/// within this (its quiet groups wait on broker liveness, not on this).
pub const UNREACHABLE_BACKOFF_MAX: Duration = Duration::from_millis(800);

/// The pauses before each further try of an unreachable peer: doubling,
/// then [`UNREACHABLE_BACKOFF_MAX`] for as long as it stays unreachable
/// (capped as it goes: doubling on past the cap overflowed a `Duration`
/// after 64 failures in a row and panicked the replication task).
fn unreachable_pauses() -> impl Iterator<Item = Duration> + Send + 'static {
    std::iter::successors(Some(UNREACHABLE_BACKOFF_FIRST), |pause| Some((*pause * 2).min(UNREACHABLE_BACKOFF_MAX)))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    fn backoff(&self) -> Backoff {
        Backoff::new(unreachable_pauses())
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let fewer =
            || RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((rpc.entries.len() as u64 / 2).max(1)));
        match self.call(Rpc::AppendEntries, &rpc, &option).await {
            // Too many entries for one message: openraft retries with fewer.
            Err(TransportError::TooLarge { .. }) => Err(fewer()),
            Err(TransportError::Status(status)) if message_too_large(&status) => Err(fewer()),
            result => self.to_rpc_error(result),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let result = self.call(Rpc::InstallSnapshot, &rpc, &option).await;
        self.to_rpc_error(result)
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> RpcResult<VoteResponse<NodeId>> {
        let result = self.call(Rpc::Vote, &rpc, &option).await;
        self.to_rpc_error(result)
    }
}

/// A join as the directory answers it.
pub type JoinFuture = Pin<Box<dyn Future<Output = Result<(), JoinRefusal>> + Send>>;

/// The groups running on this node, by key, for the transport service.
pub trait GroupDirectory: Send + Sync + 'static {
    /// The Raft handle of a group running here.
    fn raft(&self, group: &GroupId) -> Option<Raft>;

    /// Take a broker's join (on the metadata leader).
    fn join(&self, request: JoinRequest) -> JoinFuture;

    /// Take a partition leader's report that its moves settled (on the
    /// metadata leader).
    fn move_settled(&self, report: MoveSettledReport) -> JoinFuture;

    /// Take a peer's liveness report.
    fn liveness(&self, report: Liveness);

    /// A group running here appended entries from its leader.
    fn appended(&self, group: &GroupId);

    /// A Raft message from `peer` arrived (authenticated): its broker is
    /// alive, as its liveness report would say.
    fn heard_from(&self, peer: NodeId);

    /// A group running here refused `candidate` its vote in `term`, its
    /// log being shorter than this replica's.
    fn vote_refused(&self, group: &GroupId, candidate: NodeId, term: u64);
}

/// The server side of the transport: routes each request to its group.
pub struct TransportService<D> {
    directory: Arc<D>,
    identity: ClusterIdentity,
    /// Whether a request must come over TLS from a certificate that names
    /// the broker it claims to be from.
    certified_peers: bool,
}

/// The certificates a caller showed (TLS), if any.
#[cfg(not(madsim))]
type PeerCerts = Option<Arc<Vec<tonic::transport::CertificateDer<'static>>>>;
#[cfg(madsim)]
type PeerCerts = ();

#[cfg(not(madsim))]
fn peer_certs<T>(request: &tonic::Request<T>) -> PeerCerts {
    request.peer_certs()
}

#[cfg(madsim)]
fn peer_certs<T>(_request: &tonic::Request<T>) -> PeerCerts {}

impl<D> Clone for TransportService<D> {
    fn clone(&self) -> Self {
        TransportService {
            directory: self.directory.clone(),
            identity: self.identity.clone(),
            certified_peers: self.certified_peers,
        }
    }
}

impl<D: GroupDirectory> TransportService<D> {
    pub fn new(directory: Arc<D>, identity: ClusterIdentity) -> Self {
        TransportService { directory, identity, certified_peers: false }
    }

    /// Refuse requests whose TLS certificate does not name the broker they
    /// come from (see [`crate::tls`]).
    pub fn requiring_certified_peers(self, required: bool) -> Self {
        TransportService { certified_peers: required, ..self }
    }

    /// Refuse a message that claims to come from broker `claimed` (`None`:
    /// from no broker in particular) unless the caller's certificate names
    /// that broker.
    fn check_sender(&self, certs: &PeerCerts, claimed: Option<NodeId>) -> Result<(), tonic::Status> {
        if !self.certified_peers {
            return Ok(());
        }
        #[cfg(not(madsim))]
        {
            let Some(certs) = certs else {
                return Err(tonic::Status::unauthenticated(
                    "broker-to-broker calls need TLS with a certificate the cluster CA signed",
                ));
            };
            if let Some(id) = claimed {
                if !crate::tls::cert_names_broker(certs, id) {
                    return Err(tonic::Status::permission_denied(format!(
                        "the message claims to come from broker {id}, but the caller's certificate does not \
                         name {}: give each broker a certificate naming its own id",
                        crate::tls::broker_name(id)
                    )));
                }
            }
        }
        #[cfg(madsim)]
        let _ = (certs, claimed);
        Ok(())
    }

    /// Refuse a request from outside the cluster.
    fn authenticate(&self, request: &RaftRequest) -> Result<(), tonic::Status> {
        self.authenticate_as(request.cluster_id, &request.secret)
    }

    /// Refuse a request that names another cluster or lacks its secret.
    fn authenticate_as(&self, cluster_id: u64, secret: &str) -> Result<(), tonic::Status> {
        if cluster_id != self.identity.cluster_id {
            return Err(tonic::Status::failed_precondition(format!(
                "this broker belongs to cluster {:x}, the request to cluster {:x}: check the peers configuration",
                self.identity.cluster_id, cluster_id
            )));
        }
        if !secrets_match(secret, &self.identity.secret) {
            return Err(tonic::Status::unauthenticated(
                "the request does not carry this cluster's secret: give every broker the same --cluster-secret",
            ));
        }
        Ok(())
    }

    fn group(&self, request: &RaftRequest) -> Result<Raft, tonic::Status> {
        self.authenticate(request)?;
        self.running(&request.group)
    }

    /// The Raft handle of the group named `key`, running here.
    fn running(&self, key: &str) -> Result<Raft, tonic::Status> {
        let group = GroupId::parse(key).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        self.directory
            .raft(&group)
            .ok_or_else(|| tonic::Status::not_found(format!("group {group} is not running on this broker yet")))
    }

    /// Hand an AppendEntries of the authenticated caller (showing `certs`)
    /// to `group`.
    async fn serve_append(&self, certs: &PeerCerts, group: &str, payload: &[u8]) -> Result<Vec<u8>, tonic::Status> {
        let raft = self.running(group)?;
        let append: AppendEntriesRequest<TypeConfig> = decode(payload)?;
        let sender = append.vote.leader_id().voted_for();
        self.check_sender(certs, sender)?;
        sane_append(&append)?;
        if let Some(peer) = sender {
            self.directory.heard_from(peer);
        }
        let entries = !append.entries.is_empty();
        let result = raft.append_entries(append).await;
        if entries && result.is_ok() {
            if let Ok(group) = GroupId::parse(group) {
                self.directory.appended(&group);
            }
        }
        encode(&result)
    }

    /// Hand a vote request of the authenticated caller (showing `certs`)
    /// to `group`.
    async fn serve_vote(&self, certs: &PeerCerts, group: &str, payload: &[u8]) -> Result<Vec<u8>, tonic::Status> {
        let raft = self.running(group)?;
        let vote: VoteRequest<NodeId> = decode(payload)?;
        let sender = vote.vote.leader_id().voted_for();
        self.check_sender(certs, sender)?;
        sane_vote(&vote)?;
        if let Some(peer) = sender {
            self.directory.heard_from(peer);
        }
        let (term, candidate_last) = (vote.vote.leader_id().get_term(), vote.last_log_id);
        let answer = raft.vote(vote).await;
        if let (Ok(answer), Some(candidate), Ok(group)) = (&answer, sender, GroupId::parse(group)) {
            // Refused for its log (this replica's is longer), not for a
            // leader's lease or a vote already given in the term.
            if !answer.vote_granted && answer.last_log_id > candidate_last {
                self.directory.vote_refused(&group, candidate, term);
            }
        }
        encode(&answer)
    }

    /// Answer one call of a batch, within its time limit.
    async fn serve_call(self, certs: PeerCerts, index: usize, call: RaftCall) -> RaftCallReply {
        let limit = Duration::from_micros(call.timeout_us).min(BATCH_CALL_TIMEOUT_MAX);
        let served = async {
            match RaftRpc::try_from(call.rpc) {
                Ok(RaftRpc::AppendEntries) => self.serve_append(&certs, &call.group, &call.payload).await,
                Ok(RaftRpc::Vote) => self.serve_vote(&certs, &call.group, &call.payload).await,
                _ => Err(tonic::Status::invalid_argument(format!(
                    "a batched Raft call names RPC {}, which is not AppendEntries or Vote",
                    call.rpc
                ))),
            }
        };
        let result = tokio::time::timeout(limit, served).await.unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded("the batched Raft call was not answered within its time limit"))
        });
        let index = index as u32;
        match result {
            Ok(payload) => RaftCallReply { index, code: 0, message: String::new(), payload },
            Err(status) => RaftCallReply {
                index,
                code: status.code() as i32,
                message: status.message().to_string(),
                payload: Vec::new(),
            },
        }
    }
}

/// The longest a broker works on one call of a batch, whatever time limit
/// the call names.
pub const BATCH_CALL_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// The answers to one batch, each sent as it is ready.
pub type BatchAnswers = Pin<Box<dyn futures_util::Stream<Item = Result<RaftCallReply, tonic::Status>> + Send>>;

fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, tonic::Status> {
    postcard::from_bytes(payload).map_err(|e| tonic::Status::invalid_argument(format!("undecodable Raft message: {e}")))
}

fn insane(what: &str) -> tonic::Status {
    tonic::Status::invalid_argument(format!("refused a Raft message whose {what}"))
}

fn sane_term(vote: &openraft::Vote<NodeId>) -> Result<(), tonic::Status> {
    if vote.leader_id().term > WIRE_TERM_MAX {
        return Err(insane(&format!("term {} is above {WIRE_TERM_MAX}", vote.leader_id().term)));
    }
    Ok(())
}

fn sane_log_id(log_id: Option<&openraft::LogId<NodeId>>, term_max: u64, what: &str) -> Result<(), tonic::Status> {
    match log_id {
        Some(id) if id.index > WIRE_INDEX_MAX => Err(insane(&format!("{what} index {} is too large", id.index))),
        Some(id) if id.leader_id.term > term_max => {
            Err(insane(&format!("{what} term {} is above the sender's term {term_max}", id.leader_id.term)))
        }
        _ => Ok(()),
    }
}

/// A vote request whose term and last log id could be real.
pub fn sane_vote(request: &VoteRequest<NodeId>) -> Result<(), tonic::Status> {
    sane_term(&request.vote)?;
    sane_log_id(request.last_log_id.as_ref(), request.vote.leader_id().term, "last log")
}

/// An AppendEntries whose term, ids and entries could be real: entries
/// follow `prev_log_id` without a gap, with terms that never fall and never
/// pass the sender's.
pub fn sane_append(request: &AppendEntriesRequest<TypeConfig>) -> Result<(), tonic::Status> {
    sane_term(&request.vote)?;
    let term = request.vote.leader_id().term;
    sane_log_id(request.prev_log_id.as_ref(), term, "previous log")?;
    sane_log_id(request.leader_commit.as_ref(), term, "commit")?;
    let first = request.prev_log_id.map_or(0, |id| id.index + 1);
    let mut last_term = request.prev_log_id.map_or(0, |id| id.leader_id.term);
    for (expected, entry) in (first..).zip(&request.entries) {
        sane_log_id(Some(&entry.log_id), term, "entry")?;
        if entry.log_id.index != expected || entry.log_id.leader_id.term < last_term {
            return Err(insane(&format!("entries do not follow on from index {expected}")));
        }
        last_term = entry.log_id.leader_id.term;
    }
    Ok(())
}

/// A snapshot chunk whose term, last log id and offset could be real.
pub fn sane_snapshot(request: &InstallSnapshotRequest<TypeConfig>) -> Result<(), tonic::Status> {
    sane_term(&request.vote)?;
    sane_log_id(request.meta.last_log_id.as_ref(), request.vote.leader_id().term, "snapshot")?;
    if request.offset > WIRE_INDEX_MAX {
        return Err(insane(&format!("snapshot offset {} is too large", request.offset)));
    }
    Ok(())
}

fn encode<T: Serialize>(result: &T) -> Result<Vec<u8>, tonic::Status> {
    postcard::to_stdvec(result).map_err(|e| tonic::Status::internal(format!("reply did not encode: {e}")))
}

fn reply<T: Serialize>(result: &T) -> Result<tonic::Response<RaftReply>, tonic::Status> {
    Ok(tonic::Response::new(RaftReply { payload: encode(result)? }))
}

#[tonic::async_trait]
impl<D: GroupDirectory> RaftTransport for TransportService<D> {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let certs = peer_certs(&request);
        let request = request.into_inner();
        self.authenticate(&request)?;
        let payload = self.serve_append(&certs, &request.group, &request.payload).await?;
        Ok(tonic::Response::new(RaftReply { payload }))
    }

    async fn vote(&self, request: tonic::Request<RaftRequest>) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let certs = peer_certs(&request);
        let request = request.into_inner();
        self.authenticate(&request)?;
        let payload = self.serve_vote(&certs, &request.group, &request.payload).await?;
        Ok(tonic::Response::new(RaftReply { payload }))
    }

    type BatchStream = BatchAnswers;

    async fn batch(&self, request: tonic::Request<RaftBatch>) -> Result<tonic::Response<BatchAnswers>, tonic::Status> {
        let certs = peer_certs(&request);
        let batch = request.into_inner();
        self.authenticate_as(batch.cluster_id, &batch.secret)?;
        if batch.calls.len() > BATCH_CALLS_ACCEPTED_MAX {
            return Err(tonic::Status::invalid_argument(format!(
                "a batch of {} Raft calls is over the limit of {BATCH_CALLS_ACCEPTED_MAX}",
                batch.calls.len()
            )));
        }
        // Every call is served at once; each answer goes as it is ready.
        // (`PeerCerts` is `()`, a copy, in the simulation.)
        #[allow(clippy::clone_on_copy)]
        let calls: futures_util::stream::FuturesUnordered<_> = batch
            .calls
            .into_iter()
            .enumerate()
            .map(|(index, call)| self.clone().serve_call(certs.clone(), index, call))
            .collect();
        Ok(tonic::Response::new(Box::pin(futures_util::StreamExt::map(calls, Ok))))
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let certs = peer_certs(&request);
        let request = request.into_inner();
        let raft = self.group(&request)?;
        let chunk: InstallSnapshotRequest<TypeConfig> = decode(&request.payload)?;
        self.check_sender(&certs, chunk.vote.leader_id().voted_for())?;
        sane_snapshot(&chunk)?;
        reply(&raft.install_snapshot(chunk).await)
    }

    async fn join(&self, request: tonic::Request<RaftRequest>) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let certs = peer_certs(&request);
        let request = request.into_inner();
        self.authenticate(&request)?;
        let join: JoinRequest = decode(&request.payload)?;
        self.check_sender(&certs, Some(join.broker))?;
        reply(&self.directory.join(join).await)
    }

    async fn move_settled(
        &self,
        request: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let certs = peer_certs(&request);
        let request = request.into_inner();
        self.authenticate(&request)?;
        let report: MoveSettledReport = decode(&request.payload)?;
        // Any broker may report; the TLS handshake checked the cluster CA.
        self.check_sender(&certs, None)?;
        reply(&self.directory.move_settled(report).await)
    }

    async fn liveness(
        &self,
        request: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let certs = peer_certs(&request);
        let request = request.into_inner();
        self.authenticate(&request)?;
        let report = Liveness::decode(&request.payload)
            .map_err(|e| tonic::Status::invalid_argument(format!("undecodable liveness report: {e}")))?;
        self.check_sender(&certs, Some(report.broker))?;
        if report.quiet.len() > LIVENESS_GROUPS_MAX || report.wake.len() > LIVENESS_GROUPS_MAX {
            return Err(insane(&format!("liveness lists more than {LIVENESS_GROUPS_MAX} groups")));
        }
        self.directory.liveness(report);
        reply(&())
    }
}

/// Most quiet groups one liveness report may list (a broker holds fewer
/// partition replicas than this).
pub const LIVENESS_GROUPS_MAX: usize = 1 << 20;

#[cfg(test)]
mod tests {
    #[test]
    fn unreachable_pauses_double_to_their_cap_and_stay_there() {
        let pauses: Vec<Duration> = super::unreachable_pauses().take(10_000).collect();
        assert_eq!(pauses[..4], [100, 200, 400, 800].map(Duration::from_millis));
        assert!(pauses[4..].iter().all(|p| *p == super::UNREACHABLE_BACKOFF_MAX));
    }

    use super::*;

    struct NoGroups;

    impl GroupDirectory for NoGroups {
        fn raft(&self, _group: &GroupId) -> Option<Raft> {
            None
        }

        fn join(&self, _request: JoinRequest) -> JoinFuture {
            Box::pin(async { Err(JoinRefusal::Refused("no".into())) })
        }

        fn liveness(&self, _report: Liveness) {}

        fn appended(&self, _group: &GroupId) {}

        fn heard_from(&self, _peer: NodeId) {}

        fn vote_refused(&self, _group: &GroupId, _candidate: NodeId, _term: u64) {}

        fn move_settled(&self, _report: MoveSettledReport) -> JoinFuture {
            Box::pin(async { Err(JoinRefusal::Refused("no".into())) })
        }
    }

    fn refusal(cluster_id: u64, secret: &str, group: &str) -> tonic::Code {
        let identity = ClusterIdentity { cluster_id: 7, secret: "s3cret".into() };
        let service = TransportService::new(Arc::new(NoGroups), identity);
        let request = RaftRequest { group: group.to_string(), payload: Vec::new(), cluster_id, secret: secret.into() };
        service.group(&request).err().expect("refused").code()
    }

    #[test]
    fn requests_from_another_cluster_without_the_secret_or_for_unknown_groups_are_refused() {
        assert_eq!(refusal(8, "s3cret", "metadata"), tonic::Code::FailedPrecondition);
        assert_eq!(refusal(7, "", "metadata"), tonic::Code::Unauthenticated);
        assert_eq!(refusal(7, "s3creT", "metadata"), tonic::Code::Unauthenticated);
        assert_eq!(refusal(7, "s3cret!", "metadata"), tonic::Code::Unauthenticated);
        assert_eq!(refusal(7, "s3cret", "metadata"), tonic::Code::NotFound);
        assert_eq!(refusal(7, "s3cret", "not a group"), tonic::Code::InvalidArgument);
    }

    /// A batch is authenticated as a whole and bounded; each of its calls
    /// is answered by index with the status it would have had alone.
    #[tokio::test]
    async fn a_batch_answers_each_call_with_its_own_status() {
        use futures_util::StreamExt;
        let identity = ClusterIdentity { cluster_id: 7, secret: "s3cret".into() };
        let service = TransportService::new(Arc::new(NoGroups), identity);
        let call =
            |rpc: i32, group: &str| RaftCall { rpc, group: group.into(), payload: Vec::new(), timeout_us: 1_000_000 };
        let batch = |secret: &str, calls: Vec<RaftCall>| {
            tonic::Request::new(RaftBatch { cluster_id: 7, secret: secret.into(), calls })
        };
        let refused = service.batch(batch("wrong", vec![call(2, "metadata")])).await.err().expect("refused");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let many = (0..=BATCH_CALLS_ACCEPTED_MAX).map(|_| call(2, "metadata")).collect();
        let refused = service.batch(batch("s3cret", many)).await.err().expect("refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        let calls = vec![call(1, "p/t/1/0"), call(2, "not a group"), call(7, "metadata"), call(0, "metadata")];
        let answers = service.batch(batch("s3cret", calls)).await.expect("taken").into_inner();
        let mut codes: Vec<(u32, tonic::Code)> =
            answers.map(|a| a.expect("an answer")).map(|a| (a.index, tonic::Code::from_i32(a.code))).collect().await;
        codes.sort_by_key(|(index, _)| *index);
        assert_eq!(
            codes,
            [
                (0, tonic::Code::NotFound),
                (1, tonic::Code::InvalidArgument),
                (2, tonic::Code::InvalidArgument),
                (3, tonic::Code::InvalidArgument)
            ]
        );
    }

    /// A peer whose connection is open but silent (as behind a partition
    /// that drops packets): the call ends at its soft time limit, and the
    /// channel is dropped, so the next call connects afresh.
    #[tokio::test]
    async fn a_call_into_a_silent_connection_times_out_and_drops_the_channel() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        // Accept and hold connections, never answering.
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let peers = Peers::new(ClusterIdentity { cluster_id: 7, secret: "s".into() });
        let client = PeerClient {
            group: "metadata".into(),
            bounded: false,
            peers: peers.clone(),
            target: 2,
            address: address.clone(),
        };
        peers.channel(&address).unwrap();
        assert!(peers.channels.lock().unwrap().contains_key(&address));
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        let started = tokio::time::Instant::now();
        let result: Result<Result<VoteResponse<NodeId>, RaftError<NodeId>>, _> =
            client.call(Rpc::Vote, &vote, &RPCOption::new(Duration::from_millis(400))).await;
        assert!(matches!(result, Err(TransportError::TimedOut)), "{result:?}");
        assert!(started.elapsed() < Duration::from_millis(400), "ended at the soft limit");
        assert!(peers.channels.lock().unwrap().contains_key(&address), "a channel just made is kept");
        // Once the channel is older than CHANNEL_MIN_AGE, a timeout drops it.
        peers.channels.lock().unwrap().get_mut(&address).unwrap().1 -= CHANNEL_MIN_AGE;
        let result: Result<Result<VoteResponse<NodeId>, RaftError<NodeId>>, _> =
            client.call(Rpc::Vote, &vote, &RPCOption::new(Duration::from_millis(400))).await;
        assert!(matches!(result, Err(TransportError::TimedOut)), "{result:?}");
        assert!(!peers.channels.lock().unwrap().contains_key(&address), "the silent channel was dropped");
        held.abort();
    }

    /// A partition group's call waits for one of the peer's
    /// PEER_CALLS_IN_FLIGHT_MAX permits, and fails as `Busy` (the group
    /// backs off, the peer is not marked down) if none frees in time; the
    /// metadata group's calls take no permit.
    #[tokio::test]
    async fn calls_in_flight_to_a_peer_are_bounded_for_partition_groups_only() {
        let peers = Peers::new(ClusterIdentity { cluster_id: 7, secret: "s".into() });
        let far = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut held = Vec::new();
        for _ in 0..PEER_CALLS_IN_FLIGHT_MAX {
            held.push(peers.admit(2, far).await.expect("a free permit"));
        }
        let soon = tokio::time::Instant::now() + Duration::from_millis(20);
        assert!(matches!(peers.admit(2, soon).await, Err(TransportError::Busy)));
        assert!(peers.admit(3, soon).await.is_ok(), "another peer has its own permits");
        let node = BasicNode { addr: "127.0.0.1:1".into() };
        let partition = GroupId::parse("p/t/1/0").unwrap();
        let busy = GroupNetwork::new(&partition, peers.clone()).new_client(2, &node).await;
        assert!(busy.bounded);
        assert!(!GroupNetwork::new(&GroupId::Metadata, peers.clone()).new_client(2, &node).await.bounded);
        assert!(busy.unreachable(&TransportError::Busy), "the group backs off");
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        let result: Result<Result<VoteResponse<NodeId>, RaftError<NodeId>>, _> =
            busy.call(Rpc::Vote, &vote, &RPCOption::new(Duration::from_millis(40))).await;
        assert!(matches!(result, Err(TransportError::Busy)), "{result:?}");
        assert_eq!(peers.health().get(&2).map_or(0, |h| h.failed_calls), 0, "a busy call is not the peer's failure");
        held.pop();
        assert!(peers.admit(2, soon).await.is_ok(), "a permit freed is taken");
    }

    /// Brokers of this version and of the one before `Liveness::wake` read
    /// each other's liveness reports (a rolling upgrade).
    #[test]
    fn liveness_reports_decode_across_the_version_that_added_wake() {
        let quiet = vec![QuietGroup { group: "p/t/1/0".into(), term: 3, last_index: Some(9) }];
        let old = postcard::to_stdvec(&LivenessWithoutWake { broker: 2, quiet: quiet.clone() }).unwrap();
        assert_eq!(Liveness::decode(&old).unwrap(), Liveness { broker: 2, quiet: quiet.clone(), wake: Vec::new() });
        let new = Liveness { broker: 2, quiet: quiet.clone(), wake: vec!["p/t/1/1".into()] };
        let bytes = postcard::to_stdvec(&new).unwrap();
        assert_eq!(Liveness::decode(&bytes).unwrap(), new);
        // The older broker's decoder reads what it knows and ignores the rest.
        let seen: LivenessWithoutWake = postcard::from_bytes(&bytes).unwrap();
        assert_eq!((seen.broker, seen.quiet), (2, quiet));
    }

    #[test]
    fn only_a_size_limit_halves_the_next_batch() {
        let decode = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 70000000 bytes, the limit is: 67108864 bytes",
        );
        let encode = tonic::Status::resource_exhausted("Error, encoded message length too large: found 7 bytes");
        let calm = tonic::Status::resource_exhausted("h2 protocol error: http2 error: too_many_resets");
        assert!(message_too_large(&decode));
        assert!(message_too_large(&encode));
        assert!(!message_too_large(&calm));
        assert!(!message_too_large(&tonic::Status::out_of_range("read past the high watermark")));
    }

    #[test]
    fn forged_terms_and_indexes_are_refused_before_openraft_sees_them() {
        use openraft::{CommittedLeaderId, LogId, Vote};
        let log_id = |term: u64, index: u64| LogId::new(CommittedLeaderId::new(term, 1), index);
        assert!(sane_vote(&VoteRequest::new(Vote::new(3, 1), Some(log_id(2, 10)))).is_ok());
        assert!(sane_vote(&VoteRequest::new(Vote::new(u64::MAX, 1), None)).is_err());
        assert!(sane_vote(&VoteRequest::new(Vote::new(3, 1), Some(log_id(4, 10)))).is_err());
        assert!(sane_vote(&VoteRequest::new(Vote::new(3, 1), Some(log_id(2, u64::MAX)))).is_err());
        let append = |prev: Option<LogId<NodeId>>, entries: Vec<(u64, u64)>| AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(5, 1),
            prev_log_id: prev,
            leader_commit: None,
            entries: entries
                .into_iter()
                .map(|(term, index)| openraft::Entry {
                    log_id: log_id(term, index),
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
        };
        assert!(sane_append(&append(Some(log_id(2, 4)), vec![(2, 5), (5, 6)])).is_ok());
        assert!(sane_append(&append(None, vec![(1, 0)])).is_ok());
        assert!(sane_append(&append(Some(log_id(2, 4)), vec![(2, 6)])).is_err(), "a gap");
        assert!(sane_append(&append(Some(log_id(2, 4)), vec![(1, 5)])).is_err(), "a falling term");
        assert!(sane_append(&append(Some(log_id(2, 4)), vec![(6, 5)])).is_err(), "a term above the sender's");
        assert!(sane_append(&append(Some(log_id(2, u64::MAX - 1)), vec![])).is_err());
    }
}
