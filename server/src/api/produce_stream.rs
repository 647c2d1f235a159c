//! `ProduceStream`: Produce requests pipelined on one HTTP/2 stream.
//!
//! A client with many requests in flight pays, per unary Produce, for an
//! HTTP/2 stream of its own (headers both ways, trailers, a server task);
//! at one small record per request that was a third of a leader's CPU. On
//! a stream each request is one message each way. Each request is handled
//! exactly as Produce handles it (validation, admission, the append lane,
//! its own status), and answered by id as it completes.
//!
//! One task per stream reads requests while fewer than
//! [`STREAM_REQUESTS_IN_FLIGHT_MAX`] are being handled and sends answers;
//! a reader that stops taking answers stops the reading (HTTP/2 flow
//! control then holds the client back). When the broker stops, the stream
//! ends once the requests read are answered.

use std::pin::Pin;

use futures_util::stream::{FuturesUnordered, StreamExt};
use keel_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::{Request, Status, Streaming};

use super::access::Caller;
use super::service::KeelService;
use keel_core::access::{Operation, Permission};

/// Requests of one stream handled at once; more wait to be read.
pub const STREAM_REQUESTS_IN_FLIGHT_MAX: usize = 4096;
/// Answers queued for the client, in messages.
const STREAM_ANSWERS_QUEUED_MAX: usize = 1024;

/// The answers of one stream, as tonic sends them.
pub type ProduceAnswers =
    Pin<Box<dyn futures_util::Stream<Item = Result<pb::ProduceStreamResponse, Status>> + Send + 'static>>;

impl KeelService {
    /// Start serving one stream: the answers come from a task of its own.
    /// Each request is authorised for `caller`, who opened the stream.
    pub(super) fn open_produce_stream(
        &self,
        caller: Caller,
        presented: Option<(String, Vec<u8>)>,
        incoming: Streaming<pb::ProduceStreamRequest>,
    ) -> ProduceAnswers {
        let (answers, queued) = mpsc::channel(STREAM_ANSWERS_QUEUED_MAX);
        tokio::spawn(self.clone().serve_produce_stream((caller, presented), incoming, answers));
        Box::pin(futures_util::stream::unfold(queued, |mut queued| async move {
            queued.recv().await.map(|answer| (Ok(answer), queued))
        }))
    }

    async fn serve_produce_stream(
        self,
        caller: (Caller, Option<(String, Vec<u8>)>),
        mut incoming: Streaming<pb::ProduceStreamRequest>,
        answers: mpsc::Sender<pb::ProduceStreamResponse>,
    ) {
        let mut handling = FuturesUnordered::new();
        let mut reading = true;
        // A stopping broker reads no more requests, answers those it has
        // read and ends the stream; the client sends the rest elsewhere.
        let stopping = self.node.stopping();
        let mut stopping = std::pin::pin!(stopping);
        loop {
            tokio::select! {
                biased;
                Some(answer) = handling.next(), if !handling.is_empty() => {
                    if answers.send(answer).await.is_err() {
                        return; // the client went away
                    }
                }
                _ = &mut stopping, if reading => reading = false,
                next = incoming.message(), if reading && handling.len() < STREAM_REQUESTS_IN_FLIGHT_MAX => {
                    match next {
                        // Boxed: moving the request's large future into the set
                        // was 7% of a leader's request threads under r3-256.
                        Ok(Some(request)) => handling.push(Box::pin(self.produce_one(&caller, request))),
                        Ok(None) => reading = false,
                        Err(status) => {
                            tracing::debug!(%status, "a produce stream broke; answering what was read");
                            reading = false;
                        }
                    }
                }
                else => return,
            }
        }
    }

    async fn produce_one(
        &self,
        (caller, presented): &(Caller, Option<(String, Vec<u8>)>),
        request: pb::ProduceStreamRequest,
    ) -> pb::ProduceStreamResponse {
        let result = match request.request {
            Some(produce) => {
                // The call's future (about 4 KiB) is boxed where it is made,
                // so that it is copied once, not again into `timed`'s future
                // and into this one's (which the stream boxes in turn).
                self.timed(
                    "Produce",
                    Box::pin(async {
                        self.confirmed(|| self.still_valid(caller, presented)).await?;
                        let needed = [Permission::topic(&produce.topic, Operation::Produce)];
                        self.confirmed(|| self.allow("Produce", caller, &needed)).await?;
                        self.produce_call(Request::new(produce)).await
                    }),
                )
                .await
            }
            None => Err(Status::invalid_argument("a ProduceStreamRequest needs its `request`")),
        };
        let result = match result {
            Ok(answer) => pb::produce_stream_response::Result::Ok(answer.into_inner()),
            Err(status) => pb::produce_stream_response::Result::Error((&status).into()),
        };
        pb::ProduceStreamResponse { id: request.id, result: Some(result) }
    }
}
