//! What a seed decides before the run starts: the cluster, the topics, the
//! workload and the faults (swarm testing: each seed enables its own mix of
//! fault kinds). Drawn from a seeded RNG, so printing it costs nothing and
//! the same seed always gives the same scenario.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// A kind of fault the simulation injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Power cut on a broker (unsynced writes lost or torn), then restart.
    Crash,
    /// Power cut on a current partition or metadata leader.
    LeaderCrash,
    /// A broker's process stops, then resumes.
    Pause,
    /// A minority of brokers is cut off from everyone else.
    PartitionMinority,
    /// The clients can reach only a minority of brokers (the majority is cut
    /// off from them and from the minority).
    PartitionMajority,
    /// Messages from one broker to another are dropped; the other way works.
    PartitionOneWay,
    /// Two halves that reach each other only through one bridge broker.
    PartitionBridge,
    /// A share of new connections is refused.
    PacketLoss,
    /// Messages take 10-200 ms.
    Delay,
    /// A broker's clock gets an offset and a drift.
    ClockSkew,
    /// A broker's clock jumps forwards or backwards.
    ClockJump,
    /// A consumer's process dies; a new member (another id) takes its place.
    ConsumerCrash,
    /// A consumer's process stops past its session, then resumes.
    ConsumerPause,
    /// Power cut on a majority of the brokers at once, then restart. Disks
    /// honour fsync, so nothing acknowledged may be lost.
    PowerLossMajority,
    /// Power cut on every broker at once, then restart.
    PowerLossAll,
    /// A broker's disk loses power in the middle of its writes (after a
    /// drawn number of them): the broker must stop on the I/O error, and
    /// restarts from what its disk kept.
    PowerLossMidWrite,
    /// The metadata leader's or a partition leader's clock steps by hours,
    /// forwards or backwards (beyond any session or retention period).
    ClockStepHours,
    /// A broker's process is killed (kill -9) and restarted: its page
    /// cache survives, so it restarts from every write it issued, synced
    /// or not, and a later power cut may still take the unsynced ones.
    Kill,
    /// A broker's disk fills up (ENOSPC on every write): the broker must
    /// stop rather than go on; space is freed and it restarts from what
    /// its disk holds.
    DiskFull,
    /// A broker's disk fails (EIO on every write and fsync; a failed fsync
    /// forgets what it was to make durable): the broker must stop; it
    /// restarts from what its disk made durable, as after a power cut.
    DiskFailure,
    /// A share of the Raft messages between brokers is delivered twice,
    /// the copy 1-300 ms later (after newer messages): duplicated and
    /// reordered messages.
    Duplication,
    /// Producers reach only some brokers and consumers only the others:
    /// clients split from each other, each side from part of the cluster.
    ClientSplit,
    /// A partition's leader (or, if none is found, a minority of brokers)
    /// is cut off from the other brokers while every client still reaches
    /// every broker: the leader, deposed without knowing it, goes on
    /// answering clients from a state that stops moving (what a read index
    /// is for).
    PartitionBrokers,
    /// An operator's restart (SIGTERM, then start again): a broker stops
    /// gracefully while clients use it (its long polls answered, its
    /// produce streams ended, its groups stopped, its store closed), then
    /// its power is cut, so nothing it reported persisted may be missing
    /// from the disk, and it starts again.
    Restart,
}

impl FaultKind {
    /// Every kind. A seed draws the first [`FaultKind::FIRST_DRAWN`] in one
    /// go and the later ones after the rest of its scenario, so that adding
    /// a kind leaves every earlier choice of every seed as it was.
    pub const ALL: [FaultKind; 24] = [
        FaultKind::Crash,
        FaultKind::LeaderCrash,
        FaultKind::Pause,
        FaultKind::PartitionMinority,
        FaultKind::PartitionMajority,
        FaultKind::PartitionOneWay,
        FaultKind::PartitionBridge,
        FaultKind::PacketLoss,
        FaultKind::Delay,
        FaultKind::ClockSkew,
        FaultKind::ClockJump,
        FaultKind::ConsumerCrash,
        FaultKind::ConsumerPause,
        FaultKind::PowerLossMajority,
        FaultKind::PowerLossAll,
        FaultKind::PowerLossMidWrite,
        FaultKind::ClockStepHours,
        FaultKind::Kill,
        FaultKind::DiskFull,
        FaultKind::DiskFailure,
        FaultKind::Duplication,
        FaultKind::ClientSplit,
        FaultKind::PartitionBrokers,
        FaultKind::Restart,
    ];

