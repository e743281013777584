// Beam alignment (src/ops/beams/): multipath channels formed from drawn paths, and the
// sweep of receive × transmit codebooks over a batch of channels, all in f64. Complex
// values are interleaved (re, im). The CPU twins: geometry.rs::form_channels and
// sweep.rs::SweepJob::run_cpu; the launchers: src/ops/beams/gpu.rs.
#include "common.cuh"
#include "rf.cuh"

#define BEAM_PATH_WORDS 6
// beam_best_f64's block (BEST_THREADS in src/ops/beams/gpu.rs), the size of its trees.
// The other kernels are grid-stride loops over DeviceLease::launch_config's blocks.
#define BEAM_BEST_THREADS 256

#define GRID_STRIDE(k, n) \
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < (n); k += (u64)gridDim.x * blockDim.x)

// Each path's phasors: rx[(p·nr + i)] = g·e^{jπ·phase_rx(i)} and tx[(p·nt + j)] =
// e^{jπ·phase_tx(j)} for path p (channel-major), element i = row·cols + column with phase
// column·h + row·v. A path is (g_re, g_im, tx_h, tx_v, rx_h, rx_v).
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    beam_steering_f64(const double *paths, u64 total_paths, u64 rx_cols, u64 nr, u64 tx_cols,
                      u64 nt, double *rx, double *tx) {
    u64 per = nr + nt;
    GRID_STRIDE(k, total_paths * per) {
        u64 p = k / per, e = k % per;
        const double *w = paths + BEAM_PATH_WORDS * p;
        double s, c;
        if (e < nr) {
            double phase = (double)(e % rx_cols) * w[4] + (double)(e / rx_cols) * w[5];
            RF_SINCOSPI(phase, &s, &c);
            rx[2 * (p * nr + e)] = w[0] * c - w[1] * s;
            rx[2 * (p * nr + e) + 1] = w[0] * s + w[1] * c;
        } else {
            e -= nr;
            double phase = (double)(e % tx_cols) * w[2] + (double)(e / tx_cols) * w[3];
            RF_SINCOSPI(phase, &s, &c);
            tx[2 * (p * nt + e)] = c;
            tx[2 * (p * nt + e) + 1] = s;
        }
    }
}

// h[b][i][j] = Σ_l rx[b, l, i]·conj(tx[b, l, j]), paths in order.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    beam_channels_f64(const double *rx, const double *tx, u64 channels, u64 npaths, u64 nr,
                      u64 nt, double *h) {
    GRID_STRIDE(k, channels * nr * nt) {
        u64 b = k / (nr * nt), i = (k / nt) % nr, j = k % nt;
        double re = 0.0, im = 0.0;
        for (u64 l = 0; l < npaths; l++) {
            const double *r = rx + 2 * ((b * npaths + l) * nr + i);
            const double *t = tx + 2 * ((b * npaths + l) * nt + j);
            re += r[0] * t[0] + r[1] * t[1];
            im += r[1] * t[0] - r[0] * t[1];
        }
        h[2 * k] = re;
        h[2 * k + 1] = im;
    }
}

// x[b][i][t] = Σ_j h[b][i][j]·f[t][j]: each transmit beam through the channel.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    beam_project_f64(const double *h, u64 channels, u64 nr, u64 nt, const double *f, u64 kt,
                     double *x) {
    GRID_STRIDE(k, channels * nr * kt) {
        u64 b = k / (nr * kt), i = (k / kt) % nr, t = k % kt;
        const double *hr = h + 2 * (b * nr + i) * nt, *ft = f + 2 * t * nt;
        double re = 0.0, im = 0.0;
        for (u64 j = 0; j < nt; j++) {
            re += hr[2 * j] * ft[2 * j] - hr[2 * j + 1] * ft[2 * j + 1];
            im += hr[2 * j] * ft[2 * j + 1] + hr[2 * j + 1] * ft[2 * j];
        }
        x[2 * k] = re;
        x[2 * k + 1] = im;
    }
}

// power[b][r][t] = |Σ_i conj(w[r][i])·x[b][i][t] + scale[r]·n|², n sample r·kt + t of
// channel b's noise stream (rf.cuh's receiver noise) when `noisy`.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    beam_power_f64(const double *x, u64 channels, u64 nr, u64 kt, const double *w, u64 kr,
                   const u64 *noise_keys, const double *scale, u32 noisy, double *power) {
    GRID_STRIDE(k, channels * kr * kt) {
        u64 b = k / (kr * kt), r = (k / kt) % kr, t = k % kt;
        const double *wr = w + 2 * r * nr, *xb = x + 2 * b * nr * kt;
        double re = 0.0, im = 0.0;
        for (u64 i = 0; i < nr; i++) {
            double a = wr[2 * i], c = -wr[2 * i + 1];
            double xr = xb[2 * (i * kt + t)], xi = xb[2 * (i * kt + t) + 1];
            re += a * xr - c * xi;
            im += a * xi + c * xr;
        }
        if (noisy) {
            float nre, nim;
            rf_noise(noise_keys[b], r * kt + t, &nre, &nim);
            re += scale[r] * (double)nre;
            im += scale[r] * (double)nim;
        }
        power[k] = re * re + im * im;
    }
}

// Each channel's largest power (rounded to f32 first when `as_f32`, as the answer reports
// it) and its lowest index: one block per channel, a strided scan, then a tree in shared
// memory.
extern "C" __global__ void __launch_bounds__(BEAM_BEST_THREADS)
    beam_best_f64(const double *power, u64 channels, u64 pairs, u32 as_f32, u64 *best_index,
                  double *best_power) {
    __shared__ double top[BEAM_BEST_THREADS];
    __shared__ u64 at[BEAM_BEST_THREADS];
    u32 tid = threadIdx.x;
    for (u64 b = blockIdx.x; b < channels; b += gridDim.x) {
        const double *p = power + b * pairs;
        double best = -1.0;
        u64 where = 0;
        for (u64 k = tid; k < pairs; k += blockDim.x) {
            double v = as_f32 ? (double)(float)p[k] : p[k];
            if (v > best) {
                best = v;
                where = k;
            }
        }
        top[tid] = best;
        at[tid] = where;
        __syncthreads();
        for (u32 half = blockDim.x / 2; half > 0; half /= 2) {
            if (tid < half) {
                double o = top[tid + half];
                u64 oat = at[tid + half];
                if (o > top[tid] || (o == top[tid] && oat < at[tid])) {
                    top[tid] = o;
                    at[tid] = oat;
                }
            }
            __syncthreads();
        }
        if (tid == 0) {
            best_index[b] = at[0];
            best_power[b] = top[0];
        }
        // The next channel overwrites the tree: thread 0 must have read it.
        __syncthreads();
    }
}
