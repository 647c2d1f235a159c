//! `keel.v1.Keel`: every RPC is timed, its caller authenticated, and what
//! it needs checked against the access rules before it runs.

use std::future::Future;

use keel_core::access::{Operation, Permission};
use keel_proto::v1 as pb;
use keel_proto::v1::keel_server::Keel;
use tonic::{Request, Response, Status};

use super::access::Caller;
use super::service::KeelService;

impl KeelService {
    /// Run `rpc`: time it, learn who sent it, refuse it unless the caller
    /// may do all it `needs`, then `call` it.
    async fn guarded<Q, T, F>(
        &self,
        rpc: &'static str,
        request: Request<Q>,
        needs: impl FnOnce(&Q) -> Vec<Permission>,
        call: impl FnOnce(Caller, Request<Q>) -> F,
    ) -> Result<Response<T>, Status>
    where
        F: Future<Output = Result<Response<T>, Status>>,
    {
        self.timed(rpc, async move {
            let caller = self.confirmed(|| self.caller(&request)).await?;
            let needed = needs(request.get_ref());
            self.confirmed(|| self.allow(rpc, &caller, &needed)).await?;
            call(caller, request).await
        })
        .await
    }
}

fn topic(name: &str, operation: Operation) -> Vec<Permission> {
    vec![Permission::topic(name, operation)]
}

fn group(name: &str, operation: Operation) -> Vec<Permission> {
    vec![Permission::group(name, operation)]
}

fn cluster(operation: Operation) -> Vec<Permission> {
    vec![Permission::cluster(operation)]
}

/// A member of `group_name` reading `topic_name`.
fn member_reading(group_name: &str, topic_name: &str) -> Vec<Permission> {
    vec![Permission::group(group_name, Operation::Join), Permission::topic(topic_name, Operation::Consume)]
}

fn nothing<Q>(_: &Q) -> Vec<Permission> {
    Vec::new()
}

#[tonic::async_trait]
impl Keel for KeelService {
    async fn allocate_producer_id(
        &self,
        request: Request<pb::AllocateProducerIdRequest>,
    ) -> Result<Response<pb::AllocateProducerIdResponse>, Status> {
        self.guarded("AllocateProducerId", request, nothing, |caller, request| async move {
            self.confirmed(|| self.allow_somewhere("AllocateProducerId", &caller, Operation::Produce)).await?;
            self.allocate_producer_id_call(request).await
        })
        .await
    }

    async fn produce(&self, request: Request<pb::ProduceRequest>) -> Result<Response<pb::ProduceResponse>, Status> {
        self.guarded("Produce", request, |r| topic(&r.topic, Operation::Produce), |_, r| self.produce_call(r)).await
    }

    type ProduceStreamStream = super::produce_stream::ProduceAnswers;

    async fn produce_stream(
        &self,
        request: Request<tonic::Streaming<pb::ProduceStreamRequest>>,
    ) -> Result<Response<Self::ProduceStreamStream>, Status> {
        // Each request of the stream is authorised on its own, and a user's
        // secret checked again.
        let presented = super::access::presented_secret(&request);
        // The stream itself stays out of the check (it is not Sync).
        let (metadata, extensions, incoming) = request.into_parts();
        let head = Request::from_parts(metadata, extensions, ());
        let caller = self.confirmed(|| self.caller(&head)).await?;
        Ok(Response::new(self.open_produce_stream(caller, presented, incoming)))
    }

    async fn read(&self, request: Request<pb::ReadRequest>) -> Result<Response<pb::ReadResponse>, Status> {
        self.guarded("Read", request, |r| topic(&r.topic, Operation::Consume), |_, r| self.read_call(r)).await
    }

    async fn create_topic(
        &self,
        request: Request<pb::CreateTopicRequest>,
    ) -> Result<Response<pb::CreateTopicResponse>, Status> {
        let needs = |r: &pb::CreateTopicRequest| topic(&r.topic, Operation::Create);
        self.guarded("CreateTopic", request, needs, |_, r| self.create_topic_call(r)).await
    }

    async fn delete_topic(
        &self,
        request: Request<pb::DeleteTopicRequest>,
    ) -> Result<Response<pb::DeleteTopicResponse>, Status> {
        let needs = |r: &pb::DeleteTopicRequest| topic(&r.topic, Operation::Delete);
        self.guarded("DeleteTopic", request, needs, |_, r| self.delete_topic_call(r)).await
    }

    async fn alter_topic(
        &self,
        request: Request<pb::AlterTopicRequest>,
    ) -> Result<Response<pb::AlterTopicResponse>, Status> {
        let needs = |r: &pb::AlterTopicRequest| topic(&r.topic, Operation::Alter);
        self.guarded("AlterTopic", request, needs, |_, r| self.alter_topic_call(r)).await
    }

    async fn list_topics(
        &self,
        request: Request<pb::ListTopicsRequest>,
    ) -> Result<Response<pb::ListTopicsResponse>, Status> {
        // Lists what the caller may describe.
        self.guarded("ListTopics", request, nothing, |caller, r| async move { self.list_topics_call(&caller, r).await })
            .await
    }

