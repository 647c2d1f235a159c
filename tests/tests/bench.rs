//! `keel bench` against a real broker: produce (plain requests and the
//! batching producer) and consume print one JSON report each whose counts
//! match what the topic holds.

use keel_tests::{cli_ok, free_port, Broker};

fn report(output: &str) -> serde_json::Value {
    serde_json::from_str(output.trim()).unwrap_or_else(|e| panic!("not one JSON report ({e}): {output}"))
}

#[test]
fn bench_produces_and_consumes_and_reports() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(dir.path(), &address, &[]);
    let bench = ["bench", "produce", "load", "--partitions", "2", "--warmup", "0s", "--json"];

    let plain = report(&cli_ok(
        &address,
        &[&bench[..], &["--count", "500", "--in-flight", "8", "--records-per-request", "5", "--record-size", "100"]]
            .concat(),
        "",
    ));
    assert_eq!(plain["bench"], "produce");
    assert!(plain["records"].as_u64().unwrap() >= 500, "{plain}");
    assert_eq!(plain["errors"], 0, "{plain}");
    let latency = &plain["latency_ms"];
    assert!(latency["p50"].as_f64().unwrap() <= latency["max"].as_f64().unwrap(), "{plain}");

    let batching =
        report(&cli_ok(&address, &[&bench[..], &["--count", "300", "--batching", "--in-flight", "3"]].concat(), ""));
    assert!(batching["records"].as_u64().unwrap() >= 300, "{batching}");
    assert_eq!(batching["errors"], 0, "{batching}");
    // The batching producer's latencies reach the report too.
    let latency = &batching["latency_ms"];
    assert!(latency["p50"].as_f64().unwrap() <= latency["max"].as_f64().unwrap(), "{batching}");

    // Consume drains exactly what the topic holds.
    let described = report(&cli_ok(&address, &["topic", "describe", "load", "--json"], ""));
    let held: u64 =
        described["partitions"].as_array().unwrap().iter().map(|p| keel_tests::number(&p["high_watermark"])).sum();
    assert!(held >= 800, "the topic holds {held} records");
    let consumed = report(&cli_ok(
        &address,
        &["bench", "consume", "load", "--group", "drain", "--members", "2", "--count", &held.to_string(), "--json"],
        "",
    ));
    assert_eq!(consumed["records"].as_u64().unwrap(), held, "{consumed}");
    assert_eq!(consumed["errors"], 0, "{consumed}");
}

#[test]
fn bench_groups_joins_and_leaves_groups_and_reports_each_window() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(dir.path(), &address, &[]);
    let out =
        cli_ok(&address, &["bench", "groups", "--count", "120", "--window", "60", "--concurrency", "1", "--json"], "");
    let windows: Vec<serde_json::Value> = out.lines().map(report).collect();
    assert_eq!(windows.len(), 2, "{out}");
    for (index, window) in windows.iter().enumerate() {
        assert_eq!(window["first_group"], 60 * index as u64, "{window}");
        assert_eq!(window["groups"], 60, "{window}");
        assert_eq!(window["errors"], 0, "{window}");
        assert!(window["join_ms"]["p50"].as_f64().unwrap() > 0.0, "{window}");
    }
    // Each group joined and left: none has a member.
    let listed = report(&cli_ok(&address, &["group", "list", "--json"], ""));
    let groups = listed["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 120, "{listed}");
    assert!(groups.iter().all(|g| g["members"] == 0), "{listed}");
}
