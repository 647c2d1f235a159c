//! Quiet groups (issue #12): a partition group with nothing to replicate
//! sends no heartbeats, so an idle broker costs almost nothing however many
//! replicas it holds (as CockroachDB quiesces idle ranges).
//!
//! The leader of a partition group lets it go quiet once, for
//! [`QUIET_AFTER_ROUNDS`] rounds in a row, its log has not grown, it has
//! applied all of it, the membership is plain (no learners, no joint
//! configuration), a majority of the voters' brokers (its own among them)
//! were heard lately and every voter on those brokers has all of it.
//! Voters on brokers not heard are left out: a broker that is down does
//! not keep awake every group with a replica on it, and when it is heard
//! again its groups wake (for [`REJOIN_WAKE`] at least, so that heartbeats
//! tell it what was committed) until it has caught up. It lists the group
//! in the liveness report it sends each peer every [`LIVENESS_INTERVAL`]:
//! one message per broker pair, whatever the
//! number of groups. A follower that finds the group listed by the leader
//! it follows, with its own term and last log index, stops the group's
//! election timer. One that cannot match the listing (it does not know its
//! leader, or has not applied the whole log: restarted, say) asks for the
//! group in its next report to that broker, which wakes it for
//! [`ASKED_WAKE`]: heartbeats then tell the follower what it is missing.
//!
//! Failure detection moves from the group to the broker: a follower that
//! has neither heard its quiet leader's broker (a liveness report or any
//! Raft message) nor had an answer from it for [`LIVENESS_TIMEOUT`] (plus
//! however late this broker's own rounds ran lately: a stalled broker hears
//! nobody, and must not blame its peers for it) hands every group quiet
//! under it to the election waves (`waves`), which let a bounded number
//! of groups elect and settle at a time; in its turn a group's timer, long
//! expired, elects at the next tick. (When all of them started their
//! timers within 400 ms, a broker of 10,000 partitions killed left 3,300
//! groups electing at once on the two brokers left: every elected group
//! heartbeated, the heartbeats came late, followers deposed their new
//! leaders, and thousands of groups had no leader minutes later.)
//!
//! A quiet group's openraft ticker is stopped too (on the leader and on
//! its followers), so its Raft core is not woken at all while quiet.
//!
//! A group wakes when its log grows: the leader heartbeats again from the
//! next round (well within a follower's election timeout), and a follower restarts its timer on the first entries it
//! appends. A follower whose leader stops listing the group (it woke, or
//! lost the lead) restarts the timer a full election timeout later unless
//! entries come first. Quiet changes only whether heartbeats and election
//! timers run, never what Raft decides: safety is openraft's as before.
//! The metadata group never goes quiet.
//!
//! What it cannot see: a leader whose broker is alive but one of whose
//! groups is stuck (its Raft core blocked) keeps listing that group quiet,
//! where a heartbeating group would have lost its leader. keel stops a
//! broker on any storage error, so a blocked core means a blocked broker.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use openraft::ServerState;
// The runtime's clock (madsim's virtual one in simulation), as openraft's
// own election timers and the transport's peer timers use: failure
// detection must keep pace with those, and a broker's skewed wall clock
// (`crate::clock::Clock`) must not make a live peer look dead.
use tokio::time::Instant;

use super::Node;
use crate::group::GroupId;
use crate::raft::network::{Liveness, QuietGroup};
use crate::raft::types::{NodeId, Raft};

