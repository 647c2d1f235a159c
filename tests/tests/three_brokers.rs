//! Three real `keel serve` processes on loopback: a topic with three
//! replicas survives `kill -9` of a broker mid-stream; every acknowledged
//! record is readable afterwards, in order, on every replica, including the
//! killed one once it restarts from its data directory.

use std::time::{Duration, Instant};

use std::collections::{BTreeMap, BTreeSet};

use keel_tests::{cli, cli_ok, free_port, spawn_cli, Broker};

fn high_watermarks(broker: &str) -> Vec<u64> {
    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(broker, &["topic", "describe", "events", "--json"], "")).unwrap();
    described["partitions"].as_array().unwrap().iter().map(|p| keel_tests::number(&p["high_watermark"])).collect()
}

/// The records of `partition` in the replica on `broker` (not its leader's).
fn values(broker: &str, partition: u32) -> Vec<String> {
    let out = cli_ok(
        broker,
        &["read", "events", "--partition", &partition.to_string(), "--max-records", "10000", "--json", "--any-replica"],
        "",
    );
    out.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["value"].as_str().unwrap().to_string())
        .collect()
}

/// Three brokers, each in its own directory, ready to serve.
struct Cluster {
    dirs: Vec<tempfile::TempDir>,
    addresses: Vec<String>,
    /// Each broker's metrics address.
    metrics: Vec<String>,
    peers: String,
    brokers: Vec<Option<Broker>>,
}

impl Cluster {
    fn start() -> Cluster {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::TempDir::new().unwrap()).collect();
        let addresses: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let metrics: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers = keel_tests::peers(&addresses);
        let mut cluster = Cluster { dirs, addresses, metrics, peers, brokers: Vec::new() };
        cluster.brokers = (0..3).map(|i| Some(cluster.start_broker(i))).collect();
        cluster.wait_ready();
        cluster
    }

    fn start_broker(&self, i: usize) -> Broker {
        let id = (i + 1).to_string();
        let args = [
            "--id",
            &id,
            "--peers",
            &self.peers,
            "--cluster-secret",
            keel_tests::TEST_SECRET,
            "--metrics-listen",
            &self.metrics[i],
        ];
        Broker::start(self.dirs[i].path(), &self.addresses[i], &args)
    }

    fn kill(&mut self, i: usize) {
        self.brokers[i].take().expect("running").kill();
    }

    fn restart(&mut self, i: usize) {
        self.brokers[i] = Some(self.start_broker(i));
    }

    /// The leader of `topic`'s partition 0 (its id and address) and the
    /// address of a follower of it.
    fn leader_and_follower(&self, topic: &str) -> (usize, String, String) {
        let described: serde_json::Value =
            serde_json::from_str(&cli_ok(&self.addresses[0], &["topic", "describe", topic, "--json"], "")).unwrap();
        let leader = keel_tests::number(&described["partitions"][0]["leader"]) as usize;
        assert!(leader >= 1, "partition 0 has a leader: {described}");
        (leader, self.addresses[leader - 1].clone(), self.addresses[leader % 3].clone())
    }

    /// Ready once every broker is registered.
    fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            let status = cli(&self.addresses[1], &["cluster", "status", "--json"], "");
            let ready = status.status.success()
                && serde_json::from_slice::<serde_json::Value>(&status.stdout)
                    .is_ok_and(|v| v["brokers"].as_array().is_some_and(|b| b.len() == 3));
            if ready {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "cluster not ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// 10,000 uniquely numbered records to six partitions while a group of two
/// members consumes, with `kill -9` of a partition leader halfway and its
/// restart: every acknowledged record is consumed, each key's records in
/// order within a member, and the duplicates are counted.
#[test]
fn a_group_consumes_every_record_through_a_leader_kill() {
    let mut cluster = Cluster::start();
    let any = cluster.addresses[1].clone();
    cli_ok(&any, &["topic", "create", "stream", "--partitions", "6", "--replication-factor", "3"], "");
    let consume = |member: &str| {
        let args = [
            "consume",
            "stream",
            "--group",
            "g",
            "--member",
            member,
            "--json",
            "--idle-timeout-ms",
            "8000",
            "--session-timeout-ms",
            "3000",
        ];
        spawn_cli(&any, &args)
    };
    let consumers = [consume("c1"), consume("c2")];
    let batch = |from: u32, to: u32| (from..to).map(|i| format!("k{}:{i}\n", i % 50)).collect::<String>();
    cli_ok(&any, &["produce", "stream", "--key-separator", ":"], &batch(0, 5_000));

    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(&any, &["topic", "describe", "stream", "--json"], "")).unwrap();
    let leader = keel_tests::number(&described["partitions"][0]["leader"]) as usize;
    assert!(leader >= 1, "partition 0 has a leader");
    cluster.kill(leader - 1);
    let survivor = cluster.addresses[leader % 3].clone();
    cli_ok(&survivor, &["produce", "stream", "--key-separator", ":"], &batch(5_000, 10_000));
    cluster.restart(leader - 1);

    let mut everything = BTreeSet::new();
    let mut deliveries = 0usize;
    for consumer in consumers {
        let output = consumer.wait_with_output().unwrap();
        assert!(output.status.success(), "a consumer failed");
        let mut newest_per_key: BTreeMap<String, i64> = BTreeMap::new();
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let key = record["key"].as_str().unwrap().to_string();
            let value: i64 = record["value"].as_str().unwrap().parse().unwrap();
            deliveries += 1;
            let newest = newest_per_key.entry(key.clone()).or_insert(-1);
            // A re-delivery (at-least-once) may go back; a record this
            // member never saw must come after every record of its key it saw.
            let first_time = everything.insert(value);
            assert!(!first_time || value > *newest, "key {key}: new record {value} after {newest}");
            *newest = (*newest).max(value);
        }
    }
    let missing: Vec<i64> = (0..10_000).filter(|i| !everything.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged records never consumed, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    eprintln!("10000 records consumed with {} duplicate deliveries", deliveries - 10_000);

    // --max-records holds across brokers: a member's polls at the other
    // leaders were sent asking for what was wanted then, and may answer
    // after the first one delivered some. (A review found that overshoot;
    // this run does not always meet it: it passed without the fix too.)
    cli_ok(&any, &["topic", "create", "counted", "--partitions", "6", "--replication-factor", "3"], "");
    cli_ok(&any, &["produce", "counted"], &(0..18).map(|i| format!("{i}\n")).collect::<String>());
    let printed = cli_ok(&any, &["consume", "counted", "--group", "five", "--max-records", "5"], "");
    assert_eq!(printed.lines().count(), 5, "{printed}");
}

