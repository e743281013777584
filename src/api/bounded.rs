//! Request lists with a documented most-items, held to it while they are read. A list
//! of strings or sub-vectors costs a header per item (24 bytes for a `String`, more for
//! an element vector) whatever the item's JSON, so a body of `"",` would otherwise become
//! eight times its size before any length check. The first N + 1 items are kept and the
//! rest read and dropped: one past the limit is enough for the handler's own check to
//! refuse the list with its usual problem.

use serde::de::{Deserialize, Deserializer, IgnoredAny, SeqAccess, Visitor};
use std::marker::PhantomData;
use std::ops::Deref;

/// A JSON array of which at most `N + 1` items are kept (see the module comment).
#[derive(Debug)]
pub struct AtMost<T, const N: usize>(Vec<T>);

impl<T, const N: usize> AtMost<T, N> {
    pub fn into_vec(self) -> Vec<T> {
        self.0
    }
}

impl<T, const N: usize> Deref for AtMost<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for AtMost<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Items<T, N> {
            type Value = AtMost<T, N>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an array of at most {N} items")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(N + 1));
                while items.len() <= N {
                    match seq.next_element()? {
                        Some(item) => items.push(item),
                        None => return Ok(AtMost(items)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(AtMost(items))
            }
        }
        d.deserialize_seq(Items(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_one_item_past_the_limit_and_reads_the_rest() {
        let list: AtMost<String, 2> = serde_json::from_str(r#"["a", "b"]"#).unwrap();
        assert_eq!(&*list, ["a", "b"]);
        let list: AtMost<String, 2> =
            serde_json::from_str(r#"["a", "b", "c", "d", {"e": [1]}]"#).unwrap();
        assert_eq!(
            &*list,
            ["a", "b", "c"],
            "one past the limit, the rest dropped"
        );
        assert!(serde_json::from_str::<AtMost<String, 2>>(r#"["a", 1]"#).is_err());
    }
}