/// How often a broker reviews its groups and sends each peer its liveness
/// report: several times per [`LIVENESS_TIMEOUT`], so that one report lost
/// gives no broker up, and rarely enough to cost next to nothing (four
/// small messages a second per broker pair).
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(250);
/// Rounds a led group must stay idle and fully replicated before it goes
/// quiet (a second).
pub const QUIET_AFTER_ROUNDS: u32 = 4;
/// How long a broker may go unheard before the groups quiet under its lead
/// elect again: openraft's leader lease (the longest election timeout), so
/// that a broker is given up no sooner than a heartbeating leader would be.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_millis(800);
/// How long a group stays awake (heartbeating) once a follower it left out
/// is heard again: a follower back from a crash may not know what was
/// committed, only a heartbeat tells it, and until it has applied its whole
/// log it does not go quiet (and stands for election once its patience,
/// `waves::FOLLOWER_PATIENCE`, runs out). Its broker may be heard before it
/// has started all its groups, so a second of heartbeats is not enough.
pub const REJOIN_WAKE: Duration = Duration::from_secs(5);
/// How long a quiet group stays awake when a follower asks it to wake
/// (`Liveness::wake`): a few heartbeats' worth, enough to tell the follower
/// its leader and what committed.
pub const ASKED_WAKE: Duration = Duration::from_millis(500);
/// How long past a silent peer's time the round that gives it up runs.
const GIVE_UP_MARGIN: Duration = Duration::from_millis(1);
/// How long one liveness call may take.
const LIVENESS_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// The quiet state of this broker's groups (soft state: a restarted broker
/// starts with every group awake).
#[derive(Default)]
pub(super) struct Quiescence {
    /// Partition groups led here.
    led: Mutex<BTreeMap<GroupId, Led>>,
    /// Partition groups followed here whose election timer is stopped.
    following: Mutex<BTreeMap<GroupId, Following>>,
    /// When each peer's last liveness report arrived.
    heard: Mutex<BTreeMap<NodeId, Instant>>,
    /// Peers with a liveness call in flight (at most one each).
    sending: Mutex<BTreeSet<NodeId>>,
    /// By peer: groups its last report listed quiet that this replica
    /// follows but cannot match, for this broker's next report to it to
    /// ask it to wake (`Liveness::wake`).
    asking: Mutex<BTreeMap<NodeId, Vec<String>>>,
    /// How late this broker's own rounds ran lately.
    lateness: Mutex<Lateness>,
    /// Peers found unheard at the last round (for the log).
    unheard: Mutex<BTreeSet<NodeId>>,
}

/// How late this broker's rounds ran lately, as the grace its peers get.
/// While a broker's runtime is stalled (overloaded, paused) it takes in no
/// report and no Raft message, and the peers it did not hear from meanwhile
/// must not be given up for it. Each peer is allowed [`LIVENESS_TIMEOUT`]
/// plus the largest lateness recorded since the grace last ran out (a grace
/// runs out [`LIVENESS_TIMEOUT`] after the lateness it holds was recorded;
/// a smaller one meanwhile does not replace it), so that the messages
/// queued during a stall have time to be taken in. (At 10,000 partitions,
/// a broker whose rounds ran late found its peers unheard, woke every group
/// it led quiet and elected those quiet under them: load that made the
/// next rounds later still, and a second restart of the cluster did not
/// settle.)
#[derive(Default)]
struct Lateness {
    worst: Duration,
    at: Option<Instant>,
}

impl Lateness {
    fn record(&mut self, late: Duration, now: Instant) {
        if late >= self.grace(now) {
            *self = Lateness { worst: late, at: Some(now) };
        }
    }

    fn grace(&self, now: Instant) -> Duration {
        match self.at {
            Some(at) if now.saturating_duration_since(at) <= LIVENESS_TIMEOUT => self.worst,
            _ => Duration::ZERO,
        }
    }
}

struct Led {
    term: u64,
    last_index: Option<u64>,
    voters: Vec<NodeId>,
    /// Followers left out at the last round (their brokers unheard).
    left_out: Vec<NodeId>,
    /// Awake until then, for a follower left out that is heard again.
    awake_until: Option<Instant>,
    idle_rounds: u32,
    quiet: bool,
}

struct Following {
    leader: NodeId,
    /// When to start the election timer again, if due.
    wake_at: Option<Instant>,
}

