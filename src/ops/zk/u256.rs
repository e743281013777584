//! 256-bit unsigned integers as they travel over the wire: decimal or `0x` hex text.
//! Hand-written because this is the hot path of every JSON request (millions of
//! elements), and it allocates nothing per element.

use std::cmp::Ordering;
use std::fmt;

/// Little-endian 64-bit limbs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct U256(pub [u64; 4]);

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty string")]
    Empty,
    #[error("invalid digit {0:?}")]
    InvalidDigit(char),
    #[error("value does not fit in 256 bits")]
    Overflow,
}

const TEN_POW_19: u64 = 10_000_000_000_000_000_000;

impl U256 {
    pub const ZERO: U256 = U256([0; 4]);

    pub fn from_u64(v: u64) -> Self {
        U256([v, 0, 0, 0])
    }

    /// Little-endian bytes, up to 32.
    pub fn from_le_slice(bytes: &[u8]) -> Self {
        let mut b = [0u8; 32];
        b[..bytes.len()].copy_from_slice(bytes);
        U256(std::array::from_fn(|i| {
            u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
        }))
    }

    pub fn to_le_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, limb) in self.0.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&limb.to_le_bytes());
        }
        b
    }

    /// Decimal digits, or hex digits after a `0x`/`0X` prefix. No sign, no spaces.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) => Self::parse_hex(hex),
            None => Self::parse_decimal(s),
        }
    }

    /// Decimal digits of a value below 2^64, as the word itself; `None` for anything else
    /// (hex, longer or larger values, bad digits), which `parse` then reads or refuses.
    /// The common case of a small field's element, without building a 256-bit value.
    pub fn parse_u64_decimal(s: &str) -> Option<u64> {
        let d = s.as_bytes();
        match d.len() {
            1..=16 => digits_to_u64(d),
            // Most elements of a 64-bit field have 19 or 20 digits: three blocks of eight,
            // the first the leading 1–4 digits behind zeros, so no digit is read alone
            // and no loop's length depends on the value.
            17..=20 => {
                let lead = d.len() - 16;
                let first = u64::from_le_bytes(d[..8].try_into().expect("8 bytes"));
                // The string's first byte is the block's least significant: move the
                // leading digits to the top bytes and fill the bottom ones with '0'.
                let padded = (first << (8 * (8 - lead))) | (ZERO_DIGITS >> (8 * lead));
                let high = block_to_u64(padded)?;
                let middle = block_to_u64(u64::from_le_bytes(
                    d[lead..lead + 8].try_into().expect("8 bytes"),
                ))?;
                let low = block_to_u64(u64::from_le_bytes(
                    d[lead + 8..].try_into().expect("8 bytes"),
                ))?;
                high.checked_mul(10_000_000_000_000_000)?
                    .checked_add(middle * 100_000_000 + low)
            }
            _ => None,
        }
    }

    fn parse_decimal(s: &str) -> Result<Self, ParseError> {
        if s.is_empty() {
            return Err(ParseError::Empty);
        }
        let bad_digit = || {
            let c = s.chars().find(|c| !c.is_ascii_digit()).unwrap_or('?');
            ParseError::InvalidDigit(c)
        };
        // Most values have at most 19 digits, and every Goldilocks element at most 20:
        // up to 38 the value is a u128 built from two 19-digit halves.
        let d = s.as_bytes();
        if d.len() <= 19 {
            return digits_to_u64(d).map(U256::from_u64).ok_or_else(bad_digit);
        }
        if d.len() <= 38 {
            let (high, low) = d.split_at(d.len() - 19);
            let (high, low) = digits_to_u64(high)
                .zip(digits_to_u64(low))
                .ok_or_else(bad_digit)?;
            let v = u128::from(high) * u128::from(TEN_POW_19) + u128::from(low);
            return Ok(U256([v as u64, (v >> 64) as u64, 0, 0]));
        }
        let mut acc = U256::ZERO;
        for chunk in d.chunks(19) {
            let v = digits_to_u64(chunk).ok_or_else(bad_digit)?;
            acc = acc
                .mul_small_add(10u64.pow(chunk.len() as u32), v)
                .ok_or(ParseError::Overflow)?;
        }
        Ok(acc)
    }

    fn parse_hex(s: &str) -> Result<Self, ParseError> {
        if s.is_empty() {
            return Err(ParseError::Empty);
        }
        let digits = s.trim_start_matches('0');
        if digits.len() > 64 {
            // Validate the digits first so a bad character wins over a long string.
            if let Some(c) = s.chars().find(|c| !c.is_ascii_hexdigit()) {
                return Err(ParseError::InvalidDigit(c));
            }
            return Err(ParseError::Overflow);
        }
        let mut limbs = [0u64; 4];
        for (i, c) in digits.bytes().rev().enumerate() {
            let d = (c as char)
                .to_digit(16)
                .ok_or(ParseError::InvalidDigit(c as char))?;
            limbs[i / 16] |= u64::from(d) << (4 * (i % 16));
        }
        Ok(U256(limbs))
    }

    /// self * m + add, or None on overflow.
    fn mul_small_add(self, m: u64, add: u64) -> Option<Self> {
        let mut out = [0u64; 4];
        let mut carry = u128::from(add);
        for (o, &l) in out.iter_mut().zip(&self.0) {
            let t = u128::from(l) * u128::from(m) + carry;
            *o = t as u64;
            carry = t >> 64;
        }
        (carry == 0).then_some(U256(out))
    }

    /// (self / d, self % d)
    fn div_rem_small(self, d: u64) -> (Self, u64) {
        let mut out = [0u64; 4];
        let mut rem = 0u128;
        for i in (0..4).rev() {
            let cur = (rem << 64) | u128::from(self.0[i]);
            out[i] = (cur / u128::from(d)) as u64;
            rem = cur % u128::from(d);
        }
        (U256(out), rem as u64)
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0; 4]
    }

    /// Appends the decimal form to `out`.
    pub fn write_decimal(&self, out: &mut String) {
        use std::fmt::Write;
        // Fast paths: every Goldilocks element fits in 64 bits.
        if self.0[1..] == [0, 0, 0] {
            out.push_str(itoa::Buffer::new().format(self.0[0]));
            return;
        }
        if self.0[2..] == [0, 0] {
            let v = u128::from(self.0[0]) | (u128::from(self.0[1]) << 64);
            out.push_str(itoa::Buffer::new().format(v));
            return;
        }
        // 2^256 < 10^78, so at most five 19-digit chunks.
        let mut chunks = [0u64; 5];
        let mut n = 0;
        let mut v = *self;
        loop {
            let (q, r) = v.div_rem_small(TEN_POW_19);
            chunks[n] = r;
            n += 1;
            v = q;
            if v.is_zero() {
                break;
            }
        }
        let _ = write!(out, "{}", chunks[n - 1]);
        for c in chunks[..n - 1].iter().rev() {
            let _ = write!(out, "{c:019}");
        }
    }

    /// Appends `0x` and the shortest lowercase hex form to `out`.
    pub fn write_hex(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str("0x");
        match self.0.iter().rposition(|&l| l != 0) {
            None => out.push('0'),
            Some(top) => {
                let _ = write!(out, "{:x}", self.0[top]);
                for l in self.0[..top].iter().rev() {
                    let _ = write!(out, "{l:016x}");
                }
            }
        }
    }
}

