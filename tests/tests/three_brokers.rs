//! Three real `keel serve` processes on loopback: a topic with three
//! replicas survives `kill -9` of a broker mid-stream; every acknowledged
//! record is readable afterwards, in order, on every replica, including the
//! killed one once it restarts from its data directory.

use std::time::{Duration, Instant};

use keel_tests::{cli, cli_ok, free_port, Broker};

fn high_watermarks(broker: &str) -> Vec<u64> {
    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(broker, &["topic", "describe", "events", "--json"], "")).unwrap();
    described[0]["partitions"].as_array().unwrap().iter().map(|p| p["high_watermark"].as_u64().unwrap()).collect()
}

fn values(broker: &str, partition: u32) -> Vec<String> {
    let out = cli_ok(
        broker,
        &["read", "events", "--partition", &partition.to_string(), "--max-records", "10000", "--json"],
        "",
    );
    out.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["value"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn kill_9_of_a_broker_loses_no_acknowledged_record() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::TempDir::new().unwrap()).collect();
    let addresses: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let peers = addresses.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",");
    let start =
        |i: usize| Broker::start(dirs[i].path(), &addresses[i], &["--id", &(i + 1).to_string(), "--peers", &peers]);
    let mut brokers: Vec<Option<Broker>> = (0..3).map(|i| Some(start(i))).collect();

    // The cluster is ready once every broker is registered.
    let started = Instant::now();
    loop {
        let status = cli(&addresses[1], &["cluster", "status", "--json"], "");
        let ready = status.status.success()
            && serde_json::from_slice::<serde_json::Value>(&status.stdout)
                .is_ok_and(|v| v["brokers"].as_array().is_some_and(|b| b.len() == 3));
        if ready {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "cluster not ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    cli_ok(&addresses[1], &["topic", "create", "events", "--partitions", "2", "--replication-factor", "3"], "");

    let batch = |from: u32, to: u32| (from..to).map(|i| format!("k{}:record-{i:05}\n", i % 7)).collect::<String>();
    cli_ok(&addresses[1], &["produce", "events", "--key-separator", ":"], &batch(0, 300));
    brokers[0].take().unwrap().kill();
    cli_ok(&addresses[1], &["produce", "events", "--key-separator", ":"], &batch(300, 600));
    brokers[0] = Some(start(0));

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
