//! Placement: which brokers hold each partition's replicas, and which of
//! them is the preferred leader.
//!
//! Brokers are taken in id order as a ring. Replica slots are dealt round the
//! ring one after another, continuing from the number of replicas already in
//! the cluster: partition `i` of a new topic takes the `replication_factor`
//! consecutive ring positions after the previous partition's. Consecutive
//! slots are distinct brokers (the factor never exceeds the broker count) and
//! deal replicas evenly: on a fixed broker set, replica counts per broker
//! differ by at most one, across topics too. The preferred leader is the
//! replica with the fewest preferred leaderships so far (ties: first in the
//! slot order), which keeps leaders even as well. Pure and deterministic, so
//! it runs inside apply.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::id::BrokerId;

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPlacement {
    /// Distinct brokers holding a replica; the first is the preferred leader.
    pub replicas: Vec<BrokerId>,
    /// How many times the replicas were moved since the topic was created.
    /// Only a partition at epoch 0 may be initialised as a new Raft group;
    /// after a move its group already exists and changes membership instead.
    pub epoch: u64,
    /// Brokers moved off this partition that may still be members (voters
    /// or learners) of its Raft group: a move commits here at once, the
    /// group's membership follows later. Cleared when the partition's
    /// leader reports that its membership is exactly `replicas`
    /// (`MetadataCommand::MoveSettled`). A broker listed here still holds
    /// the partition's data and may not be removed.
    pub leaving: Vec<BrokerId>,
    /// Whether the partition's Raft group has run with this placement's
    /// replicas (its leader reported it, `MetadataCommand::MoveSettled`).
    /// Until then the partition is not moved: a new group is initialised
    /// only by the replicas of its first placement, so a move before any of
    /// them started would leave a group nobody ever initialises.
    #[serde(default)]
    pub started: bool,
}

impl PartitionPlacement {
    /// The broker that should lead this partition when it is healthy.
    pub fn preferred_leader(&self) -> Option<BrokerId> {
        self.replicas.first().copied()
    }
}

/// What is already placed in the cluster, which new placements continue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementLoad {
    /// Replicas already placed, over all topics.
    pub replicas_placed: u64,
    /// Preferred leaderships per broker.
    pub leaders: BTreeMap<BrokerId, u64>,
}

impl PlacementLoad {
    /// Count placements that now exist.
    pub fn add(&mut self, placements: &[PartitionPlacement]) {
        for placement in placements {
            self.replicas_placed += placement.replicas.len() as u64;
            if let Some(leader) = placement.preferred_leader() {
                *self.leaders.entry(leader).or_default() += 1;
            }
        }
    }
}

/// Why a topic could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PlacementError {
    #[error("replication factor must be at least 1")]
    ZeroReplicationFactor,
    #[error(
        "replication factor {replication_factor} exceeds the {brokers} registered brokers: add brokers or lower it"
    )]
    NotEnoughBrokers { replication_factor: u32, brokers: u32 },
}

