//! `keel bench produce|consume`: load against any running cluster, like
//! `kafka-producer-perf-test` and `nats bench`.
//!
//! Produce keeps a window of requests in flight per producer (each producer
//! has its own connections) and reports records and bytes per second and
//! the latency of each request from send to acknowledgement. Consume drains
//! a topic with the members of one consumer group and reports how fast.
//! Figures count only what completes after the warm-up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_client::{pb, BatchingConfig, BatchingProducer, Client, Consumer};
use serde::Serialize;
use tokio::time::Instant;

use crate::Connection;

/// Most requests one producer keeps in flight.
const IN_FLIGHT_MAX: u32 = 65_536;
/// Most records one Produce request carries (the broker's default limit).
const RECORDS_PER_REQUEST_MAX: u32 = 10_000;
/// Acknowledgements a batching load waits on at once.
const ACKS_QUEUED_MAX: usize = 100_000;
/// Longest latency the histograms record, in microseconds (an hour).
const LATENCY_MAX_MICROS: u64 = 3_600_000_000;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Produce fixed-size records as fast as the in-flight window allows;
    /// print records/s, MB/s and request latency (p50, p99, p99.9, max).
    ///
    /// Example: keel bench produce --partitions 3 --replication-factor 3
    /// --in-flight 256 --duration 20s
    Produce(ProduceBench),
    /// Drain a topic with the members of one consumer group; print
    /// records/s and MB/s.
    ///
    /// Example: keel bench consume --group drain --members 3 --count 1000000
    Consume(ConsumeBench),
    /// Join and leave consumer groups, each under a new name, as services
    /// whose groups come and go do; print groups/s and join latency per
    /// window of groups, to show that joins stay as fast as groups pile up
    /// (empty groups are forgotten after the cluster's group_retention_ms:
    /// lower it first for a long run).
    ///
    /// Example: keel cluster config set group_retention_ms 1000 &&
    /// keel bench groups --count 100000 --concurrency 8
    Groups(GroupsBench),
}

#[derive(Args)]
pub struct GroupsBench {
    /// The topic every group subscribes to; created with one partition if
    /// it does not exist.
    #[arg(default_value = "keel-bench")]
    topic: String,
    /// Groups to join and leave, one member each.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Groups joined at once.
    #[arg(long, default_value_t = 4)]
    concurrency: u32,
    /// Groups per reported window.
    #[arg(long, default_value_t = 10_000)]
    window: u64,
}

/// Most groups joined at once by `keel bench groups`.
const GROUPS_CONCURRENCY_MAX: u32 = 1_024;
/// Most windows `keel bench groups` reports (each keeps a histogram).
const GROUP_WINDOWS_MAX: u64 = 10_000;

#[derive(Args)]
pub struct ProduceBench {
    /// The topic; created with --partitions and --replication-factor if it
    /// does not exist.
    #[arg(default_value = "keel-bench")]
    topic: String,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Stop after this many records (after the warm-up) instead of after
    /// --duration.
    #[arg(long)]
    count: Option<u64>,
    /// How long to measure, after the warm-up (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Load that is sent but not counted, first.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Partitions of a topic the bench creates.
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Replication factor of a topic the bench creates.
    #[arg(long, default_value_t = 1)]
    replication_factor: u32,
    /// Producers, each with its own connections and window.
    #[arg(long, default_value_t = 1)]
    producers: u32,
    /// Requests each producer keeps in flight.
    #[arg(long, default_value_t = 1)]
    in_flight: u32,
    /// Records per Produce request.
    #[arg(long, default_value_t = 1)]
    records_per_request: u32,
    /// Send through the client library's batching producer (idempotent,
    /// batches per partition, --in-flight batches per partition) instead
    /// of one request per --records-per-request records; latency is then
    /// per record.
    #[arg(long)]
    batching: bool,
    /// With --batching: how long a batch waits for more records.
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    linger: Duration,
    /// With --batching: most records per batch.
    #[arg(long, default_value_t = 1000)]
    batch_records: usize,
}

#[derive(Args)]
pub struct ConsumeBench {
    /// The topic to drain (fill it with `keel bench produce` first).
    #[arg(default_value = "keel-bench")]
    topic: String,
    /// The consumer group; a fresh name starts from the log start.
    #[arg(long, default_value = "keel-bench")]
    group: String,
    /// Members of the group, each with its own connections.
    #[arg(long, default_value_t = 1)]
    members: u32,
    /// Stop after this many records.
    #[arg(long, default_value_t = 1_000_000)]
    count: u64,
    /// Give up after this long without a record.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// Records asked for per poll.
    #[arg(long, default_value_t = 500)]
    max_records: u32,
}