#[test]
fn kill_9_of_a_broker_loses_no_acknowledged_record() {
    let mut cluster = Cluster::start();
    let addresses = cluster.addresses.clone();
    cli_ok(&addresses[1], &["topic", "create", "events", "--partitions", "2", "--replication-factor", "3"], "");

    let batch = |from: u32, to: u32| (from..to).map(|i| format!("k{}:record-{i:05}\n", i % 7)).collect::<String>();
    cli_ok(&addresses[1], &["produce", "events", "--key-separator", ":"], &batch(0, 300));
    cluster.kill(0);
    cli_ok(&addresses[1], &["produce", "events", "--key-separator", ":"], &batch(300, 600));
    // `cluster status` tells the killed broker is down, and then up again.
    let live = |id: u64| {
        let status: serde_json::Value =
            serde_json::from_str(&cli_ok(&addresses[1], &["cluster", "status", "--json"], "")).unwrap();
        status["brokers"].as_array().unwrap().iter().find(|b| keel_tests::number(&b["id"]) == id).unwrap()["live"]
            .as_bool()
            .unwrap()
    };
    let started = Instant::now();
    while live(1) {
        assert!(started.elapsed() < Duration::from_secs(20), "the killed broker still shows as live");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(live(2) && live(3));
    cluster.restart(0);
    let started = Instant::now();
    while !live(1) {
        assert!(started.elapsed() < Duration::from_secs(20), "the restarted broker does not show as live");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Every acknowledged record, on every replica, once the killed broker
    // has caught up; per-key order holds.
    let started = Instant::now();
    while !addresses.iter().all(|a| high_watermarks(a).iter().sum::<u64>() == 600) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "replicas did not converge: {:?}",
            addresses.iter().map(|a| high_watermarks(a)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for address in &addresses {
        let mut all: Vec<String> = (0..2).flat_map(|p| values(address, p)).collect();
        for partition in 0..2 {
            let numbers: Vec<u32> =
                values(address, partition).iter().map(|v| v["record-".len()..].parse().unwrap()).collect();
            for key in 0..7 {
                let of_key: Vec<u32> = numbers.iter().copied().filter(|n| n % 7 == key).collect();
                assert!(of_key.windows(2).all(|w| w[0] < w[1]), "key k{key} out of order on {address}");
            }
        }
        all.sort();
        assert_eq!(all, (0..600).map(|i| format!("record-{i:05}")).collect::<Vec<_>>(), "records on {address}");
    }
}

/// A topic created while one of its brokers is down still gets a leader
/// for every partition, the down broker's preferred ones too (only the
/// first replica used to initialise a partition's group), and the broker
/// catches up when it returns.
#[test]
fn a_topic_created_while_a_broker_is_down_gets_leaders_everywhere() {
    let mut cluster = Cluster::start();
    cluster.kill(0);
    let b2 = cluster.addresses[1].clone();
    cli_ok(&b2, &["topic", "create", "late", "--partitions", "3", "--replication-factor", "3"], "");
    let started = Instant::now();
    loop {
        let described: serde_json::Value =
            serde_json::from_str(&cli_ok(&b2, &["topic", "describe", "late", "--json"], "")).unwrap();
        let leaders: Vec<u64> =
            described["partitions"].as_array().unwrap().iter().map(|p| keel_tests::number(&p["leader"])).collect();
        if leaders.iter().all(|l| *l == 2 || *l == 3) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "partitions without a leader: {leaders:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    cli_ok(&b2, &["produce", "late"], "a\nb\nc\n");
    cluster.restart(0);
    let b1 = cluster.addresses[0].clone();
    let started = Instant::now();
    let caught_up = || {
        let described: serde_json::Value =
            serde_json::from_str(&cli_ok(&b1, &["topic", "describe", "late", "--json"], "")).unwrap();
        described["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| keel_tests::number(&p["high_watermark"]))
            .sum::<u64>()
    };
    while caught_up() < 3 {
        assert!(started.elapsed() < Duration::from_secs(30), "broker 1 did not catch up");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The survivors log broker 1 going and coming back, once each way (at
    // the default filter), not one line per failed call of every group,
    // and count the failed calls. (A survivor that has not called broker 1
    // since it returned still takes it for down.)
    let log = |i: usize| std::fs::read_to_string(cluster.dirs[i].path().join("keel.log")).unwrap();
    let count = |log: &str, text: &str| log.lines().filter(|line| line.contains(text)).count();
    let started = Instant::now();
    let i = loop {
        if let Some(i) = [1, 2].into_iter().find(|i| count(&log(*i), "broker 1 answers again") > 0) {
            break i;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no survivor saw broker 1 come back: {}", log(1));
        std::thread::sleep(Duration::from_millis(200));
    };
    for i in [1, 2] {
        let log = log(i);
        assert_eq!(count(&log, "openraft::replication"), 0, "{log}");
        let (down, back) = (count(&log, "broker 1 does not answer"), count(&log, "broker 1 answers again"));
        assert!(down == back || down == back + 1, "{log}");
    }
    let metrics = keel_tests::http_get(&cluster.metrics[i], "/metrics");
    assert!(keel_tests::sample(&metrics, "keel_peer_failed_calls_total{peer=\"1\"}") > 0.0, "{metrics}");
    // Calls sent are counted too (those held back while it was down are not).
    assert!(keel_tests::sample(&metrics, "keel_raft_calls_total{peer=\"1\"}") > 0.0, "{metrics}");
    // And the latency of those answered, by RPC.
    let appends = r#"keel_raft_call_duration_seconds_count{rpc="AppendEntries"}"#;
    assert!(keel_tests::sample(&metrics, appends) > 0.0, "{metrics}");
    assert_eq!(keel_tests::sample(&metrics, "keel_peer_up{peer=\"1\"}"), 1.0, "{metrics}");
}

/// `topic describe` on any broker shows every partition as a replica sees
/// it (leader, voters, high watermark), also those the broker asked does
/// not host; a partition no replica answers for is marked unknown, not 0.
#[test]
fn topic_describe_shows_what_the_replicas_report() {
    let mut cluster = Cluster::start();
    let b1 = cluster.addresses[0].clone();
    cli_ok(&b1, &["topic", "create", "spread", "--partitions", "3", "--replication-factor", "1"], "");
    let lines: String = (0..30).map(|i| format!("k{i}:v{i}\n")).collect();
    cli_ok(&b1, &["produce", "spread", "--key-separator", ":"], &lines);
    for address in &cluster.addresses {
        let described: serde_json::Value =
            serde_json::from_str(&cli_ok(address, &["topic", "describe", "spread", "--json"], "")).unwrap();
        let partitions = described["partitions"].as_array().unwrap();
        assert!(partitions.iter().all(|p| p["hosted"] == true), "{described}");
        assert!(
            partitions.iter().all(|p| p["voters"] == p["replicas"] && p["leader"] == p["replicas"][0]),
            "{described}"
        );
        assert_eq!(partitions.iter().map(|p| keel_tests::number(&p["high_watermark"])).sum::<u64>(), 30, "{described}");
        let text = cli_ok(address, &["topic", "describe", "spread"], "");
        assert!(text.contains("VOTERS") && !text.contains('?'), "{text}");
    }
    let health = |address: &str| -> serde_json::Value {
        serde_json::from_str(&cli_ok(address, &["cluster", "health", "--json", "--timeout", "5s"], "")).unwrap()
    };
    let healthy = health(&b1);
    assert_eq!(healthy["healthy"], true, "{healthy}");
    assert!(cli_ok(&b1, &["cluster", "health"], "").contains("healthy:                     yes"));

    // Broker 3 down: its partition has no replica to ask.
    cluster.kill(2);
    let text = cli_ok(&b1, &["topic", "describe", "spread", "--timeout", "5s"], "");
    let unknown = text.lines().filter(|line| line.contains('?')).count();
    assert_eq!(unknown, 1, "{text}");
    // `cluster health` says so, once the metadata leader sees it down.
    let started = Instant::now();
    let sick = loop {
        let report = health(&b1);
        if report["brokers_down"] == serde_json::json!(["3"]) {
            break report;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "broker 3 never reported down: {report}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(sick["healthy"], false, "{sick}");
    assert_eq!(sick["leaderless_partitions"].as_array().map(Vec::len), Some(1), "{sick}");
    assert_eq!(sick["under_replicated_partitions"].as_array().map(Vec::len), Some(1), "{sick}");
}

/// A group's position is read on the partition's leader (a follower may
/// not have applied the latest forget or ack): a follower asked names the
/// leader, and the client library and CLI answer from any broker.
#[test]
fn a_group_position_is_read_on_the_leader_and_a_follower_names_it() {
    use keel_proto::v1 as pb;
    let cluster = Cluster::start();
    let b1 = cluster.addresses[0].clone();
    cli_ok(&b1, &["topic", "create", "events", "--partitions", "1", "--replication-factor", "3"], "");
    cli_ok(&b1, &["produce", "events"], "one\ntwo\nthree\n");
    cli_ok(&b1, &["group", "reset", "g", "--topic", "events", "--to", "latest"], "");
    let (leader, leader_address, follower) = cluster.leader_and_follower("events");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{follower}")).unwrap().connect().await.unwrap();
        let mut raw = pb::keel_client::KeelClient::new(channel);
        let request = pb::GroupPositionRequest { group: "g".into(), topic: "events".into(), partition: 0 };
        let refused = raw.group_position(request).await.expect_err("a follower does not answer a position");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
        let named = refused.metadata().get("keel-leader").and_then(|v| v.to_str().ok());
        assert_eq!(named, Some(format!("{leader}@{leader_address}").as_str()), "{refused:?}");

        // The client library follows the hint from any broker.
        let client = keel_client::Client::new(vec![follower.clone()], keel_client::RetryPolicy::default()).unwrap();
        let position = client.group_position("g", "events", 0).await.unwrap();
        assert!(position.committed);
        assert_eq!((position.position, position.high_watermark), (3, 3));
    });
}

/// `keel read` right after `keel produce`, through a follower: every
/// acknowledged record, because the leader answers reads (a follower may
/// not have learned the last commits yet: the leader tells it with the next
/// AppendEntries). A follower asked names the leader; asked for any
/// replica, it answers from its own.
#[test]
fn a_read_is_answered_by_the_leader_and_by_a_follower_only_when_asked() {
    use keel_proto::v1 as pb;
    let cluster = Cluster::start();
    let b1 = cluster.addresses[0].clone();
    cli_ok(&b1, &["topic", "create", "events", "--partitions", "1", "--replication-factor", "3"], "");
    // The first produce waits for the partition to have a leader.
    cli_ok(&b1, &["produce", "events"], &(0..5).map(|i| format!("r0-{i}\n")).collect::<String>());
    let (leader, leader_address, follower) = cluster.leader_and_follower("events");

    for round in 1..20 {
        let records: String = (0..5).map(|i| format!("r{round}-{i}\n")).collect();
        cli_ok(&follower, &["produce", "events"], &records);
        let read = cli_ok(&follower, &["read", "events", "--max-records", "1000", "--format", "%v\n"], "");
        assert_eq!(read.lines().count(), 5 * (round + 1), "round {round}: {read}");
    }

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{follower}")).unwrap().connect().await.unwrap();
        let mut raw = pb::keel_client::KeelClient::new(channel);
        let request = |any_replica| pb::ReadRequest {
            topic: "events".into(),
            partition: 0,
            offset: 0,
            max_records: 1000,
            max_bytes: 0,
            any_replica,
        };
        let refused = raw.read(request(false)).await.expect_err("a follower does not answer a read");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
        let named = refused.metadata().get("keel-leader").and_then(|v| v.to_str().ok());
        assert_eq!(named, Some(format!("{leader}@{leader_address}").as_str()), "{refused:?}");
        // Its own replica: the 100 records once it learned they committed.
        let started = Instant::now();
        loop {
            let read = raw.read(request(true)).await.expect("a follower answers from its replica").into_inner();
            if read.records.len() == 100 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "the follower holds {} records", read.records.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}
