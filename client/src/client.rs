//! Connections, routing and retries.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::v1 as pb;
use keel_proto::v1::keel_client::KeelClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// The API client every request goes through: it carries the user's
/// [`Credentials`].
#[cfg(not(madsim))]
pub type Api = KeelClient<tonic::service::interceptor::InterceptedService<Channel, Credentials>>;
#[cfg(madsim)]
pub type Api = KeelClient<Channel, Credentials>;

/// Request metadata naming the user (as the broker reads it).
pub const USER_METADATA: &str = "keel-user";
/// Request metadata carrying the user's secret.
pub const SECRET_METADATA: &str = "keel-secret";

/// A user's name and secret, sent with every request (over TLS, unless
/// the broker is on loopback). The default sends none.
#[derive(Clone, Default)]
pub struct Credentials {
    user: Option<(MetadataValue<Ascii>, MetadataValue<Ascii>)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.user.as_ref().map(|(user, _)| user.to_str().unwrap_or("?").to_string());
        f.debug_struct("Credentials").field("user", &user).finish_non_exhaustive()
    }
}

impl Credentials {
    /// Authenticate as `user` with `secret` (printable ASCII, as `keel user
    /// create` makes them).
    pub fn user(user: &str, secret: &str) -> Result<Credentials, ClientError> {
        let value = |what: &str, text: &str| {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ClientError::Credentials(format!(
                    "the {what} must be printable ASCII without spaces, and not empty"
                )));
            }
            text.parse::<MetadataValue<Ascii>>().map_err(|e| ClientError::Credentials(format!("the {what}: {e}")))
        };
        Ok(Credentials { user: Some((value("user name", user)?, value("secret", secret)?)) })
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some((user, secret)) = &self.user {
            request.metadata_mut().insert(USER_METADATA, user.clone());
            request.metadata_mut().insert(SECRET_METADATA, secret.clone());
        }
        Ok(request)
    }
}

/// Largest message the client sends or accepts.
const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// How long and how often to retry a request that could not be served.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Give up after this long.
    pub deadline: Duration,
    /// First wait between attempts; doubles up to `backoff_max`, and each
    /// wait gets a random jitter of up to itself on top (so clients that
    /// failed together do not retry together).
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Seed of that jitter; `None` draws one. Under simulation `None` means
    /// 0: no entropy may reach behaviour there, so the harness gives a seed
    /// from the run's own.
    pub jitter_seed: Option<u64>,
    /// Per-attempt timeout of a request that does not wait on purpose; a
    /// long poll gets its wait on top (see [`Client::call_waiting`]).
    pub request_timeout: Duration,
    /// Give up at once when no broker known can be connected to at all
    /// (connection refused, unknown host, or what answers is not a keel
    /// broker), instead of retrying until the deadline. For
    /// command-line tools, where waiting only hides a typo or a broker
    /// that is not running; a long-lived application keeps retrying
    /// through broker restarts.
    pub give_up_when_unreachable: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            deadline: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(1000),
            jitter_seed: None,
            request_timeout: Duration::from_secs(10),
            give_up_when_unreachable: false,
        }
    }
}

impl RetryPolicy {
    /// The waits between passes over the brokers: exponential, capped,
    /// with jitter, without end (the deadline ends the retries).
    fn delays(&self) -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        let builder = backon::ExponentialBuilder::new()
            .with_min_delay(self.backoff_initial)
            .with_max_delay(self.backoff_max.max(self.backoff_initial))
            .without_max_times()
            .with_jitter();
        #[cfg(madsim)]
        let builder = builder.with_jitter_seed(self.jitter_seed.unwrap_or(0));
        #[cfg(not(madsim))]
        let builder = match self.jitter_seed {
            Some(seed) => builder.with_jitter_seed(seed),
            None => builder,
        };
        builder.build()
    }
}

/// Why a request failed for good.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The broker refused the request itself (bad input, unknown topic,
    /// fenced...): retrying will not help.
    #[error("{} ({:?})", .0.message(), .0.code())]
    Refused(Status),
    /// No broker could serve the request before the deadline.
    #[error("gave up after {deadline:?}: {last}")]
    GaveUp { deadline: Duration, last: String },
    #[error("broker address {address:?} is not usable: {reason}")]
    BadAddress { address: String, reason: String },
    /// No broker could be connected to (with
    /// [`RetryPolicy::give_up_when_unreachable`]).
    #[error(
        "cannot connect to {}: {reason}; check that a broker runs there, or give its client address \
         with --broker (or KEEL_BROKER)", .addresses.join(", ")
    )]
    Unreachable { addresses: Vec<String>, reason: String },
    /// Something answered at `address`, but not as a keel broker does, and
    /// no other broker known could be connected to (with
    /// [`RetryPolicy::give_up_when_unreachable`]).
    #[error(
        "{address} is not a keel broker ({detail}); give a broker's client address (its --listen, not its \
         metrics or internal address) with --broker, and --tls-ca if the brokers use TLS"
    )]
    NotKeel { address: String, detail: String },
    #[error("no broker addresses were given")]
    NoBrokers,
    /// A TLS handshake failed: one side refused the other's certificate.
    #[error(
        "the TLS handshake with {address} failed ({reason}): check that --tls-ca names the CA that signed the \
         brokers' certificates, and that --tls-cert is one the brokers' client CA signed and still valid"
    )]
    TlsRefused { address: String, reason: String },
    /// The TLS settings given could not be used.
    #[error("the TLS settings are unusable: {0}; check the certificate, key and CA files")]
    Tls(String),
    #[error("the credentials are unusable: {0}")]
    Credentials(String),
    /// The partition forgot this producer (its state was evicted or
    /// expired), so the outcome of the batch being sent is unknown. The
    /// producer now has a new id. `unknown` holds that batch (send it again
    /// if it must be delivered: it may then be appended twice); `unsent`
    /// holds this call's records when the batch refused was an earlier one,
    /// so this call's were not sent at all.
    #[error(
        "the partition forgot producer {old_producer_id} ({reason}); the outcome of a batch of {} records is \
         unknown, and {} records of this call were not sent. The producer continues as {new_producer_id}: send \
         again what must be delivered", .unknown.len(), .unsent.len()
    )]
    ProducerReset {
        old_producer_id: u64,
        new_producer_id: u64,
        reason: String,
        unknown: Vec<pb::Record>,
        unsent: Vec<pb::Record>,
    },
}