/// How many groups are quiet here, as leader and as follower.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuietCounts {
    pub led: usize,
    pub followed: usize,
}

impl Node {
    /// Every [`LIVENESS_INTERVAL`], and when a peer's time runs out: let
    /// idle led groups go quiet (or wake them), wake followed groups whose
    /// leader's broker went unheard, and send each peer this broker's
    /// liveness report.
    pub(super) async fn quiesce_forever(&self) {
        loop {
            crate::node::timed_round("quiesce", || self.quiesce_round());
            // A peer falling silent is given up when its time runs out, not
            // up to a round later (on average an eighth of a second more
            // before the groups it led stand for election).
            let interval = LIVENESS_INTERVAL.min(self.until_a_peer_is_given_up(Instant::now()));
            let asleep = Instant::now();
            tokio::time::sleep(interval).await;
            let late = asleep.elapsed().saturating_sub(interval);
            self.ran_late(late);
        }
    }

    /// This broker's round ran `late`: its peers get as long again.
    fn ran_late(&self, late: Duration) {
        if late >= LIVENESS_TIMEOUT / 2 {
            tracing::warn!(
                late_ms = late.as_millis() as u64,
                "this broker's liveness round ran late (its runtime was stalled or overloaded): its peers are \
                 given as long again before the groups they lead quiet here elect"
            );
        }
        self.inner.quiet.lateness.lock().expect("lateness").record(late, Instant::now());
    }

