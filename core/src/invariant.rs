//! Invariant checks: what `check_invariants()` returns when state is wrong.
//!
//! A violation is a bug in keel, never the fault of input: tests, the
//! simulation and the fuzzers call `check_invariants()` after every apply and
//! fail loudly on the first violation.

/// A broken invariant, with a description of what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated: {0}")]
pub struct InvariantViolation(pub String);

/// Fail with `describe()` unless `condition` holds.
pub(crate) fn ensure(condition: bool, describe: impl FnOnce() -> String) -> Result<(), InvariantViolation> {
    if condition {
        Ok(())
    } else {
        Err(InvariantViolation(describe()))
    }
}
