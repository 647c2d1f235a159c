//! Changing a running cluster with real `keel` processes: a fourth broker
//! joins with `--join`, a partition's replicas move onto it (a Raft
//! membership change driven by the partition's leader) without losing a
//! record, broker 1 is drained and removed (and, still running, refuses
//! clients), and the cluster keeps serving without it. Broker 1 is started with a TOML config file, which this test
//! also covers.

use std::time::{Duration, Instant};

use keel_client::{Client, RetryPolicy};
use keel_tests::{cli, cli_ok, free_port, Broker};

fn json(broker: &str, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&cli_ok(broker, args, "")).unwrap()
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < Duration::from_secs(60), "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Partition `p` of `topic` as broker `broker` sees it.
fn partition(broker: &str, topic: &str, p: usize) -> serde_json::Value {
    json(broker, &["topic", "describe", topic, "--json"])["partitions"][p].clone()
}

fn ids(value: &serde_json::Value) -> Vec<u64> {
    let mut ids: Vec<u64> = value.as_array().unwrap().iter().map(keel_tests::number).collect();
    ids.sort();
    ids
}

fn values(broker: &str, topic: &str, p: u32) -> Vec<String> {
    let out = cli_ok(broker, &["read", topic, "--partition", &p.to_string(), "--max-records", "10000", "--json"], "");
    out.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["value"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_broker_joins_takes_over_replicas_and_another_is_drained_and_removed() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::TempDir::new().unwrap()).collect();
    let addresses: Vec<String> = (0..4).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let peers = keel_tests::peers(&addresses[..3]);
    let secret = keel_tests::TEST_SECRET;

    // Broker 1 reads its settings from a TOML file; flags are only given
    // for what the harness needs (the listen address).
    let config = dirs[0].path().join("keel.toml");
    let data_dir = dirs[0].path().join("from-config");
    std::fs::write(
        &config,
        format!(
            "id = 1\nadvertise = {:?}\ndata-dir = {:?}\npeers = [{}]\ncluster-secret = {secret:?}\n",
            addresses[0],
            data_dir.display().to_string(),
            peers.split(',').map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", ")
        ),
    )
    .unwrap();
    let mut broker1 = Some(Broker::start(dirs[0].path(), &addresses[0], &["--config", config.to_str().unwrap()]));
    let _broker2 =
        Broker::start(dirs[1].path(), &addresses[1], &["--id", "2", "--peers", &peers, "--cluster-secret", secret]);
    let _broker3 =
        Broker::start(dirs[2].path(), &addresses[2], &["--id", "3", "--peers", &peers, "--cluster-secret", secret]);
    let b2 = addresses[1].as_str();
    eventually("three registered brokers", || {
        json(b2, &["cluster", "status", "--json"])["brokers"].as_array().map_or(0, Vec::len) == 3
    });
    assert!(data_dir.join("keel.redb").exists(), "broker 1 must keep its data where its config file says");

    cli_ok(b2, &["topic", "create", "moves", "--partitions", "2", "--replication-factor", "3"], "");
    let records: String = (0..200).map(|i| format!("k{i}:v{i}\n")).collect();
    cli_ok(b2, &["produce", "moves", "--key-separator", ":"], &records);
    let before: Vec<Vec<String>> = (0..2).map(|p| values(b2, "moves", p)).collect();
    assert_eq!(before.iter().map(Vec::len).sum::<usize>(), 200);

    // Broker 4 joins through broker 2 and becomes a metadata voter.
    let _broker4 =
        Broker::start(dirs[3].path(), &addresses[3], &["--id", "4", "--join", b2, "--cluster-secret", secret]);
    let cluster = json(b2, &["cluster", "status", "--json"]);
    assert_eq!(cluster["brokers"].as_array().unwrap().len(), 4, "{cluster}");
    let b4 = addresses[3].as_str();

    // Move every replica off broker 1 onto broker 4.
    for p in 0..2usize {
        cli_ok(b2, &["topic", "move", "moves", "--partition", &p.to_string(), "--replicas", "2,3,4"], "");
    }
    for p in 0..2usize {
        eventually("the moved partition's voters to follow its placement", || {
            let seen = partition(b4, "moves", p);
            ids(&seen["replicas"]) == [2, 3, 4] && ids(&seen["voters"]) == [2, 3, 4]
        });
    }
    // The new replica holds every record, in order; nothing was lost.
    for p in 0..2u32 {
        eventually("broker 4 to hold every record", || values(b4, "moves", p) == before[p as usize]);
    }

    // Broker 1 holds no replicas now: once its groups have dropped it
    // (drain waits for that), it can be removed, and the cluster goes on
    // without it.
    cli_ok(b2, &["cluster", "drain", "1", "--timeout-secs", "60"], "");
    let refused = cli(b2, &["cluster", "remove-broker", "9"], "");
    assert!(!refused.status.success(), "removing an unknown broker must fail");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not registered"));
    cli_ok(b2, &["cluster", "remove-broker", "1"], "");
    // Still running, the removed broker refuses clients rather than answer
    // from its frozen metadata (found by the simulation's membership lane:
    // a consumer talking to it waited on a stale group for good).
    let policy = RetryPolicy { deadline: Duration::from_secs(2), ..RetryPolicy::default() };
    let removed = Client::new(vec![addresses[0].clone()], policy).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    eventually("the removed broker to refuse clients", || match runtime.block_on(removed.describe_cluster()) {
        Err(error) => error.to_string().contains("was removed from the cluster"),
        Ok(_) => false,
    });
    // Then it stops by itself, cleanly, and says why in its log.
    let mut broker1 = broker1.take().unwrap();
    let status = broker1.wait_for_exit(Duration::from_secs(60)).expect("the removed broker to stop by itself");
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(dirs[0].path().join("keel.log")).unwrap_or_default();
    assert!(log.contains("removed from the cluster; stopping"), "{log}");
    let cluster = json(b2, &["cluster", "status", "--json"]);
    let mut brokers: Vec<u64> =
        cluster["brokers"].as_array().unwrap().iter().map(|b| keel_tests::number(&b["id"])).collect();
    brokers.sort();
    assert_eq!(brokers, [2, 3, 4]);
    eventually("a metadata leader among brokers 2-4", || {
        let leader = keel_tests::number(&json(b4, &["cluster", "status", "--json"])["metadata_leader"]);
        (2..=4).contains(&leader)
    });
    cli_ok(b4, &["produce", "moves"], "after-removal\n");
    cli_ok(b4, &["topic", "create", "after", "--partitions", "3", "--replication-factor", "3"], "");
    let after = json(b4, &["topic", "describe", "after", "--json"]);
    for p in after["partitions"].as_array().unwrap() {
        assert!(!ids(&p["replicas"]).contains(&1), "a removed broker gets no replicas: {p}");
    }
}

