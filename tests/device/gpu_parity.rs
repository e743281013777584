//! GPU parity: every kernel and launcher against its CPU twin (integers bit for bit,
//! floats within the stated tolerances), on random and edge inputs, through the launchers
//! the service calls. Each test runs on every usable CUDA device and on the emulated
//! device, so without a GPU nothing is skipped. On a GPU host: `scripts/gpu-check.sh run`.

use gpu_ops::backend::cuda::{discover, DeviceSelection};
use gpu_ops::backend::{GpuDevice, Job};
use gpu_ops::ops::zk::samples::{edge_values, random_elements};
use gpu_ops::ops::zk::{Field, FieldBinaryJob, FieldOp, FieldVec, U256};
use std::sync::Arc;

/// Every usable CUDA device, then the emulated device (256 MiB of pretend memory).
fn devices(test: &str) -> Vec<Arc<GpuDevice>> {
    let cache = std::env::temp_dir().join("gpu-ops-parity-kernels");
    let (mut devices, reason) = discover(
        &DeviceSelection::All,
        &cache,
        &gpu_ops::ops::kernel_library(),
    );
    eprintln!("{test}: CUDA: {reason}; the emulated device runs it too");
    devices.push(Arc::new(GpuDevice::emulated(devices.len(), 256 << 20)));
    devices
}

/// The sizes a test runs at on `dev`. The emulated device runs every GPU thread as a
/// fiber on the CPU, so its sizes are smaller, chosen to cross the same branches:
/// grid-stride wraps (more items than its 32 × 256 threads), passes, chunks, tiles and
/// stages. Under ThreadSanitizer (CI's race check, many times slower) the largest is
/// left out: races need a block's threads, not long loops.
fn sizes<T: Clone>(dev: &GpuDevice, real: &[T], emulated: &[T]) -> Vec<T> {
    if !dev.is_emulated() {
        real.to_vec()
    } else if race_checked(dev) {
        emulated[..emulated.len() - 1].to_vec()
    } else {
        emulated.to_vec()
    }
}

/// Whether `dev` is the emulated device built under ThreadSanitizer.
fn race_checked(dev: &GpuDevice) -> bool {
    dev.is_emulated() && gpu_ops::backend::emulated::sanitizer() == "thread"
}

/// RF samples per test on `dev`: fewer under ThreadSanitizer.
fn rf_samples(dev: &GpuDevice, n: u64) -> u64 {
    if race_checked(dev) {
        n.min(3)
    } else {
        n
    }
}

/// An RF feature from the device within the tolerance of the CPU's: 0.1 Hz for
/// frequencies, 1e-3 (dB and the rest) otherwise, or 1e-6 relative.
fn assert_feature_close(name: &str, got: f64, want: f64, at: &str) {
    let tol = if name.ends_with("_hz") { 0.1 } else { 1e-3 };
    let d = (got - want).abs();
    assert!(
        d <= tol || d <= 1e-6 * want.abs(),
        "{at} {name}: {got} vs {want}"
    );
}

fn inputs(field: Field, n: usize) -> (Vec<U256>, Vec<U256>) {
    let e = edge_values(field);
    let mut xs: Vec<U256> = e.iter().flat_map(|x| e.iter().map(move |_| *x)).collect();
    let mut ys: Vec<U256> = e.iter().flat_map(|_| e.iter().copied()).collect();
    xs.extend(random_elements(field, n, 101));
    ys.extend(random_elements(field, n, 202));
    (xs, ys)
}

#[test]
fn cuda_field_ops_are_bit_identical_to_the_cpu() {
    let devices = devices("cuda_field_ops_are_bit_identical_to_the_cpu");
    for dev in &devices {
        eprintln!(
            "GPU {}: {} (sm {}, {})",
            dev.info.ordinal, dev.info.name, dev.info.compute_capability, dev.info.kernel_arch
        );
        // Sizes cross the grid-stride boundary (more elements than threads launched).
        for n in sizes(
            dev,
            &[1usize, 255, 257, 100_000, 3_000_000],
            &[1, 255, 257, 9000],
        ) {
            for field in Field::ALL {
                let (xs, ys) = inputs(field, n);
                let a = FieldVec::from_integers(field, &xs).unwrap();
                let b = FieldVec::from_integers(field, &ys).unwrap();
                let b1 = FieldVec::from_integers(field, &ys[7..8]).unwrap();
                for op in FieldOp::ALL {
                    for b in [&b, &b1] {
                        let job = FieldBinaryJob::new(op, a.clone(), b.clone()).unwrap();
                        let cpu = job.run_cpu();
                        let lease = dev.lease().expect("device lease");
                        let gpu = gpu_ops::ops::zk::launch_field_binary(&job, &lease)
                            .expect("kernel runs");
                        assert!(
                            cpu == gpu,
                            "{op:?} on {field:?}, n={}, broadcast={}: GPU differs from CPU",
                            xs.len(),
                            b.len() == 1
                        );
                    }
                }
            }
        }
    }
}

mod dp {
    use super::{devices, sizes};
    use gpu_ops::ops::dp::plan::{calibrate_gaussian, calibrate_laplace, GaussianPlan};
    use gpu_ops::ops::dp::{
        launch_noise, launch_privatize, Gradients, Mechanism, NoiseJob, NoiseKey, PrivatizeJob,
    };

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
    fn cuda_privatize_and_mechanisms_are_bit_identical_to_the_cpu() {
        let devices = devices("cuda_privatize_and_mechanisms_are_bit_identical_to_the_cpu");
        let key = NoiseKey::from_seed(2024);
        for dev in &devices {
            let shapes = sizes(
                dev,
                // 16 500 rows: past the first of the CPU path's blocks of 16 384 rows (row-block
                // code, nothing for the race checker, which leaves the last shape out).
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
                            Gradients::F32(g.iter().map(|&x| x as f32).collect())
                        } else {
                            Gradients::F64(g.clone())
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
                        let cpu = job.run_cpu();
                        let lease = dev.lease().expect("device lease");
                        let gpu = launch_privatize(&job, &lease).expect("kernels run");
                        assert_eq!(cpu.stats, gpu.stats, "clip stats {rows}x{cols}");
                        let same = cpu
                            .gradient
                            .iter()
                            .zip(&gpu.gradient)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "privatize {rows}x{cols} f32={f32_input}: GPU differs from CPU"
                        );
                    }
                }
            }
            for n in sizes(dev, &[1usize, 1000, 300_000], &[1, 1000, 9000]) {
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
                    let cpu = job.run_cpu();
                    let lease = dev.lease().expect("device lease");
                    let gpu = launch_noise(&job, &lease).expect("kernel runs");
                    let same = cpu
                        .iter()
                        .zip(&gpu)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{} n={n}: GPU differs from CPU", mechanism.name());
                }
            }
        }
    }
}

