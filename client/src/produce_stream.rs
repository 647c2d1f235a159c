//! Produce requests pipelined on one `ProduceStream` per broker.
//!
//! The first produce to a broker opens a stream to it; every later one
//! sends its request there with an id and waits for the answer with that
//! id, which a reader task hands over as answers arrive (in the order the
//! broker completes them). A stream that breaks fails the requests still
//! waiting on it as UNAVAILABLE (the caller's retry policy decides) and is
//! opened again by the next produce. A request whose caller gave up (a
//! timeout) is forgotten; its late answer is dropped. A broker of an
//! older version, which does not know `ProduceStream` (UNIMPLEMENTED), is
//! sent unary Produce requests from then on (a rolling upgrade).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use keel_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tonic::{Response, Status};

/// Requests queued for one stream before the sender waits, in messages.
const STREAM_REQUESTS_QUEUED_MAX: usize = 1024;

type Answer = Result<pb::ProduceResponse, Status>;

/// One open stream to one broker.
pub(crate) struct ProduceStream {
    requests: mpsc::Sender<pb::ProduceStreamRequest>,
    waiting: Arc<Mutex<BTreeMap<u64, oneshot::Sender<Answer>>>>,
    next_id: AtomicU64,
    broken: Arc<AtomicBool>,
}

/// The streams of one client, by broker address.
#[derive(Default)]
pub(crate) struct ProduceStreams {
    open: tokio::sync::Mutex<BTreeMap<String, Arc<ProduceStream>>>,
    /// Brokers that answered UNIMPLEMENTED: they take unary requests.
    unary: Mutex<BTreeSet<String>>,
}

impl ProduceStreams {
    /// Send `request` on the stream to `address` (opened through `client`
    /// if there is none, or it broke) and wait for its answer.
    pub(crate) async fn produce(
        &self,
        address: &str,
        client: crate::client::Api,
        request: pb::ProduceRequest,
    ) -> Result<Response<pb::ProduceResponse>, Status> {
        if self.unary.lock().expect("unary").contains(address) {
            return client.clone().produce(request).await;
        }
        let stream = match self.stream(address, client.clone()).await {
            Ok(stream) => stream,
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                self.unary.lock().expect("unary").insert(address.to_string());
                return client.clone().produce(request).await;
            }
            Err(status) => return Err(status),
        };
        let id = stream.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        stream.waiting.lock().expect("waiting").insert(id, reply);
        let _forget = Forget { waiting: &stream.waiting, id };
        // The reader marks the stream broken before it fails what waits:
        // a request added after that must not wait for an answer.
        if stream.broken.load(Ordering::SeqCst) {
            return Err(Status::unavailable(format!("the produce stream to {address} broke: retry")));
        }
        if stream.requests.send(pb::ProduceStreamRequest { id, request: Some(request) }).await.is_err() {
            stream.broken.store(true, Ordering::SeqCst);
            return Err(Status::unavailable(format!("the produce stream to {address} closed: retry")));
        }
        match answer.await {
            Ok(answer) => answer.map(Response::new),
            Err(_) => {
                Err(Status::unavailable(format!("the produce stream to {address} broke before answering: retry")))
            }
        }
    }

    async fn stream(&self, address: &str, mut client: crate::client::Api) -> Result<Arc<ProduceStream>, Status> {
        let mut streams = self.open.lock().await;
        if let Some(stream) = streams.get(address).filter(|s| !s.broken.load(Ordering::SeqCst)) {
            return Ok(stream.clone());
        }
        let (requests, queued) = mpsc::channel(STREAM_REQUESTS_QUEUED_MAX);
        let outgoing =
            futures_util::stream::unfold(queued, |mut queued: mpsc::Receiver<pb::ProduceStreamRequest>| async move {
                queued.recv().await.map(|request| (request, queued))
            });
        let mut incoming = client.produce_stream(outgoing).await?.into_inner();
        let stream = Arc::new(ProduceStream {
            requests,
            waiting: Arc::default(),
            next_id: AtomicU64::new(0),
            broken: Arc::new(AtomicBool::new(false)),
        });
        let (waiting, broken, address_owned) = (stream.waiting.clone(), stream.broken.clone(), address.to_string());
        tokio::spawn(async move {
            let why = loop {
                match incoming.message().await {
                    Ok(Some(answer)) => {
                        let reply = waiting.lock().expect("waiting").remove(&answer.id);
                        let result = match answer.result {
                            Some(pb::produce_stream_response::Result::Ok(ok)) => Ok(ok),
                            Some(pb::produce_stream_response::Result::Error(error)) => Err(error.into_status()),
                            None => {
                                Err(Status::internal("the broker answered a produce with neither result nor error"))
                            }
                        };
                        if let Some(reply) = reply {
                            let _ = reply.send(result);
                        }
                    }
                    Ok(None) => break "the broker ended it".to_string(),
                    Err(status) => break status.to_string(),
                }
            };
            broken.store(true, Ordering::SeqCst);
            tracing::debug!(address = %address_owned, %why, "a produce stream closed");
            // Dropping the senders fails every request still waiting.
            waiting.lock().expect("waiting").clear();
        });
        streams.insert(address.to_string(), stream.clone());
        Ok(stream)
    }
}

/// Forgets a request whose caller stopped waiting.
struct Forget<'a> {
    waiting: &'a Mutex<BTreeMap<u64, oneshot::Sender<Answer>>>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.waiting.lock().expect("waiting").remove(&self.id);
    }
}
