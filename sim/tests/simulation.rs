//! The simulation campaign CI runs (`cargo sim`): a sweep of seeds with
//! every fault kind on, the regression seeds, one negative control per
//! checker (each planted bug must be caught within a stated number of
//! seeds), and exact replay of a seed, in a batch and in another process.

#![cfg(madsim)]

use keel_core::planted::Bug;
use keel_sim::checkers::Guarantee;
use keel_sim::harness::{run_scenario, run_seed, scenario_for, Plant, RunOptions};

/// The same allocator as `keel-sim`'s: glibc's malloc and free took about
/// a sixth of a seed's time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Seeds in CI's sweep, every fault kind enabled (split over two tests so
/// they run on both cores).
const SWEEP_SEEDS: u64 = 60;

fn sweep(seeds: std::ops::Range<u64>) {
    let mut failures = Vec::new();
    let mut duplicates = 0;
    let mut retained = Vec::new();
    for seed in seeds.clone() {
        let report = run_seed(seed, RunOptions { all_faults: true, plant: None });
        duplicates += report.verdict.duplicates;
        if report.world_retained {
            retained.push(seed);
        }
        if !report.verdict.violations.is_empty() {
            failures.push(format!(
                "seed {seed}: {:?}\n  replay: cargo keel-sim -- replay --seed {seed} --all-faults --history seed-{seed}.jsonl",
                report.verdict.violations
            ));
        }
    }
    eprintln!("seeds {seeds:?}: {duplicates} duplicate deliveries (allowed)");
    assert!(failures.is_empty(), "violations:\n{}", failures.join("\n"));
    // A sweep's worker runs seed after seed: a run that leaves its cluster
    // behind (a task left waiting on a host the harness does not kill)
    // grows the worker by the whole cluster.
    assert!(retained.is_empty(), "seeds whose cluster outlived the run: {retained:?}");
}

#[test]
fn every_guarantee_holds_on_every_seed_first_half() {
    sweep(0..SWEEP_SEEDS / 2);
}

#[test]
fn every_guarantee_holds_on_every_seed_second_half() {
    sweep(SWEEP_SEEDS / 2..SWEEP_SEEDS);
}

#[test]
fn regression_seeds_hold() {
    let seeds = include_str!("../regression-seeds.txt");
    let mut failures = Vec::new();
    for line in seeds.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        let seed: u64 = words.next().unwrap().parse().expect("a seed number");
        let all_faults = words.any(|w| w == "--all-faults");
        let report = run_seed(seed, RunOptions { all_faults, plant: None });
        if !report.verdict.violations.is_empty() {
            failures.push(format!("seed {seed}: {:?}", report.verdict.violations));
        }
    }
    assert!(failures.is_empty(), "regression seeds failed:\n{}", failures.join("\n"));
}

/// Run seeds from 0 with `plant` until its checker reports it; return the
/// seed that caught it.
fn caught_within(plant: Plant, seeds: u64) -> u64 {
    for seed in 0..seeds {
        let report = run_seed(seed, RunOptions { all_faults: false, plant: Some(plant) });
        let guarantees: Vec<Guarantee> = report.verdict.violations.iter().map(|v| v.guarantee).collect();
        if guarantees.contains(&plant.caught_by()) {
            return seed;
        }
    }
    panic!("{} was not caught by {} within {seeds} seeds", plant.name(), plant.caught_by());
}

#[test]
fn g1_catches_a_disk_that_acknowledges_fsync_without_syncing() {
    caught_within(Plant::LyingDisk, 3);
}

#[test]
fn g2_and_g6_catch_apply_reading_the_wall_clock() {
    caught_within(Plant::Bug(Bug::WallClockApply), 3);
    // The same bug shows to readers as two records at one offset.
    let report = run_seed(0, RunOptions { all_faults: false, plant: Some(Plant::Bug(Bug::WallClockApply)) });
    assert!(report.verdict.violations.iter().any(|v| v.guarantee == Guarantee::G2), "{:?}", report.verdict.violations);
}

#[test]
fn g3_catches_a_consumer_that_hands_on_records_twice_in_a_session() {
    caught_within(Plant::Bug(Bug::ConsumerNoOrderFilter), 3);
}

