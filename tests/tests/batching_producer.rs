//! The batching producer against a real broker: many batches in flight per
//! partition, each record acknowledged exactly once at its own offset, and
//! every partition holding exactly the records sent to it, in send order.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_client::{pb, BatchingConfig, BatchingProducer, Client, RetryPolicy};
use keel_tests::one_broker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_batches_land_once_each_in_order() {
    let (_dir, _broker, address) = one_broker().await;
    let client = Client::new(vec![address.clone()], RetryPolicy::default()).unwrap();
    let request =
        pb::CreateTopicRequest { topic: "piped".into(), partitions: 3, replication_factor: 1, ..Default::default() };
    client.create_topic(request).await.unwrap();
    // Small batches and a deep window, so batches overtake each other on
    // the way and some arrive before the one ahead of them.
    let config = BatchingConfig {
        linger: Duration::from_millis(1),
        batch_records: 20,
        in_flight: 8,
        ..BatchingConfig::default()
    };
    let producer = BatchingProducer::new(client.clone(), config, 7);
    const RECORDS: u32 = 3_000;
    let mut acks = Vec::new();
    for i in 0..RECORDS {
        let record = pb::Record {
            key: Some(format!("key-{}", i % 10).into_bytes()),
            value: format!("{i}").into_bytes(),
            ..Default::default()
        };
        acks.push((i, producer.send("piped", record).await.unwrap()));
    }
    producer.close().await;
    // Offsets per partition, in send order.
    let mut sent: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    for (i, ack) in acks {
        let delivered = ack.wait().await.unwrap_or_else(|e| panic!("record {i}: {e}"));
        sent.entry(delivered.partition).or_default().push((delivered.offset, i));
    }
    assert_eq!(sent.values().map(Vec::len).sum::<usize>(), RECORDS as usize);
    for (partition, records) in sent {
        // Dense offsets from 0, rising in send order: nothing twice, no gap,
        // no reordering.
        let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, (0..records.len() as u64).collect::<Vec<_>>(), "partition {partition}");
        let mut stored = Vec::new();
        while stored.len() < records.len() {
            let read =
                pb::ReadRequest { topic: "piped".into(), partition, offset: stored.len() as u64, ..Default::default() };
            let response = client.read(read).await.unwrap();
            assert!(!response.records.is_empty(), "partition {partition} ends at {}", stored.len());
            stored.extend(response.records.into_iter().map(|r| r.record.unwrap().value));
        }
        let expected: Vec<Vec<u8>> = records.iter().map(|(_, i)| format!("{i}").into_bytes()).collect();
        assert_eq!(stored, expected, "partition {partition} holds what was sent to it, in order");
    }
}
