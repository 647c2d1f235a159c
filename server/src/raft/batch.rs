//! Raft calls of partition groups to one peer, carried together when many
//! are in flight.
//!
//! A failover elects thousands of groups at once, and each election makes a
//! few calls (a vote, the new leader's first entry, its commit): at 10,000
//! partitions two brokers made 18,000 calls in 1.7 s, each an HTTP/2 stream
//! and a gRPC call on both sides. Here a call to a peer goes alone while
//! fewer than [`CALLS_ALONE_MAX`] calls (alone or batches) are in flight to
//! it, so a lightly loaded cluster sends exactly what it sent before. Beyond
//! that it joins the peer's queue, and a sender task sends what is queued
//! as one `Batch` RPC (at most [`BATCH_CALLS_MAX`] calls and
//! [`BATCH_BYTES_MAX`] bytes), whose answers come back one by one as each
//! call completes. At most [`BATCH_SENDERS_MAX`] batches are in flight to a
//! peer; calls queue behind them, bounded by the peer's call permits
//! (`PEER_CALLS_IN_FLIGHT_MAX`), which every queued call holds.
//!
//! Each call keeps its own time limit, its own answer and its own error; a
//! batch that fails fails each of its calls as a call of its own would. A
//! peer of the version before batches answers `UNIMPLEMENTED`: its calls are
//! then sent alone, and every later call to it too.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::raft::raft_transport_client::RaftTransportClient;
use keel_proto::raft::{RaftBatch, RaftCall, RaftRequest, RaftRpc};
use tokio::sync::oneshot;

use super::network::{Peers, Rpc, TransportError, RAFT_MESSAGE_BYTES_MAX};
use super::types::NodeId;

/// Calls to one peer in flight (each alone, or a batch) below which a new
/// call goes alone, at once.
pub const CALLS_ALONE_MAX: usize = 4;

/// The simulation's eager batching: its clusters hold a few partitions, so
/// four calls are seldom in flight to one peer and batches seldom form.
/// While on, a call goes alone only when nothing is in flight to its peer
/// (applies to every broker of the run; one simulation runs on one thread).
#[cfg(madsim)]
pub mod sim_batching {
    use std::cell::Cell;

    thread_local! {
        static EAGER: Cell<bool> = const { Cell::new(false) };
    }

    /// Batch calls as soon as one is in flight (`false`: as in production).
    pub fn set(eager: bool) {
        EAGER.with(|e| e.set(eager));
    }

    pub(super) fn calls_alone_max() -> usize {
        if EAGER.with(Cell::get) {
            1
        } else {
            super::CALLS_ALONE_MAX
        }
    }
}

/// The calls in flight to one peer below which a new call goes alone.
fn calls_alone_max() -> usize {
    #[cfg(madsim)]
    return sim_batching::calls_alone_max();
    #[cfg(not(madsim))]
    CALLS_ALONE_MAX
}
/// Batches in flight to one peer, at most.
pub const BATCH_SENDERS_MAX: usize = 2;
/// Calls in one batch, at most (a peer refuses more than
/// [`BATCH_CALLS_ACCEPTED_MAX`]).
pub const BATCH_CALLS_MAX: usize = 256;
/// Payload bytes of the calls in one batch, at most (a call larger than
/// this goes in a batch of its own).
pub const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Calls a broker takes in one batch, at most.
pub const BATCH_CALLS_ACCEPTED_MAX: usize = 1024;

/// What a call's payload is answered with: the reply's payload, or why
/// there is none.
pub type Answer = Result<Vec<u8>, TransportError>;

/// One peer's queue of calls, and the calls and batches in flight to it.
#[derive(Debug, Default)]
pub struct PeerBatches {
    state: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    calls: VecDeque<Queued>,
    /// Calls in flight alone.
    alone: usize,
    /// Sender tasks running (each with at most one batch in flight).
    senders: usize,
    /// The peer answered a batch `UNIMPLEMENTED` (an older version): every
    /// call goes alone.
    unbatched: bool,
}

#[derive(Debug)]
struct Queued {
    call: RaftCall,
    answer: oneshot::Sender<Answer>,
}

/// Where a call goes: the peer, its address, and this broker's channels.
#[derive(Debug, Clone)]
pub struct Destination {
    pub peers: Peers,
    pub peer: NodeId,
    pub address: String,
}

/// One call's slot among the calls in flight alone; freed when dropped
/// (also when the caller gives up).
struct Alone<'a>(&'a PeerBatches);

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        self.0.state.lock().expect("peer batches").alone -= 1;
    }
}

