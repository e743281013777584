use super::super::packed::base64_json_string;
use super::answers::encode_le;
use super::*;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

fn parse(json: &str) -> Result<DenseIn, String> {
    let d = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(d).map_err(|e| format!("{} {}", e.path(), e.inner()))
}

#[test]
fn nested_arrays_give_their_shape_and_values() {
    match parse("[[1, 2, 3], [4, 5.5, -6]]").unwrap() {
        DenseIn::Nested { shape, values } => {
            assert_eq!(shape, [2, 3]);
            assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 5.5, -6.0]);
        }
        other => panic!("{other:?}"),
    }
    match parse("[[[1], [2]], [[3], [4]]]").unwrap() {
        DenseIn::Nested { shape, .. } => assert_eq!(shape, [2, 2, 1]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn nested_arrays_past_the_parse_cap_are_refused_by_their_shape() {
    use super::super::numbers::with_number_cap;
    let json = "[[1, 2, 3], [4, 5, 6]]";
    let tensor = with_number_cap(5, || parse(json)).0.unwrap();
    let e = tensor.decode("/a", 1..=4, 5).err().unwrap();
    assert_eq!(
        (e.code, e.errors[0].path.as_str()),
        (ErrorCode::PayloadTooLarge, "/a")
    );
    assert!(e.detail.contains("6 values"), "{}", e.detail);
    let tensor = with_number_cap(6, || parse(json)).0.unwrap();
    assert_eq!(tensor.decode("/a", 1..=4, 6).ok().unwrap().shape, [2, 3]);
}

#[test]
fn ragged_empty_and_deep_arrays_are_refused_with_their_path() {
    let e = parse("[[1, 2], [3]]").unwrap_err();
    assert!(e.starts_with("[1]") && e.contains("ragged"), "{e}");
    let e = parse("[[1, 2], [3, [4]]]").unwrap_err();
    assert!(e.contains("[1][1]"), "{e}");
    assert!(parse("[[1], []]").unwrap_err().contains("empty"));
    assert!(parse("[[[[[1]]]]]").unwrap_err().contains("rank 4"));
    assert!(parse("[[1, \"2\"]]").unwrap_err().starts_with("[0][1]"));
}

#[test]
fn packed_half_precisions_round_trip() {
    let values = [1.0, -2.5, 0.0009765625, 65504.0];
    for dtype in [TensorDtype::F16, TensorDtype::Bf16, TensorDtype::F32] {
        let data = B64.encode(encode_le(Values::F64(values[..3].to_vec()), dtype));
        let t = DenseIn::Packed(PackedTensor {
            encoding: BinaryEncoding::Base64,
            dtype,
            shape: vec![3],
            data: Base64Data::new(&data),
        });
        let got = t.decode("/a", 1..=3, 10).unwrap();
        assert_eq!(got.values.into_f64(), values[..3]);
    }
}

#[test]
fn simd_base64_agrees_with_the_scalar_codec() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for len in (0..200).chain([4095, 4096, 65_537]) {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let text = B64.encode(&bytes);
        assert_eq!(base64_json_string(&bytes).get(), format!("\"{text}\""));
        let words = Base64Data::new(&text).0.unwrap();
        assert_eq!(words.bytes(), bytes, "{len} bytes");
    }
    // What the scalar decoder refuses, the SIMD one refuses too, with its message.
    for bad in ["AB==", "QQ", "Q===", "Q Q==", "QUJD\n", "QU*D"] {
        let e = Base64Data::new(bad).0.unwrap_err();
        assert!(B64.decode(bad).is_err(), "{bad}");
        assert!(!e.is_empty(), "{bad}");
    }
    assert!(Base64Data::new("QUJD").0.is_ok());
}

#[test]
fn packed_f32_stays_f32_and_goes_out_unchanged() {
    let values = vec![1.5f32, -0.1, 3.4e38, f32::MIN_POSITIVE];
    let text = B64.encode(encode_le(
        Values::F32(values.clone().into()),
        TensorDtype::F32,
    ));
    let t = DenseIn::Packed(PackedTensor {
        encoding: BinaryEncoding::Base64,
        dtype: TensorDtype::F32,
        shape: vec![2, 2],
        data: Base64Data::new(&text),
    });
    let got = t.decode("/a", 2..=2, 10).unwrap();
    assert_eq!(got.values, Values::F32(values.into()));
    let e = DenseIn::Packed(PackedTensor {
        encoding: BinaryEncoding::Base64,
        dtype: TensorDtype::F32,
        shape: vec![1],
        data: Base64Data::new("AB=="),
    })
    .decode("/a", 1..=2, 10)
    .err()
    .expect("non-canonical base64 refused");
    assert_eq!(e.code, ErrorCode::InvalidTensor);
    assert_eq!(e.errors[0].path, "/a/data");
}

#[test]
fn nested_output_serializes_by_shape() {
    let out = DenseOut::new(
        vec![2, 1, 2],
        vec![1.0, 2.0, 3.0, 4.0],
        TensorDtype::F32,
        false,
    );
    assert_eq!(
        serde_json::to_string(&out).unwrap(),
        "[[[1.0,2.0]],[[3.0,4.0]]]"
    );
}
