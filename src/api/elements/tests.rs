use super::*;
use crate::api::array_operands::ArrayScope;

fn elements(json: &str) -> Elements {
    serde_json::from_str(json).unwrap()
}

#[test]
fn collects_every_bad_element_with_its_index() {
    let e = elements(r#"["1", "x", 5, "0x10", ""]"#);
    let p = e
        .decode_inline(Field::Goldilocks, Encoding::Decimal, "/a", 100)
        .unwrap_err();
    assert_eq!(p.code, ErrorCode::InvalidFieldElement);
    let paths: Vec<_> = p.errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/a/1", "/a/2", "/a/4"]);
}

#[test]
fn elements_past_the_parse_cap_are_counted_and_refused() {
    use super::super::numbers::with_number_cap;
    let text = r#"["1", "2", "18446744073709551616", "4"]"#;
    let e = with_number_cap(2, || elements(text)).0;
    assert!(
        matches!(
            &e,
            Elements::Strings {
                values: Integers::Counted(4),
                ..
            }
        ),
        "{e:?}"
    );
    let p = e
        .decode_inline(Field::Bn254Fr, Encoding::Decimal, "/a", 2)
        .unwrap_err();
    assert_eq!(
        (p.code, p.errors[0].path.as_str()),
        (ErrorCode::PayloadTooLarge, "/a")
    );
    assert!(p.detail.contains("4 elements"), "{}", p.detail);
    // At the cap exactly, every value is kept.
    let e = with_number_cap(4, || elements(text)).0;
    let v = e
        .decode_inline(Field::Bn254Fr, Encoding::Decimal, "/a", 4)
        .unwrap();
    assert_eq!(v.len(), 4);
}

#[test]
fn non_canonical_values_name_their_index() {
    let e = elements(r#"["0", "18446744069414584321"]"#);
    let p = e
        .decode_inline(Field::Goldilocks, Encoding::Decimal, "/b", 100)
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
    let e = || elements(&text);
    assert_eq!(
        e().decode_inline(Field::Goldilocks, Encoding::Base64, "/a", 100)
            .unwrap(),
        v
    );
    assert_eq!(
        e().decode_inline(Field::Goldilocks, Encoding::Decimal, "/a", 100)
            .unwrap_err()
            .code,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        e().decode_inline(Field::Goldilocks, Encoding::Base64, "/a", 2)
            .unwrap_err()
            .code,
        ErrorCode::PayloadTooLarge
    );
    // The size check comes first, as the text's length gives it.
    assert_eq!(
        elements(r#""AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA!""#)
            .decode_inline(Field::Goldilocks, Encoding::Base64, "/a", 2)
            .unwrap_err()
            .code,
        ErrorCode::PayloadTooLarge
    );
    let bad = elements(r#""not base64!""#);
    assert_eq!(
        bad.decode_inline(Field::Goldilocks, Encoding::Base64, "/a", 100)
            .unwrap_err()
            .errors[0]
            .path,
        "/a"
    );
}

/// Values parse into 64-bit words until one needs more; either way every field gets
/// the same vector as from the integers, and the first non-canonical index is named.
#[test]
fn narrow_and_wide_integers_decode_alike() {
    let big = "18446744073709551616"; // 2^64
    let texts = [
        r#"["0", "5", "2013265920", "0xffffffff00000000"]"#.to_string(),
        format!(r#"["7", "{big}", "3"]"#),
        format!(r#"["{big}"]"#),
        r#"["2013265921", "1"]"#.to_string(),
        r#"["1", "18446744069414584321"]"#.to_string(),
        // Twenty digits up to 2^64 - 1 are words; leading zeros beyond take the full parse.
        r#"["18446744073709551615", "10000000000000000000", "000000000000000000000042", "0x7"]"#
            .to_string(),
    ];
    for text in &texts {
        let ints = elements(text)
            .decode_integers(Encoding::Decimal, "/x", 100, &ArrayScope::empty("ints"))
            .unwrap();
        // Each value as the general parser reads it alone: the word path must agree.
        let strings: Vec<String> = serde_json::from_str(text).unwrap();
        let one_by_one: Vec<U256> = strings.iter().map(|s| U256::parse(s).unwrap()).collect();
        assert_eq!(ints, one_by_one, "{text}");
        for field in [
            Field::Goldilocks,
            Field::BabyBear,
            Field::Bn254Fr,
            Field::Bls12_381Fr,
        ] {
            let want = FieldVec::from_integers(field, &ints).map_err(|e| e.index);
            let got = elements(text).decode_inline(field, Encoding::Decimal, "/x", 100);
            match (want, got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{text} in {field:?}"),
                (Err(i), Err(p)) => assert_eq!(p.errors[0].path, format!("/x/{i}"), "{text}"),
                (w, g) => panic!(
                    "{text} in {field:?}: {w:?} vs {:?}",
                    g.map_err(|p| p.detail)
                ),
            }
        }
    }
}

/// Base64 answers and requests round-trip for every field width; the size hint bounds
/// the answer in every encoding.
#[test]
fn every_field_round_trips_and_the_size_hint_bounds_the_answer() {
    let big = U256([u64::MAX, 5, 9, 0x0f]);
    for field in [
        Field::Goldilocks,
        Field::BabyBear,
        Field::Bn254Fr,
        Field::Bls12_381Fr,
    ] {
        let top = match field {
            Field::Goldilocks | Field::BabyBear => U256::from_u64(field.modulus().0[0] - 1),
            _ => big,
        };
        let v = FieldVec::from_integers(field, &[U256::ZERO, U256::from_u64(42), top]).unwrap();
        for encoding in [Encoding::Decimal, Encoding::Hex, Encoding::Base64] {
            let out = ElementsOut {
                values: v.clone(),
                encoding,
            };
            let text = serde_json::to_string(&out).unwrap();
            assert!(
                text.len() <= out.json_size_hint(),
                "{field:?} {encoding:?}: {text}"
            );
            let back = elements(&text)
                .decode_inline(field, encoding, "/a", 100)
                .unwrap();
            assert_eq!(back, v, "{field:?} {encoding:?}");
        }
    }
}

/// The hand-written answer is byte for byte what serde writes.
#[test]
fn written_json_is_what_serde_writes() {
    let ints = [U256::ZERO, U256::from_u64(7), U256::from_u64(2_013_265_920)];
    for field in [
        Field::Goldilocks,
        Field::BabyBear,
        Field::Bn254Fr,
        Field::Bls12_381Fr,
    ] {
        let mut values = ints.to_vec();
        values.push(U256::from_u64(field.modulus().0[0].wrapping_sub(1)));
        let mut top = field.modulus();
        top.0[0] -= 1; // every modulus is odd
        values.push(top);
        let v = FieldVec::from_integers(field, &values).unwrap();
        for encoding in [Encoding::Decimal, Encoding::Hex, Encoding::Base64] {
            for v in [v.clone(), FieldVec::from_integers(field, &[]).unwrap()] {
                let out = ElementsOut {
                    values: v,
                    encoding,
                };
                let mut written = Vec::new();
                out.write_json(&mut written);
                let serde = serde_json::to_string(&out).unwrap();
                assert_eq!(
                    String::from_utf8(written).unwrap(),
                    serde,
                    "{field:?} {encoding:?}"
                );
            }
        }
    }
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
