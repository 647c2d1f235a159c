//! `keel`: run a broker (`keel serve`) or talk to a cluster (topics,
//! produce, read, cluster status).

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use futures_util::StreamExt;
use keel_client::{pb, BatchingConfig, BatchingProducer, Client, Consumer, RetryPolicy};
use keel_server::clock::Clock;
use keel_server::node::{Node, NodeConfig};
use keel_server::storage::NodeStore;
use serde::{Deserialize, Serialize};

/// mimalloc rather than glibc's malloc: a broker allocates and frees at a
/// high rate (requests, entries, futures).
#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` for a command's output. A closed standard output (`keel
/// topic list | head -1`) ends the command quietly with status 141, as
/// SIGPIPE ends other Unix tools (the command may not have finished: a
/// `group reset` cut short has reset only some partitions), instead of a
/// panic. `keel consume`, `keel read` and `keel produce --json` check
/// their writes themselves (a record not written out must not be
/// acknowledged; records in flight must still be answered), and `keel
/// serve` goes on without its standard output.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!($($arg)*))
    };
}

/// The exit status of a command whose standard output was closed under
/// it: 128 + SIGPIPE, what a shell reports for a tool SIGPIPE ended.
const EXIT_OUTPUT_CLOSED: i32 = 141;

/// Write one line to standard output; see [`say!`].
fn write_out(line: std::fmt::Arguments<'_>) {
    let written = writeln!(std::io::stdout().lock(), "{line}");
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(EXIT_OUTPUT_CLOSED),
        Err(error) => {
            eprintln!("error: writing to standard output: {error}");
            std::process::exit(1);
        }
    }
}

mod access;
mod bench;
mod cert;
mod format;
mod profile;

#[derive(Parser)]
#[command(
    name = "keel",
    version,
    about = "keel: a Kafka-like message broker shown correct by deterministic simulation"
)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    logging: Logging,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker. With no arguments: a single-node cluster on
    /// 127.0.0.1:7070 with its data in ./keel-data.
    #[command(after_help = "Logs go to standard error at the level KEEL_LOG sets (a tracing filter: info, debug, \
        keel_server=debug,warn, ...; default: warnings and errors); --log-format json writes one JSON object a line. \
        SIGTERM or Ctrl-C shuts the broker down gracefully.\n\n\
        Examples:\n  keel serve\n  keel serve --id 1 --listen 10.0.0.1:7070 --peers 1=10.0.0.1:7170,2=10.0.0.2:7170,3=10.0.0.3:7170 \
        --cluster-secret \"$(cat secret)\"\n  keel serve --config /etc/keel.toml")]
    Serve(Box<ServeArgs>),
    /// Create, list, describe or delete topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Produce stdin, one record a line, to a topic.
    Produce(ProduceArgs),
    /// Consume as a member of a consumer group: print records as they
    /// arrive and acknowledge them.
    Consume(ConsumeArgs),
    /// Print committed records of one partition (no group, no commit).
    Read(ReadArgs),
    /// Describe a consumer group or reset its positions.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Show the brokers and the metadata leader.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Measure a cluster: produce or consume load, with rates and latency.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Create, delete and list users: principals that prove who they are
    /// with a secret instead of a certificate.
    #[command(
        subcommand,
        after_help = "Example:\n  keel user create alice          # prints a new secret\n  \
        KEEL_USER=alice KEEL_SECRET=... keel topic list"
    )]
    User(access::UserCommand),
    /// Grant, take back and list access rules (with keel serve --authorize).
    #[command(
        subcommand,
        after_help = "Examples:\n  keel acl add alice produce --topic payments\n  \
        keel acl add alice consume --topic logs. --prefix\n  keel acl add alice join --group billing\n  \
        keel acl add ops users --cluster\n  keel acl list alice"
    )]
    Acl(access::AclCommand),
    /// Save, choose and list connection profiles (brokers and TLS files).
    #[command(
        subcommand,
        after_help = "Example:\n  keel profile create prod --broker 10.0.0.1:7070 --tls-ca certs/ca.pem \
        --tls-cert certs/client-admin.pem --tls-key certs/client-admin.key\n  keel topic list   # uses prod"
    )]
    Profile(profile::ProfileCommand),
    /// Create a certificate authority and the broker and client
    /// certificates of a TLS cluster.
    #[command(
        subcommand,
        after_help = "Example:\n  keel cert create-ca\n  \
        keel cert create-broker 1 --host 10.0.0.1,broker1.example.com\n  keel cert create-client alice"
    )]
    Cert(cert::CertCommand),
    /// Print a shell completion script.
    #[command(after_help = "Examples:\n  keel completions bash > /etc/bash_completion.d/keel\n  \
        keel completions zsh > \"${fpath[1]}/_keel\"\n  keel completions fish > ~/.config/fish/completions/keel.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print keel's manual page (roff), e.g. `keel man | man -l -`.
    Man,
}

/// `keel serve`'s flags, and the same settings in its TOML file (the
/// `--config` file is parsed into this too). A setting not given is `None`
/// and not serialized, so it does not hide a lower layer (see [`settle`]).
#[derive(Args, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServeArgs {
    /// A TOML file with any of these settings (flags and KEEL_* variables win).
    #[arg(long, env = "KEEL_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// This broker's id [default: 1].
    #[arg(long, env = "KEEL_ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    /// Address the client API listens on [default: 127.0.0.1:7070].
    #[arg(long, env = "KEEL_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Address clients use to reach this broker [default: the listen
    /// address].
    #[arg(long, env = "KEEL_ADVERTISE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise: Option<String>,
    /// Address the internal listener (Raft and joins, for other brokers
    /// only) listens on [default: the listen address's port + 100].
    #[arg(long, env = "KEEL_INTERNAL_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    internal_listen: Option<SocketAddr>,
    /// Address other brokers use to reach this one [default: the advertised
    /// address's port + 100, or the internal listen address].
    #[arg(long, env = "KEEL_INTERNAL_ADVERTISE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    internal_advertise: Option<String>,
    /// The secret every broker of the cluster shares (broker-to-broker
    /// requests carry it). A new one-broker cluster creates one in
    /// DATA_DIR/cluster-secret; a cluster of several brokers, and every
    /// broker that joins, must be given it. Once given, it is kept in
    /// DATA_DIR/cluster-secret.
    #[arg(long, env = "KEEL_CLUSTER_SECRET", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_secret: Option<String>,
    /// Data directory [default: ./keel-data].
    #[arg(long, env = "KEEL_DATA_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// The brokers of a new cluster, this one included, by their internal
    /// addresses: ID=HOST:PORT,...
    #[arg(long, env = "KEEL_PEERS", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    peers: Option<Vec<String>>,
    /// Join a running cluster through any of these brokers (their client
    /// addresses, host:port,...) instead of forming a new one. Give the same
    /// on every restart, with the cluster's secret.
    #[arg(long, env = "KEEL_JOIN", value_delimiter = ',', conflicts_with = "peers")]
    #[serde(skip_serializing_if = "Option::is_none")]
    join: Option<Vec<String>>,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (off by default).
    #[arg(long, env = "KEEL_METRICS_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_listen: Option<SocketAddr>,
    /// How often each partition leader checks whether records are due to go
    /// under its topic's retention (e.g. 30s, 5m) [default: 30s].
    #[arg(long, env = "KEEL_RETENTION_CHECK_INTERVAL", value_parser = humantime::parse_duration)]
    #[serde(skip)]
    retention_check_interval: Option<std::time::Duration>,
    /// The broker's TLS files: `keel --tls-cert/--tls-key/--tls-ca` (or
    /// KEEL_TLS_*), which every command shares, or these keys in the file.
    /// With all three, every listener speaks TLS. The certificate names the
    /// broker's host (as peers and clients reach it) and the DNS name
    /// keel-broker-ID (its broker id). Read again on SIGHUP.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<PathBuf>,
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<PathBuf>,
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_ca: Option<PathBuf>,
    /// A CA bundle (PEM) that signs client certificates: clients must then
    /// show one to connect [default: clients are not asked for one].
    #[arg(long, env = "KEEL_TLS_CLIENT_CA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_client_ca: Option<PathBuf>,
    /// Serve only authenticated callers (a client certificate, or a user and
    /// its secret), and each only what an access rule (keel acl) grants it.
    /// Give every broker of the cluster the same setting.
    #[arg(long, env = "KEEL_AUTHORIZE", num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    authorize: Option<bool>,
    /// Principals that may do everything, whatever the rules say: the first
    /// administrator (a client certificate's common name, or a user).
    #[arg(long = "super-user", env = "KEEL_SUPER_USERS", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    super_users: Option<Vec<String>>,
}

/// How client commands reach the cluster and print; accepted before or
/// after the subcommand.
#[derive(Args)]
pub(crate) struct Connection {
    /// Brokers of the cluster, by their client addresses (host:port,
    /// comma-separated); the others are discovered [default: the
    /// profile's, else 127.0.0.1:7070].
    #[arg(long, env = "KEEL_BROKER", global = true, value_delimiter = ',', value_parser = parse_broker_address)]
    pub(crate) broker: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Give up on a request after this long (e.g. 5s, 1m); a broker that
    /// refuses the connection fails the command at once [default: the
    /// profile's, else 30s].
    #[arg(long, env = "KEEL_TIMEOUT", global = true, value_parser = humantime::parse_duration)]
    pub(crate) timeout: Option<std::time::Duration>,
    /// Take what other connection flags are not given from this profile
    /// (see keel profile) [default: the one keel profile use chose].
    #[arg(long, env = "KEEL_PROFILE", global = true)]
    pub(crate) profile: Option<String>,
    /// Speak TLS, trusting brokers whose certificates this CA bundle (PEM)
    /// signed. For `keel serve`: the cluster CA, which signs every broker.
    #[arg(long, env = "KEEL_TLS_CA", global = true)]
    pub(crate) tls_ca: Option<PathBuf>,
    /// The certificate chain (PEM) to prove who this is with: a client's,
    /// for brokers that ask for one; for `keel serve`, the broker's own.
    #[arg(long, env = "KEEL_TLS_CERT", global = true, requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "KEEL_TLS_KEY", global = true, requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Authenticate as this user (made with keel user create), with
    /// --secret; wins over a client certificate.
    #[arg(long, env = "KEEL_USER", global = true, requires = "secret")]
    pub(crate) user: Option<String>,
    /// The secret of --user. Prefer KEEL_SECRET or a profile: a flag shows
    /// in the process list.
    #[arg(long, env = "KEEL_SECRET", global = true, hide_env_values = true, requires = "user")]
    pub(crate) secret: Option<String>,
}