/// The value of at most 19 ASCII decimal digits, or None if one is not a digit. Eight
/// digits at a time in one 64-bit word (the SWAR method of fast_float and simdjson).
fn digits_to_u64(digits: &[u8]) -> Option<u64> {
    debug_assert!(digits.len() <= 19);
    let mut v = 0u64;
    let mut blocks = digits.chunks_exact(8);
    for block in &mut blocks {
        let w = u64::from_le_bytes(block.try_into().expect("8 bytes"));
        v = v * 100_000_000 + block_to_u64(w)?;
    }
    for &c in blocks.remainder() {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(c - b'0');
    }
    Some(v)
}

/// Eight ASCII '0's, one a byte.
const ZERO_DIGITS: u64 = 0x3030_3030_3030_3030;

/// The value of eight ASCII digits read as a little-endian word (the first digit in the
/// lowest byte), or `None` if any byte is not a digit.
fn block_to_u64(w: u64) -> Option<u64> {
    // A byte below '0' sets its top bit in the difference, one above '9' in the sum.
    let (below, above) = (
        w.wrapping_sub(ZERO_DIGITS),
        w.wrapping_add(0x4646_4646_4646_4646),
    );
    if (below | above) & 0x8080_8080_8080_8080 != 0 {
        return None;
    }
    // Pairs, then quadruples, then all eight, most significant digit first.
    let pairs = below.wrapping_mul(10).wrapping_add(below >> 8);
    const MASK: u64 = 0x0000_00ff_0000_00ff;
    let quads = (pairs & MASK).wrapping_mul(100 + (1_000_000 << 32))
        + ((pairs >> 16) & MASK).wrapping_mul(1 + (10_000 << 32));
    Some((quads >> 32) as u32 as u64)
}