    /// Kinds drawn with the first choices of a seed (the ones that existed
    /// when seeds were first recorded).
    pub const FIRST_DRAWN: usize = 13;
    /// Kinds drawn with the later lanes; the ones after are drawn last of
    /// all, one at a time, as they were added.
    pub const SECOND_DRAWN: usize = 17;
    /// Kinds drawn before the shape lane; the ones after, after it.
    pub const THIRD_DRAWN: usize = 20;
    /// Kinds drawn before the slow consumer; the ones after, after it.
    pub const FOURTH_DRAWN: usize = 22;
    /// Kinds drawn before eager batching; the ones after, after it.
    pub const FIFTH_DRAWN: usize = 23;

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::LeaderCrash => "leader-crash",
            FaultKind::Pause => "pause",
            FaultKind::PartitionMinority => "partition-minority",
            FaultKind::PartitionMajority => "partition-majority",
            FaultKind::PartitionOneWay => "partition-one-way",
            FaultKind::PartitionBridge => "partition-bridge",
            FaultKind::PacketLoss => "packet-loss",
            FaultKind::Delay => "delay",
            FaultKind::ClockSkew => "clock-skew",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::ConsumerCrash => "consumer-crash",
            FaultKind::ConsumerPause => "consumer-pause",
            FaultKind::PowerLossMajority => "power-loss-majority",
            FaultKind::PowerLossAll => "power-loss-all",
            FaultKind::PowerLossMidWrite => "power-loss-mid-write",
            FaultKind::ClockStepHours => "clock-step-hours",
            FaultKind::Kill => "kill",
            FaultKind::DiskFull => "disk-full",
            FaultKind::DiskFailure => "disk-failure",
            FaultKind::Duplication => "duplication",
            FaultKind::ClientSplit => "client-split",
            FaultKind::PartitionBrokers => "partition-brokers",
            FaultKind::Restart => "restart",
        }
    }

    /// Faults that take brokers down or cut them off.
    pub fn is_node_fault(self) -> bool {
        matches!(
            self,
            FaultKind::Crash
                | FaultKind::LeaderCrash
                | FaultKind::Pause
                | FaultKind::PowerLossMajority
                | FaultKind::PowerLossAll
                | FaultKind::PowerLossMidWrite
                | FaultKind::Kill
                | FaultKind::DiskFull
                | FaultKind::DiskFailure
                | FaultKind::Restart
        )
    }

    pub fn is_network_fault(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionMinority
                | FaultKind::PartitionMajority
                | FaultKind::PartitionOneWay
                | FaultKind::PartitionBridge
                | FaultKind::PacketLoss
                | FaultKind::Delay
                | FaultKind::Duplication
                | FaultKind::ClientSplit
                | FaultKind::PartitionBrokers
        )
    }

    pub fn is_clock_fault(self) -> bool {
        matches!(self, FaultKind::ClockSkew | FaultKind::ClockJump | FaultKind::ClockStepHours)
    }

    pub fn is_client_fault(self) -> bool {
        matches!(self, FaultKind::ConsumerCrash | FaultKind::ConsumerPause)
    }
}

/// The range of the time retention lane's age limit: long enough that a
/// run's last records outlive it, short enough that the log start moves by
/// age within the safety phase.
pub const RETENTION_MS_MIN: u64 = 5_000;
pub const RETENTION_MS_MAX: u64 = 30_000;

/// A member that falls far behind (see [`Scenario::slow_consumer`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowConsumer {
    /// How long it processes what one poll returned.
    pub pause_ms: u64,
    /// Most records one of its polls asks for.
    pub records_per_poll: u32,
}

/// How long the brokers' fsyncs take (see [`Scenario::disk_latency`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskLatency {
    /// Every sync takes between these many microseconds.
    pub sync_us: (u64, u64),
    /// One sync in this many stalls (a busy or failing device), until the
    /// faults heal.
    pub stall_one_in: u32,
    /// How long a stall lasts, in milliseconds.
    pub stall_ms: (u64, u64),
}

/// Most partitions of the shape lane's wide topic.
pub const WIDE_TOPIC_PARTITIONS_MAX: u32 = 50;

/// One topic of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: u32,
}

/// How a consumer group shares its partitions (`JoinGroupRequest.assignor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AssignorChoice {
    Sticky,
    Range,
    RoundRobin,
}

