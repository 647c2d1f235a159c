//! Who a caller is, and whether the access rules let it do what it asks.
//!
//! A caller names itself with a client certificate (the subject's common
//! name is its principal; real builds only) or with the request metadata
//! [`USER_METADATA`] and [`SECRET_METADATA`], checked against the user's
//! hashed secret in the metadata; a secret, when given, wins. A wrong secret
//! is refused whether or not authorisation is on. A certificate that names
//! a broker (`keel-broker-ID` as its common name and DNS name) is that broker.
//!
//! With [`AccessSettings::authorize`] on, an anonymous caller is refused
//! (UNAUTHENTICATED) and any other may do only what a rule of the metadata
//! grants it (PERMISSION_DENIED, naming the permission it lacked, counted in
//! `keel_requests_refused_total`); the configured super users may do
//! everything. A broker's certificate grants nothing here: brokers act on
//! the internal listener, and on this one only look the cluster up
//! (DescribeCluster, open to every caller, so that a broker joining a
//! plaintext cluster can too). Rules are read from this broker's metadata on every
//! request, so a rule removed, or a user deleted, stops working on the next
//! request, even on an open connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use keel_core::access::{Credential, Operation, Permission, SECRET_BYTES_MAX};
use keel_core::Principal;
use sha2::Digest;
use tonic::{Request, Status};

use super::service::KeelService;

/// Request metadata naming the user a secret belongs to.
pub const USER_METADATA: &str = "keel-user";
/// Request metadata carrying the user's secret (send it over TLS only).
pub const SECRET_METADATA: &str = "keel-secret";
/// Secrets remembered as checked, so that a user's requests do not each pay
/// for PBKDF2; the memory is dropped whole when it fills.
const CHECKED_SECRETS_MAX: usize = 1_024;

/// How a broker authorises requests: the same on every broker of a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessSettings {
    /// Refuse anonymous callers and serve principals only what the access
    /// rules grant them.
    pub authorize: bool,
    /// Principals that may do everything (the first administrator).
    pub super_users: BTreeSet<Principal>,
}

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    Certificate,
    Secret,
}

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Anonymous,
    /// Another broker of the cluster (its certificate names it).
    Broker(u64),
    Principal {
        principal: Principal,
        proof: Proof,
    },
}

/// Secrets found to match a user's credential: (user, SHA-256 of the
/// secret) to the credential, so a changed credential is checked again.
#[derive(Debug, Default)]
pub struct CheckedSecrets(Mutex<BTreeMap<SecretKey, Credential>>);

/// A user and the SHA-256 of a secret it presented.
type SecretKey = (Principal, [u8; 32]);

/// The user and secret `request` presented, if any (kept by a stream to
/// check again, see [`KeelService::still_valid`]).
pub(super) fn presented_secret<T>(request: &Request<T>) -> Option<(String, Vec<u8>)> {
    let user = request.metadata().get(USER_METADATA)?.to_str().ok()?.to_string();
    let secret = request.metadata().get(SECRET_METADATA)?.as_bytes().to_vec();
    Some((user, secret))
}

/// Who a client certificate names: a broker, or a principal (its common
/// name).
#[cfg(not(madsim))]
fn certificate_caller(certs: &[tonic::transport::CertificateDer<'static>]) -> Result<Caller, Status> {
    let Some(leaf) = certs.first() else { return Ok(Caller::Anonymous) };
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| Status::unauthenticated(format!("the client certificate does not parse: {e}")))?;
    let common_name =
        cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).ok_or_else(|| {
            Status::unauthenticated("the client certificate has no common name to take as its principal")
        })?;
    if let Some(id) = common_name.strip_prefix("keel-broker-").and_then(|id| id.parse::<u64>().ok()) {
        if crate::tls::cert_names_broker(certs, id) {
            return Ok(Caller::Broker(id));
        }
    }
    let principal = Principal::new(common_name).map_err(|e| {
        Status::unauthenticated(format!(
            "the client certificate's common name {common_name:?} is not a usable principal ({e}): issue one \
             named with [A-Za-z0-9._-] (keel cert create-client NAME)"
        ))
    })?;
    Ok(Caller::Principal { principal, proof: Proof::Certificate })
}