#[test]
fn cuda_pow_and_inv_are_bit_identical_to_the_cpu() {
    use gpu_ops::ops::zk::{launch_field_inv, launch_field_pow, FieldInvJob, FieldPowJob};
    let devices = devices("cuda_pow_and_inv_are_bit_identical_to_the_cpu");
    for dev in &devices {
        for n in sizes(dev, &[1usize, 7, 1000, 300_000], &[1, 7, 1000, 9000]) {
            for field in Field::ALL {
                let mut xs = edge_values(field);
                xs.extend(random_elements(field, n, 31));
                let base = FieldVec::from_integers(field, &xs).unwrap();
                let exps = random_elements(Field::Bn254Fr, xs.len(), 32);
                for e in [exps.clone(), exps[..1].to_vec()] {
                    let job = FieldPowJob::new(base.clone(), e).unwrap();
                    let lease = dev.lease().expect("device lease");
                    let gpu = launch_field_pow(&job, &lease).expect("kernel runs");
                    assert!(job.run_cpu() == gpu, "pow on {field:?}, n={}", xs.len());
                }
                let nonzero: Vec<U256> = xs.into_iter().filter(|x| *x != U256::ZERO).collect();
                let job =
                    FieldInvJob::new(FieldVec::from_integers(field, &nonzero).unwrap()).unwrap();
                let lease = dev.lease().expect("device lease");
                let gpu = launch_field_inv(&job, &lease).expect("kernel runs");
                assert!(
                    job.run_cpu() == gpu,
                    "inv on {field:?}, n={}",
                    nonzero.len()
                );
            }
        }
    }
}

#[test]
fn cuda_ntt_is_bit_identical_to_the_cpu() {
    use gpu_ops::ops::zk::launch_ntt;
    use gpu_ops::ops::zk::ntt::{Direction, NttJob, Order};
    let devices = devices("cuda_ntt_is_bit_identical_to_the_cpu");
    for dev in &devices {
        for field in Field::ALL {
            // 2^11 crosses the tile (1 024 BN254 elements) into the stages on every
            // field but Goldilocks and BabyBear, which 2^13 crosses.
            let shapes = sizes(
                dev,
                &[(0u32, 3usize), (1, 1), (5, 4), (12, 2), (20, 1)],
                &[(0, 3), (1, 1), (5, 4), (11, 2), (13, 1)],
            );
            for (log_n, batch) in shapes {
                let n = 1usize << log_n;
                let xs = random_elements(field, n * batch, 41);
                let values = FieldVec::from_integers(field, &xs).unwrap();
                for direction in [Direction::Forward, Direction::Inverse] {
                    for (input, output) in [
                        (Order::Natural, Order::Natural),
                        (Order::BitReversed, Order::Natural),
                        (Order::Natural, Order::BitReversed),
                    ] {
                        for shift in [None, Some(U256::from_u64(3))] {
                            let job = NttJob::new(
                                direction,
                                values.clone(),
                                batch,
                                input,
                                output,
                                shift,
                                30,
                            )
                            .unwrap();
                            let lease = dev.lease().expect("device lease");
                            let gpu = launch_ntt(&job, &lease).expect("kernels run");
                            assert!(job.run_cpu() == gpu, "{field:?} n=2^{log_n} batch={batch} {direction:?} {input:?}->{output:?} shift={shift:?}");
                        }
                    }
                }
            }
        }
    }
}

/// MSM on the device against arkworks on the CPU, compared in affine (unique), on the
/// hard cases: tiny and odd sizes, zero and r − 1 scalars, the identity, duplicates (the
/// doubling path inside a bucket), P beside −P, every scalar in one bucket, a batch, and
/// the chunked path.
#[test]
fn cuda_msm_equals_the_cpu() {
    use gpu_ops::ops::zk::msm::{Curve, MsmJob, Points};
    use gpu_ops::ops::zk::samples::random_points;
    use gpu_ops::ops::zk::{launch_msm, launch_msm_in_chunks};
    let devices = devices("cuda_msm_equals_the_cpu");
    fn with_hard_points(points: Points) -> Points {
        use ark_ec::short_weierstrass::{Affine, SWCurveConfig};
        fn mix<P: SWCurveConfig>(mut p: Vec<Affine<P>>) -> Vec<Affine<P>> {
            let (a, b) = (p[0], p[1]);
            p.extend([Affine::identity(), a, a, -b]);
            p
        }
        match points {
            Points::Bn254G1(p) => Points::Bn254G1(mix(p)),
            Points::Bls12_381G1(p) => Points::Bls12_381G1(mix(p)),
        }
    }
    for dev in &devices {
        for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
            let field = curve.scalar_field();
            for n in sizes(dev, &[2usize, 31, 1000, 1 << 16], &[2, 31, 1000, 3000]) {
                let points = with_hard_points(random_points(curve, n, n as u64));
                let m = points.len();
                let mut edge = edge_values(field);
                edge.extend(random_elements(field, m, 5));
                edge.truncate(m);
                let one_bucket = vec![U256::from_u64(7); m];
                let vectors = [
                    random_elements(field, m, 9),
                    edge,
                    one_bucket,
                    vec![U256::ZERO; m],
                ];
                let scalars: Vec<FieldVec> = vectors
                    .iter()
                    .map(|v| FieldVec::from_integers(field, v).unwrap())
                    .collect();
                let job = MsmJob::new(points, scalars).unwrap();
                let cpu = job.run_cpu();
                let lease = dev.lease().expect("device lease");
                let gpu = launch_msm(&job, &lease).expect("kernels run");
                assert!(cpu == gpu, "{curve:?} n={m}: GPU differs from CPU");
                if m > 1000 {
                    let chunked = launch_msm_in_chunks(&job, &lease, 1 << 10).expect("kernels run");
                    assert!(cpu == chunked, "{curve:?} n={m} in chunks of 2^10");
                }
            }
        }
    }
}

