//! Routing: which partition a record goes to.
//!
//! Keyed records go to `fnv1a_64(key) % partition_count`. The hash is
//! 64-bit FNV-1a (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`),
//! chosen because it is tiny, public and has published test vectors, so any
//! client in any language can route exactly as keel does. It is stable: it
//! must never change, or keys would move between partitions.
//!
//! Keyless records are spread round-robin by a [`KeylessSpreader`] that the
//! producer owns; its starting point is an argument (the caller draws it from
//! its seeded RNG), so core stays free of randomness.

use serde::{Deserialize, Serialize};

use crate::id::PartitionIndex;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME))
}

/// Why a record could not be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    #[error("the topic has no partitions: create it with at least one")]
    NoPartitions,
}

/// The partition for a keyed record.
pub fn partition_for_key(key: &[u8], partition_count: u32) -> Result<PartitionIndex, RoutingError> {
    if partition_count == 0 {
        return Err(RoutingError::NoPartitions);
    }
    Ok(PartitionIndex((fnv1a_64(key) % u64::from(partition_count)) as u32))
}

/// Round-robin spreading of keyless records over a topic's partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeylessSpreader {
    next: u64,
}

impl KeylessSpreader {
    /// Start at `start` (a random draw made by the caller, so that many
    /// producers do not all begin on partition 0).
    pub fn new(start: u64) -> Self {
        KeylessSpreader { next: start }
    }

    /// The partition for the next keyless record or batch.
    pub fn next_partition(&mut self, partition_count: u32) -> Result<PartitionIndex, RoutingError> {
        if partition_count == 0 {
            return Err(RoutingError::NoPartitions);
        }
        let chosen = self.next % u64::from(partition_count);
        self.next = self.next.wrapping_add(1);
        Ok(PartitionIndex(chosen as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Published FNV-1a 64 test vectors (from the FNV reference test suite).
    #[test]
    fn fnv1a_64_matches_published_vectors() {
        assert_eq!(fnv1a_64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x85944171f73967e8);
    }

    /// keel's own routing vectors (key, partition count, partition): these
    /// must never change, or keys would move between partitions. A client in
    /// another language can check itself against them.
    #[test]
    fn key_routing_is_stable() {
        let cases: [(&[u8], u32, u32); 7] = [
            (b"", 12, 5),
            (b"a", 7, 5),
            (b"foobar", 1, 0),
            (b"foobar", 100, 68),
            (b"user-42", 6, 3),
            (b"order-1001", 12, 0),
            (b"\x00\xff", 3, 2),
        ];
        for (key, count, expected) in cases {
            assert_eq!(partition_for_key(key, count).unwrap(), PartitionIndex(expected), "key {key:?}");
        }
        assert_eq!(fnv1a_64(b"user-42"), 0x32c6d7a54d35dacb);
    }

    #[test]
    fn zero_partitions_is_an_error() {
        assert_eq!(partition_for_key(b"k", 0), Err(RoutingError::NoPartitions));
        assert_eq!(KeylessSpreader::new(0).next_partition(0), Err(RoutingError::NoPartitions));
    }

    proptest! {
        #[test]
        fn keyed_routing_is_in_range(key in proptest::collection::vec(any::<u8>(), 0..64), count in 1u32..2048) {
            prop_assert!(partition_for_key(&key, count).unwrap().0 < count);
        }

        #[test]
        fn keyless_records_spread_evenly(start in any::<u64>(), count in 1u32..64, rounds in 1u32..20, extra in 0u32..64) {
            let mut spreader = KeylessSpreader::new(start);
            let mut hits = vec![0u32; count as usize];
            for _ in 0..(count * rounds + extra % count) {
                hits[spreader.next_partition(count).unwrap().0 as usize] += 1;
            }
            let max = *hits.iter().max().unwrap();
            let min = *hits.iter().min().unwrap();
            prop_assert!(max - min <= 1, "{hits:?}");
        }
    }
}
