//! Field elements on the wire: a JSON array of decimal or `0x`-hex strings, or one
//! base64 string of little-endian fixed-width values. Strings are parsed while the JSON
//! is read (no allocation per element) and bad ones are collected with their index.

use super::problem::{ErrorCode, FieldIssue, Problem};
use crate::ops::zk::{Field, FieldVec, U256};
use base64::Engine;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use utoipa::ToSchema;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
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

/// Documentation form of an element vector: on the wire either a bare array of strings
/// or one bare base64 string (untagged: no wrapper object).
#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
#[schema(example = json!(["1", "0x2a", "21888242871839275222246405745257275088548364400416034343698204186575808495616"]))]
pub enum ElementsDoc {
    /// Canonical integers as decimal or `0x`-hex strings (never JSON numbers).
    Strings(Vec<String>),
    /// base64 of little-endian fixed-width canonical values (with `"encoding": "base64"`).
    Base64(String),
}

/// An element vector as received, before the field is known.
#[derive(Debug)]
pub enum Elements {
    Strings {
        values: Vec<U256>,
        errors: Vec<(usize, String)>,
        error_count: usize,
    },
    Base64(String),
}

impl Elements {
    /// Validates against `field`: well-formed, canonical, within `max_elements`.
    /// `path` is the JSON pointer of this vector in the request.
    /// Plain 256-bit integers (exponents): decimal/hex strings, or base64 of 32-byte
    /// little-endian values. No field check.
    pub fn decode_integers(
        &self,
        encoding: Encoding,
        path: &str,
        max_elements: usize,
    ) -> Result<Vec<U256>, Problem> {
        match (self, encoding) {
            (Elements::Base64(text), Encoding::Base64) => {
                check_count(text.len() / 4 * 3 / 32, max_elements, path)?;
                let bytes = B64.decode(text).map_err(|e| {
                    Problem::at(
                        ErrorCode::InvalidFieldElement,
                        path,
                        format!("invalid base64: {e}"),
                    )
                })?;
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
                check_count(values.len(), max_elements, path)?;
                Ok(values.clone())
            }
            // Malformed strings and encoding mismatches: the same answers as for elements.
            _ => self
                .decode(Field::Bn254Fr, encoding, path, max_elements)
                .and_then(|_| {
                    Err(Problem::new(
                        ErrorCode::Internal,
                        "exponent decoding fell through",
                    ))
                }),
        }
    }