    async fn describe_topic(
        &self,
        request: Request<pb::DescribeTopicRequest>,
    ) -> Result<Response<pb::DescribeTopicResponse>, Status> {
        let needs = |r: &pb::DescribeTopicRequest| topic(&r.topic, Operation::Describe);
        self.guarded("DescribeTopic", request, needs, |_, r| self.describe_topic_call(r)).await
    }

    async fn describe_cluster(
        &self,
        request: Request<pb::DescribeClusterRequest>,
    ) -> Result<Response<pb::DescribeClusterResponse>, Status> {
        // Every caller may see the brokers, anonymous ones included: clients
        // route by them, and a broker joining a plaintext cluster has no
        // credentials. A wrong secret is still refused.
        self.timed("DescribeCluster", async {
            self.confirmed(|| self.caller(&request)).await?;
            self.describe_cluster_call(request).await
        })
        .await
    }

    async fn describe_cluster_config(
        &self,
        request: Request<pb::DescribeClusterConfigRequest>,
    ) -> Result<Response<pb::DescribeClusterConfigResponse>, Status> {
        // Settings are no secret: every caller with valid credentials (or
        // none, on an open cluster) may list them, as it may the brokers.
        self.timed("DescribeClusterConfig", async {
            self.confirmed(|| self.caller(&request)).await?;
            Ok(Response::new(self.describe_cluster_config_call()))
        })
        .await
    }

    async fn set_cluster_config(
        &self,
        request: Request<pb::SetClusterConfigRequest>,
    ) -> Result<Response<pb::SetClusterConfigResponse>, Status> {
        let needs = |_: &pb::SetClusterConfigRequest| cluster(Operation::Configure);
        self.guarded("SetClusterConfig", request, needs, |_, r| self.set_cluster_config_call(r)).await
    }

    async fn remove_broker(
        &self,
        request: Request<pb::RemoveBrokerRequest>,
    ) -> Result<Response<pb::RemoveBrokerResponse>, Status> {
        let needs = |_: &pb::RemoveBrokerRequest| cluster(Operation::Brokers);
        self.guarded("RemoveBroker", request, needs, |_, r| self.remove_broker_call(r)).await
    }

    async fn drain_broker(
        &self,
        request: Request<pb::DrainBrokerRequest>,
    ) -> Result<Response<pb::DrainBrokerResponse>, Status> {
        let needs = |_: &pb::DrainBrokerRequest| cluster(Operation::Brokers);
        self.guarded("DrainBroker", request, needs, |_, r| self.drain_broker_call(r)).await
    }

    async fn move_partition(
        &self,
        request: Request<pb::MovePartitionRequest>,
    ) -> Result<Response<pb::MovePartitionResponse>, Status> {
        let needs = |_: &pb::MovePartitionRequest| cluster(Operation::Brokers);
        self.guarded("MovePartition", request, needs, |_, r| self.move_partition_call(r)).await
    }

