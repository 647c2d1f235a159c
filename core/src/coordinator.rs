//! Group coordination: member sessions as soft state.
//!
//! The coordinator (the metadata group's leader) keeps one session deadline
//! per member in memory. Heartbeats extend it; they are never Raft writes.
//! Liveness is judged on the coordinator's monotonic clock (`now`, passed
//! in), never a member's, and never a wall clock: a step of the wall clock
//! must neither keep a dead member nor expire live ones. When a deadline passes, [`GroupSessions::expired`] names the
//! members to remove, as [`MetadataCommand::ExpireMembers`] commands the
//! leader proposes and stamps. A new leader calls
//! [`GroupSessions::grant_fresh_sessions`] so that no member is expired for
//! heartbeats the old leader received.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::{Generation, GroupName, MemberId, MonotonicMs};
use crate::metadata::{MetadataCommand, MetadataState};

/// One member's session on this coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    member_epoch: u64,
    deadline: MonotonicMs,
}

/// The answer to a heartbeat from a known member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HeartbeatReply {
    /// The member is current; keep going.
    Current { generation: Generation },
    /// The group moved to another generation: fetch the new assignment
    /// (rejoin) before polling again.
    RebalanceRequired { generation: Generation },
}

/// Why a heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum HeartbeatError {
    #[error("group {group} does not exist: join it first")]
    UnknownGroup { group: GroupName },
    #[error("member {member} is not in group {group} (its session may have expired): join again")]
    UnknownMember { group: GroupName, member: MemberId },
    /// The member id joined again (another process, or a later join of this
    /// one): the holder of the older epoch is fenced.
    #[error(
        "member {member} of group {group} joined again with member epoch {current}; this process holds epoch {given} \
         and is fenced: stop it, or give each process its own member id"
    )]
    Fenced { group: GroupName, member: MemberId, current: u64, given: u64 },
    /// The member's epoch is newer than this coordinator knows: its join is
    /// not applied here yet.
    #[error(
        "member {member} of group {group} joined with epoch {given}, newer than this coordinator knows: retry shortly"
    )]
    EpochAhead { group: GroupName, member: MemberId, given: u64 },
}

/// Session deadlines of every member of every group, on the coordinator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSessions {
    sessions: BTreeMap<GroupName, BTreeMap<MemberId, Session>>,
}

