//! The Raft transport between brokers: one gRPC service carries every
//! group's AppendEntries, Vote and snapshot chunks, over one channel per
//! peer, with the group named in each request.
//!
//! Each RPC carries openraft's deadline (`RPCOption::hard_ttl`), so a
//! partitioned peer costs a group one timeout per attempt, then openraft's
//! backoff; other groups replicate over their own requests and are not held
//! up. A request for a group that is not running here (yet) fails with
//! `NotFound`, which the sender treats as unreachable and retries later.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::raft::raft_transport_client::RaftTransportClient;
use keel_proto::raft::raft_transport_server::RaftTransport;
use keel_proto::raft::{RaftReply, RaftRequest};
use openraft::error::{InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::types::{NodeId, Raft, TypeConfig};
use crate::group::GroupId;

/// Largest Raft message on the wire. AppendEntries requests larger than
/// this are not sent: openraft is told the payload is too large and retries
/// with fewer entries (one entry is at most a 4 MiB batch).
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Channels to peers, one per peer address, shared by every group; and
/// when each peer last answered a Raft message (its liveness as this broker
/// sees it, on the runtime's monotonic clock; for reporting only).
#[derive(Debug, Clone, Default)]
pub struct Peers {
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    answered: Arc<Mutex<BTreeMap<NodeId, tokio::time::Instant>>>,
    /// Peers that just failed to answer, and until when no group on this
    /// broker tries them again (a call waits until then): a down peer costs
    /// one attempt per [`PEER_RETRY_AFTER`], not one per group per
    /// heartbeat.
    resting: Arc<Mutex<BTreeMap<NodeId, tokio::time::Instant>>>,
}

/// How long a peer that did not answer rests before the next attempt.
pub const PEER_RETRY_AFTER: Duration = Duration::from_millis(200);

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
}

impl Peers {
    /// How long ago `peer` last answered a Raft message from this broker.
    pub fn since_answer(&self, peer: NodeId) -> Option<Duration> {
        self.answered.lock().expect("peer answers").get(&peer).map(|at| at.elapsed())
    }

    fn channel(&self, address: &str) -> Result<Channel, TransportError> {
        let mut channels = self.channels.lock().expect("peer channels");
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| TransportError::BadAddress { address: address.to_string(), reason: e.to_string() })?
            .connect_timeout(Duration::from_millis(500));
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }
}

/// Builds per-peer clients for one group.
#[derive(Debug, Clone)]
pub struct GroupNetwork {
    group: String,
    peers: Peers,
    cluster_id: u64,
}

impl GroupNetwork {
    pub fn new(group: &GroupId, peers: Peers, cluster_id: u64) -> Self {
        GroupNetwork { group: group.key(), peers, cluster_id }
    }
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            group: self.group.clone(),
            peers: self.peers.clone(),
            target,
            address: node.addr.clone(),
            cluster_id: self.cluster_id,
        }
    }
}

/// One group's client for one peer.
#[derive(Debug)]
pub struct PeerClient {
    group: String,
    peers: Peers,
    target: NodeId,
    address: String,
    cluster_id: u64,
}

/// Which RPC to call.
#[derive(Debug, Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
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
        let resting_until = self.peers.resting.lock().expect("resting peers").get(&self.target).copied();
        if let Some(until) = resting_until {
            let give_up = tokio::time::Instant::now() + option.soft_ttl();
            tokio::time::sleep_until(until.min(give_up)).await;
            if until > give_up {
                return Err(TransportError::Resting);
            }
        }
        let result = self.call_peer(rpc, request, option).await;
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
        let channel = self.peers.channel(&self.address)?;
        let mut client = RaftTransportClient::new(channel)
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        let payload = postcard::to_stdvec(request)?;
        if payload.len() > RAFT_MESSAGE_BYTES_MAX - 1024 {
            return Err(TransportError::TooLarge { bytes: payload.len() });
        }
        let mut message =
            tonic::Request::new(RaftRequest { group: self.group.clone(), payload, cluster_id: self.cluster_id });
        message.set_timeout(option.hard_ttl());
        let reply = match rpc {
            Rpc::AppendEntries => client.append_entries(message).await?,
            Rpc::Vote => client.vote(message).await?,
            Rpc::InstallSnapshot => client.install_snapshot(message).await?,
        };
        self.peers.answered.lock().expect("peer answers").insert(self.target, tokio::time::Instant::now());
        Ok(postcard::from_bytes(&reply.into_inner().payload)?)
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
            // Not `Unreachable`: that sends openraft's replication into a
            // back-off whose `select!` is not `biased`, which draws on
            // tokio's process-wide RNG and breaks replay inside a batch of
            // simulation runs. A network error retries at the next
            // heartbeat instead.
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