/// The broker a client command asks when neither a flag nor a profile names one.
pub(crate) const DEFAULT_BROKER: &str = "127.0.0.1:7070";
/// How long a client command tries when neither a flag nor a profile says.
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Connection {
    /// The retry policy of a command-line client: up to `--timeout`, and
    /// no waiting on a cluster that cannot be reached at all.
    pub(crate) fn policy(&self) -> RetryPolicy {
        let defaults = RetryPolicy::default();
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        RetryPolicy {
            deadline: timeout,
            request_timeout: defaults.request_timeout.min(timeout),
            give_up_when_unreachable: true,
            ..defaults
        }
    }

    /// A client of the brokers given (over TLS with --tls-ca).
    pub(crate) fn client(&self) -> anyhow::Result<Client> {
        self.client_of(self.broker.clone())
    }

    /// A client of `brokers`, with this connection's policy, TLS and user.
    pub(crate) fn client_of(&self, brokers: Vec<String>) -> anyhow::Result<Client> {
        let client = match &self.tls_ca {
            None if self.tls_cert.is_some() => {
                bail!("--tls-cert needs --tls-ca (the CA that signed the brokers' certificates)")
            }
            None => Client::new(brokers, self.policy())?,
            Some(ca) => {
                let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
                let tls = keel_client::ClientTls::from_files(ca, identity)?;
                Client::with_tls(brokers, self.policy(), &tls)?
            }
        };
        match (&self.user, &self.secret) {
            (Some(user), Some(secret)) => Ok(client.with_credentials(keel_client::Credentials::user(user, secret)?)?),
            _ => Ok(client),
        }
    }
}

/// A duration written the human way (`30s`, `7d`), or a bare number in
/// `unit`s (the older flags' form).
fn duration_or(text: &str, unit: std::time::Duration) -> Result<std::time::Duration, String> {
    match text.trim().parse::<u32>() {
        Ok(count) => Ok(unit * count),
        Err(_) => humantime::parse_duration(text).map_err(|e| format!("{e}: write e.g. 500ms, 30s, 10m or 1h")),
    }
}

fn duration_or_ms(text: &str) -> Result<std::time::Duration, String> {
    duration_or(text, std::time::Duration::from_millis(1))
}

/// `consume --poll-wait`: at least 10 ms, or an idle member would poll
/// in a tight loop.
fn poll_wait(text: &str) -> Result<std::time::Duration, String> {
    let wait = duration_or_ms(text)?;
    if wait < std::time::Duration::from_millis(10) {
        return Err(format!("{wait:?} is too short: give at least 10ms (5s is the default)"));
    }
    Ok(wait)
}

fn duration_or_secs(text: &str) -> Result<std::time::Duration, String> {
    duration_or(text, std::time::Duration::from_secs(1))
}

