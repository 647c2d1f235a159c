//! Planted bugs, for the simulation's negative controls: each checker must
//! catch the bug it exists for. Exists only in simulation builds
//! (`--cfg madsim`); production code cannot turn a bug on.
//!
//! The switch is per thread: madsim runs a whole simulated cluster on the
//! thread that calls `block_on`, so a run with a planted bug never leaks
//! into another run of the same test process.

use std::cell::Cell;

/// A bug the simulation can plant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bug {
    /// Partition commit skips the claim check (the G5 fence).
    CommitWithoutFence,
    /// Partition append skips the idempotent-producer check (G8).
    NoIdempotence,
    /// State machines apply with the replica's own clock instead of the
    /// leader's stamped time (G6, G2, G7).
    WallClockApply,
    /// Partition commit skips the backwards and high-watermark checks (G4).
    CommitUnchecked,
    /// Partition apply panics on a commit beyond the high watermark: a
    /// poison pill (G7).
    PanicOnBadCommit,
    /// The consumer library hands on records it already delivered in this
    /// session, out of order (G3).
    ConsumerNoOrderFilter,
    /// The coordinator never expires silent members, so a crashed member's
    /// partitions are never handed on (L1).
    NeverExpireMembers,
    /// The batching producer hands the answer of its oldest batch in flight
    /// to the newest one (and the newest's to the oldest): records are
    /// acknowledged at offsets that hold other records (G1).
    BatchingAnswersNewest,
    /// The node's store reports log entries persisted as soon as they are
    /// queued, before the fsync that makes them durable (G1 at a power cut).
    PersistedBeforeSync,
    /// A snapshot leaves out the partition's last record: a replica that
    /// installs it lacks that record (G6, G1).
    SnapshotDropsLastRecord,
    /// A partition whose Raft term is past 1 (its leader changed) refuses
    /// produces with an error clients do not retry: writes never come back
    /// after a failover (L1, the write probes).
    RefuseProducesAfterFailover,
    /// A partition forgets a group (after `group delete`) but keeps its
    /// position: a group deleted with its positions still has them (G4).
    ForgetKeepsPositions,
    /// The node's store takes a failed write (a full disk, an I/O error)
    /// as done: it neither stops nor withholds its reports, so entries it
    /// never wrote are reported persisted (G1 at the kill that follows).
    WriteErrorsIgnored,
    /// A broker checks who an authenticated caller is but not its access
    /// rules: an intruder with a secret is served whatever it asks.
    AclIgnored,
    /// A follower of a quiet group never restarts its election timer when
    /// the leader's broker goes unheard: a partition whose leader died
    /// while idle has no leader again (L1, the write probes).
    QuietForever,
    /// The range assignor leaves the last partition of every topic to no
    /// one once a topic has more partitions than subscribers (an
    /// off-by-one in the last member's share): its records are never
    /// consumed (L1).
    RangeDropsLastPartition,
    /// A broker answers a position reset with the new position without
    /// proposing it: the group keeps its old position (G4).
    ResetAnsweredNotApplied,
    /// A read by offset answers from the record after the one asked for
    /// when it returns more than one (an off-by-one in the read cursor, G2).
    ReadSkipsFirstRecord,
    /// A partition applies an empty batch instead of rejecting it: an
    /// entry no client could send (the API refuses it at the edge) changes
    /// the state machine (the raw-entries lane; a refusal).
    EmptyBatchApplied,
    /// A broker serves a poll without its fence: no member check against
    /// its metadata, no claim check, and a claim the partition refuses (a
    /// newer generation holds it) taken as made: a member of a fenced
    /// generation still gets records (G5), as does anyone who names a
    /// member. (Taking the claim check alone away is all but invisible: the
    /// claim a poll proposes is fenced by the partition itself, and the
    /// member check by the broker's metadata.)
    PollWithoutFence,
    /// Partition commit lets an offset equal to the high watermark through
    /// (an off-by-one in the bound): the group's position passes the end
    /// of the log, past a record not yet written (G4).
    CommitAtHighWatermark,
    /// A partition answers a retried batch older than the producer's latest
    /// with the latest batch's offsets (dedup finds the right batch but
    /// answers with the wrong one): records are acknowledged at offsets
    /// that hold other records (G1).
    DuplicateAnswersNewest,
    /// A broker serves a poll's records without first confirming with a
    /// quorum that it still leads (no read index): a leader cut off from
    /// the other brokers, deposed without knowing it, hands records to the
    /// member its stale state says holds the partition, after a newer
    /// generation claimed it at the new leader (G5).
    PollWithoutReadIndex,
    /// A node's store does not replay the votes of its segment log after a
    /// crash: a vote saved since the last checkpoint is lost at a power
    /// cut, and the node may vote twice in one term (G1 at the cut).
    VotesNotReplayed,
    /// A broker hands each answer of a batch of Raft calls to the call
    /// after it (an off-by-one in the index): a group takes another group's
    /// vote or appended entries for its own. Where the answer does not fit
    /// what the group sent, openraft stops the broker (G7); where it fits,
    /// a group may count a vote or an append it never got.
    BatchAnswersMisrouted,
}

