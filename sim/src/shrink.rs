//! Shrinking: from a failing run to the smallest scenario that still fails
//! the same way. Simulation builds only.
//!
//! A scenario is data (the cluster, the workload, the fault kinds and a
//! fault budget), and its seed drives everything the scenario leaves to
//! chance. The shrinker tries one reduction at a time (a fault kind off,
//! half the faults, fewer clients, brokers, topics, partitions, batches, a
//! shorter safety phase), keeps a reduction when the run still breaks the
//! same guarantee, and starts over from the smaller scenario until no
//! reduction keeps the failure or the run budget is spent. Each step is a
//! whole run, so the minimal scenario replays exactly, like any seed:
//! `keel-sim replay --scenario minimal.json`.
//!
//! Candidates run two at a time (one per core); the first in the fixed
//! order that still fails wins, so a shrink is deterministic too.

use crate::checkers::Guarantee;
use crate::harness::{check_determinism_requested, run_scenario, Plant, RunReport};
use crate::scenario::{FaultKind, Scenario};

/// Most runs one shrink spends, unless told otherwise.
pub const RUNS_MAX_DEFAULT: u32 = 200;

/// Shortest safety phase a reduction goes down to, in simulated ms.
const SAFETY_MS_MIN: u64 = 2_000;

/// What a shrink found.
pub struct Shrunk {
    /// The guarantee every accepted step still broke.
    pub guarantee: Guarantee,
    pub original: Scenario,
    pub minimal: Scenario,
    /// The minimal scenario's run.
    pub report: RunReport,
    /// Runs spent, the original's included.
    pub runs: u32,
    /// The reductions kept, in order.
    pub steps: Vec<String>,
}

/// Why there is nothing to shrink.
#[derive(Debug, thiserror::Error)]
pub enum ShrinkError {
    #[error("seed {0} breaks no guarantee: there is no failure to shrink")]
    NoFailure(u64),
}

/// The guarantee of the run's first violation.
fn broken(report: &RunReport) -> Option<Guarantee> {
    report.verdict.violations.iter().map(|v| v.guarantee).min()
}

/// One reduction of `scenario`, if it applies: a name and the smaller one.
fn reductions(scenario: &Scenario, faults_seen: u64) -> Vec<(String, Scenario)> {
    let mut out = Vec::new();
    let mut try_one = |name: String, change: &dyn Fn(&mut Scenario)| {
        let mut smaller = scenario.clone();
        change(&mut smaller);
        if smaller != *scenario {
            out.push((name, smaller));
        }
    };
    // Fewer faults first: they shrink the schedule most. Half of them,
    // then ever smaller cuts down to one: a failure that needs most of
    // its faults (the budget keeps the first ones) still sheds a quarter
    // or an eighth a step, where one fault a step spent the whole run
    // budget on a long schedule.
    let budget = scenario.max_faults.unwrap_or(faults_seen);
    let mut cut = budget - budget / 2;
    while cut > 0 {
        let fewer = budget - cut;
        try_one(format!("at most {fewer} faults"), &|s| s.max_faults = Some(fewer));
        cut /= 2;
    }
    for kind in scenario.faults.clone() {
        try_one(format!("no {} faults", kind.name()), &|s| s.faults.retain(|k| *k != kind));
    }
    try_one(format!("safety phase {} ms", (scenario.safety_ms / 2).max(SAFETY_MS_MIN)), &|s| {
        s.safety_ms = (s.safety_ms / 2).max(SAFETY_MS_MIN)
    });
    try_one("one producer fewer".into(), &|s| s.producers = (s.producers - 1).max(1));
    try_one("one consumer fewer".into(), &|s| s.consumers = (s.consumers - 1).max(1));
    try_one(format!("{} batches per producer", scenario.batches_per_producer / 2), &|s| {
        s.batches_per_producer = (s.batches_per_producer / 2).max(1)
    });
    try_one("one record per batch".into(), &|s| s.batch_records_max = 1);
    try_one("one-at-a-time producers".into(), &|s| s.batching_producers = false);
    try_one("one broker fewer".into(), &|s| {
        s.brokers = (s.brokers - 1).max(3);
        for topic in &mut s.topics {
            topic.replication_factor = topic.replication_factor.min(s.brokers as u32);
        }
    });
    try_one("one topic fewer".into(), &|s| {
        if s.topics.len() > 1 {
            s.topics.pop();
        }
        // The second group reads the last topic left.
        let last = s.topics[s.topics.len() - 1].name.clone();
        if let Some(group) = s.shape.as_mut().and_then(|shape| shape.second_group.as_mut()) {
            group.topics.retain(|t| s.topics.iter().any(|topic| topic.name == *t));
            if group.topics.is_empty() {
                group.topics.push(last);
            }
        }
    });
    for t in 0..scenario.topics.len() {
        try_one(format!("half the partitions in {}", scenario.topics[t].name), &|s| {
            s.topics[t].partitions = (s.topics[t].partitions / 2).max(1)
        });
        try_one(format!("one partition fewer in {}", scenario.topics[t].name), &|s| {
            s.topics[t].partitions = (s.topics[t].partitions - 1).max(1)
        });
    }
    try_one("no second group".into(), &|s| {
        if let Some(shape) = s.shape.as_mut() {
            shape.second_group = None;
        }
    });
    try_one("no reader".into(), &|s| {
        if let Some(shape) = s.shape.as_mut() {
            shape.reader = false;
        }
    });
    try_one("no poll byte budget".into(), &|s| {
        if let Some(shape) = s.shape.as_mut() {
            shape.poll_bytes_max = 0;
        }
    });
    try_one("default snapshots".into(), &|s| s.snapshot_every = None);
    try_one("no membership changes".into(), &|s| s.membership = false);
    try_one("no topic deletions".into(), &|s| s.topic_lifecycle = false);
    try_one("no hostile client".into(), &|s| s.hostile_clients = false);
    try_one("no byte retention".into(), &|s| s.retention_bytes = None);
    try_one("no time retention".into(), &|s| s.retention_ms = None);
    try_one("no slow member".into(), &|s| s.slow_consumer = None);
    try_one("instant fsyncs".into(), &|s| s.disk_latency = None);
    try_one("no hostile acks".into(), &|s| s.hostile_ack_every = u32::MAX);
    out
}

