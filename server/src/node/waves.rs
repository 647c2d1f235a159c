//! Partition groups elect in waves (issue #12): a broker that starts
//! thousands of groups at once (a large topic created, a restart) lets a
//! bounded number of them elect and settle at a time, so that elections do
//! not outrun the CPU and turn into a storm.
//!
//! Every partition group starts here with its election timer and its
//! ticker off (so no heartbeats either) and waits for its turn. A group is
//! let go without a turn once it is quiet here (see `quiesce`), or, as
//! leader, once its log grew while it waited (it is written to, and must
//! heartbeat). Its timers run from then on, as any group's. A
//! follower whose leader's broker is heard waits on, its election timer
//! off, until the group goes quiet (its leader settles it in the leader's
//! own turn); should that broker go unheard, or the membership no longer
//! name that leader, or that leader ask this replica's vote in a later term
//! and be refused for its shorter log, or [`FOLLOWER_PATIENCE`] pass, the
//! follower takes a turn.
//! A group with no live leader is elected by one replica at first: the
//! preferred leader if it is heard, else a heard replica drawn by lot (the
//! same on every broker); the others stand aside for
//! [`STAND_ASIDE_PATIENCE`], or until they refuse that one their vote for
//! its shorter log (see [`stands_first`]).
//! Otherwise a turn is taken when the turns held leave room for it (at
//! most [`WAVE_GROUPS`] elections at once, a new group's initialisation
//! counting for [`NEW_GROUP_TURN`]), in this order: by this broker's place
//! among the group's replicas (the preferred leader's groups first, then
//! those where this broker is next in line), then in a shuffle of this
//! broker's own. So when a broker dies, each broker left stands first in
//! the groups where it is next in line, and where brokers are ranked alike
//! (placement lists the replicas of all partitions a broker leads in one
//! order) they take the groups in different orders: their turns go to
//! different groups, rather than to the same groups where they would stand
//! against each other. A group that cannot win
//! (a majority of its voters unheard) waits without one, and a new group's
//! turn that does not fit ends the round's turns. A quiet group whose
//! leader's broker goes unheard waits here again (see `quiesce`): a broker
//! killed leaves thousands of groups to elect at once. A turn starts the
//! group's timers, and for a new group initialises it. A group gives its
//! turn back once it is quiet here, and after [`WAVE_HOLD`] at the latest.
//!
//! Knowing a leader is not enough to run the timers: after a restart a
//! follower names the leader of the vote restored from disk, and that
//! leader, restarted too, no longer leads (a restarted leader stands for
//! election in a new term: vendor/README.md). Followers whose election
//! timers ran would elect, in every group at once; instead the old leader,
//! which knows no leader, stands in a turn of its own, and its followers
//! take a turn only if it cannot win: its log lost entries they hold, so
//! they refuse it their votes, and take a turn once they have.
//!
//! A new group is initialised by its preferred leader alone, so that its
//! replicas do not all stand for election in the same instant (each would
//! vote for itself, in every group). Another replica initialises it too if
//! the preferred leader's broker has gone unheard, or after
//! [`INITIALISE_FALLBACK`] in any case. A moved replica never initialises:
//! it waits for the group's leader to reach it.
//!
//! The number of turns adapts as TCP's congestion window does: halved when
//! turns end without a leader (the brokers answer elections slower than
//! they are started, or replicas are down), one more for each group that
//! settles in its turn, between [`WAVE_GROUPS_MIN`] and the configured
//! number.
//!
//! Turns change only when an election timer runs, never what Raft decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use openraft::{BasicNode, ServerState};
// The runtime's clock (madsim's virtual one in simulation), as openraft's
// election timers use: turns are measured against elections, and a broker's
// skewed wall clock (`crate::clock::Clock`) must not stretch or cut them.
use tokio::time::Instant;

use super::Node;
use crate::group::GroupId;
use crate::raft::types::NodeId;