/// Check a `--broker` address when the flags are parsed: `host:port`, no
/// scheme, a port number.
fn parse_broker_address(text: &str) -> Result<String, String> {
    let text = text.trim();
    if let Some((scheme, _)) = text.split_once("://") {
        return Err(format!("give host:port without the {scheme}:// scheme"));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("expected host:port, e.g. 127.0.0.1:7070".to_string());
    };
    if host.is_empty() || host.contains(['/', ' ', '@']) {
        return Err(format!("{host:?} is not a host name or address; expected host:port, e.g. 127.0.0.1:7070"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{port:?} is not a port number (1-65535); expected host:port")),
        Ok(_) => Ok(text.to_string()),
    }
}

/// Log settings (brokers log to standard error).
#[derive(Args)]
struct Logging {
    /// Log lines as text or as JSON objects, one a line.
    #[arg(long, env = "KEEL_LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The log filter when `KEEL_LOG` is not set: warnings and errors, except
/// openraft's line per failed replication call (one per group per retry
/// while a peer is down); keel logs each peer's going down and coming back
/// once, and counts the failed calls in `keel_peer_failed_calls_total`;
/// and openraft's core loop, which logs a line per failed vote call and per
/// late vote answer (thousands a second while a broker with thousands of
/// groups elects: 450 MB of log in four minutes at 10,000 partitions).
const DEFAULT_LOG_FILTER: &str =
    "warn,openraft::replication=off,openraft::engine::handler::replication_handler=off,openraft::core::raft_core=off";

/// Log to standard error at the level `KEEL_LOG` asks for (a tracing
/// filter, default [`DEFAULT_LOG_FILTER`]), refusing a filter that does not
/// parse; colour only on a terminal.
fn start_logging(logging: &Logging) -> anyhow::Result<()> {
    let filter = match std::env::var("KEEL_LOG") {
        Ok(text) => tracing_subscriber::EnvFilter::try_new(&text).map_err(|error| {
            anyhow::anyhow!("KEEL_LOG={text:?} is not a log filter ({error}); use a level such as info or debug, or e.g. keel_server=debug,warn")
        })?,
        Err(_) => tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match logging.log_format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

#[derive(Subcommand)]
enum TopicCommand {
    /// Create a topic, its partitions spread over the brokers.
    #[command(after_help = "Example: keel topic create orders --partitions 6 --replication-factor 3 --retention 7d")]
    Create {
        /// The topic's name (letters, digits, '.', '_', '-').
        name: String,
        /// How many partitions (each its own Raft group).
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Replicas of each partition, on distinct brokers.
        #[arg(long, default_value_t = 1)]
        replication_factor: u32,
        /// Remove records older than this (e.g. 7d, 12h) [default: keep].
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Option<std::time::Duration>,
        /// Remove the oldest records while the partition holds more than
        /// this (e.g. 10GiB, 500MB) [default: keep].
        #[arg(long)]
        retention_bytes: Option<bytesize::ByteSize>,
    },
    /// List every topic with its partitions.
    List,
    /// Show a topic's partitions: replicas, leader, log start, high
    /// watermark and retention.
    Describe {
        /// The topic.
        name: String,
    },
    /// Delete a topic and its records (on every broker).
    Delete {
        /// The topic.
        name: String,
    },
    /// Change a topic's settings: add partitions (keys then map to other
    /// partitions, as in Kafka; groups reading it rebalance) or change its
    /// retention. Settings not given stay as they are.
    #[command(after_help = "Examples:\n  keel topic alter orders --partitions 12\n  \
        keel topic alter orders --retention 3d --retention-bytes 1GiB\n  \
        keel topic alter orders --retention forever")]
    Alter {
        /// The topic.
        name: String,
        /// The new partition count; partitions can only be added.
        #[arg(long)]
        partitions: Option<u32>,
        /// Remove records older than this (e.g. 7d, 12h), or `forever` to
        /// keep them.
        #[arg(long, value_parser = parse_retention_age)]
        retention: Option<u64>,
        /// Remove the oldest records while a partition holds more than this
        /// (e.g. 10GiB), or `unlimited`.
        #[arg(long, value_parser = parse_retention_bytes)]
        retention_bytes: Option<u64>,
    },
    /// Move one partition's replicas to other brokers (to drain a broker
    /// before removing it). The partition's leader then changes the
    /// group's membership; `topic describe` shows the voters converge.
    #[command(after_help = "Example: keel topic move orders --partition 0 --replicas 2,3,4")]
    Move {
        /// The topic.
        name: String,
        /// The partition to move.
        #[arg(long)]
        partition: u32,
        /// The new replicas, by broker id: ID,ID,...
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<u64>,
        /// Wait until every new replica's Raft voters are exactly the new
        /// replicas, showing progress; give up after this long (10m if
        /// given without a value). The move goes on either way.
        #[arg(long, num_args = 0..=1, default_missing_value = "10m", value_parser = humantime::parse_duration)]
        wait: Option<std::time::Duration>,
    },
}

#[derive(Args)]
#[command(after_help = "Example: printf 'user-1:hello\\nuser-2:world\\n' | keel produce orders --key-separator :")]
struct ProduceArgs {
    /// The topic to append to.
    topic: String,
    /// Split each line at the first SEPARATOR into key and value.
    #[arg(long)]
    key_separator: Option<String>,
    /// Send every record to this partition, whatever its key.
    #[arg(long)]
    partition: Option<u32>,
    /// A header on every record, KEY=VALUE (repeat for more).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<pb::Header>,
}

/// `--to-time`, in milliseconds since the Unix epoch: an RFC 3339 time, or
/// a duration meaning that long before now.
fn parse_time_ms(text: &str) -> Result<u64, String> {
    let hint = "write an RFC 3339 time such as 2026-12-01T08:00:00Z, or a duration ago such as 90m or 7d";
    let time = match humantime::parse_duration(text) {
        Ok(ago) => {
            std::time::SystemTime::now().checked_sub(ago).ok_or_else(|| format!("{text} ago is too far back"))?
        }
        Err(_) => humantime::parse_rfc3339_weak(text).map_err(|e| format!("{e}: {hint}"))?,
    };
    let since_epoch = time.duration_since(std::time::UNIX_EPOCH).map_err(|_| format!("{text} is before 1970"))?;
    Ok(since_epoch.as_millis() as u64)
}

/// `topic alter --retention`: milliseconds, 0 for `forever`.
fn parse_retention_age(text: &str) -> Result<u64, String> {
    if text == "forever" {
        return Ok(0);
    }
    let age = humantime::parse_duration(text).map_err(|e| format!("{e}: write a duration such as 7d, or forever"))?;
    match u64::try_from(age.as_millis()) {
        Ok(0) => Err("a retention of 0 would remove every record: give a duration, or forever".to_string()),
        Ok(ms) => Ok(ms),
        Err(_) => Ok(u64::MAX),
    }
}

/// `topic alter --retention-bytes`: bytes, 0 for `unlimited`.
fn parse_retention_bytes(text: &str) -> Result<u64, String> {
    if text == "unlimited" {
        return Ok(0);
    }
    match text.parse::<bytesize::ByteSize>() {
        Ok(size) if size.as_u64() > 0 => Ok(size.as_u64()),
        Ok(_) => Err("a size of 0 would remove every record: give a size, or unlimited".to_string()),
        Err(e) => Err(format!("{e}: write a size such as 10GiB, or unlimited")),
    }
}

/// `--header KEY=VALUE`.
fn parse_header(text: &str) -> Result<pb::Header, String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => {
            Ok(pb::Header { key: key.to_string(), value: value.as_bytes().to_vec() })
        }
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// An assignor as `keel consume --assignor` names it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum AssignorArg {
    Sticky,
    Range,
    RoundRobin,
}

impl AssignorArg {
    fn wire(self) -> pb::Assignor {
        match self {
            AssignorArg::Sticky => pb::Assignor::Sticky,
            AssignorArg::Range => pb::Assignor::Range,
            AssignorArg::RoundRobin => pb::Assignor::RoundRobin,
        }
    }
}

/// How `group describe` names an assignor.
fn assignor_label(wire: i32) -> &'static str {
    match pb::Assignor::try_from(wire) {
        Ok(pb::Assignor::Sticky) => "sticky",
        Ok(pb::Assignor::Range) => "range",
        Ok(pb::Assignor::RoundRobin) => "round-robin",
        _ => "unknown",
    }
}

#[derive(Args)]
#[command(after_help = "Examples:\n  keel consume orders --group billing --max-records 100\n  \
    keel consume orders --group audit --from 2026-12-01T08:00:00Z\n\n\
    Ctrl-C (or SIGTERM) leaves the group, so its partitions go to the other members at once.")]
struct ConsumeArgs {
    /// Topics to subscribe to.
    #[arg(required = true)]
    topics: Vec<String>,
    /// The consumer group to join.
    #[arg(long)]
    group: String,
    /// This member's id (default: keel-cli-<process id>).
    #[arg(long)]
    member: Option<String>,
    /// How long without a heartbeat before the group drops this member and
    /// gives its partitions to others (e.g. 10s; a bare number is ms, as
    /// the older --session-timeout-ms took).
    #[arg(long, alias = "session-timeout-ms", default_value = "10s", value_parser = duration_or_ms)]
    session_timeout: std::time::Duration,
    /// How long each long poll may wait at a broker for records (e.g. 5s;
    /// at least 10ms; brokers cap it at 30s). A record ends the wait at
    /// once, so a longer wait only makes an idle member cheaper for the
    /// brokers.
    #[arg(long, default_value = "5s", value_parser = poll_wait)]
    poll_wait: std::time::Duration,
    /// Stop after this many records.
    #[arg(long)]
    max_records: Option<u64>,
    /// Stop after this long without a record (e.g. 5s; a bare number is
    /// ms, as the older --idle-timeout-ms took).
    #[arg(long, alias = "idle-timeout-ms", value_parser = duration_or_ms)]
    idle_timeout: Option<std::time::Duration>,
    /// Before joining, move the group's position on every partition of the
    /// topics: earliest (the log start), latest (the high watermark), an
    /// offset, or the first record appended at or after a time (RFC 3339,
    /// or a duration ago such as 90m). The group must have no members.
    /// Without it the group goes on from its committed positions.
    #[arg(long, value_parser = StartFrom::parse)]
    from: Option<StartFrom>,
    /// How the group shares partitions among its members: sticky (balanced,
    /// members keep what they had), range (contiguous ranges per topic) or
    /// round-robin. Every member of a group uses the same one; without it
    /// this member takes the group's (sticky for a new group).
    #[arg(long, value_enum)]
    assignor: Option<AssignorArg>,
    #[command(flatten)]
    output: RecordOutput,
}

/// Where `consume --from` and `group reset` put a group's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartFrom {
    Earliest,
    Latest,
    Offset(u64),
    /// Milliseconds since the Unix epoch.
    Time(u64),
}

impl StartFrom {
    fn parse(text: &str) -> Result<StartFrom, String> {
        match text {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            _ if text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse().map(StartFrom::Offset).map_err(|e| format!("{text:?}: {e}"))
            }
            _ => parse_time_ms(text)
                .map(StartFrom::Time)
                .map_err(|e| format!("{text:?} is not earliest, latest, an offset or a time ({e})")),
        }
    }

    /// The reset request's target for one partition (a time is looked up).
    async fn target(
        self,
        client: &Client,
        topic: &str,
        partition: u32,
    ) -> anyhow::Result<pb::reset_group_position_request::To> {
        use pb::reset_group_position_request::To;
        Ok(match self {
            StartFrom::Earliest => To::Earliest(true),
            StartFrom::Latest => To::Latest(true),
            StartFrom::Offset(offset) => To::Offset(offset),
            StartFrom::Time(time_ms) => To::Offset(client.offset_at_time(topic, partition, time_ms).await?),
        })
    }
}

/// How `consume` and `read` print records (without `--json`).
#[derive(Args)]
struct RecordOutput {
    /// A line per record built of fields: %t topic, %p partition, %o
    /// offset, %k key, %v value, %T append time (ms since the epoch), %h
    /// headers (k=v,...), %% a percent sign; \n newline, \t tab [default:
    /// "%t/%p\t%o\t%k\t%v\n"].
    #[arg(long)]
    format: Option<format::RecordFormat>,
    /// How keys, values and header values are written: as their bytes,
    /// hex or base64.
    #[arg(long, value_enum, default_value_t = format::Encoding::Raw)]
    encoding: format::Encoding,
}

/// The default line of `consume` and `read`: where, offset, key, value.
const DEFAULT_RECORD_FORMAT: &str = "%t/%p\\t%o\\t%k\\t%v\\n";

impl RecordOutput {
    /// Write one record to standard output in this format. An error means
    /// the output is gone (a closed pipe: `| head`) or full.
    fn print(&self, topic: &str, partition: u32, stored: &pb::StoredRecord) -> std::io::Result<()> {
        let default = || DEFAULT_RECORD_FORMAT.parse::<format::RecordFormat>().expect("the default format parses");
        let format = self.format.clone().unwrap_or_else(default);
        format.print(topic, partition, stored, self.encoding)
    }
}

#[derive(Args)]
#[command(after_help = "Example: keel read orders --partition 2 --offset 0 --max-records 10")]
struct ReadArgs {
    /// The topic.
    topic: String,
    /// The partition to read.
    #[arg(long, default_value_t = 0)]
    partition: u32,
    /// The first offset to read.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Read at most this many records (with --follow: per request).
    #[arg(long, default_value_t = 100)]
    max_records: u32,
    /// After the records there, wait for new ones and print them as they
    /// are committed, until Ctrl-C (like `tail -f`).
    #[arg(long)]
    follow: bool,
    /// Read from the replica on the broker asked (--broker), without asking
    /// the partition's leader: it may lack the latest commits (normally
    /// those of the last 10 ms). By default the leader answers, with every acknowledged
    /// record.
    #[arg(long)]
    any_replica: bool,
    #[command(flatten)]
    output: RecordOutput,
}

#[derive(Subcommand)]
enum GroupCommand {
    /// Every consumer group: generation, members, subscribed topics.
    List,
    /// Members, assignment, committed position and lag of every partition
    /// the group reads or has a position on.
    Describe {
        /// The group.
        name: String,
    },
    /// Set the group's position on the partitions of a topic (the group
    /// must have no members): earliest, latest, an offset, or the first
    /// record appended at or after a time.
    #[command(after_help = "Examples:\n  keel group reset billing --topic orders --to earliest\n  \
        keel group reset billing --topic orders --partition 2 --to 1500\n  \
        keel group reset billing --topic orders --to-time 2026-12-01T08:00:00Z --dry-run\n  \
        keel group reset billing --topic orders --to-time 1h")]
    Reset {
        /// The group.
        name: String,
        /// The topic whose partitions get the new position.
        #[arg(long)]
        topic: String,
        /// Only these partitions (repeat the flag or separate them with
        /// commas); every partition of the topic if not given.
        #[arg(long = "partition", value_delimiter = ',')]
        partitions: Vec<u32>,
        /// earliest (the log start), latest (the high watermark), an
        /// offset, or a time as --to-time takes it.
        #[arg(long, default_value = "earliest", conflicts_with = "to_time")]
        to: String,
        /// The first record appended at or after this time (the high
        /// watermark if none was): an RFC 3339 time such as
        /// 2026-12-01T08:00:00Z, or a duration ago such as 90m or 7d.
        #[arg(long, value_parser = parse_time_ms)]
        to_time: Option<u64>,
        /// Show each partition's current position and the one it would
        /// get, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete a group that has no members, with its position on every
    /// partition: a group of the same name joined later starts afresh.
    #[command(after_help = "Example: keel group delete billing")]
    Delete {
        /// The group.
        name: String,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Show the brokers (address, liveness, replicas) and the metadata
    /// leader and voters.
    Status,
    /// Move every replica off a broker and wait until no partition group
    /// names it (then it can be removed). Nothing new is placed on it.
    Drain {
        /// The broker's id.
        id: u64,
        /// Give up waiting after this long (e.g. 10m; the drain goes on). A
        /// bare number is seconds, as the older --timeout-secs took.
        #[arg(long, alias = "timeout-secs", default_value = "10m", value_parser = duration_or_secs)]
        wait: std::time::Duration,
    },
    /// Say whether the cluster is healthy: brokers down, partitions without
    /// a leader, partitions under-replicated (a replica down, or voters
    /// not yet the replicas), like `rpk cluster health`.
    #[command(after_help = "Exits 0 either way; with --json, `healthy` says which.")]
    Health,
    /// Remove a broker that holds no replicas (drain it first).
    RemoveBroker {
        /// The broker's id.
        id: u64,
    },
    /// Print a new random cluster secret (64 hex digits) to give every
    /// broker of a new cluster (--cluster-secret or KEEL_CLUSTER_SECRET).
    #[command(after_help = "Example: export KEEL_CLUSTER_SECRET=$(keel cluster new-secret)")]
    NewSecret,
    /// List the cluster's settings (its limits), or change one with `set`.
    /// Settings of scope "cluster" apply to every later command on every
    /// broker; those of scope "partition" are fixed in each partition when
    /// its topic is created.
    #[command(after_help = "Examples:\n  keel cluster config\n  keel cluster config set groups_max 50000")]
    Config {
        #[command(subcommand)]
        action: Option<ConfigAction>,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Change a setting of scope "cluster". Refused if the cluster already
    /// holds more than the new value admits (e.g. more groups than
    /// groups_max).
    Set {
        /// The setting, as `keel cluster config` lists it.
        name: String,
        /// Its new value (counts, or milliseconds for *_ms).
        value: u64,
    },
}

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    // Client commands fill what they were not given from the profile in
    // use; a broker never takes a user's profile.
    let takes_profile = !matches!(
        cli.command,
        Command::Serve(_) | Command::Profile(_) | Command::Cert(_) | Command::Completions { .. } | Command::Man
    );
    if takes_profile {
        if let Err(error) = profile::apply(&mut cli.connection) {
            eprintln!("error: {error:#}");
            return std::process::ExitCode::FAILURE;
        }
    }
    if let Err(error) = start_logging(&cli.logging) {
        eprintln!("error: {error:#}");
        return std::process::ExitCode::FAILURE;
    }
    let result = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(cli.command, &cli.connection)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", explain(&error, &cli.connection));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The message for a failed command, with advice where the cause is known.
fn explain(error: &anyhow::Error, connection: &Connection) -> String {
    if let Some(keel_client::ClientError::Refused(status)) = error.downcast_ref() {
        // What a broker's internal listener answers to a client request.
        if status.code() == tonic::Code::Unimplemented && status.message().is_empty() {
            return format!(
                "{} answered, but without keel's client API: is it a broker's internal (broker-to-broker) \
                 address? Give its client address (its --listen; by default the internal port - 100) with --broker",
                connection.broker.join(",")
            );
        }
    }
    format!("{error:#}")
}

async fn run(command: Command, connection: &Connection) -> anyhow::Result<()> {
    match command {
        Command::Serve(mut args) => {
            // The shared TLS flags beat the file's keys.
            args.tls_cert = connection.tls_cert.clone().or(args.tls_cert);
            args.tls_key = connection.tls_key.clone().or(args.tls_key);
            args.tls_ca = connection.tls_ca.clone().or(args.tls_ca);
            serve(*args).await
        }
        Command::Topic(command) => topic(command, connection).await,
        Command::Produce(args) => produce(args, connection).await,
        Command::Read(args) => read(args, connection).await,
        Command::Consume(args) => consume(args, connection).await,
        Command::Bench(command) => bench::run(command, connection).await,
        Command::Cert(command) => cert::run(command),
        Command::Profile(command) => profile::run(command, connection, connection.json),
        Command::User(command) => access::user(command, connection).await,
        Command::Acl(command) => access::acl(command, connection).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "keel", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => {
            use clap::CommandFactory;
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()).context("writing the manual page")
        }
        Command::Group(command) => group(command, connection).await,
        Command::Cluster(ClusterCommand::Drain { id, wait }) => drain(id, wait, connection).await,
        Command::Cluster(ClusterCommand::RemoveBroker { id }) => {
            connection.client()?.remove_broker(id).await?;
            if connection.json {
                print_json(&pb::RemoveBrokerRequest { broker: id });
            } else {
                say!("removed broker {id}");
            }
            Ok(())
        }
        Command::Cluster(ClusterCommand::Health) => health(connection).await,
        Command::Cluster(ClusterCommand::NewSecret) => {
            say!("{}", new_secret());
            Ok(())
        }
        Command::Cluster(ClusterCommand::Config { action: None }) => {
            let settings = connection.client()?.describe_cluster_config().await?;
            if connection.json {
                print_json(&pb::DescribeClusterConfigResponse { settings });
            } else {
                let mut rows = table(&["SETTING", "VALUE", "SCOPE"], &["VALUE"]);
                for setting in settings {
                    rows.add_row([setting.name, setting.value.to_string(), setting.scope]);
                }
                print_table(&rows);
            }
            Ok(())
        }
        Command::Cluster(ClusterCommand::Config { action: Some(ConfigAction::Set { name, value }) }) => {
            let previous = connection.client()?.set_cluster_config(&name, value).await?;
            if connection.json {
                print_json(&pb::SetClusterConfigResponse { previous, value });
            } else {
                say!("{name} = {value} (was {previous})");
            }
            Ok(())
        }
        Command::Cluster(ClusterCommand::Status) => {
            let cluster = cluster_as_the_leader_sees_it(&connection.client()?, connection).await?;
            if connection.json {
                print_json(&cluster);
            } else {
                let mut rows = table(&["BROKER", "ADDRESS", "LIVE", "REPLICAS", "ROLE"], &["REPLICAS"]);
                for broker in &cluster.brokers {
                    let role = if broker.id == cluster.metadata_leader {
                        "metadata leader"
                    } else if cluster.metadata_voters.contains(&broker.id) {
                        "metadata voter"
                    } else {
                        ""
                    };
                    let live = if broker.live { "yes" } else { "no" };
                    let role = if broker.draining { format!("{role} (draining)") } else { role.to_string() };
                    rows.add_row([
                        broker.id.to_string(),
                        broker.address.clone(),
                        live.to_string(),
                        broker.replicas.to_string(),
                        role,
                    ]);
                }
                print_table(&rows);
            }
            Ok(())
        }
    }
}

/// The cluster as its metadata leader describes it: liveness is only as
/// complete as the leader sees it (any broker answers, from its copy).
async fn cluster_as_the_leader_sees_it(
    client: &Client,
    connection: &Connection,
) -> anyhow::Result<pb::DescribeClusterResponse> {
    let cluster = client.describe_cluster().await?;
    let leader = cluster.brokers.iter().find(|b| b.id == cluster.metadata_leader).map(|b| b.address.clone());
    if let Some(leader) = leader {
        if let Ok(seen) = connection.client_of(vec![leader])?.describe_cluster().await {
            return Ok(seen);
        }
    }
    Ok(cluster)
}

/// `keel cluster health`: brokers down as the metadata leader sees them,
/// and every partition as a replica reports it.
async fn health(connection: &Connection) -> anyhow::Result<()> {
    let client = connection.client()?;
    let cluster = cluster_as_the_leader_sees_it(&client, connection).await?;
    let down: Vec<u64> = cluster.brokers.iter().filter(|b| !b.live).map(|b| b.id).collect();
    let mut topics = client.list_topics().await?;
    from_replicas(&client, connection, &mut topics).await;
    let (mut leaderless, mut under_replicated) = (Vec::new(), Vec::new());
    for topic in &topics {
        for p in &topic.partitions {
            let at = serde_json::json!({"topic": topic.name, "partition": p.partition});
            if p.leader == 0 || !p.hosted {
                leaderless.push(at.clone());
            }
            let mut voters = p.voters.clone();
            let mut replicas = p.replicas.clone();
            voters.sort_unstable();
            replicas.sort_unstable();
            if p.replicas.iter().any(|r| down.contains(r)) || (p.hosted && voters != replicas) {
                under_replicated.push(at);
            }
        }
    }
    let healthy =
        cluster.metadata_leader != 0 && down.is_empty() && leaderless.is_empty() && under_replicated.is_empty();
    if connection.json {
        let down: Vec<String> = down.iter().map(u64::to_string).collect();
        print_json(&serde_json::json!({
            "healthy": healthy,
            "metadata_leader": cluster.metadata_leader.to_string(),
            "brokers_down": down,
            "leaderless_partitions": leaderless,
            "under_replicated_partitions": under_replicated,
        }));
        return Ok(());
    }
    let list = |items: &[serde_json::Value]| {
        let names: Vec<String> =
            items.iter().map(|i| format!("{}/{}", i["topic"].as_str().unwrap_or(""), i["partition"])).collect();
        format!("[{}]", names.join(", "))
    };
    say!("healthy:                     {}", if healthy { "yes" } else { "no" });
    let leader = if cluster.metadata_leader == 0 { "none".to_string() } else { cluster.metadata_leader.to_string() };
    say!("metadata leader:             {leader}");
    say!("brokers down:                {down:?}");
    say!("leaderless partitions:       {}", list(&leaderless));
    say!("under-replicated partitions: {}", list(&under_replicated));
    Ok(())
}

/// `keel cluster drain`: move every replica off broker `id`, then report
/// progress until no partition group names it.
async fn drain(id: u64, timeout: std::time::Duration, connection: &Connection) -> anyhow::Result<()> {
    let client = discovering_client(connection).await?;
    let moved = client.drain_broker(id).await?;
    if !connection.json {
        eprintln!("draining broker {id}: {moved} replicas moving to other brokers");
    }
    let started = tokio::time::Instant::now();
    let mut last = None;
    // On a terminal a live line with the replicas left; elsewhere (a log)
    // a line each time the count changes.
    let bar = indicatif::ProgressBar::with_draw_target(Some(moved), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {elapsed} draining broker {msg}: {pos}/{len} replicas moved",
        )
        .expect("a valid template"),
    );
    bar.set_message(id.to_string());
    let live = std::io::stderr().is_terminal() && !connection.json;
    loop {
        let cluster = client.describe_cluster().await?;
        let Some(broker) = cluster.brokers.iter().find(|b| b.id == id) else {
            bail!("broker {id} is not registered (was it removed already?)");
        };
        if live {
            bar.set_length(moved.max(broker.replicas));
            bar.set_position(moved.saturating_sub(broker.replicas));
        } else if last != Some(broker.replicas) && !connection.json {
            eprintln!("broker {id}: {} replicas left", broker.replicas);
        }
        last = Some(broker.replicas);
        if broker.replicas == 0 {
            break;
        }
        if started.elapsed() > timeout {
            bail!(
                "broker {id} still holds {} replicas after {}s: check that the brokers they move to run and are \
                 reachable; the drain goes on, run this again to wait",
                broker.replicas,
                timeout.as_secs()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    bar.finish_and_clear();
    if connection.json {
        print_json(&pb::DrainBrokerResponse { moved });
    } else {
        say!("broker {id} holds no replicas: remove it with `keel cluster remove-broker {id}`");
    }
    Ok(())
}

/// `keel topic move --wait`: ask each new replica how it sees the
/// partition until each hosts it with exactly the new replicas as voters.
async fn wait_for_move(
    client: &Client,
    connection: &Connection,
    topic: &str,
    moved: &pb::PartitionDescription,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let partition = moved.partition;
    let mut target = moved.replicas.clone();
    target.sort_unstable();
    let started = tokio::time::Instant::now();
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(target.len() as u64), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} {{elapsed}} moving {topic}/{partition} to {}: {{pos}}/{{len}} replicas in place; {{msg}}",
            ids(&target)
        ))
        .expect("a valid template"),
    );
    let live = std::io::stderr().is_terminal() && !connection.json;
    let mut last = None;
    loop {
        let cluster = client.describe_cluster().await?;
        let mut in_place = 0;
        let mut seen = Vec::new();
        for replica in &target {
            let view = match cluster.brokers.iter().find(|b| b.id == *replica) {
                Some(broker) => match connection.client_of(vec![broker.address.clone()]) {
                    Ok(replica_client) => replica_client.describe_topic(topic).await.ok(),
                    Err(_) => None,
                },
                None => None,
            };
            let voters =
                view.and_then(|t| t.partitions.into_iter().find(|p| p.partition == partition && p.hosted)).map(|p| {
                    let mut voters = p.voters;
                    voters.sort_unstable();
                    voters
                });
            in_place += u64::from(voters.as_ref() == Some(&target));
            seen.push(format!(
                "{replica}: {}",
                voters.map_or("not yet".to_string(), |v| format!("voters {}", ids(&v)))
            ));
        }
        let seen = seen.join("; ");
        if live {
            bar.set_position(in_place);
            bar.set_message(seen.clone());
        } else if last.as_ref() != Some(&seen) && !connection.json {
            eprintln!("{topic}/{partition}: {seen}");
        }
        last = Some(seen);
        if in_place == target.len() as u64 {
            break;
        }
        if started.elapsed() > timeout {
            bar.abandon();
            bail!(
                "{topic}/{partition} has not moved to {} after {}: check that those brokers run and are reachable; \
                 the move goes on, `keel topic describe {topic}` shows its voters",
                ids(&target),
                humantime::format_duration(timeout)
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    bar.finish_and_clear();
    if connection.json {
        let mut placed = moved.clone();
        placed.voters = target;
        print_json(&pb::MovePartitionResponse { partition: Some(placed) });
    }
    Ok(())
}

/// Broker ids as `1,2,3`.
fn ids(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// A client that also knows every registered broker, for long-running
/// commands that must outlive the loss of the broker they started with.
async fn discovering_client(connection: &Connection) -> anyhow::Result<Client> {
    let client = connection.client()?;
    client.describe_cluster().await?;
    Ok(client)
}

/// How a broker starts: as (part of) a new cluster, or joining one.
struct Settled {
    config: NodeConfig,
    data_dir: PathBuf,
    join: Option<Vec<String>>,
    metrics_listen: Option<SocketAddr>,
    /// The secret given by flag, variable or file, if any.
    cluster_secret: Option<String>,
    /// TLS files, if TLS is on.
    tls: Option<keel_server::tls::TlsFiles>,
}

/// The file in the data directory that keeps the cluster secret.
const SECRET_FILE: &str = "cluster-secret";
/// Longest cluster secret, in bytes.
const SECRET_BYTES_MAX: usize = 256;

/// The cluster secret: the one given, checked against the one kept in the
/// data directory; else the one kept; else, for a new one-broker cluster, a
/// new one. The result is kept in the data directory.
/// 32 random bytes as 64 hex digits.
fn new_secret() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::thread_rng().gen();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn cluster_secret(given: Option<String>, data_dir: &std::path::Path, single: bool) -> anyhow::Result<String> {
    let path = data_dir.join(SECRET_FILE);
    let kept = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text.trim().to_string()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let secret = match (given, kept) {
        (Some(given), Some(kept)) if given != kept => bail!(
            "the cluster secret given differs from the one this broker keeps in {}: give the cluster's secret, or \
             use another data directory",
            path.display()
        ),
        (Some(secret), _) | (None, Some(secret)) => secret,
        (None, None) if single => new_secret(),
        (None, None) => bail!(
            "brokers of a cluster share a secret: give every broker the same --cluster-secret (or \
             KEEL_CLUSTER_SECRET), for example from `keel cluster new-secret`"
        ),
    };
    if secret.is_empty()
        || secret.len() > SECRET_BYTES_MAX
        || secret.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        bail!("the cluster secret must be 1-{SECRET_BYTES_MAX} bytes without whitespace");
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    write_private(&path, &secret).with_context(|| format!("keeping the cluster secret in {}", path.display()))?;
    Ok(secret)
}

/// Write a file only its owner can read.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Refuse at once, with the reason, an address another process holds.
fn check_free(what: &str, address: SocketAddr, flag: &str) -> anyhow::Result<()> {
    match std::net::TcpListener::bind(address) {
        Ok(_) => Ok(()),
        Err(error) => {
            bail!("cannot listen for {what} on {address}: {error}; stop what uses it or choose another {flag}")
        }
    }
}

/// `keel serve`'s settings once layered. Its `Default` holds the
/// defaults `keel serve --help` names.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Settings {
    id: u64,
    listen: SocketAddr,
    advertise: Option<String>,
    internal_listen: Option<SocketAddr>,
    internal_advertise: Option<String>,
    cluster_secret: Option<String>,
    data_dir: PathBuf,
    peers: Vec<String>,
    join: Vec<String>,
    metrics_listen: Option<SocketAddr>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    authorize: bool,
    super_users: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            advertise: None,
            internal_listen: None,
            internal_advertise: None,
            cluster_secret: None,
            data_dir: PathBuf::from("keel-data"),
            peers: Vec::new(),
            join: Vec::new(),
            metrics_listen: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_client_ca: None,
            authorize: false,
            super_users: Vec::new(),
        }
    }
}

/// Flags and KEEL_* variables (clap reads both) over the config file over
/// the defaults, merged by figment.
fn layered(args: &ServeArgs) -> anyhow::Result<Settings> {
    use figment::providers::Serialized;
    let file: ServeArgs = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => ServeArgs::default(),
    };
    figment::Figment::from(Serialized::defaults(Settings::default()))
        .merge(Serialized::defaults(file))
        .merge(Serialized::defaults(args))
        .extract()
        .context("settling keel serve's settings")
}

/// Where and how this broker starts, from its layered settings.
fn settle(args: ServeArgs) -> anyhow::Result<Settled> {
    let Settings {
        id,
        listen,
        advertise,
        internal_listen,
        internal_advertise,
        cluster_secret,
        data_dir,
        peers,
        join,
        metrics_listen,
        tls_cert,
        tls_key,
        tls_ca,
        tls_client_ca,
        authorize,
        super_users,
    } = layered(&args)?;
    let super_users = super_users
        .iter()
        .map(|name| {
            keel_core::Principal::new(name.as_str()).with_context(|| format!("super user {name:?} is not usable"))
        })
        .collect::<anyhow::Result<_>>()?;
    let access = keel_server::api::AccessSettings { authorize, super_users };
    // The file may set any of them: the flags' own `requires` see only flags.
    let tls = match (tls_cert, tls_key, tls_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            // Authorising, a client may instead prove itself with a secret.
            let client_certificate_optional = authorize;
            Some(keel_server::tls::TlsFiles { cert, key, ca, client_ca: tls_client_ca, client_certificate_optional })
        }
        (None, None, None) if tls_client_ca.is_none() => None,
        _ => bail!(
            "a TLS broker needs all of --tls-cert, --tls-key and --tls-ca (or tls-cert, tls-key and tls-ca in \
             its file)"
        ),
    };
    let advertise = advertise.unwrap_or_else(|| listen.to_string());
    let internal = |config: &mut NodeConfig| -> anyhow::Result<()> {
        if let Some(listen) = internal_listen {
            config.internal_listen = listen;
            // Peers reach it at the advertised host, on the internal port.
            let host = config.advertised.rsplit_once(':').map_or(config.advertised.as_str(), |(host, _)| host);
            config.internal_advertised = format!("{host}:{}", listen.port());
        }
        if let Some(advertise) = internal_advertise.clone() {
            config.internal_advertised = advertise;
        }
        if config.internal_listen.port() == 0 {
            bail!("the client port leaves no default internal port: give --internal-listen");
        }
        Ok(())
    };
    if !join.is_empty() {
        // The cluster id comes from the cluster once the broker reaches it.
        let mut config = NodeConfig::new(id, listen, advertise, BTreeMap::new());
        config.access = access;
        internal(&mut config)?;
        return Ok(Settled { config, data_dir, join: Some(join), metrics_listen, cluster_secret, tls });
    }
    let mut config = NodeConfig::new(id, listen, advertise, BTreeMap::new());
    config.access = access;
    internal(&mut config)?;
    let internal_advertise = config.internal_advertised.clone();
    let mut voters = BTreeMap::new();
    for peer in peers {
        let (peer_id, address) = peer.split_once('=').with_context(|| format!("peer {peer:?} is not ID=HOST:PORT"))?;
        voters.insert(
            peer_id.parse::<u64>().with_context(|| format!("peer id {peer_id:?} is not a number"))?,
            address.to_string(),
        );
    }
    if voters.is_empty() {
        voters.insert(id, internal_advertise.clone());
    }
    if voters.get(&id) != Some(&internal_advertise) {
        bail!("the peers must include this broker by its internal address, as {id}={internal_advertise}");
    }
    config.cluster_id = keel_server::node::cluster_id_of(&voters);
    config.metadata_voters = voters;
    Ok(Settled { config, data_dir, join: None, metrics_listen, cluster_secret, tls })
}

