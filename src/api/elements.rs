//! Field elements on the wire: a JSON array of decimal or `0x`-hex strings, or one
//! base64 string of little-endian fixed-width values. Strings are parsed while the JSON
//! is read (no allocation per element) and bad ones are collected with their index.

use super::array_operands::{object_operand, ArrayScope, ObjectOperand};
use super::numbers::number_cap;
use super::packed::{base64_json_string, PackedWords};
use super::problem::{ErrorCode, FieldIssue, Problem};
use crate::ops::zk::held::FieldSource;
use crate::ops::zk::{ElementError, Field, FieldVec, U256};
use crate::wire;
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use utoipa::ToSchema;

/// Element errors listed in one problem; the detail gives the total.
const MAX_LISTED_ERRORS: usize = 16;

/// How elements are written in the request, and how the answer is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Array of strings; input may mix decimal and `0x` hex, output is decimal.
    #[default]
    Decimal,
    /// Array of strings; input may mix decimal and `0x` hex, output is `0x` hex.
    Hex,
    /// One base64 string (standard alphabet, padded) of little-endian values:
    /// 32 bytes per bn254_fr element, 8 per goldilocks element.
    Base64,
}

mod docs;
mod out;
pub use docs::{ElementsDoc, ElementsOutDoc};
pub use out::ElementsOut;

/// An element vector as received, before the field is known: strings already parsed,
/// base64 already decoded (a bad one kept, to be refused with its path once decoded).
#[derive(Debug)]
pub enum Elements {
    Strings {
        values: Integers,
        errors: Vec<(usize, String)>,
        error_count: usize,
    },
    Base64 {
        words: Result<PackedWords<u64>, String>,
        /// Bytes the text would decode to, for the size check that comes before any
        /// complaint about the text itself.
        text_bytes: usize,
    },
    /// A buffer of a bulk body (`api::bulk`), whatever `encoding` says: its layout is
    /// checked, its dtype and shape are checked against the field once it is known.
    Buffer {
        dtype: wire::Dtype,
        shape: Vec<u64>,
        bytes: Bytes,
    },
    /// `{"array": id}`: a resident array's elements (`api::array_operands`).
    Array(String),
}

/// The buffer dtype of `field`'s elements: its width, unsigned (docs/WIRE.md).
pub fn field_dtype(field: Field) -> wire::Dtype {
    match field {
        Field::BabyBear => wire::Dtype::U32,
        Field::Goldilocks => wire::Dtype::U64,
        Field::Bn254Fr | Field::Bls12_381Fr => wire::Dtype::U256,
    }
}

/// A buffer of elements (or exponents) of `dtype`: one dimension, the right dtype, at
/// most `max` of them; its bytes.
fn buffer_bytes(
    (dtype, shape, bytes): (wire::Dtype, Vec<u64>, Bytes),
    want: wire::Dtype,
    what: &str,
    path: &str,
    max: usize,
) -> Result<Bytes, Problem> {
    if dtype != want {
        return Err(Problem::at(
            ErrorCode::InvalidRequest,
            format!("{path}/dtype"),
            format!("{what} are {}, not {}", want.name(), dtype.name()),
        ));
    }
    let [n] = shape[..] else {
        return Err(Problem::at(
            ErrorCode::InvalidRequest,
            format!("{path}/shape"),
            format!(
                "a vector has one dimension, [n]; this shape has {}",
                shape.len()
            ),
        ));
    };
    check_count(usize::try_from(n).unwrap_or(usize::MAX), max, path)?;
    Ok(bytes)
}

/// Parsed integers: 64-bit words while every value fits (a Goldilocks vector then *is*
/// these words; BabyBear's are narrowed to u32), 256-bit limbs from the first value that
/// does not (which a 256-bit field's vector then is).
/// Past the parse-time cap (`numbers::with_number_cap`) nothing is kept, only counted:
/// the vector is then refused with its count.
#[derive(Debug)]
pub enum Integers {
    Narrow(Vec<u64>),
    Wide(Vec<[u64; 4]>),
    Counted(usize),
}

impl Integers {
    fn len(&self) -> usize {
        match self {
            Integers::Narrow(v) => v.len(),
            Integers::Wide(v) => v.len(),
            Integers::Counted(n) => *n,
        }
    }

