//! `keel-sim`: run one seed, sweep a range of seeds, replay a seed with its
//! history (and an HTML timeline) written out, shrink a failing seed to its
//! smallest scenario, or run a campaign that does all of it within a time
//! budget. Exits non-zero on any violation.
//!
//! Build and run it as `cargo keel-sim -- <command>` (a `--cfg madsim`
//! build; see `.cargo/config.toml`).

#[cfg(not(madsim))]
fn main() {
    eprintln!("keel-sim runs only in a simulation build: use `cargo keel-sim -- --help`");
    std::process::exit(2);
}

/// mimalloc rather than glibc's malloc: a seed allocates and frees at a
/// high rate (messages, transactions, futures), and glibc's malloc and free
/// took about a sixth of its time.
#[cfg(madsim)]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    keel_sim::allocator::keep_freed_memory();
    cli::main()
}

#[cfg(madsim)]
mod cli {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use clap::{Args, Parser, Subcommand};
    use keel_sim::harness::{check_determinism_requested, run_scenario, scenario_for, Plant, RunOptions, RunReport};
    use keel_sim::history::{to_json_lines, EventKind};
    use keel_sim::scenario::Scenario;
    use keel_sim::shrink::{self, Shrunk};
    use keel_sim::timeline;
    use serde::{Deserialize, Serialize};

    #[derive(Parser)]
    #[command(name = "keel-sim", about = "keel's deterministic simulation: every guarantee checked on every seed")]
    struct Cli {
        #[command(subcommand)]
        command: SimCommand,
    }

    #[derive(Subcommand)]
    enum SimCommand {
        /// Run one seed.
        Run(RunArgs),
        /// Run seeds FROM.. with parallel jobs within a wall-clock budget.
        Sweep(SweepArgs),
        /// Run one seed again and write its history (JSON lines).
        Replay(RunArgs),
        /// Shrink a failing seed: the smallest scenario that still breaks
        /// the same guarantee, its history, timeline and replay command.
        Shrink(ShrinkArgs),
        /// Sweep fresh seeds for a time budget, shrink every failure, and
        /// write one directory per failure and a summary.
        Campaign(CampaignArgs),
        /// Run the seeds read from standard input, one per line, and print
        /// each one's JSON summary line: a sweep's worker, which runs many
        /// seeds in one process (a process per seed cost about a sixth of
        /// a sweep's time in start-up and fresh pages).
        #[command(hide = true)]
        Worker(Common),
    }

    #[derive(Args, Clone)]
    struct Common {
        /// Enable every fault kind instead of the seed's swarm subset.
        #[arg(long)]
        all_faults: bool,
        /// Plant a known bug (a negative control): lying-disk,
        /// commit-without-fence, no-idempotence, wall-clock-apply,
        /// commit-unchecked, panic-on-bad-commit, consumer-no-order-filter,
        /// never-expire-members, batching-answers-newest,
        /// persisted-before-sync, snapshot-drops-last-record,
        /// refuse-produces-after-failover, forget-keeps-positions,
        /// write-errors-ignored, acl-ignored, quiet-forever,
        /// range-drops-last-partition, reset-answered-not-applied,
        /// read-skips-first-record, empty-batch-applied, poll-without-fence,
        /// commit-at-high-watermark, duplicate-answers-newest,
        /// poll-without-read-index, votes-not-replayed, state-across-runs (caught only with
        /// --check-determinism).
        #[arg(long)]
        plant: Option<String>,
    }

    #[derive(Args)]
    struct RunArgs {
        /// The seed (or give --scenario).
        #[arg(long, required_unless_present = "scenario")]
        seed: Option<u64>,
        /// Run this scenario (JSON, as `shrink` writes it) instead of the
        /// seed's own; its seed drives everything it leaves to chance.
        #[arg(long, conflicts_with = "seed")]
        scenario: Option<PathBuf>,
        /// Also write the run as a self-contained HTML timeline.
        #[arg(long)]
        html: Option<PathBuf>,
        /// Run it twice and compare the histories (also on when
        /// MADSIM_TEST_CHECK_DETERMINISM is set).
        #[arg(long)]
        check_determinism: bool,
        /// Write the history here (JSON lines); a failing run writes it to
        /// keel-sim-failures/seed-N.jsonl unless given.
        #[arg(long)]
        history: Option<PathBuf>,
        /// Print only a one-line JSON summary (used by sweeps).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    }

