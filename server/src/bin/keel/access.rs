//! `keel user` and `keel acl`: users that authenticate with a secret, and
//! the access rules a broker started with `--authorize` enforces.

use std::io::BufRead;

use anyhow::{bail, Context};
use base64::Engine;
use clap::{Args, Subcommand};
use keel_client::pb;
use rand::RngCore;

use crate::Connection;

/// Random bytes in a secret `keel user create` makes up.
const GENERATED_SECRET_BYTES: usize = 24;

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user. Its secret is made up and printed once, unless
    /// --secret-from-stdin gives one; only a salted hash of it is sent.
    Create {
        /// The user's name: 1-249 characters of [A-Za-z0-9._-].
        name: String,
        /// Read the secret from the first line of standard input (printable
        /// ASCII without spaces).
        #[arg(long)]
        secret_from_stdin: bool,
        /// Give an existing user a new secret (its old one stops working).
        #[arg(long)]
        replace: bool,
    },
    /// Delete a user: its secret stops working at once (its rules stay).
    Delete {
        /// A user's name (see keel user list).
        name: String,
    },
    /// List the users.
    List,
    /// Show who the broker takes this command to be, and whether it
    /// enforces access rules.
    Whoami,
}

/// A rule's resource: exactly one of these.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct Resource {
    /// A topic (with --prefix: every topic whose name starts with this).
    #[arg(long)]
    topic: Option<String>,
    /// A consumer group (with --prefix: every group whose name starts with
    /// this).
    #[arg(long)]
    group: Option<String>,
    /// The cluster itself (for brokers, users and acls).
    #[arg(long)]
    cluster: bool,
}

/// One rule, as `keel acl add` and `keel acl remove` take it.
#[derive(Args)]
pub struct Rule {
    /// Who the rule is for: a user, a client certificate's common name, or
    /// * for every authenticated principal.
    principal: String,
    /// What it may do. Topics: produce, consume, describe, create, delete,
    /// alter. Groups: join, describe, reset, delete. The cluster: brokers,
    /// users, acls.
    operation: String,
    #[command(flatten)]
    resource: Resource,
    /// Match every name that starts with the one given (an empty name with
    /// --prefix matches them all).
    #[arg(long)]
    prefix: bool,
}

impl Rule {
    fn to_pb(&self) -> pb::Acl {
        let (resource, name) = match (&self.resource.topic, &self.resource.group) {
            (Some(topic), _) => ("topic", topic.clone()),
            (_, Some(group)) => ("group", group.clone()),
            _ => ("cluster", String::new()),
        };
        pb::Acl {
            principal: self.principal.clone(),
            resource: resource.to_string(),
            name,
            prefix: self.prefix,
            operation: self.operation.clone(),
        }
    }
}

#[derive(Subcommand)]
pub enum AclCommand {
    /// Grant a rule.
    Add(Rule),
    /// Take back a rule (give it exactly as it was added).
    Remove(Rule),
    /// List the rules, all or one principal's.
    List {
        /// Only this principal's rules.
        principal: Option<String>,
    },
}

/// A secret of [`GENERATED_SECRET_BYTES`] random bytes, URL-safe base64.
fn generated_secret() -> String {
    let mut bytes = [0u8; GENERATED_SECRET_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn secret_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the secret from standard input")?;
    let secret = line.trim_end_matches(['\n', '\r']).to_string();
    if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("the secret must be printable ASCII without spaces, and not empty");
    }
    if secret.len() > keel_core::access::SECRET_BYTES_MAX {
        bail!("the secret is longer than {} bytes", keel_core::access::SECRET_BYTES_MAX);
    }
    Ok(secret)
}

pub async fn user(command: UserCommand, connection: &Connection) -> anyhow::Result<()> {
    let client = connection.client()?;
    match command {
        UserCommand::Create { name, secret_from_stdin: from_stdin, replace } => {
            keel_core::Principal::new(name.as_str())?;
            let (secret, generated) =
                if from_stdin { (secret_from_stdin()?, false) } else { (generated_secret(), true) };
            let mut salt = vec![0u8; 16];
            rand::thread_rng().fill_bytes(&mut salt);
            let credential =
                keel_core::access::Credential::derive(secret.as_bytes(), salt, keel_core::access::ITERATIONS_DEFAULT);
            let replaced = client.set_user(&name, &credential, replace).await?;
            let verb =
                if replaced { "gave user {name} a new secret" } else { "created user {name}" }.replace("{name}", &name);
            if connection.json {
                let secret = generated.then_some(secret);
                say!("{}", serde_json::json!({ "user": name, "replaced": replaced, "secret": secret }));
            } else if generated {
                say!("{verb}; its secret (shown only now):\n{secret}");
            } else {
                say!("{verb}");
            }
        }
        UserCommand::Delete { name } => {
            client.delete_user(&name).await?;
            say!("deleted user {name}");
        }
        UserCommand::List => {
            let users = client.list_users().await?;
            if connection.json {
                say!("{}", serde_json::json!(users));
            } else {
                for user in users {
                    say!("{user}");
                }
            }
        }
        UserCommand::Whoami => {
            let me = client.who_am_i().await?;
            if connection.json {
                say!(
                    "{}",
                    serde_json::json!({
                        "principal": me.principal,
                        "authenticated_by": me.authenticated_by,
                        "authorization": me.authorization,
                        "super_user": me.super_user,
                    })
                );
            } else {
                let who = if me.principal.is_empty() { "anonymous".to_string() } else { me.principal.clone() };
                let rules = match (me.authorization, me.super_user) {
                    (false, _) => "the broker enforces no access rules",
                    (true, true) => "a super user: no rule limits it",
                    (true, false) => "the broker serves it what its rules grant",
                };
                say!("{who} (authenticated by {}); {rules}", me.authenticated_by);
            }
        }
    }
    Ok(())
}

pub async fn acl(command: AclCommand, connection: &Connection) -> anyhow::Result<()> {
    let client = connection.client()?;
    match command {
        AclCommand::Add(rule) => {
            let added = client.add_acl(rule.to_pb()).await?;
            say!("{}", if added { "added the rule" } else { "the rule was already there" });
        }
        AclCommand::Remove(rule) => {
            client.remove_acl(rule.to_pb()).await?;
            say!("removed the rule");
        }
        AclCommand::List { principal } => {
            let acls = client.list_acls(principal.as_deref().unwrap_or("")).await?;
            if connection.json {
                let rows: Vec<_> = acls
                    .iter()
                    .map(|a| {
                        serde_json::json!({
                            "principal": a.principal,
                            "operation": a.operation,
                            "resource": a.resource,
                            "name": a.name,
                            "prefix": a.prefix,
                        })
                    })
                    .collect();
                say!("{}", serde_json::json!(rows));
                return Ok(());
            }
            let mut table = crate::table(&["PRINCIPAL", "OPERATION", "RESOURCE", "NAME", "MATCH"], &[]);
            for a in acls {
                let pattern = if a.resource == "cluster" {
                    ""
                } else if a.prefix {
                    "prefix"
                } else {
                    "exact"
                };
                table.add_row(vec![a.principal, a.operation, a.resource, a.name, pattern.to_string()]);
            }
            crate::print_table(&table);
        }
    }
    Ok(())
}
