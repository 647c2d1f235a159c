//! The broker's Prometheus metrics: request counts and latencies, produce
//! and consume volumes, Raft state per group and consumer lag.
//!
//! Counters and histograms are updated as requests complete. Raft state and
//! lag are read from the node when scraped, so they are never stale and
//! cost nothing between scrapes. Lag is reported by the broker that leads
//! the partition, so summing over brokers counts each partition once.
//! Nothing here feeds back into behaviour.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tonic::Code;

use crate::group::GroupId;
use crate::node::Node;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    rpc: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    raft_group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LagLabels {
    group: String,
    topic: String,
    partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer: u64,
}

/// gRPC's canonical name of a status code, as Prometheus users of gRPC
/// expect it in a `code` label (`OK`, `NOT_FOUND`).
pub fn canonical_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    rpc: String,
    /// The permission lacked (`produce on topic`), or `authentication`.
    lacked: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// Most consumer-lag series one partition reports.
pub const LAG_SERIES_PER_PARTITION_MAX: usize = 1_000;

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A Raft call to a peer, as its latency is labelled.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum RaftRpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RaftCallLabels {
    pub rpc: RaftRpc,
}

/// Latency of the Raft calls this broker's groups make to peers, by RPC
/// (shared by the transport, which observes it, and the registry).
pub type RaftCallLatency = HistogramFamily<RaftCallLabels>;

/// An empty [`RaftCallLatency`].
pub fn raft_call_latency() -> RaftCallLatency {
    // 0.1 ms to about 3 s: a loopback call is answered in well under a
    // millisecond, a loaded one in tens, and a call's time limit is 75 ms.
    fn buckets() -> Histogram {
        Histogram::new(exponential_buckets(0.0001, 2.0, 16))
    }
    HistogramFamily::new_with_constructor(buckets)
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The broker's metrics registry.
pub struct Metrics {
    /// Every series.
    registry: Registry,
    /// The broker's own series only: none per Raft group or partition.
    node_registry: Registry,
    requests: Family<RpcLabels, Counter>,
    refused: Family<RefusalLabels, Counter>,
    latency: HistogramFamily<LatencyLabels>,
    produced_records: Counter,
    produced_bytes: Counter,
    polled_records: Counter,
    acks: Counter,
    claims: Counter,
    append_entries: Counter,
    append_batches: Counter,
    raft_leader: Family<GroupLabels, Gauge>,
    raft_term: Family<GroupLabels, Gauge>,
    raft_last_log_index: Family<GroupLabels, Gauge>,
    raft_last_applied_index: Family<GroupLabels, Gauge>,
    raft_voters: Family<GroupLabels, Gauge>,
    raft_groups_led: Gauge,
    raft_quiet_groups: Family<RoleLabels, Gauge>,
    raft_groups_waiting: Gauge,
    raft_groups_electing: Gauge,
    raft_wave_size: Gauge,
    snapshots_built: Gauge,
    snapshots_installed: Gauge,
    high_watermark: Family<PartitionLabels, Gauge>,
    lag: Family<LagLabels, Gauge>,
    peer_up: Family<PeerLabels, Gauge>,
    peer_failed_calls: Family<PeerLabels, Counter>,
    raft_calls: Family<PeerLabels, Counter>,
    raft_batches: Family<PeerLabels, Counter>,
    raft_call_latency: RaftCallLatency,
    process: ProcessMetrics,
    log_segments: Gauge,
    log_bytes: Gauge,
    log_syncs: Counter,
    log_checkpoints: Counter,
    log_transactions: Counter,
    log_live_bytes: Gauge,
    log_compacted_bytes: Counter,
    log_spare_segments: Gauge,
    log_recycled_segments: Counter,
    log_side_applies: Counter,
}

/// The standard `process_*` metrics of Prometheus's client libraries, read
/// from /proc at each scrape (real builds on Linux only: a simulated node
/// shares its process with every other). Unprefixed, as dashboards expect.
#[derive(Default)]
struct ProcessMetrics {
    cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    resident_memory_bytes: Gauge,
    virtual_memory_bytes: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time_seconds: Gauge,
    threads: Gauge,
}

impl ProcessMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size, in bytes",
            self.resident_memory_bytes.clone(),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size, in bytes",
            self.virtual_memory_bytes.clone(),
        );
        registry.register("process_open_fds", "Open file descriptors", self.open_fds.clone());
        registry.register("process_max_fds", "Most file descriptors the process may open", self.max_fds.clone());
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds",
            self.start_time_seconds.clone(),
        );
        registry.register("process_threads", "OS threads of the process", self.threads.clone());
    }

    /// Read /proc/self; what cannot be read keeps its last value.
    #[cfg(not(madsim))]
    fn refresh(&self) {
        let Ok(me) = procfs::process::Process::myself() else { return };
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second().max(1) as f64;
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            // A counter only goes up: add what was spent since the last scrape.
            let seen = self.cpu_seconds.get();
            if cpu > seen {
                self.cpu_seconds.inc_by(cpu - seen);
            }
            self.resident_memory_bytes.set(saturating_i64(stat.rss.saturating_mul(procfs::page_size())));
            self.virtual_memory_bytes.set(saturating_i64(stat.vsize));
            self.threads.set(stat.num_threads);
            if let Ok(boot) = procfs::boot_time_secs() {
                self.start_time_seconds.set(saturating_i64(boot + stat.starttime / procfs::ticks_per_second().max(1)));
            }
        }
        if let Ok(count) = me.fd_count() {
            self.open_fds.set(count as i64);
        }
        if let Ok(limits) = me.limits() {
            if let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit {
                self.max_fds.set(saturating_i64(max));
            }
        }
    }

    #[cfg(madsim)]
    fn refresh(&self) {}
}

