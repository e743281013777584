//! `cargo bench --bench linalg`: CPU matrix products at 1024³ and 2048³ (f32 and f64,
//! the tf32/f16/bf16 compute types, a batched bf16 product), beside NumPy's `a @ b` on
//! the same cores in the same run when a Python with NumPy is found (BENCH_PYTHON,
//! default python3), its BLAS kernel named (threadpoolctl, where installed). NumPy runs
//! without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which force OpenBLAS onto older
//! kernels (this project's development machines set both); only its process loses them.
//! Then conv2d on the three ResNet-50 shapes of `gpu-ops check` against our own product
//! of the same work (the im2col product's m × k × n, batched) and, where BENCH_PYTHON has
//! PyTorch, its CPU `F.conv2d` of the same shape, fused CPU attention at
//! B 1, H 8, S 1024, D 64 beside NumPy's unfused attention of the same maths, and the beam
//! sweep. Best of BENCH_LINALG_REPEATS (default 3) runs each. The kernels gemm picked are
//! the host's widest (`ops::linalg::cpu_kernels`); built without the `avx512` feature, AVX-512 hosts
//! run the AVX2 ones.

use gpu_ops::ops::linalg::{cpu_kernels, Compute, Dtype, MatmulJob, MatmulShape, Operands};
use std::process::Command;
use std::time::Instant;

/// A product as the service builds it from decoded operands: f32 ones rounded to
/// `compute`.
fn product(shape: MatmulShape, compute: Compute, operands: Operands) -> MatmulJob {
    let dtype = match operands {
        Operands::F32 { .. } => Dtype::F32,
        Operands::F64 { .. } => Dtype::F64,
    };
    MatmulJob::new(shape, operands, 1.0, 1.0, compute, dtype, dtype).unwrap()
}

/// An m × k by k × n product, `batch` of them (A shared by the batch when `shared_a`).
fn shape(batch: usize, m: usize, k: usize, n: usize, shared_a: bool) -> MatmulShape {
    MatmulShape {
        batch,
        m,
        n,
        k,
        a_batched: batch > 1 && !shared_a,
        b_batched: batch > 1,
        c_batched: false,
        trans_a: false,
        trans_b: false,
    }
}

fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 2654435761 + salt) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// The best time of a product's CPU twin (from fresh operands each run).
fn product_seconds(repeats: usize, shape: MatmulShape, compute: Compute) -> f64 {
    let a_len = if shape.a_batched { shape.batch } else { 1 } * shape.m * shape.k;
    let b_len = if shape.b_batched { shape.batch } else { 1 } * shape.k * shape.n;
    let (a, b) = (values(a_len, 1), values(b_len, 2));
    best_seconds(
        repeats,
        || {
            if compute == Compute::F64 {
                Operands::F64 {
                    a: a.iter().map(|&x| f64::from(x)).collect(),
                    b: b.iter().map(|&x| f64::from(x)).collect(),
                    c: None,
                }
            } else {
                Operands::F32 {
                    a: a.clone().into(),
                    b: b.clone().into(),
                    c: None,
                }
            }
        },
        |operands| {
            let job = product(shape, compute, operands);
            let out = job.run_cpu();
            (job, out)
        },
    )
}

/// The best time of `f` on a fresh `setup()` each run; setting up and dropping what `f`
/// returns are not timed (NumPy's timing below excludes freeing its result too).
fn best_seconds<T, R>(
    repeats: usize,
    mut setup: impl FnMut() -> T,
    mut f: impl FnMut(T) -> R,
) -> f64 {
    drop(f(setup())); // warm-up: page faults, packing buffers
    (0..repeats)
        .map(|_| {
            let input = setup();
            let t = Instant::now();
            let out = std::hint::black_box(f(input));
            let seconds = t.elapsed().as_secs_f64();
            drop(out);
            seconds
        })
        .fold(f64::INFINITY, f64::min)
}