    pub fn decode(
        &self,
        field: Field,
        encoding: Encoding,
        path: &str,
        max_elements: usize,
    ) -> Result<FieldVec, Problem> {
        let vec = match (self, encoding) {
            (Elements::Strings { values, errors, error_count }, Encoding::Decimal | Encoding::Hex) => {
                if !errors.is_empty() {
                    let issues: Vec<FieldIssue> = errors
                        .iter()
                        .map(|(i, m)| FieldIssue { path: format!("{path}/{i}"), message: m.clone() })
                        .collect();
                    let detail = format!("{error_count} malformed element(s) in {path}; the first {} are listed", issues.len());
                    return Err(Problem::new(ErrorCode::InvalidFieldElement, detail).with_errors(issues));
                }
                check_count(values.len(), max_elements, path)?;
                FieldVec::from_integers(field, values)
            }
            (Elements::Base64(text), Encoding::Base64) => {
                check_count(text.len() / 4 * 3 / field.byte_width(), max_elements, path)?;
                let bytes = B64
                    .decode(text)
                    .map_err(|e| Problem::at(ErrorCode::InvalidFieldElement, path, format!("invalid base64: {e}")))?;
                FieldVec::from_le_bytes(field, &bytes)
            }
            (Elements::Base64(_), _) => {
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

    pub fn approx_len(&self) -> usize {
        match self {
            Elements::Strings { values, .. } => values.len(),
            Elements::Base64(s) => s.len() / 4 * 3,
        }
    }
}

fn check_count(n: usize, max: usize, path: &str) -> Result<(), Problem> {
    if n > max {
        return Err(Problem::at(
            ErrorCode::PayloadTooLarge,
            path,
            format!("{n} elements is more than the server's limit of {max} (--max-elements)"),
        ));
    }
    Ok(())
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

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Elements, E> {
        Ok(Elements::Base64(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Elements, E> {
        Ok(Elements::Base64(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elements, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        let mut errors = Vec::new();
        let mut error_count = 0;
        while let Some(parsed) = seq.next_element_seed(ElementSeed)? {
            match parsed {
                Ok(v) => values.push(v),
                Err(message) => {
                    if errors.len() < MAX_LISTED_ERRORS {
                        errors.push((values.len(), message));
                    }
                    error_count += 1;
                    values.push(U256::ZERO); // keeps later indices right
                }
            }
        }
        Ok(Elements::Strings {
            values,
            errors,
            error_count,
        })
    }
}

/// One array element: Ok(value), or Ok(Err(why)) so reading goes on and every bad
/// element can be reported, not just the first.
struct ElementSeed;

impl<'de> DeserializeSeed<'de> for ElementSeed {
    type Value = Result<U256, String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

const NUMBER_REFUSED: &str =
    "field elements must be strings: JSON numbers lose precision above 2^53";

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = Result<U256, String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a decimal or 0x-hex string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(U256::parse(v).map_err(|e| e.to_string()))
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

/// A result vector written in the request's encoding, streamed without building strings.
pub struct ElementsOut {
    pub values: FieldVec,
    pub encoding: Encoding,
}

impl Serialize for ElementsOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        if self.encoding == Encoding::Base64 {
            return s.serialize_str(&B64.encode(self.values.to_le_bytes()));
        }
        let mut seq = s.serialize_seq(Some(self.values.len()))?;
        let mut buf = String::with_capacity(80);
        for i in 0..self.values.len() {
            buf.clear();
            match self.encoding {
                Encoding::Hex => self.values.get(i).write_hex(&mut buf),
                _ => self.values.get(i).write_decimal(&mut buf),
            }
            seq.serialize_element(buf.as_str())?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(json: &str) -> Elements {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn collects_every_bad_element_with_its_index() {
        let e = elements(r#"["1", "x", 5, "0x10", ""]"#);
        let p = e
            .decode(Field::Goldilocks, Encoding::Decimal, "/a", 100)
            .unwrap_err();
        assert_eq!(p.code, ErrorCode::InvalidFieldElement);
        let paths: Vec<_> = p.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/a/1", "/a/2", "/a/4"]);
    }

    #[test]
    fn non_canonical_values_name_their_index() {
        let e = elements(r#"["0", "18446744069414584321"]"#);
        let p = e
            .decode(Field::Goldilocks, Encoding::Decimal, "/b", 100)
            .unwrap_err();
        assert_eq!(p.errors[0].path, "/b/1");
    }

    #[test]
    fn base64_round_trips_and_must_match_the_encoding() {
        let v = FieldVec::Goldilocks(vec![1, 2, 0xffff_ffff_0000_0000]);
        let text = serde_json::to_string(&ElementsOut {
            values: v.clone(),
            encoding: Encoding::Base64,
        })
        .unwrap();
        let e = elements(&text);
        assert_eq!(
            e.decode(Field::Goldilocks, Encoding::Base64, "/a", 100)
                .unwrap(),
            v
        );
        assert_eq!(
            e.decode(Field::Goldilocks, Encoding::Decimal, "/a", 100)
                .unwrap_err()
                .code,
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            e.decode(Field::Goldilocks, Encoding::Base64, "/a", 2)
                .unwrap_err()
                .code,
            ErrorCode::PayloadTooLarge
        );
        let bad = elements(r#""not base64!""#);
        assert_eq!(
            bad.decode(Field::Goldilocks, Encoding::Base64, "/a", 100)
                .unwrap_err()
                .errors[0]
                .path,
            "/a"
        );
    }

    #[test]
    fn output_follows_the_encoding() {
        let v = FieldVec::Goldilocks(vec![255]);
        let dec = serde_json::to_string(&ElementsOut {
            values: v.clone(),
            encoding: Encoding::Decimal,
        })
        .unwrap();
        let hex = serde_json::to_string(&ElementsOut {
            values: v,
            encoding: Encoding::Hex,
        })
        .unwrap();
        assert_eq!((dec.as_str(), hex.as_str()), (r#"["255"]"#, r#"["0xff"]"#));
    }
}
