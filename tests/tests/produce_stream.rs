//! `ProduceStream` against a real `keel serve`: each request on the stream
//! gets exactly the answer Produce would give it, by its id, and the client
//! library, which sends every produce on a stream, opens a new one when a
//! broker restart breaks the old, and a broker stopped with SIGTERM ends its
//! streams and long polls before it exits.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_client::{pb, Client, RetryPolicy};
use keel_proto::v1::keel_client::KeelClient;
use keel_tests::{one_broker, Broker};
use tonic::transport::Channel;
use tonic::Code;

fn produce(topic: &str, values: &[&str]) -> pb::ProduceRequest {
    let records = values.iter().map(|v| pb::Record { value: v.as_bytes().to_vec(), ..Default::default() }).collect();
    pb::ProduceRequest { topic: topic.to_string(), records, ..Default::default() }
}

async fn create_and_wait(client: &Client, topic: &str) {
    let request =
        pb::CreateTopicRequest { topic: topic.into(), partitions: 1, replication_factor: 1, ..Default::default() };
    client.create_topic(request).await.unwrap();
    // The client retries until the partition has a leader.
    client.produce(produce(topic, &["first"])).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_on_a_stream_gets_its_own_answer_by_id() {
    let (_dir, _broker, address) = one_broker().await;
    let client = Client::new(vec![address.clone()], RetryPolicy::default()).unwrap();
    create_and_wait(&client, "t").await;

    let channel = Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
    let mut raw = KeelClient::new(channel);
    let requests = vec![
        pb::ProduceStreamRequest { id: 7, request: Some(produce("t", &["a", "b"])) },
        pb::ProduceStreamRequest { id: 8, request: Some(produce("t", &[])) },
        pb::ProduceStreamRequest { id: 9, request: None },
        pb::ProduceStreamRequest { id: 10, request: Some(produce("no-such-topic", &["x"])) },
        pb::ProduceStreamRequest { id: 11, request: Some(produce("t", &["c"])) },
    ];
    let mut answers = raw.produce_stream(futures_util::stream::iter(requests)).await.unwrap().into_inner();
    let mut by_id = BTreeMap::new();
    while let Some(answer) = answers.message().await.unwrap() {
        assert!(by_id.insert(answer.id, answer.result.expect("a result")).is_none(), "an id answered twice");
    }
    assert_eq!(by_id.keys().copied().collect::<Vec<_>>(), vec![7, 8, 9, 10, 11], "every request answered once");
    use pb::produce_stream_response::Result as R;
    let code = |id: u64| match &by_id[&id] {
        R::Error(error) => error.clone().into_status().code(),
        R::Ok(ok) => panic!("request {id} was taken: {ok:?}"),
    };
    assert_eq!(code(8), Code::InvalidArgument, "an empty batch");
    assert_eq!(code(9), Code::InvalidArgument, "no request");
    assert_eq!(code(10), Code::NotFound, "an unknown topic");
    let (R::Ok(first), R::Ok(second)) = (&by_id[&7], &by_id[&11]) else { panic!("the good requests: {by_id:?}") };
    assert_eq!((first.base_offset, first.count), (1, 2), "after the record produced first");
    assert_eq!((second.base_offset, second.count), (3, 1), "in the order sent");

    // The partition holds exactly what was taken.
    let read = client
        .read(pb::ReadRequest { topic: "t".into(), partition: 0, offset: 0, ..Default::default() })
        .await
        .unwrap();
    let values: Vec<String> =
        read.records.iter().map(|r| String::from_utf8(r.record.clone().unwrap().value).unwrap()).collect();
    assert_eq!(values, ["first", "a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_opens_a_new_stream_after_a_broker_restart() {
    let (dir, broker, address) = one_broker().await;
    let client = Client::new(vec![address.clone()], RetryPolicy::default()).unwrap();
    create_and_wait(&client, "r").await;
    broker.kill();
    let restarted = tokio::task::spawn_blocking({
        let (dir, address) = (dir.path().to_path_buf(), address.clone());
        move || Broker::start(&dir, &address, &[])
    })
    .await
    .unwrap();
    // The old stream broke with the process; the produce goes on a new one.
    let answer = tokio::time::timeout(Duration::from_secs(30), client.produce(produce("r", &["after"])))
        .await
        .expect("answered")
        .expect("taken after the restart");
    assert_eq!(answer.base_offset, 1);
    drop(restarted);
}

/// SIGTERM while a member's long poll and a produce stream are open: the
/// broker answers the poll (empty), ends the stream and exits cleanly. It
/// used to wait 5 s for them, then stop its groups under a server that
/// still answered, and the poll died with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_long_poll_and_ends_a_stream_before_the_broker_exits() {
    let (_dir, broker, address) = one_broker().await;
    let client = Client::new(vec![address.clone()], RetryPolicy::default()).unwrap();
    create_and_wait(&client, "s").await;
    let member = keel_client::Consumer::join(client.clone(), "g", "m", vec!["s".into()], 60_000).await.unwrap();
    let channel = Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();

    // Past the one record: the poll would wait its whole 30 s.
    let poll = pb::PollPartitionsRequest {
        group: "g".into(),
        member: "m".into(),
        generation: member.generation(),
        member_epoch: member.member_epoch(),
        partitions: vec![pb::PollPartition { topic: "s".into(), partition: 0, offset: Some(1), ..Default::default() }],
        max_wait_ms: 30_000,
        ..Default::default()
    };
    let polling = tokio::spawn({
        let mut raw = KeelClient::new(channel.clone());
        async move { raw.poll_partitions(poll).await }
    });
    let (requests, queued) = tokio::sync::mpsc::channel::<pb::ProduceStreamRequest>(4);
    let outgoing = futures_util::stream::unfold(queued, |mut queued| async move {
        queued.recv().await.map(|request| (request, queued))
    });
    let mut answers = KeelClient::new(channel).produce_stream(outgoing).await.unwrap().into_inner();
    // A request without its body: answered (so the stream is open) and
    // nothing written that would end the poll.
    requests.send(pb::ProduceStreamRequest { id: 1, request: None }).await.unwrap();
    assert!(answers.message().await.unwrap().is_some(), "the stream answers");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!polling.is_finished(), "the poll was answered before SIGTERM");

    let status = tokio::task::spawn_blocking(move || broker.terminate()).await.unwrap();
    assert!(status.success(), "keel serve exited with {status}");
    let polled = polling.await.unwrap();
    let polled = polled.expect("a stopping broker answers its long polls");
    assert_eq!(polled.into_inner().partitions.len(), 1);
    assert!(matches!(answers.message().await, Ok(None) | Err(_)), "the stream ended");
    drop(requests);
}