type RpcResult<T, E = openraft::error::Infallible> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for PeerClient {
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
            Err(TransportError::Status(status))
                if matches!(status.code(), tonic::Code::ResourceExhausted | tonic::Code::OutOfRange) =>
            {
                Err(fewer())
            }
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

/// The groups running on this node, by key, for the transport service.
pub trait GroupDirectory: Send + Sync + 'static {
    /// The Raft handle of a group running here.
    fn raft(&self, group: &GroupId) -> Option<Raft>;
}

/// The server side of the transport: routes each request to its group.
pub struct TransportService<D> {
    directory: Arc<D>,
    cluster_id: u64,
}

impl<D: GroupDirectory> TransportService<D> {
    pub fn new(directory: Arc<D>, cluster_id: u64) -> Self {
        TransportService { directory, cluster_id }
    }

    fn group(&self, request: &RaftRequest) -> Result<Raft, tonic::Status> {
        if request.cluster_id != self.cluster_id {
            return Err(tonic::Status::failed_precondition(format!(
                "this broker belongs to cluster {:x}, the request to cluster {:x}: check the peers configuration",
                self.cluster_id, request.cluster_id
            )));
        }
        let group = GroupId::parse(&request.group).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        self.directory
            .raft(&group)
            .ok_or_else(|| tonic::Status::not_found(format!("group {group} is not running on this broker yet")))
    }
}

fn decode<T: DeserializeOwned>(request: &RaftRequest) -> Result<T, tonic::Status> {
    postcard::from_bytes(&request.payload)
        .map_err(|e| tonic::Status::invalid_argument(format!("undecodable Raft message: {e}")))
}

fn reply<T: Serialize>(result: &T) -> Result<tonic::Response<RaftReply>, tonic::Status> {
    let payload =
        postcard::to_stdvec(result).map_err(|e| tonic::Status::internal(format!("reply did not encode: {e}")))?;
    Ok(tonic::Response::new(RaftReply { payload }))
}

#[tonic::async_trait]
impl<D: GroupDirectory> RaftTransport for TransportService<D> {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let request = request.into_inner();
        let raft = self.group(&request)?;
        reply(&raft.append_entries(decode(&request)?).await)
    }

    async fn vote(&self, request: tonic::Request<RaftRequest>) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let request = request.into_inner();
        let raft = self.group(&request)?;
        reply(&raft.vote(decode(&request)?).await)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let request = request.into_inner();
        let raft = self.group(&request)?;
        reply(&raft.install_snapshot(decode(&request)?).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoGroups;

    impl GroupDirectory for NoGroups {
        fn raft(&self, _group: &GroupId) -> Option<Raft> {
            None
        }
    }

    fn refusal(cluster_id: u64, group: &str) -> tonic::Code {
        let service = TransportService::new(Arc::new(NoGroups), 7);
        let request = RaftRequest { group: group.to_string(), payload: Vec::new(), cluster_id };
        service.group(&request).err().expect("refused").code()
    }

    #[test]
    fn requests_from_another_cluster_or_for_unknown_groups_are_refused() {
        assert_eq!(refusal(8, "metadata"), tonic::Code::FailedPrecondition);
        assert_eq!(refusal(7, "metadata"), tonic::Code::NotFound);
        assert_eq!(refusal(7, "not a group"), tonic::Code::InvalidArgument);
    }
}
