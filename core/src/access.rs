//! Who may do what: users with hashed secrets, and the access rules (ACLs)
//! that grant principals operations on topics, groups and the cluster.
//!
//! Both live in the metadata state, so every broker authenticates and
//! authorises against the same replicated rules. A user's secret is never
//! stored: the client that creates the user derives a salted
//! PBKDF2-HMAC-SHA256 hash ([`Credential::derive`]), as Kafka keeps SCRAM
//! credentials, and a broker checks a presented secret by deriving it again.
//! Rules only grant (there is no deny); a principal may do what some rule
//! for it, or for every principal (`*`), allows.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{NameError, Principal};

/// Bytes of salt a credential carries, at least and at most.
pub const SALT_BYTES_MIN: usize = 16;
pub const SALT_BYTES_MAX: usize = 64;
/// Bytes of a derived hash (SHA-256).
pub const HASH_BYTES: usize = 32;
/// PBKDF2 rounds a credential may ask for, at most: each check of a secret
/// (a wrong one included) costs this many HMAC computations on a broker,
/// about 10 ms here. Secrets `keel user create` makes up are random, so
/// rounds guard little; the bound keeps guessing from costing brokers more.
pub const ITERATIONS_MAX: u32 = 10_000;
/// PBKDF2 rounds `keel user create` uses (SCRAM's minimum).
pub const ITERATIONS_DEFAULT: u32 = 4_096;
/// Longest secret a client may present, in bytes.
pub const SECRET_BYTES_MAX: usize = 1_024;
/// Users the cluster keeps, at most.
pub const USERS_MAX: usize = 10_000;
/// Access rules the cluster keeps, at most.
pub const ACLS_MAX: usize = 10_000;
/// A rule for this principal applies to every authenticated principal.
pub const ANY_PRINCIPAL: &str = "*";

/// A user's secret as the cluster keeps it: salted and hashed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    #[serde(with = "serde_bytes")]
    pub salt: Vec<u8>,
    pub iterations: u32,
    #[serde(with = "serde_bytes")]
    pub hash: Vec<u8>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The hash stays out of logs and traces.
        f.debug_struct("Credential").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

impl Credential {
    /// Hash `secret` with `salt` over `iterations` rounds.
    pub fn derive(secret: &[u8], salt: Vec<u8>, iterations: u32) -> Credential {
        let mut hash = vec![0u8; HASH_BYTES];
        pbkdf2::pbkdf2_hmac::<sha2::Sha256>(secret, &salt, iterations, &mut hash);
        Credential { salt, iterations, hash }
    }

    /// Whether `secret` is the one this credential was derived from. Takes
    /// as long whichever byte differs.
    pub fn matches(&self, secret: &[u8]) -> bool {
        if secret.len() > SECRET_BYTES_MAX || self.check().is_err() {
            return false;
        }
        let presented = Credential::derive(secret, self.salt.clone(), self.iterations);
        presented.hash.iter().zip(&self.hash).fold(0u8, |differ, (a, b)| differ | (a ^ b)) == 0
    }

    /// Why this credential is unusable, if it is.
    pub fn check(&self) -> Result<(), String> {
        if !(SALT_BYTES_MIN..=SALT_BYTES_MAX).contains(&self.salt.len()) {
            return Err(format!(
                "its salt is {} bytes: use {SALT_BYTES_MIN} to {SALT_BYTES_MAX} random bytes",
                self.salt.len()
            ));
        }
        if !(1..=ITERATIONS_MAX).contains(&self.iterations) {
            return Err(format!("it asks for {} rounds: use 1 to {ITERATIONS_MAX}", self.iterations));
        }
        if self.hash.len() != HASH_BYTES {
            return Err(format!("its hash is {} bytes, not {HASH_BYTES} (PBKDF2-HMAC-SHA256)", self.hash.len()));
        }
        Ok(())
    }
}

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceKind {
    Topic,
    Group,
    /// The cluster itself (its brokers, users and rules); its name is empty.
    Cluster,
}

impl ResourceKind {
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Topic => "topic",
            ResourceKind::Group => "group",
            ResourceKind::Cluster => "cluster",
        }
    }
}

/// What a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Operation {
    /// Topic: append records.
    Produce,
    /// Topic: read records, directly or in a group.
    Consume,
    /// Topic or group: see it listed and described.
    Describe,
    /// Topic: create it.
    Create,
    /// Topic or group: delete it.
    Delete,
    /// Topic: change its partitions or retention.
    Alter,
    /// Group: join it (and poll and ack as its member).
    Join,
    /// Group: move its positions.
    Reset,
    /// Cluster: drain, move and remove brokers and partitions.
    Brokers,
    /// Cluster: create and delete users.
    Users,
    /// Cluster: add and remove rules.
    Acls,
    /// Cluster: change its settings (`keel cluster config set`).
    Configure,
}

