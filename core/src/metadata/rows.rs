//! [`Rows`]: the metadata's brokers, topics or groups, a persistent ordered
//! map that also remembers which keys changed.
//!
//! Two needs of a large cluster meet here. Readers hold the state behind an
//! `Arc` while apply changes it, so apply copies it: a persistent map makes
//! that copy O(1) and a change O(log n), where a `BTreeMap` copied every
//! topic and group. And the store writes one row per broker, topic and
//! group: every mutable access goes through a method that records its key,
//! so what apply changed is known without comparing states, and no change
//! can skip being written.

use std::collections::BTreeSet;
use std::fmt;

use rpds::RedBlackTreeMapSync;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An ordered map whose copies share structure, with the keys changed since
/// the last [`Rows::take_changed`].
#[derive(Clone)]
pub struct Rows<K: Ord + Clone, V: Clone> {
    map: RedBlackTreeMapSync<K, V>,
    /// Inserted, changed or removed since the last `take_changed`.
    changed: BTreeSet<K>,
}

impl<K: Ord + Clone, V: Clone> Rows<K, V> {
    pub fn new() -> Self {
        Rows { map: RedBlackTreeMapSync::new_sync(), changed: BTreeSet::new() }
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.map.size()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every (key, value), in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.map.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.map.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.map.values()
    }

    /// Insert or replace `key`'s value.
    pub fn insert(&mut self, key: K, value: V) {
        self.changed.insert(key.clone());
        self.map.insert_mut(key, value);
    }

    /// Remove `key`, returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let value = self.map.get(key).cloned()?;
        self.map.remove_mut(key);
        self.changed.insert(key.clone());
        Some(value)
    }

    /// `key`'s value, to change: the key counts as changed.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        if self.map.contains_key(key) {
            self.changed.insert(key.clone());
        }
        self.map.get_mut(key)
    }

    /// The keys changed since the last call, in order (present: inserted or
    /// changed; absent: removed).
    pub fn take_changed(&mut self) -> BTreeSet<K> {
        std::mem::take(&mut self.changed)
    }
}

impl<K: Ord + Clone, V: Clone> Default for Rows<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for Rows<K, V> {
    /// Rows with nothing marked changed (as loaded from a store).
    fn from_iter<I: IntoIterator<Item = (K, V)>>(items: I) -> Self {
        let mut map = RedBlackTreeMapSync::new_sync();
        for (key, value) in items {
            map.insert_mut(key, value);
        }
        Rows { map, changed: BTreeSet::new() }
    }
}

/// `rows[&key]`, as for a `BTreeMap`: panics if the key is absent.
impl<K: Ord + Clone, V: Clone> std::ops::Index<&K> for Rows<K, V> {
    type Output = V;

    fn index(&self, key: &K) -> &V {
        self.map.get(key).expect("no row for this key")
    }
}

/// Equal when the contents are: what changed since the last write is
/// bookkeeping, not state.
impl<K: Ord + Clone, V: Clone + PartialEq> PartialEq for Rows<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.map.size() == other.map.size() && self.map.iter().eq(other.map.iter())
    }
}

impl<K: Ord + Clone, V: Clone + Eq> Eq for Rows<K, V> {}

impl<K: Ord + Clone + fmt::Debug, V: Clone + fmt::Debug> fmt::Debug for Rows<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.map.iter()).finish()
    }
}

/// Encoded as a plain map (as a `BTreeMap` is).
impl<K: Ord + Clone + Serialize, V: Clone + Serialize> Serialize for Rows<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.map.iter())
    }
}

impl<'de, K: Ord + Clone + Deserialize<'de>, V: Clone + Deserialize<'de>> Deserialize<'de> for Rows<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = RedBlackTreeMapSync::<K, V>::deserialize(deserializer)?;
        Ok(Rows { map, changed: BTreeSet::new() })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn every_mutable_access_marks_its_key_and_copies_do_not_see_changes() {
        let mut rows: Rows<u32, String> = [(1, "a".to_string()), (2, "b".to_string())].into_iter().collect();
        assert!(rows.take_changed().is_empty(), "loaded rows are not changes");
        let copy = rows.clone();
        rows.insert(3, "c".into());
        rows.get_mut(&1).unwrap().push('!');
        assert_eq!(rows.remove(&2), Some("b".to_string()));
        assert_eq!(rows.remove(&9), None);
        assert!(rows.get_mut(&8).is_none());
        assert_eq!(rows.take_changed(), BTreeSet::from([1, 2, 3]));
        assert!(rows.take_changed().is_empty());
        assert_eq!(copy.get(&1).map(String::as_str), Some("a"));
        assert_eq!(copy.len(), 2);
        assert_eq!(rows.iter().map(|(k, v)| (*k, v.clone())).collect::<Vec<_>>(), [(1, "a!".into()), (3, "c".into())]);
    }

    #[test]
    fn encodes_as_a_btree_map_does() {
        let items = [(2u32, 20u64), (1, 10), (3, 30)];
        let rows: Rows<u32, u64> = items.into_iter().collect();
        let map: BTreeMap<u32, u64> = items.into_iter().collect();
        let bytes = postcard::to_stdvec(&rows).unwrap();
        assert_eq!(bytes, postcard::to_stdvec(&map).unwrap());
        let back: Rows<u32, u64> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, rows);
    }
}