/// Turns a broker hands out at once, by default, counted in elections: a
/// group that elects (after a restart, or when its leader's broker went
/// unheard) takes one, a new group that is initialised [`NEW_GROUP_TURN`].
/// Each group holding a turn costs its leader a heartbeat per follower
/// every 100 ms until it goes quiet (half a second or so after its
/// election). Measured with 10,000 partitions at RF 3 on three brokers of
/// one 2-core machine: 64 turns of any kind led every new group in 33-40 s
/// and, broker 1 killed, re-elected the 3,334 groups it led in 35 s; 256
/// re-elected them in 9 s, but took 81 s over the new groups (each new
/// group writes its membership on three brokers before it elects), hence
/// [`NEW_GROUP_TURN`]. Later, with elections cheaper (votes in the segment
/// log, quiet groups), a failover with 256 took 2.5-2.6 s and left half of
/// the two cores idle; 512 took 1.5-2.0 s (median 1.9); 768 and 1,024 were
/// no faster and slowed a restart of all brokers by a third
/// (BENCHMARKS.md, thirty-eighth session): the elections were bound by
/// CPU, a fifth of it in one RPC per Raft call. With the calls of many
/// groups batched (`raft::batch`), 1,024 took 1.4 s in each of three
/// runs, 768 1.4-1.7 s and 512 1.6 s; a restart of all brokers 5.4-6.3 s
/// against 3.9-4.7 s with 512 (thirty-ninth session).
pub const WAVE_GROUPS: usize = 1024;
/// What a new group's turn counts for (see [`WAVE_GROUPS`]): 128 new
/// groups at a time. With the calls batched, a topic of 10,000 partitions
/// was led after 7 s, against 14 s with 64 at a time.
pub const NEW_GROUP_TURN: usize = 8;
/// The fewest turns the wave shrinks to when turns end without a leader.
pub const WAVE_GROUPS_MIN: usize = 8;
/// The longest a group holds a turn: one that cannot go quiet (a replica
/// is down, or it is written to) must not hold back the groups after it.
pub const WAVE_HOLD: Duration = Duration::from_secs(3);
/// How long a replica that is not the preferred leader waits for a new
/// group's leader to reach it before it initialises the group itself,
/// while the preferred leader's broker is heard (a broker unheard is given
/// up at once).
pub const INITIALISE_FALLBACK: Duration = Duration::from_secs(60);
/// How long a follower whose leader's broker is heard waits with its
/// election timer off before it takes a turn anyway (its leader may have
/// stepped down without this replica hearing of another).
pub const FOLLOWER_PATIENCE: Duration = Duration::from_secs(10);
/// How long a replica stands aside in a group whose leader must be
/// elected while another live replica stands first there (see
/// [`stands_first`]): that one should have won within two election
/// timeouts (1.6 s at most), and after this the group takes a turn here
/// too, as any group whose election is overdue.
pub const STAND_ASIDE_PATIENCE: Duration = Duration::from_secs(2);
/// How often turns are handed out.
pub const WAVE_ROUND: Duration = Duration::from_millis(100);

/// The groups waiting for a turn and those holding one (soft state).
#[derive(Default)]
pub(super) struct Waves {
    state: Mutex<WaveState>,
}

#[derive(Default)]
struct WaveState {
    /// Groups started here whose election timers are off, in turn order.
    waiting: BTreeMap<Turn, Waiting>,
    /// Groups holding a turn.
    turned: BTreeMap<GroupId, Held>,
    /// How many turns there are now (see [`next_wave_size`]); none until
    /// the first round, which starts from the configured number.
    size: Option<usize>,
    /// The last candidate each group refused its vote here for its shorter
    /// log, in what term, and when. Bounded by the groups running here; an
    /// entry goes when its group takes a turn or is let go, and after
    /// [`FOLLOWER_PATIENCE`] (a group waiting since before then has taken
    /// a turn anyway).
    refused: BTreeMap<GroupId, Refusal>,
}

/// The number of turns after a round in which `settled` groups went quiet
/// in their turn and `leaderless` turns ended without a leader: halved
/// (once a round, however many ended so), else one more per settled group,
/// within [`WAVE_GROUPS_MIN`] and `ceiling`.
fn next_wave_size(size: usize, ceiling: usize, settled: usize, leaderless: usize) -> usize {
    let floor = WAVE_GROUPS_MIN.min(ceiling);
    let size = if leaderless > 0 { size / 2 } else { size.saturating_add(settled) };
    size.clamp(floor, ceiling)
}

