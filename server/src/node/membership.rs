//! Membership changes: brokers joining and leaving the metadata group, and
//! partition groups following their placement when replicas move.
//!
//! The metadata is the plan; Raft membership is what runs. `MoveReplicas`
//! commits the new placement at once; each partition's leader then notices
//! that its voters differ from the placement, adds the new replicas as
//! learners, waits until they have caught up, and replaces the voters with
//! the placement (openraft's joint consensus). A replica that is no longer
//! placed on its broker keeps running until its group's membership no
//! longer names it, so a move never removes a replica before the group can
//! do without it. Before it changes the membership, the leader records in
//! the group the placement epoch it follows; the group refuses an epoch
//! older than one it already followed, so a leader whose metadata lags
//! cannot undo a move.
//!
//! Waiting for a learner to catch up polls the metrics instead of using
//! openraft's blocking `add_learner`, which waits on the metrics watch
//! channel (a second waiter there breaks determinism in simulation).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::metadata::{MetadataCommand, MetadataOutcome, MetadataState};
use keel_core::partition::PartitionCommand;
use keel_core::BrokerId;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};

use super::{Node, ProposeError};
use crate::group::GroupId;
use crate::raft::network::{JoinRefusal, JoinRequest, MoveSettledReport};
use crate::raft::types::{Command, NodeId, Raft, Response};

/// How long a new member may take to catch up before the change gives up.
/// Shorter than a client's request timeout: the caller (or the next duty
/// round) retries, and catching up goes on meanwhile.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(8);
/// Attempts a joining broker makes before it gives up.
const JOIN_ATTEMPTS_MAX: u32 = 20;

/// Why a membership change did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("the metadata refused: {0}")]
    Rejected(keel_core::metadata::MetadataRejection),
    #[error("broker {broker} did not catch up within {seconds} s; check that it runs and is reachable, then retry")]
    CatchUpTimeout { broker: NodeId, seconds: u64 },
    /// Removing the broker would leave the metadata group with no voter.
    #[error(
        "broker {broker} is the cluster's last metadata voter and cannot be removed: a cluster needs at least one \
         broker (add another first, or stop this one to retire the cluster)"
    )]
    LastBroker { broker: NodeId },
    /// The broker is joining, or being removed, through this metadata
    /// leader right now.
    #[error("broker {broker} is {change} right now; retry once that has finished")]
    Busy { broker: NodeId, change: BrokerChange },
}

/// A change of the brokers that the metadata leader makes one at a time per
/// broker. A join that ran while the same broker was being removed, between
/// the membership change that dropped it and the unregistration, found it
/// still registered, took it for a member and added it back as a learner
/// (sim seed 710000317: the removed broker's restart rejoined 34 ms before
/// its removal finished, was made a voter again, re-registered itself, and
/// a topic created later placed replicas on it after it had shut down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerChange {
    Joining,
    Leaving,
}

impl std::fmt::Display for BrokerChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BrokerChange::Joining => "joining",
            BrokerChange::Leaving => "being removed",
        })
    }
}

/// The brokers whose change is under way through this metadata leader, at
/// most one change each (soft state: bounded by the brokers asked about,
/// an entry goes when its change ends).
#[derive(Debug, Default, Clone)]
pub(super) struct BrokerChanges(Arc<Mutex<BTreeMap<NodeId, BrokerChange>>>);

impl BrokerChanges {
    /// Begin `change` of `broker`, unless a change of it is under way.
    pub(super) fn begin(&self, broker: NodeId, change: BrokerChange) -> Result<BrokerChangeHeld, MembershipError> {
        let mut changes = self.0.lock().expect("broker changes");
        if let Some(under_way) = changes.get(&broker) {
            return Err(MembershipError::Busy { broker, change: *under_way });
        }
        changes.insert(broker, change);
        Ok(BrokerChangeHeld { changes: self.clone(), broker })
    }
}

/// Holds a broker's change until dropped (a dropped join request too).
pub(super) struct BrokerChangeHeld {
    changes: BrokerChanges,
    broker: NodeId,
}

impl Drop for BrokerChangeHeld {
    fn drop(&mut self) {
        self.changes.0.lock().expect("broker changes").remove(&self.broker);
    }
}

impl Node {
    /// Begin `change` of `broker`, unless a change of it is under way here.
    fn begin_broker_change(&self, broker: NodeId, change: BrokerChange) -> Result<BrokerChangeHeld, MembershipError> {
        self.inner.broker_changes.begin(broker, change)
    }
}