/// NumPy's best time for `batch` n³ products of `dtype` (float32, float64).
fn numpy_seconds(batch: usize, n: usize, dtype: &str, repeats: usize) -> Result<f64, String> {
    let dims = if batch > 1 {
        format!("({batch}, {n}, {n})")
    } else {
        format!("({n}, {n})")
    };
    numpy_best(
        &format!(
            "rng = np.random.default_rng(1)\n\
             a = rng.random({dims}, dtype=np.{dtype})\n\
             b = rng.random({dims}, dtype=np.{dtype})\n\
             run = lambda: a @ b\n"
        ),
        repeats,
    )
}

/// NumPy's best time for attention over `heads` heads of S × D, the same maths as ours
/// (scores, max-subtracted softmax, weighted values), one head at a time so that it holds
/// one S × S matrix, not `heads` of them.
fn numpy_attention_seconds(
    heads: usize,
    s: usize,
    d: usize,
    repeats: usize,
) -> Result<f64, String> {
    numpy_best(
        &format!(
            "rng = np.random.default_rng(1)\n\
             q, k, v = (rng.standard_normal(({heads}, {s}, {d}), dtype=np.float32) for _ in range(3))\n\
             scale = np.float32(1 / np.sqrt({d}))\n\
             def one(h):\n\
             \x20   x = (q[h] @ k[h].T) * scale\n\
             \x20   x -= x.max(axis=1, keepdims=True)\n\
             \x20   np.exp(x, out=x)\n\
             \x20   x /= x.sum(axis=1, keepdims=True)\n\
             \x20   return x @ v[h]\n\
             run = lambda: [one(h) for h in range({heads})]\n"
        ),
        repeats,
    )
}

/// NumPy's best time for the same beam sweep as ours: X = H·Fᵀ and G = conj(W)·X per
/// channel (batched matmuls in complex128), |G|², and each channel's argmax.
fn numpy_sweep_seconds(b: usize, nt: usize, nr: usize, repeats: usize) -> Result<f64, String> {
    numpy_best(
        &format!(
            "rng = np.random.default_rng(1)\n\
             h = rng.standard_normal(({b}, {nr}, {nt})) + 1j * rng.standard_normal(({b}, {nr}, {nt}))\n\
             f = np.exp(1j * np.pi * np.outer(-1 + 2 * np.arange({nt}) / {nt}, np.arange({nt}))) / np.sqrt({nt})\n\
             w = np.exp(1j * np.pi * np.outer(-1 + 2 * np.arange({nr}) / {nr}, np.arange({nr}))) / np.sqrt({nr})\n\
             def one():\n\
             \x20   g = np.conj(w) @ (h @ f.T)\n\
             \x20   p = (g.real ** 2 + g.imag ** 2).reshape({b}, -1)\n\
             \x20   return p.argmax(axis=1)\n\
             run = one\n"
        ),
        repeats,
    )
}

/// A Python for the NumPy side, without the variables that pin OpenBLAS to older
/// kernels than the host's (the module's doc says why).
fn numpy_command(python: &str) -> Command {
    let mut command = Command::new(python);
    command
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE");
    command
}

/// NumPy's version and its BLAS's library, kernel and threads (threadpoolctl), or why
/// not known.
fn numpy_kernel() -> String {
    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import numpy as np\n\
        try:\n\
        \x20   import threadpoolctl\n\
        \x20   info = ', '.join(f\"{i['internal_api']} {i.get('version')} {i.get('architecture')} kernel, {i['num_threads']} threads\" for i in threadpoolctl.threadpool_info())\n\
        except ImportError:\n\
        \x20   info = 'BLAS kernel not known: no threadpoolctl'\n\
        print(f'NumPy {np.__version__}: {info}')";
    match numpy_command(&python).args(["-c", script]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Ok(_) => format!("{python} has no NumPy"),
        Err(e) => format!("{python}: {e}"),
    }
}

/// Runs `setup` (which defines `run`) in BENCH_PYTHON (default python3) and reports the
/// best of `repeats` timed calls of `run()` after one warm-up, or why there is none.
fn numpy_best(setup: &str, repeats: usize) -> Result<f64, String> {
    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "import time, numpy as np\n{setup}\
         run()\n\
         best = min((lambda t: (run(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range({repeats}))\n\
         print(best)"
    );
    let out = numpy_command(&python)
        .args(["-c", &script])
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{python} failed ({})",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("NumPy's output: {e}"))
}