/// Response metadata of a refusal that a retry after this many ms may pass
/// (a broker at its in-flight write limit).
pub const RETRY_AFTER_METADATA: &str = "keel-retry-after-ms";
/// Longest wait a retry hint can ask for.
const RETRY_AFTER_MS_MAX: u64 = 5_000;
/// Response metadata of a refusal that fences this process's member epoch.
pub const FENCED_METADATA: &str = "keel-fenced";
/// Response metadata of a refusal naming a topic incarnation that was
/// deleted (the topic may exist again under a new one).
pub const TOPIC_GONE_METADATA: &str = "keel-topic-gone";
/// Response metadata of a refusal of a batch whose sequence is ahead of the
/// next one expected (a batch ahead of it has not landed): not appended.
pub const SEQUENCE_GAP_METADATA: &str = "keel-sequence-gap";
/// Response metadata of a refusal saying the partition forgot the producer.
pub const PRODUCER_LOST_METADATA: &str = "keel-producer-lost";
/// Added by the client to a refusal that followed an attempt of the same
/// request left unanswered (timed out, or its connection broke): that
/// attempt may still be applied, so the refusal does not say the request
/// never will be.
pub const AFTER_UNANSWERED_METADATA: &str = "keel-after-unanswered";

/// Partition counts and incarnations (topic ids) of topics, learned from
/// the metadata leader on first use: a producer names the incarnation in
/// every batch, so none lands in a topic deleted under it.
#[derive(Debug, Default)]
pub(crate) struct KnownTopics(BTreeMap<String, (u32, u64)>);

impl KnownTopics {
    /// `topic`'s partition count and incarnation.
    pub(crate) async fn get(&mut self, client: &Client, topic: &str) -> Result<(u32, u64), ClientError> {
        if let Some(known) = self.0.get(topic) {
            return Ok(*known);
        }
        let described = client.describe_topic_fresh(topic).await?;
        let known = (described.partitions.len() as u32, described.id);
        self.0.insert(topic.to_string(), known);
        Ok(known)
    }

    /// Look `topic` up again next time (its incarnation was deleted).
    pub(crate) fn forget(&mut self, topic: &str) {
        self.0.remove(topic);
    }
}

/// Where to send a request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// The metadata group's leader.
    Metadata,
    /// A partition's leader.
    Partition(String, u32),
    /// This broker first, then any (a poll of the partitions it leads).
    Broker(String),
    /// Any broker.
    Any,
}

/// A keel client: cheap to clone, safe to share.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    policy: RetryPolicy,
    /// Every broker address known, bootstrap first.
    brokers: Mutex<Vec<String>>,
    channels: Mutex<BTreeMap<String, Channel>>,
    /// The last known leader address per route.
    leaders: Mutex<BTreeMap<Route, String>>,
    /// Produce requests go on one stream per broker.
    produce_streams: crate::produce_stream::ProduceStreams,
    /// TLS to every broker (`None`: plaintext).
    #[cfg(not(madsim))]
    tls: Option<tonic::transport::ClientTlsConfig>,
    /// Who this client says it is.
    credentials: Credentials,
}

/// How a client speaks TLS to brokers (real builds only). PEM bytes.
#[cfg(not(madsim))]
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// The CA bundle that signed the brokers' certificates.
    pub ca: Vec<u8>,
    /// The certificate chain and key this client proves itself with, for
    /// brokers that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(not(madsim))]