    fn push(&mut self, value: U256) {
        match self {
            Integers::Narrow(v) if value.0[1..] == [0, 0, 0] => v.push(value.0[0]),
            Integers::Narrow(v) => {
                let mut wide = Vec::with_capacity(v.capacity().max(v.len() + 1));
                wide.extend(v.iter().map(|&x| [x, 0, 0, 0]));
                wide.push(value.0);
                *self = Integers::Wide(wide);
            }
            Integers::Wide(v) => v.push(value.0),
            Integers::Counted(n) => *n += 1,
        }
    }

    /// The values; None past the cap (whose count the caller refuses first).
    fn into_u256(self) -> Option<Vec<U256>> {
        match self {
            Integers::Narrow(v) => Some(v.into_iter().map(U256::from_u64).collect()),
            Integers::Wide(v) => Some(v.into_iter().map(U256).collect()),
            Integers::Counted(_) => None,
        }
    }
}

impl Elements {
    /// Plain 256-bit integers (exponents): decimal/hex strings, or base64 of 32-byte
    /// little-endian values. No field check. `path` is the JSON pointer of this vector in
    /// the request.
    pub fn decode_integers(
        self,
        encoding: Encoding,
        path: &str,
        max_elements: usize,
        arrays: &ArrayScope,
    ) -> Result<Vec<U256>, Problem> {
        match (self, encoding) {
            // A resident array of elements of any field: its canonical integers.
            (Elements::Array(id), _) => {
                let v = arrays.any_field_elements(&id, path)?;
                Ok((0..v.len()).map(|i| v.get(i)).collect())
            }
            (
                Elements::Buffer {
                    dtype,
                    shape,
                    bytes,
                },
                _,
            ) => {
                let bytes = buffer_bytes(
                    (dtype, shape, bytes),
                    wire::Dtype::U256,
                    "exponents",
                    path,
                    max_elements,
                )?;
                Ok(bytes
                    .chunks_exact(32)
                    .map(|c| {
                        U256(std::array::from_fn(|i| {
                            u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap())
                        }))
                    })
                    .collect())
            }
            (Elements::Base64 { words, text_bytes }, Encoding::Base64) => {
                check_count(text_bytes / 32, max_elements, path)?;
                let words = words.map_err(|e| invalid_base64(path, &e))?;
                let bytes = words.bytes();
                if bytes.len() % 32 != 0 {
                    return Err(Problem::at(
                        ErrorCode::InvalidFieldElement,
                        path,
                        format!(
                            "{} bytes is not a whole number of 32-byte integers",
                            bytes.len()
                        ),
                    ));
                }
                Ok(bytes
                    .chunks_exact(32)
                    .map(|c| {
                        U256(std::array::from_fn(|i| {
                            u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap())
                        }))
                    })
                    .collect())
            }
            (Elements::Strings { values, errors, .. }, Encoding::Decimal | Encoding::Hex)
                if errors.is_empty() =>
            {
                let n = values.len();
                check_count(n, max_elements, path)?;
                values
                    .into_u256()
                    .ok_or_else(|| too_many_elements(n, max_elements, path))
            }
            // Malformed strings and encoding mismatches: the same answers as for elements.
            (elements, _) => elements
                .decode_inline(Field::Bn254Fr, encoding, path, max_elements)
                .and_then(|_| {
                    Err(Problem::new(
                        ErrorCode::Internal,
                        "exponent decoding fell through",
                    ))
                }),
        }
    }

    /// Validates against `field`: well-formed, canonical, within `max_elements`; or the
    /// elements of the resident array it names, which must be of `field` (checked when
    /// the array was made, so not again). `path` is the JSON pointer of this vector in the
    /// request.
    pub fn decode(
        self,
        field: Field,
        encoding: Encoding,
        path: &str,
        max_elements: usize,
        arrays: &ArrayScope,
    ) -> Result<FieldVec, Problem> {
        match self {
            // A copy: the ops own their operands (and write results over them).
            Elements::Array(id) => Ok(FieldVec::clone(&*arrays.field_elements(&id, field, path)?)),
            data => data.decode_inline(field, encoding, path, max_elements),
        }
    }

    /// As `decode`, for a job that reads operands where they are held
    /// (`ops::zk::held`): a resident array's elements named with their device key, and
    /// a result a device holds left there.
    pub fn decode_source(
        self,
        field: Field,
        encoding: Encoding,
        path: &str,
        max_elements: usize,
        arrays: &ArrayScope,
    ) -> Result<FieldSource, Problem> {
        match self {
            Elements::Array(id) => arrays.field_source(&id, field, path),
            data => Ok(FieldSource::Host {
                values: data.decode_inline(field, encoding, path, max_elements)?,
                key: None,
            }),
        }
    }

    /// The resident array it names, if any.
    pub fn array_id(&self) -> Option<&str> {
        match self {
            Elements::Array(id) => Some(id),
            _ => None,
        }
    }

    /// `decode` of elements the request carries.
    fn decode_inline(
        self,
        field: Field,
        encoding: Encoding,
        path: &str,
        max_elements: usize,
    ) -> Result<FieldVec, Problem> {
        let vec = match (self, encoding) {
            (Elements::Array(_), _) => {
                return Err(Problem::at(
                    ErrorCode::InvalidRequest,
                    format!("{path}/array"),
                    "this operand takes its values in the request, not from a resident array",
                ))
            }
            (Elements::Buffer { dtype, shape, bytes }, _) => {
                let what = format!("{} elements", field.name());
                let bytes = buffer_bytes((dtype, shape, bytes), field_dtype(field), &what, path, max_elements)?;
                FieldVec::from_le_bytes(field, &bytes)
            }
            (Elements::Strings { values, errors, error_count }, Encoding::Decimal | Encoding::Hex) => {
                if !errors.is_empty() {
                    let issues: Vec<FieldIssue> = errors
                        .into_iter()
                        .map(|(i, message)| FieldIssue { path: format!("{path}/{i}"), message })
                        .collect();
                    let detail = format!("{error_count} malformed element(s) in {path}; the first {} are listed", issues.len());
                    return Err(Problem::new(ErrorCode::InvalidFieldElement, detail).with_errors(issues));
                }
                let n = values.len();
                check_count(n, max_elements, path)?;
                match values {
                    Integers::Narrow(v) => FieldVec::from_words(field, v),
                    Integers::Wide(v) => FieldVec::from_limbs(field, v),
                    Integers::Counted(_) => return Err(too_many_elements(n, max_elements, path)),
                }
            }
            (Elements::Base64 { words, text_bytes }, Encoding::Base64) => {
                check_count(text_bytes / field.byte_width(), max_elements, path)?;
                let words = words.map_err(|e| invalid_base64(path, &e))?;
                from_packed(field, words)
            }
            (Elements::Base64 { .. }, _) => {
                return Err(Problem::at(
                    ErrorCode::InvalidRequest,
                    path,
                    "a string is only accepted with \"encoding\": \"base64\"; send an array of strings otherwise",
                ))
            }
            (Elements::Strings { .. }, _) => {
                return Err(Problem::at(ErrorCode::InvalidRequest, path, "with \"encoding\": \"base64\" send one base64 string"))
            }
        };
        vec.map_err(|e| {
            Problem::at(
                ErrorCode::InvalidFieldElement,
                format!("{path}/{}", e.index),
                e.message,
            )
        })
    }

    /// Elements as sent: the strings, or the bytes the base64 text would decode to.
    pub fn approx_len(&self) -> usize {
        match self {
            Elements::Strings { values, .. } => values.len(),
            Elements::Base64 { text_bytes, .. } => *text_bytes,
            Elements::Buffer { bytes, .. } => bytes.len(),
            Elements::Array(_) => 0,
        }
    }
}