#[cfg(not(madsim))]
fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Metrics {
            requests: Family::default(),
            refused: Family::default(),
            latency: HistogramFamily::new_with_constructor(latency_histogram),
            produced_records: Counter::default(),
            produced_bytes: Counter::default(),
            polled_records: Counter::default(),
            acks: Counter::default(),
            claims: Counter::default(),
            append_entries: Counter::default(),
            append_batches: Counter::default(),
            raft_leader: Family::default(),
            raft_term: Family::default(),
            raft_last_log_index: Family::default(),
            raft_last_applied_index: Family::default(),
            raft_voters: Family::default(),
            raft_groups_led: Gauge::default(),
            raft_quiet_groups: Family::default(),
            raft_groups_waiting: Gauge::default(),
            raft_groups_electing: Gauge::default(),
            raft_wave_size: Gauge::default(),
            snapshots_built: Gauge::default(),
            snapshots_installed: Gauge::default(),
            high_watermark: Family::default(),
            lag: Family::default(),
            peer_up: Family::default(),
            peer_failed_calls: Family::default(),
            raft_calls: Family::default(),
            raft_batches: Family::default(),
            raft_call_latency: raft_call_latency(),
            process: ProcessMetrics::default(),
            log_segments: Gauge::default(),
            log_bytes: Gauge::default(),
            log_syncs: Counter::default(),
            log_checkpoints: Counter::default(),
            log_transactions: Counter::default(),
            log_live_bytes: Gauge::default(),
            log_compacted_bytes: Counter::default(),
            log_spare_segments: Gauge::default(),
            log_recycled_segments: Counter::default(),
            log_side_applies: Counter::default(),
            registry: Registry::default(),
            node_registry: Registry::default(),
        };
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").to_string() }).set(1);
        let registry = metrics.registry_of(&build_info, true);
        let node_registry = metrics.registry_of(&build_info, false);
        Metrics { registry, node_registry, ..metrics }
    }

    /// A registry of every series, or (`per_group` false) of the broker's
    /// own only.
    fn registry_of(&self, build_info: &Family<BuildLabels, Gauge>, per_group: bool) -> Registry {
        let metrics = self;
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("keel");
        registry.register("build_info", "Always 1; the version of keel this broker runs", build_info.clone());
        registry.register("requests", "API requests answered, by RPC and gRPC status code", metrics.requests.clone());
        registry.register(
            "requests_refused",
            "API requests refused for lack of a permission (by RPC and the permission's operation and resource \
             kind, e.g. `produce on topic`), of authentication (`authentication`), or made with a broker's \
             certificate (`broker`)",
            metrics.refused.clone(),
        );
        registry.register("request_duration_seconds", "API request latency, by RPC", metrics.latency.clone());
        registry.register(
            "raft_call_duration_seconds",
            "Raft calls to peers that were answered, by RPC: from sending to the answer, the peer's work included \
             (a vote and appended entries are flushed before it answers); calls with no answer are not in it \
             (those that could not reach the peer are in keel_peer_failed_calls_total)",
            metrics.raft_call_latency.clone(),
        );
        registry.register("produced_records", "Records appended by produce requests", metrics.produced_records.clone());
        registry.register(
            "produced_bytes",
            "Value and key bytes appended by produce requests",
            metrics.produced_bytes.clone(),
        );
        registry.register("polled_records", "Records handed to consumers by polls", metrics.polled_records.clone());
        registry.register("acks", "Consumer acknowledgements committed", metrics.acks.clone());
        registry.register(
            "claims",
            "Claims this broker wrote as a partition's leader, one per partition for a member's first poll of a \
             generation (a claim an earlier leader wrote is not written again)",
            metrics.claims.clone(),
        );
        registry.register(
            "append_entries",
            "Raft entries proposed by this leader for produce requests (each carries one or more batches)",
            metrics.append_entries.clone(),
        );
        registry.register(
            "append_batches",
            "Produce batches proposed by this leader, gathered into keel_append_entries_total entries",
            metrics.append_batches.clone(),
        );
        if per_group {
            registry.register("raft_leader", "1 if this broker leads the Raft group", metrics.raft_leader.clone());
            registry.register("raft_term", "The Raft group's current term on this broker", metrics.raft_term.clone());
            registry.register(
                "raft_last_log_index",
                "Last log index on this replica",
                metrics.raft_last_log_index.clone(),
            );
            registry.register(
                "raft_last_applied_index",
                "Last applied index on this replica",
                metrics.raft_last_applied_index.clone(),
            );
            registry.register(
                "raft_voters",
                "Voters of the Raft group as this replica sees them",
                metrics.raft_voters.clone(),
            );
            registry.register(
                "partition_high_watermark",
                "Next offset of partitions led here",
                metrics.high_watermark.clone(),
            );
            registry.register(
                "consumer_lag",
                "Records not yet acknowledged by a group, on partitions led here",
                metrics.lag.clone(),
            );
        }
        registry.register(
            "raft_groups_led",
            "Raft groups (the metadata group and partitions) this broker leads: the sum of keel_raft_leader",
            metrics.raft_groups_led.clone(),
        );
        registry.register(
            "snapshots_built",
            "Raft snapshots this broker built since it started (all groups)",
            metrics.snapshots_built.clone(),
        );
        registry.register(
            "snapshots_installed",
            "Raft snapshots this broker installed from a leader since it started (all groups)",
            metrics.snapshots_installed.clone(),
        );
        registry.register(
            "peer_up",
            "1 if this broker's last Raft call to the peer reached it, 0 if not",
            metrics.peer_up.clone(),
        );
        registry.register(
            "peer_failed_calls",
            "Raft calls to the peer that could not reach it (refused, timed out, or held back while it was down)",
            metrics.peer_failed_calls.clone(),
        );
        registry.register(
            "raft_calls",
            "Raft calls (AppendEntries, votes, snapshot chunks) this broker sent to the peer, answered or not",
            metrics.raft_calls.clone(),
        );
        registry.register(
            "raft_batches",
            "Batch RPCs this broker sent to the peer, each carrying several of its Raft calls (counted in \
             keel_raft_calls_total too) while others were in flight",
            metrics.raft_batches.clone(),
        );
        registry.register(
            "raft_quiet_groups",
            "Partition groups here that are quiet (idle: no heartbeats, no election timer), as leader and as follower",
            metrics.raft_quiet_groups.clone(),
        );
        registry.register(
            "raft_groups_waiting",
            "Partition groups started here waiting for their turn to elect (no leader known yet)",
            metrics.raft_groups_waiting.clone(),
        );
        registry.register(
            "raft_groups_electing",
            "Partition groups here holding a turn to elect and settle (at most raft_wave_size at once)",
            metrics.raft_groups_electing.clone(),
        );
        registry.register(
            "raft_wave_size",
            "Turns to elect and settle this broker hands out at once now: halved when turns end without a leader, \
             one more per group that settles",
            metrics.raft_wave_size.clone(),
        );
        registry.register("log_segments", "Segment files of this broker's log", metrics.log_segments.clone());
        registry.register(
            "log_bytes",
            "Bytes on disk of this broker's log segments (created at full size)",
            metrics.log_bytes.clone(),
        );
        registry.register(
            "log_syncs",
            "fdatasyncs of the log (each covers every group's waiting appends) and durable commits",
            metrics.log_syncs.clone(),
        );
        registry.register(
            "log_checkpoints",
            "Checkpoints: durable commits of the broker's database, after which unused segments go",
            metrics.log_checkpoints.clone(),
        );
        registry.register(
            "log_transactions",
            "Transactions the storage writer committed to the broker's database (one per batch with anything to write)",
            metrics.log_transactions.clone(),
        );
        registry.register(
            "log_live_bytes",
            "Bytes of the log's frames still in use (what the segments would take if fully compacted)",
            metrics.log_live_bytes.clone(),
        );
        registry.register(
            "log_compacted_bytes",
            "Bytes of live frames compaction copied out of mostly dead segments so that they could go",
            metrics.log_compacted_bytes.clone(),
        );
        registry.register(
            "log_spare_segments",
            format!(
                "Freed segments kept (at most {}) to become later segments instead of new files",
                crate::storage::segments::SPARE_SEGMENTS_MAX
            ),
            metrics.log_spare_segments.clone(),
        );
        registry.register(
            "log_recycled_segments",
            "Segments made from spares (written over, not newly allocated) since the broker started",
            metrics.log_recycled_segments.clone(),
        );
        registry.register(
            "log_side_applies",
            "Raft applies committed on their own beside the storage writer, rather than queued behind its fsync",
            metrics.log_side_applies.clone(),
        );
        metrics.process.register(&mut root);
        root
    }

    /// The histogram of Raft call latency, for the transport to observe.
    pub fn raft_call_latency(&self) -> RaftCallLatency {
        self.raft_call_latency.clone()
    }

    /// Count one answered request and its latency.
    pub fn observe_request(&self, rpc: &'static str, code: tonic::Code, seconds: f64) {
        // Labels of static names: no allocation per request.
        self.requests.get_or_create(&RpcLabels { rpc, code: canonical_name(code) }).inc();
        self.latency.get_or_create(&LatencyLabels { rpc }).observe(seconds);
    }

    /// A request refused by the access rules: `lacked` names what it
    /// lacked, without the resource's name (which would make a series per
    /// name).
    pub fn refused(&self, rpc: &str, lacked: &str) {
        self.refused.get_or_create(&RefusalLabels { rpc: rpc.to_string(), lacked: lacked.to_string() }).inc();
    }

    pub fn produced(&self, records: u64, bytes: u64) {
        self.produced_records.inc_by(records);
        self.produced_bytes.inc_by(bytes);
    }

    /// One Raft entry carrying `batches` produce batches was proposed.
    pub fn append_entry(&self, batches: u64) {
        self.append_entries.inc();
        self.append_batches.inc_by(batches);
    }

    /// Raft entries and produce batches proposed so far (for tests).
    pub fn append_counts(&self) -> (u64, u64) {
        (self.append_entries.get(), self.append_batches.get())
    }

    pub fn polled(&self, records: u64) {
        self.polled_records.inc_by(records);
    }

    pub fn acked(&self) {
        self.acks.inc();
    }

    pub fn claimed(&self) {
        self.claims.inc();
    }

    /// Claims written here since the broker started.
    pub fn claims_written(&self) -> u64 {
        self.claims.get()
    }

    /// Read the node's current Raft state and lag, then render everything
    /// in the OpenMetrics text format.
    pub fn render(&self, node: &Node) -> String {
        self.refresh_node(node);
        self.refresh_groups(node);
        Self::encode(&self.registry)
    }

    /// Read the node's own figures, then render them (no series per Raft
    /// group or partition): what a scraper of a broker with thousands of
    /// partitions reads cheaply.
    pub fn render_node(&self, node: &Node) -> String {
        self.refresh_node(node);
        Self::encode(&self.node_registry)
    }

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
            let _ = writeln!(text, "# metrics could not be encoded");
        }
        text
    }

    /// The series of the broker as a whole.
    fn refresh_node(&self, node: &Node) {
        self.process.refresh();
        self.raft_groups_led.set(node.groups_led() as i64);
        for (peer, health) in node.peer_health() {
            let labels = PeerLabels { peer };
            self.peer_up.get_or_create(&labels).set(i64::from(health.down_since.is_none()));
            let counter = self.peer_failed_calls.get_or_create(&labels);
            counter.inc_by(health.failed_calls.saturating_sub(counter.get()));
            let counter = self.raft_calls.get_or_create(&labels);
            counter.inc_by(health.calls.saturating_sub(counter.get()));
            let counter = self.raft_batches.get_or_create(&labels);
            counter.inc_by(health.batches.saturating_sub(counter.get()));
        }
        let usage = node.log_usage();
        self.log_segments.set(usage.segments as i64);
        self.log_bytes.set(usage.bytes as i64);
        self.log_syncs.inc_by(usage.syncs.saturating_sub(self.log_syncs.get()));
        self.log_checkpoints.inc_by(usage.checkpoints.saturating_sub(self.log_checkpoints.get()));
        self.log_transactions.inc_by(usage.transactions.saturating_sub(self.log_transactions.get()));
        self.log_live_bytes.set(usage.live_bytes as i64);
        self.log_compacted_bytes.inc_by(usage.compacted_bytes.saturating_sub(self.log_compacted_bytes.get()));
        self.log_spare_segments.set(usage.spare_segments as i64);
        self.log_recycled_segments.inc_by(usage.recycled_segments.saturating_sub(self.log_recycled_segments.get()));
        self.log_side_applies.inc_by(usage.side_applies.saturating_sub(self.log_side_applies.get()));
        let quiet = node.quiet_counts();
        self.raft_quiet_groups.get_or_create(&RoleLabels { role: "leader" }).set(quiet.led as i64);
        self.raft_quiet_groups.get_or_create(&RoleLabels { role: "follower" }).set(quiet.followed as i64);
        let (waiting, electing) = node.wave_counts();
        self.raft_groups_waiting.set(waiting as i64);
        self.raft_groups_electing.set(electing as i64);
        self.raft_wave_size.set(node.wave_size() as i64);
        let (built, installed) = node.snapshot_counts();
        self.snapshots_built.set(built as i64);
        self.snapshots_installed.set(installed as i64);
    }

    /// A series per Raft group running here and per partition led here.
    fn refresh_groups(&self, node: &Node) {
        for family in [
            &self.raft_leader,
            &self.raft_term,
            &self.raft_last_log_index,
            &self.raft_last_applied_index,
            &self.raft_voters,
        ] {
            family.clear();
        }
        self.high_watermark.clear();
        self.lag.clear();
        let metadata = node.metadata();
        for group in node.groups() {
            let Some(raft) = node.raft(&group) else { continue };
            let labels = GroupLabels { raft_group: group.to_string() };
            let (leading, term, last_log, applied, voters) = {
                let metrics = raft.metrics();
                let m = metrics.borrow();
                (
                    // Its state, not `current_leader`: after a restart that
                    // names the leader of the last committed vote until an
                    // election says otherwise.
                    m.state == openraft::ServerState::Leader,
                    m.current_term,
                    m.last_log_index.unwrap_or(0),
                    m.last_applied.map_or(0, |l| l.index),
                    m.membership_config.membership().voter_ids().count(),
                )
            };
            self.raft_leader.get_or_create(&labels).set(i64::from(leading));
            self.raft_term.get_or_create(&labels).set(term as i64);
            self.raft_last_log_index.get_or_create(&labels).set(last_log as i64);
            self.raft_last_applied_index.get_or_create(&labels).set(applied as i64);
            self.raft_voters.get_or_create(&labels).set(voters as i64);
            let GroupId::Partition(partition, _) = &group else { continue };
            if !leading {
                continue;
            }
            let Some(state) = node.partition(partition) else { continue };
            let high_watermark = state.high_watermark().0;
            let labels = PartitionLabels { topic: partition.topic.to_string(), partition: partition.partition.0 };
            self.high_watermark.get_or_create(&labels).set(high_watermark as i64);
            // A partition remembers every group that ever read it; report
            // those still subscribed, and the others only while they lag.
            let mut series = 0;
            for group_name in state.groups().keys() {
                let lag = high_watermark.saturating_sub(state.group_position(group_name).0);
                let subscribed = metadata.group(group_name).is_some_and(|g| g.subscribes_to(&partition.topic));
                if !(subscribed || lag > 0) || series >= LAG_SERIES_PER_PARTITION_MAX {
                    continue;
                }
                series += 1;
                let labels = LagLabels {
                    group: group_name.to_string(),
                    topic: partition.topic.to_string(),
                    partition: partition.partition.0,
                };
                self.lag.get_or_create(&labels).set(lag as i64);
            }
        }
    }
}