/// Whether a majority of the voters of each of a group's configurations
/// (one, or two while joint) is this broker or a peer heard lately.
fn majority_heard(joint: &[BTreeSet<NodeId>], me: NodeId, live_peers: &BTreeSet<NodeId>) -> bool {
    joint.iter().filter(|voters| !voters.is_empty()).all(|voters| {
        let heard = voters.iter().filter(|v| **v == me || live_peers.contains(v)).count();
        2 * heard > voters.len()
    })
}

/// Which replica of a group stands for election first, as every broker
/// that hears the same brokers computes it: the preferred leader if it is
/// heard, otherwise one of the heard voters chosen by a hash of the group
/// and the voter, so that the groups of a dead broker are shared out
/// evenly. `None` while the membership is joint (a move: Raft decides).
///
/// Only one replica then stands at first. When broker 1 of three was killed,
/// brokers 2 and 3 both took turns in its 3,334 groups: in those where both
/// election timers ran, the two often stood at once (a vote round trip
/// takes hundreds of milliseconds on busy brokers), split the votes and
/// stood again one or two timeouts later; a failover took 1.5-3.0 s.
fn stands_first(
    group: &GroupId,
    joint: &[BTreeSet<NodeId>],
    preferred: Option<NodeId>,
    me: NodeId,
    live_peers: &BTreeSet<NodeId>,
) -> Option<NodeId> {
    let [voters] = joint else { return None };
    let heard = |voter: &NodeId| *voter == me || live_peers.contains(voter);
    if let Some(preferred) = preferred.filter(|p| voters.contains(p) && heard(p)) {
        return Some(preferred);
    }
    voters.iter().copied().filter(heard).min_by_key(|voter| (lot(group, *voter), *voter))
}

/// A voter's lot in a group (see [`stands_first`]): the same on every
/// broker, and in simulation on every replay.
fn lot(group: &GroupId, voter: NodeId) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    group.hash(&mut hasher);
    voter.hash(&mut hasher);
    hasher.finish()
}

/// What a turn counts for in a wave of `size` (see [`WAVE_GROUPS`]).
fn turn_weight(initialise: bool, size: usize) -> usize {
    if initialise {
        NEW_GROUP_TURN.min(size)
    } else {
        1
    }
}

/// A group holding a turn.
struct Held {
    since: Instant,
    /// What its turn counts for: 1, or [`NEW_GROUP_TURN`].
    weight: usize,
    /// Its place, should it wait again.
    turn: Turn,
    waited_since: Instant,
    preferred: Option<NodeId>,
}

/// A waiting group's place: by this broker's rank among its replicas,
/// then in an order of this broker's own (`spread`), then by group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Turn {
    rank: usize,
    spread: u64,
    group: GroupId,
}

impl Turn {
    fn new(rank: usize, group: GroupId, me: NodeId) -> Turn {
        Turn { rank, spread: spread(&group, me), group }
    }
}

/// Where a group comes among those of the same rank on broker `me`: a
/// fixed shuffle of its own per broker, so that brokers standing in the
/// same groups at the same rank take them in different orders. (When a
/// broker of three died, the two left were ranked the same in all of its
/// groups, second and third, as placement lists the replicas of every
/// partition it leads in the same order: both stood in the same groups in
/// the same order, so their turns went to the same groups at once, not to
/// twice as many.) Soft state: only the order of turns, never what Raft decides.
fn spread(group: &GroupId, me: NodeId) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    // `DefaultHasher::new()` has fixed keys: the same order every run (and
    // in simulation, the same on every replay).
    let mut hasher = DefaultHasher::new();
    me.hash(&mut hasher);
    group.hash(&mut hasher);
    hasher.finish()
}

struct Waiting {
    since: Instant,
    /// Its last log index when first seen waiting: a leader whose log grew
    /// since is written to, and heartbeats (it is let go).
    last_index: Option<u64>,
    /// The membership to initialise a new group with, if this replica may.
    initialise: Option<BTreeMap<NodeId, BasicNode>>,
    preferred: Option<NodeId>,
}

