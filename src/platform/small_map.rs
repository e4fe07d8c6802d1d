//! Sorted-vector maps and sets for the few children of one PostgresCluster.
//!
//! The child index keeps an observation per managed PostgresCluster (its
//! pods, claims, Services, Secrets, budgets): a handful of entries each. A
//! `BTreeMap` allocates a whole node (room for 11 entries) for the first
//! one, so a single `PodInfo` cost ~2 KiB and an observation ~6 KiB — the
//! largest thing the manager kept per PostgresCluster (heaptrack, issue 16).
//! These keep exactly their entries, in key order, with the same methods
//! the callers used.

use std::borrow::Borrow;

/// A map ordered by key, stored as a sorted vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallMap<K, V>(Vec<(K, V)>);

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap(Vec::new())
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.find(key).is_ok()
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                // Room for exactly one more: `Vec` would double (to 4 at
                // the first entry), and the slack was most of what an
                // observation cost (a 200-byte `PodInfo` took 800 bytes;
                // heaptrack, issue 16). The copies this costs are of a few
                // entries.
                self.0.reserve_exact(1);
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let i = self.find(key).ok()?;
        let (_, v) = self.0.remove(i);
        // Nor any after a removal (an emptied observation keeps none).
        self.0.shrink_to_fit();
        Some(v)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.0.retain_mut(|(k, v)| keep(k, v));
        self.0.shrink_to_fit();
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.0.iter_mut().map(|(_, v)| v)
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SmallMap<K, V> {
    /// Later entries replace earlier ones with the same key, as in a
    /// `BTreeMap`.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = SmallMap::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for SmallMap<K, V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

/// Like a `BTreeMap`'s: panics when the key is missing.
impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SmallMap<K, V> {
    type Output = V;
    fn index(&self, key: &Q) -> &V {
        match self.get(key) {
            Some(v) => v,
            None => panic!("no entry for the key in the SmallMap"),
        }
    }
}

impl<'a, K, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<K, V> IntoIterator for SmallMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// A set ordered by value, stored as a sorted vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallSet<T>(SmallMap<T, ()>);

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        SmallSet(SmallMap::default())
    }
}

impl<T: Ord> SmallSet<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether it was not there yet.
    pub fn insert(&mut self, value: T) -> bool {
        self.0.insert(value, ()).is_none()
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.0.remove(value).is_some()
    }

    pub fn contains<Q: Ord + ?Sized>(&self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.0.contains_key(value)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.0.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.0.keys()
    }
}

impl<T: Ord> FromIterator<T> for SmallSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        SmallSet(iter.into_iter().map(|v| (v, ())).collect())
    }
}

impl<T: Ord, const N: usize> From<[T; N]> for SmallSet<T> {
    fn from(values: [T; N]) -> Self {
        values.into_iter().collect()
    }
}

impl<'a, T> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (T, ())>, fn(&'a (T, ())) -> &'a T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.0.iter().map(|(k, _)| k)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn behaves_like_the_btree_collections_it_replaces() {
        let ops: Vec<(bool, u8, u8)> = (0..200u32)
            .map(|i| ((i * 7919) % 3 != 0, ((i * 31) % 17) as u8, i as u8))
            .collect();
        let (mut m, mut b) = (SmallMap::new(), BTreeMap::new());
        let (mut s, mut t) = (SmallSet::new(), BTreeSet::new());
        for (insert, k, v) in ops {
            if insert {
                assert_eq!(m.insert(k, v), b.insert(k, v));
                assert_eq!(s.insert(k), t.insert(k));
            } else {
                assert_eq!(m.remove(&k), b.remove(&k));
                assert_eq!(s.remove(&k), t.remove(&k));
            }
            assert!(m.iter().eq(b.iter()));
            assert!(s.iter().eq(t.iter()));
            assert_eq!(m.get(&k), b.get(&k));
            assert_eq!(s.contains(&k), t.contains(&k));
        }
        m.retain(|k, _| k % 2 == 0);
        b.retain(|k, _| k % 2 == 0);
        assert!(m.iter().eq(b.iter()));
        let names: SmallMap<String, i32> = [
            ("b".to_string(), 1),
            ("a".to_string(), 2),
            ("b".to_string(), 3),
        ]
        .into();
        assert_eq!(names.get("b"), Some(&3));
        assert_eq!(names.keys().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn holds_no_room_beyond_its_entries() {
        let mut m = SmallMap::new();
        for k in 0..5u8 {
            m.insert(k, [0u8; 200]);
            assert_eq!(m.0.capacity(), m.len());
        }
        m.remove(&3);
        assert_eq!(m.0.capacity(), 4);
        m.retain(|k, _| *k < 2);
        assert_eq!(m.0.capacity(), 2);
        m.retain(|_, _| false);
        assert_eq!(m.0.capacity(), 0);
    }
}
