//! keel-sim: the deterministic simulation harness.
//!
//! It runs the real `keel-server` code on madsim hosts with simulated
//! disks, networks and per-node clocks, drives it with the real client
//! library, injects faults drawn from a seed, and checks the guarantees
//! G1-G8 and L1 against the recorded history. Build it with `cargo sim`
//! (tests) or `cargo keel-sim` (the command line), both `--cfg madsim`
//! builds in their own target dir.
//!
//! - [`scenario`]: what a seed decides (pure).
//! - [`history`]: the recorded events, JSON lines and the trace hash (pure).
//! - [`checkers`]: one checker per guarantee over a history (pure).
//! - `harness` (simulation builds): one run of one seed.
//! - `shrink` (simulation builds): a failing run down to its smallest scenario.
//! - [`timeline`]: a history as a self-contained HTML timeline (pure).
//! - `allocator` (simulation builds): how the simulation's mimalloc runs.

#[cfg(all(madsim, unix))]
pub mod allocator;
pub mod checkers;
#[cfg(madsim)]
pub mod harness;
pub mod history;
pub mod scenario;
#[cfg(madsim)]
pub mod shrink;
pub mod timeline;

#[cfg(test)]
mod tests {
    /// The simulation build is wired: `cargo sim` compiles this crate with
    /// `--cfg madsim`, the plain workspace build without it.
    #[test]
    fn cfg_matches_the_build() {
        let simulated = cfg!(madsim);
        let requested = std::env::var("KEEL_EXPECT_MADSIM").ok();
        if let Some(expected) = requested {
            assert_eq!(simulated.to_string(), expected);
        }
    }
}