/// How often a joining broker that does not write to a terminal says it
/// is still catching up.
const JOIN_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Join the cluster through `through`, showing how far this broker's copy
/// of the metadata has caught up: a live line on a terminal, otherwise a
/// line every [`JOIN_PROGRESS_EVERY`].
async fn join_showing_progress(node: &Node, through: String) -> Result<(), keel_server::raft::network::JoinRefusal> {
    let live = std::io::stderr().is_terminal();
    eprintln!("joining the cluster through {through}: waiting until this broker has caught up and votes");
    let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} joining: metadata applied up to index {msg}")
            .expect("a valid template"),
    );
    let applied = || {
        node.raft(&keel_server::group::GroupId::Metadata)
            .and_then(|raft| raft.metrics().borrow().last_applied.map(|log_id| log_id.index))
            .unwrap_or(0)
    };
    let joined = node.join_cluster(through);
    tokio::pin!(joined);
    let mut ticks =
        tokio::time::interval(if live { std::time::Duration::from_millis(200) } else { JOIN_PROGRESS_EVERY });
    ticks.tick().await;
    let outcome = loop {
        tokio::select! {
            biased;
            outcome = &mut joined => break outcome,
            _ = ticks.tick() => {
                if live {
                    bar.set_message(applied().to_string());
                    bar.tick();
                } else {
                    eprintln!("still joining: metadata applied up to index {}", applied());
                }
            }
        }
    };
    bar.finish_and_clear();
    outcome
}

