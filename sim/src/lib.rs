//! keel-sim: the deterministic simulation harness.
//!
//! It will run the real `keel-server` code on madsim hosts with simulated
//! disks, networks and per-node clocks, inject faults drawn from a seed, and
//! check the guarantees G1-G8 and L1 against the recorded history. Build it
//! with `cargo sim` (a `--cfg madsim` build in its own target dir).

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