/// An openraft write error as a proposal error.
pub(super) fn write_error(
    group: &GroupId,
    error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
) -> ProposeError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => ProposeError::NotLeader {
            group: group.clone(),
            leader: forward.leader_id,
            address: forward.leader_node.map(|n| n.addr),
        },
        other => ProposeError::Raft { group: group.clone(), reason: other.to_string() },
    }
}

/// The voters of a group's effective membership.
pub(super) fn voters(raft: &Raft) -> BTreeSet<NodeId> {
    raft.metrics().borrow().membership_config.membership().voter_ids().collect()
}

/// What a group led here by one of its voters looks like to convergence:
/// its term, its membership's log id, and whether that membership is
/// committed (applied here); `None` unless `me` leads the group as one of
/// its voters. A leader that voted itself out stays "leader" in openraft's
/// metrics until it steps down, but must change no membership again
/// (openraft asserts this in debug builds; the simulation found a
/// partition leader doing it after a move that took it out was followed
/// by one that brought a new replica).
fn led_as_voter(raft: &Raft, me: NodeId) -> Option<LedMembership> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = &metrics.membership_config;
    let leads = metrics.current_leader == Some(me)
        && metrics.state == openraft::ServerState::Leader
        // The joint configuration's sets as they are: `voter_ids()` builds
        // a set on every call (9% of an idle broker's CPU at 10,000 groups).
        && membership.membership().get_joint_config().iter().any(|voters| voters.contains(&me));
    let applied = metrics.last_applied.map(|id| id.index);
    leads.then(|| LedMembership {
        term: metrics.current_term,
        membership: membership.log_id().map(|id| id.index),
        committed: membership.log_id().is_none_or(|id| Some(id.index) <= applied),
    })
}

/// See [`led_as_voter`]: with the metadata, all that convergence reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LedMembership {
    term: u64,
    membership: Option<u64>,
    committed: bool,
}

/// The groups led here found to follow their placement, and the metadata
/// they were found to follow it in: reviewed again only when either
/// changes (each review builds several sets per group, 5 times a second,
/// for thousands of groups).
#[derive(Default)]
pub(super) struct Converged {
    metadata: Option<Arc<MetadataState>>,
    groups: BTreeMap<GroupId, LedMembership>,
}

/// Whether a group's effective membership names `node` (voter or learner).
fn names(raft: &Raft, node: NodeId) -> bool {
    raft.metrics().borrow().membership_config.membership().get_node(&node).is_some()
}

/// Every node (voter or learner) of a group's effective membership, and
/// whether that membership is committed (applied here).
fn nodes(raft: &Raft) -> (BTreeSet<NodeId>, bool) {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = &metrics.membership_config;
    let nodes = membership.membership().nodes().map(|(id, _)| *id).collect();
    let applied = metrics.last_applied.map(|id| id.index);
    let committed = membership.log_id().is_none_or(|id| Some(id.index) <= applied);
    (nodes, committed)
}

/// What a partition's leader does next to make its group follow the
/// placement.
enum Convergence {
    /// Voters differ from the placement: learners first, then joint
    /// consensus.
    ChangeVoters(BTreeMap<NodeId, String>),
    /// Voters are right; learners left from an earlier attempt go.
    RemoveLearners(BTreeSet<NodeId>),
    /// Members registered a new internal address since they joined.
    UpdateAddresses(BTreeMap<NodeId, BasicNode>),
    /// The membership is exactly the placement and committed, but the
    /// metadata still lists brokers leaving: tell the metadata leader.
    ReportSettled(MoveSettledReport),
}

/// Add `node` as a learner unless it is already a member, then wait until
/// the leader has replicated to it up to the change (for a member added by
/// an earlier attempt: up to the log's end as it is now).
async fn add_learner_and_catch_up(
    group: &GroupId,
    raft: &Raft,
    node: NodeId,
    address: String,
) -> Result<(), MembershipError> {
    let target = if names(raft, node) {
        raft.metrics().borrow().last_log_index.unwrap_or(0)
    } else {
        raft.add_learner(node, BasicNode { addr: address }, false)
            .await
            .map_err(|e| write_error(group, e))?
            .log_id
            .index
    };
    let mut waited = Duration::ZERO;
    let step = Duration::from_millis(50);
    loop {
        let caught_up = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            match &metrics.replication {
                // No longer the leader: whoever leads carries on.
                None => true,
                Some(replication) => {
                    replication.get(&node).and_then(|matched| matched.as_ref()).is_some_and(|m| m.index >= target)
                }
            }
        };
        if caught_up {
            return Ok(());
        }
        if waited >= CATCH_UP_TIMEOUT {
            return Err(MembershipError::CatchUpTimeout { broker: node, seconds: CATCH_UP_TIMEOUT.as_secs() });
        }
        tokio::time::sleep(step).await;
        waited += step;
    }
}

