//! What encoding one Raft entry costs: an entry of 128 records of 1 KiB
//! (a coalesced append at 256 produces in flight), encoded with
//! `postcard::to_stdvec` (a vector grown as it goes) and with
//! `keel_server::encoding::to_sized_vec` (a counting pass, then one
//! allocation). Prints the median and the fastest of 2,000 encodings each,
//! the two alternating in rounds.
//! Run with `cargo bench -p keel-server --bench encoding`.

use std::time::{Duration, Instant};

use keel_core::partition::PartitionCommand;
use keel_core::record::Record;
use keel_core::TimestampMs;
use keel_server::raft::types::{Command, Request, TypeConfig};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

/// The broker's allocator (see `keel`'s `main.rs`): how a growing vector
/// reallocates depends on it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RECORDS: usize = 128;
const RECORD_BYTES: usize = 1024;
const ROUNDS: usize = 20;
const PER_ROUND: usize = 100;

fn main() {
    let records = (0..RECORDS).map(|i| Record::from_value(vec![i as u8; RECORD_BYTES])).collect();
    let request =
        Request::new(TimestampMs(1), Command::Partition(PartitionCommand::Append { producer: None, records }));
    let entry: Entry<TypeConfig> =
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), 1), payload: EntryPayload::Normal(request) };
    let (mut grown, mut sized) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        grown.extend(time(|| postcard::to_stdvec(&entry).unwrap()));
        sized.extend(time(|| keel_server::encoding::to_sized_vec(&entry).unwrap()));
    }
    report("postcard::to_stdvec", &mut grown);
    report("encoding::to_sized_vec", &mut sized);
}

fn time(encode: impl Fn() -> Vec<u8>) -> Vec<Duration> {
    (0..PER_ROUND)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(encode());
            started.elapsed()
        })
        .collect()
}

fn report(name: &str, times: &mut [Duration]) {
    times.sort();
    println!(
        "{name}: entry of {RECORDS} x {RECORD_BYTES} B records: median {:.1} us, fastest {:.1} us ({} encodings)",
        times[times.len() / 2].as_secs_f64() * 1e6,
        times[0].as_secs_f64() * 1e6,
        times.len()
    );
}
