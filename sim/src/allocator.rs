//! How the simulation's allocator (mimalloc, the `global_allocator` of
//! `keel-sim` and of the seeds bench) runs.
//!
//! A seed starts and drops whole clusters: Raft groups, their tasks and
//! stores come and go by the hundred, so memory freed now is wanted again
//! a few simulated milliseconds later. Two of mimalloc's defaults cost
//! time here (BENCHMARKS.md, 2026-12-07):
//! - it gives freed pages back to the kernel after a second and then takes
//!   them back as new, zeroed pages. The simulation keeps them instead:
//!   about 4% more seeds a minute at about the same peak memory. Sweep
//!   workers are replaced every few seeds anyway, which returns everything;
//! - it asks for transparent huge pages, so the kernel zeroes 2 MiB at each
//!   first touch of a region, again and again as memory is purged and
//!   reused: 10-13% of a seed's time in `clear_page_erms`. Without them a
//!   seed takes about 8% less time, at a slightly lower peak memory.
//!
//! mimalloc reads its options from the environment when the process
//! starts, before `main`, and setting one from Rust would take `unsafe`
//! (which the workspace forbids): so the process runs itself again with
//! the options in its environment.

use std::ffi::OsStr;

/// mimalloc's options the simulation sets, with their values: how long
/// freed memory waits before it goes back to the kernel, in milliseconds
/// (-1: never); whether the process may use transparent huge pages (0: no).
pub const OPTIONS: [(&str, &str); 2] = [("MIMALLOC_PURGE_DELAY", "-1"), ("MIMALLOC_ALLOW_THP", "0")];

/// If the environment lacks any of [`OPTIONS`], replace this process with
/// itself (the same executable and arguments) with the missing ones set;
/// returns only if that is not needed or the exec failed. An operator's
/// own settings win. Call it first thing in `main`.
pub fn set_allocator_options() {
    use std::os::unix::process::CommandExt;
    let missing: Vec<(&str, &str)> =
        OPTIONS.into_iter().filter(|(variable, _)| std::env::var_os(variable).is_none()).collect();
    if missing.is_empty() {
        return;
    }
    let Ok(executable) = std::env::current_exe() else { return };
    let error = std::process::Command::new(executable)
        .args(std::env::args_os().skip(1))
        .envs(missing.iter().map(|(variable, value)| (variable, OsStr::new(value))))
        .exec();
    // Still here: the exec failed, so run on with the defaults.
    eprintln!("keel-sim: could not restart with {missing:?} ({error}); going on without them");
}
