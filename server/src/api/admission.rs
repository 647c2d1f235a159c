//! Admission control: a bound on the writes a broker holds in flight.
//!
//! Every produce keeps its decoded batch in memory until its Raft entry
//! commits; while the disk or a quorum stalls, unbounded arrivals would
//! grow memory without limit. Each write takes a share of a fixed budget
//! before it is proposed and gives it back when it is answered; a write
//! that finds the budget spent is refused at once with RESOURCE_EXHAUSTED
//! and a retry hint (`keel-retry-after-ms`), which the client library backs
//! off on. Nothing waits for room here: a refused write costs nothing.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Bytes of produce batches one broker holds in flight.
pub const WRITE_BYTES_IN_FLIGHT_MAX: u64 = 256 * 1024 * 1024;
/// The budget's unit: a write costs its size rounded up to this, and at
/// least one unit.
const UNIT_BYTES: u64 = 1024;
/// How long a refused client should wait before it retries.
pub const RETRY_AFTER_MS: u64 = 100;
/// Response metadata of a refusal that a retry after this many ms may pass.
pub const RETRY_AFTER_METADATA: &str = "keel-retry-after-ms";

/// The in-flight write budget of one broker.
#[derive(Debug, Clone)]
pub struct Admission {
    units: Arc<Semaphore>,
    units_max: u32,
}

/// A write's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    /// A budget of `bytes_max` bytes.
    pub fn new(bytes_max: u64) -> Admission {
        let units_max = (bytes_max / UNIT_BYTES).clamp(1, u64::from(u32::MAX >> 3)) as u32;
        Admission { units: Arc::new(Semaphore::new(units_max as usize)), units_max }
    }

    /// Admit a write of `bytes`, or refuse it while the budget is spent.
    /// A write larger than the whole budget is admitted only alone.
    pub fn admit(&self, broker: u64, bytes: u64) -> Result<Admitted, Status> {
        let units = (bytes.div_ceil(UNIT_BYTES).max(1)).min(u64::from(self.units_max)) as u32;
        match self.units.clone().try_acquire_many_owned(units) {
            Ok(permit) => Ok(Admitted { _permit: permit }),
            Err(_) => {
                let mut status = Status::resource_exhausted(format!(
                    "broker {broker} holds {} MiB of writes in flight, its limit: retry in {RETRY_AFTER_MS} ms",
                    WRITE_BYTES_IN_FLIGHT_MAX / (1024 * 1024)
                ));
                if let Ok(value) = RETRY_AFTER_MS.to_string().parse() {
                    status.metadata_mut().insert(RETRY_AFTER_METADATA, value);
                }
                Err(status)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_refuses_with_a_retry_hint_until_writes_are_answered() {
        let admission = Admission::new(4 * 1024);
        let first = admission.admit(1, 3 * 1024).unwrap();
        let _small = admission.admit(1, 10).unwrap();
        let refused = admission.admit(1, 1024).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(refused.metadata().get(RETRY_AFTER_METADATA).unwrap(), "100");
        drop(first);
        admission.admit(1, 2 * 1024).unwrap();
    }

    #[test]
    fn a_write_over_the_whole_budget_is_admitted_alone() {
        let admission = Admission::new(4 * 1024);
        let alone = admission.admit(1, 1 << 30).unwrap();
        assert!(admission.admit(1, 1).is_err());
        drop(alone);
        admission.admit(1, 1).unwrap();
    }
}
