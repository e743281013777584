//! What an array is, apart from its values: its kind, and its description as stored
//! beside them.

use super::ArrayData;
use crate::ops::linalg::Dtype;
use crate::ops::zk::msm::Curve;
use crate::ops::zk::Field;
use serde::{Deserialize, Serialize};

/// What an array holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ArrayKind {
    /// Canonical elements of one field.
    FieldElements,
    /// Affine points of one curve, checked.
    Points,
    /// A dense tensor of rank 1 to 4 in f16, bf16, f32 or f64.
    Tensor,
    /// An IQ recording: complex samples, interleaved little-endian f32 (`cf32_le`).
    Recording,
    /// Bytes, as they were sent: an HE public key, secret key or ciphertext.
    Bytes,
}

impl ArrayKind {
    pub fn name(self) -> &'static str {
        match self {
            ArrayKind::FieldElements => "field_elements",
            ArrayKind::Points => "points",
            ArrayKind::Tensor => "tensor",
            ArrayKind::Recording => "recording",
            ArrayKind::Bytes => "bytes",
        }
    }
}

/// What an array was made as, where that matters beyond its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ArrayRole {
    /// An embedding table made through `/embeddings/tables`: an f32 `[V, D]` tensor,
    /// counted against the tables' own limits besides the arrays', and kept until it is
    /// deleted unless its upload gave it a time to live.
    EmbeddingTable,
}

impl ArrayRole {
    pub fn name(self) -> &'static str {
        match self {
            ArrayRole::EmbeddingTable => "embedding_table",
        }
    }
}

/// An array's description, as stored beside its values.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArrayMeta {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub kind: ArrayKind,
    /// Set for field elements.
    pub field: Option<Field>,
    /// Set for points.
    pub curve: Option<Curve>,
    /// Set for tensors (absent from arrays stored before tensors were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
    pub len: usize,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Milliseconds since the Unix epoch; the array is gone from then on (`NEVER`: kept
    /// until it is deleted).
    pub expires_at_ms: u64,
    /// Absent for arrays made through `/arrays` or kept as results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<ArrayRole>,
}

/// The expiry of an array kept until it is deleted: an embedding table whose upload gave
/// no time to live (tables were kept so before they were arrays). The last millisecond
/// of year 9999, not `u64::MAX`: a build from before tables were arrays, reading the
/// shared catalog during a rolling upgrade, formats every expiry as a date, and no date
/// past 9999 formats; no time to live reaches it.
pub const NEVER: u64 = 253_402_300_799_999;

impl ArrayMeta {
    /// The description of `data`, made now, expiring at `expires_at_ms`.
    pub fn describe(
        data: &ArrayData,
        id: String,
        tenant: String,
        name: Option<String>,
        expires_at_ms: u64,
    ) -> Self {
        Self {
            id,
            tenant,
            name,
            kind: data.kind(),
            field: data.field(),
            curve: data.curve(),
            dtype: data.dtype(),
            shape: data.shape(),
            len: data.len(),
            created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            expires_at_ms,
            role: None,
        }
    }

    pub fn is_table(&self) -> bool {
        self.role == Some(ArrayRole::EmbeddingTable)
    }
}

impl ArrayMeta {
    /// When it expires, RFC 3339 with milliseconds; `None` when it is kept until deleted
    /// (or a time to live reaches past year 9999, which no date formats).
    pub fn expires_at(&self) -> Option<String> {
        if self.expires_at_ms >= NEVER {
            return None;
        }
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.expires_at_ms);
        Some(humantime::format_rfc3339_millis(at).to_string())
    }
}