impl Shape {
    /// The shape seeds had before the lane: sticky, one group, no budget,
    /// no reader (as a starting point for the plants that need the lane).
    pub fn first() -> Shape {
        Shape { assignor: AssignorChoice::Sticky, second_group: None, poll_bytes_max: 0, reader: false }
    }

    fn describe(&self) -> String {
        let second = self.second_group.as_ref().map_or_else(String::new, |g| {
            format!(
                ", group {} ({} assignor, {} members) reads {}",
                g.name,
                g.assignor.name(),
                g.members,
                g.topics.join(", ")
            )
        });
        format!(
            " group g uses the {} assignor{second}; polls ask for {}{}; ",
            self.assignor.name(),
            if self.poll_bytes_max == 0 {
                "the default bytes".to_string()
            } else {
                format!("{} bytes", self.poll_bytes_max)
            },
            if self.reader { "; a reader reads by offset" } else { "" },
        )
    }
}

impl AssignorChoice {
    pub const ALL: [AssignorChoice; 3] = [AssignorChoice::Sticky, AssignorChoice::Range, AssignorChoice::RoundRobin];

    pub fn name(self) -> &'static str {
        match self {
            AssignorChoice::Sticky => "sticky",
            AssignorChoice::Range => "range",
            AssignorChoice::RoundRobin => "round-robin",
        }
    }
}

/// A consumer group besides `g`, with its own subscription and assignor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    pub name: String,
    /// A subset of the run's topics.
    pub topics: Vec<String>,
    pub assignor: AssignorChoice,
    /// Members, each on its own client host.
    pub members: u32,
}

/// The workload's shape beyond one group of sticky members reading topics
/// of replication factor 3 with no byte budget (what seeds drew before).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// The assignor of group `g`, which reads every topic.
    pub assignor: AssignorChoice,
    /// A second group reading some of the topics.
    pub second_group: Option<GroupSpec>,
    /// Most bytes a member's poll asks for (0: the broker's default).
    pub poll_bytes_max: u64,
    /// A client reads partitions by offset (Read, no group) throughout the
    /// safety phase; what it reads must agree with every other observer.
    pub reader: bool,
}

