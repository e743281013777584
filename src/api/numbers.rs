//! JSON numbers read straight into flat storage, with the count capped while they are
//! read. A body is charged by what it becomes: `[[0],[0],…]` built as `Vec<Vec<f64>>` took
//! 80 bytes per 4-byte row (a vector header and a heap block each), 20 times the body;
//! read flat it takes the 8 bytes of each number. Past the cap (`--max-tensor-elements`
//! or `--max-elements`, whichever is larger: `extract::BodyLimits`)
//! numbers are only counted, never stored, and the op's own limit refuses the body with
//! the count once it is decoded.

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::Deserializer;
use std::cell::Cell;

thread_local! {
    /// The most numbers one array of the body being parsed on this thread may store.
    static NUMBER_CAP: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Bytes of values the body being parsed on this thread has stored so far.
    static STORED: Cell<u64> = const { Cell::new(0) };
}

/// Runs `parse` with `cap` as this thread's cap on numbers stored per array; returns
/// what it returned and the bytes of numbers and field elements it stored (what the
/// in-flight budget charges besides the body: `body_budget::DecodedCharge`).
pub fn with_number_cap<T>(cap: usize, parse: impl FnOnce() -> T) -> (T, u64) {
    struct Restore(usize, u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            NUMBER_CAP.with(|c| c.set(self.0));
            STORED.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(
        NUMBER_CAP.with(|c| c.replace(cap)),
        STORED.with(|c| c.replace(0)),
    );
    let value = parse();
    (value, STORED.with(Cell::get))
}

/// Counts `bytes` of values stored by the parse running on this thread.
pub(super) fn note_stored(bytes: u64) {
    STORED.with(|c| c.set(c.get().saturating_add(bytes)));
}

pub(super) fn number_cap() -> usize {
    NUMBER_CAP.with(Cell::get)
}

/// Numbers in order, stored up to the cap and counted beyond it.
#[derive(Debug, Default)]
pub struct Counted {
    values: Vec<f64>,
    count: usize,
    cap: usize,
}

impl Counted {
    pub fn new() -> Self {
        Counted {
            values: Vec::new(),
            count: 0,
            cap: number_cap(),
        }
    }

    pub fn push(&mut self, x: f64) {
        self.count += 1;
        if self.count <= self.cap {
            self.values.push(x);
        } else if !self.values.is_empty() {
            // Past the cap the body is refused: its memory goes back now.
            self.values = Vec::new();
        }
    }

    /// Numbers seen, stored or not.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The values, when every number was stored.
    pub fn into_values(self) -> Option<Vec<f64>> {
        (self.count <= self.cap).then_some(self.values)
    }

    /// Drops what is stored (a body found malformed keeps counting, storing nothing).
    fn discard(&mut self) {
        self.values = Vec::new();
        self.cap = 0;
    }

    /// Reads one JSON array of numbers into `self`; its length.
    pub fn read_array<'de, A: SeqAccess<'de>>(&mut self, mut seq: A) -> Result<usize, A::Error> {
        let stored = self.values.len();
        let mut len = 0;
        while seq.next_element_seed(Number(self))?.is_some() {
            len += 1;
        }
        note_stored(8 * self.values.len().saturating_sub(stored) as u64);
        Ok(len)
    }
}

/// One number into `Counted`.
struct Number<'a>(&'a mut Counted);

impl<'de> DeserializeSeed<'de> for Number<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let x = <f64 as serde::Deserialize>::deserialize(d)?;
        self.0.push(x);
        Ok(())
    }
}

