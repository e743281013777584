//! The kernels' noise samplers (kernels/dp_noise.cuh), compiled for the host by build.rs,
//! against RFC 8439 and the Rust twin: the same C the GPU runs, checked without a GPU.

use super::noise::{BitStream, NoiseKey, DOMAIN_GAUSSIAN, DOMAIN_LAPLACE};

extern "C" {
    fn gpu_ops_host_chacha20_block(
        key: *const u32,
        counter: u32,
        n0: u32,
        n1: u32,
        n2: u32,
        out: *mut u32,
    );
    fn gpu_ops_host_dp_noise(
        kind: i32,
        key: *const u32,
        domain: u32,
        first: u64,
        n: usize,
        t: u64,
        c: u64,
        out: *mut i64,
    );
    fn gpu_ops_host_dp_divmod_u128(n_lo: u64, n_hi: u64, m_lo: u64, m_hi: u64, out: *mut u64);
}

/// The kernels' u128 division (`dp_divmod_u128`, written for compilers without the
/// `__udivti3` libcall) as the host runs it.
fn host_divmod(n: u128, m: u128) -> (u128, u128) {
    let mut out = [0u64; 4];
    // SAFETY: out has the 4 words the function writes.
    unsafe {
        gpu_ops_host_dp_divmod_u128(
            n as u64,
            (n >> 64) as u64,
            m as u64,
            (m >> 64) as u64,
            out.as_mut_ptr(),
        )
    };
    let word = |lo: u64, hi: u64| (hi as u128) << 64 | lo as u128;
    (word(out[0], out[1]), word(out[2], out[3]))
}

#[test]
fn the_kernels_u128_division_is_rusts() {
    let edges = [
        0u128,
        1,
        2,
        3,
        u64::MAX as u128 - 1,
        u64::MAX as u128,
        u64::MAX as u128 + 1,
        1 << 100,
        (1 << 127) - 1,
        1 << 127,
        u128::MAX - 1,
        u128::MAX,
    ];
    let mut state = 0x243f_6a88_85a3_08d3u64;
    let mut next = || {
        // splitmix64: reproducible operands of every size.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut cases: Vec<(u128, u128)> = Vec::new();
    for &n in &edges {
        for &m in edges.iter().filter(|&&m| m > 0) {
            cases.push((n, m));
        }
    }
    for _ in 0..20_000 {
        let (a, b, c, d) = (next(), next(), next(), next());
        let n = ((a as u128) << 64 | b as u128) >> (c % 128);
        let m = (((d as u128) << 64 | c as u128) >> (a % 128)).max(1);
        cases.push((n, m));
    }
    for (n, m) in cases {
        assert_eq!(host_divmod(n, m), (n / m, n % m), "{n} / {m}");
    }
}

#[test]
fn chacha20_block_matches_rfc8439_section_2_3_2() {
    let key: [u32; 8] = std::array::from_fn(|i| {
        u32::from_le_bytes([
            4 * i as u8,
            4 * i as u8 + 1,
            4 * i as u8 + 2,
            4 * i as u8 + 3,
        ])
    });
    let mut out = [0u32; 16];
    // SAFETY: key has 8 words, out 16.
    unsafe {
        gpu_ops_host_chacha20_block(
            key.as_ptr(),
            1,
            0x0900_0000,
            0x4a00_0000,
            0,
            out.as_mut_ptr(),
        )
    };
    let want = [
        0xe4e7f110, 0x15593bd1, 0x1fdd0f50, 0xc47120a3, 0xc7f4d1c7, 0x0368c033, 0x9aaa2204,
        0x4e6cd4c3, 0x466482d2, 0x09aa9f07, 0x05d7c214, 0xa2028bd9, 0xd19c12b5, 0xb94e16de,
        0xe883d0cb, 0x4e3c50a2,
    ];
    assert_eq!(out, want);
}

fn host(kind: i32, key: &NoiseKey, domain: u32, first: u64, n: usize, t: u64, c: u64) -> Vec<i64> {
    let mut out = vec![0i64; n];
    let words = key.words();
    // SAFETY: key has 8 words; out has n elements.
    unsafe {
        gpu_ops_host_dp_noise(
            kind,
            words.as_ptr(),
            domain,
            first,
            n,
            t,
            c,
            out.as_mut_ptr(),
        )
    };
    out
}

#[test]
fn samplers_match_the_rust_twin_bit_for_bit() {
    let keys = [
        NoiseKey([0; 32]),
        NoiseKey::from_seed(1),
        NoiseKey::from_seed(0xdead_beef),
    ];
    // (t, c): small, typical (2^20 steps) and the largest plans the service makes.
    let gaussian = [
        (1, 1),
        (2, 3),
        (1_048_577, 1_048_576),
        (2_147_483_649, 2_147_483_647),
    ];
    let laplace = [1u64, 3, 1 << 20, (1 << 50) - 1];
    for key in &keys {
        for first in [0u64, (1 << 32) - 5] {
            for &(t, c) in &gaussian {
                let got = host(0, key, DOMAIN_GAUSSIAN, first, 500, t, c);
                let want: Vec<i64> = (0..500)
                    .map(|i| {
                        BitStream::new(key, DOMAIN_GAUSSIAN, first + i).discrete_gaussian(t, c)
                    })
                    .collect();
                assert_eq!(got, want, "gaussian t={t} c={c}");
            }
            for &t in &laplace {
                let got = host(1, key, DOMAIN_LAPLACE, first, 500, t, 0);
                let want: Vec<i64> = (0..500)
                    .map(|i| BitStream::new(key, DOMAIN_LAPLACE, first + i).discrete_laplace(t))
                    .collect();
                assert_eq!(got, want, "laplace t={t}");
            }
        }
    }
}