impl ClientTls {
    /// Read PEM files: the CA bundle, and a certificate with its key.
    pub fn from_files(
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<ClientTls, ClientError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| ClientError::Tls(format!("reading {}: {e}", path.display())))
        };
        let identity = match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        Ok(ClientTls { ca: read(ca)?, identity })
    }

    fn config(&self) -> tonic::transport::ClientTlsConfig {
        let config =
            tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(&self.ca));
        match &self.identity {
            Some((cert, key)) => config.identity(tonic::transport::Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

/// What a refusing broker said to do next.
enum Next {
    Retry(Vec<String>),
    Backoff,
    Fail,
}

fn hinted_addresses(status: &Status, key: &str) -> Vec<String> {
    let Some(value) = status.metadata().get(key).and_then(|v| v.to_str().ok()) else { return Vec::new() };
    value
        .split(',')
        .filter_map(|entry| entry.split_once('@').map(|(_, address)| address.to_string()))
        .filter(|a| !a.is_empty())
        .collect()
}

/// Where a refusal from `answered` says to go instead: the leader it
/// names, or else a replica other than `answered` (which may be listed
/// while a move adds it, before it runs the group).
pub(crate) fn hinted_leader(status: &Status, answered: &str) -> Option<String> {
    let replicas = hinted_addresses(status, "keel-replicas").into_iter().filter(|address| address != answered);
    hinted_addresses(status, "keel-leader").into_iter().chain(replicas).next()
}

/// Whether a refusal is one to wait out and ask again (an election, a
/// broker behind, a busy broker).
pub(crate) fn passing(status: &Status) -> bool {
    matches!(next_step(status), Next::Backoff)
}

fn next_step(status: &Status) -> Next {
    match status.code() {
        Code::FailedPrecondition => {
            let mut hints = hinted_addresses(status, "keel-leader");
            hints.extend(hinted_addresses(status, "keel-replicas"));
            if hints.is_empty() {
                Next::Fail
            } else {
                Next::Retry(hints)
            }
        }
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled | Code::Internal => Next::Backoff,
        // A broker at its in-flight limit says when to come back.
        Code::ResourceExhausted if status.metadata().get(RETRY_AFTER_METADATA).is_some() => Next::Backoff,
        _ => Next::Fail,
    }
}

/// Whether a failed attempt may have reached the broker and be applied
/// without its answer coming back: it timed out, or the connection failed
/// under it. (A broker's own "retry" answers are Unavailable too; counting
/// them errs on the side of an unknown outcome.)
fn may_be_unanswered(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled | Code::Internal
    )
}

/// Why the connection behind a failed request could not be made, if that
/// is why it failed: refused, or the host is unknown. Attempts that timed
/// out are not counted: the host may only be slow.
fn connect_failure(status: &Status) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            match io.kind() {
                ConnectionRefused => return Some("connection refused".to_string()),
                AddrNotAvailable | HostUnreachable | NetworkUnreachable => return Some(io.to_string()),
                _ => {}
            }
        }
        let text = error.to_string();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            return Some(format!("unknown host ({text})"));
        }
        source = error.source();
    }
    None
}

/// Why a TLS handshake failed, if that is why the request did: a
/// certificate one side refused. Not retried: it does not heal by itself.
fn tls_failure(status: &Status) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        let text = error.to_string();
        if ["invalid peer certificate", "received fatal alert", "peer sent no certificates"]
            .iter()
            .any(|sign| text.contains(sign))
        {
            return Some(text);
        }
        source = error.source();
    }
    None
}

/// Whether a failed request reached something that is not a keel broker:
/// an HTTP server without gRPC (a metrics port, say), or no HTTP/2 at all.
fn not_keel(status: &Status) -> Option<String> {
    let message = status.message();
    if message.contains("grpc-status header missing") {
        return Some(format!("it answered HTTP without gRPC: {message}"));
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        let text = error.to_string();
        if text.contains("frame with invalid size") {
            return Some(format!("it does not speak HTTP/2: {text}"));
        }
        source = error.source();
    }
    None
}

/// The group named in [`Client::offset_at_time`]'s position lookup, which
/// only reads the partition's bounds.
const BOUNDS_LOOKUP_GROUP: &str = "keel.offset-lookup";
/// Partitions whose position `delete_group` removes at once (requests in
/// flight).
const GROUP_DELETE_PARTITIONS_IN_FLIGHT_MAX: usize = 16;

impl Client {
    /// A client for the cluster reachable at `brokers` (`host:port`).
    /// Connections are made lazily.
    pub fn new(brokers: Vec<String>, policy: RetryPolicy) -> Result<Client, ClientError> {
        if brokers.is_empty() {
            return Err(ClientError::NoBrokers);
        }
        let client = Client {
            inner: Arc::new(Inner {
                policy,
                brokers: Mutex::new(brokers),
                channels: Mutex::new(BTreeMap::new()),
                leaders: Mutex::new(BTreeMap::new()),
                produce_streams: Default::default(),
                #[cfg(not(madsim))]
                tls: None,
                credentials: Credentials::default(),
            }),
        };
        Ok(client)
    }

    /// A client that speaks TLS to the cluster reachable at `brokers`.
    #[cfg(not(madsim))]
    pub fn with_tls(brokers: Vec<String>, policy: RetryPolicy, tls: &ClientTls) -> Result<Client, ClientError> {
        let mut client = Client::new(brokers, policy)?;
        Arc::get_mut(&mut client.inner).expect("a new client is not shared").tls = Some(tls.config());
        Ok(client)
    }

    /// This client, sending `credentials` with every request.
    pub fn with_credentials(mut self, credentials: Credentials) -> Result<Client, ClientError> {
        let inner = Arc::get_mut(&mut self.inner).ok_or_else(|| {
            ClientError::Credentials("set credentials before the client is cloned or used".to_string())
        })?;
        inner.credentials = credentials;
        Ok(self)
    }