#[test]
fn g4_catches_commits_that_go_backwards_or_past_the_high_watermark() {
    caught_within(Plant::Bug(Bug::CommitUnchecked), 3);
}

#[test]
fn g1_catches_a_batching_producer_that_mismatches_its_answers() {
    caught_within(Plant::Bug(Bug::BatchingAnswersNewest), 5);
}

#[test]
fn g5_catches_commit_without_the_fence() {
    // A consumer paused past its session (or fenced by a second process
    // with its id) that acks what it held shows it now and then; the
    // hostile lane's acks under a generation the group has left behind
    // show it in most seeds that have the lane: 7 of seeds 0-39, seed 3
    // first (2026-12-04; with the paused consumer alone, 5 of 120).
    caught_within(Plant::Bug(Bug::CommitWithoutFence), 40);
}

#[test]
fn g5_catches_a_poll_without_the_fence() {
    // A paused consumer that polls after the rebalance, and the hostile
    // lane's zombie (a poll as the member a partition leader's lagging
    // metadata still holds) show it: 6 of seeds 0-39, seed 6 first, 3 of
    // them by the zombie (2026-12-05); 24 of seeds 0-39, seed 0 first, once
    // G5 also took the claims replicas applied for claims made (the same
    // day, twenty-ninth session): without the member check, the hostile
    // lane's forged polls in a generation not reached yet apply a claim,
    // and the group's own polls are fenced by it. 6 of seeds 0-39 on
    // 36fbe4e (0, 5, 8, 16, 23, 37), 2 once a group given its turn to elect
    // ticks at once (10, 37; 2026-12-06): elections and woken leaders
    // came 150 ms sooner, and with them the claims that fence a stale
    // poll. The refusal checker catches the same plant in most of the
    // others (the hostile lane's polls as members it does not own).
    caught_within(Plant::Bug(Bug::PollWithoutFence), 12);
}

#[test]
fn g5_catches_a_poll_without_the_read_index() {
    // A leader cut off from the other brokers (the network lane's
    // partition-brokers; clients still reach it), deposed without knowing
    // it, serves the hostile lane's zombie: a poll from the log's start as
    // the member its stale state says holds the partition, after the lane
    // moved the group on and a newer generation's claim applied at the new
    // leader. It needs a leader deposed at the right moment, so which seeds
    // catch it moves with every change of timing: seeds 117, 127, 170, 191,
    // 211, 214, 219, 245 and 286 of 0-299 since the writer commits before
    // its sync (2026-12-07); 51, 150, 182, 183 and 196 of 0-199 before; 0
    // of 1,100 seeds before the brokers-only split.
    caught_within(Plant::Bug(Bug::PollWithoutReadIndex), 130);
}

#[test]
fn g1_catches_a_retried_batch_answered_with_the_newest_batchs_offsets() {
    // Producers with several batches in flight retry older batches after
    // newer ones applied: 7 of seeds 0-11, seed 0 first (2026-12-05). Since
    // commits reach followers with the next entries (2026-12-07): G1 in 4 of
    // seeds 0-15, seed 4 first (seed 0 breaks only G3, order).
    caught_within(Plant::Bug(Bug::DuplicateAnswersNewest), 5);
}

#[test]
fn g7_catches_a_poison_pill() {
    caught_within(Plant::Bug(Bug::PanicOnBadCommit), 3);
}

#[test]
fn g7_catches_batched_raft_answers_handed_to_the_wrong_calls() {
    // Each answer of a batch goes to the call after its own (the plant
    // turns eager batching on): a group given another group's answer
    // finds it does not fit what it sent, and openraft stops the broker.
    // 13 of seeds 0-239, 11 the first (2026-12-07); one of them (44) as
    // partitions that take no writes after the heal (L1).
    caught_within(Plant::Bug(Bug::BatchAnswersMisrouted), 20);
}