/// How long a broker goes on after it sees that it was removed from the
/// cluster before it stops by itself (exit status 0). Meanwhile it tells
/// clients to ask another broker.
const REMOVED_STOP_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let retention_check_interval = args.retention_check_interval;
    let Settled { mut config, data_dir, join, metrics_listen, cluster_secret: given_secret, tls } = settle(args)?;
    if let Some(interval) = retention_check_interval {
        config.retention_interval = interval;
    }
    if let Some(files) = tls.clone() {
        config.tls = Some(keel_server::tls::Tls::load(files).context("setting up TLS")?);
    } else {
        warn_if_exposed(&config, metrics_listen);
    }
    if config.access.authorize && config.access.super_users.is_empty() {
        tracing::warn!("authorisation is on but no --super-user is named: no client can grant the first access rule");
    }
    let single = join.is_none() && config.metadata_voters.len() == 1;
    config.cluster_secret = cluster_secret(given_secret, &data_dir, single)?;
    let joining = match join {
        Some(join) => {
            let client = match &tls {
                Some(files) => Client::with_tls(
                    join.clone(),
                    RetryPolicy::default(),
                    &keel_client::ClientTls::from_files(&files.ca, Some((&files.cert, &files.key)))?,
                )?,
                None => Client::new(join.clone(), RetryPolicy::default())?,
            };
            let cluster = client
                .describe_cluster()
                .await
                .with_context(|| format!("asking {} for the cluster to join", join.join(",")))?;
            config.cluster_id = cluster.cluster_id;
            // Any broker's internal address will do: it sends the join on to
            // the metadata leader.
            let through = cluster
                .brokers
                .iter()
                .find(|b| b.id == cluster.metadata_leader)
                .or(cluster.brokers.first())
                .map(|b| b.internal_address.clone())
                .with_context(|| format!("the cluster at {} has no registered broker yet", join.join(",")))?;
            Some(through)
        }
        None => None,
    };
    check_free("clients", config.listen, "--listen")?;
    check_free("brokers", config.internal_listen, "--internal-listen")?;
    let store =
        NodeStore::open(&data_dir).with_context(|| format!("opening the data directory {}", data_dir.display()))?;
    let (id, listen) = (config.id, config.listen);
    let internal_listen = config.internal_listen;
    let node = Node::start(config, store, Clock::system()).await?;
    if single {
        // A one-broker cluster is ready once it has registered itself; say
        // "listening" only then, so a client started next can use it.
        wait_until_registered(&node).await?;
    }
    if let Some(through) = joining {
        // Returns once this broker has caught up and votes.
        if let Err(error) = join_showing_progress(&node, through).await {
            node.shutdown().await;
            bail!("could not join the cluster: {error}");
        }
    }
    let mut serving = format!("brokers on {internal_listen}; data in {}", data_dir.display());
    if let Some(address) = metrics_listen {
        if let Err(error) = serve_metrics(node.clone(), address).await {
            node.shutdown().await;
            return Err(error);
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        serving.push_str(&format!("; metrics at {scheme}://{address}/metrics"));
    }
    if tls.is_some() {
        serving.push_str("; TLS");
    }
    // Caught before "listening" is said, so a stop sent after it is seen.
    let mut signal = Interrupts::catch()?;
    // Not say!: a broker started without a standard output still serves.
    let _ = writeln!(std::io::stdout().lock(), "keel broker {id} listening on {listen} ({serving})");
    let mut removed_since = None;
    loop {
        tokio::select! {
            biased;
            caught = signal.next() => match caught {
                Caught::Stop => break,
                Caught::Hangup => match node.reload_tls() {
                    Ok(true) => tracing::warn!("SIGHUP: TLS certificates read again; new connections use them"),
                    Ok(false) => tracing::warn!("SIGHUP: nothing to reload (TLS is off)"),
                    Err(error) => tracing::error!(
                        %error,
                        "SIGHUP: the TLS files are unusable; the ones loaded before stay in use"
                    ),
                },
            },
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {
                if let Some(fatal) = node.fatal_error() {
                    node.shutdown().await;
                    bail!("broker {id} stopped: {fatal}; restart it to recover from its data directory");
                }
                if !node.removed_from_cluster() {
                    removed_since = None;
                } else if removed_since.get_or_insert_with(tokio::time::Instant::now).elapsed() >= REMOVED_STOP_AFTER {
                    tracing::warn!(broker = id, "this broker was removed from the cluster; stopping");
                    let _ = writeln!(std::io::stdout(), "keel broker {id} was removed from the cluster");
                    break;
                }
            }
        }
    }
    // Not println!: a closed standard output must not stop a clean shutdown.
    let _ = writeln!(std::io::stdout(), "keel broker {id} shutting down");
    node.shutdown().await;
    Ok(())
}