/// Everything a seed decides. A scenario can also be given whole (as
/// JSON, `keel-sim run --scenario`): the shrinker writes the smaller
/// scenarios it finds that way, and the seed still drives everything the
/// scenario leaves to chance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    pub seed: u64,
    pub brokers: u64,
    pub topics: Vec<TopicSpec>,
    /// Idempotent producers, each on its own client host.
    pub producers: u32,
    /// Whether the producers are batching producers (several batches in
    /// flight per partition, records acknowledged one by one) instead of
    /// sending one batch at a time.
    pub batching_producers: bool,
    /// Batches each producer sends, one at a time.
    pub batches_per_producer: u32,
    pub batch_records_max: u32,
    /// Pause between a producer's batches.
    pub produce_interval_ms: u64,
    /// Members of the one consumer group, each on its own client host.
    pub consumers: u32,
    pub session_timeout_ms: u64,
    /// Every so many acks a member also sends a hostile one (an offset
    /// before its position or past the high watermark), which must be
    /// refused.
    pub hostile_ack_every: u32,
    /// A member acknowledges after every so many polls (what it polled
    /// since its last acks).
    pub ack_every_polls: u32,
    /// Fault kinds this seed enables.
    pub faults: Vec<FaultKind>,
    /// Every broker snapshots each Raft group every so many entries and
    /// purges the log behind the snapshot, so snapshots are built, purged
    /// and installed on replicas that fell behind; `None`: keel's default
    /// (5,000 entries, never reached in a run).
    pub snapshot_every: Option<u64>,
    /// Most faults injected over the run, all lanes together (`None`: as
    /// many as the lanes draw). Seeds never set it; the shrinker does.
    #[serde(default)]
    pub max_faults: Option<u64>,
    /// An operator changes the cluster under load: a spare broker joins,
    /// partitions move, brokers are drained, removed and shut down for good.
    #[serde(default)]
    pub membership: bool,
    /// An operator deletes topics in use and creates them again under the
    /// same name (also while brokers are down), once a run.
    #[serde(default)]
    pub topic_lifecycle: bool,
    /// A hostile client forges acks and polls (as a non-member, with a
    /// member's id but not its epoch, with a future generation) and sends
    /// malformed produces; each must be refused and change nothing.
    #[serde(default)]
    pub hostile_clients: bool,
    /// Every topic keeps at most this many bytes per partition: partition
    /// leaders apply retention (checked every second), the log start moves
    /// under producers and consumers, and log entries are deleted. Records
    /// it removes need neither survive nor be consumed.
    #[serde(default)]
    pub retention_bytes: Option<u64>,
    /// Brokers authorise every request (`--authorize`): the workload runs
    /// as a user whose rules grant what it does, and (with hostile clients)
    /// an intruder with a rule to describe topics only, an anonymous caller
    /// and a caller with a wrong secret try what they may not; each must be
    /// refused and change nothing.
    #[serde(default)]
    pub access_control: bool,
    /// Replication factors 1 to 5, sometimes a wide topic, the assignors,
    /// a second group, poll byte budgets and a reader (`None`: the shape
    /// seeds had before this lane).
    #[serde(default)]
    pub shape: Option<Shape>,
    /// Every topic also keeps records for at most this long (by the
    /// partition leader's clock and the records' append times, which the
    /// clock lanes skew and step by hours): the log start moves by age.
    /// Records it removes need neither survive nor be consumed.
    #[serde(default)]
    pub retention_ms: Option<u64>,
    /// One member of the group `g` falls far behind through the safety
    /// phase: it takes few records per poll and processes them slowly
    /// (while staying in its session), so retention passes its position
    /// and the others' progress does not hide its lag; it catches up once
    /// the faults heal.
    #[serde(default)]
    pub slow_consumer: Option<SlowConsumer>,
    /// Every fsync of a broker's storage takes simulated time, and some
    /// stall for tens or hundreds of milliseconds: appends gather while a
    /// sync runs (group commit, as on a real disk), a leader's own flush
    /// can finish after its followers' acknowledgements, and a stalled
    /// disk holds up a broker's Raft groups (`None`: syncs take no time,
    /// as seeds had before this lane).
    #[serde(default)]
    pub disk_latency: Option<DiskLatency>,
    /// Brokers send partition groups' Raft calls to a peer in a batch as
    /// soon as one call is in flight to it, not only beyond four (the
    /// simulation's clusters seldom have four in flight): the batched
    /// transport carries most calls.
    #[serde(default)]
    pub eager_batching: bool,
    /// Mean time between faults of one lane (node, network, clock, client).
    pub fault_interval_ms: u64,
    /// How long a fault lasts before it heals.
    pub fault_duration_ms: (u64, u64),
    /// Length of the safety phase (workload under faults).
    pub safety_ms: u64,
    /// Bound of the liveness phase: faults healed, every acknowledged
    /// record must be consumed and the group settled within it (L1).
    pub liveness_ms: u64,
}