/// Skewed scalars cost the bucket sums no more than random ones: all zero, all one, one
/// repeated value, a few values in turn and r − 1 everywhere put up to n entries in one
/// bucket, yet no thread adds more than the plan's chunk in any level (read back from
/// the kernels' per-thread addition counts), and the answers equal the CPU's.
#[test]
fn msm_bucket_work_is_balanced_whatever_the_scalars() {
    use gpu_ops::ops::zk::launch_msm_measured;
    use gpu_ops::ops::zk::msm::{Curve, MsmJob};
    use gpu_ops::ops::zk::samples::random_points;
    let devices = devices("msm_bucket_work_is_balanced_whatever_the_scalars");
    for dev in &devices {
        for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
            let field = curve.scalar_field();
            for n in sizes(dev, &[1usize << 16], &[1000, 3000]) {
                let points = random_points(curve, n, 77);
                let random = random_elements(field, n, 78);
                let mut r_minus_1 = field.modulus();
                r_minus_1.0[0] -= 1;
                let few: Vec<U256> = (0..n).map(|i| random[i % 4]).collect();
                let cases = [
                    ("random", random.clone()),
                    ("all zero", vec![U256::ZERO; n]),
                    ("all one", vec![U256::from_u64(1); n]),
                    ("one repeated value", vec![random[0]; n]),
                    ("four values in turn", few),
                    ("r - 1", vec![r_minus_1; n]),
                ];
                let lease = dev.lease().expect("device lease");
                let mut random_path = 0;
                for (name, scalars) in cases {
                    let scalars = FieldVec::from_integers(field, &scalars).unwrap();
                    let job = MsmJob::new(points.clone(), vec![scalars]).unwrap();
                    let (gpu, work) =
                        launch_msm_measured(&job, &lease, usize::MAX).expect("kernels run");
                    let at = format!("{curve:?} n={n} {name}");
                    assert!(job.run_cpu() == gpu, "{at}: GPU differs from CPU");
                    eprintln!("{at}: {work:?}, critical path {}", work.critical_path());
                    for (level, &adds) in work.most_adds_per_level.iter().enumerate() {
                        assert!(adds <= work.chunk, "{at}: level {level} {work:?}");
                    }
                    if name == "random" {
                        random_path = work.critical_path();
                    } else {
                        assert!(
                            work.critical_path() <= random_path + work.chunk,
                            "{at}: {work:?} against random's {random_path}"
                        );
                    }
                    if name == "all one" {
                        // One thread per bucket would have added every point in turn.
                        assert_eq!(work.largest_bucket as usize, n, "{at}");
                    }
                }
            }
        }
    }
}

/// Matmul on the device against the CPU twin, within the tolerance `MatmulJob::agrees`
/// states: tiles cut at every edge, more tiles than the grid (block-stride wraps), K
/// across several 16-deep slices and not a multiple of them, transposes, broadcast
/// operands, C with beta, each compute precision and output dtype; then a batch in
/// passes under a memory limit.
#[test]
fn cuda_matmul_agrees_with_the_cpu() {
    use gpu_ops::ops::linalg::{launch_matmul, Compute, Dtype, MatmulJob, MatmulShape, Operands};
    let devices = devices("cuda_matmul_agrees_with_the_cpu");
    let base = MatmulShape {
        batch: 1,
        m: 1,
        n: 1,
        k: 1,
        a_batched: false,
        b_batched: false,
        c_batched: false,
        trans_a: false,
        trans_b: false,
    };
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 31 + salt * 7) as f32 * 0.377).sin() * (1 + (i + salt) % 5) as f32)
            .collect()
    };
    let job = |shape: MatmulShape, compute, output, with_c: bool| {
        let operands = Operands::F32 {
            a: values(shape.a_len(), 1),
            b: values(shape.b_len(), 2),
            c: with_c.then(|| values(shape.c_len(), 3)),
        };
        MatmulJob::new(shape, operands, 1.25, -0.5, compute, Dtype::F32, output).unwrap()
    };
    for dev in &devices {
        let shapes = sizes(
            dev,
            &[
                MatmulShape {
                    m: 1000,
                    n: 1000,
                    k: 1000,
                    ..base
                },
                MatmulShape {
                    batch: 8,
                    m: 300,
                    n: 129,
                    k: 65,
                    a_batched: true,
                    trans_a: true,
                    ..base
                },
                MatmulShape {
                    batch: 3,
                    m: 63,
                    n: 257,
                    k: 1,
                    b_batched: true,
                    c_batched: true,
                    trans_b: true,
                    ..base
                },
            ],
            &[
                base,
                MatmulShape {
                    m: 65,
                    n: 63,
                    k: 40,
                    trans_a: true,
                    trans_b: true,
                    ..base
                },
                MatmulShape {
                    batch: 3,
                    m: 70,
                    n: 20,
                    k: 17,
                    b_batched: true,
                    c_batched: true,
                    ..base
                },
                MatmulShape {
                    batch: 5,
                    m: 130,
                    n: 129,
                    k: 33,
                    a_batched: true,
                    trans_b: true,
                    ..base
                },
            ],
        );
        let lease = dev.lease().expect("device lease");
        for shape in shapes {
            for (compute, output, with_c) in [
                (Compute::F32, Dtype::F32, false),
                (Compute::Tf32, Dtype::F32, true),
                (Compute::F16, Dtype::F16, true),
                (Compute::Bf16, Dtype::Bf16, false),
            ] {
                let job = job(shape, compute, output, with_c);
                let gpu = launch_matmul(&job, &lease).expect("kernels run");
                job.agrees(&gpu, &job.run_cpu())
                    .unwrap_or_else(|e| panic!("{shape:?} {compute:?} {output:?} c={with_c}: {e}"));
            }
        }
        drop(lease);
        // A batch many times the memory limit: passes of a few entries, the broadcast
        // operand uploaded once.
        dev.set_memory_limit(64 << 10);
        let shape = MatmulShape {
            batch: 9,
            m: 40,
            n: 48,
            k: 56,
            a_batched: true,
            c_batched: true,
            ..base
        };
        let job = job(shape, Compute::F32, Dtype::F32, true);
        let lease = dev.lease().expect("device lease");
        let gpu = launch_matmul(&job, &lease).expect("kernels run");
        job.agrees(&gpu, &job.run_cpu())
            .unwrap_or_else(|e| panic!("in passes: {e}"));
    }
}

