//! Users and access rules over the API: each change is a metadata command,
//! applied by the metadata leader and checked again in apply.

use keel_core::access::{AccessOutcome, Acl, Credential, Operation, PatternKind, ResourceKind};
use keel_core::metadata::{MetadataCommand, MetadataOutcome};
use keel_core::Principal;
use keel_proto::v1 as pb;
use tonic::Status;

use super::access::{Caller, Proof};
use super::service::KeelService;

/// A rule as the API spells it, checked.
pub(super) fn acl_from(acl: Option<pb::Acl>) -> Result<Acl, Status> {
    let acl = acl.ok_or_else(|| Status::invalid_argument("the request names no rule: give `acl`"))?;
    let resource = match acl.resource.as_str() {
        "topic" => ResourceKind::Topic,
        "group" => ResourceKind::Group,
        "cluster" => ResourceKind::Cluster,
        other => {
            return Err(Status::invalid_argument(format!(
                "{other:?} is not a kind of resource: use topic, group or cluster"
            )))
        }
    };
    let operation = Operation::parse(&acl.operation).ok_or_else(|| {
        let all: Vec<&str> = Operation::ALL.iter().map(|op| op.name()).collect();
        Status::invalid_argument(format!("{:?} is not an operation: use one of {}", acl.operation, all.join(", ")))
    })?;
    let pattern = if acl.prefix { PatternKind::Prefix } else { PatternKind::Literal };
    let acl = Acl { principal: acl.principal, resource, pattern, name: acl.name, operation };
    acl.check().map_err(|reason| Status::invalid_argument(format!("the rule is not usable: {reason}")))?;
    Ok(acl)
}

pub(super) fn acl_to(acl: &Acl) -> pb::Acl {
    pb::Acl {
        principal: acl.principal.clone(),
        resource: acl.resource.name().to_string(),
        name: acl.name.clone(),
        prefix: acl.pattern == PatternKind::Prefix,
        operation: acl.operation.name().to_string(),
    }
}

fn access_outcome(outcome: MetadataOutcome) -> Result<AccessOutcome, Status> {
    match outcome {
        MetadataOutcome::Access(outcome) => Ok(outcome),
        other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
    }
}

impl KeelService {
    pub(super) async fn set_user_request(&self, request: pb::SetUserRequest) -> Result<pb::SetUserResponse, Status> {
        let user = Principal::new(request.user.as_str()).map_err(super::errors::invalid_name)?;
        let credential = Credential { salt: request.salt, iterations: request.iterations, hash: request.hash };
        credential.check().map_err(|reason| {
            Status::invalid_argument(format!("the credential for user {user} is not usable: {reason}"))
        })?;
        let command = MetadataCommand::SetUser { user: user.to_string(), credential, replace: request.replace };
        match access_outcome(self.propose_metadata(command).await?)? {
            AccessOutcome::UserSet { replaced, .. } => Ok(pb::SetUserResponse { replaced }),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn delete_user_request(
        &self,
        request: pb::DeleteUserRequest,
    ) -> Result<pb::DeleteUserResponse, Status> {
        let user = Principal::new(request.user.as_str()).map_err(super::errors::invalid_name)?;
        access_outcome(self.propose_metadata(MetadataCommand::DeleteUser { user: user.to_string() }).await?)?;
        Ok(pb::DeleteUserResponse {})
    }

    pub(super) fn list_users_request(&self) -> pb::ListUsersResponse {
        let metadata = self.node.metadata();
        pb::ListUsersResponse { users: metadata.access().users().map(ToString::to_string).collect() }
    }

    pub(super) async fn add_acl_request(&self, request: pb::AddAclRequest) -> Result<pb::AddAclResponse, Status> {
        let acl = acl_from(request.acl)?;
        match access_outcome(self.propose_metadata(MetadataCommand::AddAcl { acl }).await?)? {
            AccessOutcome::AclAdded { added } => Ok(pb::AddAclResponse { added }),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    pub(super) async fn remove_acl_request(
        &self,
        request: pb::RemoveAclRequest,
    ) -> Result<pb::RemoveAclResponse, Status> {
        let acl = acl_from(request.acl)?;
        access_outcome(self.propose_metadata(MetadataCommand::RemoveAcl { acl }).await?)?;
        Ok(pb::RemoveAclResponse {})
    }

    pub(super) fn list_acls_request(&self, request: pb::ListAclsRequest) -> pb::ListAclsResponse {
        let metadata = self.node.metadata();
        let acls = metadata
            .access()
            .acls()
            .filter(|acl| request.principal.is_empty() || acl.principal == request.principal)
            .map(|acl| acl_to(&acl))
            .collect();
        pb::ListAclsResponse { acls }
    }

    pub(super) fn who_am_i_request(&self, caller: &Caller) -> pb::WhoAmIResponse {
        let settings = &self.node.config().access;
        let (principal, authenticated_by, super_user) = match caller {
            Caller::Anonymous => (String::new(), "none", false),
            Caller::Broker(id) => (format!("keel-broker-{id}"), "certificate", false),
            Caller::Principal { principal, proof } => (
                principal.to_string(),
                match proof {
                    Proof::Certificate => "certificate",
                    Proof::Secret => "secret",
                },
                settings.super_users.contains(principal),
            ),
        };
        pb::WhoAmIResponse {
            principal,
            authenticated_by: authenticated_by.to_string(),
            authorization: settings.authorize,
            super_user,
        }
    }
}