impl Node {
    /// This cluster's identity.
    pub fn cluster_id(&self) -> u64 {
        self.inner.config.cluster_id
    }

    /// The voters of a group running here, as this broker sees them.
    pub fn group_voters(&self, group: &GroupId) -> Option<BTreeSet<NodeId>> {
        self.raft(group).map(|raft| voters(&raft))
    }

    /// On the metadata leader: register `broker` at its client `address`
    /// and `internal_address`, add it as a learner of the metadata group,
    /// wait until it has caught up, and make it a voter. Doing it again for
    /// a member changes nothing but its addresses.
    pub async fn add_broker(
        &self,
        broker: NodeId,
        address: String,
        internal_address: String,
    ) -> Result<(), MembershipError> {
        let group = GroupId::Metadata;
        let raft = self.raft(&group).ok_or_else(|| ProposeError::GroupNotHere { group: group.clone() })?;
        let _joining = self.begin_broker_change(broker, BrokerChange::Joining)?;
        // Register only what changed: a repeated join writes nothing.
        let known = self.metadata().brokers().get(&BrokerId(broker)).cloned();
        if !known.is_some_and(|b| b.address == address && b.internal_address == internal_address) {
            let register = MetadataCommand::RegisterBroker {
                broker: BrokerId(broker),
                address: address.clone(),
                internal_address: internal_address.clone(),
            };
            match self.propose(&group, Command::Metadata(register)).await? {
                Response::Metadata(Ok(_)) => {}
                Response::Metadata(Err(rejection)) => return Err(MembershipError::Rejected(rejection)),
                other => unreachable!("the metadata group answered {other:?}"),
            }
        }
        // A member that moved to another internal address: Raft must send
        // there from now on (the same node, so no quorum changes).
        let moved = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&broker)
            .is_some_and(|node| node.addr != internal_address);
        if moved {
            let nodes = BTreeMap::from([(broker, BasicNode { addr: internal_address.clone() })]);
            raft.change_membership(ChangeMembers::SetNodes(nodes), false).await.map_err(|e| write_error(&group, e))?;
        }
        add_learner_and_catch_up(&group, &raft, broker, internal_address).await?;
        if !voters(&raft).contains(&broker) {
            raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([broker])), false)
                .await
                .map_err(|e| write_error(&group, e))?;
        }
        Ok(())
    }

    /// Whether this broker is on its way out of, or out of, the cluster: the
    /// newest metadata membership it knows names it neither as a voter of
    /// the target configuration nor as a learner. A removed broker never
    /// hears of the final configuration (it is no longer sent entries), so
    /// the joint one, where it is only in the outgoing half, is the sign;
    /// but while it still leads that joint configuration it is the one
    /// broker that can finish it, so it is not out yet. (A leader that
    /// removed itself appended the final configuration: out.) A broker
    /// whose membership is still empty (joining) is not out.
    pub fn removed_from_cluster(&self) -> bool {
        let Some(raft) = self.raft(&GroupId::Metadata) else { return false };
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        let me = self.id();
        let membership = metrics.membership_config.membership();
        let joint = membership.get_joint_config().len() > 1;
        if joint && metrics.current_leader == Some(me) {
            return false;
        }
        let Some(target) = membership.get_joint_config().last() else { return false };
        if target.is_empty() {
            return false;
        }
        !target.contains(&me) && !membership.learner_ids().any(|learner| learner == me)
    }

    /// On the metadata leader: a joint configuration whose change nobody
    /// drives any more (openraft leaves the second step to the caller of
    /// `change_membership`, and a RemoveBroker or join whose caller went
    /// away, or a leader that crashed in between, leaves it half done)
    /// is finished here by moving to its target voters.
    pub(super) fn finish_joint_membership(&self, raft: &Raft) {
        let target = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let joint = metrics.membership_config.membership().get_joint_config();
            if joint.len() < 2 {
                return;
            }
            joint.last().cloned().unwrap_or_default()
        };
        let group = GroupId::Metadata;
        if !self.inner.membership_changes.lock().expect("membership changes").insert(group.clone()) {
            return;
        }
        let (node, raft) = (self.clone(), raft.clone());
        self.spawn(async move {
            if let Err(error) = raft.change_membership(ChangeMembers::ReplaceAllVoters(target), false).await {
                tracing::debug!(error = %write_error(&group, error), "could not finish a joint metadata membership yet");
            }
            node.inner.membership_changes.lock().expect("membership changes").remove(&group);
        });
    }

    /// On the metadata leader: take `broker`, which must hold no replicas,
    /// out of the metadata group and unregister it.
    pub async fn remove_broker(&self, broker: NodeId) -> Result<(), MembershipError> {
        let group = GroupId::Metadata;
        let raft = self.raft(&group).ok_or_else(|| ProposeError::GroupNotHere { group: group.clone() })?;
        if !self.is_metadata_leader().await {
            let leader = self.metadata_leader().await;
            return Err(ProposeError::NotLeader {
                group,
                leader: leader.as_ref().map(|l| l.0),
                address: leader.map(|l| l.1),
            }
            .into());
        }
        if voters(&raft).iter().all(|voter| *voter == broker) {
            return Err(MembershipError::LastBroker { broker });
        }
        let _leaving = self.begin_broker_change(broker, BrokerChange::Leaving)?;
        // Marked draining first, in the metadata: should this removal be cut
        // short after the membership change (its caller went away, or this
        // broker lost the lead), a join finding the broker out of the
        // membership but registered takes it for removed, not for a joiner
        // whose learner entry was lost (see `accept_join`).
        if !self.metadata().brokers().get(&BrokerId(broker)).is_some_and(|known| known.draining) {
            let drain = MetadataCommand::DrainBroker { broker: BrokerId(broker) };
            match self.propose(&group, Command::Metadata(drain)).await? {
                Response::Metadata(Ok(_)) => {}
                Response::Metadata(Err(rejection)) => return Err(MembershipError::Rejected(rejection)),
                other => unreachable!("the metadata group answered {other:?}"),
            }
        }
        // Check first (on a copy), so a refused removal changes no membership.
        let command = MetadataCommand::RemoveBroker { broker: BrokerId(broker) };
        if let Err(rejection) = MetadataState::clone(&self.metadata()).apply(self.clock().now(), &command) {
            return Err(MembershipError::Rejected(rejection));
        }
        // Name only this broker: a change computed from a copy of the voters
        // could undo a concurrent addition.
        let change = if voters(&raft).contains(&broker) {
            Some(ChangeMembers::RemoveVoters(BTreeSet::from([broker])))
        } else if names(&raft, broker) {
            Some(ChangeMembers::RemoveNodes(BTreeSet::from([broker])))
        } else {
            None
        };
        if let Some(change) = change {
            raft.change_membership(change, false).await.map_err(|e| write_error(&group, e))?;
        }
        match self.propose(&group, Command::Metadata(command)).await? {
            Response::Metadata(Ok(MetadataOutcome::BrokerRemoved { .. })) => Ok(()),
            Response::Metadata(Ok(other)) => unreachable!("RemoveBroker applied as {other:?}"),
            Response::Metadata(Err(rejection)) => Err(MembershipError::Rejected(rejection)),
            other => unreachable!("the metadata group answered {other:?}"),
        }
    }

    /// The metadata leader's id and internal address, as this broker's Raft
    /// membership of the metadata group knows them.
    fn metadata_leader_internal(&self, raft: &Raft) -> (Option<NodeId>, Option<String>) {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader;
        let address = leader.and_then(|l| metrics.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
        (leader, address)
    }

    /// On the metadata leader: take a broker's join (see [`Node::add_broker`]).
    pub(super) async fn accept_join(&self, request: JoinRequest) -> Result<(), JoinRefusal> {
        let raft = self.raft(&GroupId::Metadata).ok_or_else(|| JoinRefusal::Retry("no metadata group yet".into()))?;
        let (leader, internal_address) = self.metadata_leader_internal(&raft);
        if leader != Some(self.id()) {
            return Err(JoinRefusal::NotLeader { leader, internal_address });
        }
        if request.broker == 0 {
            return Err(JoinRefusal::Refused("broker id 0 is reserved: give the broker an id of 1 or more".into()));
        }
        tracing::debug!(broker = request.broker, rejoin = request.rejoin, "a broker asks to join");
        // Removed: the membership no longer names it, and the registry
        // does not either (RemoveBroker ends with the registration; a broker
        // whose learner entry was lost is still registered: sim seed
        // 220008084) or marks it draining (a removal drains first: one cut
        // short after its membership change left the registration).
        let removed = |node: &Node| {
            !names(&raft, request.broker)
                && node.metadata().brokers().get(&BrokerId(request.broker)).is_none_or(|broker| broker.draining)
        };
        if request.rejoin && removed(self) {
            // Refused for good only by a leader a quorum confirms: one cut
            // off may lack the entries that added the broker.
            if raft.ensure_linearizable().await.is_err() {
                let (leader, internal_address) = self.metadata_leader_internal(&raft);
                return match leader {
                    Some(leader) if leader != self.id() => {
                        Err(JoinRefusal::NotLeader { leader: Some(leader), internal_address })
                    }
                    _ => Err(JoinRefusal::Retry("the metadata leader could not confirm its lead; retry".into())),
                };
            }
        }
        if request.rejoin && removed(self) {
            return Err(JoinRefusal::Refused(format!(
                "broker {} was removed from the cluster: it does not add itself back; to bring it back as a new \
                 member, empty its data directory and start it with --join",
                request.broker
            )));
        }
        match self.add_broker(request.broker, request.address, request.internal_address).await {
            Ok(()) => Ok(()),
            Err(MembershipError::Propose(ProposeError::NotLeader { .. })) => {
                let (leader, internal_address) = self.metadata_leader_internal(&raft);
                Err(JoinRefusal::NotLeader { leader, internal_address })
            }
            Err(error @ (MembershipError::Rejected(_) | MembershipError::LastBroker { .. })) => {
                Err(JoinRefusal::Refused(error.to_string()))
            }
            Err(error) => Err(JoinRefusal::Retry(error.to_string())),
        }
    }

    /// Whether this broker was added to the cluster before, so that a
    /// leader that no longer names it nor registers it removed it: it holds
    /// any of the metadata group's log (entries or a snapshot). A joining
    /// broker is sent the log only once the leader added it as a learner,
    /// which follows its registration (committed first, `add_broker`), and
    /// only a removal ends a registration. The leader refuses a former
    /// member only once neither its membership nor its registry names it:
    /// a learner entry may have been lost while the registration stayed (a
    /// power cut in the middle of the join; sim seed 220008084). Asking
    /// whether its own log names it, as this did before, missed a broker
    /// that was added and removed before it looked: the membership it then
    /// held named it no more, it asked to join as new, and was added back
    /// (sim seeds 280003187, 9100049, 710000317). Asked of the Raft core,
    /// not its metrics, which are empty until the core has loaded the log
    /// after a restart.
    ///
    /// Refused if this broker's metadata group is not running: a broker
    /// that cannot look must not join as new (it may have been a member).
    async fn was_member(&self) -> Result<bool, JoinRefusal> {
        let stopped = |why: String| {
            JoinRefusal::Refused(format!(
                "this broker's metadata group {why}, so it cannot tell whether it was a member; see this broker's \
                 log for the error that stopped it, and restart it"
            ))
        };
        let Some(raft) = self.raft(&GroupId::Metadata) else { return Err(stopped("is not running".into())) };
        // Any log holds a membership (the first entry, or a snapshot's).
        raft.with_raft_state(|state| state.membership_state.effective().log_id().is_some())
            .await
            .map_err(|error| stopped(format!("has stopped ({error})")))
    }

    /// Join the cluster through the broker at `internal_address` (following
    /// it to the metadata leader): returns once this broker is registered,
    /// has caught up and votes. Harmless to repeat; refused for good once the
    /// cluster has removed this broker.
    pub async fn join_cluster(&self, internal_address: String) -> Result<(), JoinRefusal> {
        let mut target = internal_address.clone();
        let mut last = JoinRefusal::Retry("no attempt made".into());
        let mut rejoin = false;
        for _ in 0..JOIN_ATTEMPTS_MAX {
            // Asked again at each attempt: an earlier attempt whose answer
            // was lost may have added this broker, and the operator removed
            // it since; a retry that still said "new broker" was added back
            // (sim seed 9100049).
            rejoin |= self.was_member().await?;
            let request = JoinRequest {
                broker: self.id(),
                address: self.inner.config.advertised.clone(),
                internal_address: self.inner.config.internal_advertised.clone(),
                rejoin,
            };
            match self.inner.peers.join(&target, &request, CATCH_UP_TIMEOUT + Duration::from_secs(5)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(JoinRefusal::NotLeader { internal_address: Some(leader), .. })) => {
                    target = leader;
                    continue;
                }
                Ok(Err(refusal @ JoinRefusal::Refused(_))) => return Err(refusal),
                Ok(Err(refusal)) => last = refusal,
                Err(error) => {
                    last = JoinRefusal::Retry(format!("{target} did not answer: {error}"));
                    // The leader it was sent to may be gone: ask the broker
                    // it was given again, which names the next leader.
                    target = internal_address.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(last)
    }

    /// Keep this broker's registration (its two addresses) current while it
    /// votes in the metadata group: the leader registers itself; the others
    /// ask the leader over the internal transport. A broker removed from the
    /// metadata group does not register again: neither one whose own log
    /// shows it on the way out, nor (the leader checks) one removed while
    /// it was down, whose log never heard of it.
    pub(super) async fn keep_registration(&self, raft: &Raft, leading: bool) {
        let me = self.id();
        if !voters(raft).contains(&me) || self.removed_from_cluster() {
            return;
        }
        let (address, internal_address) =
            (self.inner.config.advertised.clone(), self.inner.config.internal_advertised.clone());
        let current = self.metadata().brokers().get(&BrokerId(me)).cloned();
        if current.is_some_and(|b| b.address == address && b.internal_address == internal_address) {
            return;
        }
        if leading {
            let command = MetadataCommand::RegisterBroker { broker: BrokerId(me), address, internal_address };
            let proposed = self.propose(&GroupId::Metadata, Command::Metadata(command));
            match tokio::time::timeout(super::DUTY_PROPOSAL_TIMEOUT, proposed).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(%error, "could not register this broker yet"),
                Err(_) => tracing::debug!("registering this broker got no answer in time; retrying"),
            }
            return;
        }
        let (_, Some(leader)) = self.metadata_leader_internal(raft) else { return };
        let request = JoinRequest { broker: me, address, internal_address, rejoin: true };
        match self.inner.peers.join(&leader, &request, Duration::from_secs(5)).await {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => tracing::debug!(%refusal, "the metadata leader did not register this broker yet"),
            Err(error) => tracing::debug!(%error, "could not reach the metadata leader to register"),
        }
    }

    /// The placement of a running partition group, or `None` if its topic
    /// (with this id) is gone.
    pub(super) fn placement_of<'m>(
        metadata: &'m MetadataState,
        group: &GroupId,
    ) -> Option<&'m keel_core::placement::PartitionPlacement> {
        let GroupId::Partition(partition, topic_id) = group else { return None };
        let topic = metadata.topic(&partition.topic).filter(|t| t.id == *topic_id)?;
        topic.partitions.get(partition.partition.0 as usize)
    }

    /// The next step of a group led here towards its placement, if any.
    fn convergence(metadata: &MetadataState, group: &GroupId, raft: &Raft) -> Option<Convergence> {
        let placement = Self::placement_of(metadata, group)?;
        let GroupId::Partition(partition, topic_id) = group else { return None };
        let target: BTreeSet<NodeId> = placement.replicas.iter().map(|b| b.0).collect();
        if voters(raft) != target {
            let addresses = placement
                .replicas
                .iter()
                .map(|b| (b.0, metadata.brokers().get(b).map(|i| i.internal_address.clone()).unwrap_or_default()))
                .collect();
            return Some(Convergence::ChangeVoters(addresses));
        }
        let (nodes, committed) = nodes(raft);
        if nodes != target {
            return Some(Convergence::RemoveLearners(nodes.difference(&target).copied().collect()));
        }
        let moved: BTreeMap<NodeId, BasicNode> = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            placement
                .replicas
                .iter()
                .filter_map(|b| {
                    let registered = metadata.brokers().get(b)?.internal_address.clone();
                    let known = membership.get_node(&b.0)?;
                    (known.addr != registered).then_some((b.0, BasicNode { addr: registered }))
                })
                .collect()
        };
        if !moved.is_empty() {
            return Some(Convergence::UpdateAddresses(moved));
        }
        // Also the first time a group runs with its placement: until the
        // metadata knows it started, the partition is not moved.
        if committed && (!placement.leaving.is_empty() || !placement.started) {
            return Some(Convergence::ReportSettled(MoveSettledReport {
                topic: partition.topic.to_string(),
                topic_id: *topic_id,
                partition: partition.partition.0,
                epoch: placement.epoch,
            }));
        }
        None
    }

    /// Record in a partition group this broker leads that its membership
    /// now follows the placement of `epoch`. Refused if the group already
    /// followed a newer one: this broker's metadata lags (it restarted with
    /// an old placement), and the change would move the group back onto
    /// brokers that no longer run it (simulation seed 154 before the fix:
    /// a partition without a leader for good).
    async fn follow_placement(&self, group: &GroupId, epoch: u64) -> Result<(), String> {
        let command = Command::Partition(PartitionCommand::FollowPlacement { epoch });
        match self.propose(group, command).await.map_err(|e| e.to_string())? {
            Response::Partition(Ok(_)) => Ok(()),
            Response::Partition(Err(rejection)) => Err(rejection.to_string()),
            other => Err(format!("group {group} answered {other:?}")),
        }
    }

    /// Tell the metadata leader (this broker, or another over the internal
    /// transport) that a partition's moves have settled.
    async fn report_settled(&self, report: MoveSettledReport) -> Result<(), String> {
        let raft = self.raft(&GroupId::Metadata).ok_or("no metadata group")?;
        let (leader, address) = self.metadata_leader_internal(&raft);
        if leader == Some(self.id()) {
            return self.accept_move_settled(report).await.map_err(|e| e.to_string());
        }
        let address = address.ok_or("no metadata leader is known yet")?;
        match self.inner.peers.report_settled(&address, &report).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refusal)) => Err(refusal.to_string()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// On the metadata leader: record that a partition's moves settled.
    pub(super) async fn accept_move_settled(&self, report: MoveSettledReport) -> Result<(), JoinRefusal> {
        let raft = self.raft(&GroupId::Metadata).ok_or_else(|| JoinRefusal::Retry("no metadata group yet".into()))?;
        let (leader, internal_address) = self.metadata_leader_internal(&raft);
        if leader != Some(self.id()) {
            return Err(JoinRefusal::NotLeader { leader, internal_address });
        }
        // A report this leader's metadata already contradicts (another
        // epoch, another incarnation) is refused here, and one it already
        // took (nothing leaving, the group known to run) is done, so
        // that a lagging reporter does not fill the log with rejections.
        let current = self.metadata().topics().iter().find_map(|(name, topic)| {
            (name.as_str() == report.topic && topic.id == report.topic_id)
                .then(|| {
                    topic
                        .partitions
                        .get(report.partition as usize)
                        .map(|p| (p.epoch, p.leaving.is_empty() && p.started))
                })
                .flatten()
        });
        match current {
            Some((epoch, settled)) if epoch == report.epoch => {
                if settled {
                    return Ok(());
                }
            }
            _ => {
                let stale = format!("the report on {}/{} is stale", report.topic, report.partition);
                return Err(JoinRefusal::Refused(stale));
            }
        }
        self.settle_gathered(report).await
    }

    /// On every partition group this broker leads whose voters differ from
    /// its placement: start a membership change (one at a time per group).
    pub(super) fn converge_partition_memberships(&self) {
        let metadata = self.metadata();
        let mut converged = self.inner.converged.lock().expect("converged");
        let known = std::mem::take(&mut converged.groups);
        let known = match &converged.metadata {
            Some(seen) if Arc::ptr_eq(seen, &metadata) => known,
            _ => BTreeMap::new(),
        };
        converged.metadata = Some(metadata.clone());
        let groups: Vec<(GroupId, Raft)> = self
            .inner
            .groups
            .lock()
            .expect("groups")
            .iter()
            .filter(|(g, _)| **g != GroupId::Metadata)
            .map(|(g, h)| (g.clone(), h.raft.clone()))
            .collect();
        for (group, raft) in groups {
            let Some(led) = led_as_voter(&raft, self.id()) else { continue };
            if known.get(&group) == Some(&led) {
                converged.groups.insert(group, led);
                continue;
            }
            let Some(step) = Self::convergence(&metadata, &group, &raft) else {
                converged.groups.insert(group, led);
                continue;
            };
            let Some(epoch) = Self::placement_of(&metadata, &group).map(|p| p.epoch) else { continue };
            if !self.inner.membership_changes.lock().expect("membership changes").insert(group.clone()) {
                continue;
            }
            let node = self.clone();
            self.spawn(async move {
                // Every change of the membership is fenced by the placement
                // it follows (a lagging metadata replica proposes an older
                // epoch, and the group refuses it); reporting is fenced by
                // the metadata leader instead.
                let fenced = match step {
                    Convergence::ReportSettled(_) => Ok(()),
                    _ => node.follow_placement(&group, epoch).await,
                };
                let result = match (fenced, step) {
                    (Err(error), _) => Err(error),
                    (Ok(()), Convergence::ChangeVoters(addresses)) => {
                        change_voters(&group, &raft, addresses).await.map_err(|e| e.to_string())
                    }
                    (Ok(()), Convergence::RemoveLearners(learners)) => raft
                        .change_membership(ChangeMembers::RemoveNodes(learners), false)
                        .await
                        .map(|_| ())
                        .map_err(|e| write_error(&group, e).to_string()),
                    (Ok(()), Convergence::UpdateAddresses(nodes)) => raft
                        .change_membership(ChangeMembers::SetNodes(nodes), false)
                        .await
                        .map(|_| ())
                        .map_err(|e| write_error(&group, e).to_string()),
                    (Ok(()), Convergence::ReportSettled(report)) => node.report_settled(report).await,
                };
                if let Err(error) = result {
                    tracing::info!(%error, %group, "moving replicas did not finish yet; retrying");
                }
                node.inner.membership_changes.lock().expect("membership changes").remove(&group);
            });
        }
    }
}