/// Attention on the device against the CPU twin, within `AttentionJob::agrees`: query
/// blocks cut at their edge, more tasks than the grid, every key tile size (D from 8 to
/// 256), grouped heads, causal masks with fewer and more queries than keys, padded and
/// empty sequences, weights, each output dtype, large logits; then passes under a memory
/// limit.
#[test]
fn cuda_attention_agrees_with_the_cpu() {
    use gpu_ops::ops::linalg::Dtype;
    use gpu_ops::ops::nn::{launch_attention, AttentionJob, AttentionShape, Tensors};
    let devices = devices("cuda_attention_agrees_with_the_cpu");
    let shape = |batch, heads, kv_heads, queries, keys, head_dim, value_dim| AttentionShape {
        batch,
        heads,
        kv_heads,
        queries,
        keys,
        head_dim,
        value_dim,
    };
    let values = |len: usize, salt: usize, gain: f32| -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i * 31 + salt * 7) as f32 * 0.377).sin() * gain * (1 + (i + salt) % 3) as f32
            })
            .collect()
    };
    let job = |s: AttentionShape, causal, lengths: Option<Vec<usize>>, output, gain| {
        let tensors = Tensors::F32 {
            q: values(s.q_len(), 1, gain),
            k: values(s.k_len(), 2, 1.0),
            v: values(s.v_len(), 3, 1.0),
        };
        let scale = 1.0 / (s.head_dim as f64).sqrt();
        AttentionJob::new(s, tensors, scale, causal, lengths, Dtype::F32, output, true).unwrap()
    };
    for dev in &devices {
        let cases = sizes(
            dev,
            &[
                (shape(2, 8, 2, 512, 512, 64, 64), true, None),
                (shape(1, 4, 4, 300, 1000, 128, 128), false, Some(vec![777])),
            ],
            &[
                (shape(2, 4, 2, 19, 75, 32, 24), true, Some(vec![75, 0])),
                (shape(1, 2, 1, 40, 9, 8, 16), true, None),
                (shape(1, 1, 1, 17, 70, 256, 256), false, Some(vec![45])),
                (shape(3, 2, 1, 1, 33, 100, 3), false, None),
            ],
        );
        let lease = dev.lease().expect("device lease");
        for (s, causal, lengths) in cases {
            for (output, gain) in [(Dtype::F32, 1.0), (Dtype::F16, 1.0), (Dtype::F32, 3000.0)] {
                let job = job(s, causal, lengths.clone(), output, gain);
                let gpu = launch_attention(&job, &lease).expect("kernels run");
                job.agrees(&gpu, &job.run_cpu())
                    .unwrap_or_else(|e| panic!("{s:?} causal={causal} {output:?} ×{gain}: {e}"));
            }
        }
        drop(lease);
        // Passes of one sequence at a time.
        dev.set_memory_limit(64 << 10);
        let job = job(
            shape(5, 2, 1, 30, 40, 16, 16),
            true,
            Some(vec![40, 3, 0, 39, 1]),
            Dtype::F32,
            1.0,
        );
        let lease = dev.lease().expect("device lease");
        let gpu = launch_attention(&job, &lease).expect("kernels run");
        job.agrees(&gpu, &job.run_cpu())
            .unwrap_or_else(|e| panic!("in passes: {e}"));
    }
}

/// Convolution on the device against the CPU twin, within `Conv2dJob::agrees`: groups
/// (depthwise too), strides, dilation, uneven padding, bias and ReLU, each output dtype,
/// windows past one matmul tile.
#[test]
fn cuda_conv2d_agrees_with_the_cpu() {
    use gpu_ops::ops::linalg::Dtype;
    use gpu_ops::ops::nn::{launch_conv2d, Conv2dJob, Conv2dShape, ConvTensors};
    let devices = devices("cuda_conv2d_agrees_with_the_cpu");
    let base = Conv2dShape {
        batch: 2,
        channels: 4,
        height: 9,
        width: 11,
        out_channels: 6,
        kernel_h: 3,
        kernel_w: 2,
        stride: (1, 1),
        padding: [0; 4],
        dilation: (1, 1),
        groups: 1,
    };
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 31 + salt * 7) as f32 * 0.377).sin() * (1 + (i + salt) % 4) as f32)
            .collect()
    };
    for dev in &devices {
        let shapes = sizes(
            dev,
            &[Conv2dShape {
                batch: 8,
                channels: 64,
                height: 56,
                width: 56,
                out_channels: 64,
                padding: [1; 4],
                kernel_w: 3,
                ..base
            }],
            &[
                Conv2dShape {
                    groups: 2,
                    stride: (1, 2),
                    padding: [1, 2, 0, 1],
                    ..base
                },
                Conv2dShape {
                    channels: 5,
                    out_channels: 10,
                    groups: 5,
                    stride: (2, 1),
                    padding: [0, 0, 3, 3],
                    dilation: (2, 3),
                    ..base
                },
                Conv2dShape {
                    batch: 1,
                    channels: 3,
                    height: 12,
                    width: 12,
                    out_channels: 70,
                    padding: [1; 4],
                    kernel_w: 3,
                    ..base
                },
            ],
        );
        let lease = dev.lease().expect("device lease");
        for shape in shapes {
            for (with_bias, relu, output) in [
                (true, true, Dtype::F32),
                (false, false, Dtype::F16),
                (true, false, Dtype::Bf16),
            ] {
                let tensors = ConvTensors::F32 {
                    input: values(shape.input_len(), 1),
                    weight: values(shape.weight_len(), 2),
                    bias: with_bias.then(|| values(shape.out_channels, 3)),
                };
                let job = Conv2dJob::new(shape, tensors, relu, Dtype::F32, output).unwrap();
                let gpu = launch_conv2d(&job, &lease).expect("kernels run");
                job.agrees(&gpu, &job.run_cpu()).unwrap_or_else(|e| {
                    panic!("{shape:?} bias={with_bias} relu={relu} {output:?}: {e}")
                });
            }
        }
    }
}

/// Sinusoidal embeddings on the device against the CPU, both layouts and every output
/// dtype, past grid-stride wraps and in row passes under a memory limit.
#[test]
fn cuda_sinusoidal_embeddings_agree_with_the_cpu() {
    use gpu_ops::ops::linalg::{launch_sinusoidal, Dtype, Layout, SinusoidalJob};
    let devices = devices("cuda_sinusoidal_embeddings_agree_with_the_cpu");
    for dev in &devices {
        for (rows, dim) in sizes(
            dev,
            &[(100_000usize, 512usize), (7, 65_536)],
            &[(300, 64), (5, 2)],
        ) {
            let positions: Vec<f64> = (0..rows).map(|i| ((i * 7919) % 100_003) as f64).collect();
            for layout in [Layout::Interleaved, Layout::Split] {
                for output in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                    let job =
                        SinusoidalJob::new(&positions, dim, 10_000.0, 1.0, 0.5, layout, output)
                            .unwrap();
                    let lease = dev.lease().expect("device lease");
                    let gpu = launch_sinusoidal(&job, &lease).expect("kernels run");
                    job.agrees(&gpu, &job.run_cpu())
                        .unwrap_or_else(|e| panic!("{rows}×{dim} {layout:?} {output:?}: {e}"));
                }
            }
        }
        dev.set_memory_limit(16 << 10);
        let positions: Vec<f64> = (0..500).map(f64::from).collect();
        let job = SinusoidalJob::new(
            &positions,
            32,
            10_000.0,
            1.0,
            0.0,
            Layout::Split,
            Dtype::F32,
        )
        .unwrap();
        let lease = dev.lease().expect("device lease");
        let gpu = launch_sinusoidal(&job, &lease).expect("kernels run");
        job.agrees(&gpu, &job.run_cpu())
            .unwrap_or_else(|e| panic!("in passes: {e}"));
    }
}

