//! Settled reports gathered into one metadata entry (issue #12).
//!
//! Every partition's leader reports once that its group started, and again
//! after each move, that the group's membership matches its placement
//! (`MoveSettled`). At 10,000 partitions one entry per report was 10,000
//! entries, each rewriting the topic's row (every placement) on every
//! broker: apply fell minutes behind, reports timed out, were sent again
//! and proposed again (31,000 to 34,000 entries for one topic).
//!
//! Here the metadata leader queues the reports it accepts, by topic. Each
//! topic has at most one driver, which proposes everything queued for it
//! (at most [`SETTLED_REPORTS_MAX`] partitions) as one `MovesSettled`, then
//! answers each report by the metadata as applied. While one entry
//! commits, the topic's next reports gather; topics do not wait for each
//! other. A report already queued (the same partition and epoch) waits for
//! the same entry instead of adding another.
//!
//! The queue is bounded by the partitions in the cluster: a partition's
//! leader keeps at most one report in flight (`membership_changes`), and a
//! caller that gave up (its call timed out) is dropped from the queue when
//! the same report comes again.

use std::collections::{BTreeMap, BTreeSet};

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
    /// Topics with a driver running (at most one each).
    driving: BTreeSet<Topic>,
}

impl Node {
    /// On the metadata leader: queue a report for the next `MovesSettled`
    /// entry of its topic, and wait for that entry's outcome.
    pub(super) async fn settle_gathered(&self, report: MoveSettledReport) -> Result<(), JoinRefusal> {
        let (answer, outcome) = oneshot::channel();
        let topic = (report.topic, report.topic_id);
        let start_driver = {
            let mut settling = self.inner.settling.lock().expect("settling");
            let waiting =
                settling.queue.entry(topic.clone()).or_default().entry((report.partition, report.epoch)).or_default();
            waiting.retain(|earlier| !earlier.is_closed());
            waiting.push(answer);
            settling.driving.insert(topic.clone())
        };
        if start_driver {
            let node = self.clone();
            self.spawn(async move { node.drive_settling(topic).await });
        }
        outcome.await.unwrap_or_else(|_| Err(JoinRefusal::Retry("the broker is stopping".into())))
    }

    /// Propose what is queued for `topic`, at most
    /// [`SETTLED_REPORTS_MAX`] partitions per entry, until none is.
    async fn drive_settling(&self, topic: Topic) {
        loop {
            let Some(reports) = self.next_settled_batch(&topic) else { return };
            let (topic, topic_id) = topic.clone();
            let partitions = reports.keys().map(|(partition, epoch)| (PartitionIndex(*partition), *epoch)).collect();
            let command = MetadataCommand::MovesSettled { topic: topic.clone(), topic_id, partitions };
            let answer_all = |reports: Reports, result: Result<(), JoinRefusal>| {
                for answer in reports.into_values().flatten() {
                    let _gone = answer.send(result.clone());
                }
            };
            match self.propose(&GroupId::Metadata, Command::Metadata(command)).await {
                Ok(Response::Metadata(Ok(MetadataOutcome::MovesSettled { .. }))) => {
                    // Answered by the metadata as applied here, per epoch:
                    // one entry may carry a partition under two epochs.
                    let metadata = self.metadata();
                    let info = keel_core::TopicName::new(&topic).ok().and_then(|name| metadata.topic(&name).cloned());
                    for ((partition, epoch), answers) in reports {
                        let settled = info.as_ref().filter(|t| t.id == topic_id).is_some_and(|t| {
                            t.partitions.get(partition as usize).is_some_and(|p| p.epoch == epoch && p.started)
                        });
                        let result = if !settled {
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

    /// Take `topic`'s queued reports (at most [`SETTLED_REPORTS_MAX`]), or
    /// stop driving it if none are queued.
    fn next_settled_batch(&self, topic: &Topic) -> Option<Reports> {
        let mut settling = self.inner.settling.lock().expect("settling");
        let Some(mut reports) = settling.queue.remove(topic) else {
            settling.driving.remove(topic);
            return None;
        };
        if reports.len() > SETTLED_REPORTS_MAX {
            let (&split, _) = reports.iter().nth(SETTLED_REPORTS_MAX).expect("more than the bound");
            let rest = reports.split_off(&split);
            settling.queue.insert(topic.clone(), rest);
        }
        Some(reports)
    }
}
