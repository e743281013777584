//! Base64 payloads decoded while the body is parsed, straight into whole words (SIMD where
//! the CPU has it), so packed tensors and field elements become typed vectors without a
//! copy; and base64 answers written as finished JSON strings.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytemuck::Pod;
use serde_json::value::RawValue;

/// Decoded bytes held in words of `W` (`u32` for packed f32, `u64` for field elements):
/// `len` bytes, the last word zero-padded.
#[derive(Clone, Debug)]
pub struct PackedWords<W> {
    pub words: Vec<W>,
    pub len: usize,
}

impl<W: Pod> PackedWords<W> {
    /// Standard base64 with padding, or why not (the scalar decoder names the offset).
    pub fn decode(text: &str) -> Result<Self, String> {
        let decode = || {
            let len = base64_simd::STANDARD.decoded_length(text.as_bytes()).ok()?;
            let mut words = vec![W::zeroed(); len.div_ceil(size_of::<W>())];
            let out = &mut bytemuck::cast_slice_mut(&mut words)[..len];
            let done = base64_simd::STANDARD
                .decode(text.as_bytes(), base64_simd::Out::from_slice(out))
                .ok()?
                .len();
            (done == len).then_some(PackedWords { words, len })
        };
        decode().ok_or_else(|| scalar_refusal(text))
    }

    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// Why `text` is not standard base64 with padding. The SIMD decoder does not say what
/// is wrong; the scalar one names the offset.
fn scalar_refusal(text: &str) -> String {
    match B64.decode(text) {
        Err(e) => e.to_string(),
        Ok(_) => "not canonical standard base64".into(),
    }
}

/// `bytes` as a JSON string of standard base64 with padding (SIMD where the CPU has it).
/// A finished JSON string: base64 needs no escaping, and serde's string writer would
/// otherwise check each of a large answer's bytes.
pub fn base64_json_string(bytes: &[u8]) -> Box<RawValue> {
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4 + 2);
    text.push('"');
    base64_simd::STANDARD.encode_append(bytes, &mut text);
    text.push('"');
    RawValue::from_string(text).expect("base64 in quotes is a JSON string")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_into_words_and_names_bad_input() {
        let words = PackedWords::<u64>::decode(&B64.encode([1u8, 2, 3, 4, 5, 6, 7, 8, 9])).unwrap();
        assert_eq!((words.len, words.words.len()), (9, 2));
        assert_eq!(words.bytes(), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(words.words[1], 9, "the last word is zero-padded");
        let err = PackedWords::<u32>::decode("AAA*").unwrap_err();
        assert!(err.contains("offset 3"), "{err}");
        assert_eq!(base64_json_string(&[255, 0]).get(), "\"/wA=\"");
    }
}