/// How a partition group started here takes part in the waves.
pub(super) struct Start {
    pub initialise: Option<BTreeMap<NodeId, BasicNode>>,
    pub preferred: Option<NodeId>,
    /// This broker's place in the group's placement (0: the preferred
    /// leader; `usize::MAX` if not placed here, such as a replica moved off).
    pub rank: usize,
}

/// A vote a group refused here: to whom, in what term, and when.
struct Refusal {
    candidate: NodeId,
    term: u64,
    at: Instant,
}

/// What one round decided for a waiting group.
enum Step {
    Wait,
    /// It is quiet here: let it go, its timers as quiescence set them.
    ReleaseQuiet,
    /// It is awake (written to): let its timers run, without a turn.
    ReleaseAwake,
    /// It takes a turn (and is initialised, if new).
    Turn {
        initialise: bool,
    },
}

impl Node {
    /// A partition group just started here (its election timer off) waits
    /// for its turn.
    pub(super) fn wait_for_turn(&self, group: GroupId, start: Start) {
        let mut state = self.inner.waves.state.lock().expect("waves");
        let waiting = Waiting {
            since: Instant::now(),
            last_index: None,
            initialise: start.initialise,
            preferred: start.preferred,
        };
        state.waiting.insert(Turn::new(start.rank, group, self.id()), waiting);
    }

    pub(super) async fn waves_forever(&self) {
        loop {
            crate::node::timed_round("waves", || self.wave_round());
            tokio::time::sleep(WAVE_ROUND).await;
        }
    }