#[test]
fn g8_catches_a_dropped_idempotence_check() {
    // Earlier seeds show the bug as G3 (a retried batch appended again
    // lands out of order) before G8 does: seed 7 was the first where G8
    // itself reports a record at two offsets (2026-12-01), seed 13 since
    // the disk-full lane changed the runs (2026-12-02; 13 of seeds 0-39).
    caught_within(Plant::Bug(Bug::NoIdempotence), 16);
}

#[test]
fn l1_catches_a_coordinator_that_never_expires_members() {
    caught_within(Plant::Bug(Bug::NeverExpireMembers), 3);
}

#[test]
fn g1_at_every_power_cut_catches_persistence_reported_before_the_fsync() {
    caught_within(Plant::Bug(Bug::PersistedBeforeSync), 10);
    // Caught at the cut itself, from the broker's own durable image (on
    // the first seeds: which one depends on the trace).
    let at_the_cut = (0..10).find(|seed| {
        let report =
            run_seed(*seed, RunOptions { all_faults: false, plant: Some(Plant::Bug(Bug::PersistedBeforeSync)) });
        report.verdict.violations.iter().any(|v| v.message.contains("lost what it reported durable"))
    });
    assert!(at_the_cut.is_some(), "no seed of 0..10 caught the plant at a power cut");
}

#[test]
fn g1_at_every_power_cut_catches_a_vote_lost() {
    // A vote is a frame of the segment log, replayed after a crash; the
    // check at each power cut compares the durable image's vote with the
    // last one the broker saved.
    caught_within(Plant::Bug(Bug::VotesNotReplayed), 10);
}

#[test]
fn g6_catches_a_snapshot_that_drops_a_record() {
    caught_within(Plant::Bug(Bug::SnapshotDropsLastRecord), 3);
    // The seed's own snapshot lane builds and installs snapshots.
    let report = run_seed(0, RunOptions { all_faults: true, plant: None });
    assert!(report.snapshots.0 > 0, "no snapshot was built: {:?}", report.snapshots);
}

#[test]
fn l1_catches_partitions_that_refuse_writes_after_a_failover() {
    // Consumers still read everything acknowledged; only the write probes
    // after the heal show that writes never come back.
    caught_within(Plant::Bug(Bug::RefuseProducesAfterFailover), 3);
}

#[test]
fn forged_acks_of_the_hostile_client_are_caught_once_the_fence_is_gone() {
    // With the fence, every forged ack and poll is refused (the sweeps);
    // without it, the hostile client's acks move positions (G4). Whether a
    // forged ack lands before the member's own depends on the run (seed 0
    // shows it again since the impostor came; for a while only seed 2 did).
    let caught = (0..6).find(|seed| {
        let report = run_seed(*seed, RunOptions { all_faults: true, plant: Some(Plant::Bug(Bug::CommitWithoutFence)) });
        report.verdict.violations.iter().any(|v| v.guarantee == Guarantee::G4 && v.message.contains("hostile ack"))
    });
    assert!(caught.is_some(), "no forged ack moved a position in all-fault seeds 0-5");
}

#[test]
fn g4_catches_a_group_deleted_with_positions_left_behind() {
    // The topic lane (on with every fault) deletes a second group after it
    // acknowledged some records; each of its positions must go with it.
    let plant = Some(Plant::Bug(Bug::ForgetKeepsPositions));
    let caught = (0..3).find(|seed| {
        let report = run_seed(*seed, RunOptions { all_faults: true, plant });
        report.verdict.violations.iter().any(|v| v.guarantee == Guarantee::G4 && v.message.contains("these stayed"))
    });
    assert!(caught.is_some(), "forget-keeps-positions was not caught in all-fault seeds 0-2");
}

#[test]
fn the_replay_check_catches_a_harness_that_keeps_state_across_runs() {
    let scenario = scenario_for(0, RunOptions::default());
    let planted = run_scenario(scenario.clone(), Some(Plant::StateAcrossRuns), true);
    assert!(
        planted.verdict.violations.iter().any(|v| v.guarantee == Guarantee::Replay),
        "{:?}",
        planted.verdict.violations
    );
    // Without the plant, the same check passes.
    let clean = run_scenario(scenario, None, true);
    assert!(clean.verdict.violations.is_empty(), "{:?}", clean.verdict.violations);
}

