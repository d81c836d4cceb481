//! [`Shards`]: a map by name whose copy shares everything with the original until
//! changed, what lets a delta make a new route table in O(change).

use std::collections::HashMap;
use std::sync::Arc;

/// One shard: its entries by name.
type Shard<V> = Arc<HashMap<Arc<str>, V>>;

/// Number of shards of a [`Shards`] map.
const SHARDS: usize = 256;

/// A map by name whose copy shares everything with the original until changed, and
/// then copies only the shard (1/256 of the entries) a change touches: what lets a delta
/// make a new table in O(change) while requests in flight keep the old one.
#[derive(Debug, Clone)]
pub(crate) struct Shards<V> {
    shards: Arc<Vec<Shard<V>>>,
    len: usize,
}

impl<V: Clone> Default for Shards<V> {
    fn default() -> Self {
        Shards {
            shards: Arc::new((0..SHARDS).map(|_| Arc::default()).collect()),
            len: 0,
        }
    }
}

impl<V: Clone> Shards<V> {
    /// The shard of `key` (FNV-1a; the maps inside use the standard keyed hasher).
    fn shard(key: &str) -> usize {
        let mut h: u32 = 0x811c_9dc5;
        for b in key.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        h as usize % SHARDS
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no entries.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The map's own copy of `key`, to share.
    pub(crate) fn key_of(&self, key: &str) -> Option<Arc<str>> {
        self.shards[Self::shard(key)]
            .get_key_value(key)
            .map(|(k, _)| k.clone())
    }

    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.shards[Self::shard(key)].get(key)
    }

    fn shard_mut(&mut self, key: &str) -> &mut HashMap<Arc<str>, V> {
        Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[Self::shard(key)])
    }

    /// Sets the entry of `key`. The key is an [`Arc`] so that the value can share the
    /// name instead of holding a copy of it (a route its host, a backend its name).
    pub(crate) fn insert(&mut self, key: Arc<str>, value: V) -> Option<V> {
        let old = self.shard_mut(&key).insert(key, value);
        self.len += usize::from(old.is_none());
        old
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        let old = self.shard_mut(key).remove(key);
        self.len -= usize::from(old.is_some());
        old
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.shards.iter().flat_map(|s| s.values())
    }
}