    /// Take back finished turns and hand out free ones.
    pub(super) fn wave_round(&self) {
        let now = Instant::now();
        let me = self.id();
        let mut state = self.inner.waves.state.lock().expect("waves");
        let state = &mut *state;
        let quiet_led = self.quiet_led_groups();
        let quiet_here = |group: &GroupId| quiet_led.contains(group) || self.quietly_following(group);
        let live_peers = self.live_peers(now);
        let mut again = Vec::new();
        let mut settled_in_turn = 0;
        state.turned.retain(|group, held| {
            let Some(raft) = self.raft(group) else { return false };
            // Settled once quiet here: a follower that merely knows a
            // leader may know one restored from disk that is not (yet)
            // heartbeating, and must hold its turn while its timer runs.
            let settled = quiet_here(group);
            let leader_known = raft.metrics().borrow().current_leader.is_some();
            let expired = now.saturating_duration_since(held.since) >= WAVE_HOLD;
            if expired && !leader_known {
                // No leader in its turn (its peers too busy to answer, or
                // down): it stops standing for election and waits for
                // another turn, so that groups failing to elect never add
                // up to a storm.
                super::quiesce::following_timers(&raft, false);
                again.push((held.turn.clone(), held.waited_since, held.preferred));
            }
            settled_in_turn += if settled { held.weight } else { 0 };
            !settled && !expired
        });
        let ceiling = self.inner.config.wave_groups;
        let size = state.size.unwrap_or(ceiling);
        let next = next_wave_size(size, ceiling, settled_in_turn, again.len());
        if next < size {
            tracing::debug!(leaderless = again.len(), size = next, "turns ended without a leader; fewer turns");
        }
        state.size = Some(next);
        for (turn, since, preferred) in again {
            let waiting = Waiting { since, last_index: None, initialise: None, preferred };
            state.waiting.insert(turn, waiting);
        }
        let taken: usize = state.turned.values().map(|held| held.weight).sum();
        let mut room = next.saturating_sub(taken);
        let mut done = Vec::new();
        for (turn, waiting) in state.waiting.iter_mut() {
            let Some(raft) = self.raft(&turn.group) else {
                done.push(turn.clone());
                continue;
            };
            let step = {
                let metrics = raft.metrics();
                let m = metrics.borrow();
                // The joint configuration's sets as they are: `voter_ids()`
                // builds a set on every call, thousands of groups a round.
                let joint = m.membership_config.membership().get_joint_config();
                let initialised = joint.iter().any(|voters| !voters.is_empty());
                let leading = m.state == ServerState::Leader && m.current_leader == Some(me);
                // The first log index seen is the baseline (a group's
                // metrics are not loaded yet when it starts waiting).
                if waiting.last_index.is_none() {
                    waiting.last_index = m.last_log_index;
                }
                let written = leading && waiting.last_index.is_some() && m.last_log_index > waiting.last_index;
                if quiet_here(&turn.group) {
                    Step::ReleaseQuiet
                } else if written {
                    Step::ReleaseAwake
                } else if m.current_leader.is_some_and(|leader| {
                    leader != me
                        && joint.iter().any(|voters| voters.contains(&leader))
                        && live_peers.contains(&leader)
                        && !state
                            .refused
                            .get(&turn.group)
                            .is_some_and(|refused| refused.candidate == leader && refused.term > m.current_term)
                }) && now.saturating_duration_since(waiting.since) < FOLLOWER_PATIENCE
                {
                    // Its leader's broker is heard: the leader goes quiet
                    // in its own turn (or heartbeats, written to), and
                    // should that broker go unheard this group takes a
                    // turn and may elect. A leader the membership no
                    // longer names (a move took it off) is stepping down:
                    // its followers must elect. So is one that asked this
                    // replica's vote in a later term and was refused for
                    // its shorter log: it restarted (it stands in a new
                    // term) and lost entries this replica holds (after a
                    // power cut of all its replicas, entries its followers
                    // flushed before it
                    // did), so it cannot win here; without this, such a
                    // group waited out the followers' patience.
                    Step::Wait
                } else if initialised && !majority_heard(joint, me, &live_peers) {
                    // It cannot win an election while most of its voters
                    // are unheard: it waits rather than take a turn it
                    // cannot use. (Groups that could not elect, such as
                    // those of replication factor 2 whose other replica's
                    // broker died, took turns again and again, and held
                    // back those that could.)
                    Step::Wait
                } else if initialised
                    && now.saturating_duration_since(waiting.since) < STAND_ASIDE_PATIENCE
                    && stands_first(&turn.group, joint, waiting.preferred, me, &live_peers).is_some_and(|first| {
                        first != me && state.refused.get(&turn.group).is_none_or(|refused| refused.candidate != first)
                    })
                {
                    // Another live replica stands first here: it elects
                    // alone, unless it asked this replica's vote and was
                    // refused for its shorter log (it cannot win), or it
                    // has not won within the patience.
                    Step::Wait
                } else if initialised {
                    Step::Turn { initialise: false }
                } else if waiting.initialise.is_some() && self.may_initialise(waiting, now) {
                    Step::Turn { initialise: true }
                } else {
                    Step::Wait
                }
            };
            match step {
                Step::Wait => {}
                Step::ReleaseQuiet => {
                    // Quiescence runs a quiet group's timers from here. A
                    // quiet leader's election timer is set to run should it
                    // step down (its ticker stays off while it is quiet).
                    if quiet_led.contains(&turn.group) {
                        raft.runtime_config().elect(true);
                    }
                    done.push(turn.clone());
                }
                Step::ReleaseAwake => {
                    self.allow_elections(&turn.group, &raft);
                    done.push(turn.clone());
                }
                // A new group's turn counts for more, but never for more
                // than the whole wave (a wave of one turn still turns). One
                // that does not fit ends the round's turns, so that the
                // room freed next is its, not taken a turn at a time by
                // the groups after it.
                Step::Turn { initialise } if room < turn_weight(initialise, next) => room = 0,
                Step::Turn { initialise } => {
                    let weight = turn_weight(initialise, next);
                    room -= weight;
                    self.allow_elections(&turn.group, &raft);
                    let held = Held {
                        since: now,
                        weight,
                        turn: turn.clone(),
                        waited_since: waiting.since,
                        preferred: waiting.preferred,
                    };
                    state.turned.insert(turn.group.clone(), held);
                    done.push(turn.clone());
                    if let Some(members) = waiting.initialise.take().filter(|_| initialise) {
                        let group = turn.group.clone();
                        self.spawn(async move {
                            if let Err(error) = raft.initialize(members).await {
                                tracing::debug!(%error, %group, "partition group already initialised");
                            }
                        });
                    }
                }
            }
        }
        state.refused.retain(|_, refused| now.saturating_duration_since(refused.at) < FOLLOWER_PATIENCE);
        for turn in done {
            state.refused.remove(&turn.group);
            state.waiting.remove(&turn);
        }
    }

