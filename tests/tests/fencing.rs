//! A member paused past its session (SIGSTOP) loses its partitions: the
//! other member consumes what arrives meanwhile, and when the paused member
//! resumes, its stale generation is fenced (it rejoins) and no committed
//! position goes backwards (G4, G5).

use std::time::{Duration, Instant};

use keel_tests::{cli, cli_ok, free_port, keel_binary, signal, spawn_cli, Broker};
use rustix::process::Signal;

/// The group's position on each partition it has a member for (none
/// before the group exists).
fn positions(broker: &str) -> Vec<u64> {
    let mut positions = Vec::new();
    let output = cli(broker, &["group", "describe", "g", "--json"], "");
    if !output.status.success() {
        return positions;
    }
    let described: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for partition in 0..2u32 {
        let position = described["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["partition"].as_u64() == Some(u64::from(partition)))
            .map(|p| keel_tests::number(&p["position"]));
        positions.extend(position);
    }
    positions
}

#[test]
fn a_paused_member_is_fenced_and_its_partitions_move_on() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(dir.path(), &address, &[]);
    cli_ok(&address, &["topic", "create", "t", "--partitions", "2"], "");
    cli_ok(&address, &["produce", "t"], &(0..20).map(|i| format!("{i}\n")).collect::<String>());

    let mut a = std::process::Command::new(keel_binary())
        .args(["consume", "t", "--group", "g", "--member", "a", "--session-timeout-ms", "1000", "--json"])
        .args(["--broker", &address])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while positions(&address).iter().sum::<u64>() < 20 {
        assert!(started.elapsed() < Duration::from_secs(30), "member a never consumed the first records");
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = positions(&address);

    // Pause a past its session; b joins and must get everything new.
    signal(&a, Signal::STOP);
    let b =
        spawn_cli(&address, &["consume", "t", "--group", "g", "--member", "b", "--json", "--idle-timeout-ms", "4000"]);
    cli_ok(&address, &["produce", "t"], &(20..40).map(|i| format!("{i}\n")).collect::<String>());
    let output = b.wait_with_output().unwrap();
    assert!(output.status.success(), "member b failed");
    let consumed_by_b: Vec<u64> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["value"].as_str().unwrap().parse().unwrap()
        })
        .collect();
    for value in 20..40 {
        assert!(consumed_by_b.contains(&value), "record {value} was not consumed while a was paused");
    }

    // a resumes: it must not move any committed position back.
    signal(&a, Signal::CONT);
    std::thread::sleep(Duration::from_secs(3));
    let after = positions(&address);
    assert!(after.iter().sum::<u64>() >= 40, "positions {after:?}");
    for (old, new) in before.iter().zip(&after) {
        assert!(new >= old, "a committed position went back: {before:?} -> {after:?}");
    }
    assert!(a.try_wait().unwrap().is_none(), "the resumed member must rejoin, not crash");
    let _ = a.kill();
    // It learnt that it lost its place, and said so.
    let told = a.wait_with_output().unwrap();
    let told = String::from_utf8_lossy(&told.stderr);
    assert!(told.contains("rejoining") && (told.contains("fenced") || told.contains("removed")), "a said: {told}");
}
