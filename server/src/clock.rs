//! The one clock interface of a node.
//!
//! Everything the node stamps (the leader's time in commands, session
//! deadlines) reads [`Clock::now`]. In production it is the system clock. In
//! the simulation madsim fakes the system clock with one global time, so
//! each node's `Clock` adds its own offset and drift, and the simulation can
//! jump it: that is how keel gets per-node clock skew under madsim.
//!
//! Deadlines (member sessions) read [`Clock::monotonic`] instead: the
//! runtime's monotonic clock, which skew and jumps of the wall clock do not
//! move (under madsim, simulated monotonic time).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use keel_core::{MonotonicMs, TimestampMs};

/// How one node's clock departs from true (simulated) time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skew {
    /// Added to the reading, in milliseconds (may be negative).
    pub offset_ms: i64,
    /// Extra milliseconds gained per second elapsed since `drift_since_ms`,
    /// in parts per million (may be negative).
    pub drift_ppm: i64,
    /// True time at which drift started counting.
    pub drift_since_ms: u64,
}

/// A node's clock: true time plus this node's skew.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    skew: Arc<Mutex<Skew>>,
    /// The origin of [`Clock::monotonic`], taken at its first reading (so
    /// that it is read inside the runtime, simulated or not).
    origin: Arc<std::sync::OnceLock<tokio::time::Instant>>,
}

impl Clock {
    /// The system clock, without skew.
    pub fn system() -> Self {
        Clock::default()
    }

    /// This node's time, in milliseconds since the Unix epoch.
    pub fn now(&self) -> TimestampMs {
        let true_ms = true_time_ms();
        let skew = *self.skew.lock().expect("clock lock");
        TimestampMs(apply_skew(true_ms, skew))
    }

    /// Milliseconds on the runtime's monotonic clock since this clock was
    /// first read: for deadlines, never for stamps.
    pub fn monotonic(&self) -> MonotonicMs {
        let origin = *self.origin.get_or_init(tokio::time::Instant::now);
        MonotonicMs(origin.elapsed().as_millis() as u64)
    }

    /// Set this clock's skew (simulation and tests only).
    pub fn set_skew(&self, skew: Skew) {
        *self.skew.lock().expect("clock lock") = skew;
    }

    /// Jump this clock by `delta_ms` (forwards or backwards).
    pub fn jump(&self, delta_ms: i64) {
        let mut skew = self.skew.lock().expect("clock lock");
        skew.offset_ms = skew.offset_ms.saturating_add(delta_ms);
    }
}

/// True (or, under madsim, simulated) time in milliseconds.
fn true_time_ms() -> u64 {
    // The one place a node reads the system clock; madsim intercepts it.
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn apply_skew(true_ms: u64, skew: Skew) -> u64 {
    let elapsed_ms = true_ms.saturating_sub(skew.drift_since_ms) as i128;
    let drift_ms = elapsed_ms * i128::from(skew.drift_ppm) / 1_000_000;
    let skewed = i128::from(true_ms) + i128::from(skew.offset_ms) + drift_ms;
    skewed.clamp(0, i128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_adds_offset_and_drift() {
        let skew = Skew { offset_ms: -500, drift_ppm: 1_000, drift_since_ms: 1_000_000 };
        // 1,000 s after drift started, 1,000 ppm adds 1 s.
        assert_eq!(apply_skew(2_000_000, skew), 2_000_000 - 500 + 1_000);
        assert_eq!(apply_skew(10, Skew { offset_ms: -100, ..Skew::default() }), 0);
    }

    #[tokio::test]
    async fn jumps_move_the_wall_clock_but_not_the_monotonic_one() {
        let clock = Clock::system();
        let before = clock.monotonic();
        clock.jump(-3_600_000);
        clock.jump(7_200_000);
        let after = clock.monotonic();
        assert!(after >= before && after.0 - before.0 < 60_000, "{before} -> {after}");
    }

    #[test]
    fn jumps_move_the_clock() {
        let clock = Clock::system();
        let before = clock.now();
        clock.jump(3_600_000);
        assert!(clock.now().0 >= before.0 + 3_600_000);
    }
}