/// Say loudly that a broker without TLS listens beyond this host.
fn warn_if_exposed(config: &NodeConfig, metrics: Option<SocketAddr>) {
    let exposed: Vec<String> = [Some(config.listen), Some(config.internal_listen), metrics]
        .into_iter()
        .flatten()
        .filter(|address| !address.ip().is_loopback())
        .map(|address| address.to_string())
        .collect();
    if !exposed.is_empty() {
        let warning = format!(
            "WARNING: listening on {} without TLS: anyone who reaches these addresses can read and change \
             everything; give --tls-cert, --tls-key and --tls-ca",
            exposed.join(", ")
        );
        tracing::warn!("{warning}");
        eprintln!("{warning}");
    }
}

/// The metrics endpoint's connections: TLS ones once handshaken.
struct TlsMetricsListener {
    incoming: tokio::sync::mpsc::Receiver<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
    address: SocketAddr,
}

impl axum::serve::Listener for TlsMetricsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(stream) => {
                let peer = stream.get_ref().0.peer_addr().unwrap_or(self.address);
                (stream, peer)
            }
            // The accept loop ended: serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.address)
    }
}

/// Serve `GET /metrics` in the Prometheus text format until the process
/// ends (over TLS when the broker has it).
async fn serve_metrics(node: Node, address: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the metrics address {address}"))?;
    let tls = node.tls();
    // `/metrics` has every series; `/metrics/node` the broker's own only,
    // none per Raft group or partition (cheap at thousands of partitions).
    let every = node.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let node = every.clone();
                async move { metrics_response(&headers, node.render_metrics()) }
            }),
        )
        .route(
            "/metrics/node",
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let node = node.clone();
                async move { metrics_response(&headers, node.render_node_metrics()) }
            }),
        );
    tokio::spawn(async move {
        let served = match tls {
            Some(tls) => {
                let incoming = tls.accept(listener, keel_server::tls::Listener::Metrics);
                axum::serve(TlsMetricsListener { incoming, address }, app).await
            }
            None => axum::serve(listener, app).await,
        };
        if let Err(error) = served {
            tracing::error!(%error, "the metrics endpoint stopped");
        }
    });
    Ok(())
}

/// OpenMetrics for scrapers that ask for it (Prometheus does); the classic
/// text format for everything else (curl, older scrapers).
fn metrics_response(
    headers: &axum::http::HeaderMap,
    openmetrics: String,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains("application/openmetrics-text") {
        let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(axum::http::header::CONTENT_TYPE, content_type)], openmetrics)
    } else {
        let content_type = "text/plain; version=0.0.4; charset=utf-8";
        ([(axum::http::header::CONTENT_TYPE, content_type)], prometheus_text(&openmetrics))
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition: a
/// counter's HELP and TYPE name its `_total` samples, and OpenMetrics'
/// `# UNIT` and `# EOF` lines go.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> =
        openmetrics.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        text.push_str(renamed.as_deref().unwrap_or(line));
        text.push('\n');
    }
    text
}

async fn wait_until_registered(node: &Node) -> anyhow::Result<()> {
    for _ in 0..600 {
        if node.metadata().brokers().contains_key(&keel_core::BrokerId(node.id())) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    bail!("broker {} did not register itself within 30 s", node.id())
}

/// SIGINT (Ctrl-C) and SIGTERM, caught from when this is made: a signal
/// that arrives before anything waits on it is not lost, and does not kill
/// the process.
struct Interrupts {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hangup: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn catch() -> anyhow::Result<Interrupts> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Interrupts {
                interrupt: signal(SignalKind::interrupt()).context("catching SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("catching SIGTERM")?,
                hangup: signal(SignalKind::hangup()).context("catching SIGHUP")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Interrupts {})
    }

    /// Wait for the next one.
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            biased;
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }

    /// Wait for a stop (SIGINT, SIGTERM) or a SIGHUP.
    async fn next(&mut self) -> Caught {
        #[cfg(unix)]
        tokio::select! {
            biased;
            _ = self.interrupt.recv() => Caught::Stop,
            _ = self.terminate.recv() => Caught::Stop,
            _ = self.hangup.recv() => Caught::Hangup,
        }
        #[cfg(not(unix))]
        {
            self.recv().await;
            Caught::Stop
        }
    }
}

/// What [`Interrupts::next`] caught.
enum Caught {
    /// Stop the broker.
    Stop,
    /// Read the TLS files again.
    Hangup,
}

/// A topic table; with `--json`, one topic is its `TopicDescription` and
/// a list is a `ListTopicsResponse`.
/// A table for the terminal: columns as wide as their contents, two spaces
/// apart, no borders (as kubectl and rpk print); `right` names the columns
/// (numbers) aligned right.
fn table(header: &[&str], right: &[&str]) -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(header.iter().copied());
    for (column, name) in table.column_iter_mut().zip(header) {
        column.set_padding((0, 2));
        if right.contains(name) {
            column.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    table
}

/// Print a table without the spaces that pad its last column.
fn print_table(table: &comfy_table::Table) {
    for line in table.lines() {
        say!("{}", line.trim_end());
    }
}

fn print_topics(topics: Vec<pb::TopicDescription>, json: bool, one: bool) {
    if json {
        match (one, topics.first()) {
            (true, Some(topic)) => print_json(topic),
            _ => print_json(&pb::ListTopicsResponse { topics }),
        }
        return;
    }
    let mut rows = table(
        &["TOPIC", "PARTITION", "REPLICAS", "VOTERS", "LEADER", "LOG START", "HIGH WATERMARK", "RETENTION"],
        &["PARTITION", "LEADER", "LOG START", "HIGH WATERMARK"],
    );
    for topic in &topics {
        let age =
            topic.retention_ms.map(|ms| humantime::format_duration(std::time::Duration::from_millis(ms)).to_string());
        let size = topic.retention_bytes.map(|bytes| bytesize::ByteSize::b(bytes).display().iec().to_string());
        let retention = match (age, size) {
            (None, None) => "-".to_string(),
            (age, size) => [age, size].into_iter().flatten().collect::<Vec<_>>().join(", "),
        };
        for p in &topic.partitions {
            // What no replica could tell is unknown, not 0.
            let known = |value: u64| if p.hosted { value.to_string() } else { "?".to_string() };
            let voters = if p.hosted { ids(&p.voters) } else { "?".to_string() };
            let leader = if p.leader == 0 { "-".to_string() } else { p.leader.to_string() };
            rows.add_row([
                topic.name.clone(),
                p.partition.to_string(),
                ids(&p.replicas),
                voters,
                leader,
                known(p.log_start),
                known(p.high_watermark),
                retention.clone(),
            ]);
        }
    }
    print_table(&rows);
}

/// Fill in the partitions the answering broker does not host (their
/// leader, log start, high watermark and voters are unknown to it) from a
/// broker that does: the partition's leader where it is known, else any
/// replica. Best effort: what no replica answers stays unknown.
async fn from_replicas(client: &Client, connection: &Connection, topics: &mut [pb::TopicDescription]) {
    if topics.iter().all(|t| t.partitions.iter().all(|p| p.hosted)) {
        return;
    }
    let Ok(cluster) = client.describe_cluster().await else { return };
    let address_of: BTreeMap<u64, String> = cluster.brokers.iter().map(|b| (b.id, b.address.clone())).collect();
    // Each broker's view of each topic, asked at most once per broker.
    let mut views: BTreeMap<(u64, String), Option<pb::TopicDescription>> = BTreeMap::new();
    for topic in topics.iter_mut() {
        for partition in topic.partitions.iter_mut().filter(|p| !p.hosted) {
            for replica in partition.replicas.clone() {
                let key = (replica, topic.name.clone());
                if !views.contains_key(&key) {
                    let view = match address_of.get(&replica) {
                        Some(address) => match connection.client_of(vec![address.clone()]) {
                            Ok(replica_client) => replica_client.describe_topic(&topic.name).await.ok(),
                            Err(_) => None,
                        },
                        None => None,
                    };
                    views.insert(key.clone(), view);
                }
                let seen = views[&key]
                    .as_ref()
                    .filter(|view| view.id == topic.id)
                    .and_then(|view| view.partitions.iter().find(|p| p.partition == partition.partition && p.hosted));
                if let Some(seen) = seen {
                    *partition = seen.clone();
                    if partition.leader == replica {
                        break;
                    }
                }
            }
        }
    }
}

async fn topic(command: TopicCommand, connection: &Connection) -> anyhow::Result<()> {
    match command {
        TopicCommand::Create { name, partitions, replication_factor, retention, retention_bytes } => {
            let retention_ms = retention.map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
            let retention_bytes = retention_bytes.map(|size| size.as_u64());
            let request =
                pb::CreateTopicRequest { topic: name, partitions, replication_factor, retention_ms, retention_bytes };
            let topic = connection.client()?.create_topic(request).await?;
            print_topics(vec![topic], connection.json, true);
        }
        TopicCommand::List => {
            let client = connection.client()?;
            let mut topics = client.list_topics().await?;
            from_replicas(&client, connection, &mut topics).await;
            print_topics(topics, connection.json, false)
        }
        TopicCommand::Describe { name } => {
            let client = connection.client()?;
            let mut topics = vec![client.describe_topic(&name).await?];
            from_replicas(&client, connection, &mut topics).await;
            print_topics(topics, connection.json, true)
        }
        TopicCommand::Move { name, partition, replicas, wait } => {
            let client = discovering_client(connection).await?;
            let moved = client.move_partition(&name, partition, replicas).await?;
            if let Some(timeout) = wait {
                wait_for_move(&client, connection, &name, &moved, timeout).await?;
                if !connection.json {
                    say!("partition {name}/{} moved: its voters are {}", moved.partition, ids(&moved.replicas));
                }
            } else if connection.json {
                print_json(&pb::MovePartitionResponse { partition: Some(moved) });
            } else {
                say!(
                    "partition {name}/{} now placed on {:?}; its leader moves the Raft membership there next",
                    moved.partition,
                    moved.replicas
                );
            }
        }
        TopicCommand::Alter { name, partitions, retention, retention_bytes } => {
            if partitions.is_none() && retention.is_none() && retention_bytes.is_none() {
                bail!("say what to change: --partitions, --retention or --retention-bytes");
            }
            let request = pb::AlterTopicRequest { topic: name, partitions, retention_ms: retention, retention_bytes };
            let topic = connection.client()?.alter_topic(request).await?;
            print_topics(vec![topic], connection.json, true);
        }
        TopicCommand::Delete { name } => {
            connection.client()?.delete_topic(&name).await?;
            if connection.json {
                print_json(&pb::DeleteTopicRequest { topic: name });
            } else {
                say!("deleted topic {name}");
            }
        }
    }
    Ok(())
}

/// `keel produce` redraws its progress line every this many records.
const PRODUCE_PROGRESS_EVERY: u64 = 1000;

async fn produce(args: ProduceArgs, connection: &Connection) -> anyhow::Result<()> {
    let client = discovering_client(connection).await?;
    // Lines go round-robin (or by key), gathered into batches per partition
    // with several in flight; each is acknowledged once appended.
    let config = BatchingConfig { sticky_keyless: false, ..BatchingConfig::default() };
    let producer = BatchingProducer::new(client, config, u64::from(std::process::id()));
    // Lines arrive from a reader thread.
    let (lines, mut incoming) = tokio::sync::mpsc::channel::<std::io::Result<String>>(PRODUCE_LINES_QUEUED_MAX);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if lines.blocking_send(line).is_err() {
                return;
            }
        }
    });
    // Acknowledgements are awaited in the order the lines were read.
    let (acks, mut answered) = tokio::sync::mpsc::channel::<keel_client::Ack>(PRODUCE_LINES_QUEUED_MAX);
    let json = connection.json;
    // A live count on a terminal, for large inputs.
    let bar = bench::progress("produce");
    let printer = tokio::spawn(async move {
        let (mut count, mut failed, mut first_error) = (0u64, 0u64, None);
        // A closed output stops the printing, not the producing: every
        // line read is still sent and answered.
        let mut printing = json;
        while let Some(ack) = answered.recv().await {
            match ack.wait().await {
                Ok(delivered) => {
                    count += 1;
                    if count % PRODUCE_PROGRESS_EVERY == 0 {
                        bar.set_message(format!("produce: {count} records acknowledged"));
                        bar.tick();
                    }
                    if printing {
                        let line = serde_json::json!({"partition": delivered.partition, "offset": delivered.offset.to_string()});
                        printing = writeln!(std::io::stdout().lock(), "{line}").is_ok();
                    }
                }
                Err(error) => {
                    failed += 1;
                    first_error.get_or_insert(error);
                }
            }
        }
        bar.finish_and_clear();
        (count, failed, first_error)
    });
    while let Some(line) = incoming.recv().await {
        let line = line.context("reading stdin")?;
        let (key, value) = match args.key_separator.as_deref().and_then(|separator| line.split_once(separator)) {
            Some((key, value)) => (Some(key.as_bytes().to_vec()), value.to_string()),
            None => (None, line),
        };
        let record = pb::Record { key, value: value.into_bytes(), headers: args.headers.clone(), ..Default::default() };
        let ack = match args.partition {
            Some(partition) => producer.send_to(&args.topic, partition, record).await?,
            None => producer.send(&args.topic, record).await?,
        };
        if acks.send(ack).await.is_err() {
            break;
        }
    }
    drop(acks);
    producer.close().await;
    let (count, failed, first_error) = printer.await.context("the acknowledgement task failed")?;
    if let Some(error) = first_error {
        bail!("{failed} records were not acknowledged ({count} were); the first: {error}");
    }
    if !json {
        eprintln!("produced {count} records to {}", args.topic);
    }
    Ok(())
}

