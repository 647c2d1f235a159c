//! `keel-sim`: run one seed, sweep a range of seeds, or replay a seed with
//! its history written out. Exits non-zero on any violation.
//!
//! Build and run it as `cargo keel-sim -- <command>` (a `--cfg madsim`
//! build; see `.cargo/config.toml`).

#[cfg(not(madsim))]
fn main() {
    eprintln!("keel-sim runs only in a simulation build: use `cargo keel-sim -- --help`");
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(madsim)]
mod cli {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::process::{Child, Command, ExitCode, Stdio};
    use std::time::{Duration, Instant};

    use clap::{Args, Parser, Subcommand};
    use keel_sim::harness::{run_seed, scenario_for, Plant, RunOptions, RunReport};
    use keel_sim::history::to_json_lines;
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
        /// persisted-before-sync, snapshot-drops-last-record.
        #[arg(long)]
        plant: Option<String>,
    }

    #[derive(Args)]
    struct RunArgs {
        #[arg(long)]
        seed: u64,
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
    struct SweepArgs {
        /// First seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// How many seeds.
        #[arg(long, default_value_t = 100)]
        count: u64,
        /// Seeds run at once (each in its own process).
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
            violations: report.verdict.violations.iter().map(|v| format!("{}: {}", v.guarantee, v.message)).collect(),
        }
    }

    fn run(args: RunArgs, always_write: bool) -> Result<bool, String> {
        let options = options(&args.common)?;
        if !args.json {
            println!("{}", scenario_for(args.seed, options).describe());
        }
        let report = run_seed(args.seed, options);
        let summary = summary(&report);
        let failed = !summary.violations.is_empty();
        let given = args.history.is_some();
        let history = match args.history {
            Some(path) => Some(path),
            None if failed => Some(PathBuf::from(format!("keel-sim-failures/seed-{}.jsonl", args.seed))),
            None => None,
        };
        if let Some(path) = &history {
            if failed || always_write || given {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
                }
                std::fs::write(path, to_json_lines(&report.events))
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
            }
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
        if failed {
            println!("VIOLATIONS:");
            for violation in &summary.violations {
                println!("  {violation}");
            }
            println!("replay: {}", replay_command(args.seed, &args.common));
        } else {
            println!("ok: every guarantee held");
        }
        Ok(!failed)
    }

    fn spawn_seed(seed: u64, common: &Common) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut command = Command::new(exe);
        command.args(["run", "--seed", &seed.to_string(), "--json"]);
        if common.all_faults {
            command.arg("--all-faults");
        }
        if let Some(plant) = &common.plant {
            command.args(["--plant", plant]);
        }
        command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().map_err(|e| e.to_string())
    }

    fn sweep(args: SweepArgs) -> Result<bool, String> {
        options(&args.common)?;
        let started = Instant::now();
        let budget = args.budget_secs.map(Duration::from_secs);
        let mut next = args.from;
        let end = args.from + args.count;
        let mut running: Vec<(u64, Child, Instant)> = Vec::new();
        let mut done: Vec<Summary> = Vec::new();
        let mut last_progress = Instant::now();
        loop {
            let out_of_time = budget.is_some_and(|b| started.elapsed() >= b);
            while running.len() < args.jobs.max(1) && next < end && !out_of_time {
                running.push((next, spawn_seed(next, &args.common)?, Instant::now()));
                next += 1;
            }
            if running.is_empty() {
                break;
            }
            let mut still = Vec::new();
            for (seed, mut child, since) in running {
                match child.try_wait().map_err(|e| e.to_string())? {
                    None if since.elapsed() >= Duration::from_secs(args.seed_timeout_secs) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        let violation = format!(
                            "L1 liveness: the run of seed {seed} did not finish within {} wall s: simulated time stopped advancing",
                            args.seed_timeout_secs
                        );
                        println!("seed {seed} FAILED: {violation}");
                        println!("  replay: {}", replay_command(seed, &args.common));
                        done.push(Summary::failed(seed, violation));
                    }
                    None => still.push((seed, child, since)),
                    Some(_) => {
                        let output = child.wait_with_output().map_err(|e| e.to_string())?;
                        let line = String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or("").to_string();
                        let summary = serde_json::from_str::<Summary>(&line).unwrap_or_else(|_| {
                            Summary::failed(
                                seed,
                                format!("G7 node failure: the run of seed {seed} crashed the process"),
                            )
                        });
                        if !summary.violations.is_empty() {
                            println!("seed {seed} FAILED: {}", summary.violations.join("; "));
                            println!("  replay: {}", replay_command(seed, &args.common));
                        }
                        done.push(summary);
                    }
                }
            }
            running = still;
            if last_progress.elapsed() >= Duration::from_secs(10) {
                last_progress = Instant::now();
                let failing = done.iter().filter(|s| !s.violations.is_empty()).count();
                let per_minute = done.len() as f64 / started.elapsed().as_secs_f64() * 60.0;
                println!(
                    "sweep: {}/{} seeds done, {failing} failing, {per_minute:.1} seeds/min, {:.0} s elapsed",
                    done.len(),
                    args.count,
                    started.elapsed().as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut faults: BTreeMap<String, u64> = BTreeMap::new();
        for summary in &done {
            for (kind, count) in &summary.faults {
                *faults.entry(kind.clone()).or_default() += count;
            }
        }
        let failing: Vec<u64> = done.iter().filter(|s| !s.violations.is_empty()).map(|s| s.seed).collect();
        let wall = started.elapsed().as_secs_f64();
        let simulated: u64 = done.iter().map(|s| s.simulated_ms).sum();
        println!(
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
        );
        println!("faults injected: {faults:?}");
        println!(
            "snapshots: {} built, {} installed ({} of {} seeds installed one)",
            done.iter().map(|s| s.snapshots_built).sum::<u64>(),
            done.iter().map(|s| s.snapshots_installed).sum::<u64>(),
            done.iter().filter(|s| s.snapshots_installed > 0).count(),
            done.len()
        );
        Ok(failing.is_empty())
    }

    pub fn main() -> ExitCode {
        let cli = Cli::parse();
        let result = match cli.command {
            SimCommand::Run(args) => run(args, false),
            SimCommand::Replay(args) => run(args, true),
            SimCommand::Sweep(args) => sweep(args),
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
