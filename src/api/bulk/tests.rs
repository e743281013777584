use super::*;
use crate::api::dense_tensors::{DenseIn, DenseOut, TensorDtype};
use crate::ops::linalg::Values;
use axum::http::HeaderValue;

fn accept(values: &[&str]) -> AnswerForm {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(header::ACCEPT, HeaderValue::from_str(v).unwrap());
    }
    AnswerForm::from_headers(&h)
}

#[test]
fn the_bulk_answer_is_given_only_when_preferred() {
    assert_eq!(accept(&[]), AnswerForm::Json);
    assert_eq!(accept(&["*/*"]), AnswerForm::Json);
    assert_eq!(accept(&[wire::MEDIA_TYPE]), AnswerForm::Bulk);
    assert_eq!(accept(&["APPLICATION/VND.GPU-OPS.BULK"]), AnswerForm::Bulk);
    assert_eq!(
        accept(&["application/json", wire::MEDIA_TYPE]),
        AnswerForm::Bulk
    );
    assert_eq!(
        accept(&["application/json;q=0.8, application/vnd.gpu-ops.bulk;q=0.9"]),
        AnswerForm::Bulk
    );
    assert_eq!(
        accept(&["application/vnd.gpu-ops.bulk; q=0.5, */*"]),
        AnswerForm::Json
    );
    assert_eq!(
        accept(&["application/vnd.gpu-ops.bulk;q=0"]),
        AnswerForm::Json
    );
}

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Request {
    a: DenseIn,
    #[serde(default)]
    scale: f64,
}

fn bulk(header: &serde_json::Value, buffers: &[(Dtype, Vec<u64>, Vec<u8>)]) -> Bytes {
    let mut header = header.clone();
    let mut w = EnvelopeWriter::new();
    for (i, (dtype, shape, bytes)) in buffers.iter().enumerate() {
        let r = w.push(*dtype, shape.clone(), Bytes::from(bytes.clone()));
        header[["a", "b", "c"][i]] = serde_json::to_value(r).unwrap();
    }
    Bytes::from(w.finish_to_vec(&header).unwrap())
}

use crate::wire::Dtype;

#[test]
fn a_header_parses_as_the_json_request_with_its_buffers_lent() {
    let values = [1.5f32, -2.0, 0.25, 8.0];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let body = bulk(
        &serde_json::json!({"scale": 2.0}),
        &[(Dtype::F32, vec![2, 2], bytes.clone())],
    );
    let req: Request = parse_bulk(body, &BodyLimits::default()).unwrap();
    assert_eq!(req.scale, 2.0);
    let t = req.a.decode("/a", 2..=2, 16).ok().unwrap();
    assert_eq!(t.shape, [2, 2]);
    assert_eq!(t.values, Values::F32(values.to_vec().into()));
    let Values::F32(lent) = &t.values else {
        unreachable!()
    };
    assert!(
        lent.is_lent(),
        "an f32 tensor is read where it lies in the body"
    );
    assert_eq!(t.packed, Some(TensorDtype::F32));
    // Nothing stays lent once the parse is over.
    assert!(buffer(0, 16).is_err());
}

#[test]
fn descriptors_are_found_anywhere_and_checked_whole() {
    let header = r#"{"a": {"dtype": "f32", "shape": [1], "byte_offset": 0, "byte_length": 4},
        "list": [{"x": 1}, {"dtype": "u64", "shape": [], "byte_offset": 64, "byte_length": 8}]}"#;
    let found = descriptors(header).unwrap();
    let mut paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["/a", "/list/1"]);
    let bad = r#"{"a": {"dtype": "f32", "shape": [1], "byte_offset": 0}}"#;
    let p = descriptors(bad).unwrap_err();
    assert_eq!(p.code, ErrorCode::InvalidBuffer);
    assert!(p.errors[0].path.starts_with("/a"), "{p:?}");
    let p =
        descriptors(r#"{"a": {"dtype": "f33", "shape": [1], "byte_offset": 0, "byte_length": 4}}"#)
            .unwrap_err();
    assert_eq!(p.errors[0].path, "/a/dtype");
}

#[test]
fn decoded_bytes_are_charged_before_any_buffer_is_read() {
    // A body whose layout is fine but whose values (f16 widened to f32) the charge
    // refuses is refused by the charge, not by anything later.
    let half = vec![0u8; 2 * 1000];
    let body = bulk(&serde_json::json!({}), &[(Dtype::F16, vec![1000], half)]);
    let found = descriptors(wire::split(&body).unwrap().header).unwrap();
    let total: u64 = found.iter().map(|(_, b)| decoded_bytes(b)).sum();
    assert_eq!(total, 4000, "f16 is charged as the f32 it becomes");
}

#[test]
fn answers_write_tensors_as_buffers_from_where_they_lie() {
    #[derive(serde::Serialize)]
    struct Answer {
        result: DenseOut,
        n: u32,
    }
    let values = vec![1.0f32, 2.0, 3.0];
    let answer = Answer {
        result: DenseOut::new(
            vec![3],
            Values::F32(values.clone().into()),
            TensorDtype::F32,
            true,
        ),
        n: 3,
    };
    let body = bulk_chunks(&answer).unwrap().concat();
    let envelope = wire::split(&body).unwrap();
    let header: serde_json::Value = serde_json::from_str(envelope.header.trim_end()).unwrap();
    assert_eq!(header["n"], 3);
    let r: BufferRef = serde_json::from_value(header["result"].clone()).unwrap();
    assert_eq!((r.dtype, r.shape.clone()), (Dtype::F32, vec![3]));
    let got: Vec<f32> = wire::bytes_of(envelope.data, &r)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, values);
    // The same answer serialized as JSON afterwards is JSON again.
    assert!(!answering());
    let json = serde_json::to_value(&answer).unwrap();
    assert_eq!(json["result"]["encoding"], "base64");
}

#[derive(serde::Deserialize)]
struct Gradients {
    a: crate::api::float_arrays::Matrix,
}

#[test]
fn a_float_matrix_in_a_buffer_is_read_in_place_not_copied() {
    use crate::api::float_arrays::Decoded;
    let values: Vec<f32> = (0..256).map(|i| i as f32 / 8.0 - 3.0).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let body = bulk(&serde_json::json!({}), &[(Dtype::F32, vec![16, 16], bytes)]);
    let body_at = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let req: Gradients = parse_bulk(body.clone(), &BodyLimits::default()).unwrap();
    let (rows, cols, decoded) = req.a.decode("/a", 256).ok().unwrap();
    assert_eq!((rows, cols), (16, 16));
    let Decoded::F32(g) = decoded else {
        panic!("f32 values stay f32")
    };
    assert_eq!(*g, values[..]);
    assert!(g.is_lent(), "read in place");
    assert!(body_at.contains(&(g.as_ptr() as usize)), "inside the body");
}