    fn quiesce_round(&self) {
        let now = Instant::now();
        let me = self.id();
        let groups: Vec<(GroupId, Raft)> = {
            let groups = self.inner.groups.lock().expect("groups");
            groups.iter().filter(|(g, _)| **g != GroupId::Metadata).map(|(g, h)| (g.clone(), h.raft.clone())).collect()
        };
        let quiet = &self.inner.quiet;
        // A peer is live if its report arrived lately, or if it answered
        // one of this broker's calls lately (its own report among them):
        // two independent signals each round, so that a few lost messages
        // give no live broker up.
        let live_peers = self.live_peers(now);
        let live = |peer: &NodeId| live_peers.contains(peer);
        self.log_unheard(&live_peers);
        let running: BTreeSet<&GroupId> = groups.iter().map(|(g, _)| g).collect();
        // Taken before `led` is locked (`waves` locks in the other order).
        let in_turn = self.groups_in_turn();

        let mut reports: BTreeMap<NodeId, Vec<QuietGroup>> = BTreeMap::new();
        {
            let mut led = quiet.led.lock().expect("led");
            led.retain(|group, _| running.contains(group));
            for (group, raft) in &groups {
                let metrics = raft.metrics();
                let m = metrics.borrow();
                if m.state != ServerState::Leader {
                    if led.remove(group).is_some_and(|l| l.quiet) {
                        // A follower now: its election timer must run (a
                        // group quiet before its wave turn never had it on).
                        leading_timers(raft, true);
                        raft.runtime_config().elect(true);
                    }
                    continue;
                }
                let membership = m.membership_config.membership();
                // The joint configuration's sets as they are: `voter_ids()`
                // builds a set on every call, 10,000 groups a round.
                let joint = membership.get_joint_config();
                let plain = joint.len() == 1 && membership.learner_ids().next().is_none();
                let voters: Vec<NodeId> = joint.iter().flatten().copied().collect();
                // Followers on brokers given up are left out, as
                // CockroachDB quiesces ranges with dead replicas: with one
                // broker down, every group with a replica there would
                // otherwise heartbeat for as long as it stays down (at
                // 10,000 partitions, 6,600 groups heartbeating on two
                // brokers: the survivors overloaded and the 3,400 groups
                // the dead broker led never elected). A follower whose
                // broker is heard again counts again, and its group wakes
                // for `REJOIN_WAKE` (below) even if it had the whole log.
                let live_followers = || voters.iter().filter(|v| **v != me && live(v));
                let left_out: Vec<NodeId> = voters.iter().filter(|v| **v != me && !live(v)).copied().collect();
                let replicated = m.replication.as_ref().is_some_and(|matched| {
                    live_followers().all(|v| matched.get(v).is_some_and(|l| l.map(|l| l.index) == m.last_log_index))
                });
                let quorum_live = 2 * (1 + live_followers().count()) > voters.len();
                // A leader its membership no longer names must keep
                // ticking: openraft steps it down on a tick.
                let settled = plain
                    && voters.contains(&me)
                    && m.last_log_index.is_some()
                    && m.last_applied.map(|l| l.index) == m.last_log_index
                    && replicated
                    && quorum_live;
                let term = m.current_term;
                let entry = led.entry(group.clone()).or_insert(Led {
                    term,
                    last_index: m.last_log_index,
                    voters: Vec::new(),
                    left_out: Vec::new(),
                    awake_until: None,
                    idle_rounds: 0,
                    quiet: false,
                });
                if entry.left_out.iter().any(|voter| !left_out.contains(voter)) {
                    entry.awake_until = Some(now + REJOIN_WAKE);
                }
                entry.left_out = left_out;
                let settled = settled && entry.awake_until.is_none_or(|until| now >= until);
                let unchanged = entry.term == term && entry.last_index == m.last_log_index;
                entry.idle_rounds = if settled && unchanged { entry.idle_rounds.saturating_add(1) } else { 0 };
                entry.term = term;
                entry.last_index = m.last_log_index;
                entry.voters = voters;
                drop(m);
                // A group electing in its wave (a new topic's, or after a
                // restart) has had no writes to wait out: it goes quiet at
                // the first settled round, handing its turn on sooner.
                let rounds = if in_turn.contains(group) { 1 } else { QUIET_AFTER_ROUNDS };
                // A quiet group stays quiet while nothing changes: the group
                // that went quiet in its turn, after one round, must not
                // wake when the turn ends and the bar rises.
                let go_quiet = if entry.quiet { entry.idle_rounds > 0 } else { entry.idle_rounds >= rounds };
                if go_quiet != entry.quiet {
                    tracing::debug!(%group, term, quiet = go_quiet, "led group goes quiet or wakes");
                    leading_timers(raft, !go_quiet);
                    entry.quiet = go_quiet;
                }
                if entry.quiet {
                    for voter in entry.voters.iter().filter(|v| **v != me) {
                        reports.entry(*voter).or_default().push(QuietGroup {
                            group: group.key(),
                            term,
                            last_index: entry.last_index,
                        });
                    }
                }
            }
        }

        let due: Vec<(GroupId, bool)> = {
            let mut following = quiet.following.lock().expect("following");
            following.retain(|group, _| running.contains(group));
            // Due: its leader's broker is unheard (orphaned), or its
            // leader stopped listing it a full election timeout ago.
            let due: Vec<(GroupId, bool)> = following
                .iter()
                .map(|(g, f)| (g, f, !live(&f.leader)))
                .filter(|(_, f, orphaned)| *orphaned || f.wake_at.is_some_and(|at| at <= now))
                .map(|(g, _, orphaned)| (g.clone(), orphaned))
                .collect();
            for (group, _) in &due {
                following.remove(group);
            }
            due
        };
        #[cfg(madsim)]
        let due = if keel_core::planted::is_planted(keel_core::planted::Bug::QuietForever) { Vec::new() } else { due };
        // Read once, and only when a group is orphaned (its rank decides its turn).
        let metadata = due.iter().any(|(_, orphaned)| *orphaned).then(|| self.metadata());
        for (group, orphaned) in due {
            let Some(raft) = self.raft(&group) else { continue };
            if orphaned {
                // Its leader's broker is unheard: it stands for election in
                // its wave turn, its timers off until then.
                tracing::debug!(%group, "followed group's leader went unheard: it waits for a turn to elect");
                let rank = metadata
                    .as_deref()
                    .and_then(|metadata| Self::placement_of(metadata, &group))
                    .and_then(|placement| placement.replicas.iter().position(|b| b.0 == self.id()))
                    .unwrap_or(usize::MAX);
                self.wait_for_turn(group, super::waves::Start { initialise: None, preferred: None, rank });
            } else {
                tracing::debug!(%group, "followed group wakes: its election timer runs again");
                following_timers(&raft, true);
            }
        }

        self.send_liveness(reports);
    }