impl GroupSessions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget every session and give every current member a full session
    /// from `now`. Call on becoming leader.
    pub fn grant_fresh_sessions(&mut self, metadata: &MetadataState, now: MonotonicMs) {
        self.sessions.clear();
        self.sync(metadata, now);
    }

    /// Follow the metadata: start a session for each new membership (a full
    /// timeout from `now`) and drop sessions of members that are gone.
    /// Call after every applied metadata command.
    pub fn sync(&mut self, metadata: &MetadataState, now: MonotonicMs) {
        self.sessions.retain(|group, _| metadata.group(group).is_some_and(|g| !g.members.is_empty()));
        for (group, info) in metadata.groups().iter() {
            if info.members.is_empty() {
                continue;
            }
            let sessions = self.sessions.entry(group.clone()).or_default();
            sessions.retain(|member, session| {
                info.members.get(member).is_some_and(|m| m.member_epoch == session.member_epoch)
            });
            for (member, member_info) in &info.members {
                sessions.entry(member.clone()).or_insert(Session {
                    member_epoch: member_info.member_epoch,
                    deadline: now.plus_ms(member_info.session_timeout_ms),
                });
            }
        }
    }

    /// A heartbeat from `member` of `group`, joined with `member_epoch`,
    /// that believes it is in `generation`, received at `now`: extend its
    /// session. A heartbeat of an older epoch keeps nothing alive.
    pub fn heartbeat(
        &mut self,
        metadata: &MetadataState,
        group: &GroupName,
        member: &MemberId,
        member_epoch: u64,
        generation: Generation,
        now: MonotonicMs,
    ) -> Result<HeartbeatReply, HeartbeatError> {
        let Some(info) = metadata.group(group) else {
            return Err(HeartbeatError::UnknownGroup { group: group.clone() });
        };
        let Some(member_info) = info.members.get(member) else {
            return Err(HeartbeatError::UnknownMember { group: group.clone(), member: member.clone() });
        };
        if member_epoch > member_info.member_epoch {
            return Err(HeartbeatError::EpochAhead {
                group: group.clone(),
                member: member.clone(),
                given: member_epoch,
            });
        }
        if member_epoch < member_info.member_epoch {
            return Err(HeartbeatError::Fenced {
                group: group.clone(),
                member: member.clone(),
                current: member_info.member_epoch,
                given: member_epoch,
            });
        }
        let session =
            Session { member_epoch: member_info.member_epoch, deadline: now.plus_ms(member_info.session_timeout_ms) };
        self.sessions.entry(group.clone()).or_default().insert(member.clone(), session);
        if generation == info.generation {
            Ok(HeartbeatReply::Current { generation })
        } else {
            Ok(HeartbeatReply::RebalanceRequired { generation: info.generation })
        }
    }

    /// Commands that remove every member whose session ended by `now`, one
    /// per group, in group order.
    pub fn expired(&self, now: MonotonicMs) -> Vec<MetadataCommand> {
        self.sessions
            .iter()
            .filter_map(|(group, sessions)| {
                let members: Vec<(String, u64)> = sessions
                    .iter()
                    .filter(|(_, s)| s.deadline <= now)
                    .map(|(member, s)| (member.as_str().to_string(), s.member_epoch))
                    .collect();
                (!members.is_empty())
                    .then(|| MetadataCommand::ExpireMembers { group: group.as_str().to_string(), members })
            })
            .collect()
    }

    /// The earliest session deadline: when to call [`Self::expired`] next.
    pub fn next_deadline(&self) -> Option<MonotonicMs> {
        self.sessions.values().flat_map(|s| s.values()).map(|s| s.deadline).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignor::AssignorKind;
    use crate::limits::Limits;
    use crate::TimestampMs;

    fn join(metadata: &mut MetadataState, member: &str, at: u64) {
        let command = MetadataCommand::JoinGroup {
            group: "g".into(),
            member: member.into(),
            topics: vec!["t".into()],
            session_timeout_ms: 10_000,
            assignor: Some(AssignorKind::StickyBalanced),
        };
        metadata.apply(TimestampMs(at), &command).unwrap();
    }

    fn epoch(metadata: &MetadataState, member: &str) -> u64 {
        let group = metadata.group(&GroupName::new("g").unwrap()).unwrap();
        group.members[&MemberId::new(member).unwrap()].member_epoch
    }

    fn names(commands: &[MetadataCommand]) -> Vec<String> {
        commands
            .iter()
            .flat_map(|c| match c {
                MetadataCommand::ExpireMembers { members, .. } => members.iter().map(|(m, _)| m.clone()).collect(),
                _ => vec![],
            })
            .collect()
    }

    #[test]
    fn silent_members_expire_and_heartbeats_keep_members_alive() {
        let mut metadata = MetadataState::new(Limits::default());
        metadata
            .apply(
                TimestampMs(0),
                &MetadataCommand::RegisterBroker {
                    broker: crate::BrokerId(1),
                    address: "b1:1".into(),
                    internal_address: "b1:2".into(),
                },
            )
            .unwrap();
        let create = MetadataCommand::CreateTopic {
            topic: "t".into(),
            partitions: 2,
            replication_factor: 1,
            retention: Default::default(),
        };
        metadata.apply(TimestampMs(0), &create).unwrap();
        join(&mut metadata, "a", 0);
        join(&mut metadata, "b", 0);
        let mut sessions = GroupSessions::new();
        sessions.sync(&metadata, MonotonicMs(0));
        assert_eq!(sessions.next_deadline(), Some(MonotonicMs(10_000)));
        let (group, a) = (GroupName::new("g").unwrap(), MemberId::new("a").unwrap());
        let generation = metadata.group(&group).unwrap().generation;
        let reply =
            sessions.heartbeat(&metadata, &group, &a, epoch(&metadata, "a"), generation, MonotonicMs(9_000)).unwrap();
        assert_eq!(reply, HeartbeatReply::Current { generation });
        assert!(sessions.expired(MonotonicMs(9_999)).is_empty());
        let expired = sessions.expired(MonotonicMs(10_000));
        assert_eq!(names(&expired), vec!["b".to_string()]);
        for command in &expired {
            metadata.apply(TimestampMs(10_000), command).unwrap();
        }
        sessions.sync(&metadata, MonotonicMs(10_000));
        assert_eq!(sessions.next_deadline(), Some(MonotonicMs(19_000)));
        let stale = sessions
            .heartbeat(&metadata, &group, &a, epoch(&metadata, "a"), Generation(0), MonotonicMs(10_001))
            .unwrap();
        assert_eq!(stale, HeartbeatReply::RebalanceRequired { generation: metadata.group(&group).unwrap().generation });
    }

    #[test]
    fn a_new_leader_grants_fresh_sessions() {
        let mut metadata = MetadataState::new(Limits::default());
        join(&mut metadata, "a", 0);
        let mut sessions = GroupSessions::new();
        sessions.grant_fresh_sessions(&metadata, MonotonicMs(50_000));
        assert!(sessions.expired(MonotonicMs(59_999)).is_empty());
        assert_eq!(names(&sessions.expired(MonotonicMs(60_000))), vec!["a".to_string()]);
    }

    #[test]
    fn unknown_groups_and_members_are_told_to_join() {
        let mut metadata = MetadataState::new(Limits::default());
        let mut sessions = GroupSessions::new();
        let (group, member) = (GroupName::new("g").unwrap(), MemberId::new("a").unwrap());
        assert!(matches!(
            sessions.heartbeat(&metadata, &group, &member, 1, Generation(0), MonotonicMs(0)),
            Err(HeartbeatError::UnknownGroup { .. })
        ));
        join(&mut metadata, "b", 0);
        assert!(matches!(
            sessions.heartbeat(&metadata, &group, &member, 1, Generation(0), MonotonicMs(0)),
            Err(HeartbeatError::UnknownMember { .. })
        ));
    }

    #[test]
    fn an_expiry_decided_before_a_rejoin_spares_the_new_membership() {
        let mut metadata = MetadataState::new(Limits::default());
        join(&mut metadata, "a", 0);
        let mut sessions = GroupSessions::new();
        sessions.sync(&metadata, MonotonicMs(0));
        let expired = sessions.expired(MonotonicMs(10_000));
        // The member leaves and rejoins before the expiry is applied.
        metadata
            .apply(TimestampMs(10_000), &MetadataCommand::LeaveGroup { group: "g".into(), member: "a".into() })
            .unwrap();
        join(&mut metadata, "a", 10_000);
        for command in &expired {
            let outcome = metadata.apply(TimestampMs(10_001), command).unwrap();
            assert!(
                matches!(outcome, crate::metadata::MetadataOutcome::MembersExpired { ref expired, .. } if expired.is_empty())
            );
        }
        assert_eq!(metadata.group(&GroupName::new("g").unwrap()).unwrap().members.len(), 1);
    }
}

