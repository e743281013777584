//! `cargo bench --bench linalg`: CPU matmul GFLOP/s at 1024³ and 2048³ (f32 compute, and
//! tf32/f16/bf16 compute against it), beside NumPy's `a @ b` (its BLAS, usually OpenBLAS)
//! on the same cores in the same run when a Python with NumPy is found (BENCH_PYTHON,
//! default python3). Then fused CPU attention at B·H = 32, S = 2048, D = 64 beside
//! NumPy's unfused attention of the same maths. Best of BENCH_LINALG_REPEATS (default 3)
//! runs each.

use gpu_ops::ops::linalg::{Compute, Dtype, MatmulJob, MatmulShape, Operands};
use std::process::Command;
use std::time::Instant;

/// The job as the service builds it from decoded operands: rounded to `compute`.
fn job(n: usize, compute: Compute, a: Vec<f32>, b: Vec<f32>) -> MatmulJob {
    let shape = MatmulShape {
        batch: 1,
        m: n,
        n,
        k: n,
        a_batched: false,
        b_batched: false,
        c_batched: false,
        trans_a: false,
        trans_b: false,
    };
    let operands = Operands::F32 {
        a: a.into(),
        b: b.into(),
        c: None,
    };
    MatmulJob::new(shape, operands, 1.0, 1.0, compute, Dtype::F32, Dtype::F32).unwrap()
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

/// NumPy's best time for an n³ f32 product, or why there is none.
fn numpy_seconds(n: usize, repeats: usize) -> Result<f64, String> {
    numpy_best(
        &format!(
            "rng = np.random.default_rng(1)\n\
             a = rng.random(({n}, {n}), dtype=np.float32)\n\
             b = rng.random(({n}, {n}), dtype=np.float32)\n\
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
    let out = Command::new(&python)
        .args(["-c", &script])
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{python} has no NumPy ({})",
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
    println!("\n# gpu-ops attention benchmark (CPU, fused, f32)\n");
    println!(
        "| B·H | S | D | causal | ours | GFLOP/s | NumPy (unfused, not causal) | ours / NumPy |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let (heads, s, d) = (32usize, 2048usize, 64usize);
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
    println!("# gpu-ops matmul benchmark (CPU, {threads} threads, best of {repeats})\n");
    println!("| n³ | compute | ours | GFLOP/s | NumPy f32 | ours / NumPy |");
    println!("|---|---|---|---|---|---|");
    for n in [1024usize, 2048] {
        let flops = 2.0 * (n as f64).powi(3);
        let numpy = numpy_seconds(n, repeats);
        let values = |salt: usize| -> Vec<f32> {
            (0..n * n)
                .map(|i| ((i * 2654435761 + salt) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        let (a, b) = (values(1), values(2));
        for compute in [Compute::F32, Compute::Tf32, Compute::F16, Compute::Bf16] {
            let ours = best_seconds(
                repeats,
                || (a.clone(), b.clone()),
                |(a, b)| {
                    let job = job(n, compute, a, b);
                    let out = job.run_cpu();
                    (job, out)
                },
            );
            let (np, ratio) = match (&numpy, compute) {
                (Ok(t), Compute::F32) => (format!("{:.1} ms", t * 1e3), format!("{:.2}", ours / t)),
                (Err(why), Compute::F32) => (why.clone(), "-".into()),
                _ => ("".into(), "".into()),
            };
            println!(
                "| {n} | {} | {:.1} ms | {:.1} | {np} | {ratio} |",
                compute.name(),
                ours * 1e3,
                flops / ours / 1e9
            );
        }
    }
    println!(
        "\nEach row times the job as the worker runs it, from decoded operands: rounded to the"
    );
    println!(
        "compute precision (O(n²); nothing for f32), the f32 product (O(n³)), D rounded to the"
    );
    println!("output dtype. The GPU path has no figure until a session has a GPU.");
    attention_rows(repeats);
    sweep_rows(repeats);
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