impl KeelService {
    /// Who sent `request`; a wrong secret is refused here.
    pub(super) fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let metadata = request.metadata();
        if let Some(user) = metadata.get(USER_METADATA) {
            let user = user.to_str().map_err(|_| Status::unauthenticated("the keel-user metadata is not text"))?;
            let secret = metadata
                .get(SECRET_METADATA)
                .ok_or_else(|| Status::unauthenticated(format!("user {user:?} sent no secret: give --secret")))?;
            let principal = self.check_secret(user, secret.as_bytes())?;
            return Ok(Caller::Principal { principal, proof: Proof::Secret });
        }
        #[cfg(not(madsim))]
        if let Some(certs) = request.peer_certs() {
            return certificate_caller(&certs);
        }
        Ok(Caller::Anonymous)
    }

    /// Run `check`; a refusal (UNAUTHENTICATED, PERMISSION_DENIED) stands
    /// only once this broker's metadata is known to be current. A follower's
    /// metadata may lack a user or rule the leader has applied (it restarted,
    /// or was cut off), and so may a leader's just after its election: the
    /// leader catches up to a read index and checks again, and a follower
    /// answers UNAVAILABLE, so that the client backs off and asks again
    /// (here once this broker has caught up, or at another broker).
    pub(super) async fn confirmed<T>(&self, check: impl Fn() -> Result<T, Status>) -> Result<T, Status> {
        let metadata = crate::group::GroupId::Metadata;
        let applied = || {
            let raft = self.node.raft(&metadata);
            raft.and_then(|raft| raft.metrics().borrow().last_applied.map(|log_id| log_id.index))
        };
        let checked_at = applied();
        let result = check();
        let Err(refusal) = &result else { return result };
        if !matches!(refusal.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) {
            return result;
        }
        if self.node.is_metadata_leader().await {
            self.applied_to_read_index(&metadata, "the metadata group").await?;
            // Checked again only if something was applied meanwhile (a
            // refusal is counted once per check).
            return if applied() == checked_at { result } else { check() };
        }
        Err(Status::unavailable(format!(
            "{} (broker {}, which does not lead the metadata group, may not have applied the latest users and \
             rules yet: retry)",
            refusal.message(),
            self.node.id()
        )))
    }

    /// Check `caller` again, as a long-lived stream does before each of its
    /// requests: a user deleted or given a new secret since is refused.
    pub(super) fn still_valid(&self, caller: &Caller, presented: &Option<(String, Vec<u8>)>) -> Result<(), Status> {
        match (caller, presented) {
            (Caller::Principal { proof: Proof::Secret, .. }, Some((user, secret))) => {
                self.check_secret(user, secret).map(drop)
            }
            _ => Ok(()),
        }
    }

    /// The principal `user` if `secret` is its secret.
    pub(super) fn check_secret(&self, user: &str, secret: &[u8]) -> Result<Principal, Status> {
        let refused = || {
            Status::unauthenticated(format!(
                "user {user:?} does not exist or the secret is wrong: check --user and --secret (KEEL_USER, \
                 KEEL_SECRET)"
            ))
        };
        let principal = Principal::new(user).map_err(|_| refused())?;
        if secret.len() > SECRET_BYTES_MAX {
            return Err(refused());
        }
        let metadata = self.node.metadata();
        let credential = metadata.access().user(&principal).ok_or_else(refused)?;
        let key = (principal.clone(), sha2::Sha256::digest(secret).into());
        let checked = &self.checked_secrets.0;
        if checked.lock().expect("checked secrets").get(&key) == Some(credential) {
            return Ok(principal);
        }
        if !credential.matches(secret) {
            return Err(refused());
        }
        let mut checked = checked.lock().expect("checked secrets");
        if checked.len() >= CHECKED_SECRETS_MAX {
            checked.clear();
        }
        checked.insert(key, credential.clone());
        Ok(principal)
    }

    /// Whether `caller` may do everything: authorisation is off, or it is a
    /// super user.
    fn unrestricted(&self, caller: &Caller) -> bool {
        let settings = &self.node.config().access;
        #[cfg(madsim)]
        if keel_core::planted::is_planted(keel_core::planted::Bug::AclIgnored)
            && matches!(caller, Caller::Principal { .. })
        {
            return true;
        }
        match caller {
            _ if !settings.authorize => true,
            // Brokers act on the internal listener; on this one they only
            // look the cluster up, which any caller may.
            Caller::Anonymous | Caller::Broker(_) => false,
            Caller::Principal { principal, .. } => settings.super_users.contains(principal),
        }
    }

    /// Refuse `rpc` unless `caller` may do all of `needed`.
    pub(super) fn allow(&self, rpc: &'static str, caller: &Caller, needed: &[Permission]) -> Result<(), Status> {
        if self.unrestricted(caller) {
            return Ok(());
        }
        let principal = match caller {
            Caller::Principal { principal, .. } => principal,
            Caller::Broker(_) if needed.is_empty() => return Ok(()),
            Caller::Broker(id) => {
                self.node.metrics().refused(rpc, "broker");
                return Err(Status::permission_denied(format!(
                    "broker {id}'s certificate grants nothing on the client listener beyond looking the cluster up"
                )));
            }
            Caller::Anonymous => {
                self.node.metrics().refused(rpc, "authentication");
                return Err(Status::unauthenticated(
                    "this cluster serves authenticated callers only: give a client certificate (--tls-cert, \
                     --tls-key), or a user and its secret (--user, --secret)",
                ));
            }
        };
        let metadata = self.node.metadata();
        for permission in needed {
            if !metadata.access().allows(principal, permission) {
                self.node
                    .metrics()
                    .refused(rpc, &format!("{} on {}", permission.operation, permission.resource.name()));
                let acl = permission.as_acl(principal);
                return Err(Status::permission_denied(format!(
                    "{principal} lacks {permission}: an administrator can grant it with `keel acl add {principal} \
                     {} --{} {}`",
                    acl.operation,
                    acl.resource.name(),
                    acl.name
                )));
            }
        }
        Ok(())
    }

    /// Refuse `rpc` unless `caller` may do `operation` on some topic (a
    /// producer id is handed to anyone who may produce somewhere).
    pub(super) fn allow_somewhere(
        &self,
        rpc: &'static str,
        caller: &Caller,
        operation: Operation,
    ) -> Result<(), Status> {
        if self.unrestricted(caller) {
            return Ok(());
        }
        let principal = match caller {
            Caller::Principal { principal, .. } => principal,
            // Refused as anonymous, or as a broker for lacking it.
            _ => return self.allow(rpc, caller, &[Permission::topic("", operation)]),
        };
        let metadata = self.node.metadata();
        if metadata.access().allows_somewhere(principal, keel_core::access::ResourceKind::Topic, operation) {
            return Ok(());
        }
        self.node.metrics().refused(rpc, &format!("{operation} on topic"));
        Err(Status::permission_denied(format!(
            "{principal} may {operation} on no topic, so it is refused: an administrator can grant it with `keel acl \
             add {principal} {operation} --topic NAME`"
        )))
    }

    /// Refuse `rpc` unless `caller` may change user `user`: a super user's
    /// secret only a super user may set or delete (who holds `users` could
    /// otherwise become one).
    pub(super) fn allow_user_change(&self, rpc: &'static str, caller: &Caller, user: &str) -> Result<(), Status> {
        let settings = &self.node.config().access;
        let protected = settings.authorize && settings.super_users.iter().any(|s| s.as_str() == user);
        if !protected || self.unrestricted(caller) {
            return Ok(());
        }
        self.node.metrics().refused(rpc, "super user");
        Err(Status::permission_denied(format!(
            "{user} is a super user: only a super user may set or delete its secret"
        )))
    }

    /// Whether `caller` may see what `permission` names (filters listings;
    /// not counted as a refusal).
    pub(super) fn may(&self, caller: &Caller, permission: &Permission) -> bool {
        if self.unrestricted(caller) {
            return true;
        }
        match caller {
            Caller::Principal { principal, .. } => self.node.metadata().access().allows(principal, permission),
            _ => false,
        }
    }
}
