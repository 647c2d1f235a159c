//! Simulation speed: seeds per minute and simulated seconds per wall
//! second for the standard scenario (every fault kind on), one seed at a
//! time on one core. Run it with `cargo sim-bench` (a release `--cfg madsim`
//! build); `KEEL_SIM_BENCH_SEEDS` sets how many seeds (default 20).

#[cfg(not(madsim))]
fn main() {
    println!("seeds bench: simulation build only; run `cargo sim-bench`");
}

/// The same allocator as `keel-sim`'s (see there).
#[cfg(madsim)]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(madsim)]
fn main() {
    use keel_sim::harness::{run_seed, RunOptions};
    keel_sim::allocator::keep_freed_memory();
    let smoke = !std::env::args().any(|a| a == "--bench");
    let seeds: u64 =
        std::env::var("KEEL_SIM_BENCH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(if smoke { 2 } else { 20 });
    let started = std::time::Instant::now();
    let (mut simulated_ms, mut operations, mut faults) = (0u64, 0u64, 0u64);
    for seed in 0..seeds {
        let report = run_seed(seed, RunOptions { all_faults: true, plant: None });
        assert!(report.verdict.violations.is_empty(), "seed {seed}: {:?}", report.verdict.violations);
        simulated_ms += report.simulated_ms;
        operations += report.verdict.operations;
        faults += report.faults.values().sum::<u64>();
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "standard scenario, {seeds} seeds on one core: {:.1} seeds/min, {:.1} simulated s per wall s \
         ({:.1} s wall, {:.0} simulated s, {operations} operations, {faults} faults)",
        seeds as f64 / wall * 60.0,
        simulated_ms as f64 / 1000.0 / wall,
        wall,
        simulated_ms as f64 / 1000.0
    );
}