/// What a bench measured.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    records: u64,
    bytes: u64,
    seconds: f64,
    records_per_sec: f64,
    mb_per_sec: f64,
    /// Request latency in milliseconds (produce only).
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_ms: Option<Latency>,
    errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: f64,
    p99: f64,
    p99_9: f64,
    max: f64,
}

impl Report {
    /// A report of `records` (`bytes` of payload) over `seconds`.
    fn new(bench: &'static str, records: u64, bytes: u64, seconds: f64) -> Report {
        Report {
            bench,
            records,
            bytes,
            seconds,
            records_per_sec: records as f64 / seconds,
            mb_per_sec: bytes as f64 / seconds / 1e6,
            latency_ms: None,
            errors: 0,
            first_error: None,
        }
    }

    fn print(&self, json: bool) {
        if json {
            say!("{}", serde_json::to_string(self).expect("a report serialises"));
            return;
        }
        say!(
            "{}: {} records in {:.2} s: {:.0} records/s, {:.1} MB/s",
            self.bench,
            self.records,
            self.seconds,
            self.records_per_sec,
            self.mb_per_sec
        );
        if let Some(latency) = &self.latency_ms {
            say!(
                "latency per request (ms): p50 {:.2}, p99 {:.2}, p99.9 {:.2}, max {:.2}",
                latency.p50,
                latency.p99,
                latency.p99_9,
                latency.max
            );
        }
        if self.errors > 0 {
            say!("errors: {} (first: {})", self.errors, self.first_error.as_deref().unwrap_or(""));
        }
    }
}

/// A live rate line on stderr (drawn only on a terminal).
pub(crate) fn progress(what: &'static str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("a valid template"));
    bar.set_message(format!("{what}: warming up"));
    bar
}

/// Show the rate of `done` about once a second until `stop`.
async fn show_rate(bar: ProgressBar, what: &'static str, done: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut last = (Instant::now(), done.load(Ordering::Relaxed));
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = (Instant::now(), done.load(Ordering::Relaxed));
        let rate = (now.1 - last.1) as f64 / (now.0 - last.0).as_secs_f64();
        bar.set_message(format!("{what}: {} records, {rate:.0} records/s", now.1));
        bar.tick();
        last = now;
    }
    bar.finish_and_clear();
}

pub async fn run(command: BenchCommand, connection: &Connection) -> anyhow::Result<()> {
    match command {
        BenchCommand::Produce(args) => produce(args, connection).await,
        BenchCommand::Consume(args) => consume(args, connection).await,
        BenchCommand::Groups(args) => groups(args, connection).await,
    }
}

/// One window of `keel bench groups`.
#[derive(Debug, Serialize)]
struct GroupWindow {
    first_group: u64,
    groups: u64,
    groups_per_sec: f64,
    join_ms: Latency,
    errors: u64,
}