impl Operation {
    pub const ALL: [Operation; 12] = [
        Operation::Produce,
        Operation::Consume,
        Operation::Describe,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Join,
        Operation::Reset,
        Operation::Brokers,
        Operation::Users,
        Operation::Acls,
        Operation::Configure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::Produce => "produce",
            Operation::Consume => "consume",
            Operation::Describe => "describe",
            Operation::Create => "create",
            Operation::Delete => "delete",
            Operation::Alter => "alter",
            Operation::Join => "join",
            Operation::Reset => "reset",
            Operation::Brokers => "brokers",
            Operation::Users => "users",
            Operation::Acls => "acls",
            Operation::Configure => "configure",
        }
    }

    pub fn parse(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Whether a rule granting this also lets the principal see the
    /// resource (as in Kafka: who may write, read, delete or alter a topic
    /// may describe it). Creating does not.
    pub fn implies_describe(self) -> bool {
        use Operation::*;
        matches!(self, Produce | Consume | Delete | Alter | Join | Reset)
    }

    /// Whether this operation means anything on `kind`.
    pub fn applies_to(self, kind: ResourceKind) -> bool {
        use Operation::*;
        match kind {
            ResourceKind::Topic => matches!(self, Produce | Consume | Describe | Create | Delete | Alter),
            ResourceKind::Group => matches!(self, Join | Describe | Reset | Delete),
            ResourceKind::Cluster => matches!(self, Brokers | Users | Acls | Configure),
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a rule's name matches a resource's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PatternKind {
    /// Exactly this name.
    Literal,
    /// Every name that starts with it (the empty prefix matches every name).
    Prefix,
}

/// One grant: `principal` may do `operation` on the resources of `resource`
/// kind that `pattern` and `name` match.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Acl {
    /// A principal's name, or [`ANY_PRINCIPAL`].
    pub principal: String,
    pub resource: ResourceKind,
    pub pattern: PatternKind,
    pub name: String,
    pub operation: Operation,
}

impl Acl {
    /// Why this rule cannot be kept, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.principal != ANY_PRINCIPAL {
            Principal::new(self.principal.as_str()).map_err(|e| e.to_string())?;
        }
        if !self.operation.applies_to(self.resource) {
            let allowed: Vec<&str> =
                Operation::ALL.iter().filter(|op| op.applies_to(self.resource)).map(|op| op.name()).collect();
            return Err(format!(
                "{} is not an operation on a {}: use one of {}",
                self.operation,
                self.resource.name(),
                allowed.join(", ")
            ));
        }
        match (self.resource, self.pattern) {
            (ResourceKind::Cluster, _) if !self.name.is_empty() => {
                Err("a cluster rule names no resource: leave the name empty".to_string())
            }
            (ResourceKind::Cluster, _) => Ok(()),
            // Any prefix of a legal name is fine, the empty one included.
            (_, PatternKind::Prefix) if self.name.is_empty() => Ok(()),
            (ResourceKind::Topic, _) => {
                crate::id::TopicName::new(self.name.as_str()).map(drop).map_err(|e: NameError| e.to_string())
            }
            (ResourceKind::Group, _) => {
                crate::id::GroupName::new(self.name.as_str()).map(drop).map_err(|e: NameError| e.to_string())
            }
        }
    }

    fn grant(&self) -> Grant {
        Grant { resource: self.resource, pattern: self.pattern, name: self.name.clone(), operation: self.operation }
    }
}

impl fmt::Display for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.principal == ANY_PRINCIPAL { "every principal" } else { self.principal.as_str() };
        match (self.resource, self.pattern) {
            (ResourceKind::Cluster, _) => write!(f, "{who} may {} on the cluster", self.operation),
            (kind, PatternKind::Literal) => write!(f, "{who} may {} on {} {}", self.operation, kind.name(), self.name),
            (kind, PatternKind::Prefix) => {
                write!(f, "{who} may {} on {}s prefixed {:?}", self.operation, kind.name(), self.name)
            }
        }
    }
}

/// A rule without its principal (rules are kept per principal).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Grant {
    resource: ResourceKind,
    pattern: PatternKind,
    name: String,
    operation: Operation,
}

