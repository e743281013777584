//! GPU parity: every field kernel against the CPU twin, bit for bit, on random and edge
//! inputs, through the real service path. Runs where a CUDA device is usable and says
//! why it skips elsewhere. On a GPU host: `scripts/gpu-check.sh run`.

use gpu_ops::backend::cuda::{discover, DeviceSelection};
use gpu_ops::ops::zk::samples::{edge_values, random_elements};
use gpu_ops::ops::zk::{Field, FieldBinaryJob, FieldOp, FieldVec, U256};

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
    let cache = std::env::temp_dir().join("gpu-ops-parity-kernels");
    let (devices, reason) = discover(&DeviceSelection::All, &cache);
    if devices.is_empty() {
        eprintln!("SKIP cuda_field_ops_are_bit_identical_to_the_cpu: {reason}");
        return;
    }
    for dev in &devices {
        eprintln!(
            "GPU {}: {} (sm {}, {})",
            dev.info.ordinal, dev.info.name, dev.info.compute_capability, dev.info.kernel_arch
        );
        // Sizes cross the grid-stride boundary (more elements than threads launched).
        for n in [1usize, 255, 257, 100_000, 3_000_000] {
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
                        let gpu = gpu_ops::ops::zk::run_field_binary_cuda(&job, &lease)
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