/// Print one JSON document on a line: an API message in the proto3 JSON
/// mapping (field names as in the .proto files, 64-bit integers as strings,
/// every field present), or a document built of them.
fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string(value) {
        Ok(text) => say!("{text}"),
        Err(error) => eprintln!("error: the answer did not encode as JSON: {error}"),
    }
}

/// Write a record as one JSON line (see [`record_json`]). An error means
/// the output is gone (a closed pipe: `| head`) or full.
fn print_record_json(at: Option<(&str, u32)>, stored: &pb::StoredRecord) -> std::io::Result<()> {
    let text = serde_json::to_string(&record_json(at, stored)).map_err(std::io::Error::other)?;
    writeln!(std::io::stdout().lock(), "{text}")
}

/// A record as `keel consume --json` and `keel read --json` print it: its
/// offset and append time as strings (as in the proto3 JSON mapping), key
/// and value as text when they are UTF-8, else as base64 in `key_base64`
/// and `value_base64`.
fn record_json(at: Option<(&str, u32)>, stored: &pb::StoredRecord) -> serde_json::Value {
    use base64::Engine;
    let record = stored.record.clone().unwrap_or_default();
    let mut json = serde_json::json!({
        "offset": stored.offset.to_string(),
        "append_time_ms": stored.append_time_ms.to_string(),
    });
    if let Some((topic, partition)) = at {
        json["topic"] = topic.into();
        json["partition"] = partition.into();
    }
    let mut bytes = |name: &str, value: Option<&[u8]>| match value.map(std::str::from_utf8) {
        None => json[name] = serde_json::Value::Null,
        Some(Ok(text)) => json[name] = text.into(),
        Some(Err(_)) => {
            json[format!("{name}_base64")] =
                base64::engine::general_purpose::STANDARD.encode(value.unwrap_or_default()).into()
        }
    };
    bytes("key", record.key.as_deref());
    bytes("value", Some(&record.value));
    json
}

/// Position requests `keel group describe` keeps in flight.
const GROUP_DESCRIBE_POSITIONS_IN_FLIGHT_MAX: usize = 32;

/// Lines `keel produce` reads ahead of their acknowledgements.
const PRODUCE_LINES_QUEUED_MAX: usize = 10_000;

async fn consume(args: ConsumeArgs, connection: &Connection) -> anyhow::Result<()> {
    let member = args.member.clone().unwrap_or_else(|| format!("keel-cli-{}", std::process::id()));
    // Ctrl-C or SIGTERM ends the loop between polls, so the member leaves
    // the group (its partitions go to the others at once) instead of
    // holding them until its session times out. Caught before joining, so
    // none is missed once the member exists.
    let mut interrupted = Interrupts::catch()?;
    let client = discovering_client(connection).await?;
    if let Some(from) = args.from {
        for topic in &args.topics {
            let count = client.describe_topic(topic).await?.partitions.len() as u32;
            for partition in 0..count {
                let to = Some(from.target(&client, topic, partition).await?);
                let request =
                    pb::ResetGroupPositionRequest { group: args.group.clone(), topic: topic.clone(), partition, to };
                client.reset_group_position(request).await.with_context(|| {
                    format!("--from: setting group {}'s position on {topic}/{partition}", args.group)
                })?;
            }
        }
    }
    let mut consumer = Consumer::join_with_assignor(
        client,
        &args.group,
        &member,
        args.topics.clone(),
        u64::try_from(args.session_timeout.as_millis()).unwrap_or(u64::MAX),
        args.assignor.map_or(pb::Assignor::Unspecified, AssignorArg::wire),
    )
    .await?;
    let started = tokio::time::Instant::now();
    let mut printed = 0u64;
    let mut partitions = std::collections::BTreeSet::new();
    let mut idle_since = tokio::time::Instant::now();
    loop {
        if args.max_records.is_some_and(|max| printed >= max) {
            break;
        }
        if args.idle_timeout.is_some_and(|idle| idle_since.elapsed() >= idle) {
            break;
        }
        let want = args.max_records.map_or(500, |max| (max - printed).min(500)) as u32;
        // Back by the idle timeout, not a whole poll wait later.
        let wait = args
            .idle_timeout
            .map_or(args.poll_wait, |idle| args.poll_wait.min(idle.saturating_sub(idle_since.elapsed())));
        let deliveries = tokio::select! {
            biased;
            _ = interrupted.recv() => break,
            polled = consumer.poll(want, wait) => polled?,
        };
        for notice in consumer.take_notices() {
            eprintln!("keel consume: {notice}");
        }
        if deliveries.is_empty() {
            continue;
        }
        // Polls in flight asked for as many as were wanted when sent: print
        // (and ack) no more than are wanted now. Those left over stay
        // unacknowledged, for the group's next reader.
        let mut deliveries = deliveries;
        deliveries.truncate(want as usize);
        idle_since = tokio::time::Instant::now();
        let mut written = Ok(());
        for delivery in &deliveries {
            written = if connection.json {
                print_record_json(Some((&delivery.topic, delivery.partition)), &delivery.record)
            } else {
                args.output.print(&delivery.topic, delivery.partition, &delivery.record)
            };
            if written.is_err() {
                break;
            }
            partitions.insert((delivery.topic.clone(), delivery.partition));
            printed += 1;
        }
        // Out before they are acknowledged: a record is acknowledged only
        // once it has left this process.
        if let Err(error) = written.and_then(|()| std::io::stdout().flush()) {
            // Nothing of this poll is acknowledged: its records come again,
            // to this group's next reader.
            consumer.leave().await?;
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                // Not eprintln!: with `2>&1 | head` this pipe is closed too.
                let _ = writeln!(
                    std::io::stderr(),
                    "keel consume: standard output was closed; {} records of the last poll left \
                     unacknowledged; member {member} left group {}",
                    deliveries.len(),
                    args.group
                );
                return Ok(());
            }
            return Err(anyhow::Error::new(error).context(format!(
                "writing records to standard output; {} records of the last poll left unacknowledged, \
                 member {member} left group {}",
                deliveries.len(),
                args.group
            )));
        }
        // One poll reads the partitions one broker leads: acknowledge each
        // one's last record (not interrupted: a signal waits for it).
        let mut last = BTreeMap::new();
        for delivery in &deliveries {
            last.insert((delivery.topic.as_str(), delivery.partition), (delivery.topic_id, delivery.record.offset));
        }
        for ((topic, partition), (topic_id, offset)) in last {
            match consumer.ack_in(topic, topic_id, partition, offset).await {
                Ok(Some(_)) => {}
                // Fenced, and rejoined: the rest of this poll's acks would
                // be refused too; its records come again.
                // (Also when the topic was deleted since the poll: its
                // offsets say nothing of a new log.)
                Ok(None) => break,
                Err(error) => return Err(error.into()),
            }
        }
        for notice in consumer.take_notices() {
            eprintln!("keel consume: {notice}");
        }
    }
    consumer.leave().await?;
    eprintln!(
        "keel consume: {printed} records from {} partitions in {:.1} s; member {member} left group {}",
        partitions.len(),
        started.elapsed().as_secs_f64(),
        args.group
    );
    Ok(())
}