impl Grant {
    fn allows(&self, needed: &Permission) -> bool {
        self.resource == needed.resource
            && (self.operation == needed.operation
                || (needed.operation == Operation::Describe && self.operation.implies_describe()))
            && match self.pattern {
                PatternKind::Literal => self.name == needed.name,
                PatternKind::Prefix => needed.name.starts_with(&self.name),
            }
    }
}

/// What a request needs: `operation` on the resource `name` of `resource`
/// kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub resource: ResourceKind,
    pub name: String,
    pub operation: Operation,
}

impl Permission {
    pub fn topic(name: &str, operation: Operation) -> Permission {
        Permission { resource: ResourceKind::Topic, name: name.to_string(), operation }
    }

    pub fn group(name: &str, operation: Operation) -> Permission {
        Permission { resource: ResourceKind::Group, name: name.to_string(), operation }
    }

    pub fn cluster(operation: Operation) -> Permission {
        Permission { resource: ResourceKind::Cluster, name: String::new(), operation }
    }

    /// The rule that would grant this permission to `principal`.
    pub fn as_acl(&self, principal: &Principal) -> Acl {
        Acl {
            principal: principal.to_string(),
            resource: self.resource,
            pattern: PatternKind::Literal,
            name: self.name.clone(),
            operation: self.operation,
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.resource {
            ResourceKind::Cluster => write!(f, "{} on the cluster", self.operation),
            kind => write!(f, "{} on {} {}", self.operation, kind.name(), self.name),
        }
    }
}

/// Why a user or rule command changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AccessRejection {
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("the credential for user {user} is not usable: {reason}")]
    InvalidCredential { user: String, reason: String },
    #[error("user {user} already exists: delete it first, or replace its secret")]
    UserExists { user: Principal },
    #[error("user {user} does not exist: check the name (keel user list)")]
    UnknownUser { user: String },
    #[error("the cluster already has {max} users: delete some first")]
    TooManyUsers { max: usize },
    #[error("the rule is not usable: {reason}")]
    InvalidAcl { reason: String },
    #[error("the cluster already has {max} rules: remove some first")]
    TooManyAcls { max: usize },
    #[error("there is no rule \"{acl}\": check it against keel acl list")]
    UnknownAcl { acl: String },
}

/// What a user or rule command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessOutcome {
    /// The user exists now; `replaced` when it had a secret before.
    UserSet {
        user: Principal,
        replaced: bool,
    },
    UserDeleted {
        user: Principal,
    },
    /// The rule is in force; `added` is false when it already was.
    AclAdded {
        added: bool,
    },
    AclRemoved,
}

/// The users and rules of a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRules {
    users: BTreeMap<Principal, Credential>,
    grants: BTreeMap<String, BTreeSet<Grant>>,
    acl_count: usize,
}

impl AccessRules {
    pub fn user(&self, user: &Principal) -> Option<&Credential> {
        self.users.get(user)
    }

    pub fn users(&self) -> impl Iterator<Item = &Principal> {
        self.users.keys()
    }