    /// Send each registered peer this broker's liveness report (skipping a
    /// peer whose previous call is still in flight).
    fn send_liveness(&self, mut reports: BTreeMap<NodeId, Vec<QuietGroup>>) {
        let me = self.id();
        let metadata = self.metadata();
        for (peer, broker) in metadata.brokers().iter() {
            let peer = &peer.0;
            if *peer == me || !self.inner.quiet.sending.lock().expect("sending").insert(*peer) {
                continue;
            }
            let wake = self.inner.quiet.asking.lock().expect("asking").remove(peer).unwrap_or_default();
            let report = Liveness { broker: me, quiet: reports.remove(peer).unwrap_or_default(), wake };
            let (node, peer, address) = (self.clone(), *peer, broker.internal_address.clone());
            self.spawn(async move {
                // Bounded here: a call on a connection dead without knowing
                // it would otherwise wait for the keepalive to notice.
                let call = Box::pin(node.inner.peers.liveness(peer, &address, &report, LIVENESS_CALL_TIMEOUT));
                match tokio::time::timeout(LIVENESS_CALL_TIMEOUT, call).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::trace!(peer, %error, "liveness report not delivered"),
                    Err(_) => tracing::trace!(peer, "liveness report not answered in time"),
                }
                node.inner.quiet.sending.lock().expect("sending").remove(&peer);
            });
        }
    }

    /// A peer's liveness report: it is alive; the groups it lists go quiet
    /// here if this replica follows it there with all of its log; groups
    /// quiet here under it that it no longer lists wake a full election
    /// timeout later (unless entries wake them first).
    pub(super) fn take_liveness(&self, report: Liveness) {
        let now = Instant::now();
        let quiet = &self.inner.quiet;
        quiet.heard.lock().expect("heard").insert(report.broker, now);
        let listed: BTreeMap<GroupId, QuietGroup> = report
            .quiet
            .into_iter()
            .filter_map(|q| GroupId::parse(&q.group).ok().filter(|g| *g != GroupId::Metadata).map(|g| (g, q)))
            .collect();
        self.asked_to_wake(report.broker, &report.wake, now);
        let full_timeout = Duration::from_millis(self.inner.raft_config.election_timeout_max);
        let mut unmatched = Vec::new();
        let mut following = quiet.following.lock().expect("following");
        for (group, q) in &listed {
            let Some(raft) = self.raft(group) else { continue };
            let matches = FollowerView::of(&raft.metrics().borrow()).may_go_quiet(report.broker, q);
            if !matches {
                unmatched.push(q.group.clone());
            }
            match (matches, following.get_mut(group)) {
                (true, Some(followed)) => {
                    *followed = Following { leader: report.broker, wake_at: None };
                }
                (true, None) => {
                    tracing::debug!(%group, leader = report.broker, "followed group goes quiet");
                    following_timers(&raft, false);
                    following.insert(group.clone(), Following { leader: report.broker, wake_at: None });
                }
                (false, Some(followed)) => {
                    followed.wake_at.get_or_insert(now + full_timeout);
                }
                (false, None) => {}
            }
        }
        for (group, followed) in following.iter_mut() {
            if followed.leader == report.broker && !listed.contains_key(group) {
                followed.wake_at.get_or_insert(now + full_timeout);
            }
        }
        drop(following);
        // Replaced with each report: what the peer lists now is what counts.
        let mut asking = quiet.asking.lock().expect("asking");
        match unmatched.is_empty() {
            true => asking.remove(&report.broker),
            false => asking.insert(report.broker, unmatched),
        };
    }

    /// `peer` follows the listed groups but could not match this broker's
    /// quiet listing of them: those led here quiet wake for
    /// [`ASKED_WAKE`] (from the next round), so that heartbeats tell the
    /// follower its leader and what committed. (A follower that started its
    /// groups after its broker was heard again, past [`REJOIN_WAKE`], got no
    /// heartbeat, never matched, and stood for election once its patience
    /// ran out.)
    fn asked_to_wake(&self, peer: NodeId, groups: &[String], now: Instant) {
        if groups.is_empty() {
            return;
        }
        let mut led = self.inner.quiet.led.lock().expect("led");
        for group in groups.iter().filter_map(|g| GroupId::parse(g).ok()) {
            if let Some(entry) = led.get_mut(&group).filter(|l| l.quiet && l.voters.contains(&peer)) {
                tracing::debug!(%group, peer, "a follower asks its quiet group to wake");
                entry.awake_until =
                    Some(entry.awake_until.map_or(now + ASKED_WAKE, |until| until.max(now + ASKED_WAKE)));
            }
        }
    }

    /// A group followed here appended entries from its leader: it is awake.
    pub(super) fn woken_by_entries(&self, group: &GroupId) {
        let was_quiet = self.inner.quiet.following.lock().expect("following").remove(group).is_some();
        if was_quiet {
            if let Some(raft) = self.raft(group) {
                following_timers(&raft, true);
            }
        }
    }

    /// A Raft message from `peer` arrived: it is alive. Under load a
    /// liveness report can be late behind thousands of Raft calls on the
    /// same connection; those calls say as much. (Taking only the reports
    /// let a restarted cluster of 10,000 partitions find its peers "down"
    /// again and again, so that no group could go quiet.)
    pub(super) fn heard_from(&self, peer: NodeId) {
        self.inner.quiet.heard.lock().expect("heard").insert(peer, Instant::now());
    }

    /// Whether a peer was heard lately: its liveness report or a Raft
    /// message from it arrived, or it answered one of this broker's calls,
    /// within [`LIVENESS_TIMEOUT`] plus this broker's own recent lateness.
    pub(super) fn peer_live(&self, peer: NodeId, now: Instant) -> bool {
        self.since_heard(peer, now).is_some_and(|since| since < self.liveness_timeout(now))
    }

    /// How long ago `peer` was last heard (its report or a Raft message)
    /// or answered one of this broker's calls, whichever is later.
    fn since_heard(&self, peer: NodeId, now: Instant) -> Option<Duration> {
        let heard =
            self.inner.quiet.heard.lock().expect("heard").get(&peer).map(|at| now.saturating_duration_since(*at));
        heard.into_iter().chain(self.inner.peers.since_answer(peer)).min()
    }

    /// How long a peer may go unheard: [`LIVENESS_TIMEOUT`] plus this
    /// broker's own recent lateness.
    fn liveness_timeout(&self, now: Instant) -> Duration {
        LIVENESS_TIMEOUT + self.inner.quiet.lateness.lock().expect("lateness").grace(now)
    }

    /// How long until the first of the peers heard now goes unheard, if
    /// nothing more comes from it (see [`until_first_given_up`]).
    fn until_a_peer_is_given_up(&self, now: Instant) -> Duration {
        let silences = self.live_peers(now).into_iter().filter_map(|peer| self.since_heard(peer, now));
        until_first_given_up(self.liveness_timeout(now), silences)
    }

    /// The peers heard lately (see [`Node::peer_live`]) among the
    /// registered brokers and those heard at all: taken once per round
    /// rather than once per group.
    pub(super) fn live_peers(&self, now: Instant) -> BTreeSet<NodeId> {
        let me = self.id();
        let mut peers: BTreeSet<NodeId> = self.metadata().brokers().iter().map(|(id, _)| id.0).collect();
        peers.extend(self.inner.quiet.heard.lock().expect("heard").keys().copied());
        peers.extend(self.inner.peers.answered_peers());
        peers.into_iter().filter(|peer| *peer != me && self.peer_live(*peer, now)).collect()
    }

    /// Log the registered peers that became unheard, or were heard again,
    /// since the last round.
    fn log_unheard(&self, live_peers: &BTreeSet<NodeId>) {
        let me = self.id();
        let peers: Vec<NodeId> = self.metadata().brokers().iter().map(|(id, _)| id.0).filter(|id| *id != me).collect();
        let heard_once: BTreeSet<NodeId> = self.inner.quiet.heard.lock().expect("heard").keys().copied().collect();
        let mut unheard = self.inner.quiet.unheard.lock().expect("unheard");
        for peer in peers {
            let live = live_peers.contains(&peer);
            // A peer not heard since this broker started is not news.
            if !live && heard_once.contains(&peer) && unheard.insert(peer) {
                tracing::warn!(
                    peer,
                    "broker {peer} went unheard: the groups it leads quiet here start their election timers"
                );
            } else if live && unheard.remove(&peer) {
                tracing::warn!(peer, "broker {peer} is heard again");
            }
        }
    }

    /// Partition groups led here that are quiet.
    pub(super) fn quiet_led_groups(&self) -> BTreeSet<GroupId> {
        let led = self.inner.quiet.led.lock().expect("led");
        led.iter().filter(|(_, l)| l.quiet).map(|(g, _)| g.clone()).collect()
    }

    /// Whether this replica follows a group that is quiet (its election
    /// timer stopped).
    pub(super) fn quietly_following(&self, group: &GroupId) -> bool {
        self.inner.quiet.following.lock().expect("following").contains_key(group)
    }

    /// How many groups are quiet here.
    pub fn quiet_counts(&self) -> QuietCounts {
        let quiet = &self.inner.quiet;
        QuietCounts {
            led: quiet.led.lock().expect("led").values().filter(|l| l.quiet).count(),
            followed: quiet.following.lock().expect("following").len(),
        }
    }
}