/// CPU attention at B·H = `heads`, S = S_kv = `s`, D = `d`, against NumPy's.
fn attention_rows(repeats: usize) {
    use gpu_ops::ops::nn::{AttentionJob, AttentionShape, Tensors};
    println!("\n# gpu-ops attention benchmark (CPU, fused, f32, B 1)\n");
    println!(
        "| B·H | S | D | causal | ours | GFLOP/s | NumPy (unfused, not causal) | ours / NumPy |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let (heads, s, d) = (8usize, 1024usize, 64usize);
    let numpy = numpy_attention_seconds(heads, s, d, repeats);
    let shape = AttentionShape {
        batch: 1,
        heads,
        kv_heads: heads,
        queries: s,
        keys: s,
        head_dim: d,
        value_dim: d,
    };
    let values = |salt: usize| -> Vec<f32> {
        (0..shape.q_len())
            .map(|i| ((i * 2654435761 + salt) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    };
    let (q, k, v) = (values(1), values(2), values(3));
    for causal in [false, true] {
        let ours = best_seconds(
            repeats,
            || Tensors::F32 {
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
            },
            |tensors| {
                let scale = 1.0 / (d as f64).sqrt();
                let job = AttentionJob::new(
                    shape,
                    tensors,
                    scale,
                    causal,
                    None,
                    Dtype::F32,
                    Dtype::F32,
                    false,
                )
                .unwrap();
                let out = job.run_cpu();
                (job, out)
            },
        );
        let (np, ratio) = match (&numpy, causal) {
            (Ok(t), false) => (format!("{:.1} ms", t * 1e3), format!("{:.2}", ours / t)),
            (Err(why), false) => (why.clone(), "-".into()),
            _ => ("".into(), "".into()),
        };
        println!(
            "| {heads} | {s} | {d} | {causal} | {:.1} ms | {:.1} | {np} | {ratio} |",
            ours * 1e3,
            shape.flops() / ours / 1e9
        );
    }
    println!("\nGFLOP/s counts 4·B·H·S²·D as if nothing were masked (the causal run skips about");
    println!(
        "half). The job includes its O(n) input checks (max |q|, |k| for the overflow guard)."
    );
}

fn main() {
    let repeats: usize = std::env::var("BENCH_LINALG_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let threads = rayon::current_num_threads();
    println!(
        "# gpu-ops matmul benchmark (CPU, {threads} threads, gemm's {} kernels, best of {repeats})\n",
        cpu_kernels()
    );
    println!("{}\n", numpy_kernel());
    println!("| product | compute | ours | GFLOP/s | NumPy | ours / NumPy |");
    println!("|---|---|---|---|---|---|");
    let mut cases: Vec<(usize, usize, Vec<Compute>)> = [1024usize, 2048]
        .into_iter()
        .map(|n| {
            let computes = vec![
                Compute::F32,
                Compute::F64,
                Compute::Tf32,
                Compute::F16,
                Compute::Bf16,
            ];
            (1, n, computes)
        })
        .collect();
    cases.push((16, 512, vec![Compute::Bf16, Compute::F32]));
    for (batch, n, computes) in cases {
        let flops = 2.0 * batch as f64 * (n as f64).powi(3);
        for compute in computes {
            let ours = product_seconds(repeats, shape(batch, n, n, n, false), compute);
            // NumPy has no bf16 product: the f32 and f64 rows have its figure.
            let numpy = match compute {
                Compute::F32 => Some(numpy_seconds(batch, n, "float32", repeats)),
                Compute::F64 => Some(numpy_seconds(batch, n, "float64", repeats)),
                _ => None,
            };
            let (np, ratio) = match numpy {
                Some(Ok(t)) => (format!("{:.1} ms", t * 1e3), format!("{:.2}", ours / t)),
                Some(Err(why)) => (why, "-".into()),
                None => ("".into(), "".into()),
            };
            let label = if batch > 1 {
                format!("{batch} × {n}³")
            } else {
                format!("{n}³")
            };
            println!(
                "| {label} | {} | {:.1} ms | {:.1} | {np} | {ratio} |",
                compute.name(),
                ours * 1e3,
                flops / ours / 1e9
            );
        }
    }
    println!(
        "\nEach row times the job as the worker runs it, from decoded operands: rounded to the"
    );
    println!("compute precision (O(n²); nothing for f32 and f64), the product (O(n³)), D rounded");
    println!("to the output dtype. The GPU path has no figure until a session has a GPU.");
    conv_rows(repeats);
    attention_rows(repeats);
    sweep_rows(repeats);
}

/// conv2d (f32, bias + ReLU as the check has them) on ResNet-50's shapes at N 32, and
/// our own f32 product of the same work: per image, the im2col product (O × C·KH·KW)
/// by (C·KH·KW × OH·OW), the weights shared by the batch.
fn conv_rows(repeats: usize) {
    use gpu_ops::ops::nn::{Conv2dJob, Conv2dShape, ConvTensors};
    println!("\n# gpu-ops conv2d benchmark (CPU, f32, N 32)\n");
    println!("{}\n", torch_version());
    println!(
        "| layer | ours | GFLOP/s | our product of the same work | GFLOP/s | conv / product | PyTorch | ours / PyTorch |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let layers = [
        ("conv1 7×7/2 3→64 224²", 3, 224, 64, 7, 2, 3, true),
        ("stage 3 3×3 128→128 28²", 128, 28, 128, 3, 1, 1, true),
        ("stage 3 1×1 512→128 28²", 512, 28, 128, 1, 1, 0, false),
    ];
    let batch = 32;
    for (label, channels, size, out_channels, kernel, stride, pad, bias_relu) in layers {
        let shape = Conv2dShape {
            batch,
            channels,
            height: size,
            width: size,
            out_channels,
            kernel_h: kernel,
            kernel_w: kernel,
            stride: (stride, stride),
            padding: [pad; 4],
            dilation: (1, 1),
            groups: 1,
        };
        let input = values(shape.input_len(), 1);
        let weight = values(shape.weight_len(), 2);
        let bias = bias_relu.then(|| values(out_channels, 3));
        let ours = best_seconds(
            repeats,
            || ConvTensors::F32 {
                input: input.clone(),
                weight: weight.clone(),
                bias: bias.clone(),
            },
            |tensors| {
                let job =
                    Conv2dJob::new(shape, tensors, bias_relu, Dtype::F32, Dtype::F32).unwrap();
                let out = job.run_cpu();
                (job, out)
            },
        );
        let (m, k, n) = (out_channels, shape.window(), shape.positions());
        let flops = 2.0 * (batch * m * k * n) as f64;
        let product = product_seconds(repeats, self::shape(batch, m, k, n, true), Compute::F32);
        let (torch, ratio) = match torch_conv_seconds(&shape, bias_relu, repeats) {
            Ok(t) => (format!("{:.1} ms", t * 1e3), format!("{:.2}", ours / t)),
            Err(why) => (why, "-".into()),
        };
        println!(
            "| {label} | {:.1} ms | {:.1} | {batch} × {m}×{k}×{n}: {:.1} ms | {:.1} | {:.0} % | {torch} | {ratio} |",
            ours * 1e3,
            flops / ours / 1e9,
            product * 1e3,
            flops / product / 1e9,
            100.0 * product / ours
        );
    }
    println!("\nGFLOP/s counts 2·N·O·C·KH·KW·OH·OW; ours includes the bias and ReLU pass.");
}

/// PyTorch's version, its CPU capability and oneDNN, from BENCH_PYTHON, or why not known.
fn torch_version() -> String {
    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import torch\n\
        print(f'PyTorch {torch.__version__} (CPU: {torch.backends.cpu.get_cpu_capability()}, \
        oneDNN {torch.backends.mkldnn.is_available()}, {torch.get_num_threads()} threads)')";
    match numpy_command(&python).args(["-c", script]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Ok(_) => format!("{python} has no PyTorch: its column is empty"),
        Err(e) => format!("{python}: {e}"),
    }
}

/// PyTorch's CPU conv2d (f32, the same shape, bias and ReLU where ours has them) in
/// BENCH_PYTHON on the same cores: the best of `repeats` after a warm-up.
fn torch_conv_seconds(
    shape: &gpu_ops::ops::nn::Conv2dShape,
    bias_relu: bool,
    repeats: usize,
) -> Result<f64, String> {
    let threads = rayon::current_num_threads();
    let setup = format!(
        "import torch, torch.nn.functional as F\n\
         torch.set_num_threads({threads})\n\
         x = torch.rand({n}, {c}, {h}, {w}) - 0.5\n\
         wt = torch.rand({o}, {c}, {kh}, {kw}) - 0.5\n\
         b = (torch.rand({o}) - 0.5) if {bias} else None\n\
         def run():\n\
         \x20   with torch.no_grad():\n\
         \x20       y = F.conv2d(x, wt, b, stride={s}, padding={p})\n\
         \x20       return F.relu(y) if {bias} else y\n",
        n = shape.batch,
        c = shape.channels,
        h = shape.height,
        w = shape.width,
        o = shape.out_channels,
        kh = shape.kernel_h,
        kw = shape.kernel_w,
        s = shape.stride.0,
        p = shape.padding[0],
        bias = if bias_relu { "True" } else { "False" },
    );
    numpy_best(&setup, repeats)
}

/// A beam sweep of uploaded channels with DFT codebooks (the job as the worker runs it,
/// from decoded channels) against NumPy's batched complex products.
fn sweep_rows(repeats: usize) {
    use gpu_ops::ops::beams::{Array, Channels, Codebook, SweepJob};
    use gpu_ops::ops::FieldPath;
    println!("\n# gpu-ops beam sweep benchmark (CPU, f64, DFT codebooks, no noise)\n");
    println!("| channels | N_T × N_R | beams | ours | GFLOP/s | NumPy | ours / NumPy |");
    println!("|---|---|---|---|---|---|---|");
    for (b, nt, nr) in [(1024usize, 64usize, 16usize), (256, 256, 32)] {
        let numpy = numpy_sweep_seconds(b, nt, nr, repeats);
        let (tx, rx) = (
            Array::new(1, nt, FieldPath::root()).unwrap(),
            Array::new(1, nr, FieldPath::root()).unwrap(),
        );
        let h: Vec<f64> = (0..2 * b * nr * nt)
            .map(|i| ((i * 2654435761) % 1000) as f64 / 500.0 - 1.0)
            .collect();
        let ours = best_seconds(
            repeats,
            || h.clone(),
            |h| {
                let job = SweepJob::new(
                    Channels::Uploaded(h),
                    0,
                    tx,
                    rx,
                    Codebook::dft(tx, 1, FieldPath::root()).unwrap(),
                    Codebook::dft(rx, 1, FieldPath::root()).unwrap(),
                    None,
                    false,
                    Dtype::F64,
                )
                .unwrap();
                let out = job.run_cpu();
                (job, out)
            },
        );
        // 8 flops per complex multiply-add: N_r·N_t·K_t, then K_r·N_r·K_t, per channel.
        let flops = 8.0 * (b * nr * nt) as f64 * (nt + nr) as f64;
        let (np, ratio) = match &numpy {
            Ok(t) => (format!("{:.1} ms", t * 1e3), format!("{:.2}", ours / t)),
            Err(why) => (why.clone(), "-".into()),
        };
        println!(
            "| {b} | {nt} × {nr} | {nt} × {nr} | {:.1} ms | {:.1} | {np} | {ratio} |",
            ours * 1e3,
            flops / ours / 1e9
        );
    }
    println!("\nOurs includes the job's overflow guard over the channels (O(B·N_r·N_t)).");
}
