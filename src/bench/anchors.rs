//! What a run is compared with, by op and by the backend that answered: published GPU
//! figures where one exists, and where the comparison is made otherwise. Printed with the
//! table, so a run on a GPU host says how far it is from the reference, and a run
//! elsewhere says what it would be compared with.

use super::report::Run;
use serde::Serialize;

/// FlashAttention-2's forward pass on an H100 SXM5 at fp16 with head dimension 128, about
/// 370 TFLOP/s (Dao, "FlashAttention-2", 2023, fig. 7): the anchor the issue names.
const FLASH_ATTENTION_2_H100_GFLOPS: f64 = 370_000.0;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Comparison {
    pub reference: String,
    /// The best run's server-side GFLOP/s over the reference's, where both exist.
    pub ratio: Option<f64>,
    pub note: String,
}

/// The comparisons for a run of `path` answered by `backend` (`x-backend`: cpu, cuda,
/// hip or emulated; the GPU anchors are NVIDIA's, so an AMD run's ratios are across
/// vendors, and an emulated run, on the host's CPU, is given none).
pub fn comparisons(path: &str, backend: &str, runs: &[Run]) -> Vec<Comparison> {
    let best = runs
        .iter()
        .filter_map(|r| r.gflops_compute)
        .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))));
    let on_gpu = backend == "cuda" || backend == "hip";
    let mut out = Vec::new();
    match path {
        "/nn/attention" => out.push(Comparison {
            reference: "FlashAttention-2 forward, H100 SXM5, fp16, D = 128: 370 TFLOP/s".into(),
            ratio: best.filter(|_| on_gpu).map(|g| g / FLASH_ATTENTION_2_H100_GFLOPS),
            note: if on_gpu {
                "our attention_f32 is f32 without tensor cores: a lower bound on the gap".into()
            } else {
                "answered on the CPU: CPU attention is compared with NumPy in `cargo bench --bench linalg`".into()
            },
        }),
        "/linalg/matmul" => out.push(Comparison {
            reference: "cuBLASLt called directly on the same shape and compute type".into(),
            ratio: None,
            note: if on_gpu {
                "the server's products run on cuBLASLt once its self-test passed (`matmul_cublaslt` in /device): compare `comp GF/s` with a direct cuBLASLt run of the shape (scripts/gpu-check.sh)".into()
            } else {
                "answered on the CPU: CPU matmul is compared with NumPy in `cargo bench --bench linalg`".into()
            },
        }),
        "/beams/sweep" | "/beams/channels" | "/embeddings/sinusoidal" => {
            out.push(bandwidth("bytes the op moves over its compute time"))
        }
        p if p.starts_with("/embeddings/tables/") => out.push(bandwidth(
            "a lookup reads one table row per id: rows × D × 4 bytes over the compute time",
        )),
        _ => {}
    }
    out
}

/// The device's bandwidth as the reference, for an op that moves memory rather than
/// computing: `moved` says what is set against it.
fn bandwidth(moved: &str) -> Comparison {
    Comparison {
        reference: "the device's memory bandwidth (GET /device/bandwidth, device to device)".into(),
        ratio: None,
        note: format!("{moved}, against that figure; not yet derived by the bench"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(gflops: f64) -> Run {
        Run {
            concurrency: 1,
            seconds: 1.0,
            ok: 1,
            errors: Default::default(),
            throughput_per_second: 1.0,
            latency_ms: None,
            queue_ms: None,
            compute_ms: None,
            gflops_end_to_end: None,
            gflops_compute: Some(gflops),
            over_compute_and_copy: None,
        }
    }

    #[test]
    fn attention_on_a_gpu_is_a_fraction_of_flash_attention_2() {
        let c = comparisons("/nn/attention", "cuda", &[run(37_000.0), run(74_000.0)]);
        assert_eq!(c.len(), 1);
        assert!((c[0].ratio.unwrap() - 0.2).abs() < 1e-12, "{c:?}");
        // On the CPU the anchor is named but no ratio is claimed.
        let c = comparisons("/nn/attention", "cpu", &[run(50.0)]);
        assert_eq!(c[0].ratio, None);
        assert!(c[0].note.contains("NumPy"));
        assert!(comparisons("/zk/field_add", "cuda", &[run(1.0)]).is_empty());
        assert_eq!(
            comparisons("/embeddings/tables/t1/lookup", "cpu", &[]).len(),
            1
        );
    }
}