    #[derive(Args)]
    struct ShrinkArgs {
        #[arg(long)]
        seed: u64,
        /// Most runs to spend.
        #[arg(long, default_value_t = shrink::RUNS_MAX_DEFAULT)]
        max_runs: u32,
        /// Where to write minimal.json, the histories and timelines
        /// (default keel-sim-failures/seed-N).
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    }

    #[derive(Args)]
    struct CampaignArgs {
        /// Wall-clock budget for sweeping, e.g. 10m or 1h (shrinking the
        /// failures found comes after it).
        #[arg(long, value_parser = humantime::parse_duration)]
        budget: Duration,
        /// First seed (default: drawn from the clock, so each campaign
        /// explores fresh seeds; printed, so it can be repeated).
        #[arg(long)]
        from: Option<u64>,
        /// Seeds run at once (one worker process each, running seeds one
        /// after another).
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Most runs each shrink spends.
        #[arg(long, default_value_t = shrink::RUNS_MAX_DEFAULT)]
        max_runs: u32,
        /// Where to write one directory per failure and summary.json.
        #[arg(long, default_value = "keel-sim-campaign")]
        out: PathBuf,
        /// A seed still running after this many wall seconds is killed and
        /// reported.
        #[arg(long, default_value_t = 300)]
        seed_timeout_secs: u64,
        #[command(flatten)]
        common: Common,
    }

    #[derive(Args)]
    struct SweepArgs {
        /// First seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// How many seeds.
        #[arg(long, default_value_t = 100)]
        count: u64,
        /// Seeds run at once (one worker process each, running seeds one
        /// after another).
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Stop starting seeds after this many seconds.
        #[arg(long)]
        budget_secs: Option<u64>,
        /// A seed still running after this many wall seconds is killed and
        /// reported (a simulation that stops advancing time hangs).
        #[arg(long, default_value_t = 300)]
        seed_timeout_secs: u64,
        #[command(flatten)]
        common: Common,
    }

    /// One seed's outcome, as a sweep collects it.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Summary {
        seed: u64,
        trace_hash: u64,
        simulated_ms: u64,
        operations: u64,
        acknowledged: u64,
        duplicates: u64,
        faults: BTreeMap<String, u64>,
        #[serde(default)]
        snapshots_built: u64,
        #[serde(default)]
        snapshots_installed: u64,
        #[serde(default)]
        compacted_bytes: u64,
        #[serde(default)]
        rejections: BTreeMap<String, u64>,
        /// The run's cluster outlived it (`RunReport::world_retained`).
        #[serde(default)]
        world_retained: bool,
        violations: Vec<String>,
    }

    impl Summary {
        /// A seed whose run gave no summary of its own.
        fn failed(seed: u64, violation: String) -> Summary {
            Summary {
                seed,
                trace_hash: 0,
                simulated_ms: 0,
                operations: 0,
                acknowledged: 0,
                duplicates: 0,
                faults: BTreeMap::new(),
                snapshots_built: 0,
                snapshots_installed: 0,
                compacted_bytes: 0,
                rejections: BTreeMap::new(),
                world_retained: false,
                violations: vec![violation],
            }
        }
    }

    fn options(common: &Common) -> Result<RunOptions, String> {
        let plant = match &common.plant {
            Some(name) => Some(Plant::parse(name).ok_or_else(|| format!("unknown bug {name:?}: see --help"))?),
            None => None,
        };
        Ok(RunOptions { all_faults: common.all_faults, plant })
    }