async fn group(command: GroupCommand, connection: &Connection) -> anyhow::Result<()> {
    match command {
        GroupCommand::List => {
            let groups = connection.client()?.list_groups().await?;
            if connection.json {
                print_json(&pb::ListGroupsResponse { groups });
            } else {
                let mut rows = table(&["GROUP", "GENERATION", "MEMBERS", "TOPICS"], &["GENERATION", "MEMBERS"]);
                for group in groups {
                    rows.add_row([
                        group.group,
                        group.generation.to_string(),
                        group.members.to_string(),
                        group.topics.join(","),
                    ]);
                }
                print_table(&rows);
            }
        }
        GroupCommand::Describe { name } => {
            let client = connection.client()?;
            let described = client.describe_group(&name).await?;
            let assigned: BTreeMap<(String, u32), String> = described
                .members
                .iter()
                .flat_map(|m| m.partitions.iter().map(|p| ((p.topic.clone(), p.partition), m.member.clone())))
                .collect();
            // Every partition the group reads or has a position on, members
            // or not: lag matters most when no member is left.
            let mut candidates = Vec::new();
            for topic in client.list_topics().await? {
                candidates.extend(topic.partitions.iter().map(|p| (topic.name.clone(), p.partition)));
            }
            let positions: Vec<_> = futures_util::stream::iter(candidates)
                .map(|(topic, partition)| {
                    let (client, name) = (client.clone(), name.clone());
                    async move {
                        let position = client.group_position(&name, &topic, partition).await;
                        position.map(|position| (topic, partition, position))
                    }
                })
                .buffered(GROUP_DESCRIBE_POSITIONS_IN_FLIGHT_MAX)
                .collect()
                .await;
            let mut rows = Vec::new();
            for position in positions {
                let (topic, partition, position) = position?;
                let member = assigned.get(&(topic.clone(), partition)).cloned();
                if member.is_some() || position.committed {
                    rows.push((topic, partition, member, position));
                }
            }
            if connection.json {
                let partitions: Vec<_> = rows
                    .iter()
                    .map(|(topic, partition, member, pos)| {
                        let mut row = serde_json::to_value(pos).expect("a message serialises");
                        row["topic"] = topic.clone().into();
                        row["partition"] = (*partition).into();
                        row["member"] = member.clone().into();
                        row["lag"] = pos.high_watermark.saturating_sub(pos.position).to_string().into();
                        row
                    })
                    .collect();
                let mut described = serde_json::to_value(&described).expect("a message serialises");
                described["partitions"] = partitions.into();
                print_json(&described);
            } else {
                say!(
                    "group {} generation {} members {} assignor {}",
                    described.group,
                    described.generation,
                    described.members.len(),
                    assignor_label(described.assignor)
                );
                let mut printed = table(
                    &["TOPIC", "PARTITION", "MEMBER", "POSITION", "HIGH WATERMARK", "LAG"],
                    &["PARTITION", "POSITION", "HIGH WATERMARK", "LAG"],
                );
                for (topic, partition, member, pos) in rows {
                    let lag = pos.high_watermark.saturating_sub(pos.position);
                    printed.add_row([
                        topic,
                        partition.to_string(),
                        member.unwrap_or_else(|| "-".to_string()),
                        pos.position.to_string(),
                        pos.high_watermark.to_string(),
                        lag.to_string(),
                    ]);
                }
                print_table(&printed);
            }
        }
        GroupCommand::Delete { name } => {
            let positions = connection.client()?.delete_group(&name).await?;
            if connection.json {
                print_json(&serde_json::json!({"group": name, "positions_removed": positions}));
            } else {
                say!("deleted group {name} and its positions on {positions} partitions");
            }
        }
        GroupCommand::Reset { name, topic, partitions, to, to_time, dry_run } => {
            use pb::reset_group_position_request::To;
            let client = connection.client()?;
            let from = match to_time {
                Some(time_ms) => StartFrom::Time(time_ms),
                None => StartFrom::parse(&to).map_err(|e| anyhow::anyhow!("--to {e}"))?,
            };
            let count = client.describe_topic(&topic).await?.partitions.len() as u32;
            let partitions: Vec<u32> = if partitions.is_empty() { (0..count).collect() } else { partitions };
            if let Some(missing) = partitions.iter().find(|p| **p >= count) {
                bail!("{topic} has no partition {missing}: it has {count} (0 to {})", count.saturating_sub(1));
            }
            if dry_run {
                // A group with positions but no members may be unknown to
                // the metadata: it has no members then.
                let members = match client.describe_group(&name).await {
                    Ok(group) => group.members.len(),
                    Err(keel_client::ClientError::Refused(status)) if status.code() == tonic::Code::NotFound => 0,
                    Err(error) => return Err(error.into()),
                };
                if members > 0 {
                    eprintln!("keel: group {name} has {members} members: a reset is refused until they leave");
                }
            }
            let mut positions = Vec::new();
            for partition in partitions {
                let target = from.target(&client, &topic, partition).await?;
                let (position, new_position) = if dry_run {
                    let now = client.group_position(&name, &topic, partition).await?;
                    let would = match target {
                        To::Earliest(_) | To::Forget(_) => now.log_start,
                        To::Latest(_) => now.high_watermark,
                        To::Offset(offset) => offset,
                    };
                    if !connection.json {
                        say!("{topic}/{partition}: position {} -> {would} (dry run)", now.position);
                    }
                    (now.position, would)
                } else {
                    let request = pb::ResetGroupPositionRequest {
                        group: name.clone(),
                        topic: topic.clone(),
                        partition,
                        to: Some(target),
                    };
                    let position = client.reset_group_position(request).await?;
                    if !connection.json {
                        say!("{topic}/{partition}: position {position}");
                    }
                    (position, position)
                };
                positions.push(serde_json::json!({
                    "partition": partition,
                    "position": position.to_string(),
                    "new_position": new_position.to_string(),
                }));
            }
            if connection.json {
                print_json(
                    &serde_json::json!({"group": name, "topic": topic, "dry_run": dry_run, "partitions": positions}),
                );
            }
        }
    }
    Ok(())
}

async fn read(args: ReadArgs, connection: &Connection) -> anyhow::Result<()> {
    let client = connection.client()?;
    // Caught before the first read, so that Ctrl-C always ends --follow
    // cleanly.
    let mut interrupted = Interrupts::catch()?;
    let mut offset = args.offset;
    loop {
        let request = pb::ReadRequest {
            topic: args.topic.clone(),
            partition: args.partition,
            offset,
            max_records: args.max_records,
            max_bytes: 0,
            any_replica: args.any_replica,
        };
        let response = tokio::select! {
            biased;
            _ = interrupted.recv() => return Ok(()),
            response = client.read(request) => response?,
        };
        let got = response.records.len();
        for stored in response.records {
            offset = stored.offset + 1;
            let written = if connection.json {
                print_record_json(None, &stored)
            } else {
                args.output.print(&args.topic, args.partition, &stored)
            };
            match written {
                Ok(()) => {}
                // `| head`: what was wanted has been read.
                Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                Err(error) => return Err(anyhow::Error::new(error).context("writing records to standard output")),
            }
        }
        if !args.follow {
            return Ok(());
        }
        if got == 0 {
            tokio::select! {
                biased;
                _ = interrupted.recv() => return Ok(()),
                _ = tokio::time::sleep(READ_FOLLOW_INTERVAL) => {}
            }
        }
    }
}

/// How often `keel read --follow` asks again when it has read everything.
const READ_FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use keel_client::pb;

    #[test]
    fn records_print_text_as_text_and_other_bytes_as_base64() {
        let stored = pb::StoredRecord {
            offset: u64::MAX,
            append_time_ms: 7,
            record: Some(pb::Record { key: Some(b"k".to_vec()), value: vec![0xff, 0x00], ..Default::default() }),
        };
        let json = super::record_json(Some(("t", 3)), &stored);
        assert_eq!(json["offset"], "18446744073709551615");
        assert_eq!((json["topic"].as_str(), json["partition"].as_u64()), (Some("t"), Some(3)));
        assert_eq!(json["key"], "k");
        assert!(json.get("value").is_none(), "{json}");
        assert_eq!(json["value_base64"], "/wA=");
    }

    /// Every subcommand, every flag and every argument has a description.
    #[test]
    fn every_command_and_argument_says_what_it_does() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(path.clone());
                }
                for arg in sub.get_arguments() {
                    if arg.get_help().is_none() && arg.get_long_help().is_none() {
                        missing.push(format!("{path} {}", arg.get_id()));
                    }
                }
                walk(sub, &path, missing);
            }
        }
        let command = super::Cli::command();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&command, "keel", &mut missing);
        assert!(missing.is_empty(), "without a description: {missing:?}");
    }

    /// A flag (or KEEL_* variable, which clap folds into it) beats the
    /// file, the file beats the defaults, and a setting given nowhere keeps
    /// its default.
    #[test]
    fn serve_settings_layer_flags_over_the_file_over_the_defaults() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keel.toml");
        std::fs::write(&file, "id = 7\ndata-dir = \"/from/file\"\npeers = [\"7=127.0.0.1:7170\"]\n").unwrap();
        let config = file.display().to_string();
        let parse = |flags: &[&str]| {
            let mut argv = vec!["keel", "serve", "--config", &config];
            argv.extend_from_slice(flags);
            let super::Command::Serve(args) = super::Cli::try_parse_from(argv).unwrap().command else {
                panic!("not serve")
            };
            super::layered(&args).unwrap()
        };
        let settings = parse(&[]);
        assert_eq!(settings.id, 7);
        assert_eq!(settings.data_dir, std::path::PathBuf::from("/from/file"));
        assert_eq!(settings.peers, vec!["7=127.0.0.1:7170".to_string()]);
        assert_eq!(settings.listen.to_string(), "127.0.0.1:7070");
        assert!(settings.join.is_empty() && settings.metrics_listen.is_none());

        let settings = parse(&["--id", "9", "--listen", "127.0.0.1:9090", "--metrics-listen", "127.0.0.1:9464"]);
        assert_eq!(settings.id, 9);
        assert_eq!(settings.listen.to_string(), "127.0.0.1:9090");
        assert_eq!(settings.metrics_listen.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9464"));
        assert_eq!(settings.data_dir, std::path::PathBuf::from("/from/file"));

        std::fs::write(&file, "id = \"seven\"\n").unwrap();
        let Ok(super::Command::Serve(args)) =
            super::Cli::try_parse_from(["keel", "serve", "--config", &config]).map(|c| c.command)
        else {
            panic!("not serve")
        };
        let error = format!("{:#}", super::layered(&args).err().expect("a bad id is refused"));
        assert!(error.contains("keel.toml") && error.contains("id"), "{error}");
    }
}