#[test]
fn shrinking_reduces_a_planted_failure_to_a_few_faults_and_the_minimum_replays_exactly() {
    let plant = Some(Plant::Bug(Bug::PersistedBeforeSync));
    let seed = caught_within(Plant::Bug(Bug::PersistedBeforeSync), 10);
    let scenario = scenario_for(seed, RunOptions { all_faults: false, plant });
    let shrunk = keel_sim::shrink::shrink(scenario.clone(), plant, 80, |_, _| {}).expect("the seed fails");
    assert_eq!(shrunk.guarantee, Guarantee::G1);
    let faults: u64 = shrunk.report.faults.values().sum();
    assert!(faults <= 3, "{faults} faults left after {} runs: {:?}", shrunk.runs, shrunk.steps);
    // Smaller, and nowhere larger (which dimensions shrink depends on the
    // seed the planted bug is first caught on).
    assert_ne!(shrunk.minimal, scenario, "nothing was shrunk: {:?}", shrunk.steps);
    assert!(shrunk.minimal.producers <= scenario.producers && shrunk.minimal.safety_ms <= scenario.safety_ms);
    // The minimal scenario is data: through JSON and back, it runs the
    // same way again.
    let json = serde_json::to_string(&shrunk.minimal).expect("serialises");
    let again = run_scenario(serde_json::from_str(&json).expect("parses"), plant, false);
    assert_eq!(again.trace_hash, shrunk.report.trace_hash);
    assert!(again.verdict.violations.iter().any(|v| v.guarantee == Guarantee::G1));
}

