//! nats-bench: publish fixed-size messages to a JetStream stream with a
//! window of publishes awaiting their acks per producer, and print the
//! report `keel bench produce --json` prints.
//!
//!   nats-bench URL REPLICAS PRODUCERS IN_FLIGHT RECORD_SIZE WARMUP_SECS SECONDS

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, replicas, producers, in_flight, record_size, warmup, seconds] = &args[..] else {
        eprintln!("usage: nats-bench URL REPLICAS PRODUCERS IN_FLIGHT RECORD_SIZE WARMUP_SECS SECONDS");
        std::process::exit(2);
    };
    let parse = |s: &str| s.parse::<u64>().expect("a number");
    let (replicas, producers, in_flight) = (parse(replicas) as usize, parse(producers), parse(in_flight) as usize);
    let (record_size, warmup, seconds) = (parse(record_size) as usize, parse(warmup), parse(seconds));
    let client = async_nats::connect(url.as_str()).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let stream = format!("bench-r{replicas}-{}", std::process::id());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{stream}.>")],
        num_replicas: replicas,
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("create the stream");
    let payload = bytes::Bytes::from(vec![b'k'; record_size]);
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let measuring_from = started + Duration::from_secs(warmup);
    let mut tasks = Vec::new();
    for p in 0..producers {
        // Each producer has its own connection, as keel's have their own clients.
        let client = async_nats::connect(url.as_str()).await.expect("connect to NATS");
        let js = async_nats::jetstream::new(client);
        let (subject, payload, stop, counted, errors) =
            (format!("{stream}.{p}"), payload.clone(), stop.clone(), counted.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Histogram::<u64>::new_with_max(3_600_000_000, 3).unwrap();
            let mut pending = FuturesUnordered::new();
            let mut last_ack = measuring_from;
            loop {
                while pending.len() < in_flight && !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    match js.publish(subject.clone(), payload.clone()).await {
                        Ok(ack) => pending.push(async move { (sent, ack.await) }),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                let Some((sent, ack)) = pending.next().await else { break };
                match ack {
                    Ok(_) if sent >= measuring_from => {
                        let now = Instant::now();
                        latencies.saturating_record(((now - sent).as_micros() as u64).max(1));
                        counted.fetch_add(1, Ordering::Relaxed);
                        last_ack = now;
                    }
                    Ok(_) => {}
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            (latencies, last_ack)
        }));
    }
    tokio::time::sleep_until((measuring_from + Duration::from_secs(seconds)).into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Histogram::<u64>::new_with_max(3_600_000_000, 3).unwrap();
    let mut ended = measuring_from;
    for task in tasks {
        let (h, last) = task.await.unwrap();
        latencies.add(h).unwrap();
        ended = ended.max(last);
    }
    let records = counted.load(Ordering::Relaxed);
    let seconds = (ended - measuring_from).as_secs_f64().max(1e-9);
    let ms = |v: u64| v as f64 / 1000.0;
    let report = serde_json::json!({
        "bench": "produce",
        "records": records,
        "bytes": records * record_size as u64,
        "seconds": seconds,
        "records_per_sec": records as f64 / seconds,
        "mb_per_sec": (records * record_size as u64) as f64 / seconds / 1e6,
        "latency_ms": {"p50": ms(latencies.value_at_quantile(0.5)), "p99": ms(latencies.value_at_quantile(0.99)),
                       "p99_9": ms(latencies.value_at_quantile(0.999)), "max": ms(latencies.max())},
        "errors": errors.load(Ordering::Relaxed),
    });
    println!("{report}");
}
