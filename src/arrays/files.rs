//! Arrays on disk: `<id>.bin` (the values' little-endian bytes, the wire's form) then
//! `<id>.json` (the metadata, whose presence commits the array), written whole
//! (`crate::durable`), so an array answered 201 survives a crash, and one cut short
//! leaves no metadata.

use super::{ArrayData, ArrayError, ArrayKind, ArrayMeta, Recording, ResidentArray, Tensor};
use crate::ops::linalg::{Dtype, Values};
use crate::ops::zk::msm::Points;
use crate::ops::zk::FieldVec;
use std::path::Path;
use std::sync::Arc;

fn io(what: &Path, e: std::io::Error) -> ArrayError {
    ArrayError::Io(format!("{}: {e}", what.display()))
}

/// The values' disk (and artifact store) form; none for values held on a device (read
/// back first: `Arrays::materialised`).
pub(super) fn values_bytes(data: &ArrayData) -> Result<std::borrow::Cow<'_, [u8]>, ArrayError> {
    Ok(match data {
        ArrayData::FieldElements(v) => v.le_bytes(),
        ArrayData::Points(p) => std::borrow::Cow::Owned(p.to_le_bytes()),
        ArrayData::Tensor(t) => t.values.le_bytes(t.dtype),
        ArrayData::Recording(r) => std::borrow::Cow::Borrowed(r.as_le_bytes()),
        ArrayData::Bytes(b) => std::borrow::Cow::Borrowed(&b[..]),
        ArrayData::Held(h) => {
            return Err(ArrayError::Io(format!(
                "{} is held on device {}, not read back",
                h.describe(),
                h.ordinal()
            )))
        }
    })
}

pub(super) fn write(dir: &Path, array: &ResidentArray) -> Result<(), ArrayError> {
    let meta = serde_json::to_vec(&array.meta).expect("metadata serializes");
    let values = values_bytes(&array.data)?;
    let parts: [(&str, &[u8]); 2] = [("bin", &values), ("json", &meta)];
    crate::durable::write_parts(dir, &array.meta.id, &parts).map_err(|(p, e)| io(&p, e))
}

/// The metadata first: a crash between the two leaves values no array claims, which the
/// next load deletes.
pub(super) fn remove(dir: &Path, id: &str) -> Result<(), ArrayError> {
    crate::durable::remove_parts(dir, id, &["json", "bin"]).map_err(|(p, e)| io(&p, e))
}

/// Every committed array under `dir` (created if missing) that has not expired at
/// `now_ms`. Expired arrays and values without metadata are deleted; an array whose
/// files disagree is skipped with a warning and left for an operator to look at.
pub(super) fn load_all(dir: &Path, now_ms: u64) -> Result<Vec<ResidentArray>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    let mut out = Vec::new();
    for path in &paths {
        let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
        let id = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        match ext {
            "json" => match load(path, now_ms) {
                Ok(Some(a)) => out.push(a),
                Ok(None) => {
                    if let Err(e) = remove(dir, id) {
                        tracing::warn!(array = %id, error = %e, "expired array's files not removed");
                    }
                }
                Err(e) => tracing::warn!("resident array {} skipped: {e}", path.display()),
            },
            // Values whose metadata never committed (a crash mid-write), and temporaries.
            "bin" if !path.with_extension("json").exists() => {
                let _ = std::fs::remove_file(path);
            }
            "tmp" => {
                let _ = std::fs::remove_file(path);
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The array `meta_path` commits, `None` when it has expired.
fn load(meta_path: &Path, now_ms: u64) -> Result<Option<ResidentArray>, String> {
    let meta: ArrayMeta =
        serde_json::from_slice(&std::fs::read(meta_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    if now_ms >= meta.expires_at_ms {
        return Ok(None);
    }
    let bytes = std::fs::read(meta_path.with_extension("bin")).map_err(|e| e.to_string())?;
    let data = decode(&meta, &bytes.into())?;
    Ok(Some(ResidentArray { meta, data }))
}

/// The values `meta` describes, from their stored form, checked again as on upload: a
/// file changed on disk (or an object in the store) is never served unchecked.
pub(super) fn decode(meta: &ArrayMeta, bytes: &bytes::Bytes) -> Result<ArrayData, String> {
    let data = match (meta.kind, meta.field, meta.curve, meta.dtype, &meta.shape) {
        (ArrayKind::FieldElements, Some(field), None, None, None) => ArrayData::FieldElements(
            Arc::new(FieldVec::from_le_bytes(field, &bytes[..]).map_err(|e| e.message)?),
        ),
        (ArrayKind::Points, None, Some(curve), None, None) => ArrayData::Points(Arc::new(
            Points::from_le_bytes(curve, &bytes[..])
                .map_err(|e| format!("{} bad points, first {:?}", e.count, e.listed.first()))?,
        )),
        (ArrayKind::Tensor, None, None, Some(dtype), Some(shape)) => {
            ArrayData::Tensor(Arc::new(tensor(dtype, shape, &bytes[..])?))
        }
        (ArrayKind::Recording, None, None, None, None) => ArrayData::Recording(Arc::new(
            Recording::from_le_bytes(bytes.clone()).map_err(|e| e.to_string())?,
        )),
        (ArrayKind::Bytes, None, None, None, None) => ArrayData::Bytes(bytes.clone()),
        _ => return Err("the metadata's kind, field, curve, dtype and shape disagree".into()),
    };
    if data.len() != meta.len {
        return Err(format!(
            "{} values for a length of {}",
            data.len(),
            meta.len
        ));
    }
    Ok(data)
}

/// A tensor's values from its file, checked as an upload is: the shape's product of
/// `dtype` values, every one finite.
fn tensor(dtype: Dtype, shape: &[usize], bytes: &[u8]) -> Result<Tensor, String> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if shape.is_empty() || n.and_then(|n| n.checked_mul(dtype.bytes())) != Some(bytes.len()) {
        return Err(format!(
            "{} bytes for shape {shape:?} of {}",
            bytes.len(),
            dtype.name()
        ));
    }
    let values = Values::from_le_bytes(bytes, dtype);
    if let Some(i) = values.first_non_finite() {
        return Err(format!("value {i} is not finite"));
    }
    Ok(Tensor::new(dtype, shape.to_vec(), values))
}