async fn groups(args: GroupsBench, connection: &Connection) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=GROUPS_CONCURRENCY_MAX).contains(&args.concurrency),
        "--concurrency must be 1 to {GROUPS_CONCURRENCY_MAX}"
    );
    anyhow::ensure!(args.window >= 1, "--window must be at least 1");
    let windows = args.count.div_ceil(args.window);
    anyhow::ensure!(windows <= GROUP_WINDOWS_MAX, "--count / --window must be at most {GROUP_WINDOWS_MAX} windows");
    let client = connection.client()?;
    ensure_topic(&client, &args.topic, 1, 1).await?;
    // Names unique to this run, so a rerun never meets an earlier one's.
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    type Window = (Histogram<u64>, u64, Option<Instant>, Option<Instant>);
    let new_window = || -> Window {
        (Histogram::new_with_bounds(1, LATENCY_MAX_MICROS, 3).expect("histogram bounds"), 0, None, None)
    };
    let tallies: Arc<std::sync::Mutex<Vec<Window>>> =
        Arc::new(std::sync::Mutex::new((0..windows).map(|_| new_window()).collect()));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let started = Instant::now();
    let bar = progress("groups");
    let shown = tokio::spawn(show_rate(bar, "groups", done.clone(), stop.clone()));
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (client, next, done, tallies, first_error) =
            (connection.client()?, next.clone(), done.clone(), tallies.clone(), first_error.clone());
        let (topic, count, window) = (args.topic.clone(), args.count, args.window);
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return;
                }
                let group = format!("keel-bench-{run}-{n}");
                let begun = Instant::now();
                let joined = Consumer::join(client.clone(), &group, "member", vec![topic.clone()], 10_000).await;
                let took = begun.elapsed();
                let left = match joined {
                    Ok(consumer) => consumer.leave().await.map_err(|e| format!("group {group} could not leave: {e}")),
                    Err(error) => Err(format!("group {group} could not join: {error}")),
                };
                {
                    let mut tallies = tallies.lock().expect("group windows");
                    let tally = &mut tallies[(n / window) as usize];
                    let now = Instant::now();
                    tally.2 = Some(tally.2.map_or(begun, |first| first.min(begun)));
                    tally.3 = Some(tally.3.map_or(now, |last| last.max(now)));
                    match &left {
                        Ok(()) => tally.0.saturating_record(took.as_micros() as u64),
                        Err(_) => tally.1 += 1,
                    }
                }
                if let Err(error) = left {
                    first_error.lock().expect("first error").get_or_insert(error);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.context("a groups task failed")?;
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = shown.await;
    let ms = |micros: u64| micros as f64 / 1e3;
    let tallies = std::mem::take(&mut *tallies.lock().expect("group windows"));
    let report: Vec<GroupWindow> = tallies
        .into_iter()
        .enumerate()
        .map(|(index, (histogram, errors, first, last))| {
            let span = first.zip(last).map_or(0.0, |(first, last)| (last - first).as_secs_f64());
            let groups = histogram.len() + errors;
            GroupWindow {
                first_group: index as u64 * args.window,
                groups,
                groups_per_sec: if span > 0.0 { groups as f64 / span } else { 0.0 },
                join_ms: Latency {
                    p50: ms(histogram.value_at_quantile(0.50)),
                    p99: ms(histogram.value_at_quantile(0.99)),
                    p99_9: ms(histogram.value_at_quantile(0.999)),
                    max: ms(histogram.max()),
                },
                errors,
            }
        })
        .collect();
    if connection.json {
        for window in &report {
            say!("{}", serde_json::to_string(window).expect("a window encodes"));
        }
    } else {
        let mut rows = crate::table(
            &["GROUPS", "GROUPS/S", "JOIN P50 MS", "P99 MS", "P99.9 MS", "MAX MS", "ERRORS"],
            &["GROUPS/S", "JOIN P50 MS", "P99 MS", "P99.9 MS", "MAX MS", "ERRORS"],
        );
        for window in &report {
            rows.add_row([
                format!("{}-{}", window.first_group, window.first_group + window.groups.max(1) - 1),
                format!("{:.0}", window.groups_per_sec),
                format!("{:.2}", window.join_ms.p50),
                format!("{:.2}", window.join_ms.p99),
                format!("{:.2}", window.join_ms.p99_9),
                format!("{:.2}", window.join_ms.max),
                window.errors.to_string(),
            ]);
        }
        crate::print_table(&rows);
        say!("{} groups joined and left in {seconds:.1} s ({:.0} groups/s)", args.count, args.count as f64 / seconds);
    }
    if let Some(error) = first_error.lock().expect("first error").take() {
        eprintln!("first error: {error}");
    }
    Ok(())
}

/// The shared tallies of a produce run.
#[derive(Default)]
struct Tally {
    /// Records acknowledged after the warm-up.
    records: AtomicU64,
    /// Records acknowledged in all (the progress line).
    all_records: Arc<AtomicU64>,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
    /// When the last counted acknowledgement arrived.
    last_ack: std::sync::Mutex<Option<Instant>>,
}

impl Tally {
    fn error(&self, error: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.first_error.lock().expect("first error").get_or_insert_with(|| error.to_string());
    }
}

