//! Where should Raft log entries live: rows of the node's redb database
//! (keel today) or frames of an append-only segment log? Batches of 1 KiB
//! entries, each batch made durable before the next, as a node's writer
//! does with the appends that queued up during its previous fsync.
//!
//! - redb: one transaction inserts the batch's rows (not durable), a second
//!   empty one commits durably: the writer's two commits per batch today.
//! - segments: the batch's frames in one write, then one `sync_data`.
//!
//! Printed per case: batches and entries per second, and the bytes the
//! kernel sent to the device per payload byte (`write_bytes` of
//! /proc/self/io). Rounds alternate between the layouts; the medians are
//! printed last. The files go in `KEEL_BENCH_DIR` (default: `target/`, on
//! the same disk as a broker's data would be).
//!
//! Run with `cargo bench -p keel-server --bench segments [-- SECONDS ROUNDS]`
//! (`cargo test --all-targets` runs it as a quick smoke run).

// Only `full_run` is used here.
#[allow(dead_code)]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_server::storage::segments::{DirectoryDisk, SegmentDisk, SegmentLog};
use redb::{Database, Durability, TableDefinition};

const LOG: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("raft_log");
const ENTRY_BYTES: usize = 1024;

/// Bytes this process has caused to be sent to storage so far.
fn device_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("write_bytes: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

struct Outcome {
    batches_per_s: f64,
    entries_per_s: f64,
    device_per_payload: f64,
}

/// Run `batch` (which writes `per_batch` entries durably) for `seconds`.
fn run(seconds: f64, per_batch: usize, mut batch: impl FnMut(u64)) -> Outcome {
    let (started, bytes_before) = (Instant::now(), device_bytes());
    let mut batches = 0u64;
    while started.elapsed() < Duration::from_secs_f64(seconds) {
        batch(batches);
        batches += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let payload = (batches * per_batch as u64 * ENTRY_BYTES as u64) as f64;
    Outcome {
        batches_per_s: batches as f64 / elapsed,
        entries_per_s: (batches * per_batch as u64) as f64 / elapsed,
        device_per_payload: (device_bytes() - bytes_before) as f64 / payload,
    }
}

fn redb_case(dir: &std::path::Path, seconds: f64, per_batch: usize) -> Outcome {
    let db = Database::create(dir.join("log.redb")).expect("create redb");
    let entry = vec![b'x'; ENTRY_BYTES];
    run(seconds, per_batch, |n| {
        let mut txn = db.begin_write().expect("begin");
        txn.set_durability(Durability::None).expect("durability");
        {
            let mut table = txn.open_table(LOG).expect("table");
            for i in 0..per_batch as u64 {
                table.insert(("partition-0", n * per_batch as u64 + i), entry.as_slice()).expect("insert");
            }
        }
        txn.commit().expect("commit");
        db.begin_write().expect("begin").commit().expect("durable commit");
    })
}

fn segments_case(dir: &std::path::Path, seconds: f64, per_batch: usize) -> Outcome {
    let disk: Arc<dyn SegmentDisk> = Arc::new(DirectoryDisk::new(dir.join("segments")).expect("directory"));
    let mut log = SegmentLog::open(disk, None, |_, _| Ok(())).expect("open");
    // A frame as the log store would write it: group, index, entry.
    let mut body = vec![b'x'; ENTRY_BYTES + 24];
    body[..11].copy_from_slice(b"partition-0");
    run(seconds, per_batch, |n| {
        for i in 0..per_batch as u64 {
            body[12..20].copy_from_slice(&(n * per_batch as u64 + i).to_le_bytes());
            log.append(&body).expect("append");
        }
        log.sync().expect("sync");
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (seconds, rounds) = if common::full_run() { (3.0, 3) } else { (0.05, 1) };
    let seconds: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(seconds);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(rounds);
    let base = std::env::var("KEEL_BENCH_DIR").unwrap_or_else(|_| "target".to_string());
    std::fs::create_dir_all(&base).expect("bench directory");
    println!("{seconds} s per case, {rounds} rounds, 1 KiB entries, in {base}");
    println!("{:<10} {:>6} {:>12} {:>12} {:>18}", "layout", "batch", "batches/s", "entries/s", "device B/payload B");
    let mut medians = Vec::new();
    for per_batch in [1usize, 16, 64, 256] {
        let (mut redb, mut segments) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for (name, results) in [("redb", &mut redb), ("segments", &mut segments)] {
                let dir = tempfile::tempdir_in(&base).expect("temporary directory");
                let outcome = if name == "redb" {
                    redb_case(dir.path(), seconds, per_batch)
                } else {
                    segments_case(dir.path(), seconds, per_batch)
                };
                println!(
                    "{name:<10} {per_batch:>6} {:>12.0} {:>12.0} {:>18.2}",
                    outcome.batches_per_s, outcome.entries_per_s, outcome.device_per_payload
                );
                results.push(outcome);
            }
        }
        for (name, results) in [("redb", redb), ("segments", segments)] {
            medians.push((
                name,
                per_batch,
                median(results.iter().map(|o| o.batches_per_s).collect()),
                median(results.iter().map(|o| o.entries_per_s).collect()),
                median(results.iter().map(|o| o.device_per_payload).collect()),
            ));
        }
    }
    println!("\nmedians");
    println!("{:<10} {:>6} {:>12} {:>12} {:>18}", "layout", "batch", "batches/s", "entries/s", "device B/payload B");
    for (name, per_batch, batches, entries, device) in medians {
        println!("{name:<10} {per_batch:>6} {batches:>12.0} {entries:>12.0} {device:>18.2}");
    }
}
