// Privacy noise, identical on the CPU and the GPU.
//
// Randomness: ChaCha20 (RFC 8439 block function) keyed per request; element i of a
// release reads its own stream (nonce = domain, i), so any thread or device that draws
// element i draws the same bits. Bits are consumed LSB-first from the stream's 32-bit
// words.
//
// Samplers: Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy"
// (2020), Algorithms 1-3, in exact integer arithmetic: no floating point touches a
// probability, so the floating-point attacks on textbook samplers (Mironov 2012) have
// nothing to work on. Callers snap values to a power-of-two grid first.
//
// Host C++ as well as CUDA: kernels/host/dp_host.cpp compiles this file for the host and
// the Rust twin (src/ops/dp/noise.rs) is checked against it bit for bit.
#ifndef GPU_OPS_DP_NOISE_CUH
#define GPU_OPS_DP_NOISE_CUH

#include "common.cuh"

typedef long long i64;
typedef unsigned __int128 u128;

// Larger |Y| from the Laplace proposal is rejected outright: for every scale the
// service allows (t < 2^32) its acceptance probability is below exp(-2^17).
#define DP_MAX_ABS_NOISE (1ull << 40)

#define DP_ROTL(v, n) (((v) << (n)) | ((v) >> (32 - (n))))
#define DP_QR(a, b, c, d)                                                                 \
    a += b; d ^= a; d = DP_ROTL(d, 16);                                                   \
    c += d; b ^= c; b = DP_ROTL(b, 12);                                                   \
    a += b; d ^= a; d = DP_ROTL(d, 8);                                                    \
    c += d; b ^= c; b = DP_ROTL(b, 7);

FIELD_FN void dp_chacha20_block(const u32 key[8], u32 counter, u32 n0, u32 n1, u32 n2,
                                u32 out[16]) {
    u32 x[16];
    x[0] = 0x61707865u; x[1] = 0x3320646eu; x[2] = 0x79622d32u; x[3] = 0x6b206574u;
    for (int i = 0; i < 8; i++) x[4 + i] = key[i];
    x[12] = counter; x[13] = n0; x[14] = n1; x[15] = n2;
    u32 s[16];
    for (int i = 0; i < 16; i++) s[i] = x[i];
    for (int round = 0; round < 10; round++) {
        DP_QR(s[0], s[4], s[8], s[12]) DP_QR(s[1], s[5], s[9], s[13])
        DP_QR(s[2], s[6], s[10], s[14]) DP_QR(s[3], s[7], s[11], s[15])
        DP_QR(s[0], s[5], s[10], s[15]) DP_QR(s[1], s[6], s[11], s[12])
        DP_QR(s[2], s[7], s[8], s[13]) DP_QR(s[3], s[4], s[9], s[14])
    }
    for (int i = 0; i < 16; i++) out[i] = s[i] + x[i];
}

typedef struct {
    u32 key[8];
    u32 domain;
    u64 index;
    u32 block;
    u32 next_word;
    u32 avail;
    u64 buf;
    u32 words[16];
} dp_bits;

FIELD_FN void dp_bits_init(dp_bits *s, const u32 key[8], u32 domain, u64 index) {
    for (int i = 0; i < 8; i++) s->key[i] = key[i];
    s->domain = domain;
    s->index = index;
    s->block = 0;
    s->next_word = 16;
    s->avail = 0;
    s->buf = 0;
}

FIELD_FN u32 dp_next_word(dp_bits *s) {
    if (s->next_word == 16) {
        dp_chacha20_block(s->key, s->block, s->domain, (u32)s->index, (u32)(s->index >> 32),
                          s->words);
        s->block++;
        s->next_word = 0;
    }
    return s->words[s->next_word++];
}

// The next k bits of the stream, 1 <= k <= 32; the first bit drawn is the lowest.
FIELD_FN u32 dp_take(dp_bits *s, u32 k) {
    if (s->avail < k) {
        s->buf |= (u64)dp_next_word(s) << s->avail;
        s->avail += 32;
    }
    u32 r = (u32)(s->buf & (k == 32 ? 0xffffffffull : ((1ull << k) - 1)));
    s->buf >>= k;
    s->avail -= k;
    return r;
}

// Uniform on {0, ..., t-1}, t >= 1, by rejection over the fewest bits that cover t.
FIELD_FN u64 dp_uniform(dp_bits *s, u64 t) {
    if (t <= 1) return 0;
    u32 bits = 0;
    while (bits < 64 && ((t - 1) >> bits) != 0) bits++;
    for (;;) {
        u64 u;
        if (bits <= 32) {
            u = dp_take(s, bits);
        } else {
            u64 lo = dp_take(s, 32);
            u = lo | ((u64)dp_take(s, bits - 32) << 32);
        }
        if (u < t) return u;
    }
}

