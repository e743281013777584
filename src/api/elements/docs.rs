//! The element vectors' documentation forms: the shapes the OpenAPI document gives them
//! (the parsers in `elements.rs` accept exactly these).

use crate::api::array_operands::ArrayRefDoc;
use utoipa::ToSchema;

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
    /// A resident array of this field's elements (`POST /arrays`), used without another
    /// check; an exponent takes elements of any field, as integers.
    Array(ArrayRefDoc),
}

/// Documentation form of an element vector in an answer: a bare array of strings or one
/// bare base64 string (in a bulk answer, a buffer descriptor).
#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
#[schema(example = json!(["1", "42"]))]
pub enum ElementsOutDoc {
    /// Decimal, or `0x` hex with `"encoding": "hex"`.
    Strings(Vec<String>),
    /// With `"encoding": "base64"`: little-endian fixed-width values.
    Base64(String),
}
