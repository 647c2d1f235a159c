//! Shared by the bench binaries: run mode and latency figures.

use std::time::Duration;

/// `cargo bench` passes `--bench`; `cargo test --all-targets` runs bench
/// binaries without it, and then a quick smoke run is enough.
pub fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Print throughput and latency percentiles of one measured run.
pub fn report(name: &str, operations: u64, elapsed: Duration, latencies: &mut [Duration]) {
    latencies.sort_unstable();
    let percentile =
        |p: f64| latencies.get(((latencies.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default();
    println!(
        "{name:<44} {:>10.0} appends/s   p50 {:>8.3} ms   p99 {:>8.3} ms   ({operations} appends in {:.2} s)",
        operations as f64 / elapsed.as_secs_f64(),
        percentile(0.50).as_secs_f64() * 1e3,
        percentile(0.99).as_secs_f64() * 1e3,
        elapsed.as_secs_f64(),
    );
}
