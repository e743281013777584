use super::*;
use proptest::prelude::*;

/// A header as a request would carry it: plain fields and two buffers.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Header {
    op: String,
    a: BufferRef,
    b: BufferRef,
}

fn le_f32(values: &[f32]) -> Bytes {
    Bytes::from(
        values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
}

#[test]
fn a_written_body_splits_back_into_its_header_and_buffers() {
    let a: Vec<f32> = (0..15).map(|i| i as f32 * 0.5).collect(); // 60 bytes: padded to 64
    let b: Vec<u64> = vec![u64::MAX, 1, 2];
    let mut w = EnvelopeWriter::new();
    let ra = w.push(Dtype::F32, vec![3, 5], le_f32(&a));
    let rb = w.push(
        Dtype::U64,
        vec![3],
        Bytes::from(b.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()),
    );
    assert_eq!((ra.byte_offset, ra.byte_length), (0, 60));
    assert_eq!((rb.byte_offset, rb.byte_length), (64, 24));
    let header = Header {
        op: "add".into(),
        a: ra,
        b: rb,
    };
    let body = w.finish_to_vec(&header).unwrap();
    let n = u64::from_le_bytes(body[..8].try_into().unwrap()) as usize;
    assert_eq!(
        (8 + n) % 64,
        0,
        "the data section starts on a 64-byte boundary"
    );
    let env = split(&body).unwrap();
    let parsed: Header = serde_json::from_str(env.header.trim_end()).unwrap();
    assert_eq!(parsed, header);
    check_layout(&[("/a", &parsed.a), ("/b", &parsed.b)], env.data.len()).unwrap();
    assert_eq!(bytes_of(env.data, &parsed.a), &le_f32(&a)[..]);
    let got: Vec<u64> = bytes_of(env.data, &parsed.b)
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, b);
}

#[test]
fn framing_defects_are_named() {
    assert_eq!(split(&[1, 2, 3]).unwrap_err(), FramingError::TooShort(3));
    let long = (MAX_HEADER_BYTES + 1).to_le_bytes();
    assert_eq!(
        split(&long).unwrap_err(),
        FramingError::HeaderTooLong(MAX_HEADER_BYTES + 1)
    );
    let mut past = 10u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert_eq!(
        split(&past).unwrap_err(),
        FramingError::HeaderPastEnd {
            header: 10,
            body: 10
        }
    );
    let mut latin1 = 3u64.to_le_bytes().to_vec();
    latin1.extend_from_slice(b"{\xe9}");
    assert_eq!(split(&latin1).unwrap_err(), FramingError::NotUtf8(1));
    // An empty header and no data split; what the header must hold is the caller's.
    let empty = 0u64.to_le_bytes();
    let env = split(&empty).unwrap();
    assert_eq!((env.header, env.data.len()), ("", 0));
}

fn buffer(dtype: Dtype, shape: &[u64], byte_offset: u64, byte_length: u64) -> BufferRef {
    BufferRef {
        dtype,
        shape: shape.to_vec(),
        byte_offset,
        byte_length,
    }
}

#[test]
fn layout_defects_name_the_descriptor_member_at_fault() {
    let path_of =
        |buffers: &[(&str, &BufferRef)], len| check_layout(buffers, len).unwrap_err().path;
    // Length against dtype × shape.
    let short = buffer(Dtype::F32, &[4], 0, 12);
    assert_eq!(path_of(&[("/a", &short)], 64), "/a/byte_length");
    // Shape past 64 bits of elements.
    let huge = buffer(Dtype::U256, &[u64::MAX, 2], 0, 0);
    assert_eq!(path_of(&[("/x", &huge)], 0), "/x/shape");
    // An offset off the 64-byte grid.
    let a = buffer(Dtype::F32, &[4], 0, 16);
    let odd = buffer(Dtype::F32, &[4], 16, 16);
    assert_eq!(path_of(&[("/a", &a), ("/b", &odd)], 128), "/b/byte_offset");
    // Overlap and gap.
    let same = buffer(Dtype::F32, &[4], 0, 16);
    assert_eq!(path_of(&[("/a", &a), ("/b", &same)], 64), "/b/byte_offset");
    let far = buffer(Dtype::F32, &[4], 128, 16);
    let err = check_layout(&[("/a", &a), ("/b", &far)], 144).unwrap_err();
    assert_eq!(err.path, "/b/byte_offset");
    assert!(err.message.contains("starts at 64"), "{err}");
    // Past the end, and bytes after the last buffer's padding.
    assert_eq!(path_of(&[("/a", &a)], 8), "/a/byte_length");
    let err = check_layout(&[("/a", &a)], 65).unwrap_err();
    assert_eq!(err.path, "");
    // The last buffer's padding may be left off, or sent.
    check_layout(&[("/a", &a)], 16).unwrap();
    check_layout(&[("/a", &a)], 64).unwrap();
    // Order in the header does not matter; offsets do.
    let second = buffer(Dtype::Cf32, &[2], 64, 16);
    check_layout(&[("/b", &second), ("/a", &a)], 80).unwrap();
    // No buffers, no data.
    check_layout(&[], 0).unwrap();
    assert_eq!(path_of(&[], 1), "");
}

#[test]
fn a_descriptor_has_exactly_its_four_members_and_a_known_dtype() {
    let ok = r#"{"dtype":"bf16","shape":[2,3],"byte_offset":0,"byte_length":12}"#;
    let b: BufferRef = serde_json::from_str(ok).unwrap();
    assert_eq!((b.dtype, b.elements()), (Dtype::Bf16, Some(6)));
    let scalar: BufferRef =
        serde_json::from_str(r#"{"dtype":"u256","shape":[],"byte_offset":0,"byte_length":32}"#)
            .unwrap();
    assert_eq!(scalar.expected_length(), Some(32));
    for bad in [
        r#"{"dtype":"f8","shape":[1],"byte_offset":0,"byte_length":1}"#,
        r#"{"dtype":"f32","shape":[1],"byte_offset":0,"byte_length":4,"encoding":"base64"}"#,
        r#"{"dtype":"f32","shape":[-1],"byte_offset":0,"byte_length":4}"#,
        r#"{"dtype":"f32","shape":[1],"byte_offset":0}"#,
    ] {
        assert!(serde_json::from_str::<BufferRef>(bad).is_err(), "{bad}");
    }
}

proptest! {
    /// Any buffers written come back byte for byte, and the layout they were written in
    /// is the one the reader accepts.
    #[test]
    fn any_buffers_round_trip(lengths in proptest::collection::vec(0usize..300, 0..6)) {
        let mut w = EnvelopeWriter::new();
        let mut written = Vec::new();
        for (i, n) in lengths.iter().enumerate() {
            let bytes: Vec<u8> = (0..n * 4).map(|j| (i * 31 + j) as u8).collect();
            let r = w.push(Dtype::U32, vec![*n as u64], Bytes::from(bytes.clone()));
            written.push((format!("/b{i}"), r, bytes));
        }
        let header: Vec<&BufferRef> = written.iter().map(|(_, r, _)| r).collect();
        let body = w.finish_to_vec(&header).unwrap();
        let env = split(&body).unwrap();
        let parsed: Vec<BufferRef> = serde_json::from_str(env.header).unwrap();
        let named: Vec<(&str, &BufferRef)> =
            written.iter().map(|(p, _, _)| p.as_str()).zip(&parsed).collect();
        prop_assert!(check_layout(&named, env.data.len()).is_ok());
        for ((_, _, bytes), r) in written.iter().zip(&parsed) {
            prop_assert_eq!(bytes_of(env.data, r), &bytes[..]);
        }
    }
}