impl Ord for U256 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.iter().rev().cmp(other.0.iter().rev())
    }
}

impl PartialOrd for U256 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for U256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::with_capacity(80);
        self.write_decimal(&mut s);
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digit_blocks_parse_like_a_digit_loop() {
        let naive = |d: &[u8]| -> Option<u64> {
            d.iter().try_fold(0u64, |v, &c| {
                c.is_ascii_digit().then(|| v * 10 + u64::from(c - b'0'))
            })
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 20) as usize;
            let mut d: Vec<u8> = (0..len)
                .map(|k| b'0' + ((x >> (k * 3)) % 10) as u8)
                .collect();
            if x % 5 == 0 && len > 0 {
                // One byte just outside the digits, or far outside.
                let bad = [b'/', b':', b' ', 0x80, 0xff, b'a'][(x >> 60) as usize % 6];
                d[(x >> 40) as usize % len] = bad;
            }
            assert_eq!(
                digits_to_u64(&d),
                naive(&d),
                "{:?}",
                String::from_utf8_lossy(&d)
            );
        }
        assert_eq!(
            digits_to_u64(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(digits_to_u64(b""), Some(0));
    }

    #[test]
    fn the_word_parse_agrees_with_the_full_parse_or_declines() {
        let cases = [
            "0",
            "7",
            "0000000000000000000000000000001", // leading zeros past 20 digits: declined
            "9999999999999999999",
            "10000000000000000000",
            "18446744073709551615", // 2^64 - 1
            "18446744073709551616", // 2^64: overflows the word
            "12345678901234567",
            "1234567890123456x",
            "x2345678901234567",
            "1a446744073709551615",
            "/8446744073709551615",
            "184:6744073709551615",
            "1844674407370955161",
            "0000000000000000000",
            "99999999999999999999",
            "1844674407370955161a",
            "184467440737095516:5",
            "0x10",
            "",
            "-1",
            "340282366920938463463374607431768211455",
        ];
        for s in cases {
            let word = U256::parse_u64_decimal(s);
            match U256::parse(s) {
                Ok(v) if v.0[1..] == [0, 0, 0] && s.len() <= 20 && !s.starts_with("0x") => {
                    assert_eq!(word, Some(v.0[0]), "{s}")
                }
                _ => assert_eq!(word, None, "{s}"),
            }
        }
    }

    /// One bad character at each position of every length the word parse reads (in the
    /// padded leading block, the bytes shifted out of it, the middle and the last block).
    #[test]
    fn the_word_parse_declines_a_bad_character_anywhere() {
        for len in 1..=20usize {
            for at in 0..len {
                for bad in ["/", ":", "a", " ", "é", "\u{7f}"] {
                    let mut text = "1".repeat(len); // below 2^64 at every length
                    text.replace_range(at..at + 1, bad);
                    assert_eq!(U256::parse_u64_decimal(&text), None, "{text:?}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn every_word_parses_to_itself(v in any::<u64>(), bits in 1u32..=64, zeros in 0usize..3) {
            let v = v >> (64 - bits); // every length of digits, not mostly 19 and 20
            let text = format!("{}{v}", "0".repeat(zeros));
            let expected = (text.len() <= 20).then_some(v);
            prop_assert_eq!(U256::parse_u64_decimal(&text), expected);
        }
    }

    use num_bigint::BigUint;
    use proptest::prelude::*;

    fn to_big(v: U256) -> BigUint {
        BigUint::from_slice(
            &v.0.iter()
                .flat_map(|l| [*l as u32, (*l >> 32) as u32])
                .collect::<Vec<_>>(),
        )
    }

    proptest! {
        #[test]
        fn decimal_and_hex_round_trip_through_an_independent_bigint(limbs in any::<[u64; 4]>()) {
            let v = U256(limbs);
            let big = to_big(v);
            let mut dec = String::new();
            v.write_decimal(&mut dec);
            prop_assert_eq!(&dec, &big.to_str_radix(10));
            prop_assert_eq!(U256::parse(&dec).unwrap(), v);
            let mut hex = String::new();
            v.write_hex(&mut hex);
            prop_assert_eq!(&hex, &format!("0x{}", big.to_str_radix(16)));
            prop_assert_eq!(U256::parse(&hex).unwrap(), v);
        }
    }

    proptest! {
        #[test]
        fn values_of_64_and_128_bits_take_the_fast_paths_correctly(small in any::<u64>(), mid in any::<u128>()) {
            for v in [U256([small, 0, 0, 0]), U256([mid as u64, (mid >> 64) as u64, 0, 0])] {
                let mut dec = String::new();
                v.write_decimal(&mut dec);
                prop_assert_eq!(&dec, &to_big(v).to_str_radix(10));
                prop_assert_eq!(U256::parse(&dec).unwrap(), v);
            }
        }
    }

    #[test]
    fn edge_values_format_and_parse() {
        assert_eq!(U256::parse("0").unwrap(), U256::ZERO);
        assert_eq!(U256::parse("0x0").unwrap(), U256::ZERO);
        assert_eq!(U256::parse("000123").unwrap(), U256::from_u64(123));
        assert_eq!(U256::parse("0X00ff").unwrap(), U256::from_u64(255));
        let max = U256([u64::MAX; 4]);
        assert_eq!(U256::parse(&max.to_string()).unwrap(), max);
        let mut hex = String::new();
        U256::ZERO.write_hex(&mut hex);
        assert_eq!(hex, "0x0");
    }

    #[test]
    fn rejects_malformed_and_oversized_text() {
        assert_eq!(U256::parse(""), Err(ParseError::Empty));
        assert_eq!(U256::parse("0x"), Err(ParseError::Empty));
        assert_eq!(U256::parse("-1"), Err(ParseError::InvalidDigit('-')));
        assert_eq!(U256::parse("12a"), Err(ParseError::InvalidDigit('a')));
        assert_eq!(U256::parse("0xg"), Err(ParseError::InvalidDigit('g')));
        assert_eq!(U256::parse(" 1"), Err(ParseError::InvalidDigit(' ')));
        // 2^256 exactly
        let two_256 =
            "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        assert_eq!(U256::parse(two_256), Err(ParseError::Overflow));
        assert_eq!(
            U256::parse(&format!("0x1{}", "0".repeat(64))),
            Err(ParseError::Overflow)
        );
        assert_eq!(
            U256::parse(&format!("0x{}", "0".repeat(70))).unwrap(),
            U256::ZERO
        );
    }
}