    fn channel(&self, address: &str) -> Result<Channel, ClientError> {
        let mut channels = self.inner.channels.lock().expect("channels");
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        #[cfg(not(madsim))]
        let scheme = if self.inner.tls.is_some() { "https" } else { "http" };
        #[cfg(madsim)]
        let scheme = "http";
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| ClientError::BadAddress { address: address.to_string(), reason: e.to_string() })?
            .connect_timeout(Duration::from_millis(1000));
        #[cfg(not(madsim))]
        let endpoint = match &self.inner.tls {
            Some(tls) => endpoint.tls_config(tls.clone()).map_err(|e| ClientError::Tls(e.to_string()))?,
            None => endpoint,
        };
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// Addresses to try for `route`, best first.
    fn candidates(&self, route: &Route) -> Vec<String> {
        let mut candidates = Vec::new();
        if let Route::Broker(address) = route {
            candidates.push(address.clone());
        } else if let Some(leader) = self.leader(route) {
            candidates.push(leader);
        }
        for broker in self.inner.brokers.lock().expect("brokers").iter() {
            if !candidates.contains(broker) {
                candidates.push(broker.clone());
            }
        }
        candidates
    }

    /// The last known leader of `route`, if any.
    pub(crate) fn leader(&self, route: &Route) -> Option<String> {
        self.inner.leaders.lock().expect("leaders").get(route).cloned()
    }

    /// Forget the leader of `route`: the next request asks any broker.
    pub(crate) fn forget(&self, route: &Route) {
        self.inner.leaders.lock().expect("leaders").remove(route);
    }

    /// Remember `address` as the leader of `route` (and as a broker).
    pub(crate) fn learn(&self, route: &Route, address: &str) {
        if matches!(route, Route::Partition(..) | Route::Metadata) {
            self.inner.leaders.lock().expect("leaders").insert(route.clone(), address.to_string());
        }
        let mut brokers = self.inner.brokers.lock().expect("brokers");
        if !brokers.iter().any(|b| b == address) {
            brokers.push(address.to_string());
        }
    }

