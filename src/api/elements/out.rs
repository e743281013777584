//! Element vectors in answers.

use super::{base64_json_string, field_dtype, Encoding};
use crate::api::bulk;
use crate::ops::zk::{Field, FieldVec};
use bytes::Bytes;
use serde::{Serialize, Serializer};

/// A result vector written in the request's encoding, streamed without building strings.
pub struct ElementsOut {
    pub values: FieldVec,
    pub encoding: Encoding,
}

impl ElementsOut {
    /// An upper bound of the serialised length, to size the answer's buffer up front.
    pub fn json_size_hint(&self) -> usize {
        let n = self.values.len();
        match self.encoding {
            Encoding::Base64 => self.values.byte_len().div_ceil(3) * 4 + 2,
            // Quotes and a comma around each value's digits (0x and 64 hex digits at most).
            _ => {
                2 + n * match self.values.field() {
                    Field::BabyBear => 3 + 10,
                    Field::Goldilocks => 3 + 20,
                    Field::Bn254Fr | Field::Bls12_381Fr => 3 + 78,
                }
            }
        }
    }

    /// Calls `f` with each value's text in the decimal or hex encoding: small fields'
    /// decimal digits straight from the word (itoa), everything else through one reused
    /// string. Shared by `write_json` and `Serialize`, so both write the same text.
    fn try_for_each_text<E>(&self, mut f: impl FnMut(&str) -> Result<(), E>) -> Result<(), E> {
        let mut digits = itoa::Buffer::new();
        match (&self.values, self.encoding) {
            (FieldVec::Goldilocks(v), Encoding::Decimal) => {
                v.iter().try_for_each(|&x| f(digits.format(x)))
            }
            (FieldVec::BabyBear(v), Encoding::Decimal) => {
                v.iter().try_for_each(|&x| f(digits.format(x)))
            }
            (values, encoding) => {
                let mut text = String::with_capacity(80);
                (0..values.len()).try_for_each(|i| {
                    text.clear();
                    match encoding {
                        Encoding::Hex => values.get(i).write_hex(&mut text),
                        _ => values.get(i).write_decimal(&mut text),
                    }
                    f(&text)
                })
            }
        }
    }

    /// Appends what `Serialize` writes, without serde: digits, hex and base64 need no
    /// escaping, which serde's string writer checks byte by byte (a large answer's
    /// costliest part).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        if self.encoding == Encoding::Base64 {
            out.push(b'"');
            base64_simd::STANDARD.encode_append(self.values.le_bytes(), out);
            out.push(b'"');
            return;
        }
        out.push(b'[');
        let mut first = true;
        let Ok(()) = self.try_for_each_text(|text| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
            Ok::<(), std::convert::Infallible>(())
        });
        out.push(b']');
    }
}

impl Serialize for ElementsOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        if bulk::answering() {
            let bytes = Bytes::copy_from_slice(&self.values.le_bytes());
            let shape = vec![self.values.len() as u64];
            let dtype = field_dtype(self.values.field());
            return bulk::push_answer_buffer(dtype, shape, bytes).serialize(s);
        }
        if self.encoding == Encoding::Base64 {
            return base64_json_string(&self.values.le_bytes()).serialize(s);
        }
        let mut seq = s.serialize_seq(Some(self.values.len()))?;
        self.try_for_each_text(|text| seq.serialize_element(text))?;
        seq.end()
    }
}