/// A move whose target is down commits its placement at once, but the
/// partition's group keeps its old replica as its only voter: removing that
/// broker then would lose the partition. It is refused until the group has
/// followed the move.
#[test]
fn a_broker_still_in_a_moving_group_is_not_removed() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::TempDir::new().unwrap()).collect();
    let addresses: Vec<String> = (0..4).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let peers = keel_tests::peers(&addresses[..3]);
    let secret = keel_tests::TEST_SECRET;
    let start = |i: usize, how: &[&str]| {
        let id = (i + 1).to_string();
        let mut args = vec!["--id", id.as_str(), "--cluster-secret", secret];
        args.extend_from_slice(how);
        Broker::start(dirs[i].path(), &addresses[i], &args)
    };
    let _brokers: Vec<Broker> = (0..3).map(|i| start(i, &["--peers", &peers])).collect();
    let b2 = addresses[1].as_str();
    eventually("three registered brokers", || {
        json(b2, &["cluster", "status", "--json"])["brokers"].as_array().map_or(0, Vec::len) == 3
    });
    let broker4 = start(3, &["--join", b2]);
    // One partition per broker, replication factor 1.
    cli_ok(b2, &["topic", "create", "solo", "--partitions", "4", "--replication-factor", "1"], "");
    let described = json(b2, &["topic", "describe", "solo", "--json"]);
    let on_1 = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .position(|p| ids(&p["replicas"]) == [1])
        .expect("a partition on broker 1");
    let b1 = addresses[0].as_str();
    // Only a broker that hosts a partition knows its leader.
    eventually("the partition on broker 1 to have a leader", || {
        keel_tests::number(&partition(b1, "solo", on_1)["leader"]) == 1
    });
    let records: String = (0..20).map(|i| format!("v{i}\n")).collect();
    let producer = cli(b2, &["produce", "solo"], &records);
    assert!(producer.status.success());
    let before = values(b2, "solo", on_1 as u32);
    assert!(!before.is_empty());

    // Broker 4 is down; the move to it commits, the voters stay [1].
    broker4.kill();
    cli_ok(b2, &["topic", "move", "solo", "--partition", &on_1.to_string(), "--replicas", "4"], "");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(ids(&partition(b1, "solo", on_1)["voters"]), [1]);
    let refused = cli(b2, &["cluster", "remove-broker", "1"], "");
    assert!(!refused.status.success(), "broker 1 is the partition's only voter: it must not be removed");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("still a member"), "{stderr}");
    let status = json(b2, &["cluster", "status", "--json"]);
    assert_eq!(status["brokers"].as_array().unwrap().len(), 4, "nothing was removed: {status}");

    // Broker 4 returns: the group follows the move, drain sees broker 1
    // empty, and then it may go.
    let _broker4 = start(3, &["--join", b2]);
    cli_ok(b2, &["cluster", "drain", "1", "--timeout-secs", "60"], "");
    cli_ok(b2, &["cluster", "remove-broker", "1"], "");
    let b4 = addresses[3].as_str();
    eventually("broker 4 to hold every record of the moved partition", || values(b4, "solo", on_1 as u32) == before);
}