fn invalid_base64(path: &str, why: &str) -> Problem {
    Problem::at(
        ErrorCode::InvalidFieldElement,
        path,
        format!("invalid base64: {why}"),
    )
}

/// Decoded little-endian values as `field`'s vector: the words themselves where the
/// width allows (Goldilocks, and the 256-bit fields as four words an element).
fn from_packed(field: Field, words: PackedWords<u64>) -> Result<FieldVec, ElementError> {
    let whole = words.len % field.byte_width() == 0;
    if !whole || field == Field::BabyBear || cfg!(target_endian = "big") {
        return FieldVec::from_le_bytes(field, words.bytes());
    }
    match field {
        Field::Goldilocks => FieldVec::from_words(field, words.words),
        _ => match bytemuck::allocation::try_cast_vec::<u64, [u64; 4]>(words.words) {
            Ok(limbs) => FieldVec::from_limbs(field, limbs),
            Err((_, words)) => {
                FieldVec::from_le_bytes(field, &bytemuck::cast_slice(&words)[..words.len() * 8])
            }
        },
    }
}

fn check_count(n: usize, max: usize, path: &str) -> Result<(), Problem> {
    if n > max {
        return Err(too_many_elements(n, max, path));
    }
    Ok(())
}

fn too_many_elements(n: usize, max: usize, path: &str) -> Problem {
    Problem::at(
        ErrorCode::PayloadTooLarge,
        path,
        format!("{n} elements is more than the server's limit of {max} (--max-elements)"),
    )
}

