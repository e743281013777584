//! What the ops' unit tests share.

/// Deterministic values in ±[2^-6, 4), of every sign and spread over eight binades:
/// clear of f16's subnormals, where relative error bounds do not hold.
pub fn spread_values(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let unit = (s >> 11) as f64 / (1u64 << 53) as f64;
            let magnitude = 2f64.powf(-6.0 + 8.0 * unit);
            if s & 1 == 0 {
                magnitude
            } else {
                -magnitude
            }
        })
        .collect()
}