/// How long until the first of peers silent for `silences` goes unheard
/// (just past `timeout`), or [`LIVENESS_INTERVAL`] if no peer is heard.
fn until_first_given_up(timeout: Duration, silences: impl Iterator<Item = Duration>) -> Duration {
    silences.map(|since| timeout.saturating_sub(since) + GIVE_UP_MARGIN).min().unwrap_or(LIVENESS_INTERVAL)
}

/// Start or stop a led group's heartbeats, and its ticker with them: a
/// quiet group's Raft core is not woken at all (at 10,000 groups a ticker
/// each, every 150 ms, kept a broker's workers busy enough to delay every
/// Raft message past its time limit).
pub(super) fn leading_timers(raft: &Raft, on: bool) {
    raft.runtime_config().heartbeat(on);
    raft.runtime_config().tick(on);
}

/// Start or stop a followed (or waiting) group's election timer, and its
/// ticker with it.
pub(super) fn following_timers(raft: &Raft, on: bool) {
    raft.runtime_config().elect(on);
    raft.runtime_config().tick(on);
}

/// What a follower's metrics say, for deciding whether it may go quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FollowerView {
    state: ServerState,
    leader: Option<NodeId>,
    term: u64,
    last_log_index: Option<u64>,
    last_applied: Option<u64>,
}

