//! The CPU's products on every kernel path the host has. gemm picks its kernels once per
//! process by the CPU's vector width (AVX-512, AVX2 with FMA, NEON, scalar), so a test
//! process sees one path. On an AVX-512 host the test runs the same products once more
//! in a child under valgrind, whose CPU model has no AVX-512: gemm there takes its AVX2
//! kernels. Each product is held to a naive triple loop over explicit indices, with
//! operands rounded to the compute type by the `half` crate, none of it shared with the
//! code under test.

use super::views::cpu_kernels as kernels;
use super::{Compute, Dtype, MatmulJob, MatmulShape, Operands, Values};

/// What the child runs; its presence tells the test it is the child.
const CHILD: &str = "GPU_OPS_KERNEL_PATH_CHILD";

fn spread(len: usize, salt: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| {
            let h = (i ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn rounded(x: f32, compute: Compute) -> f64 {
    match compute {
        Compute::Bf16 => f64::from(half::bf16::from_f32(x).to_f32()),
        Compute::F16 => f64::from(half::f16::from_f32(x).to_f32()),
        _ => f64::from(x),
    }
}

/// Checks one product; panics with what differs.
fn check(batch: usize, m: usize, k: usize, n: usize, ta: bool, tb: bool, compute: Compute) {
    let shape = MatmulShape {
        batch,
        m,
        n,
        k,
        a_batched: batch > 1,
        // B broadcast over the batch, so a zero batch stride is on every path too.
        b_batched: false,
        c_batched: false,
        trans_a: ta,
        trans_b: tb,
    };
    let (a, b) = (spread(batch * m * k, 1), spread(k * n, 2));
    let wide = compute == Compute::F64;
    let operands = if wide {
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
    };
    let dtype = if wide { Dtype::F64 } else { Dtype::F32 };
    let job = MatmulJob::new(shape, operands, 1.0, 0.0, compute, dtype, dtype).unwrap();
    let got: Vec<f64> = match job.run_cpu() {
        Values::F32(d) => d.iter().map(|&x| f64::from(x)).collect(),
        Values::F64(d) => d,
    };
    // Unit roundoff of the accumulation: f64 for f64, f32 for every other compute type.
    let u = if wide {
        f64::EPSILON / 2.0
    } else {
        f64::from(f32::EPSILON) / 2.0
    };
    for e in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut abs) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let x = if ta {
                        a[e * m * k + p * m + i]
                    } else {
                        a[e * m * k + i * k + p]
                    };
                    let y = if tb { b[j * k + p] } else { b[p * n + j] };
                    let xy = rounded(x, compute) * rounded(y, compute);
                    sum += xy;
                    abs += xy.abs();
                }
                let value = got[(e * m + i) * n + j];
                let bound = (k + 2) as f64 * u * abs + f64::MIN_POSITIVE;
                assert!(
                    (value - sum).abs() <= bound,
                    "{} kernels, {batch} × {m}×{k}×{n} ta={ta} tb={tb} {}: D[{e},{i},{j}] = {value}, \
                     reference {sum} (bound {bound})",
                    kernels(),
                    compute.name()
                );
            }
        }
    }
}

/// Sizes past every microkernel's tile (and not multiples of them), each transpose, a
/// batch with a broadcast operand, and each compute type but tf32 (no crate rounds it;
/// tests.rs holds tf32 to its bound).
fn check_every_product() {
    for compute in [Compute::F32, Compute::F64, Compute::Bf16, Compute::F16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            check(1, 67, 45, 131, ta, tb, compute);
        }
        check(3, 33, 70, 17, false, true, compute);
        check(1, 1, 300, 1, false, false, compute);
    }
}

#[test]
fn products_match_a_naive_reference_on_every_kernel_path_the_host_has() {
    check_every_product();
    if std::env::var_os(CHILD).is_some() {
        // The parent reads this line to know which kernels the child ran.
        println!("kernel path: {}", kernels());
        return;
    }
    if kernels() != "avx512" {
        // The host's one path ran above.
        return;
    }
    let valgrind = std::process::Command::new("valgrind")
        .args(["-q", "--error-exitcode=3"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "ops::linalg::kernel_paths::products_match_a_naive_reference_on_every_kernel_path_the_host_has",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output();
    let out = match valgrind {
        Ok(out) => out,
        Err(e) => {
            crate::skips::skip_unless_required(
                "ops::linalg::kernel_paths::products_match_a_naive_reference_on_every_kernel_path_the_host_has",
                &format!("the AVX2 path is not checked: valgrind did not start ({e})"),
                "REQUIRE_VALGRIND",
            );
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the products under valgrind (AVX2 kernels): {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("kernel path: avx2"),
        "the child did not run gemm's AVX2 kernels:\n{stdout}"
    );
}