/// A matrix as rows of numbers: its values row-major, and the first defect that makes
/// it no matrix (kept, not raised, so it is refused as `invalid_tensor` with its row's
/// path once decoded, as before).
#[derive(Debug)]
pub struct Rows {
    pub numbers: Counted,
    pub rows: usize,
    pub cols: usize,
    pub defect: Option<RowsDefect>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsDefect {
    /// Row `row` has `len` values where row 0 has `cols`.
    Ragged { row: usize, len: usize },
}

/// Reads an array of arrays of numbers.
pub fn read_rows<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Rows, A::Error> {
    let mut rows = Rows {
        numbers: Counted::new(),
        rows: 0,
        cols: 0,
        defect: None,
    };
    while seq.next_element_seed(Row(&mut rows))?.is_some() {}
    Ok(rows)
}

struct Row<'a>(&'a mut Rows);

impl<'de> DeserializeSeed<'de> for Row<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Row<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of numbers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        let rows = self.0;
        let len = rows.numbers.read_array(seq)?;
        if rows.rows == 0 {
            rows.cols = len;
        } else if len != rows.cols && rows.defect.is_none() {
            rows.defect = Some(RowsDefect::Ragged {
                row: rows.rows,
                len,
            });
            rows.numbers.discard();
        }
        rows.rows += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct RowsOf(Rows);

    impl<'de> serde::Deserialize<'de> for RowsOf {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Rows;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("rows")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Rows, A::Error> {
                    read_rows(seq)
                }
            }
            d.deserialize_seq(V).map(RowsOf)
        }
    }

    fn rows(json: &str, cap: usize) -> Rows {
        with_number_cap(cap, || serde_json::from_str::<RowsOf>(json).unwrap().0).0
    }

    #[test]
    fn rows_are_read_flat_and_a_ragged_row_is_named() {
        let r = rows("[[1, 2], [3, 4.5], [5, 6]]", usize::MAX);
        assert_eq!((r.rows, r.cols, r.defect), (3, 2, None));
        assert_eq!(
            r.numbers.into_values().unwrap(),
            [1.0, 2.0, 3.0, 4.5, 5.0, 6.0]
        );
        let r = rows("[[1, 2], [3], [5, 6, 7]]", usize::MAX);
        assert_eq!(r.defect, Some(RowsDefect::Ragged { row: 1, len: 1 }));
        assert_eq!(r.rows, 3);
        assert!(
            r.numbers.into_values().is_none(),
            "nothing kept once ragged"
        );
    }

    #[test]
    fn past_the_cap_numbers_are_counted_not_stored() {
        let r = rows("[[1, 2], [3, 4], [5, 6]]", 4);
        assert_eq!(r.numbers.count(), 6);
        assert!(r.numbers.into_values().is_none());
        let r = rows("[[1, 2], [3, 4]]", 4);
        assert_eq!(r.numbers.into_values().unwrap().len(), 4);
        // The cap is the thread's only while the parse runs.
        assert_eq!(number_cap(), usize::MAX);
    }

    #[test]
    fn the_parse_reports_the_bytes_it_stored() {
        let (r, stored) = with_number_cap(usize::MAX, || {
            serde_json::from_str::<RowsOf>("[[1, 2], [3, 4]]")
                .unwrap()
                .0
        });
        assert_eq!((r.rows, stored), (2, 32));
        // Past the cap what was stored is dropped, so nothing is charged.
        let (_, stored) = with_number_cap(1, || {
            serde_json::from_str::<RowsOf>("[[1, 2], [3, 4]]")
                .unwrap()
                .0
        });
        assert_eq!(stored, 0);
    }

    #[test]
    fn a_flat_array_is_counted_the_same_way() {
        let mut c = with_number_cap(2, Counted::new).0;
        let mut de = serde_json::Deserializer::from_str("[1, 2, 3]");
        struct Seq<'a>(&'a mut Counted);
        impl<'de> Visitor<'de> for Seq<'_> {
            type Value = usize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("numbers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<usize, A::Error> {
                self.0.read_array(seq)
            }
        }
        let len = serde::Deserializer::deserialize_seq(&mut de, Seq(&mut c)).unwrap();
        assert_eq!((len, c.count()), (3, 3));
        assert!(c.into_values().is_none());
    }
}
