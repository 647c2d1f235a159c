//! The README quick start against a real single-node `keel serve`, driven
//! through the CLI; then bad input, which must get a clear error and leave
//! the broker serving.

use keel_tests::{cli, cli_ok, free_port, http_get, number, sample, Broker};

#[test]
fn quick_start_through_the_cli() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let broker = Broker::start(dir.path(), &address, &[]);

    let created = cli_ok(&address, &["topic", "create", "orders", "--partitions", "3"], "");
    assert!(created.contains("orders"), "{created}");
    cli_ok(&address, &["produce", "orders", "--key-separator", ":"], "user-1:first\nuser-1:second\nuser-2:third\n");

    // Keyed records of one key land in one partition, in order.
    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(&address, &["topic", "describe", "orders", "--json"], "")).unwrap();
    let partitions = described["partitions"].as_array().unwrap();
    let total: u64 = partitions.iter().map(|p| number(&p["high_watermark"])).sum();
    assert_eq!(total, 3);
    let mut values = Vec::new();
    for partition in 0..3 {
        let read = cli_ok(&address, &["read", "orders", "--partition", &partition.to_string(), "--json"], "");
        for line in read.lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            values.push((record["key"].as_str().unwrap().to_string(), record["value"].as_str().unwrap().to_string()));
        }
    }
    let user_1: Vec<_> = values.iter().filter(|(k, _)| k == "user-1").map(|(_, v)| v.as_str()).collect();
    assert_eq!(user_1, ["first", "second"]);
    assert_eq!(values.len(), 3);

    // A consumer group reads every record once; its commits hold across
    // runs, so a second run of the same group finds nothing new.
    let consumed = cli_ok(&address, &["consume", "orders", "--group", "readers", "--max-records", "3", "--json"], "");
    assert_eq!(consumed.lines().count(), 3, "{consumed}");
    let again = cli_ok(&address, &["consume", "orders", "--group", "readers", "--idle-timeout-ms", "1000"], "");
    assert_eq!(again, "", "committed records were delivered again");

    let status = cli_ok(&address, &["cluster", "status"], "");
    assert!(status.contains("metadata leader"), "{status}");
    let health = cli_ok(&address, &["cluster", "health"], "");
    assert!(health.contains("healthy:                     yes"), "{health}");

    // Bad input: a clear error, a failing exit code, nothing changed.
    for (args, expected) in [
        (vec!["topic", "create", "bad name"], "[A-Za-z0-9._-]"),
        (vec!["topic", "create", "orders"], "already exists"),
        (vec!["topic", "create", "zero", "--partitions", "0"], "partitions"),
        (vec!["topic", "create", "wide", "--replication-factor", "3"], "brokers"),
        (vec!["read", "missing"], "does not exist"),
        (vec!["read", "orders", "--partition", "9"], "does not exist"),
        (vec!["topic", "describe", "missing"], "does not exist"),
    ] {
        let output = cli(&address, &args, "");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "keel {args:?} should fail");
        assert!(stderr.contains(expected), "keel {args:?}: expected {expected:?} in {stderr}");
    }
    let listed: serde_json::Value = serde_json::from_str(&cli_ok(&address, &["topic", "list", "--json"], "")).unwrap();
    assert_eq!(listed["topics"].as_array().unwrap().len(), 1, "bad input created nothing");

    // A graceful shutdown, then a restart from the same directory keeps
    // every record.
    assert!(broker.terminate().success());
    let _broker = Broker::start(dir.path(), &address, &[]);
    let listed: serde_json::Value =
        serde_json::from_str(&cli_ok(&address, &["topic", "describe", "orders", "--json"], "")).unwrap();
    let total: u64 = listed["partitions"].as_array().unwrap().iter().map(|p| number(&p["high_watermark"])).sum();
    assert_eq!(total, 3);
}