/// Faults of the schedule (what `max_faults` bounds): not the slow-disk
/// lane's fsync stalls, which its own reduction turns off.
fn faults_injected(report: &RunReport) -> u64 {
    report.faults.iter().filter(|(kind, _)| kind.as_str() != crate::harness::FSYNC_STALL).map(|(_, n)| n).sum()
}

/// Run `candidates` two at a time, in order; the first that still breaks
/// `guarantee`, with its report, or `None`. Stops early when `runs` reaches
/// `runs_max`.
fn first_still_failing(
    candidates: Vec<(String, Scenario)>,
    plant: Option<Plant>,
    guarantee: Guarantee,
    runs: &mut u32,
    runs_max: u32,
) -> Option<(String, Scenario, RunReport)> {
    let mut queue = candidates.into_iter();
    loop {
        let room = runs_max.saturating_sub(*runs).min(2) as usize;
        let pair: Vec<(String, Scenario)> = queue.by_ref().take(room).collect();
        if pair.is_empty() {
            return None;
        }
        *runs += pair.len() as u32;
        let handles: Vec<_> = pair
            .into_iter()
            .map(|(name, scenario)| {
                let run = scenario.clone();
                (name, scenario, std::thread::spawn(move || run_scenario(run, plant, check_determinism_requested())))
            })
            .collect();
        let mut found = None;
        for (name, scenario, handle) in handles {
            let report = handle.join().expect("a run reports, panics included");
            if found.is_none() && has(&report, guarantee) {
                found = Some((name, scenario, report));
            }
        }
        if found.is_some() {
            return found;
        }
    }
}

fn has(report: &RunReport, guarantee: Guarantee) -> bool {
    report.verdict.violations.iter().any(|v| v.guarantee == guarantee)
}

/// Shrink the failing run of `scenario` within `runs_max` runs; `progress`
/// hears of each step kept.
pub fn shrink(
    scenario: Scenario,
    plant: Option<Plant>,
    runs_max: u32,
    mut progress: impl FnMut(&str, &Scenario),
) -> Result<Shrunk, ShrinkError> {
    let seed = scenario.seed;
    let first = run_scenario(scenario.clone(), plant, check_determinism_requested());
    let Some(guarantee) = broken(&first) else { return Err(ShrinkError::NoFailure(seed)) };
    let mut runs = 1;
    let mut current = scenario.clone();
    let mut report = first;
    let mut steps = Vec::new();
    while runs < runs_max {
        let candidates = reductions(&current, faults_injected(&report));
        match first_still_failing(candidates, plant, guarantee, &mut runs, runs_max) {
            Some((name, smaller, smaller_report)) => {
                progress(&name, &smaller);
                steps.push(name);
                current = smaller;
                report = smaller_report;
            }
            None => break,
        }
    }
    Ok(Shrunk { guarantee, original: scenario, minimal: current, report, runs, steps })
}

/// Fault kinds of a scenario, by name (for printing).
pub fn fault_names(scenario: &Scenario) -> Vec<&'static str> {
    scenario.faults.iter().map(|k: &FaultKind| k.name()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fault budget is cut by a half, a quarter, an eighth ... one.
    #[test]
    fn the_fault_budget_is_cut_by_halves_down_to_one() {
        let scenario = Scenario { max_faults: Some(44), ..Scenario::from_seed(1, false) };
        let budgets: Vec<String> =
            reductions(&scenario, 0).into_iter().map(|(name, _)| name).filter(|n| n.ends_with(" faults")).collect();
        let expected: Vec<String> = [22, 33, 39, 42, 43].iter().map(|n| format!("at most {n} faults")).collect();
        assert_eq!(budgets[..5], expected[..]);
        let one = Scenario { max_faults: Some(1), ..scenario };
        let budgets: Vec<String> = reductions(&one, 0).into_iter().map(|(name, _)| name).collect();
        assert_eq!(budgets[0], "at most 0 faults");
        assert!(!budgets[1].starts_with("at most"));
    }
}