    async fn join_group(
        &self,
        request: Request<pb::JoinGroupRequest>,
    ) -> Result<Response<pb::JoinGroupResponse>, Status> {
        let needs = |r: &pb::JoinGroupRequest| {
            let mut needs = group(&r.group, Operation::Join);
            needs.extend(r.topics.iter().map(|t| Permission::topic(t, Operation::Consume)));
            needs
        };
        self.guarded("JoinGroup", request, needs, |_, r| async move {
            self.join_group_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let needs = |r: &pb::HeartbeatRequest| group(&r.group, Operation::Join);
        self.guarded("Heartbeat", request, needs, |_, r| async move {
            self.heartbeat_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn leave_group(
        &self,
        request: Request<pb::LeaveGroupRequest>,
    ) -> Result<Response<pb::LeaveGroupResponse>, Status> {
        let needs = |r: &pb::LeaveGroupRequest| group(&r.group, Operation::Join);
        self.guarded("LeaveGroup", request, needs, |_, r| async move {
            self.leave_group_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn poll(&self, request: Request<pb::PollRequest>) -> Result<Response<pb::PollResponse>, Status> {
        let needs = |r: &pb::PollRequest| member_reading(&r.group, &r.topic);
        self.guarded("Poll", request, needs, |_, r| async move {
            self.poll_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn poll_partitions(
        &self,
        request: Request<pb::PollPartitionsRequest>,
    ) -> Result<Response<pb::PollPartitionsResponse>, Status> {
        let needs = |r: &pb::PollPartitionsRequest| {
            let topics: std::collections::BTreeSet<&str> = r.partitions.iter().map(|p| p.topic.as_str()).collect();
            let mut needs = vec![Permission::group(&r.group, Operation::Join)];
            needs.extend(topics.into_iter().map(|topic| Permission::topic(topic, Operation::Consume)));
            needs
        };
        self.guarded("PollPartitions", request, needs, |_, r| async move {
            self.poll_partitions_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let needs = |r: &pb::AckRequest| member_reading(&r.group, &r.topic);
        self.guarded(
            "Ack",
            request,
            needs,
            |_, r| async move { self.ack_request(r.into_inner()).await.map(Response::new) },
        )
        .await
    }

    async fn list_groups(
        &self,
        request: Request<pb::ListGroupsRequest>,
    ) -> Result<Response<pb::ListGroupsResponse>, Status> {
        // Lists what the caller may describe.
        self.guarded("ListGroups", request, nothing, |caller, _| async move {
            Ok(Response::new(self.list_groups_request(&caller)))
        })
        .await
    }

    async fn describe_group(
        &self,
        request: Request<pb::DescribeGroupRequest>,
    ) -> Result<Response<pb::DescribeGroupResponse>, Status> {
        let needs = |r: &pb::DescribeGroupRequest| group(&r.group, Operation::Describe);
        self.guarded("DescribeGroup", request, needs, |_, r| async move {
            self.describe_group_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn group_position(
        &self,
        request: Request<pb::GroupPositionRequest>,
    ) -> Result<Response<pb::GroupPositionResponse>, Status> {
        // The answer shows the topic's bounds too.
        let needs = |r: &pb::GroupPositionRequest| {
            vec![Permission::group(&r.group, Operation::Describe), Permission::topic(&r.topic, Operation::Describe)]
        };
        self.guarded("GroupPosition", request, needs, |_, r| async move {
            self.group_position_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn reset_group_position(
        &self,
        request: Request<pb::ResetGroupPositionRequest>,
    ) -> Result<Response<pb::ResetGroupPositionResponse>, Status> {
        // Forgetting a position is how a group is deleted.
        let needs = |r: &pb::ResetGroupPositionRequest| {
            let operation = match r.to {
                Some(pb::reset_group_position_request::To::Forget(_)) => Operation::Delete,
                _ => Operation::Reset,
            };
            // As Kafka asks for Read on the topic to move a group's offsets.
            vec![Permission::group(&r.group, operation), Permission::topic(&r.topic, Operation::Consume)]
        };
        self.guarded("ResetGroupPosition", request, needs, |_, r| async move {
            self.reset_group_position_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn delete_group(
        &self,
        request: Request<pb::DeleteGroupRequest>,
    ) -> Result<Response<pb::DeleteGroupResponse>, Status> {
        let needs = |r: &pb::DeleteGroupRequest| group(&r.group, Operation::Delete);
        self.guarded("DeleteGroup", request, needs, |_, r| async move {
            self.delete_group_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn set_user(&self, request: Request<pb::SetUserRequest>) -> Result<Response<pb::SetUserResponse>, Status> {
        let needs = |_: &pb::SetUserRequest| cluster(Operation::Users);
        self.guarded("SetUser", request, needs, |caller, r| async move {
            self.allow_user_change("SetUser", &caller, &r.get_ref().user)?;
            self.set_user_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn delete_user(
        &self,
        request: Request<pb::DeleteUserRequest>,
    ) -> Result<Response<pb::DeleteUserResponse>, Status> {
        let needs = |_: &pb::DeleteUserRequest| cluster(Operation::Users);
        self.guarded("DeleteUser", request, needs, |caller, r| async move {
            self.allow_user_change("DeleteUser", &caller, &r.get_ref().user)?;
            self.delete_user_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn list_users(
        &self,
        request: Request<pb::ListUsersRequest>,
    ) -> Result<Response<pb::ListUsersResponse>, Status> {
        let needs = |_: &pb::ListUsersRequest| cluster(Operation::Users);
        self.guarded("ListUsers", request, needs, |_, _| async move { Ok(Response::new(self.list_users_request())) })
            .await
    }

    async fn add_acl(&self, request: Request<pb::AddAclRequest>) -> Result<Response<pb::AddAclResponse>, Status> {
        let needs = |_: &pb::AddAclRequest| cluster(Operation::Acls);
        self.guarded("AddAcl", request, needs, |_, r| async move {
            self.add_acl_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn remove_acl(
        &self,
        request: Request<pb::RemoveAclRequest>,
    ) -> Result<Response<pb::RemoveAclResponse>, Status> {
        let needs = |_: &pb::RemoveAclRequest| cluster(Operation::Acls);
        self.guarded("RemoveAcl", request, needs, |_, r| async move {
            self.remove_acl_request(r.into_inner()).await.map(Response::new)
        })
        .await
    }

    async fn list_acls(&self, request: Request<pb::ListAclsRequest>) -> Result<Response<pb::ListAclsResponse>, Status> {
        let needs = |_: &pb::ListAclsRequest| cluster(Operation::Acls);
        self.guarded("ListAcls", request, needs, |_, r| async move {
            Ok(Response::new(self.list_acls_request(r.into_inner())))
        })
        .await
    }

    async fn who_am_i(&self, request: Request<pb::WhoAmIRequest>) -> Result<Response<pb::WhoAmIResponse>, Status> {
        // Anyone may ask, anonymous callers included.
        self.timed("WhoAmI", async {
            let caller = self.confirmed(|| self.caller(&request)).await?;
            Ok(Response::new(self.who_am_i_request(&caller)))
        })
        .await
    }
}