    /// Send a request to the broker that must take it, following hints and
    /// backing off through elections, until it succeeds, is refused for
    /// good, or the deadline passes.
    pub async fn call<T, F, Fut>(&self, route: Route, request: F) -> Result<T, ClientError>
    where
        F: Fn(Api) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_waiting(route, Duration::ZERO, request).await
    }

    /// [`Client::call`] for a request that may wait up to `wait` on purpose
    /// (a long poll): each attempt may take that long plus the policy's
    /// request timeout.
    pub async fn call_waiting<T, F, Fut>(&self, route: Route, wait: Duration, request: F) -> Result<T, ClientError>
    where
        F: Fn(Api) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        Ok(self.attempts(route, wait, |_, client| request(client)).await?.0)
    }

    /// [`Client::call_waiting`], also saying which broker answered.
    pub(crate) async fn call_answered<T, F, Fut>(
        &self,
        route: Route,
        wait: Duration,
        request: F,
    ) -> Result<(T, String), ClientError>
    where
        F: Fn(Api) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.attempts(route, wait, |_, client| request(client)).await
    }

    /// The retry loop of [`Client::call_waiting`]; `request` is also told
    /// the address it is sent to.
    async fn attempts<T, F, Fut>(&self, route: Route, wait: Duration, request: F) -> Result<(T, String), ClientError>
    where
        F: Fn(&str, Api) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let attempt_timeout = self.inner.policy.request_timeout + wait;
        let policy = self.inner.policy;
        let started = tokio::time::Instant::now();
        let mut delays = policy.delays();
        let mut queue = self.candidates(&route);
        let mut last = String::from("no attempt made");
        // Addresses of this pass over the candidates that could not be
        // connected to, and whether any could.
        let mut unreachable: Vec<String> = Vec::new();
        let mut unreachable_reason = String::new();
        let mut connected = false;
        // The last address of this pass that answered, but not as a keel
        // broker does, and how; and how many did.
        let mut not_a_broker: Option<(String, String)> = None;
        let mut not_brokers = 0usize;
        // Whether an attempt went out and no answer came back.
        let mut unanswered = false;
        loop {
            if started.elapsed() > policy.deadline {
                return Err(ClientError::GaveUp { deadline: policy.deadline, last });
            }
            let Some(address) = queue.first().cloned() else {
                if policy.give_up_when_unreachable && !connected && !unreachable.is_empty() {
                    // Not a broker anywhere: an address given by mistake.
                    // Some refused: the cluster is down, or the address is
                    // wrong; the message names both.
                    if let Some((address, detail)) = not_a_broker.filter(|_| not_brokers == unreachable.len()) {
                        return Err(ClientError::NotKeel { address, detail });
                    }
                    return Err(ClientError::Unreachable { addresses: unreachable, reason: unreachable_reason });
                }
                (unreachable, connected, not_a_broker, not_brokers) = (Vec::new(), false, None, 0);
                tokio::time::sleep(delays.next().unwrap_or(policy.backoff_max)).await;
                queue = self.candidates(&route);
                continue;
            };
            queue.remove(0);
            let client = KeelClient::with_interceptor(self.channel(&address)?, self.inner.credentials.clone())
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX);
            // Boxed: a call's future is several KiB, and inline it made this
            // loop's (and every caller's) future as large, copied whenever
            // one is moved.
            let attempt = match tokio::time::timeout(attempt_timeout, Box::pin(request(&address, client))).await {
                Ok(result) => result,
                Err(_) => Err(Status::deadline_exceeded(format!("no answer within {attempt_timeout:?}"))),
            };
            match attempt {
                Ok(response) => {
                    self.learn(&route, &address);
                    return Ok((response.into_inner(), address));
                }
                Err(status) => {
                    last = format!("{address}: {}: {}", status.code(), status.message());
                    if let Some(reason) = tls_failure(&status) {
                        return Err(ClientError::TlsRefused { address, reason });
                    }
                    // Something that is not a keel broker counts as no
                    // broker there: the other candidates are still tried.
                    // It may be a port given by mistake (a metrics port),
                    // or a dead broker's port that another process took or
                    // that the connection met itself on (a TCP
                    // self-connect: a port in the ephemeral range with no
                    // listener, where the client reads its own preface).
                    if let Some(detail) = not_keel(&status) {
                        // A proxy's error page (a 502 without gRPC) may
                        // follow a request the broker behind it applied.
                        unanswered |= may_be_unanswered(&status);
                        unreachable.push(address.clone());
                        unreachable_reason = format!("{address} is not a keel broker ({detail})");
                        not_a_broker = Some((address, detail));
                        not_brokers += 1;
                        continue;
                    }
                    match connect_failure(&status) {
                        Some(reason) => {
                            unreachable.push(address.clone());
                            unreachable_reason = reason;
                        }
                        None => {
                            connected = true;
                            unanswered |= may_be_unanswered(&status);
                        }
                    }
                    match next_step(&status) {
                        Next::Fail if unanswered => {
                            let mut status = status;
                            status.metadata_mut().insert(AFTER_UNANSWERED_METADATA, "true".parse().expect("ascii"));
                            return Err(ClientError::Refused(status));
                        }
                        Next::Fail => return Err(ClientError::Refused(status)),
                        Next::Retry(hints) => {
                            // Not the broker that just refused: a replica
                            // whose group is stopped or not started yet names
                            // itself among the replicas, and was asked again
                            // and again, at once, until the deadline.
                            for hint in hints.into_iter().rev().filter(|hint| *hint != address) {
                                queue.retain(|a| *a != hint);
                                queue.insert(0, hint);
                            }
                        }
                        Next::Backoff => {
                            // A broker at its write limit says when to come back.
                            let hinted = status
                                .metadata()
                                .get(RETRY_AFTER_METADATA)
                                .and_then(|v| v.to_str().ok())
                                .and_then(|v| v.parse::<u64>().ok());
                            if let Some(ms) = hinted {
                                tokio::time::sleep(Duration::from_millis(ms.min(RETRY_AFTER_MS_MAX))).await;
                            }
                        }
                    }
                }
            }
        }
    }

    pub async fn create_topic(&self, request: pb::CreateTopicRequest) -> Result<pb::TopicDescription, ClientError> {
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.create_topic(r).await }
            })
            .await?;
        Ok(response.topic.unwrap_or_default())
    }

    pub async fn delete_topic(&self, topic: &str) -> Result<(), ClientError> {
        let request = pb::DeleteTopicRequest { topic: topic.to_string() };
        self.call(Route::Metadata, |mut c| {
            let r = request.clone();
            async move { c.delete_topic(r).await }
        })
        .await?;
        Ok(())
    }

    /// Change a topic's partition count (it can only grow) or retention;
    /// `None` keeps a setting, a retention of 0 removes that limit.
    pub async fn alter_topic(&self, request: pb::AlterTopicRequest) -> Result<pb::TopicDescription, ClientError> {
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.alter_topic(r).await }
            })
            .await?;
        Ok(response.topic.unwrap_or_default())
    }

    /// Delete a group that has no members: first its position on every
    /// partition of every topic, then the group itself. Returns how many
    /// partitions it had a position on. A group known only by its
    /// positions (never joined) is deleted too; a group with neither is
    /// `NOT_FOUND`. Refused with `FAILED_PRECONDITION` while it has members.
    pub async fn delete_group(&self, group: &str) -> Result<u32, ClientError> {
        use futures_util::{StreamExt, TryStreamExt};
        // Every partition where the group may have a position: a stale list
        // (from a broker that just restarted, say) would leave positions
        // behind on the topics it lacks (sim seed 110000971).
        let mut partitions = Vec::new();
        for topic in self.list_topics_fresh().await? {
            partitions.extend(topic.partitions.iter().map(|p| (topic.name.clone(), p.partition)));
        }
        let forgotten: Vec<bool> = futures_util::stream::iter(partitions)
            .map(|(topic, partition)| {
                let request = pb::ResetGroupPositionRequest {
                    group: group.to_string(),
                    topic,
                    partition,
                    to: Some(pb::reset_group_position_request::To::Forget(true)),
                };
                async move {
                    let route = Route::Partition(request.topic.clone(), request.partition);
                    let reply = self
                        .call(route, |mut c| {
                            let r = request.clone();
                            async move { c.reset_group_position(r).await }
                        })
                        .await?;
                    Ok::<_, ClientError>(reply.had_position)
                }
            })
            .buffered(GROUP_DELETE_PARTITIONS_IN_FLIGHT_MAX)
            .try_collect()
            .await?;
        let positions = forgotten.iter().filter(|had| **had).count() as u32;
        let request = pb::DeleteGroupRequest { group: group.to_string() };
        let deleted = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.delete_group(r).await }
            })
            .await;
        match deleted {
            Ok(_) => Ok(positions),
            // Positions set by `group reset` with no member ever joined.
            Err(ClientError::Refused(status)) if status.code() == tonic::Code::NotFound && positions > 0 => {
                Ok(positions)
            }
            Err(error) => Err(error),
        }
    }

    /// Every consumer group, as the broker asked has them.
    pub async fn list_groups(&self) -> Result<Vec<pb::GroupSummary>, ClientError> {
        Ok(self.call(Route::Any, |mut c| async move { c.list_groups(pb::ListGroupsRequest {}).await }).await?.groups)
    }

    pub async fn list_topics(&self) -> Result<Vec<pb::TopicDescription>, ClientError> {
        let request = pb::ListTopicsRequest { leader_only: false };
        Ok(self.call(Route::Any, |mut c| async move { c.list_topics(request).await }).await?.topics)
    }

    /// Every topic, as the metadata leader has them once it applied
    /// everything committed: no topic is missing (a broker's own replica may
    /// be behind, after a restart say).
    pub async fn list_topics_fresh(&self) -> Result<Vec<pb::TopicDescription>, ClientError> {
        let request = pb::ListTopicsRequest { leader_only: true };
        Ok(self.call(Route::Metadata, |mut c| async move { c.list_topics(request).await }).await?.topics)
    }

    pub async fn describe_topic(&self, topic: &str) -> Result<pb::TopicDescription, ClientError> {
        let request = pb::DescribeTopicRequest { topic: topic.to_string(), leader_only: false };
        let response = self
            .call(Route::Any, |mut c| {
                let r = request.clone();
                async move { c.describe_topic(r).await }
            })
            .await?;
        Ok(response.topic.unwrap_or_default())
    }

    /// A topic as the metadata leader knows it: no committed change (a
    /// deletion, say) is missing from it. Resolve a topic's incarnation
    /// with this before writing to it.
    pub async fn describe_topic_fresh(&self, topic: &str) -> Result<pb::TopicDescription, ClientError> {
        let request = pb::DescribeTopicRequest { topic: topic.to_string(), leader_only: true };
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.describe_topic(r).await }
            })
            .await?;
        Ok(response.topic.unwrap_or_default())
    }

    pub async fn describe_cluster(&self) -> Result<pb::DescribeClusterResponse, ClientError> {
        let cluster = self
            .call(Route::Any, |mut c| async move {
                c.describe_cluster(pb::DescribeClusterRequest { leader_only: false }).await
            })
            .await?;
        for broker in &cluster.brokers {
            self.learn(&Route::Any, &broker.address);
        }
        Ok(cluster)
    }

    /// The cluster as the metadata leader has it once it applied everything
    /// committed: a broker just registered or removed is seen as such (a
    /// broker's own replica may lag). Decide removals with this.
    pub async fn describe_cluster_fresh(&self) -> Result<pb::DescribeClusterResponse, ClientError> {
        let request = pb::DescribeClusterRequest { leader_only: true };
        self.call(Route::Metadata, |mut c| async move { c.describe_cluster(request).await }).await
    }

    /// The cluster's settings: name, value and scope of each.
    pub async fn describe_cluster_config(&self) -> Result<Vec<pb::ClusterSetting>, ClientError> {
        let describe = |mut c: Api| async move { c.describe_cluster_config(pb::DescribeClusterConfigRequest {}).await };
        let answer = self.call(Route::Any, describe).await?;
        Ok(answer.settings)
    }

    /// Change a cluster-scoped setting; returns the value it had.
    pub async fn set_cluster_config(&self, name: &str, value: u64) -> Result<u64, ClientError> {
        let request = pb::SetClusterConfigRequest { name: name.to_string(), value };
        let set = |mut c: Api| {
            let request = request.clone();
            async move { c.set_cluster_config(request).await }
        };
        let answer = self.call(Route::Metadata, set).await?;
        Ok(answer.previous)
    }

    /// Create `user` with `credential` (or with `replace`, give it a new
    /// one); derive it with [`keel_core::access::Credential::derive`] from
    /// the secret and a fresh random salt, so that only the hash reaches the
    /// cluster. Returns whether a secret was replaced.
    pub async fn set_user(
        &self,
        user: &str,
        credential: &keel_core::access::Credential,
        replace: bool,
    ) -> Result<bool, ClientError> {
        let request = pb::SetUserRequest {
            user: user.to_string(),
            salt: credential.salt.clone(),
            iterations: credential.iterations,
            hash: credential.hash.clone(),
            replace,
        };
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.set_user(r).await }
            })
            .await?;
        Ok(response.replaced)
    }

    pub async fn delete_user(&self, user: &str) -> Result<(), ClientError> {
        let request = pb::DeleteUserRequest { user: user.to_string() };
        self.call(Route::Metadata, |mut c| {
            let r = request.clone();
            async move { c.delete_user(r).await }
        })
        .await?;
        Ok(())
    }

    /// Every user's name (from the metadata leader).
    pub async fn list_users(&self) -> Result<Vec<String>, ClientError> {
        Ok(self.call(Route::Metadata, |mut c| async move { c.list_users(pb::ListUsersRequest {}).await }).await?.users)
    }

    /// Grant a rule; returns false when it was already in force.
    pub async fn add_acl(&self, acl: pb::Acl) -> Result<bool, ClientError> {
        let request = pb::AddAclRequest { acl: Some(acl) };
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.add_acl(r).await }
            })
            .await?;
        Ok(response.added)
    }

    pub async fn remove_acl(&self, acl: pb::Acl) -> Result<(), ClientError> {
        let request = pb::RemoveAclRequest { acl: Some(acl) };
        self.call(Route::Metadata, |mut c| {
            let r = request.clone();
            async move { c.remove_acl(r).await }
        })
        .await?;
        Ok(())
    }

    /// The rules (of `principal` only, unless it is empty), from the
    /// metadata leader.
    pub async fn list_acls(&self, principal: &str) -> Result<Vec<pb::Acl>, ClientError> {
        let request = pb::ListAclsRequest { principal: principal.to_string() };
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.list_acls(r).await }
            })
            .await?;
        Ok(response.acls)
    }

    /// Who a broker takes this client to be.
    pub async fn who_am_i(&self) -> Result<pb::WhoAmIResponse, ClientError> {
        self.call(Route::Any, |mut c| async move { c.who_am_i(pb::WhoAmIRequest {}).await }).await
    }

    /// Move every replica off a broker; returns how many moved. The broker's
    /// `replicas` in [`Client::describe_cluster`] counts down as they go.
    pub async fn drain_broker(&self, broker: u64) -> Result<u64, ClientError> {
        let response = self
            .call(Route::Metadata, |mut c| async move { c.drain_broker(pb::DrainBrokerRequest { broker }).await })
            .await?;
        Ok(response.moved)
    }

    /// Remove a broker that holds no replicas.
    pub async fn remove_broker(&self, broker: u64) -> Result<(), ClientError> {
        self.call(Route::Metadata, |mut c| async move { c.remove_broker(pb::RemoveBrokerRequest { broker }).await })
            .await?;
        Ok(())
    }

    /// Move a partition's replicas; the partition's leader then changes its
    /// Raft membership (watch `voters` in [`Client::describe_topic`]).
    pub async fn move_partition(
        &self,
        topic: &str,
        partition: u32,
        replicas: Vec<u64>,
    ) -> Result<pb::PartitionDescription, ClientError> {
        let request = pb::MovePartitionRequest { topic: topic.to_string(), partition, replicas };
        let response = self
            .call(Route::Metadata, |mut c| {
                let r = request.clone();
                async move { c.move_partition(r).await }
            })
            .await?;
        Ok(response.partition.unwrap_or_default())
    }

    pub async fn allocate_producer_id(&self) -> Result<u64, ClientError> {
        let response =
            self.call(Route::Metadata, |mut c| async move {
                c.allocate_producer_id(pb::AllocateProducerIdRequest {}).await
            })
            .await?;
        Ok(response.producer_id)
    }

    pub async fn describe_group(&self, group: &str) -> Result<pb::DescribeGroupResponse, ClientError> {
        let request = pb::DescribeGroupRequest { group: group.to_string() };
        self.call(Route::Any, |mut c| {
            let r = request.clone();
            async move { c.describe_group(r).await }
        })
        .await
    }

    /// A group's position on one partition, as its leader has it after a
    /// read index (current; unavailable while the partition has no leader).
    pub async fn group_position(
        &self,
        group: &str,
        topic: &str,
        partition: u32,
    ) -> Result<pb::GroupPositionResponse, ClientError> {
        let request = pb::GroupPositionRequest { group: group.to_string(), topic: topic.to_string(), partition };
        self.call(Route::Partition(topic.to_string(), partition), |mut c| {
            let r = request.clone();
            async move { c.group_position(r).await }
        })
        .await
    }

    /// Reset a group's position on one partition (the group must have no
    /// members).
    pub async fn reset_group_position(&self, request: pb::ResetGroupPositionRequest) -> Result<u64, ClientError> {
        let route = Route::Partition(request.topic.clone(), request.partition);
        let reset = self
            .call(route, |mut c| {
                let r = request.clone();
                async move { c.reset_group_position(r).await }
            })
            .await?;
        Ok(reset.position)
    }

    /// The offset of the first record of a partition appended at or after
    /// `time_ms` (milliseconds since the Unix epoch), or its high watermark
    /// if none is (like Kafka's `ListOffsets` by timestamp). A binary search
    /// over reads of one record each: about log2(records) reads. Append
    /// times never decrease within a partition (the leader clamps them).
    pub async fn offset_at_time(&self, topic: &str, partition: u32, time_ms: u64) -> Result<u64, ClientError> {
        // A position lookup answers with the partition's log start and high
        // watermark; the group's own position is not used (a group that
        // never committed has none, and the lookup changes nothing).
        let bounds = self.group_position(BOUNDS_LOOKUP_GROUP, topic, partition).await?;
        let (mut low, mut high) = (bounds.log_start, bounds.high_watermark);
        while low < high {
            let middle = low + (high - low) / 2;
            let request = pb::ReadRequest {
                topic: topic.to_string(),
                partition,
                offset: middle,
                max_records: 1,
                max_bytes: 0,
                any_replica: false,
            };
            let appended_at = match self.read(request).await {
                Ok(response) => response.records.first().map(|r| (r.offset, r.append_time_ms)),
                // Retention moved the log start past `middle` meanwhile.
                Err(ClientError::Refused(status)) if status.code() == Code::OutOfRange => None,
                Err(error) => return Err(error),
            };
            match appended_at {
                Some((offset, at)) if at >= time_ms => high = offset.min(high),
                Some((offset, _)) => low = offset + 1,
                None => low = middle + 1,
            }
        }
        Ok(low)
    }

    /// Append a batch to one partition (its leader takes it), on the
    /// client's produce stream to that broker.
    pub async fn produce(&self, request: pb::ProduceRequest) -> Result<pb::ProduceResponse, ClientError> {
        let route = Route::Partition(request.topic.clone(), request.partition);
        self.attempts(route, Duration::ZERO, |address, client| {
            let (address, request) = (address.to_string(), request.clone());
            async move { self.inner.produce_streams.produce(&address, client, request).await }
        })
        .await
        .map(|(answer, _)| answer)
    }

    /// Read committed records of one partition from any replica.
    pub async fn read(&self, request: pb::ReadRequest) -> Result<pb::ReadResponse, ClientError> {
        let route = Route::Partition(request.topic.clone(), request.partition);
        self.call(route, |mut c| {
            let r = request.clone();
            async move { c.read(r).await }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_at_its_write_limit_is_retried_other_exhaustion_is_not() {
        let mut busy = Status::resource_exhausted("broker 1 holds 256 MiB of writes in flight");
        busy.metadata_mut().insert(RETRY_AFTER_METADATA, "100".parse().unwrap());
        assert!(matches!(next_step(&busy), Next::Backoff));
        let too_big = Status::resource_exhausted("record 0 is over the size limit");
        assert!(matches!(next_step(&too_big), Next::Fail));
    }

    /// A refusal that follows an unanswered attempt of the same request says
    /// so (that attempt may still be applied); one that follows only
    /// answered attempts does not.
    #[tokio::test]
    async fn a_refusal_after_an_unanswered_attempt_is_marked() {
        let policy = RetryPolicy {
            deadline: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(1),
            jitter_seed: Some(1),
            request_timeout: Duration::from_millis(50),
            give_up_when_unreachable: false,
        };
        let client = Client::new(vec!["127.0.0.1:1".into()], policy).unwrap();
        let refuse_after = |unanswered: usize| {
            let calls = std::sync::atomic::AtomicUsize::new(0);
            let client = client.clone();
            async move {
                let answer = client
                    .attempts(Route::Metadata, Duration::ZERO, |_, _| {
                        let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        async move {
                            if call < unanswered {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                            Err::<tonic::Response<()>, _>(Status::failed_precondition("a sequence gap"))
                        }
                    })
                    .await;
                match answer {
                    Err(ClientError::Refused(status)) => status.metadata().get(AFTER_UNANSWERED_METADATA).is_some(),
                    other => panic!("not refused: {other:?}"),
                }
            }
        };
        assert!(!refuse_after(0).await, "no attempt went unanswered");
        assert!(refuse_after(1).await, "the first attempt timed out");
    }

    /// A broker that refuses naming itself among the replicas (its group
    /// stopped or not started yet) is not asked again at once: the next
    /// replica is. It was asked in a loop until the deadline.
    #[tokio::test]
    async fn a_refusing_broker_that_names_itself_is_not_asked_again_at_once() {
        let (stopped, running) = ("127.0.0.1:1", "127.0.0.1:2");
        let policy = RetryPolicy { deadline: Duration::from_secs(5), ..RetryPolicy::default() };
        let client = Client::new(vec![stopped.to_string()], policy).unwrap();
        let asked = std::sync::Mutex::new(Vec::new());
        let answer = client
            .attempts(Route::Metadata, Duration::ZERO, |address, _| {
                asked.lock().unwrap().push(address.to_string());
                let address = address.to_string();
                async move {
                    if address == running {
                        return Ok(tonic::Response::new(()));
                    }
                    let mut status = Status::failed_precondition("partition t/0 is not hosted on broker 1");
                    let replicas = format!("1@{stopped},2@{running}");
                    status.metadata_mut().insert("keel-replicas", replicas.parse().unwrap());
                    Err(status)
                }
            })
            .await;
        assert_eq!(answer.unwrap().1, running);
        assert_eq!(*asked.lock().unwrap(), [stopped, running]);
    }
}