async fn produce(args: ProduceBench, connection: &Connection) -> anyhow::Result<()> {
    anyhow::ensure!(args.record_size > 0, "--record-size must be at least 1");
    anyhow::ensure!((1..=IN_FLIGHT_MAX).contains(&args.in_flight), "--in-flight must be 1 to {IN_FLIGHT_MAX}");
    anyhow::ensure!(
        (1..=RECORDS_PER_REQUEST_MAX).contains(&args.records_per_request),
        "--records-per-request must be 1 to {RECORDS_PER_REQUEST_MAX}"
    );
    anyhow::ensure!(args.producers >= 1, "--producers must be at least 1");
    let admin = connection.client()?;
    let topic = ensure_topic(&admin, &args.topic, args.partitions, args.replication_factor).await?;
    let partitions = topic.partitions.len() as u32;
    let record = pb::Record { value: vec![b'k'; args.record_size], ..Default::default() };
    let request = pb::ProduceRequest {
        topic: args.topic.clone(),
        partition: 0,
        records: vec![record; args.records_per_request as usize],
        idempotent: false,
        producer_id: 0,
        sequence: 0,
        topic_id: Some(topic.id),
    };

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let measuring_from = started + args.warmup;
    let shown = tokio::spawn(show_rate(progress("produce"), "produce", tally.all_records.clone(), stop.clone()));
    let mut slots = Vec::new();
    // One histogram shared by every slot: one per slot (256 of them, each
    // about 180 KiB) put a cache miss in every record's bookkeeping.
    let shared = Arc::new(std::sync::Mutex::new(latency_histogram()));
    for producer in 0..args.producers {
        let client = connection.client()?;
        if args.batching {
            let config = BatchingConfig {
                linger: args.linger,
                batch_records: args.batch_records,
                in_flight: args.in_flight as usize,
                ..BatchingConfig::default()
            };
            let record = request.records[0].clone();
            let producer = BatchingProducer::new(client, config, u64::from(producer));
            let load = batching_load(producer, args.topic.clone(), record, tally.clone(), stop.clone(), measuring_from);
            slots.push(tokio::spawn(async move { Some(load.await) }));
            continue;
        }
        for slot in 0..args.in_flight {
            let (client, request, tally, stop) = (client.clone(), request.clone(), tally.clone(), stop.clone());
            let shared = shared.clone();
            let first_partition = (producer * args.in_flight + slot) % partitions;
            slots.push(tokio::spawn(async move {
                let mut partition = first_partition;
                while !stop.load(Ordering::Relaxed) {
                    let mut request = request.clone();
                    request.partition = partition;
                    partition = (partition + 1) % partitions;
                    let sent = Instant::now();
                    let count = request.records.len() as u64;
                    match client.produce(request).await {
                        Ok(_) => {
                            let acked = Instant::now();
                            tally.all_records.fetch_add(count, Ordering::Relaxed);
                            if sent >= measuring_from {
                                let micros = (acked - sent).as_micros() as u64;
                                shared.lock().expect("latencies").saturating_record(micros.max(1));
                                tally.records.fetch_add(count, Ordering::Relaxed);
                                *tally.last_ack.lock().expect("last ack") = Some(acked);
                            }
                        }
                        Err(error) => tally.error(error),
                    }
                }
                None
            }));
        }
    }
    tokio::time::sleep_until(measuring_from).await;
    match args.count {
        Some(count) => {
            while tally.records.load(Ordering::Relaxed) < count {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        None => tokio::time::sleep(args.duration).await,
    }
    stop.store(true, Ordering::Relaxed);
    // Every slot has stopped recording once joined; a batching producer
    // returns a histogram of its own.
    let mut latencies = latency_histogram();
    for slot in slots {
        if let Some(own) = slot.await.context("a produce task failed")? {
            latencies.add(own).expect("histograms of equal bounds");
        }
    }
    latencies.add(&*shared.lock().expect("latencies")).expect("histograms of equal bounds");
    let _ = shown.await;
    let records = tally.records.load(Ordering::Relaxed);
    let ended = tally.last_ack.lock().expect("last ack").unwrap_or(measuring_from);
    let seconds = (ended.max(measuring_from) - measuring_from).as_secs_f64().max(1e-9);
    let bytes = records * args.record_size as u64;
    let millis = |micros: u64| micros as f64 / 1000.0;
    let report = Report {
        latency_ms: (!latencies.is_empty()).then(|| Latency {
            p50: millis(latencies.value_at_quantile(0.50)),
            p99: millis(latencies.value_at_quantile(0.99)),
            p99_9: millis(latencies.value_at_quantile(0.999)),
            max: millis(latencies.max()),
        }),
        errors: tally.errors.load(Ordering::Relaxed),
        first_error: tally.first_error.lock().expect("first error").clone(),
        ..Report::new("produce", records, bytes, seconds)
    };
    report.print(connection.json);
    Ok(())
}

/// An empty histogram of latencies in microseconds.
fn latency_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_max(LATENCY_MAX_MICROS, 3).expect("histogram bounds")
}

/// Records through one batching producer until `stop`; returns the latency
/// of each record from its send to its acknowledgement.
async fn batching_load(
    producer: BatchingProducer,
    topic: String,
    record: pb::Record,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    measuring_from: Instant,
) -> Histogram<u64> {
    // Acknowledgements in send order; the producer's own queues bound how
    // many are outstanding.
    let (acks, mut answered) = tokio::sync::mpsc::channel::<(Instant, keel_client::Ack)>(ACKS_QUEUED_MAX);
    let collector = {
        let tally = tally.clone();
        tokio::spawn(async move {
            let mut latencies = latency_histogram();
            while let Some((sent, ack)) = answered.recv().await {
                match ack.wait().await {
                    Ok(_) => {
                        let acked = Instant::now();
                        tally.all_records.fetch_add(1, Ordering::Relaxed);
                        if sent >= measuring_from {
                            latencies.saturating_record(((acked - sent).as_micros() as u64).max(1));
                            tally.records.fetch_add(1, Ordering::Relaxed);
                            *tally.last_ack.lock().expect("last ack") = Some(acked);
                        }
                    }
                    Err(error) => tally.error(error),
                }
            }
            latencies
        })
    };
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        match producer.send(&topic, record.clone()).await {
            Ok(ack) => {
                if acks.send((sent, ack)).await.is_err() {
                    break;
                }
            }
            Err(error) => {
                tally.error(error);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    drop(acks);
    producer.close().await;
    collector.await.unwrap_or_else(|_| latency_histogram())
}

/// The topic, created with this shape if it does not exist yet.
async fn ensure_topic(
    client: &Client,
    topic: &str,
    partitions: u32,
    replication_factor: u32,
) -> anyhow::Result<pb::TopicDescription> {
    if let Ok(existing) = client.describe_topic_fresh(topic).await {
        return Ok(existing);
    }
    let request =
        pb::CreateTopicRequest { topic: topic.to_string(), partitions, replication_factor, ..Default::default() };
    client.create_topic(request).await.with_context(|| format!("could not create topic {topic}"))?;
    // Wait until every partition has a leader that takes writes.
    let described = client.describe_topic_fresh(topic).await?;
    Ok(described)
}

async fn consume(args: ConsumeBench, connection: &Connection) -> anyhow::Result<()> {
    anyhow::ensure!(args.members >= 1, "--members must be at least 1");
    let consumed = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut members = Vec::new();
    for index in 0..args.members {
        let client = connection.client()?;
        let member = format!("keel-bench-{}-{index}", std::process::id());
        let consumer = Consumer::join(client, &args.group, &member, vec![args.topic.clone()], 10_000)
            .await
            .with_context(|| format!("member {member} could not join group {}", args.group))?;
        members.push(consumer);
    }
    let started = Instant::now();
    let bar = progress("consume");
    let shown = tokio::spawn(show_rate(bar, "consume", consumed.clone(), stop.clone()));
    let mut tasks = Vec::new();
    for mut consumer in members {
        let (consumed, bytes, stop) = (consumed.clone(), bytes.clone(), stop.clone());
        let (count, idle_timeout, max_records) = (args.count, args.idle_timeout, args.max_records);
        tasks.push(tokio::spawn(async move {
            let mut idle_since = Instant::now();
            let mut outcome = Ok(());
            while !stop.load(Ordering::Relaxed) && consumed.load(Ordering::Relaxed) < count {
                if idle_since.elapsed() >= idle_timeout {
                    outcome = Err(anyhow::anyhow!("no record for {}", humantime::format_duration(idle_timeout)));
                    break;
                }
                let deliveries = match consumer.poll(max_records, Duration::from_millis(500)).await {
                    Ok(deliveries) => deliveries,
                    Err(error) => {
                        outcome = Err(error.into());
                        break;
                    }
                };
                if deliveries.is_empty() {
                    continue;
                }
                idle_since = Instant::now();
                let mut last = std::collections::BTreeMap::new();
                for delivery in &deliveries {
                    let size = delivery.record.record.as_ref().map_or(0, |r| r.value.len());
                    bytes.fetch_add(size as u64, Ordering::Relaxed);
                    last.insert(
                        (delivery.topic.clone(), delivery.partition),
                        (delivery.topic_id, delivery.record.offset),
                    );
                }
                consumed.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
                for ((topic, partition), (topic_id, offset)) in last {
                    match consumer.ack_in(&topic, topic_id, partition, offset).await {
                        Ok(Some(_)) => {}
                        // Fenced, and rejoined: the rest would be refused too.
                        Ok(None) => break,
                        Err(error) => outcome = Err(error.into()),
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
            let _ = consumer.leave().await;
            outcome
        }));
    }
    let mut first_error = None;
    for task in tasks {
        if let Err(error) = task.await.context("a consume task failed")? {
            first_error.get_or_insert(format!("{error:#}"));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = shown.await;
    let (records, bytes) = (consumed.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
    let report = Report {
        errors: u64::from(first_error.is_some()),
        first_error,
        ..Report::new("consume", records, bytes, seconds)
    };
    report.print(connection.json);
    Ok(())
}