#[test]
fn a_failure_draws_a_timeline_that_a_browser_renders() {
    let report = run_seed(0, RunOptions { all_faults: false, plant: Some(Plant::Bug(Bug::BatchingAnswersNewest)) });
    assert!(!report.verdict.violations.is_empty());
    let page = keel_sim::timeline::html("seed 0", &report.events, &report.verdict.violations);
    assert!(page.contains(r#"class="op produce ok violation""#), "the records G1 names are outlined");
    let dir = std::env::temp_dir().join(format!("keel-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let html = dir.join("timeline.html");
    std::fs::write(&html, &page).expect("write the page");
    let chromium = std::path::Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        // CI machines get no browser unless the project installs one; the
        // page's structure is checked above and in the timeline's own tests.
        eprintln!("skipped the browser half: /usr/bin/chromium is not installed (apt-get install chromium)");
        return;
    }
    let png = dir.join("timeline.png");
    let browser = |extra: &[&str]| {
        std::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1600,800",
            ])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .args(extra)
            .arg(format!("file://{}", html.display()))
            .output()
            .expect("run chromium")
    };
    // The browser parsed the page into lanes and bars.
    let dom = String::from_utf8_lossy(&browser(&["--dump-dom"]).stdout).to_string();
    assert!(dom.contains("<svg") && dom.contains(">broker-1</text>") && dom.contains("violation"), "{dom:.500}");
    // And painted it: a PNG of real size.
    browser(&[&format!("--screenshot={}", png.display())]);
    let image = std::fs::read(&png).expect("a screenshot");
    assert!(image.starts_with(b"\x89PNG") && image.len() > 20_000, "{} bytes", image.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_seed_replays_exactly_in_a_batch_and_in_another_process() {
    let options = RunOptions { all_faults: true, plant: None };
    // Seed 8 was the second seed here until it was found to replay
    // differently inside a batch (see the ignored test below).
    let batch: Vec<u64> = [3, 5, 3, 5].iter().map(|seed| run_seed(*seed, options).trace_hash).collect();
    assert_eq!(batch[0], batch[2], "seed 3 replayed differently inside a batch");
    assert_eq!(batch[1], batch[3], "seed 5 replayed differently inside a batch");
    assert_ne!(batch[0], batch[1], "different seeds, different traces");

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel-sim"))
        .args(["run", "--seed", "3", "--all-faults", "--json"])
        .output()
        .expect("run keel-sim");
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or("")).expect("a summary");
    assert_eq!(summary["trace_hash"].as_u64(), Some(batch[0]), "seed 3 replayed differently in another process");
}

/// `keel-sim sweep` runs its seeds on worker processes, one seed after
/// another each, and replaces a worker after a few seeds (here two): a
/// planted bug's failures are reported seed by seed, as a process per seed
/// reported them.
#[test]
fn a_sweep_through_its_workers_reports_every_failing_seed() {
    let dir = std::env::temp_dir().join(format!("keel-sim-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel-sim"))
        .args(["sweep", "--from", "0", "--count", "6", "--jobs", "2", "--plant", "lying-disk"])
        .env("KEEL_SIM_LOG", "off")
        .env("KEEL_SIM_SEEDS_PER_WORKER", "2")
        // Failing runs write their histories under the working directory.
        .current_dir(&dir)
        .output()
        .expect("run keel-sim");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "a sweep with violations exits non-zero");
    let summary = stdout.lines().find(|l| l.starts_with("summary: 6 seeds")).expect("a summary line");
    assert!(summary.contains("violations in seeds [0, 1, 2, 3, 4, 5]"), "{summary}");
    for seed in 0..6 {
        assert!(dir.join(format!("keel-sim-failures/seed-{seed}.jsonl")).exists(), "seed {seed}'s history");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seeds that replayed differently inside one process (5 of seeds 8-47
/// with every fault kind, 2026-12-02, among them 12 and 24). openraft drew
/// on tokio's thread RNG (a `select!` without `biased;`, several waiters on
/// its metrics watch channel), and that RNG is seeded anew for every run
/// in a process. Fixed in `vendor/openraft` (vendor/README.md); the same
/// 40 seeds then replayed exactly.
#[test]
fn seeds_that_drew_on_tokios_rng_replay_exactly_in_a_batch() {
    let options = RunOptions { all_faults: true, plant: None };
    for seed in [12, 24] {
        let batch: Vec<u64> = [seed, seed].iter().map(|seed| run_seed(*seed, options).trace_hash).collect();
        assert_eq!(batch[0], batch[1], "seed {seed} replayed differently inside a batch");
    }
}

#[test]
fn the_retention_lane_moves_log_starts_and_every_guarantee_holds() {
    // Seed 6000004 keeps 94 bytes per partition: retention runs under the
    // workload and faults, on every replica, snapshots keeping records.
    let report = run_seed(6_000_004, RunOptions { all_faults: false, plant: None });
    assert_eq!(report.scenario.retention_bytes, Some(94));
    assert!(report.verdict.violations.is_empty(), "{:?}", report.verdict.violations);
    let moved = report
        .events
        .iter()
        .any(|e| matches!(&e.kind, keel_sim::history::EventKind::ReplicaLog { log_start, .. } if *log_start > 0));
    assert!(moved, "no replica's log start moved");
}

#[test]
fn the_disk_latency_lane_stalls_fsyncs_and_every_guarantee_holds() {
    // With every fault on, every fsync takes simulated time and some stall
    // for tens or hundreds of milliseconds while the faults last.
    let report = run_seed(0, RunOptions { all_faults: true, plant: None });
    let disk = report.scenario.disk_latency.expect("the lane is on with every fault");
    assert!(disk.sync_us.0 >= 20 && disk.stall_ms.0 >= 20, "{disk:?}");
    assert!(report.faults.get("fsync-stall").is_some_and(|n| *n > 0), "no fsync stalled: {:?}", report.faults);
    assert!(report.verdict.violations.is_empty(), "{:?}", report.verdict.violations);
    // Off in the negative controls: their seed bounds were found without it.
    assert_eq!(scenario_for(0, RunOptions { all_faults: true, plant: Some(Plant::LyingDisk) }).disk_latency, None);
}

#[test]
fn g1_at_the_kill_catches_a_store_that_goes_on_past_a_failed_write() {
    // The disk-full lane: a broker must stop on the failed write; one that
    // takes it as done reports entries it never wrote, which the check at
    // the kill that follows finds.
    caught_within(Plant::Bug(Bug::WriteErrorsIgnored), 3);
}

#[test]
fn refusal_catches_a_broker_that_ignores_access_rules() {
    // The access lane: an intruder whose only rule is to describe topics
    // produces, deletes topics, joins groups and grants itself rules; a
    // broker that checks who it is but not what it may do serves it.
    caught_within(Plant::Bug(Bug::AclIgnored), 3);
}

#[test]
fn refusal_catches_a_partition_that_applies_an_entry_no_client_could_send() {
    // The raw-entries lane proposes commands the API refuses at the edge
    // straight to the Raft logs; a partition that applies an empty batch
    // is caught (3 of seeds 0-59 show it, 41 the first, since simulated
    // calls stopped making a handshake connection, 2026-12-06; 5 of 0-59,
    // 9 the first, before; since one replica stands first in an election,
    // 2026-12-07: 4 of 0-59, 51 the first, and 28 of 0-199).
    caught_within(Plant::Bug(Bug::EmptyBatchApplied), 80);
}

/// The raw-entries lane fills a partition up to its groups limit (a
/// cluster with the lane starts with a low one), and one group more is
/// refused; the lane's groups are forgotten after, and the run stays clean.
#[test]
fn the_raw_entries_lane_reaches_a_partitions_groups_limit() {
    // 2 of all-fault seeds 0-19 reach it, 7 the first (2026-12-05); since
    // the brokers-only split changed the runs, 3 of seeds 0-29: 18, 25, 26
    // (the same day, twenty-ninth session); since a leader replicates
    // before its own flush, 15 of seeds 0-59: 1, 2, 5, 6, 14, 16, ...;
    // since clients are answered by the apply worker and the membership
    // fixes of 2026-12-06, 4 of seeds 0-40: 10, 22, 24, 36.
    let reached = (0..40).find(|seed| {
        let report = run_seed(*seed, RunOptions { all_faults: true, plant: None });
        assert!(report.verdict.violations.is_empty(), "seed {seed}: {:?}", report.verdict.violations);
        report.rejections.contains_key("partition:TooManyGroups")
    });
    assert!(reached.is_some(), "no all-fault seed of 0-39 reached a partition's groups limit");
}

/// The raw-entries lane commits the offset at the high watermark (one past
/// the last record): a partition whose bound is off by one lets the
/// group's position pass the end of the log, which the brokers' position
/// samples show (G4; the lane's own check sees it too).
#[test]
fn g4_catches_a_commit_at_the_high_watermark() {
    // 12 of seeds 0-59, seed 12 first (2026-12-06, once simulated calls
    // stopped making a handshake connection; seed 4 first before).
    caught_within(Plant::Bug(Bug::CommitAtHighWatermark), 20);
}

/// Failure detection of quiet groups: followers that never give a silent
/// leader's broker up leave a partition leaderless after its leader died.
#[test]
fn l1_catches_quiet_followers_that_never_elect_after_their_leader_died() {
    // A leader must die while its group is quiet: 10 of seeds 0-39 show it
    // (10 the first; 6 of 0-19 before GroupPosition read on the leader
    // changed the traces).
    caught_within(Plant::Bug(Bug::QuietForever), 20);
}

/// The shape lane: group g on the range assignor (its last member's share
/// one short) leaves a partition to no one, and its records unconsumed.
#[test]
fn l1_catches_a_range_assignor_that_leaves_a_partition_to_no_one() {
    // Caught in 10 of seeds 0-39 (8 the first): a topic needs more
    // partitions than members.
    caught_within(Plant::Bug(Bug::RangeDropsLastPartition), 20);
}

/// The shape lane: an operator resets the audit group's position (no
/// member left) and a replica must then report it.
#[test]
fn g4_catches_a_position_reset_answered_but_never_applied() {
    // Caught in 14 of seeds 0-39 (7 the first): the audit group's position
    // must lag the high watermark it is reset to.
    caught_within(Plant::Bug(Bug::ResetAnsweredNotApplied), 20);
}

/// The shape lane's reader: a read by offset must start at that offset.
#[test]
fn g2_catches_a_read_that_skips_the_record_asked_for() {
    // Caught in every one of seeds 0-39.
    caught_within(Plant::Bug(Bug::ReadSkipsFirstRecord), 5);
}