/// A broker removed while it was down does not add itself back when it is
/// restarted with `--join`: its own log still names it a voter, but the
/// cluster's does not. Found by the simulation (seed 120001278): the
/// removed broker re-registered itself at start-up, was then shut down
/// for good, and new partitions were placed on it.
#[test]
fn a_broker_removed_while_down_does_not_join_again_by_itself() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::TempDir::new().unwrap()).collect();
    let addresses: Vec<String> = (0..4).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let peers = keel_tests::peers(&addresses[..3]);
    let secret = keel_tests::TEST_SECRET;
    let args = |i: usize, how: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = vec!["--id".into(), (i + 1).to_string(), "--cluster-secret".into(), secret.into()];
        args.extend(how.iter().map(|a| a.to_string()));
        args
    };
    let start = |i: usize, how: &[&str]| {
        let args = args(i, how);
        Broker::start(dirs[i].path(), &addresses[i], &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let _brokers: Vec<Broker> = (0..3).map(|i| start(i, &["--peers", &peers])).collect();
    let b2 = addresses[1].as_str();
    eventually("three registered brokers", || {
        json(b2, &["cluster", "status", "--json"])["brokers"].as_array().map_or(0, Vec::len) == 3
    });
    let registered = |broker: &str| -> Vec<u64> {
        let status = json(broker, &["cluster", "status", "--json"]);
        let mut ids: Vec<u64> =
            status["brokers"].as_array().unwrap().iter().map(|b| keel_tests::number(&b["id"])).collect();
        ids.sort();
        ids
    };
    let broker4 = start(3, &["--join", b2]);
    assert_eq!(registered(b2), [1, 2, 3, 4]);

    // Broker 4 goes down and is removed meanwhile.
    broker4.kill();
    cli_ok(b2, &["cluster", "remove-broker", "4"], "");
    assert_eq!(registered(b2), [1, 2, 3]);

    // Restarted with the same data and `--join`, it is refused and stops.
    let mut restarted = std::process::Command::new(keel_tests::keel_binary())
        .arg("serve")
        .args(["--listen", &addresses[3]])
        .args(args(3, &["--join", b2]))
        .current_dir(dirs[3].path())
        .env_remove("KEEL_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = restarted.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = restarted.kill();
            panic!("the removed broker went on running after its join was refused");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut restarted.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("was removed from the cluster"), "{stderr}");
    assert_eq!(registered(b2), [1, 2, 3], "the removed broker registered itself again");
    // The metadata leader's view, asked through any broker, agrees; and a
    // second removal is refused as not registered, by the leader.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let through_3 = Client::new(vec![addresses[2].clone()], RetryPolicy::default()).unwrap();
    let fresh = runtime.block_on(through_3.describe_cluster_fresh()).unwrap();
    let mut fresh_ids: Vec<u64> = fresh.brokers.iter().map(|b| b.id).collect();
    fresh_ids.sort();
    assert_eq!(fresh_ids, [1, 2, 3]);
    let again = cli(addresses[2].as_str(), &["cluster", "remove-broker", "4"], "");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not registered"), "{again:?}");
    cli_ok(b2, &["topic", "create", "after", "--partitions", "6", "--replication-factor", "1"], "");
    let after = json(b2, &["topic", "describe", "after", "--json"]);
    for p in after["partitions"].as_array().unwrap() {
        assert!(!ids(&p["replicas"]).contains(&4), "a removed broker gets no replicas: {p}");
    }
}
