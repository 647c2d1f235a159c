//! Group administration: describe a group, read a group's position on a
//! partition, reset it while the group has no members.

use keel_core::metadata::MetadataCommand;
use keel_core::partition::{PartitionCommand, PartitionOutcome};
use keel_core::{GroupName, Offset};
use keel_proto::v1 as pb;
use tonic::Status;

use super::errors::invalid_name;
use super::service::KeelService;

impl KeelService {
    pub(super) async fn describe_group_request(
        &self,
        request: pb::DescribeGroupRequest,
    ) -> Result<pb::DescribeGroupResponse, Status> {
        let group = GroupName::new(request.group).map_err(invalid_name)?;
        let metadata = self.node.metadata();
        let Some(info) = metadata.group(&group) else {
            return Err(self.missing(format!("group {group} does not exist")).await);
        };
        let members = info
            .members
            .iter()
            .map(|(member, m)| pb::GroupMember {
                member: member.to_string(),
                topics: m.topics.iter().map(ToString::to_string).collect(),
                partitions: info
                    .partitions_of(member)
                    .into_iter()
                    .map(|p| pb::TopicPartition {
                        topic_id: metadata.topic(&p.topic).map_or(0, |t| t.id),
                        topic: p.topic.to_string(),
                        partition: p.partition.0,
                    })
                    .collect(),
            })
            .collect();
        Ok(pb::DescribeGroupResponse {
            group: group.to_string(),
            generation: info.generation.0,
            members,
            assignor: super::consumer::assignor_name(info.assignor).into(),
        })
    }

    /// Every group in this broker's metadata, by name (bounded by the
    /// cluster's groups limit) that `caller` may describe.
    pub(super) fn list_groups_request(&self, caller: &super::Caller) -> pb::ListGroupsResponse {
        let metadata = self.node.metadata();
        let groups = metadata
            .groups()
            .iter()
            .filter(|(name, _)| {
                let describe =
                    keel_core::access::Permission::group(name.as_str(), keel_core::access::Operation::Describe);
                self.may(caller, &describe)
            })
            .map(|(name, info)| {
                let topics: std::collections::BTreeSet<String> =
                    info.members.values().flat_map(|m| m.topics.iter().map(ToString::to_string)).collect();
                pb::GroupSummary {
                    group: name.to_string(),
                    generation: info.generation.0,
                    members: info.members.len() as u32,
                    topics: topics.into_iter().collect(),
                }
            })
            .collect();
        pb::ListGroupsResponse { groups }
    }

    pub(super) async fn group_position_request(
        &self,
        request: pb::GroupPositionRequest,
    ) -> Result<pb::GroupPositionResponse, Status> {
        let group = GroupName::new(request.group).map_err(invalid_name)?;
        let partition = self.partition(&request.topic, request.partition).await?;
        // Read on the leader after a read index: a replica restarted with
        // entries it has not applied yet (the commit index is not synced)
        // would answer a position that a committed forget or ack already
        // replaced, for as long as its group has no leader (sim seed
        // 160008958: a deleted group's position "stayed" for 12 s).
        self.confirm_leadership(&partition).await?;
        let state = self.node.partition(&partition).ok_or_else(|| self.hosted_elsewhere(&partition))?;
        let committed = state.groups().get(&group).and_then(|g| g.position).is_some();
        Ok(pb::GroupPositionResponse {
            position: state.group_position(&group).0,
            committed,
            log_start: state.log_start().0,
            high_watermark: state.high_watermark().0,
        })
    }

    pub(super) async fn reset_group_position_request(
        &self,
        request: pb::ResetGroupPositionRequest,
    ) -> Result<pb::ResetGroupPositionResponse, Status> {
        let group = GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        let metadata = self.node.metadata();
        let partition = self.partition(&request.topic, request.partition).await?;
        if metadata.group(&group).is_some_and(|g| !g.members.is_empty()) {
            return Err(Status::failed_precondition(format!(
                "group {group} has members: stop them (or wait for their sessions to expire) before resetting"
            )));
        }
        // Earliest and latest are read from this replica's state: it must
        // lead and have applied everything committed, or a new leader's
        // stale high watermark would move the position back past acks it
        // has not applied yet.
        if matches!(
            request.to,
            Some(pb::reset_group_position_request::To::Earliest(_) | pb::reset_group_position_request::To::Latest(_))
        ) {
            self.confirm_leadership(&partition).await?;
        }
        let state = self.node.partition(&partition).ok_or_else(|| self.hosted_elsewhere(&partition))?;
        let position = match request.to {
            Some(pb::reset_group_position_request::To::Earliest(_)) => state.log_start(),
            Some(pb::reset_group_position_request::To::Latest(_)) => state.high_watermark(),
            Some(pb::reset_group_position_request::To::Offset(offset)) => Offset(offset),
            Some(pb::reset_group_position_request::To::Forget(_)) => {
                let command = PartitionCommand::ForgetGroup { group: request.group };
                return match self.propose_partition(&partition, command).await? {
                    PartitionOutcome::GroupForgotten { had_position } => {
                        Ok(pb::ResetGroupPositionResponse { position: state.log_start().0, had_position })
                    }
                    other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
                };
            }
            None => return Err(Status::invalid_argument("say where to reset to: earliest, latest or an offset")),
        };
        #[cfg(madsim)]
        if keel_core::planted::is_planted(keel_core::planted::Bug::ResetAnsweredNotApplied) {
            return Ok(pb::ResetGroupPositionResponse { position: position.0, had_position: true });
        }
        match self
            .propose_partition(&partition, PartitionCommand::ResetPosition { group: request.group, position })
            .await?
        {
            PartitionOutcome::PositionReset { position } => {
                Ok(pb::ResetGroupPositionResponse { position: position.0, had_position: true })
            }
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// Forget a group with no members in the metadata (its positions were
    /// forgotten partition by partition before).
    pub(super) async fn delete_group_request(
        &self,
        request: pb::DeleteGroupRequest,
    ) -> Result<pb::DeleteGroupResponse, Status> {
        GroupName::new(request.group.as_str()).map_err(invalid_name)?;
        self.propose_metadata(MetadataCommand::DeleteGroup { group: request.group }).await?;
        Ok(pb::DeleteGroupResponse {})
    }
}
