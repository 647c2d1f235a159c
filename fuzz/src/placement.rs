//! Placement properties for the `assignors` target: every partition gets
//! `replication_factor` distinct registered brokers, and on a fixed broker
//! set, continuing from any earlier load, replica counts per broker differ
//! by at most one over the new topic and what was placed before it.

use std::collections::{BTreeMap, BTreeSet};

use keel_core::placement::{place_partitions, PlacementLoad};
use keel_core::BrokerId;

pub fn check(data: &[u8]) {
    let [brokers, partitions, replication, earlier, ids @ ..] = data else { return };
    let broker_count = usize::from(brokers % 12);
    // Broker ids: distinct, drawn from the bytes (gaps allowed).
    let brokers: BTreeSet<BrokerId> =
        ids.iter().take(broker_count).map(|b| BrokerId(u64::from(*b) + 1)).collect::<BTreeSet<_>>();
    let partitions = u32::from(*partitions % 40);
    let replication_factor = u32::from(*replication % 6);
    // An earlier topic placed the same way on the same brokers.
    let mut load = PlacementLoad::default();
    let mut counts: BTreeMap<BrokerId, u64> = BTreeMap::new();
    let earlier_partitions = u32::from(*earlier % 20);
    if let Ok(placed) = place_partitions(&brokers, &load, earlier_partitions, replication_factor) {
        for placement in &placed {
            for broker in &placement.replicas {
                *counts.entry(*broker).or_default() += 1;
            }
        }
        load.add(&placed);
    }
    let placed = match place_partitions(&brokers, &load, partitions, replication_factor) {
        Ok(placed) => placed,
        Err(_) => {
            assert!(
                replication_factor == 0 || replication_factor as usize > brokers.len(),
                "placement refused {partitions}x{replication_factor} on {} brokers",
                brokers.len()
            );
            return;
        }
    };
    assert_eq!(placed.len(), partitions as usize);
    for placement in &placed {
        let distinct: BTreeSet<&BrokerId> = placement.replicas.iter().collect();
        assert_eq!(distinct.len(), replication_factor as usize, "replicas not distinct: {placement:?}");
        assert!(placement.replicas.iter().all(|b| brokers.contains(b)), "unknown broker in {placement:?}");
        assert_eq!(placement.epoch, 0);
        for broker in &placement.replicas {
            *counts.entry(*broker).or_default() += 1;
        }
    }
    if !placed.is_empty() {
        let all: Vec<u64> = brokers.iter().map(|b| counts.get(b).copied().unwrap_or(0)).collect();
        let (max, min) = (all.iter().max().copied().unwrap_or(0), all.iter().min().copied().unwrap_or(0));
        assert!(max - min <= 1, "replica counts {counts:?} are uneven on {brokers:?}");
    }
}