impl FollowerView {
    fn of(metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>) -> Self {
        FollowerView {
            state: metrics.state,
            leader: metrics.current_leader,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index,
            last_applied: metrics.last_applied.map(|l| l.index),
        }
    }

    /// Whether this replica follows `leader` in `quiet`'s term with all of
    /// the leader's log, and has applied it too: a follower restarted after
    /// a power cut may hold every entry but not know they committed (the
    /// commit index is not synced), and a quiet leader sends no heartbeat
    /// to tell it; quiet, it never applied them (sim seed 160009226). Not
    /// quiet, it elects in time, and the new leader commits them.
    fn may_go_quiet(&self, leader: NodeId, quiet: &QuietGroup) -> bool {
        self.state == ServerState::Follower
            && self.leader == Some(leader)
            && self.term == quiet.term
            && self.last_log_index == quiet.last_index
            && self.last_applied == quiet.last_index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round that ran late gives peers that much longer, for
    /// LIVENESS_TIMEOUT; a later, smaller lateness does not cut a larger
    /// grace short, and the grace ends once it is that old.
    #[test]
    fn a_late_round_extends_the_grace_for_a_liveness_timeout() {
        let start = Instant::now();
        let mut lateness = Lateness::default();
        assert_eq!(lateness.grace(start), Duration::ZERO);
        lateness.record(Duration::from_millis(900), start);
        assert_eq!(lateness.grace(start), Duration::from_millis(900));
        let soon = start + Duration::from_millis(300);
        lateness.record(Duration::from_millis(10), soon);
        assert_eq!(lateness.grace(soon), Duration::from_millis(900), "a smaller lateness keeps the larger grace");
        assert_eq!(lateness.grace(start + LIVENESS_TIMEOUT), Duration::from_millis(900));
        let later = start + LIVENESS_TIMEOUT + Duration::from_millis(1);
        assert_eq!(lateness.grace(later), Duration::ZERO, "the grace ends");
        lateness.record(Duration::from_millis(5), later);
        assert_eq!(lateness.grace(later), Duration::from_millis(5));
    }

    /// The round after this one runs just past the soonest time a silent
    /// peer is to be given up, never later than the usual interval (the
    /// caller takes the smaller), and at the interval with no peer heard.
    #[test]
    fn the_next_round_runs_when_the_first_silent_peer_is_to_be_given_up() {
        let ms = Duration::from_millis;
        let timeout = LIVENESS_TIMEOUT;
        assert_eq!(until_first_given_up(timeout, [ms(100), ms(700)].into_iter()), ms(100) + GIVE_UP_MARGIN);
        assert_eq!(until_first_given_up(timeout, [ms(0)].into_iter()), timeout + GIVE_UP_MARGIN);
        // Past its time already (its round is due at once).
        assert_eq!(until_first_given_up(timeout, [ms(900)].into_iter()), GIVE_UP_MARGIN);
        assert_eq!(until_first_given_up(timeout, std::iter::empty()), LIVENESS_INTERVAL);
    }

    /// A follower goes quiet only under the listed leader and term, with
    /// the leader's whole log, and once it has applied it.
    #[test]
    fn a_follower_goes_quiet_only_once_it_has_applied_the_leaders_log() {
        let quiet = QuietGroup { group: "t/0".into(), term: 4, last_index: Some(9) };
        let caught_up = FollowerView {
            state: ServerState::Follower,
            leader: Some(2),
            term: 4,
            last_log_index: Some(9),
            last_applied: Some(9),
        };
        assert!(caught_up.may_go_quiet(2, &quiet));
        let not_applied = FollowerView { last_applied: Some(7), ..caught_up };
        assert!(!not_applied.may_go_quiet(2, &quiet), "entries held but not known committed");
        assert!(!FollowerView { last_applied: None, ..caught_up }.may_go_quiet(2, &quiet));
        assert!(!FollowerView { last_log_index: Some(8), last_applied: Some(8), ..caught_up }.may_go_quiet(2, &quiet));
        assert!(!FollowerView { term: 5, ..caught_up }.may_go_quiet(2, &quiet), "another term");
        assert!(!caught_up.may_go_quiet(3, &quiet), "another leader");
        assert!(!FollowerView { state: ServerState::Candidate, ..caught_up }.may_go_quiet(2, &quiet));
    }
}
