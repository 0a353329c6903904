//! A strictly decoded map: the one form in which the lattice types read maps from untrusted
//! bytes (no duplicate key silently dropped, one encoding per map).

use core::fmt;
use core::marker::PhantomData;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A map decoded strictly: keys strictly ascending, so no duplicate key is silently dropped
/// (as serde's `BTreeMap` does: the last one wins) and every map has exactly one encoding.
/// Encoded as a plain serde map, i.e. exactly as the `BTreeMap` it is read into.
pub(crate) struct StrictMap<K, V>(pub(crate) Vec<(K, V)>);

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for StrictMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);

        impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for MapVisitor<K, V> {
            type Value = StrictMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map with strictly ascending keys")
            }

            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // Not pre-sized from the claimed length: it is untrusted input.
                let mut entries: Vec<(K, V)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<K, V>()? {
                    if entries.last().is_some_and(|(prev, _)| *prev >= k) {
                        return Err(de::Error::custom("map keys are not strictly ascending"));
                    }
                    entries.push((k, v));
                }
                Ok(StrictMap(entries))
            }
        }

        d.deserialize_map(MapVisitor(PhantomData))
    }
}