/// Place `partition_count` partitions with `replication_factor` replicas on
/// `brokers`, continuing from what `load` says is already placed.
pub fn place_partitions(
    brokers: &BTreeSet<BrokerId>,
    load: &PlacementLoad,
    partition_count: u32,
    replication_factor: u32,
) -> Result<Vec<PartitionPlacement>, PlacementError> {
    if replication_factor == 0 {
        return Err(PlacementError::ZeroReplicationFactor);
    }
    let ring: Vec<BrokerId> = brokers.iter().copied().collect();
    let broker_count = ring.len() as u64;
    if u64::from(replication_factor) > broker_count {
        return Err(PlacementError::NotEnoughBrokers { replication_factor, brokers: broker_count as u32 });
    }
    let mut load = load.clone();
    let mut placements = Vec::with_capacity(partition_count as usize);
    for _ in 0..partition_count {
        let start = load.replicas_placed % broker_count;
        let mut replicas: Vec<BrokerId> =
            (0..u64::from(replication_factor)).map(|slot| ring[((start + slot) % broker_count) as usize]).collect();
        let leader_position =
            (0..replicas.len()).min_by_key(|&i| (load.leaders.get(&replicas[i]).copied().unwrap_or(0), i)).unwrap_or(0);
        replicas.swap(0, leader_position);
        let placement = PartitionPlacement { replicas, epoch: 0, leaving: Vec::new(), started: false };
        load.add(std::slice::from_ref(&placement));
        placements.push(placement);
    }
    Ok(placements)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    fn brokers(count: u64) -> BTreeSet<BrokerId> {
        (0..count).map(|b| BrokerId(b * 7 + 1)).collect()
    }

    fn ids(placements: &[PartitionPlacement]) -> Vec<Vec<u64>> {
        placements.iter().map(|p| p.replicas.iter().map(|b| b.0).collect()).collect()
    }

    #[test]
    fn a_small_topic_is_dealt_round_the_ring() {
        let placed = place_partitions(&brokers(3), &PlacementLoad::default(), 4, 2).unwrap();
        assert_eq!(ids(&placed), vec![vec![1, 8], vec![15, 1], vec![8, 15], vec![1, 8]]);
        assert_eq!(placed[1].preferred_leader(), Some(BrokerId(15)));
    }

    #[test]
    fn impossible_placements_are_refused() {
        let empty = PlacementLoad::default();
        assert_eq!(place_partitions(&brokers(3), &empty, 1, 0), Err(PlacementError::ZeroReplicationFactor));
        assert_eq!(
            place_partitions(&brokers(2), &empty, 1, 3),
            Err(PlacementError::NotEnoughBrokers { replication_factor: 3, brokers: 2 })
        );
        assert!(place_partitions(&BTreeSet::new(), &empty, 1, 1).is_err());
    }

    fn spread(counts: &BTreeMap<BrokerId, u64>, brokers: &BTreeSet<BrokerId>) -> u64 {
        let all: Vec<u64> = brokers.iter().map(|b| counts.get(b).copied().unwrap_or(0)).collect();
        all.iter().max().unwrap() - all.iter().min().unwrap()
    }

    proptest! {
        /// Topics with one replication factor on a fixed broker set: replicas
        /// on distinct brokers; replica and leader counts per broker differ
        /// by at most one after every topic.
        #[test]
        fn placement_is_distinct_and_even(
            broker_count in 1u64..9,
            replication_factor in 1u32..6,
            sizes in proptest::collection::vec(1u32..40, 1..6),
        ) {
            let brokers = brokers(broker_count);
            let replication_factor = replication_factor.min(broker_count as u32);
            let mut load = PlacementLoad::default();
            let mut replicas: BTreeMap<BrokerId, u64> = BTreeMap::new();
            for partitions in sizes {
                let placed = place_partitions(&brokers, &load, partitions, replication_factor).unwrap();
                prop_assert_eq!(placed.len(), partitions as usize);
                for placement in &placed {
                    let distinct: BTreeSet<_> = placement.replicas.iter().collect();
                    prop_assert_eq!(distinct.len(), replication_factor as usize);
                    for broker in &placement.replicas {
                        *replicas.entry(*broker).or_default() += 1;
                    }
                }
                load.add(&placed);
                prop_assert!(spread(&replicas, &brokers) <= 1, "replicas {:?}", replicas);
                prop_assert!(spread(&load.leaders, &brokers) <= 1, "leaders {:?}", load.leaders);
            }
        }

        /// Mixed replication factors still deal replicas evenly.
        #[test]
        fn mixed_factors_deal_replicas_evenly(
            broker_count in 1u64..9,
            topics in proptest::collection::vec((1u32..40, 1u32..6), 1..6),
        ) {
            let brokers = brokers(broker_count);
            let mut load = PlacementLoad::default();
            let mut replicas: BTreeMap<BrokerId, u64> = BTreeMap::new();
            for (partitions, factor) in topics {
                let placed = place_partitions(&brokers, &load, partitions, factor.min(broker_count as u32)).unwrap();
                for placement in &placed {
                    for broker in &placement.replicas {
                        *replicas.entry(*broker).or_default() += 1;
                    }
                }
                load.add(&placed);
            }
            prop_assert!(spread(&replicas, &brokers) <= 1, "replicas {:?}", replicas);
        }
    }
}
