//! keel's fuzz targets, as plain functions of the fuzzer's bytes: libFuzzer
//! drives them through the binaries in `fuzz_targets/`, and
//! `tests/corpus.rs` replays every committed corpus input through them in
//! an ordinary `cargo test`.
//!
//! The state-machine, assignor and recovery targets reuse the property
//! tests' own generators and checks (the files under `core/tests/` and
//! `server/tests/`): the fuzzer's bytes seed proptest's generators, so a
//! fuzzer finding and a proptest failure are judged by the same reference
//! models. The decoding and placement targets read the bytes directly. Each target panics on a broken
//! property, which is what libFuzzer reports.

// The included test files carry their own proptest `#[test]`s, which only
// exist in their own test builds; here only their generators and checks
// are used. The two core model files each include core/tests/common/.
#![allow(clippy::duplicate_mod)]
#[path = "../../core/tests/assignor_properties.rs"]
#[allow(dead_code)]
mod assignor_properties;
#[path = "../../server/tests/crash_disk.rs"]
#[allow(dead_code)]
mod crash_disk;
mod decode;
#[path = "../../core/tests/metadata_model.rs"]
#[allow(dead_code)]
mod metadata_model;
#[path = "../../core/tests/partition_model.rs"]
#[allow(dead_code)]
mod partition_model;
mod placement;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

pub use decode::decode;

/// Draw one value of `strategy`, with the fuzzer's bytes as the seed of
/// proptest's generator (ChaCha). Handing the bytes straight to the
/// generators (`RngAlgorithm::PassThrough`) looped forever in proptest's
/// uniform sampling once an input ran out, so the bytes seed it instead:
/// libFuzzer then searches seeds, guided by the coverage each one reaches.
fn draw<S: Strategy>(data: &[u8], strategy: S) -> Option<S::Value> {
    let mut seed = [0u8; 32];
    for (i, chunk) in seed.chunks_mut(8).enumerate() {
        let mut salted = data.to_vec();
        salted.push(i as u8);
        chunk.copy_from_slice(&keel_core::routing::fnv1a_64(&salted).to_le_bytes());
    }
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    strategy.new_tree(&mut runner).ok().map(|tree| tree.current())
}

/// Target 1: metadata command sequences, valid and invalid, against the
/// reference model, with `check_invariants()` after each step.
pub fn metadata(data: &[u8]) {
    if let Some(commands) = draw(data, metadata_model::commands()) {
        if let Err(failure) = metadata_model::check_commands(&commands) {
            panic!("metadata state machine broke a property: {failure}\ncommands: {commands:?}");
        }
    }
}

/// Target 2: partition steps (idempotent producers, claims, commits,
/// resets, retention) against the reference model.
pub fn partition(data: &[u8]) {
    if let Some(inputs) = draw(data, partition_model::inputs()) {
        let shown = format!("{inputs:?}");
        if let Err(failure) = partition_model::check_steps(inputs) {
            panic!("partition state machine broke a property: {failure}\ninputs: {shown}");
        }
    }
}

/// Target 3: assignors (ownership, balance, stickiness, order
/// independence) and placement (distinct replicas, even spread).
pub fn assignors(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    if selector % 4 == 0 {
        placement::check(rest);
        return;
    }
    if let Some(case) = draw(rest, assignor_properties::any_case()) {
        let shown = format!("{case:?}");
        if let Err(failure) = assignor_properties::check_case(case) {
            panic!("an assignor broke a property: {failure}\ncase: {shown}");
        }
    }
}

/// Target 5: redb on the crash-simulating disk under write, sync and crash
/// sequences reopens with the state of a committed transaction.
pub fn recovery(data: &[u8]) {
    if let Some((steps, final_seed)) = draw(data, crash_disk::sequence()) {
        let disk = keel_server::storage::crash_disk::CrashDisk::new();
        if let Err(violation) = crash_disk::run_sequence(disk, &steps, final_seed) {
            panic!("recovery broke a property: {violation:?}\nsteps: {steps:?}\nfinal seed: {final_seed}");
        }
    }
}

/// A fuzz target: a function of the fuzzer's bytes that panics on a bug.
pub type Target = fn(&[u8]);

/// Every target by name, for the corpus replay.
pub const TARGETS: [(&str, Target); 5] = [
    ("metadata", metadata),
    ("partition", partition),
    ("assignors", assignors),
    ("decode", decode),
    ("recovery", recovery),
];