    /// A group running here refused `candidate` its vote in `term`, its log
    /// being shorter: if the group waits for a turn on that candidate as
    /// its leader, it stops waiting (see [`Node::wave_round`]).
    pub(super) fn vote_refused(&self, group: &GroupId, candidate: NodeId, term: u64) {
        if self.raft(group).is_none() || matches!(group, GroupId::Metadata) {
            return;
        }
        let mut state = self.inner.waves.state.lock().expect("waves");
        state.refused.insert(group.clone(), Refusal { candidate, term, at: Instant::now() });
    }

    /// Whether this replica initialises a new group now: it is the
    /// preferred leader, or the preferred leader's broker is unheard (after
    /// this broker has had time to hear it), or it waited long enough.
    fn may_initialise(&self, waiting: &Waiting, now: Instant) -> bool {
        let waited = now.saturating_duration_since(waiting.since);
        match waiting.preferred {
            Some(preferred) if preferred == self.id() => true,
            Some(preferred) => {
                waited >= INITIALISE_FALLBACK
                    || (waited >= super::quiesce::LIVENESS_TIMEOUT && !self.peer_live(preferred, now))
            }
            None => true,
        }
    }

    /// Let a group's election timer and ticker run (a leader's ticker
    /// drives its heartbeats), unless it went quiet as a follower since
    /// this round looked (then `quiesce` starts them when it wakes).
    fn allow_elections(&self, group: &GroupId, raft: &crate::raft::types::Raft) {
        if !self.quietly_following(group) {
            super::quiesce::following_timers(raft, true);
        }
    }

    /// The groups holding a turn.
    pub(super) fn groups_in_turn(&self) -> std::collections::BTreeSet<GroupId> {
        self.inner.waves.state.lock().expect("waves").turned.keys().cloned().collect()
    }

    /// Groups started here still waiting for a turn, and holding one.
    pub fn wave_counts(&self) -> (usize, usize) {
        let state = self.inner.waves.state.lock().expect("waves");
        (state.waiting.len(), state.turned.len())
    }