impl Scenario {
    /// The scenario of `seed`. `all_faults` enables every fault kind
    /// instead of a swarm-drawn subset.
    pub fn from_seed(seed: u64, all_faults: bool) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed);
        let brokers = rng.gen_range(3..=5);
        let topic_count = rng.gen_range(1..=2);
        let topics = (0..topic_count)
            .map(|t| TopicSpec { name: format!("t{t}"), partitions: rng.gen_range(1..=3), replication_factor: 3 })
            .collect();
        // Swarm testing: each kind is on with probability one half, and at
        // least one is on.
        let first = &FaultKind::ALL[..FaultKind::FIRST_DRAWN];
        let mut faults: Vec<FaultKind> = first.iter().copied().filter(|_| all_faults || rng.gen_bool(0.5)).collect();
        if faults.is_empty() {
            faults.push(first[rng.gen_range(0..first.len())]);
        }
        Scenario {
            seed,
            brokers,
            topics,
            producers: rng.gen_range(1..=3),
            batches_per_producer: rng.gen_range(15..=40),
            batch_records_max: rng.gen_range(1..=4),
            produce_interval_ms: rng.gen_range(50..=300),
            consumers: rng.gen_range(2..=3),
            session_timeout_ms: rng.gen_range(2_000..=4_000),
            hostile_ack_every: rng.gen_range(5..=20),
            ack_every_polls: rng.gen_range(1..=3),
            faults,
            fault_interval_ms: rng.gen_range(1_000..=3_000),
            fault_duration_ms: (500, rng.gen_range(1_500..=5_000)),
            safety_ms: 20_000,
            liveness_ms: 60_000,
            // Drawn last, so that every earlier choice of a seed is what it
            // was before these lanes existed.
            batching_producers: false,
            snapshot_every: None,
            max_faults: None,
            membership: false,
            topic_lifecycle: false,
            hostile_clients: false,
            retention_bytes: None,
            access_control: false,
            shape: None,
            retention_ms: None,
            slow_consumer: None,
            disk_latency: None,
            eager_batching: false,
        }
        .with_later_lanes(&mut rng, all_faults)
    }

    /// The lanes added after seeds were first recorded, each drawn after
    /// everything before it (in the order they were added).
    fn with_later_lanes(mut self, rng: &mut StdRng, all_faults: bool) -> Scenario {
        self.batching_producers = rng.gen_bool(0.5);
        if all_faults || rng.gen_bool(0.5) {
            self.snapshot_every = Some(rng.gen_range(5..=40));
        }
        for kind in &FaultKind::ALL[FaultKind::FIRST_DRAWN..FaultKind::SECOND_DRAWN] {
            if all_faults || rng.gen_bool(0.5) {
                self.faults.push(*kind);
            }
        }
        self.faults.sort();
        self.membership = all_faults || rng.gen_bool(0.5);
        self.topic_lifecycle = all_faults || rng.gen_bool(0.5);
        self.hostile_clients = all_faults || rng.gen_bool(0.5);
        if rng.gen_bool(0.5) {
            self.retention_bytes = Some(rng.gen_range(40..=200));
        }
        for kind in &FaultKind::ALL[FaultKind::SECOND_DRAWN..FaultKind::THIRD_DRAWN] {
            if all_faults || rng.gen_bool(0.5) {
                self.faults.push(*kind);
            }
        }
        self.faults.sort();
        self.access_control = all_faults || rng.gen_bool(0.5);
        if all_faults || rng.gen_bool(0.5) {
            self.shape = Some(self.draw_shape(rng));
        }
        for kind in &FaultKind::ALL[FaultKind::THIRD_DRAWN..FaultKind::FOURTH_DRAWN] {
            if all_faults || rng.gen_bool(0.5) {
                self.faults.push(*kind);
            }
        }
        self.faults.sort();
        // Like byte retention, on for half the seeds even with every fault:
        // what it removes is exempt from the consumption checks.
        if rng.gen_bool(0.5) {
            self.retention_ms = Some(rng.gen_range(RETENTION_MS_MIN..=RETENTION_MS_MAX));
        }
        if all_faults || rng.gen_bool(0.5) {
            // Well inside the session, so the slow member stays a member.
            let pause_ms = rng.gen_range(300..=self.session_timeout_ms / 2);
            self.slow_consumer = Some(SlowConsumer { pause_ms, records_per_poll: rng.gen_range(1..=3) });
        }
        for kind in &FaultKind::ALL[FaultKind::FOURTH_DRAWN..FaultKind::FIFTH_DRAWN] {
            if all_faults || rng.gen_bool(0.5) {
                self.faults.push(*kind);
            }
        }
        self.faults.sort();
        if all_faults || rng.gen_bool(0.5) {
            let fastest = rng.gen_range(20..=200);
            self.disk_latency = Some(DiskLatency {
                sync_us: (fastest, rng.gen_range(fastest..=5_000)),
                stall_one_in: rng.gen_range(50..=500),
                stall_ms: (20, rng.gen_range(50..=2_000)),
            });
        }
        self.eager_batching = all_faults || rng.gen_bool(0.5);
        for kind in &FaultKind::ALL[FaultKind::FIFTH_DRAWN..] {
            if all_faults || rng.gen_bool(0.5) {
                self.faults.push(*kind);
            }
        }
        self.faults.sort();
        self
    }

    /// Replication factors, a wide topic, groups and budgets (changes the
    /// topics it draws for).
    fn draw_shape(&mut self, rng: &mut StdRng) -> Shape {
        for topic in &mut self.topics {
            topic.replication_factor = rng.gen_range(1..=self.brokers.min(5)) as u32;
        }
        // Many partitions: one Raft group each on every replica.
        if rng.gen_bool(0.125) {
            self.topics[0].partitions = rng.gen_range(12..=WIDE_TOPIC_PARTITIONS_MAX);
        }
        let pick = |rng: &mut StdRng| AssignorChoice::ALL[rng.gen_range(0..AssignorChoice::ALL.len())];
        let assignor = pick(rng);
        let second_group = rng.gen_bool(0.5).then(|| {
            let last = &self.topics[self.topics.len() - 1];
            GroupSpec {
                name: "g2".into(),
                topics: vec![last.name.clone()],
                assignor: pick(rng),
                members: rng.gen_range(1..=2),
            }
        });
        Shape {
            assignor,
            second_group,
            poll_bytes_max: if rng.gen_bool(0.5) { rng.gen_range(16..=256) } else { 0 },
            reader: rng.gen_bool(0.5),
        }
    }

    /// The pause between a producer's batches: the drawn interval, or
    /// longer, so that writes go on through most of the safety phase while
    /// faults come and go (the drawn interval alone ended most producers'
    /// writes within seconds: a fifth of all-fault seeds had no
    /// acknowledged record left to check once a topic was deleted).
    pub fn produce_pace_ms(&self) -> u64 {
        let spread = self.safety_ms * 3 / 4 / u64::from(self.batches_per_producer.max(1));
        self.produce_interval_ms.max(spread)
    }

    pub fn enables(&self, kind: FaultKind) -> bool {
        self.faults.contains(&kind)
    }

    /// Make sure `kinds` are on (negative controls need their trigger).
    pub fn enable(&mut self, kinds: &[FaultKind]) {
        for kind in kinds {
            if !self.faults.contains(kind) {
                self.faults.push(*kind);
            }
        }
        self.faults.sort();
    }

    /// One line per choice, printed at the start of a run.
    pub fn describe(&self) -> String {
        let topics: Vec<String> =
            self.topics.iter().map(|t| format!("{}({}p, rf {})", t.name, t.partitions, t.replication_factor)).collect();
        let faults: Vec<&str> = self.faults.iter().map(|f| f.name()).collect();
        format!(
            "seed {seed}: {brokers} brokers; topics {topics}; {producers} producers x {batches} batches of 1-{records} \
             records every {interval} ms{batching}; {consumers} consumers (session {session} ms, acks every {ack_every} polls, \
             hostile ack every {hostile}); \
             faults [{faults}] every ~{fault_interval} ms lasting {d0}-{d1} ms{max_faults}; snapshots {snapshots};{membership}{hostile_client}{retention}{slow}{access} \
             {shape}safety {safety} ms, liveness bound {liveness} ms",
            seed = self.seed,
            brokers = self.brokers,
            topics = topics.join(", "),
            producers = self.producers,
            batches = self.batches_per_producer,
            records = self.batch_records_max,
            interval = self.produce_pace_ms(),
            batching = if self.batching_producers { " (batching, several in flight)" } else { "" },
            consumers = self.consumers,
            session = self.session_timeout_ms,
            hostile = self.hostile_ack_every,
            ack_every = self.ack_every_polls,
            faults = faults.join(", "),
            fault_interval = self.fault_interval_ms,
            d0 = self.fault_duration_ms.0,
            d1 = self.fault_duration_ms.1,
            membership = match (self.membership, self.topic_lifecycle) {
                (true, true) => " a broker joins, partitions move, brokers are removed, topics are deleted and re-created;",
                (true, false) => " a broker joins, partitions move, brokers are removed;",
                (false, true) => " topics are deleted and re-created;",
                (false, false) => "",
            },
            hostile_client = if self.hostile_clients { " a hostile client forges acks, polls and produces;" } else { "" },
            access = if self.access_control { " requests are authorised against access rules;" } else { "" },
            retention = match (self.retention_bytes, self.retention_ms) {
                (Some(b), Some(ms)) => format!(" retention keeps {b} bytes per partition and {ms} ms of records;"),
                (Some(b), None) => format!(" retention keeps {b} bytes per partition;"),
                (None, Some(ms)) => format!(" retention keeps {ms} ms of records;"),
                (None, None) => String::new(),
            },
            slow = self.slow_consumer.as_ref().map_or_else(String::new, |slow| format!(
                " member c0 of g falls behind (at most {} records per poll, {} ms on each);",
                slow.records_per_poll, slow.pause_ms
            )) + &self.disk_latency.map_or_else(String::new, |disk| format!(
                " fsyncs take {}-{} us, one in {} stalls {}-{} ms;",
                disk.sync_us.0, disk.sync_us.1, disk.stall_one_in, disk.stall_ms.0, disk.stall_ms.1
            )) + if self.eager_batching { " Raft calls go in batches eagerly;" } else { "" },
            max_faults = self.max_faults.map_or_else(String::new, |n| format!(", at most {n}")),
            snapshots = match self.snapshot_every {
                Some(n) => format!("every {n} entries"),
                None => "default".to_string(),
            },
            shape = self.shape.as_ref().map_or_else(String::new, Shape::describe),
            safety = self.safety_ms,
            liveness = self.liveness_ms,
        )
    }
}