impl Bug {
    /// Every bug, in a fixed order.
    pub const ALL: [Bug; 25] = [
        Bug::CommitWithoutFence,
        Bug::NoIdempotence,
        Bug::WallClockApply,
        Bug::CommitUnchecked,
        Bug::PanicOnBadCommit,
        Bug::ConsumerNoOrderFilter,
        Bug::NeverExpireMembers,
        Bug::BatchingAnswersNewest,
        Bug::PersistedBeforeSync,
        Bug::SnapshotDropsLastRecord,
        Bug::RefuseProducesAfterFailover,
        Bug::ForgetKeepsPositions,
        Bug::WriteErrorsIgnored,
        Bug::AclIgnored,
        Bug::QuietForever,
        Bug::RangeDropsLastPartition,
        Bug::ResetAnsweredNotApplied,
        Bug::ReadSkipsFirstRecord,
        Bug::EmptyBatchApplied,
        Bug::PollWithoutFence,
        Bug::CommitAtHighWatermark,
        Bug::DuplicateAnswersNewest,
        Bug::PollWithoutReadIndex,
        Bug::VotesNotReplayed,
        Bug::BatchAnswersMisrouted,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bug::CommitWithoutFence => "commit-without-fence",
            Bug::NoIdempotence => "no-idempotence",
            Bug::WallClockApply => "wall-clock-apply",
            Bug::CommitUnchecked => "commit-unchecked",
            Bug::PanicOnBadCommit => "panic-on-bad-commit",
            Bug::ConsumerNoOrderFilter => "consumer-no-order-filter",
            Bug::NeverExpireMembers => "never-expire-members",
            Bug::BatchingAnswersNewest => "batching-answers-newest",
            Bug::PersistedBeforeSync => "persisted-before-sync",
            Bug::SnapshotDropsLastRecord => "snapshot-drops-last-record",
            Bug::RefuseProducesAfterFailover => "refuse-produces-after-failover",
            Bug::ForgetKeepsPositions => "forget-keeps-positions",
            Bug::WriteErrorsIgnored => "write-errors-ignored",
            Bug::AclIgnored => "acl-ignored",
            Bug::QuietForever => "quiet-forever",
            Bug::RangeDropsLastPartition => "range-drops-last-partition",
            Bug::ResetAnsweredNotApplied => "reset-answered-not-applied",
            Bug::ReadSkipsFirstRecord => "read-skips-first-record",
            Bug::EmptyBatchApplied => "empty-batch-applied",
            Bug::PollWithoutFence => "poll-without-fence",
            Bug::CommitAtHighWatermark => "commit-at-high-watermark",
            Bug::DuplicateAnswersNewest => "duplicate-answers-newest",
            Bug::PollWithoutReadIndex => "poll-without-read-index",
            Bug::VotesNotReplayed => "votes-not-replayed",
            Bug::BatchAnswersMisrouted => "batch-answers-misrouted",
        }
    }
}

impl Bug {
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

thread_local! {
    static PLANTED: Cell<u32> = const { Cell::new(0) };
}

/// Plant exactly `bugs` for runs on this thread (empty: none).
pub fn plant(bugs: &[Bug]) {
    PLANTED.with(|planted| planted.set(bugs.iter().fold(0, |bits, bug| bits | bug.bit())));
}

thread_local! {
    static REJECTIONS: std::cell::RefCell<std::collections::BTreeMap<(&'static str, &'static str), u64>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// Count a rejection of `kind` by state machine `machine` ("metadata",
/// "partition") applied on this thread (every replica's apply counts): the
/// simulation reports which kinds a campaign reached.
pub fn note_rejection(machine: &'static str, kind: &'static str) {
    REJECTIONS.with(|counts| *counts.borrow_mut().entry((machine, kind)).or_default() += 1);
}

/// The rejections counted on this thread since the last call, by
/// (machine, kind).
pub fn take_rejections() -> std::collections::BTreeMap<(&'static str, &'static str), u64> {
    REJECTIONS.with(|counts| std::mem::take(&mut *counts.borrow_mut()))
}

/// Whether `bug` is planted on this thread.
pub fn is_planted(bug: Bug) -> bool {
    PLANTED.with(|planted| planted.get() & bug.bit() != 0)
}