#[cfg(test)]
mod epoch_tests {
    use super::*;
    use crate::assignor::AssignorKind;
    use crate::limits::Limits;
    use crate::TimestampMs;

    #[test]
    fn a_heartbeat_of_an_older_join_is_fenced_and_keeps_nothing_alive() {
        let mut metadata = MetadataState::new(Limits::default());
        let join = MetadataCommand::JoinGroup {
            group: "g".into(),
            member: "a".into(),
            topics: vec!["t".into()],
            session_timeout_ms: 10_000,
            assignor: Some(AssignorKind::StickyBalanced),
        };
        metadata.apply(TimestampMs(0), &join).unwrap();
        // The same member id joins again (another process): a new epoch.
        metadata.apply(TimestampMs(1), &join).unwrap();
        let group = GroupName::new("g").unwrap();
        let member = MemberId::new("a").unwrap();
        let current = metadata.group(&group).unwrap().members[&member].member_epoch;
        let mut sessions = GroupSessions::new();
        sessions.sync(&metadata, MonotonicMs(0));
        let stale = sessions.heartbeat(&metadata, &group, &member, current - 1, Generation(0), MonotonicMs(9_000));
        assert!(matches!(stale, Err(HeartbeatError::Fenced { given, .. }) if given == current - 1));
        // The zombie's heartbeat did not extend the session.
        assert_eq!(sessions.next_deadline(), Some(MonotonicMs(10_000)));
        assert!(sessions.heartbeat(&metadata, &group, &member, current, Generation(0), MonotonicMs(9_000)).is_ok());
    }
}
