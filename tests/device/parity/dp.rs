//! Privatization (clipping and noise) and the noise mechanisms: exact noise, bit for bit.

use super::{on_every_device, Device};
use gpu_ops::ops::dp::plan::{calibrate_gaussian, calibrate_laplace, GaussianPlan};
use gpu_ops::ops::dp::{Gradients, Mechanism, NoiseJob, NoiseKey, PrivatizeJob};

/// Deterministic pseudo-gradients with a spread of norms, some rows clipped, some not.
fn gradients(rows: usize, cols: usize) -> Vec<f64> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..rows * cols)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let scale = 1.0 + (i / cols % 7) as f64;
            ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * scale / (cols as f64).sqrt()
        })
        .collect()
}

#[test]
fn privatize_and_mechanisms_are_bit_identical_to_the_cpu() {
    let key = NoiseKey::from_seed(2024);
    on_every_device(
        "privatize_and_mechanisms_are_bit_identical_to_the_cpu",
        |d| {
            // 16 500 rows: past the first of the CPU path's blocks of 16 384 rows (row-block
            // code, nothing for the race checker, which leaves the last shape out).
            let shapes = d.sizes(
                &[
                    (1usize, 1usize),
                    (3, 257),
                    (64, 10_000),
                    (256, 70_001),
                    (16_500, 3),
                ],
                &[(1, 1), (3, 257), (5, 9000), (16_500, 3)],
            );
            for (rows, cols) in shapes {
                let g = gradients(rows, cols);
                let layer_sets: Vec<(Vec<u64>, Vec<f64>)> = vec![
                    (vec![0, cols as u64], vec![1.0]),
                    (vec![0, (cols / 3) as u64, cols as u64], vec![0.5, 2.0]),
                ];
                for (bounds, clip) in layer_sets {
                    if bounds.windows(2).any(|w| w[0] == w[1]) {
                        continue;
                    }
                    let c = clip.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let plan =
                        GaussianPlan::new(1.1 * c, c / 1024.0 / (cols as f64).sqrt()).unwrap();
                    for f32_input in [true, false] {
                        let gradients = if f32_input {
                            Gradients::F32(g.iter().map(|&x| x as f32).collect::<Vec<_>>().into())
                        } else {
                            Gradients::F64(g.clone().into())
                        };
                        let job = PrivatizeJob {
                            gradients,
                            rows,
                            cols,
                            bounds: bounds.clone(),
                            clip_norms: clip.clone(),
                            plan,
                            divisor: rows as f64,
                            key,
                        };
                        let layers = clip.len();
                        d.check(
                            format!("privatize {rows}x{cols} {layers} layer(s) f32={f32_input}"),
                            &job,
                        );
                    }
                }
            }
            // With room beside the batch's own buffers (bounds, clip norms, sums, answer
            // and key) for ten rows of 700 f64 (with their two segment partials, two
            // factors and two norms), 40 rows run in eight chunks of five on two lanes:
            // each chunk's kernels wait for the previous chunk's, so the column sums keep
            // the CPU's row order.
            let (rows, cols) = (40, 700);
            let job = PrivatizeJob {
                gradients: Gradients::F64(gradients(rows, cols).into()),
                rows,
                cols,
                bounds: vec![0, 100, cols as u64],
                clip_norms: vec![0.5, 2.0],
                plan: GaussianPlan::new(2.2, 1.0 / 4096.0).unwrap(),
                divisor: 1.0,
                key,
            };
            d.in_passes(8 * (2 * 3 + 2 + 2 * 700) + 32 + 10 * 8 * (700 + 6), |d| {
                d.check("privatize 40x700 in chunks", &job);
            });
            for n in d.sizes(&[1usize, 1000, 300_000], &[1, 1000, 9000]) {
                check_releases(d, key, n, "");
            }
            // With room for about a thousand values (16 bytes each, in and out), a release
            // of 3 000 runs in chunks of about 500 on two lanes: the noise of each value is
            // still its index's in the whole.
            d.in_passes(16_000, |d| check_releases(d, key, 3_000, " in chunks"));
        },
    );
}

/// Both mechanisms over `n` values, each held to its CPU twin bit for bit.
fn check_releases(d: &Device, key: NoiseKey, n: usize, how: &str) {
    let values: Vec<f64> = gradients(1, n).iter().map(|x| x * 1e3).collect();
    let mechanisms = [
        Mechanism::Gaussian(calibrate_gaussian(n, 1.0, 0.7, 1e-6).unwrap().plan),
        Mechanism::Laplace(calibrate_laplace(n, 1.0, 0.7).unwrap().plan),
    ];
    for mechanism in mechanisms {
        let job = NoiseJob {
            values: values.clone(),
            mechanism,
            key,
        };
        d.check(format!("{} n={n}{how}", mechanism.name()), &job);
    }
}