/// `GET path` over plain HTTP/1.0; returns the body.
#[test]
fn prometheus_metrics_show_traffic_raft_state_and_lag() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let metrics_address = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(dir.path(), &address, &["--metrics-listen", &metrics_address]);

    cli_ok(&address, &["topic", "create", "metered"], "");
    cli_ok(&address, &["produce", "metered"], "a\nb\nc\nd\n");
    cli_ok(&address, &["consume", "metered", "--group", "meters", "--max-records", "1"], "");

    let metrics = http_get(&metrics_address, "/metrics");
    assert_eq!(sample(&metrics, "keel_produced_records_total"), 4.0);
    assert!(sample(&metrics, "keel_polled_records_total") >= 1.0);
    assert!(sample(&metrics, "keel_acks_total") >= 1.0);
    assert!(sample(&metrics, r#"keel_requests_total{rpc="Produce",code="OK"}"#) >= 1.0);
    assert!(sample(&metrics, r#"keel_request_duration_seconds_count{rpc="Produce"}"#) >= 1.0);
    assert_eq!(sample(&metrics, r#"keel_raft_leader{raft_group="metadata"}"#), 1.0);
    assert!(sample(&metrics, r#"keel_raft_term{raft_group="metadata"}"#) >= 1.0);
    assert_eq!(sample(&metrics, r#"keel_partition_high_watermark{topic="metered",partition="0"}"#), 4.0);
    // One record acknowledged of four: three to go.
    assert_eq!(sample(&metrics, r#"keel_consumer_lag{group="meters",topic="metered",partition="0"}"#), 3.0);

    // A group that has read everything and left has no lag series any more
    // (a partition remembers every group that ever read it).
    cli_ok(&address, &["consume", "metered", "--group", "done", "--max-records", "4"], "");
    let metrics = http_get(&metrics_address, "/metrics");
    assert!(!metrics.contains(r#"keel_consumer_lag{group="done""#), "{metrics}");

    // A bad request is counted with its status code.
    cli(&address, &["topic", "describe", "missing"], "");
    let metrics = http_get(&metrics_address, "/metrics");
    assert!(sample(&metrics, r#"keel_requests_total{rpc="DescribeTopic",code="NOT_FOUND"}"#) >= 1.0);
}

/// Retention set at `keel topic create` runs by itself: once the partition
/// holds more than its byte limit, the log start moves past the oldest
/// records, `topic describe` shows it, reads below it are refused with a
/// clear error, and the newest records are read intact.
#[test]
fn retention_by_size_moves_the_log_start() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _broker =
        Broker::start(dir.path(), &address, &["--retention-check-interval", "200ms", "--metrics-listen", &metrics]);
    let created = cli_ok(&address, &["topic", "create", "kept", "--retention-bytes", "2KiB"], "");
    assert!(created.contains("2.0 KiB"), "the retention is shown: {created}");
    // 40 records of 100 bytes: 4,000 bytes, twice the limit.
    let lines: String = (0..40).map(|i| format!("{i:03}{}\n", "x".repeat(97))).collect();
    cli_ok(&address, &["produce", "kept"], &lines);

    let log_start = || {
        let described: serde_json::Value =
            serde_json::from_str(&cli_ok(&address, &["topic", "describe", "kept", "--json"], "")).unwrap();
        assert_eq!(described["retention_bytes"], "2048", "{described}");
        assert!(described["retention_ms"].is_null(), "no age limit: {described}");
        number(&described["partitions"][0]["log_start"])
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while log_start() == 0 {
        assert!(std::time::Instant::now() < deadline, "retention never ran");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // At most 2 KiB (2,048 bytes) is kept: the last 20 records.
    let start = log_start();
    assert_eq!(start, 20, "the log start is just past the records beyond 2 KiB");
    let read = cli_ok(&address, &["read", "kept", "--offset", &start.to_string(), "--json"], "");
    let values: Vec<String> = read
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["value"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(values, (20..40).map(|i| format!("{i:03}{}", "x".repeat(97))).collect::<Vec<_>>());
    let below = cli(&address, &["read", "kept", "--offset", "0"], "");
    assert!(!below.status.success(), "a read below the log start is refused");
    let error = String::from_utf8_lossy(&below.stderr);
    assert!(error.contains("log start") || error.contains("out of range"), "{error}");
    // Far fewer entries than openraft's own snapshot interval (5,000): the
    // retention check snapshots the partition itself, so that the entries
    // behind the log start can be purged.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sample(&http_get(&metrics, "/metrics"), "keel_snapshots_built") < 1.0 {
        assert!(std::time::Instant::now() < deadline, "retention never led to a snapshot");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