/// With a 1 MiB `--gpu-memory-limit-mib`, work many times larger runs in passes and still
/// equals the CPU: field vectors by element ranges, NTT batches by whole polynomials, MSM
/// by point chunks.
#[test]
fn cuda_work_beyond_the_memory_limit_runs_in_passes() {
    use gpu_ops::ops::mpc::{launch_combine, launch_share};
    use gpu_ops::ops::zk::msm::{Curve, MsmJob};
    use gpu_ops::ops::zk::ntt::{Direction, NttJob, Order};
    use gpu_ops::ops::zk::samples::random_points;
    use gpu_ops::ops::zk::{launch_field_inv, launch_msm, launch_ntt, FieldInvJob};
    let devices = devices("cuda_work_beyond_the_memory_limit_runs_in_passes");
    for dev in &devices {
        // The emulated device at 1/16 of the limit and the sizes: still many passes.
        let scale = if dev.is_emulated() { 4 } else { 0 };
        dev.set_memory_limit(1 << (20 - scale));
        let field = Field::Bn254Fr;
        let (xs, ys) = inputs(field, 1 << (18 - scale));
        let a = FieldVec::from_integers(field, &xs).unwrap();
        let b = FieldVec::from_integers(field, &ys).unwrap();
        let lease = dev.lease().expect("device lease");
        let job = FieldBinaryJob::new(FieldOp::Mul, a.clone(), b).unwrap();
        let gpu = gpu_ops::ops::zk::launch_field_binary(&job, &lease).expect("kernels run");
        assert!(job.run_cpu() == gpu, "field_mul in passes");

        let nonzero: Vec<U256> = xs.iter().copied().filter(|x| *x != U256::ZERO).collect();
        let inv = FieldInvJob::new(FieldVec::from_integers(field, &nonzero).unwrap()).unwrap();
        assert!(
            inv.run_cpu() == launch_field_inv(&inv, &lease).expect("kernels run"),
            "field_inv in passes"
        );

        let values =
            FieldVec::from_integers(field, &random_elements(field, 8 << (14 - scale), 4)).unwrap();
        let ntt = NttJob::new(
            Direction::Inverse,
            values,
            8,
            Order::Natural,
            Order::Natural,
            Some(U256::from_u64(5)),
            30,
        )
        .unwrap();
        assert!(
            ntt.run_cpu() == launch_ntt(&ntt, &lease).expect("kernels run"),
            "NTT batch in passes"
        );

        let points = random_points(Curve::Bn254G1, 1 << (15 - scale), 2);
        let scalars =
            FieldVec::from_integers(field, &random_elements(field, 1 << (15 - scale), 6)).unwrap();
        let msm = MsmJob::new(points, vec![scalars]).unwrap();
        assert!(
            msm.run_cpu() == launch_msm(&msm, &lease).expect("kernels run"),
            "MSM in chunks"
        );

        let (secrets, xs) = shamir_inputs(field, 1 << (14 - scale));
        let (share, combine) = shamir_jobs(secrets, &xs);
        let shares = launch_share(&share, &lease).expect("kernels run");
        assert!(share.run_cpu() == shares, "Shamir split in passes");
        assert!(
            combine.run_cpu() == launch_combine(&combine, &lease).expect("kernels run"),
            "Shamir combine in passes"
        );
        dev.set_memory_limit(0);
    }
}

/// `rf_receive` against `generate::receive`, and the features of the GPU recordings
/// against the CPU's within the tolerances (1e-3 dB, 0.1 Hz).
#[test]
fn cuda_rf_recordings_match_the_cpu() {
    use gpu_ops::ops::rf::features::{extract, FEATURE_NAMES};
    use gpu_ops::ops::rf::generate::{plan, receive};
    use gpu_ops::ops::rf::gpu::{pack, receive_cuda, unpack};
    use gpu_ops::ops::rf::rng::dataset_key;
    use gpu_ops::ops::rf::scenario::Scenario;
    let devices = devices("cuda_rf_recordings_match_the_cpu");
    let s = Scenario::default();
    let key = dataset_key(5);
    let all: Vec<_> = (0..6).map(|n| plan(&s, key, n)).collect();
    let cfg = gpu_ops::ops::rf::dataset::extract_config(&s);
    for dev in &devices {
        let plans = &all[..rf_samples(dev, 6) as usize];
        let batch = pack(&plans.iter().collect::<Vec<_>>());
        let lease = dev.lease().expect("device lease");
        let out = receive_cuda(&batch, &lease).expect("rf_receive runs");
        let got = unpack(&batch, &out);
        for (n, (sample, recordings)) in plans.iter().zip(&got).enumerate() {
            for (r, (p, rec)) in sample.plans.iter().zip(recordings).enumerate() {
                let want = receive(p, &sample.wave);
                let worst = rec
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| {
                        f64::from((a - b).norm()) / f64::from(b.norm()).max(p.noise_sigma)
                    })
                    .fold(0.0, f64::max);
                assert!(
                    worst < 1e-6,
                    "sample {n} rx {r}: relative difference {worst}"
                );
                let (fa, fb) = (
                    extract(rec, &cfg).unwrap().aggregate(),
                    extract(&want, &cfg).unwrap().aggregate(),
                );
                for (i, name) in FEATURE_NAMES.iter().enumerate() {
                    assert_feature_close(
                        name,
                        fa[i].mean,
                        fb[i].mean,
                        &format!("sample {n} rx {r}"),
                    );
                }
            }
        }
    }
}