impl PeerBatches {
    /// Make `rpc` on `group` with `payload` to the peer at `to`, alone or
    /// in a batch (snapshot chunks always alone); the peer gives up on it
    /// after `timeout`.
    pub(super) async fn call(
        self: &Arc<Self>,
        to: &Destination,
        rpc: Rpc,
        group: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Answer {
        let wire = match rpc {
            Rpc::AppendEntries => RaftRpc::AppendEntries,
            Rpc::Vote => RaftRpc::Vote,
            Rpc::InstallSnapshot => RaftRpc::Unspecified,
        };
        let answered = {
            let mut queue = self.state.lock().expect("peer batches");
            let busy = !queue.calls.is_empty() || queue.alone + queue.senders >= calls_alone_max();
            if queue.unbatched || wire == RaftRpc::Unspecified || !busy {
                queue.alone += 1;
                Err(payload)
            } else {
                let (answer, answered) = oneshot::channel();
                let timeout_us = timeout.as_micros().try_into().unwrap_or(u64::MAX);
                let call = RaftCall { rpc: wire as i32, group: group.to_string(), payload, timeout_us };
                queue.calls.push_back(Queued { call, answer });
                if queue.senders < BATCH_SENDERS_MAX {
                    queue.senders += 1;
                    tokio::spawn(self.clone().send_batches(to.clone()));
                }
                Ok(answered)
            }
        };
        match answered {
            // The sender goes away without answering only when this broker
            // shuts down.
            Ok(answered) => answered.await.unwrap_or(Err(TransportError::TimedOut)),
            Err(payload) => {
                let _slot = Alone(self);
                call_alone(to, rpc, group, payload, timeout).await
            }
        }
    }

    /// Send what is queued, a batch at a time, until the queue is empty.
    async fn send_batches(self: Arc<Self>, to: Destination) {
        loop {
            let batch = {
                let mut queue = self.state.lock().expect("peer batches");
                let batch = queue.take_batch();
                if batch.is_empty() {
                    queue.senders -= 1;
                    return;
                }
                batch
            };
            // Boxed: the call's future is several KiB (see `call_peer`).
            if Box::pin(send_batch(&to, batch)).await == Refused::Batches {
                // An older peer: its calls from now on go alone. (The
                // calls of the refused batch failed UNIMPLEMENTED, and their
                // groups send them again at once.)
                tracing::debug!(peer = %to.address, "the peer takes no batched Raft calls; calling it alone");
                self.state.lock().expect("peer batches").unbatched = true;
            }
        }
    }
}

/// Whether the peer refused to take batches.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    Nothing,
    Batches,
}

impl Queue {
    /// The next batch: queued calls in order, up to [`BATCH_CALLS_MAX`] and
    /// [`BATCH_BYTES_MAX`] (at least one), leaving out those whose caller
    /// gave up.
    fn take_batch(&mut self) -> Vec<Queued> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = self.calls.front() {
            if next.answer.is_closed() {
                self.calls.pop_front();
                continue;
            }
            let size = next.call.payload.len() + next.call.group.len();
            if batch.len() == BATCH_CALLS_MAX || (!batch.is_empty() && bytes + size > BATCH_BYTES_MAX) {
                break;
            }
            bytes += size;
            batch.extend(self.calls.pop_front());
        }
        batch
    }
}

fn client(to: &Destination) -> Result<RaftTransportClient<tonic::transport::Channel>, TransportError> {
    Ok(RaftTransportClient::new(to.peers.channel(&to.address)?)
        .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX))
}

/// Make one call as an RPC of its own.
pub(super) async fn call_alone(to: &Destination, rpc: Rpc, group: &str, payload: Vec<u8>, timeout: Duration) -> Answer {
    let mut client = client(to)?;
    let identity = to.peers.identity();
    let mut message = tonic::Request::new(RaftRequest {
        group: group.to_string(),
        payload,
        cluster_id: identity.cluster_id,
        secret: identity.secret.clone(),
    });
    message.set_timeout(timeout);
    let reply = match rpc {
        Rpc::AppendEntries => client.append_entries(message).await?,
        Rpc::Vote => client.vote(message).await?,
        Rpc::InstallSnapshot => client.install_snapshot(message).await?,
    };
    Ok(reply.into_inner().payload)
}

/// The planted bug: each answer goes to the call after its own.
#[cfg(madsim)]
fn misrouted(mut reply: keel_proto::raft::RaftCallReply, calls: usize) -> keel_proto::raft::RaftCallReply {
    if keel_core::planted::is_planted(keel_core::planted::Bug::BatchAnswersMisrouted) && calls > 1 {
        reply.index = ((reply.index as usize + 1) % calls) as u32;
    }
    reply
}

