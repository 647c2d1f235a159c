//! How the simulation's allocator (mimalloc, the `global_allocator` of
//! `keel-sim` and of the seeds bench) runs.
//!
//! A seed starts and drops whole clusters: Raft groups, their tasks and
//! stores come and go by the hundred, so memory freed now is wanted again
//! a few simulated milliseconds later. mimalloc by default gives freed
//! pages back to the kernel after a second and then takes them back as
//! new, zeroed pages. The simulation keeps them instead: about 4% more
//! seeds a minute at about the same peak memory (BENCHMARKS.md,
//! 2026-12-07). Sweep workers are replaced every few seeds anyway, which
//! returns everything.
//!
//! mimalloc reads its options from the environment when the process
//! starts, before `main`, and setting one from Rust would take `unsafe`
//! (which the workspace forbids): so the process runs itself again with
//! the option in its environment.

use std::ffi::OsStr;

/// mimalloc's option: how long freed memory waits before it goes back to
/// the kernel, in milliseconds; -1 never.
pub const PURGE_DELAY_VARIABLE: &str = "MIMALLOC_PURGE_DELAY";

/// If the environment does not set mimalloc's purge delay, replace this
/// process with itself (the same executable and arguments) keeping freed
/// memory; returns only if that is not needed or the exec failed. An
/// operator's own setting wins. Call it first thing in `main`.
pub fn keep_freed_memory() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(PURGE_DELAY_VARIABLE).is_some() {
        return;
    }
    let Ok(executable) = std::env::current_exe() else { return };
    let error = std::process::Command::new(executable)
        .args(std::env::args_os().skip(1))
        .env(PURGE_DELAY_VARIABLE, OsStr::new("-1"))
        .exec();
    // Still here: the exec failed, so run on with the default.
    eprintln!("keel-sim: could not restart with {PURGE_DELAY_VARIABLE}=-1 ({error}); going on without it");
}