#[test]
fn cuda_rf_chunk_sums_match_the_cpu() {
    use gpu_ops::ops::rf::features::{self, chunk_sums, extract, extract_from_sums, FEATURE_NAMES};
    use gpu_ops::ops::rf::generate::{plan, receive};
    use gpu_ops::ops::rf::gpu::{chunks_of, pack, receive_and_reduce_cuda, unpack};
    use gpu_ops::ops::rf::rng::dataset_key;
    use gpu_ops::ops::rf::scenario::Scenario;
    let devices = devices("cuda_rf_chunk_sums_match_the_cpu");
    let s = Scenario::default();
    let key = dataset_key(6);
    let all: Vec<_> = (0..6).map(|n| plan(&s, key, n)).collect();
    let cfg = gpu_ops::ops::rf::dataset::extract_config(&s);
    for dev in &devices {
        let plans = &all[..rf_samples(dev, 6) as usize];
        let batch = pack(&plans.iter().collect::<Vec<_>>());
        let (chunk, seg) = features::plan(&cfg, batch.receivers[0].len as usize).unwrap();
        let chunks = chunks_of(&batch, chunk);
        let window = features::hann(seg);
        let fft = rustfft::FftPlanner::<f32>::new().plan_fft_forward(seg);
        let lease = dev.lease().expect("device lease");
        let (iq, sums) =
            receive_and_reduce_cuda(&batch, chunk, seg, true, &lease).expect("rf kernels run");
        let iq = iq.expect("recordings kept");
        assert_eq!(sums.len(), chunks.len());
        // The device's sums against the CPU's over the device's own recordings.
        for (c, got) in chunks.iter().zip(&sums) {
            let want = chunk_sums(&c.samples(&iq), &window, fft.as_ref());
            assert_eq!(
                (got.crossings, got.power_max, got.segments),
                (want.crossings, want.power_max, want.segments)
            );
            assert!((got.power_sum - want.power_sum).abs() <= 1e-12 * want.power_sum);
            assert!((got.magnitude_sum - want.magnitude_sum).abs() <= 1e-12 * want.magnitude_sum);
            let peak = want.bins.iter().copied().fold(0.0, f64::max);
            for (j, (a, b)) in got.bins.iter().zip(&want.bins).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-5 * (b + 1e-6 * peak),
                    "bin {j}: {a} vs {b}"
                );
            }
        }
        // End to end: features from the device's sums against the CPU's extraction of the
        // CPU's recordings.
        let per_rx = chunks.len() / batch.receivers.len();
        let recordings = unpack(&batch, &iq);
        let mut at = 0;
        for (n, (sample, recs)) in plans.iter().zip(&recordings).enumerate() {
            for (r, p) in sample.plans.iter().enumerate() {
                assert_eq!(recs[r].len(), sample.wave.len());
                let got = extract_from_sums(&sums[at..at + per_rx], cfg.sample_rate_hz, chunk, seg)
                    .aggregate();
                at += per_rx;
                let want = extract(&receive(p, &sample.wave), &cfg)
                    .unwrap()
                    .aggregate();
                for (i, name) in FEATURE_NAMES.iter().enumerate() {
                    assert_feature_close(
                        name,
                        got[i].mean,
                        want[i].mean,
                        &format!("sample {n} rx {r}"),
                    );
                }
            }
        }
    }
}

/// `rf_waveform` against `WaveSpec::synthesize` for every modulation, and the dataset
/// device path (waveforms, recordings and chunk sums on the device) against the CPU's
/// records of the same samples.
#[test]
fn cuda_rf_waveforms_and_dataset_records_match_the_cpu() {
    use gpu_ops::ops::rf::dataset::{records_agree, sample, samples_cuda, segment_len};
    use gpu_ops::ops::rf::generate::draft;
    use gpu_ops::ops::rf::gpu::{pack, pack_drafts, waveforms_cuda};
    use gpu_ops::ops::rf::rng::dataset_key;
    use gpu_ops::ops::rf::scenario::Scenario;
    let devices = devices("cuda_rf_waveforms_and_dataset_records_match_the_cpu");
    let mut s = Scenario::default();
    let m = &mut s.signal.mix;
    (m.fm_voice, m.fm_tone, m.fm_dtmf, m.am, m.carrier) = (1.0, 1.0, 1.0, 1.0, 1.0);
    let key = dataset_key(7);
    let drafts: Vec<_> = (0..20).map(|n| draft(&s, key, n)).collect();
    let batch = pack_drafts(&drafts.iter().collect::<Vec<_>>());
    let plans: Vec<_> = drafts.into_iter().map(|d| d.synthesized()).collect();
    let want = pack(&plans.iter().collect::<Vec<_>>());
    for dev in &devices {
        let lease = dev.lease().expect("device lease");
        let (re, im) = waveforms_cuda(&batch, &lease).expect("rf_waveform runs");
        let worst = re
            .iter()
            .chain(&im)
            .zip(want.wave_re.iter().chain(&want.wave_im))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "waveforms: worst difference {worst}");
        let got =
            samples_cuda(&s, key, 0..rf_samples(dev, 20), false, &lease).expect("device path runs");
        for (n, g) in got.iter().enumerate() {
            let (cpu, _, _) = sample(&s, key, n as u64, false);
            if let Err(e) = records_agree(g, &cpu, segment_len(&s)) {
                panic!("sample {n}: {e}");
            }
        }
    }
}

/// `/rf/features` on the device (`FeaturesJob::run_cuda`) against the CPU's extraction.
#[test]
fn cuda_rf_features_of_an_upload_match_the_cpu() {
    use gpu_ops::ops::rf::features::FEATURE_NAMES;
    use gpu_ops::ops::rf::generate::generate;
    use gpu_ops::ops::rf::rng::dataset_key;
    use gpu_ops::ops::rf::scenario::Scenario;
    use gpu_ops::ops::rf::{ExtractConfig, FeaturesJob};
    let devices = devices("cuda_rf_features_of_an_upload_match_the_cpu");
    let s = Scenario::default();
    let sample = generate(&s, dataset_key(8), 0);
    let job = FeaturesJob {
        iq: sample.iq[0].clone(),
        config: ExtractConfig {
            sample_rate_hz: s.signal.sample_rate_hz,
            chunk_ms: 150.0,
        },
    };
    assert!(job.device_refusal().is_none());
    let want = job.run_cpu().unwrap();
    for dev in &devices {
        let lease = dev.lease().expect("device lease");
        let got = job
            .run_device(&lease)
            .expect("rf_chunk_reduce runs")
            .unwrap();
        assert_eq!(got.chunks.len(), want.chunks.len());
        for (g, w) in got.chunks.iter().zip(&want.chunks) {
            for (name, (a, b)) in FEATURE_NAMES.iter().zip(g.iter().zip(w)) {
                assert_feature_close(name, *a, *b, "upload");
            }
        }
    }
}