impl<'de> Deserialize<'de> for Elements {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElementsVisitor)
    }
}

struct ElementsVisitor;

impl<'de> Visitor<'de> for ElementsVisitor {
    type Value = Elements;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of decimal or 0x-hex strings, or a base64 string")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Elements, A::Error> {
        Ok(match object_operand(map)? {
            ObjectOperand::Array(id) => Elements::Array(id),
            ObjectOperand::Buffer(b, bytes) => Elements::Buffer {
                dtype: b.dtype,
                shape: b.shape,
                bytes,
            },
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Elements, E> {
        Ok(Elements::Base64 {
            words: PackedWords::decode(v),
            text_bytes: v.len() / 4 * 3,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elements, A::Error> {
        let mut values = Integers::Narrow(Vec::with_capacity(
            seq.size_hint().unwrap_or(0).min(1 << 20),
        ));
        let mut errors = Vec::new();
        let mut error_count = 0;
        let cap = number_cap();
        loop {
            let index = values.len();
            if index > cap && !matches!(values, Integers::Counted(_)) {
                values = Integers::Counted(index); // refused: its memory goes back now
            }
            match seq.next_element_seed(ElementSeed(&mut values))? {
                None => break,
                Some(Ok(())) => {}
                Some(Err(message)) => {
                    if errors.len() < MAX_LISTED_ERRORS {
                        errors.push((index, message));
                    }
                    error_count += 1;
                    values.push(U256::ZERO); // keeps later indices right
                }
            }
        }
        super::numbers::note_stored(match &values {
            Integers::Narrow(v) => 8 * v.len() as u64,
            Integers::Wide(v) => 32 * v.len() as u64,
            Integers::Counted(_) => 0,
        });
        Ok(Elements::Strings {
            values,
            errors,
            error_count,
        })
    }
}

/// One array element, parsed and appended to the vector where it is read (no value is
/// handed back through serde: millions of elements make every move count). Ok(()) once
/// appended, or Ok(Err(why)) with nothing appended, so reading goes on and every bad
/// element can be reported, not just the first.
struct ElementSeed<'a>(&'a mut Integers);

impl<'de> DeserializeSeed<'de> for ElementSeed<'_> {
    type Value = Result<(), String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

const NUMBER_REFUSED: &str =
    "field elements must be strings: JSON numbers lose precision above 2^53";

impl<'de> Visitor<'de> for ElementSeed<'_> {
    type Value = Result<(), String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a decimal or 0x-hex string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        // A small field's element goes straight in as its word while every value so far
        // has been one; anything else (hex, wide, malformed) takes the full parse.
        if let Integers::Narrow(words) = &mut *self.0 {
            if let Some(word) = U256::parse_u64_decimal(v) {
                words.push(word);
                return Ok(Ok(()));
            }
        }
        Ok(U256::parse(v)
            .map(|value| self.0.push(value))
            .map_err(|e| e.to_string()))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(NUMBER_REFUSED.into()))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(NUMBER_REFUSED.into()))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(NUMBER_REFUSED.into()))
    }
}

#[cfg(test)]
mod tests;
