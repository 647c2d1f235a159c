//! Settled reports gathered into one metadata entry (issue #12).
//!
//! Every partition's leader reports once that its group started, and again
//! after each move, that the group's membership matches its placement
//! (`MoveSettled`). At 10,000 partitions one entry per report was 10,000
//! entries, each rewriting the topic's row (every placement) on every
//! broker: apply fell minutes behind, reports timed out, were sent again
//! and proposed again (31,000 to 34,000 entries for one topic).
//!
//! Here the metadata leader queues the reports it accepts, by topic, and
//! one driver at a time proposes everything queued for a topic (at most
//! [`SETTLED_REPORTS_MAX`] partitions) as one `MovesSettled`, then answers
//! each report from that entry's outcome. While one entry commits, the next
//! reports gather. A report already queued (the same partition and epoch)
//! waits for the same entry instead of adding another.
//!
//! The queue is bounded by the partitions in the cluster: a partition's
//! leader keeps at most one report in flight (`membership_changes`).

use std::collections::BTreeMap;

use keel_core::metadata::{MetadataCommand, MetadataOutcome, SETTLED_REPORTS_MAX};
use keel_core::PartitionIndex;
use tokio::sync::oneshot;

use super::Node;
use crate::group::GroupId;
use crate::raft::network::{JoinRefusal, MoveSettledReport};
use crate::raft::types::{Command, Response};

type Answer = oneshot::Sender<Result<(), JoinRefusal>>;
/// A topic by name and incarnation (its id).
type Topic = (String, u64);
/// One topic's queued reports: by (partition, epoch), each with every
/// caller waiting on it.
type Reports = BTreeMap<(u32, u64), Vec<Answer>>;

/// Reports waiting for an entry, by topic.
#[derive(Default)]
pub(super) struct Settling {
    queue: BTreeMap<Topic, Reports>,
    /// Whether a driver is running (at most one).
    driving: bool,
}

impl Node {
    /// On the metadata leader: queue a report for the next `MovesSettled`
    /// entry of its topic, and wait for that entry's outcome.
    pub(super) async fn settle_gathered(&self, report: MoveSettledReport) -> Result<(), JoinRefusal> {
        let (answer, outcome) = oneshot::channel();
        let start_driver = {
            let mut settling = self.inner.settling.lock().expect("settling");
            settling
                .queue
                .entry((report.topic, report.topic_id))
                .or_default()
                .entry((report.partition, report.epoch))
                .or_default()
                .push(answer);
            !std::mem::replace(&mut settling.driving, true)
        };
        if start_driver {
            let node = self.clone();
            self.spawn(async move { node.drive_settling().await });
        }
        outcome.await.unwrap_or_else(|_| Err(JoinRefusal::Retry("the broker is stopping".into())))
    }

    /// Propose what is queued, a topic's worth (bounded) per entry, until
    /// the queue is empty.
    async fn drive_settling(&self) {
        loop {
            let Some(((topic, topic_id), reports)) = self.next_settled_batch() else { return };
            let partitions = reports.keys().map(|(partition, epoch)| (PartitionIndex(*partition), *epoch)).collect();
            let command = MetadataCommand::MovesSettled { topic: topic.clone(), topic_id, partitions };
            let answer_all = |reports: Reports, result: Result<(), JoinRefusal>| {
                for answer in reports.into_values().flatten() {
                    let _gone = answer.send(result.clone());
                }
            };
            match self.propose(&GroupId::Metadata, Command::Metadata(command)).await {
                Ok(Response::Metadata(Ok(MetadataOutcome::MovesSettled { stale, .. }))) => {
                    for ((partition, epoch), answers) in reports {
                        let result = if stale.contains(&PartitionIndex(partition)) {
                            Err(JoinRefusal::Refused(format!(
                                "the report on {topic}/{partition} (epoch {epoch}) is stale"
                            )))
                        } else {
                            Ok(())
                        };
                        for answer in answers {
                            let _gone = answer.send(result.clone());
                        }
                    }
                }
                Ok(Response::Metadata(Err(rejection))) => {
                    answer_all(reports, Err(JoinRefusal::Refused(rejection.to_string())))
                }
                Ok(other) => {
                    answer_all(reports, Err(JoinRefusal::Refused(format!("the metadata group answered {other:?}"))))
                }
                Err(error) => answer_all(reports, Err(JoinRefusal::Retry(error.to_string()))),
            }
        }
    }

    /// Take the first queued topic's reports (at most
    /// [`SETTLED_REPORTS_MAX`]), or stop driving if none are queued.
    fn next_settled_batch(&self) -> Option<(Topic, Reports)> {
        let mut settling = self.inner.settling.lock().expect("settling");
        let Some((topic, mut reports)) = settling.queue.pop_first() else {
            settling.driving = false;
            return None;
        };
        if reports.len() > SETTLED_REPORTS_MAX {
            let (&split, _) = reports.iter().nth(SETTLED_REPORTS_MAX).expect("more than the bound");
            let rest = reports.split_off(&split);
            settling.queue.insert(topic.clone(), rest);
        }
        Some((topic, reports))
    }
}