    /// How many turns the wave has now.
    pub fn wave_size(&self) -> usize {
        let state = self.inner.waves.state.lock().expect("waves");
        state.size.unwrap_or(self.inner.config.wave_groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_takes_a_turn_only_with_a_majority_of_its_voters_heard() {
        let heard: BTreeSet<NodeId> = [2].into();
        let three: BTreeSet<NodeId> = [1, 2, 3].into();
        let two_with_dead: BTreeSet<NodeId> = [1, 3].into();
        assert!(majority_heard(std::slice::from_ref(&three), 1, &heard), "2 of 3");
        assert!(!majority_heard(std::slice::from_ref(&two_with_dead), 1, &heard), "1 of 2");
        assert!(!majority_heard(std::slice::from_ref(&three), 1, &BTreeSet::new()), "1 of 3");
        assert!(majority_heard(&[[1].into()], 1, &BTreeSet::new()), "a group of one");
        // Joint: a majority of each configuration.
        assert!(!majority_heard(&[three.clone(), two_with_dead], 1, &heard));
        assert!(majority_heard(&[three, [1, 2].into()], 1, &heard));
    }

    #[test]
    fn brokers_ranked_alike_take_the_groups_in_different_orders() {
        // Broker 1 of three dies leading 3,334 groups; brokers 2 and 3 are
        // second and third in each (as placement lists them).
        let orphans: Vec<GroupId> =
            (0..3334).map(|p| GroupId::parse(&format!("p/t/1/{p}")).expect("group id")).collect();
        let first_turns = |me: NodeId| -> BTreeSet<GroupId> {
            let rank = me as usize - 1;
            let order: BTreeSet<Turn> = orphans.iter().map(|g| Turn::new(rank, g.clone(), me)).collect();
            order.into_iter().take(WAVE_GROUPS).map(|turn| turn.group).collect()
        };
        let (two, three) = (first_turns(2), first_turns(3));
        let shared = two.intersection(&three).count();
        // By group alone both would take the same ones; shuffled, about
        // WAVE_GROUPS * WAVE_GROUPS / 3,334 are shared (314 of 1,024).
        let expected = WAVE_GROUPS * WAVE_GROUPS / orphans.len();
        assert!(shared < 2 * expected, "{shared} of the first {WAVE_GROUPS} turns shared (about {expected} expected)");
        assert_eq!(first_turns(2), two, "the same order every time");
        // Rank still comes first.
        assert!(Turn::new(0, orphans[5].clone(), 2) < Turn::new(1, orphans[0].clone(), 2));
    }

    #[test]
    fn one_live_replica_stands_first_and_a_dead_brokers_groups_are_shared_out() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let group = GroupId::parse("p/t/1/0").expect("group id");
        let all: BTreeSet<NodeId> = [1, 2, 3].into();
        let peers_of = |me: NodeId| -> BTreeSet<NodeId> { all.iter().copied().filter(|p| *p != me).collect() };
        let joint = std::slice::from_ref(&voters);
        // The preferred leader, heard, stands first on every broker.
        for me in 1..=3 {
            assert_eq!(stands_first(&group, joint, Some(1), me, &peers_of(me)), Some(1));
        }
        // Broker 1 dies: 2 and 3 agree on one of them in each of its groups,
        // and share the groups about evenly.
        let orphans: Vec<GroupId> =
            (0..3334).map(|p| GroupId::parse(&format!("p/t/1/{p}")).expect("group id")).collect();
        let mut firsts = BTreeMap::<NodeId, usize>::new();
        for group in &orphans {
            let on_two = stands_first(group, joint, Some(1), 2, &[3].into());
            let on_three = stands_first(group, joint, Some(1), 3, &[2].into());
            assert_eq!(on_two, on_three, "brokers 2 and 3 agree in {group}");
            *firsts.entry(on_two.expect("a live voter")).or_default() += 1;
        }
        assert_eq!(firsts.keys().copied().collect::<Vec<_>>(), [2, 3]);
        assert!(firsts.values().all(|n| *n > 1_400), "shared out evenly: {firsts:?}");
        // Alone, a broker stands first itself; a joint membership is Raft's.
        assert_eq!(stands_first(&group, joint, Some(1), 2, &BTreeSet::new()), Some(2));
        assert_eq!(stands_first(&group, &[voters.clone(), [2, 3, 4].into()], Some(1), 2, &[3].into()), None);
    }

    #[test]
    fn a_new_groups_turn_counts_for_more_but_never_for_more_than_the_wave() {
        assert_eq!(turn_weight(false, WAVE_GROUPS), 1);
        assert_eq!(turn_weight(true, WAVE_GROUPS), NEW_GROUP_TURN);
        assert_eq!(WAVE_GROUPS / NEW_GROUP_TURN, 128, "128 new groups at a time, as measured best");
        assert_eq!(turn_weight(true, 2), 2, "a small wave still turns a new group");
        assert_eq!(turn_weight(true, 1), 1);
    }

    #[test]
    fn the_wave_halves_on_turns_without_a_leader_and_grows_by_settled_groups() {
        // Many turns ending leaderless in one round halve it once.
        assert_eq!(next_wave_size(64, 64, 0, 40), 32);
        assert_eq!(next_wave_size(32, 64, 5, 1), 16, "a leaderless turn outweighs settled ones");
        assert_eq!(next_wave_size(9, 64, 0, 3), WAVE_GROUPS_MIN, "never below the floor");
        assert_eq!(next_wave_size(8, 64, 3, 0), 11, "one more per settled group");
        assert_eq!(next_wave_size(60, 64, 10, 0), 64, "never above the configured number");
        assert_eq!(next_wave_size(64, 64, 0, 0), 64);
        // A configuration below the floor is kept as it is.
        assert_eq!(next_wave_size(4, 4, 0, 2), 4);
        assert_eq!(next_wave_size(1, 1, 0, 0), 1);
    }
}