    fn replay_command(seed: u64, common: &Common) -> String {
        let mut command = format!("cargo keel-sim -- replay --seed {seed}");
        if common.all_faults {
            command.push_str(" --all-faults");
        }
        if let Some(plant) = &common.plant {
            command.push_str(&format!(" --plant {plant}"));
        }
        command.push_str(&format!(" --history seed-{seed}.jsonl"));
        command
    }

    fn summary(report: &RunReport) -> Summary {
        Summary {
            seed: report.scenario.seed,
            trace_hash: report.trace_hash,
            simulated_ms: report.simulated_ms,
            operations: report.verdict.operations,
            acknowledged: report.verdict.acknowledged,
            duplicates: report.verdict.duplicates,
            faults: report.faults.clone(),
            snapshots_built: report.snapshots.0,
            snapshots_installed: report.snapshots.1,
            compacted_bytes: report.compacted_bytes,
            rejections: report.rejections.clone(),
            world_retained: report.world_retained,
            violations: report.verdict.violations.iter().map(|v| format!("{}: {}", v.guarantee, v.message)).collect(),
        }
    }

    /// The scenario a run command names: a file, or the seed's own.
    fn scenario_of(args: &RunArgs, options: RunOptions) -> Result<Scenario, String> {
        match (&args.scenario, args.seed) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{} is not a scenario: {e}", path.display()))
            }
            (None, Some(seed)) => Ok(scenario_for(seed, options)),
            (None, None) => Err("give --seed or --scenario".into()),
        }
    }

    fn write_file(path: &std::path::Path, contents: &str) -> Result<(), String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        std::fs::write(path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    fn timeline_of(report: &RunReport) -> String {
        let title = format!("keel-sim seed {}: {}", report.scenario.seed, report.scenario.describe());
        timeline::html(&title, &report.events, &report.verdict.violations)
    }

    fn run(args: RunArgs, always_write: bool) -> Result<bool, String> {
        let options = options(&args.common)?;
        let scenario = scenario_of(&args, options)?;
        let seed = scenario.seed;
        if !args.json {
            println!("{}", scenario.describe());
        }
        let report = run_scenario(scenario, options.plant, args.check_determinism || check_determinism_requested());
        let summary = summary(&report);
        let failed = !summary.violations.is_empty();
        let given = args.history.is_some();
        let history = match args.history {
            Some(path) => Some(path),
            None if failed => Some(PathBuf::from(format!("keel-sim-failures/seed-{seed}.jsonl"))),
            None => None,
        };
        if let Some(path) = &history {
            if failed || always_write || given {
                write_file(path, &to_json_lines(&report.events))?;
            }
        }
        if let Some(path) = &args.html {
            write_file(path, &timeline_of(&report))?;
        }
        if args.json {
            println!("{}", serde_json::to_string(&summary).expect("summary serialises"));
            return Ok(!failed);
        }
        println!(
            "seed {}: {} simulated s, {} operations, {} records acknowledged, {} duplicate deliveries, \
             {} snapshots built and {} installed, faults {:?}",
            summary.seed,
            summary.simulated_ms / 1000,
            summary.operations,
            summary.acknowledged,
            summary.duplicates,
            summary.snapshots_built,
            summary.snapshots_installed,
            summary.faults
        );
        println!("trace hash {:016x}", summary.trace_hash);
        if let Some(path) = &history {
            println!("history: {}", path.display());
        }
        if let Some(path) = &args.html {
            println!("timeline: {}", path.display());
        }
        if failed {
            println!("VIOLATIONS:");
            for violation in &summary.violations {
                println!("  {violation}");
            }
            match &args.scenario {
                Some(path) => {
                    let plant = args.common.plant.as_ref().map_or_else(String::new, |p| format!(" --plant {p}"));
                    println!("replay: cargo keel-sim -- replay --scenario {}{plant}", path.display())
                }
                None => {
                    println!("replay: {}", replay_command(seed, &args.common));
                    println!("shrink: {}", shrink_command_line(seed, &args.common));
                }
            }
        } else {
            println!("ok: every guarantee held");
        }
        Ok(!failed)
    }

    fn shrink_command_line(seed: u64, common: &Common) -> String {
        let mut command = format!("cargo keel-sim -- shrink --seed {seed}");
        if common.all_faults {
            command.push_str(" --all-faults");
        }
        if let Some(plant) = &common.plant {
            command.push_str(&format!(" --plant {plant}"));
        }
        command
    }

    /// The faults a run injected, one line each, in order.
    fn fault_schedule(report: &RunReport) -> Vec<String> {
        report
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Fault { kind, detail } => Some(format!("{:>6} ms  {kind}: {detail}", e.at_ms)),
                _ => None,
            })
            .collect()
    }

    /// Write a shrink's files to `dir`; returns the replay command.
    fn write_shrunk(
        dir: &std::path::Path,
        shrunk: &Shrunk,
        original: &RunReport,
        common: &Common,
    ) -> Result<String, String> {
        let minimal = dir.join("minimal.json");
        write_file(&minimal, &serde_json::to_string_pretty(&shrunk.minimal).expect("scenarios serialise"))?;
        write_file(&dir.join("history.jsonl"), &to_json_lines(&original.events))?;
        write_file(&dir.join("timeline.html"), &timeline_of(original))?;
        write_file(&dir.join("minimal-history.jsonl"), &to_json_lines(&shrunk.report.events))?;
        write_file(&dir.join("minimal-timeline.html"), &timeline_of(&shrunk.report))?;
        let plant = common.plant.as_ref().map_or_else(String::new, |p| format!(" --plant {p}"));
        let replay = format!(
            "cargo keel-sim -- replay --scenario {}{plant} --html {}",
            minimal.display(),
            dir.join("minimal-timeline.html").display()
        );
        let schedule = fault_schedule(&shrunk.report);
        let mut text = format!(
            "{} of seed {}, shrunk in {} runs ({} steps: {})\nminimal scenario: {}\nminimal fault schedule ({} faults):\n",
            shrunk.guarantee,
            shrunk.original.seed,
            shrunk.runs,
            shrunk.steps.len(),
            shrunk.steps.join(", "),
            shrunk.minimal.describe(),
            schedule.len()
        );
        for line in &schedule {
            text.push_str(&format!("  {line}\n"));
        }
        text.push_str("violations of the minimal run:\n");
        for v in &shrunk.report.verdict.violations {
            text.push_str(&format!("  {}: {}\n", v.guarantee, v.message));
        }
        text.push_str(&format!("replay: {replay}\n"));
        write_file(&dir.join("README.txt"), &text)?;
        Ok(replay)
    }

    /// Shrink `seed` and write what it found to `dir`; `None` if the seed
    /// does not fail in this process.
    fn shrink_seed(
        seed: u64,
        common: &Common,
        max_runs: u32,
        dir: &std::path::Path,
    ) -> Result<Option<(Shrunk, String)>, String> {
        let options = options(common)?;
        let scenario = scenario_for(seed, options);
        let original = run_scenario(scenario.clone(), options.plant, check_determinism_requested());
        if original.verdict.violations.is_empty() {
            return Ok(None);
        }
        let started = Instant::now();
        let shrunk = shrink::shrink(scenario, options.plant, max_runs, |step, smaller| {
            println!(
                "  kept: {step} ({:.0} s; {} fault kinds, {} brokers, {} producers, {} consumers, safety {} ms)",
                started.elapsed().as_secs_f64(),
                smaller.faults.len(),
                smaller.brokers,
                smaller.producers,
                smaller.consumers,
                smaller.safety_ms
            );
        })
        .map_err(|e| e.to_string())?;
        let replay = write_shrunk(dir, &shrunk, &original, common)?;
        Ok(Some((shrunk, replay)))
    }

    fn shrink_command(args: ShrinkArgs) -> Result<bool, String> {
        let dir = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("keel-sim-failures/seed-{}", args.seed)));
        println!("shrinking seed {} (at most {} runs)", args.seed, args.max_runs);
        match shrink_seed(args.seed, &args.common, args.max_runs, &dir)? {
            None => {
                println!("seed {} breaks no guarantee: nothing to shrink", args.seed);
                Ok(true)
            }
            Some(_) => {
                print!("{}", std::fs::read_to_string(dir.join("README.txt")).unwrap_or_default());
                println!("files: {}", dir.display());
                Ok(false)
            }
        }
    }

    /// A sweep's worker: runs each seed it reads, as `run --seed N --json`.
    fn worker(common: Common) -> Result<bool, String> {
        use std::io::{BufRead, Write};
        for line in std::io::stdin().lock().lines() {
            let line = line.map_err(|e| e.to_string())?;
            let Ok(seed) = line.trim().parse::<u64>() else { continue };
            let args = RunArgs {
                seed: Some(seed),
                scenario: None,
                html: None,
                check_determinism: false,
                history: None,
                json: true,
                common: common.clone(),
            };
            run(args, false)?;
            std::io::stdout().flush().map_err(|e| e.to_string())?;
        }
        Ok(true)
    }

    /// Seeds one worker process runs before it is replaced. A process that
    /// runs seed after seed grows: about 36 MB a seed with every fault on
    /// (7.6 GB after some 210 seeds, 2026-12-06), until the kernel kills it.
    /// Not diagnosed; likely what madsim-rs/madsim issue 242 describes (a
    /// dropped runtime does not free the tasks still pending in it). A fresh process costs
    /// about 50 ms, so this is about 3 ms a seed. `KEEL_SIM_SEEDS_PER_WORKER`
    /// sets another number (the tests replace workers sooner).
    const SEEDS_PER_WORKER_MAX: u64 = 16;

    fn seeds_per_worker() -> u64 {
        std::env::var("KEEL_SIM_SEEDS_PER_WORKER")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(SEEDS_PER_WORKER_MAX)
            .max(1)
    }

    /// A worker process of a sweep, and the seed it is running.
    struct Worker {
        child: Child,
        stdin: ChildStdin,
        /// Its standard output, line by line (a thread reads it); closed
        /// when the process ends.
        lines: mpsc::Receiver<String>,
        running: Option<(u64, Instant)>,
        /// Seeds it was given.
        seeds: u64,
    }

    impl Worker {
        fn spawn(common: &Common) -> Result<Worker, String> {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut command = Command::new(exe);
            command.arg("worker");
            if common.all_faults {
                command.arg("--all-faults");
            }
            if let Some(plant) = &common.plant {
                command.args(["--plant", plant]);
            }
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            let stdin = child.stdin.take().ok_or("a worker without standard input")?;
            let stdout = child.stdout.take().ok_or("a worker without standard output")?;
            // At most one summary line waits per worker: it runs one seed
            // at a time.
            let (send, lines) = mpsc::sync_channel(1);
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                    if send.send(line).is_err() {
                        break;
                    }
                }
            });
            Ok(Worker { child, stdin, lines, running: None, seeds: 0 })
        }

        fn start(&mut self, seed: u64) -> Result<(), String> {
            use std::io::Write;
            writeln!(self.stdin, "{seed}").and_then(|()| self.stdin.flush()).map_err(|e| e.to_string())?;
            self.running = Some((seed, Instant::now()));
            self.seeds += 1;
            Ok(())
        }

        fn stop(mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// What became of a worker's seed since the last look.
    enum Outcome {
        Running,
        Done(Summary),
        /// The process ended (a panic, an abort) or hung: it is replaced.
        Lost(Summary),
    }

    fn look_at(worker: &mut Worker, seed: u64, since: Instant, seed_timeout_secs: u64) -> Outcome {
        loop {
            match worker.lines.try_recv() {
                Ok(line) => match serde_json::from_str::<Summary>(&line) {
                    Ok(summary) if summary.seed == seed => return Outcome::Done(summary),
                    // Anything else the run printed.
                    _ => continue,
                },
                Err(mpsc::TryRecvError::Empty) if since.elapsed() >= Duration::from_secs(seed_timeout_secs) => {
                    return Outcome::Lost(Summary::failed(
                        seed,
                        format!(
                            "L1 liveness: the run of seed {seed} did not finish within {seed_timeout_secs} wall s: simulated time stopped advancing"
                        ),
                    ))
                }
                Err(mpsc::TryRecvError::Empty) => return Outcome::Running,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Outcome::Lost(Summary::failed(
                        seed,
                        format!("G7 node failure: the run of seed {seed} crashed the process"),
                    ))
                }
            }
        }
    }

    /// Run seeds `from..from + count` on `jobs` worker processes, starting
    /// no seed after `budget`; every seed's summary, by seed. A worker
    /// whose seed crashes it or hangs is replaced.
    fn sweep_seeds(
        from: u64,
        count: u64,
        jobs: usize,
        budget: Option<Duration>,
        seed_timeout_secs: u64,
        common: &Common,
    ) -> Result<Vec<Summary>, String> {
        options(common)?;
        let seeds_per_worker = seeds_per_worker();
        let started = Instant::now();
        let mut next = from;
        let end = from.saturating_add(count);
        let mut workers: Vec<Worker> = Vec::new();
        let mut done: Vec<Summary> = Vec::new();
        let mut last_progress = Instant::now();
        loop {
            let out_of_time = budget.is_some_and(|b| started.elapsed() >= b);
            let more = |next: u64| next < end && !out_of_time;
            while workers.len() < jobs.max(1) && more(next) {
                workers.push(Worker::spawn(common)?);
            }
            for worker in workers.iter_mut().filter(|w| w.running.is_none()) {
                if more(next) {
                    worker.start(next)?;
                    next += 1;
                }
            }
            if workers.iter().all(|w| w.running.is_none()) {
                break;
            }
            let mut kept = Vec::with_capacity(workers.len());
            for mut worker in workers {
                let Some((seed, since)) = worker.running else {
                    kept.push(worker);
                    continue;
                };
                let summary = match look_at(&mut worker, seed, since, seed_timeout_secs) {
                    Outcome::Running => {
                        kept.push(worker);
                        continue;
                    }
                    Outcome::Done(summary) => {
                        worker.running = None;
                        match worker.seeds < seeds_per_worker {
                            true => kept.push(worker),
                            // Idle between seeds: a fresh one takes over.
                            false => worker.stop(),
                        }
                        summary
                    }
                    Outcome::Lost(summary) => {
                        worker.stop();
                        summary
                    }
                };
                if !summary.violations.is_empty() {
                    println!("seed {seed} FAILED: {}", summary.violations.join("; "));
                    println!("  replay: {}", replay_command(seed, common));
                }
                done.push(summary);
            }
            workers = kept;
            if last_progress.elapsed() >= Duration::from_secs(10) {
                last_progress = Instant::now();
                let failing = done.iter().filter(|s| !s.violations.is_empty()).count();
                let per_minute = done.len() as f64 / started.elapsed().as_secs_f64() * 60.0;
                let of = if end == u64::MAX { String::new() } else { format!("/{count}") };
                println!(
                    "sweep: {}{of} seeds done, {failing} failing, {per_minute:.1} seeds/min, {:.0} s elapsed",
                    done.len(),
                    started.elapsed().as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for worker in workers {
            worker.stop();
        }
        done.sort_by_key(|s| s.seed);
        Ok(done)
    }

    /// The sweep's totals, as printed lines.
    fn sweep_totals(done: &[Summary], wall: f64) -> Vec<String> {
        let mut faults: BTreeMap<String, u64> = BTreeMap::new();
        for summary in done {
            for (kind, count) in &summary.faults {
                *faults.entry(kind.clone()).or_default() += count;
            }
        }
        let failing: Vec<u64> = done.iter().filter(|s| !s.violations.is_empty()).map(|s| s.seed).collect();
        let simulated: u64 = done.iter().map(|s| s.simulated_ms).sum();
        vec![
            format!(
                "summary: {} seeds, {:.0} simulated s ({:.1} simulated s per wall s), {} operations, {} records acknowledged, \
                 {} duplicate deliveries, {} violations in seeds {:?}, {:.1} seeds/min",
                done.len(),
                simulated as f64 / 1000.0,
                simulated as f64 / 1000.0 / wall,
                done.iter().map(|s| s.operations).sum::<u64>(),
                done.iter().map(|s| s.acknowledged).sum::<u64>(),
                done.iter().map(|s| s.duplicates).sum::<u64>(),
                done.iter().map(|s| s.violations.len()).sum::<usize>(),
                failing,
                done.len() as f64 / wall * 60.0
            ),
            format!("faults injected: {faults:?}"),
            rejection_coverage(done),
            format!(
                "snapshots: {} built, {} installed ({} of {} seeds installed one)",
                done.iter().map(|s| s.snapshots_built).sum::<u64>(),
                done.iter().map(|s| s.snapshots_installed).sum::<u64>(),
                done.iter().filter(|s| s.snapshots_installed > 0).count(),
                done.len()
            ),
            format!(
                "log compaction: {} bytes of live frames copied ({} of {} seeds compacted)",
                done.iter().map(|s| s.compacted_bytes).sum::<u64>(),
                done.iter().filter(|s| s.compacted_bytes > 0).count(),
                done.len()
            ),
            format!(
                "runs whose cluster outlived them (a worker's memory grows with each): {} {:?}",
                done.iter().filter(|s| s.world_retained).count(),
                done.iter().filter(|s| s.world_retained).map(|s| s.seed).collect::<Vec<_>>()
            ),
        ]
    }

    /// Which rejection kinds of the state machines the seeds reached.
    fn rejection_coverage(done: &[Summary]) -> String {
        let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
        for summary in done {
            for (kind, count) in &summary.rejections {
                *seen.entry(kind.as_str()).or_default() += count;
            }
        }
        let all: Vec<String> = keel_core::metadata::MetadataRejection::KINDS
            .iter()
            .map(|k| format!("metadata:{k}"))
            .chain(keel_core::partition::PartitionRejection::KINDS.iter().map(|k| format!("partition:{k}")))
            .collect();
        let never: Vec<&str> = all.iter().map(String::as_str).filter(|k| !seen.contains_key(k)).collect();
        format!("rejection kinds reached: {} of {} {seen:?}; never: {never:?}", all.len() - never.len(), all.len())
    }

    fn sweep(args: SweepArgs) -> Result<bool, String> {
        let started = Instant::now();
        let budget = args.budget_secs.map(Duration::from_secs);
        let done = sweep_seeds(args.from, args.count, args.jobs, budget, args.seed_timeout_secs, &args.common)?;
        for line in sweep_totals(&done, started.elapsed().as_secs_f64()) {
            println!("{line}");
        }
        Ok(done.iter().all(|s| s.violations.is_empty()))
    }

    /// What a campaign writes to summary.json.
    #[derive(Serialize)]
    struct CampaignSummary {
        from: u64,
        seeds: usize,
        budget_secs: u64,
        sweep_secs: f64,
        failures: Vec<CampaignFailure>,
        totals: Vec<String>,
    }

    #[derive(Serialize)]
    struct CampaignFailure {
        seed: u64,
        violations: Vec<String>,
        directory: String,
        minimal_replay: Option<String>,
        shrink_steps: Vec<String>,
        minimal_faults: Option<usize>,
    }

    fn campaign(args: CampaignArgs) -> Result<bool, String> {
        let from = args.from.unwrap_or_else(|| {
            // Fresh seeds each time, far from CI's and the regression seeds.
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            1_000_000 + (now.as_secs() % 1_000_000) * 1_000
        });
        println!(
            "campaign: seeds from {from} for {}{}, writing to {}",
            humantime::format_duration(args.budget),
            if args.common.all_faults { ", every fault kind" } else { ", each seed its own swarm of lanes" },
            args.out.display()
        );
        std::fs::create_dir_all(&args.out).map_err(|e| format!("creating {}: {e}", args.out.display()))?;
        let started = Instant::now();
        let done =
            sweep_seeds(from, u64::MAX - from, args.jobs, Some(args.budget), args.seed_timeout_secs, &args.common)?;
        let sweep_secs = started.elapsed().as_secs_f64();
        let totals = sweep_totals(&done, sweep_secs);
        for line in &totals {
            println!("{line}");
        }
        let mut failures = Vec::new();
        for failed in done.iter().filter(|s| !s.violations.is_empty()) {
            let dir = args.out.join(format!("seed-{}", failed.seed));
            println!("shrinking seed {} into {}", failed.seed, dir.display());
            let (minimal_replay, shrink_steps, minimal_faults) =
                match shrink_seed(failed.seed, &args.common, args.max_runs, &dir)? {
                    Some((shrunk, replay)) => (Some(replay), shrunk.steps, Some(fault_schedule(&shrunk.report).len())),
                    // A failure of its own process (a hang, a crash) that an
                    // in-process run does not repeat: keep what it said.
                    None => {
                        let text = format!(
                            "seed {} failed in its own process but not when run again in-process:\n{}\nreplay: {}\n",
                            failed.seed,
                            failed.violations.join("\n"),
                            replay_command(failed.seed, &args.common)
                        );
                        write_file(&dir.join("README.txt"), &text)?;
                        (None, Vec::new(), None)
                    }
                };
            failures.push(CampaignFailure {
                seed: failed.seed,
                violations: failed.violations.clone(),
                directory: dir.display().to_string(),
                minimal_replay,
                shrink_steps,
                minimal_faults,
            });
        }
        let summary = CampaignSummary {
            from,
            seeds: done.len(),
            budget_secs: args.budget.as_secs(),
            sweep_secs,
            failures,
            totals,
        };
        write_file(&args.out.join("summary.json"), &serde_json::to_string_pretty(&summary).expect("serialises"))?;
        println!(
            "campaign: {} seeds, {} failing; summary {}",
            summary.seeds,
            summary.failures.len(),
            args.out.join("summary.json").display()
        );
        Ok(summary.failures.is_empty())
    }

    /// `KEEL_SIM_LOG=keel_server=debug` (a tracing filter) prints the
    /// brokers' logs to stderr while a seed runs, to see why it failed.
    /// Off by default: logs cost time and sweeps do not read them.
    fn init_logs() {
        let Ok(filter) = std::env::var("KEEL_SIM_LOG") else { return };
        match tracing_subscriber::EnvFilter::try_new(&filter) {
            Ok(filter) => tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_timer(SimulatedTime)
                .init(),
            Err(e) => eprintln!("KEEL_SIM_LOG={filter:?} is not a tracing filter ({e}); running without logs"),
        }
    }

    /// Log lines carry the simulated time since the run began, in ms (the
    /// `at_ms` of the history), not the wall clock.
    struct SimulatedTime;

    impl tracing_subscriber::fmt::time::FormatTime for SimulatedTime {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            match madsim::time::TimeHandle::try_current() {
                Some(time) => write!(w, "{:>8}ms", time.elapsed().as_millis()),
                None => write!(w, "{:>10}", "-"),
            }
        }
    }

    pub fn main() -> ExitCode {
        let cli = Cli::parse();
        init_logs();
        let result = match cli.command {
            SimCommand::Run(args) => run(args, false),
            SimCommand::Replay(args) => run(args, true),
            SimCommand::Sweep(args) => sweep(args),
            SimCommand::Shrink(args) => shrink_command(args),
            SimCommand::Campaign(args) => campaign(args),
            SimCommand::Worker(common) => worker(common),
        };
        match result {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::from(2)
            }
        }
    }
}