/// Beam channels and sweeps on the device against the CPU: linear and planar arrays,
/// generated and uploaded channels, DFT and uploaded codebooks, noise, the grid and the
/// best pairs reduced on the device, past grid-stride wraps and in passes under a memory
/// limit.
#[test]
fn cuda_beams_agree_with_the_cpu() {
    use gpu_ops::ops::beams::{
        launch_channels, launch_sweep, Array, ChannelSpec, Channels, ChannelsJob, Codebook,
        MeasurementNoise, SweepJob,
    };
    use gpu_ops::ops::linalg::Dtype;
    use gpu_ops::ops::FieldPath;
    let array = |rows, columns| Array::new(rows, columns, FieldPath::root()).unwrap();
    let spec = |tx, rx, paths, count| ChannelSpec {
        tx,
        rx,
        paths,
        azimuth_deg: (-90.0, 90.0),
        elevation_deg: (-30.0, 30.0),
        seed: 5,
        first: 1 << 40,
        count,
    };
    let devices = devices("cuda_beams_agree_with_the_cpu");
    for dev in &devices {
        for (tx, rx, paths, count) in sizes(
            dev,
            &[
                (array(8, 8), array(1, 16), 8, 4096),
                (array(1, 64), array(4, 4), 3, 100),
            ],
            &[
                (array(1, 16), array(2, 2), 3, 40),
                (array(2, 4), array(1, 8), 1, 3),
            ],
        ) {
            let channels = ChannelsJob::new(spec(tx, rx, paths, count), Dtype::F32).unwrap();
            let lease = dev.lease().expect("device lease");
            let h = launch_channels(&channels, &lease).expect("kernels run");
            channels
                .agrees(&h, &channels.run_cpu())
                .unwrap_or_else(|e| panic!("channels {tx:?} {rx:?}: {e}"));
            let f64_channels = ChannelsJob::new(spec(tx, rx, paths, count), Dtype::F64).unwrap();
            for (uploaded, noise, grid, output) in [
                (false, None, true, Dtype::F32),
                (false, Some(0.0), false, Dtype::F32),
                (true, Some(-10.0), true, Dtype::F64),
                (true, None, false, Dtype::F64),
            ] {
                let source = if uploaded {
                    Channels::Uploaded(f64_channels.run_cpu())
                } else {
                    Channels::Generated {
                        spec: f64_channels.spec.clone(),
                        drawn: f64_channels.drawn.clone(),
                        words: f64_channels.words.clone(),
                    }
                };
                // An uploaded receive codebook: the DFT's beams, each scaled differently.
                let dft = Codebook::dft(rx, 1, FieldPath::root()).unwrap();
                let n = rx.elements();
                let scaled: Vec<f64> = dft
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, x)| x * (1.0 + (i / (2 * n)) as f64 * 0.25))
                    .collect();
                let job = SweepJob::new(
                    source,
                    1 << 40,
                    tx,
                    rx,
                    Codebook::dft(tx, 2, FieldPath::root()).unwrap(),
                    Codebook::new(scaled, n, FieldPath::root()).unwrap(),
                    noise.map(|snr_db| MeasurementNoise { snr_db, seed: 3 }),
                    grid,
                    output,
                )
                .unwrap();
                let gpu = launch_sweep(&job, &lease).expect("kernels run");
                job.agrees(&gpu, &job.run_cpu()).unwrap_or_else(|e| {
                    panic!("sweep {tx:?} {rx:?} uploaded {uploaded} noise {noise:?}: {e}")
                });
            }
        }
        dev.set_memory_limit(16 << 10);
        let s = spec(array(1, 8), array(1, 4), 2, 50);
        let channels = ChannelsJob::new(s.clone(), Dtype::F64).unwrap();
        let lease = dev.lease().expect("device lease");
        let h = launch_channels(&channels, &lease).expect("kernels run");
        channels
            .agrees(&h, &channels.run_cpu())
            .unwrap_or_else(|e| panic!("channels in passes: {e}"));
        let job = SweepJob::new(
            Channels::Generated {
                spec: s,
                drawn: channels.drawn.clone(),
                words: channels.words.clone(),
            },
            1 << 40,
            array(1, 8),
            array(1, 4),
            Codebook::dft(array(1, 8), 4, FieldPath::root()).unwrap(),
            Codebook::dft(array(1, 4), 4, FieldPath::root()).unwrap(),
            Some(MeasurementNoise {
                snr_db: 20.0,
                seed: 9,
            }),
            false,
            Dtype::F32,
        )
        .unwrap();
        let gpu = launch_sweep(&job, &lease).expect("kernels run");
        job.agrees(&gpu, &job.run_cpu())
            .unwrap_or_else(|e| panic!("sweep in passes: {e}"));
        dev.set_memory_limit(0);
    }
}

/// Table lookups on the device equal the CPU's bit for bit, past grid-stride wraps and in
/// passes under a memory limit; the table is cached on the device after the first.
#[test]
fn cuda_lookups_equal_the_cpu_and_keep_their_table() {
    use gpu_ops::ops::linalg::{launch_lookup, Dtype, LookupJob};
    let devices = devices("cuda_lookups_equal_the_cpu_and_keep_their_table");
    for dev in &devices {
        for (vocab, dim, n) in sizes(
            dev,
            &[(50_000usize, 1024usize, 100_000usize)],
            &[(300, 48, 700), (5, 1, 9000)],
        ) {
            let table: Vec<f32> = (0..vocab * dim)
                .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 7.0)
                .collect();
            let table = std::sync::Arc::new(table);
            let ids: Vec<u32> = (0..n).map(|i| ((i * 7919) % vocab) as u32).collect();
            let key = format!("parity/{vocab}x{dim}");
            for output in [Dtype::F32, Dtype::F16] {
                let job =
                    LookupJob::new(key.clone(), table.clone(), dim, ids.clone(), output).unwrap();
                let lease = dev.lease().expect("device lease");
                let gpu = launch_lookup(&job, &lease).expect("kernels run");
                job.agrees(&gpu, &job.run_cpu())
                    .unwrap_or_else(|e| panic!("{vocab}×{dim}, {n} ids, {output:?}: {e}"));
                assert!(dev.holds_table(&key));
            }
            dev.forget_table(&key);
            assert!(!dev.holds_table(&key));
        }
        dev.set_memory_limit(4 << 10);
        let table = std::sync::Arc::new((0..64 * 16).map(|i| i as f32).collect::<Vec<_>>());
        let ids: Vec<u32> = (0..2000).map(|i| (i % 64) as u32).collect();
        let job = LookupJob::new("parity/passes".into(), table, 16, ids, Dtype::F32).unwrap();
        let lease = dev.lease().expect("device lease");
        let gpu = launch_lookup(&job, &lease).expect("kernels run");
        job.agrees(&gpu, &job.run_cpu())
            .unwrap_or_else(|e| panic!("in passes: {e}"));
        dev.set_memory_limit(0);
    }
}