/// Send one batch and hand each call its answer (or its error).
async fn send_batch(to: &Destination, batch: Vec<Queued>) -> Refused {
    let timeout = batch.iter().map(|q| Duration::from_micros(q.call.timeout_us)).max().unwrap_or_default();
    let (calls, mut answers): (Vec<RaftCall>, Vec<Option<oneshot::Sender<Answer>>>) =
        batch.into_iter().map(|q| (q.call, Some(q.answer))).unzip();
    let identity = to.peers.identity();
    let mut request =
        tonic::Request::new(RaftBatch { cluster_id: identity.cluster_id, secret: identity.secret.clone(), calls });
    request.set_timeout(timeout);
    to.peers.count_batch(to.peer);
    let exchange = async {
        let mut stream = client(to)?.batch(request).await?.into_inner();
        while let Some(reply) = stream.message().await? {
            #[cfg(madsim)]
            let reply = misrouted(reply, answers.len());
            let Some(answer) = answers.get_mut(reply.index as usize).and_then(Option::take) else {
                continue; // an index not asked for, or answered twice: ignored
            };
            let result = match tonic::Code::from_i32(reply.code) {
                tonic::Code::Ok => Ok(reply.payload),
                code => Err(TransportError::Status(tonic::Status::new(code, reply.message))),
            };
            let _ = answer.send(result);
        }
        Ok::<_, TransportError>(())
    };
    // The stream is not bounded by the request's deadline: bound it here.
    let outcome = tokio::time::timeout(timeout, Box::pin(exchange)).await;
    let refused = match &outcome {
        Ok(Err(TransportError::Status(status))) if status.code() == tonic::Code::Unimplemented => Refused::Batches,
        _ => Refused::Nothing,
    };
    // Every call not answered fails as it would have alone.
    for answer in answers.into_iter().flatten() {
        let error = match &outcome {
            Ok(Ok(())) => TransportError::Status(tonic::Status::internal(
                "the peer ended a batch of Raft calls without answering this one",
            )),
            Ok(Err(TransportError::Status(status))) => {
                TransportError::Status(tonic::Status::new(status.code(), status.message()))
            }
            Ok(Err(TransportError::BadAddress { address, reason })) => {
                TransportError::BadAddress { address: address.clone(), reason: reason.clone() }
            }
            Ok(Err(_)) | Err(_) => TransportError::TimedOut,
        };
        let _ = answer.send(Err(error));
    }
    refused
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use keel_proto::raft::raft_transport_server::{RaftTransport, RaftTransportServer};
    use keel_proto::raft::{RaftCallReply, RaftReply};

    use super::*;
    use crate::raft::network::ClusterIdentity;

    /// A peer that answers each call after `delay_ms` with its payload
    /// behind a prefix saying how it came ("alone" or "batch"), and records
    /// the size of each batch; it refuses batches if `refuses`.
    #[derive(Clone, Default)]
    struct Echo {
        delay_ms: u64,
        refuses: bool,
        batches: Arc<Mutex<Vec<usize>>>,
        alone: Arc<AtomicUsize>,
    }

    impl Echo {
        async fn alone(
            &self,
            request: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            self.alone.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(self.delay_ms)).await;
            let payload = [b"alone:".as_slice(), &request.into_inner().payload].concat();
            Ok(tonic::Response::new(RaftReply { payload }))
        }
    }

    #[tonic::async_trait]
    impl RaftTransport for Echo {
        async fn append_entries(
            &self,
            request: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            self.alone(request).await
        }

        async fn vote(
            &self,
            request: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            self.alone(request).await
        }

        async fn install_snapshot(
            &self,
            request: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            self.alone(request).await
        }

        type BatchStream = super::super::network::BatchAnswers;

        async fn batch(
            &self,
            request: tonic::Request<RaftBatch>,
        ) -> Result<tonic::Response<Self::BatchStream>, tonic::Status> {
            if self.refuses {
                return Err(tonic::Status::unimplemented("an older broker"));
            }
            let calls = request.into_inner().calls;
            self.batches.lock().unwrap().push(calls.len());
            let delay = Duration::from_millis(self.delay_ms);
            // Answered last first: each answer finds its call by index.
            let answers: Vec<_> = calls
                .into_iter()
                .enumerate()
                .rev()
                .map(|(index, call)| {
                    let payload = [b"batch:".as_slice(), &call.payload].concat();
                    Ok(RaftCallReply { index: index as u32, code: 0, message: String::new(), payload })
                })
                .collect();
            let answers = futures_util::stream::once(tokio::time::sleep(delay))
                .flat_map(move |()| futures_util::stream::iter(answers.clone()));
            Ok(tonic::Response::new(Box::pin(answers)))
        }

        async fn join(&self, _: tonic::Request<RaftRequest>) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }

        async fn move_settled(
            &self,
            _: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }

        async fn liveness(&self, _: tonic::Request<RaftRequest>) -> Result<tonic::Response<RaftReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }
    }

    use futures_util::StreamExt;

    async fn serve(echo: Echo) -> Destination {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let incoming = futures_util::stream::unfold(listener, |listener| async move {
            Some((listener.accept().await.map(|(socket, _)| socket), listener))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftTransportServer::new(echo))
                .serve_with_incoming(incoming),
        );
        let peers = Peers::new(ClusterIdentity { cluster_id: 7, secret: "s".into() });
        Destination { peers, peer: 2, address }
    }

    /// Fire `count` votes at once; each gets its own payload back.
    async fn fire(batches: &Arc<PeerBatches>, to: &Destination, count: usize) -> Vec<String> {
        let calls = (0..count).map(|i| {
            let (batches, to) = (batches.clone(), to.clone());
            async move {
                let answer = batches
                    .call(&to, Rpc::Vote, "p/t/1/0", format!("call {i}").into_bytes(), Duration::from_secs(5))
                    .await
                    .expect("answered");
                String::from_utf8(answer).unwrap()
            }
        });
        futures_util::future::join_all(calls).await
    }

    /// Calls beyond CALLS_ALONE_MAX in flight go together, each answered
    /// with its own reply (answers come back out of order); a lone call
    /// afterwards goes alone again.
    #[tokio::test]
    async fn calls_beyond_the_few_in_flight_go_together_and_each_gets_its_own_answer() {
        let echo = Echo { delay_ms: 50, ..Echo::default() };
        let to = serve(echo.clone()).await;
        let batches = Arc::new(PeerBatches::default());
        let answers = fire(&batches, &to, 40).await;
        for (i, answer) in answers.iter().enumerate() {
            assert!(answer.ends_with(&format!(":call {i}")), "call {i} got {answer:?}");
        }
        let alone = answers.iter().filter(|a| a.starts_with("alone:")).count();
        assert_eq!(alone, CALLS_ALONE_MAX, "{answers:?}");
        let sizes = echo.batches.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 40 - CALLS_ALONE_MAX);
        assert!(sizes.len() <= 2, "the queued calls went in few batches: {sizes:?}");
        assert_eq!(to.peers.health()[&2].batches, sizes.len() as u64, "each batch counted");
        let again = fire(&batches, &to, 1).await;
        assert_eq!(again, ["alone:call 0"]);
        let queue = batches.state.lock().unwrap();
        assert_eq!((queue.alone, queue.senders, queue.calls.len()), (0, 0, 0), "nothing left in flight");
    }

    /// A peer of the version before batches: the calls of the refused batch
    /// fail UNIMPLEMENTED (their groups send them again), and every later
    /// call goes alone.
    #[tokio::test]
    async fn a_peer_that_refuses_batches_is_called_alone_from_then_on() {
        let echo = Echo { delay_ms: 50, refuses: true, ..Echo::default() };
        let to = serve(echo.clone()).await;
        let batches = Arc::new(PeerBatches::default());
        let calls = (0..12).map(|i| {
            let (batches, to) = (batches.clone(), to.clone());
            async move { batches.call(&to, Rpc::Vote, "p/t/1/0", vec![i], Duration::from_secs(5)).await }
        });
        let results = futures_util::future::join_all(calls).await;
        let refused = results
            .iter()
            .filter(|r| matches!(r, Err(TransportError::Status(s)) if s.code() == tonic::Code::Unimplemented))
            .count();
        assert_eq!(refused, 12 - CALLS_ALONE_MAX, "{results:?}");
        let answers = fire(&batches, &to, 12).await;
        assert!(answers.iter().all(|a| a.starts_with("alone:")), "{answers:?}");
        assert_eq!(echo.alone.load(Ordering::SeqCst), CALLS_ALONE_MAX + 12);
    }

    /// A peer that does not answer: each queued call fails by its own
    /// time limit, and the queue is empty afterwards.
    #[tokio::test]
    async fn queued_calls_to_a_silent_peer_time_out() {
        let echo = Echo { delay_ms: 10_000, ..Echo::default() };
        let to = serve(echo.clone()).await;
        let batches = Arc::new(PeerBatches::default());
        let calls = (0..10).map(|i| {
            let (batches, to) = (batches.clone(), to.clone());
            async move { batches.call(&to, Rpc::AppendEntries, "p/t/1/0", vec![i], Duration::from_millis(200)).await }
        });
        let started = tokio::time::Instant::now();
        let results = futures_util::future::join_all(calls).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(results.iter().all(Result::is_err), "{results:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let queue = batches.state.lock().unwrap();
        assert_eq!((queue.alone, queue.senders, queue.calls.len()), (0, 0, 0));
    }
}