/// Make `target` the group's voters: learners first, then joint consensus.
async fn change_voters(group: &GroupId, raft: &Raft, target: BTreeMap<NodeId, String>) -> Result<(), MembershipError> {
    for (node, address) in &target {
        add_learner_and_catch_up(group, raft, *node, address.clone()).await?;
    }
    let voters: BTreeSet<NodeId> = target.keys().copied().collect();
    raft.change_membership(ChangeMembers::ReplaceAllVoters(voters), false).await.map_err(|e| write_error(group, e))?;
    Ok(())
}

/// Whether a running group that is no longer placed here may stop: its
/// topic is gone (its data then goes); or its own membership no longer
/// names this broker and that membership is committed (applied here); or
/// the metadata no longer names this broker even as leaving, which it
/// stops doing only once the group's leader reported its membership
/// settled without this broker (`MoveSettled`): that membership is
/// committed in the group, whether or not this replica heard of it. The
/// stopped replica keeps its data (a move back reopens it). A replica cut
/// off before the final membership reached it would otherwise stand for
/// election in the joint one forever and answer reads from its old state
/// (simulation seed 25: a deleted group's position read back for 10 s).
pub(super) fn may_stop(metadata: &MetadataState, group: &GroupId, raft: &Raft, me: NodeId) -> bool {
    let Some(placement) = Node::placement_of(metadata, group) else { return true };
    let me_broker = keel_core::BrokerId(me);
    if !placement.replicas.contains(&me_broker) && !placement.leaving.contains(&me_broker) {
        return true;
    }
    let (_, committed) = nodes(raft);
    committed && !names(raft, me)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_joins_or_leaves_one_change_at_a_time() {
        let changes = BrokerChanges::default();
        let joining = changes.begin(4, BrokerChange::Joining).expect("the first change of broker 4");
        // A removal of the same broker while it joins is refused as busy,
        // and says what is under way.
        match changes.begin(4, BrokerChange::Leaving) {
            Err(MembershipError::Busy { broker: 4, change: BrokerChange::Joining }) => {}
            other => panic!("expected Busy joining, got {:?}", other.map(|_| ())),
        }
        // So is a second join (a retry while the first is still running).
        assert!(matches!(changes.begin(4, BrokerChange::Joining), Err(MembershipError::Busy { .. })));
        // Another broker's change goes ahead.
        let other = changes.begin(5, BrokerChange::Leaving).expect("broker 5 is not changing");
        // Once the join ends (its request answered or dropped), the removal may begin.
        drop(joining);
        let leaving = changes.begin(4, BrokerChange::Leaving).expect("broker 4's join has ended");
        drop((leaving, other));
        assert!(changes.0.lock().expect("broker changes").is_empty(), "every change ended");
    }
}