/// `m` random secrets and five points: 1, p − 1, p − 2, 2^20 and 7.
fn shamir_inputs(field: Field, m: usize) -> (FieldVec, Vec<U256>) {
    let secrets = FieldVec::from_integers(field, &random_elements(field, m, 31)).unwrap();
    let p = field.modulus();
    let minus = |k: u64| U256([p.0[0] - k, p.0[1], p.0[2], p.0[3]]);
    let xs = vec![
        U256::from_u64(1),
        minus(1),
        minus(2),
        U256::from_u64(1 << 20),
        U256::from_u64(7),
    ];
    (secrets, xs)
}

/// A threshold-3 split of `secrets` at `xs`, and a combine of the CPU's shares with two
/// checked beyond the threshold.
fn shamir_jobs(
    secrets: FieldVec,
    xs: &[U256],
) -> (
    gpu_ops::ops::mpc::shamir::ShareJob,
    gpu_ops::ops::mpc::shamir::CombineJob,
) {
    use gpu_ops::ops::dp::NoiseKey;
    use gpu_ops::ops::mpc::shamir::{dealer_coefficients, CombineJob, ShareJob};
    let (field, m) = (secrets.field(), secrets.len());
    let coeffs = dealer_coefficients(&secrets, 3, &NoiseKey::derive(b"parity", 1));
    let share = ShareJob::new(
        Arc::new(coeffs),
        m,
        FieldVec::from_integers(field, xs).unwrap(),
    );
    let combine = CombineJob::new(3, xs, share.run_cpu()).unwrap();
    (share, combine)
}

#[test]
fn cuda_shamir_split_and_combine_are_bit_identical_to_the_cpu() {
    use gpu_ops::ops::mpc::{launch_combine, launch_share};
    let devices = devices("cuda_shamir_split_and_combine_are_bit_identical_to_the_cpu");
    for dev in &devices {
        // Sizes cross the grid-stride boundary (more secrets than threads launched).
        for m in sizes(dev, &[1usize, 1000, 1 << 20], &[1, 257, 9000]) {
            for field in Field::ALL {
                let (secrets, xs) = shamir_inputs(field, m);
                let (share, combine) = shamir_jobs(secrets.clone(), &xs);
                let lease = dev.lease().expect("device lease");
                let shares = launch_share(&share, &lease).expect("kernel runs");
                assert!(share.run_cpu() == shares, "split {field:?} m={m}");
                let rows = launch_combine(&combine, &lease).expect("kernel runs");
                assert!(combine.run_cpu() == rows, "combine {field:?} m={m}");
                assert!(
                    combine.finish(rows).unwrap() == secrets,
                    "the device's rows recover the secrets ({field:?} m={m})"
                );
            }
        }
    }
}

/// Mask terms with distinct keys, every third subtracted: more than one launch's group.
fn unmask_job(len: usize, terms: usize) -> gpu_ops::ops::mpc::secagg::UnmaskJob {
    use gpu_ops::ops::mpc::secagg::{MaskTerm, UnmaskJob};
    let sum: Vec<u32> = (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let terms = (0..terms)
        .map(|t| MaskTerm {
            key: std::array::from_fn(|b| (t * 31 + b * 7) as u8),
            subtract: t % 3 == 0,
        })
        .collect();
    UnmaskJob::new(Arc::new(sum), terms)
}

#[test]
fn cuda_secagg_unmask_is_bit_identical_to_the_cpu() {
    use gpu_ops::ops::mpc::launch_unmask;
    let devices = devices("cuda_secagg_unmask_is_bit_identical_to_the_cpu");
    for dev in &devices {
        // Lengths off the 16-word block (a partial last block), and beyond the threads
        // launched; 70 masks take two launches.
        for len in sizes(dev, &[1usize, 1001, (1 << 20) + 5], &[1, 17, 9001]) {
            for terms in [0, 1, 70] {
                let job = unmask_job(len, terms);
                let lease = dev.lease().expect("device lease");
                let out = launch_unmask(&job, &lease).expect("kernel runs");
                assert!(job.run_cpu() == out, "unmask len={len} terms={terms}");
            }
        }
    }
}

#[test]
fn cuda_he_ciphertext_sum_is_bit_identical_to_the_cpu() {
    use fhe::bfv::{Encoding, Plaintext, PublicKey, SecretKey};
    use fhe_traits::{FheEncoder, FheEncrypter};
    use gpu_ops::ops::he::{launch_sum, CiphertextSumJob, ParameterSet};
    let devices = devices("cuda_he_ciphertext_sum_is_bit_identical_to_the_cpu");
    let par = ParameterSet::Bfv128N4096.parameters();
    let mut rng = rand::rng();
    let sk = SecretKey::random(&par, &mut rng);
    let pk = PublicKey::new(&sk, &mut rng);
    let cts: Vec<_> = (0..5u64)
        .map(|k| {
            let v: Vec<u64> = (0..4096u64).map(|i| (i ^ k) % 65537).collect();
            pk.try_encrypt(
                &Plaintext::try_encode(&v, Encoding::simd(), &par).unwrap(),
                &mut rng,
            )
            .unwrap()
        })
        .collect();
    for dev in &devices {
        for weights in [None, Some(vec![1, 65536, 3, 1, 40000])] {
            let job = CiphertextSumJob::new(&par, cts.clone(), weights.clone()).unwrap();
            let lease = dev.lease().expect("device lease");
            let out = launch_sum(&job, &lease).expect("kernel runs");
            assert!(job.run_cpu() == out, "sum, weights {weights:?}");
        }
        // Room for about three ciphertexts of 192 KiB beside the running sum and the
        // output: the five are summed in passes, each pass starting from the last's sum.
        dev.set_memory_limit(1 << 20);
        let job = CiphertextSumJob::new(&par, cts.clone(), Some(vec![2, 1, 65536, 5, 9])).unwrap();
        let lease = dev.lease().expect("device lease");
        let out = launch_sum(&job, &lease).expect("kernel runs");
        assert!(job.run_cpu() == out, "sum in passes");
        dev.set_memory_limit(0);
    }
}