    /// Every rule, ordered by principal.
    pub fn acls(&self) -> impl Iterator<Item = Acl> + '_ {
        self.grants.iter().flat_map(|(principal, grants)| {
            grants.iter().map(move |g| Acl {
                principal: principal.clone(),
                resource: g.resource,
                pattern: g.pattern,
                name: g.name.clone(),
                operation: g.operation,
            })
        })
    }

    pub fn acl_count(&self) -> usize {
        self.acl_count
    }

    /// Whether a rule grants `principal` what `needed` names.
    pub fn allows(&self, principal: &Principal, needed: &Permission) -> bool {
        [principal.as_str(), ANY_PRINCIPAL]
            .iter()
            .filter_map(|p| self.grants.get(*p))
            .any(|grants| grants.iter().any(|g| g.allows(needed)))
    }

    /// Whether a rule grants `principal` `operation` on some resource of
    /// `resource` kind (a producer id is handed to anyone who may produce
    /// somewhere).
    pub fn allows_somewhere(&self, principal: &Principal, resource: ResourceKind, operation: Operation) -> bool {
        [principal.as_str(), ANY_PRINCIPAL]
            .iter()
            .filter_map(|p| self.grants.get(*p))
            .any(|grants| grants.iter().any(|g| g.resource == resource && g.operation == operation))
    }

    pub(crate) fn set_user(
        &mut self,
        user: &str,
        credential: &Credential,
        replace: bool,
    ) -> Result<AccessOutcome, AccessRejection> {
        let name = Principal::new(user)?;
        credential.check().map_err(|reason| AccessRejection::InvalidCredential { user: name.to_string(), reason })?;
        let replaced = self.users.contains_key(&name);
        if replaced && !replace {
            return Err(AccessRejection::UserExists { user: name });
        }
        if !replaced && self.users.len() >= USERS_MAX {
            return Err(AccessRejection::TooManyUsers { max: USERS_MAX });
        }
        self.users.insert(name.clone(), credential.clone());
        Ok(AccessOutcome::UserSet { user: name, replaced })
    }

    pub(crate) fn delete_user(&mut self, user: &str) -> Result<AccessOutcome, AccessRejection> {
        let name = Principal::new(user)?;
        match self.users.remove(&name) {
            Some(_) => Ok(AccessOutcome::UserDeleted { user: name }),
            None => Err(AccessRejection::UnknownUser { user: user.to_string() }),
        }
    }

    pub(crate) fn add_acl(&mut self, acl: &Acl) -> Result<AccessOutcome, AccessRejection> {
        acl.check().map_err(|reason| AccessRejection::InvalidAcl { reason })?;
        let grant = acl.grant();
        if self.grants.get(&acl.principal).is_some_and(|grants| grants.contains(&grant)) {
            return Ok(AccessOutcome::AclAdded { added: false });
        }
        if self.acl_count >= ACLS_MAX {
            return Err(AccessRejection::TooManyAcls { max: ACLS_MAX });
        }
        self.grants.entry(acl.principal.clone()).or_default().insert(grant);
        self.acl_count += 1;
        Ok(AccessOutcome::AclAdded { added: true })
    }

    pub(crate) fn remove_acl(&mut self, acl: &Acl) -> Result<AccessOutcome, AccessRejection> {
        let grant = acl.grant();
        let Some(grants) = self.grants.get_mut(&acl.principal) else {
            return Err(AccessRejection::UnknownAcl { acl: acl.to_string() });
        };
        if !grants.remove(&grant) {
            return Err(AccessRejection::UnknownAcl { acl: acl.to_string() });
        }
        if grants.is_empty() {
            self.grants.remove(&acl.principal);
        }
        self.acl_count -= 1;
        Ok(AccessOutcome::AclRemoved)
    }

    /// The counts agree with what is kept.
    pub fn check_invariants(&self) -> Result<(), String> {
        let counted: usize = self.grants.values().map(BTreeSet::len).sum();
        if counted != self.acl_count {
            return Err(format!("{counted} rules are kept but {} are counted", self.acl_count));
        }
        if self.grants.values().any(BTreeSet::is_empty) {
            return Err("a principal is kept with no rules".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(principal: &str, resource: ResourceKind, pattern: PatternKind, name: &str, operation: Operation) -> Acl {
        Acl { principal: principal.into(), resource, pattern, name: name.into(), operation }
    }

    fn alice() -> Principal {
        Principal::new("alice").unwrap()
    }

    #[test]
    fn a_secret_matches_only_its_own_credential() {
        let credential = Credential::derive(b"open sesame", vec![7; 16], 16);
        assert!(credential.matches(b"open sesame"));
        assert!(!credential.matches(b"open sesame!"));
        assert!(!credential.matches(b""));
        let other_salt = Credential::derive(b"open sesame", vec![8; 16], 16);
        assert_ne!(credential.hash, other_salt.hash, "the salt changes the hash");
    }

    #[test]
    fn unusable_credentials_are_refused_and_match_nothing() {
        let mut rules = AccessRules::default();
        let short_salt = Credential::derive(b"s", vec![1; 4], 16);
        assert!(matches!(rules.set_user("alice", &short_salt, false), Err(AccessRejection::InvalidCredential { .. })));
        assert!(!short_salt.matches(b"s"));
        let no_rounds = Credential { salt: vec![1; 16], iterations: 0, hash: vec![0; 32] };
        assert!(rules.set_user("alice", &no_rounds, false).is_err());
        assert!(rules.set_user("not a name", &Credential::derive(b"s", vec![1; 16], 1), false).is_err());
        assert_eq!(rules.users().count(), 0);
    }

    #[test]
    fn users_are_created_replaced_only_when_asked_and_deleted() {
        let mut rules = AccessRules::default();
        let first = Credential::derive(b"one", vec![1; 16], 2);
        let second = Credential::derive(b"two", vec![2; 16], 2);
        assert_eq!(
            rules.set_user("alice", &first, false),
            Ok(AccessOutcome::UserSet { user: alice(), replaced: false })
        );
        assert_eq!(rules.set_user("alice", &second, false), Err(AccessRejection::UserExists { user: alice() }));
        assert!(rules.user(&alice()).unwrap().matches(b"one"));
        assert_eq!(
            rules.set_user("alice", &second, true),
            Ok(AccessOutcome::UserSet { user: alice(), replaced: true })
        );
        assert!(rules.user(&alice()).unwrap().matches(b"two"));
        assert_eq!(rules.delete_user("alice"), Ok(AccessOutcome::UserDeleted { user: alice() }));
        assert!(matches!(rules.delete_user("alice"), Err(AccessRejection::UnknownUser { .. })));
    }

    #[test]
    fn literal_and_prefix_rules_grant_exactly_what_they_name() {
        let mut rules = AccessRules::default();
        rules
            .add_acl(&acl("alice", ResourceKind::Topic, PatternKind::Literal, "payments", Operation::Produce))
            .unwrap();
        rules.add_acl(&acl("alice", ResourceKind::Topic, PatternKind::Prefix, "logs.", Operation::Consume)).unwrap();
        rules.add_acl(&acl("*", ResourceKind::Topic, PatternKind::Prefix, "", Operation::Describe)).unwrap();
        let can = |p: Permission| rules.allows(&alice(), &p);
        assert!(can(Permission::topic("payments", Operation::Produce)));
        assert!(!can(Permission::topic("payments2", Operation::Produce)), "a literal is not a prefix");
        assert!(!can(Permission::topic("payments", Operation::Consume)));
        assert!(can(Permission::topic("logs.web", Operation::Consume)));
        assert!(!can(Permission::topic("logs", Operation::Consume)));
        assert!(!can(Permission::group("logs.web", Operation::Describe)), "a topic rule grants nothing on groups");
        assert!(can(Permission::topic("anything", Operation::Describe)), "rules for * apply to everyone");
        let bob = Principal::new("bob").unwrap();
        assert!(!rules.allows(&bob, &Permission::topic("payments", Operation::Produce)));
        assert!(rules.allows_somewhere(&alice(), ResourceKind::Topic, Operation::Produce));
        assert!(!rules.allows_somewhere(&bob, ResourceKind::Topic, Operation::Produce));
    }

    #[test]
    fn who_may_use_a_resource_may_describe_it_but_not_who_may_create_it() {
        let mut rules = AccessRules::default();
        rules.add_acl(&acl("alice", ResourceKind::Topic, PatternKind::Literal, "payments", Operation::Create)).unwrap();
        assert!(!rules.allows(&alice(), &Permission::topic("payments", Operation::Describe)));
        rules
            .add_acl(&acl("alice", ResourceKind::Topic, PatternKind::Literal, "payments", Operation::Produce))
            .unwrap();
        assert!(rules.allows(&alice(), &Permission::topic("payments", Operation::Describe)));
        assert!(!rules.allows(&alice(), &Permission::topic("payments", Operation::Consume)));
        rules.add_acl(&acl("alice", ResourceKind::Group, PatternKind::Prefix, "g", Operation::Join)).unwrap();
        assert!(rules.allows(&alice(), &Permission::group("g1", Operation::Describe)));
        assert!(!rules.allows(&alice(), &Permission::group("g1", Operation::Reset)));
    }

    #[test]
    fn rules_are_checked_added_once_and_removed() {
        let mut rules = AccessRules::default();
        let produce = acl("alice", ResourceKind::Topic, PatternKind::Literal, "payments", Operation::Produce);
        assert_eq!(rules.add_acl(&produce), Ok(AccessOutcome::AclAdded { added: true }));
        assert_eq!(rules.add_acl(&produce), Ok(AccessOutcome::AclAdded { added: false }));
        assert_eq!(rules.acl_count(), 1);
        for bad in [
            acl("alice", ResourceKind::Topic, PatternKind::Literal, "payments", Operation::Join),
            acl("alice", ResourceKind::Cluster, PatternKind::Literal, "x", Operation::Users),
            acl("al ice", ResourceKind::Topic, PatternKind::Literal, "payments", Operation::Produce),
            acl("alice", ResourceKind::Topic, PatternKind::Literal, "", Operation::Produce),
        ] {
            assert!(matches!(rules.add_acl(&bad), Err(AccessRejection::InvalidAcl { .. })), "{bad:?}");
        }
        assert_eq!(rules.remove_acl(&produce), Ok(AccessOutcome::AclRemoved));
        assert!(matches!(rules.remove_acl(&produce), Err(AccessRejection::UnknownAcl { .. })));
        assert!(!rules.allows(&alice(), &Permission::topic("payments", Operation::Produce)));
        rules.check_invariants().unwrap();
        assert_eq!(rules.acls().count(), 0);
    }
}