// Bernoulli(n/m) for m < 2^127: compares a uniform's binary expansion with n/m's,
// bit by bit, until they differ (two bits expected).
FIELD_FN int dp_bernoulli(dp_bits *s, u128 n, u128 m) {
    if (n >= m) return 1;
    if (n == 0) return 0;
    u128 rem = n;
    for (;;) {
        rem <<= 1;
        int p_bit = rem >= m;
        if (p_bit) rem -= m;
        int u_bit = (int)dp_take(s, 1);
        if (u_bit != p_bit) return u_bit < p_bit;
        if (rem == 0) return 0;
    }
}

// Bernoulli(exp(-n/m)) for 0 <= n/m <= 1 (CKS20 Algorithm 1).
FIELD_FN int dp_bernoulli_exp_unit(dp_bits *s, u128 n, u128 m) {
    u64 k = 1;
    // P(k > 40) < 1/40!, so the cap never binds; it only bounds m * k.
    while (k < 64 && dp_bernoulli(s, n, m * k)) k++;
    return (int)(k & 1);
}

// n / m for m >= 1, and n % m in *rem, by shift and subtract. The u128 `/` is a libcall
// (__udivti3) that AMD's device compiler in LLVM 15 cannot legalise (HIP, issue "AMD
// GPUs"); this is the same quotient and remainder on every compiler. Operands that fit
// 64 bits, the common case, take the native 64-bit division.
FIELD_FN u128 dp_divmod_u128(u128 n, u128 m, u128 *rem) {
    if ((n >> 64) == 0 && (m >> 64) == 0) {
        u64 a = (u64)n, b = (u64)m;
        *rem = a % b;
        return a / b;
    }
    u128 q = 0;
    if (m <= n) {
        // m shifted up to n's leading bit, then one quotient bit per step back down.
        u128 d = m;
        int shift = 0;
        while ((d >> 127) == 0 && (d << 1) <= n) {
            d <<= 1;
            shift++;
        }
        for (; shift >= 0; shift--) {
            q <<= 1;
            if (n >= d) {
                n -= d;
                q |= 1;
            }
            d >>= 1;
        }
    }
    *rem = n;
    return q;
}

// Bernoulli(exp(-n/m)) for any n/m >= 0.
FIELD_FN int dp_bernoulli_exp(dp_bits *s, u128 n, u128 m) {
    u128 part;
    u128 whole = dp_divmod_u128(n, m, &part);
    for (u128 i = 0; i < whole; i++) {
        if (!dp_bernoulli_exp_unit(s, 1, 1)) return 0;
    }
    return dp_bernoulli_exp_unit(s, part, m);
}

// Discrete Laplace: P(y) proportional to exp(-|y| / t), t >= 1 (CKS20 Algorithm 2, s = 1).
FIELD_FN i64 dp_discrete_laplace(dp_bits *s, u64 t) {
    for (;;) {
        u64 u = dp_uniform(s, t);
        if (!dp_bernoulli_exp_unit(s, u, t)) continue;
        u64 v = 0;
        while (dp_bernoulli_exp_unit(s, 1, 1)) v++;
        u64 y = u + t * v;
        u32 negative = dp_take(s, 1);
        if (negative && y == 0) continue;
        return negative ? -(i64)y : (i64)y;
    }
}

// Discrete Gaussian with variance parameter sigma^2 = t * c (CKS20 Algorithm 3). Writing
// sigma^2 as t * c makes sigma^2 / t = c an integer, so the acceptance test
// exp(-(|y| - c)^2 / (2 t c)) stays in exact integers; t near sigma keeps it efficient.
FIELD_FN i64 dp_discrete_gaussian(dp_bits *s, u64 t, u64 c) {
    u128 den = (u128)2 * t * c;
    for (;;) {
        i64 y = dp_discrete_laplace(s, t);
        u64 mag = y < 0 ? (u64)(-y) : (u64)y;
        if (mag > DP_MAX_ABS_NOISE) continue;
        u128 diff = mag >= c ? (u128)(mag - c) : (u128)(c - mag);
        if (dp_bernoulli_exp(s, diff * diff, den)) return y;
    }
}

// Stream domains: one request key never feeds two mechanisms the same bits.
#define DP_DOMAIN_GAUSSIAN 1u
#define DP_DOMAIN_LAPLACE 2u

// The release of one snapped value: round(x / grid) + noise, back on the grid. `inv_grid`
// and `grid` are exact powers of two, so only rint and the final conversion round.
FIELD_FN double dp_release(i64 snapped, i64 noise, double grid) {
    return DMUL((double)(snapped + noise), grid);
}

#endif
