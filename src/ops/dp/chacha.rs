//! ChaCha20's block function (RFC 8439 §2.3) for many streams at once: the noise of
//! element i reads its own stream (nonce (domain, i)), so the first blocks of `LANES`
//! consecutive elements are independent and computed together, word-sliced: each state
//! word holds one lane per stream, and every step of a round is the same operation across
//! the lanes, which the compiler turns into vector instructions (AVX2 where the CPU has
//! it, chosen at run time; SSE2 otherwise). The words are exactly the `chacha20` crate's
//! keystream (tests below), and so the kernels' (`kernels/dp_noise.cuh`).

/// Streams whose first blocks are computed in one call.
pub const LANES: usize = 8;

/// "expand 32-byte k".
const SIGMA: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];

/// The 96-bit nonce of element `index` in `domain`: the domain's 4 bytes, then the
/// index's 8, little-endian.
pub fn nonce(domain: u32, index: u64) -> [u32; 3] {
    [domain, index as u32, (index >> 32) as u32]
}

/// Block `counter` of one stream, as 16 little-endian keystream words.
pub fn block(key: &[u32; 8], counter: u32, nonce: [u32; 3]) -> [u32; 16] {
    blocks_sliced::<1>(key, counter, &[nonce])[0]
}

/// Block `counter` of `LANES` streams at once.
pub fn blocks(key: &[u32; 8], counter: u32, nonces: &[[u32; 3]; LANES]) -> [[u32; 16]; LANES] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { blocks_avx2(key, counter, nonces) };
    }
    blocks_sliced::<LANES>(key, counter, nonces)
}

/// The same code compiled with AVX2 enabled: eight 32-bit lanes per instruction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn blocks_avx2(
    key: &[u32; 8],
    counter: u32,
    nonces: &[[u32; 3]; LANES],
) -> [[u32; 16]; LANES] {
    blocks_sliced::<LANES>(key, counter, nonces)
}

#[inline(always)]
fn blocks_sliced<const N: usize>(
    key: &[u32; 8],
    counter: u32,
    nonces: &[[u32; 3]; N],
) -> [[u32; 16]; N] {
    let mut start = [[0u32; N]; 16];
    for (w, word) in start.iter_mut().enumerate() {
        for (lane, x) in word.iter_mut().enumerate() {
            *x = match w {
                0..=3 => SIGMA[w],
                4..=11 => key[w - 4],
                12 => counter,
                _ => nonces[lane][w - 13],
            };
        }
    }
    let mut x = start;
    for _ in 0..10 {
        quarter_round(&mut x, 0, 4, 8, 12);
        quarter_round(&mut x, 1, 5, 9, 13);
        quarter_round(&mut x, 2, 6, 10, 14);
        quarter_round(&mut x, 3, 7, 11, 15);
        quarter_round(&mut x, 0, 5, 10, 15);
        quarter_round(&mut x, 1, 6, 11, 12);
        quarter_round(&mut x, 2, 7, 8, 13);
        quarter_round(&mut x, 3, 4, 9, 14);
    }
    let mut out = [[0u32; 16]; N];
    for (w, (word, first)) in x.iter().zip(&start).enumerate() {
        for lane in 0..N {
            out[lane][w] = word[lane].wrapping_add(first[lane]);
        }
    }
    out
}

#[inline(always)]
fn quarter_round<const N: usize>(x: &mut [[u32; N]; 16], a: usize, b: usize, c: usize, d: usize) {
    let (mut va, mut vb, mut vc, mut vd) = (x[a], x[b], x[c], x[d]);
    for l in 0..N {
        va[l] = va[l].wrapping_add(vb[l]);
        vd[l] = (vd[l] ^ va[l]).rotate_left(16);
        vc[l] = vc[l].wrapping_add(vd[l]);
        vb[l] = (vb[l] ^ vc[l]).rotate_left(12);
        va[l] = va[l].wrapping_add(vb[l]);
        vd[l] = (vd[l] ^ va[l]).rotate_left(8);
        vc[l] = vc[l].wrapping_add(vd[l]);
        vb[l] = (vb[l] ^ vc[l]).rotate_left(7);
    }
    (x[a], x[b], x[c], x[d]) = (va, vb, vc, vd);
}

#[cfg(test)]
mod tests {
    use super::*;
    use chacha20::cipher::{KeyIvInit, StreamCipher, StreamCipherSeek};
    use chacha20::ChaCha20;

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// The `chacha20` crate's keystream block `counter` for (key, nonce).
    fn crate_block(key: &[u8; 32], counter: u32, nonce: [u32; 3]) -> Vec<u32> {
        let nonce: Vec<u8> = nonce.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut c = ChaCha20::new(key.into(), nonce.as_slice().into());
        c.seek(u64::from(counter) * 64);
        let mut block = [0u8; 64];
        c.apply_keystream(&mut block);
        words(&block)
    }

    #[test]
    fn rfc_8439_block_test_vector() {
        // §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1.
        let key: [u8; 32] = std::array::from_fn(|i| i as u8);
        let key = words(&key).try_into().unwrap();
        let out = block(&key, 1, [0x0900_0000, 0x4a00_0000, 0]);
        assert_eq!(out[0], 0xe4e7_f110);
        assert_eq!(out[1], 0x1559_3bd1);
        assert_eq!(out[15], 0x4e3c_50a2);
    }

    #[test]
    fn lanes_equal_the_chacha20_crate_for_every_stream_and_counter() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20 {
            let key_bytes: [u8; 32] = std::array::from_fn(|_| next() as u8);
            let key: [u32; 8] = words(&key_bytes).try_into().unwrap();
            let first = next() >> 1;
            let domain = next() as u32;
            let nonces: [[u32; 3]; LANES] =
                std::array::from_fn(|l| nonce(domain, first.wrapping_add(l as u64)));
            for counter in [0u32, 1, 7, 1 << 31] {
                let lanes = blocks(&key, counter, &nonces);
                let portable = blocks_sliced::<LANES>(&key, counter, &nonces);
                for (l, n) in nonces.iter().enumerate() {
                    let want = crate_block(&key_bytes, counter, *n);
                    assert_eq!(lanes[l].to_vec(), want, "lane {l} counter {counter}");
                    assert_eq!(portable[l].to_vec(), want);
                    assert_eq!(block(&key, counter, *n).to_vec(), want);
                }
            }
        }
    }
}
