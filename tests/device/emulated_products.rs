//! Kept products on the emulated device (`ops::linalg::kept`): a matmul asked to keep D
//! without answering it leaves D on the device, rounded to its dtype there exactly as
//! the host rounds; the next product that names it runs there and reads it in place
//! (nothing downloaded between the steps), with the CPU's answer; a precision that would
//! round it reads it back first; a read brings it to the host once. And the job alone:
//! the rounding at the edges of f16 and bf16, an overflow, a held operand the device
//! lost.

use super::emulated_kept::{downloaded, lease_of, reads_back, resident_placements, server};
use crate::common::TestServer;
use gpu_ops::backend::{GpuDevice, Job};
use gpu_ops::ops::linalg::held::HeldTensor;
use gpu_ops::ops::linalg::kept::{KeepOnDevice, KeptMatmulJob, TensorResult};
use gpu_ops::ops::linalg::{Compute, Dtype, MatmulJob, MatmulShape, Operands, Values};
use serde_json::{json, Value};
use std::sync::Arc;

async fn matmul(s: &TestServer, body: Value, ran_on: &str) -> Value {
    let res = s.post("/linalg/matmul", body).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let backend = res.headers()["x-backend"].to_str().unwrap().to_string();
    let answer: Value = res.json().await.unwrap();
    assert_eq!(backend, ran_on, "{answer}");
    answer
}

/// A rows × cols matrix of small integers (every product and sum below is exact in f32,
/// so any order of the sums gives the same bits).
fn integers(rows: usize, cols: usize, seed: usize) -> Value {
    let row = |r: usize| -> Vec<i64> {
        (0..cols)
            .map(|c| ((r * 5 + c * 3 + seed * 2) % 7) as i64 - 3)
            .collect()
    };
    json!((0..rows).map(row).collect::<Vec<_>>())
}

fn kept_on_device(answer: &Value) -> String {
    assert!(answer.get("result").is_none(), "{answer}");
    assert_eq!(answer["kept"]["held"], json!(["device"]), "{answer}");
    assert_eq!(answer["kept"]["kind"], "tensor", "{answer}");
    answer["kept"]["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_kept_chain_of_products_stays_on_the_emulated_device_until_read() {
    let s = server().await;
    let (x, w1, w2) = (integers(16, 32, 1), integers(32, 24, 2), integers(24, 8, 3));
    let product = |a: Value, b: Value, backend: &str| json!({"a": a, "b": b, "dtype": "bf16", "backend": backend});
    // The chain on the CPU, each D sent back.
    let h = matmul(&s, product(x.clone(), w1.clone(), "cpu"), "cpu").await["result"].clone();
    let want = matmul(&s, product(h.clone(), w2.clone(), "cpu"), "cpu").await["result"].clone();

    // On the device, the first D kept there.
    let before = downloaded(&s);
    let mut first = product(x, w1, "gpu");
    first["keep"] = json!({"with_data": false});
    let kept = kept_on_device(&matmul(&s, first, "emulated").await);
    // Four bytes came back: the rounding kernel's flag of a value that is not finite.
    assert_eq!(downloaded(&s), before + 4, "D stayed on the device");
    let key = gpu_ops::arrays::device_key(&kept);
    let gpus = s.state.backends.gpus();
    assert!(gpus[0].holds_table(&key));
    let listed: Value = s
        .get(&format!("/arrays/{kept}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (listed["dtype"].clone(), listed["shape"].clone()),
        (json!("bf16"), json!([16, 24])),
        "{listed}"
    );

    // `auto` takes the next product to the device holding A, which reads it in place.
    let resident = resident_placements(&s, "matmul");
    let before = downloaded(&s);
    let next = product(json!({"array": kept}), w2.clone(), "auto");
    let got = matmul(&s, next, "emulated").await;
    assert_eq!(resident_placements(&s, "matmul"), resident + 1);
    assert_eq!(got["result"], want, "the chain's answer is the CPU's");
    assert_eq!(
        downloaded(&s),
        before + 16 * 8 * 4,
        "only the answer came back"
    );

    // f64, which no held tensor can serve, is refused where it lies: nothing read back.
    let reads = reads_back(&s, "read");
    let mut wide = product(json!({"array": kept}), w2.clone(), "gpu");
    (wide["compute"], wide["dtype"]) = (json!("f64"), json!("f64"));
    let refused = s.post("/linalg/matmul", wide).send().await.unwrap();
    assert_eq!(refused.status(), 422);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(
        (
            problem["code"].clone(),
            problem["errors"][0]["path"].clone()
        ),
        (json!("array_mismatch"), json!("/a/array")),
        "{problem}"
    );
    assert_eq!(reads_back(&s, "read"), reads, "nothing was read back");
    assert!(gpus[0].holds_table(&key), "still held on the device");

    // A precision that rounds bf16 (f16: fewer exponent bits) reads it back first.
    let mut f16 = product(json!({"array": kept}), w2, "gpu");
    f16["compute"] = json!("f16");
    let on_f16 = matmul(&s, f16.clone(), "emulated").await;
    assert_eq!(reads_back(&s, "read"), reads + 1);
    f16["a"] = h.clone();
    f16["backend"] = json!("cpu");
    assert_eq!(on_f16["result"], matmul(&s, f16, "cpu").await["result"]);

    // Read: the CPU's D, held on the host and the disk from then on.
    let data: Value = s
        .get(&format!("/arrays/{kept}/data"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(data["tensor"], h, "{data}");
    let listed: Value = s
        .get(&format!("/arrays/{kept}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["held"], json!(["host", "disk"]), "{listed}");
    let deleted = s.delete(&format!("/arrays/{kept}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(!gpus[0].holds_table(&key));
    assert_eq!(gpus[0].kept_bytes(), 0);
}

/// `rows × 1` times `[[1]]`: D is A's column exactly (one product, no sum), so what the
/// device keeps is the rounding alone.
fn column_job(values: &[f32], output: Dtype) -> MatmulJob {
    let shape = MatmulShape {
        batch: 1,
        m: values.len(),
        n: 1,
        k: 1,
        a_batched: false,
        b_batched: false,
        c_batched: false,
        trans_a: false,
        trans_b: false,
    };
    let operands = Operands::F32 {
        a: values.to_vec().into(),
        b: vec![1.0f32].into(),
        c: None,
    };
    MatmulJob::new(shape, operands, 1.0, 0.0, Compute::F32, Dtype::F32, output).unwrap()
}

fn keep(key: &str, rows: usize) -> Option<KeepOnDevice> {
    Some(KeepOnDevice {
        key: key.into(),
        shape: vec![rows, 1],
    })
}

fn f32s(v: Values) -> Vec<f32> {
    v.into_f32()
}

#[test]
fn kept_products_are_rounded_on_the_device_as_on_the_host() {
    let dev = Arc::new(GpuDevice::emulated(0, 64 << 20));
    let lease = lease_of(&dev);
    let ulp16 = 2f32.powi(-10);
    // Ties, either side of them, f16's subnormals and its largest values, bf16's ties,
    // zero (a negative zero is no test: the product's sum starts from +0).
    let edges = [
        1.0 + ulp16 / 2.0,
        1.0 + 3.0 * ulp16 / 2.0,
        -(1.0 + ulp16 / 2.0 + 2f32.powi(-20)),
        2f32.powi(-25),
        3.0 * 2f32.powi(-25),
        2f32.powi(-24) * 1.5,
        6.1e-5,
        65503.0,
        65519.0,
        -65519.99,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        3.0e38,
        0.0,
        0.1,
        -1234.567,
    ];
    for output in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
        let finite: Vec<f32> = edges
            .iter()
            .copied()
            .filter(|x| output != Dtype::F16 || x.abs() < 65520.0)
            .collect();
        let key = format!("array/arr_round_{}", output.name());
        let job = KeptMatmulJob::new(
            column_job(&finite, output),
            Default::default(),
            keep(&key, finite.len()),
        );
        let TensorResult::Held(held) = job.run_device(&lease).unwrap().unwrap() else {
            panic!("{}: a finite product is kept", output.name());
        };
        let got = f32s(held.read_on(&lease).unwrap());
        let want: Vec<f32> = finite.iter().map(|&x| output.round(x)).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{}", output.name());
        assert_eq!(
            (held.dtype(), held.shape()),
            (output, &[finite.len(), 1][..])
        );
    }
    // 65520 rounds to f16's infinity: not kept, but answered, so the refusal can name it.
    let job = KeptMatmulJob::new(
        column_job(&[1.0, 65520.0], Dtype::F16),
        Default::default(),
        keep("array/arr_inf", 2),
    );
    let TensorResult::Host(values) = job.run_device(&lease).unwrap().unwrap() else {
        panic!("an overflow is not kept");
    };
    assert_eq!(values.first_non_finite(), Some(1));
    assert!(!dev.holds_table("array/arr_inf"));
}

#[test]
fn a_product_reads_a_held_operand_in_place_and_one_the_device_lost_is_named() {
    let dev = Arc::new(GpuDevice::emulated(0, 64 << 20));
    let lease = lease_of(&dev);
    let values: Vec<f32> = (0..64).map(|i| (i % 9) as f32 - 4.0).collect();
    let first = KeptMatmulJob::new(
        column_job(&values, Dtype::Bf16),
        Default::default(),
        keep("array/arr_h", 64),
    );
    let TensorResult::Held(held) = first.run_device(&lease).unwrap().unwrap() else {
        panic!("kept");
    };
    // Dᵀ (1 × 64) times a 64 × 3 matrix, Dᵀ read where the device holds it.
    let next = |held: Arc<HeldTensor>| {
        let shape = MatmulShape {
            batch: 1,
            m: 1,
            n: 3,
            k: 64,
            a_batched: false,
            b_batched: false,
            c_batched: false,
            trans_a: true,
            trans_b: false,
        };
        let b: Vec<f32> = (0..192).map(|i| (i % 5) as f32 - 2.0).collect();
        let operands = Operands::F32 {
            a: Vec::new().into(),
            b: b.into(),
            c: None,
        };
        let precision = (Compute::Bf16, Dtype::Bf16, Dtype::F32);
        let job = MatmulJob::checked(shape, operands, [true, false, false], (1.0, 0.0), precision)
            .unwrap();
        KeptMatmulJob::new(job, [Some(held), None, None], None)
    };
    let job = next(held.clone());
    assert_eq!(job.resident_on(), Some(0));
    let on_device = job.run_device(&lease).unwrap();
    let cpu = job.run_cpu();
    let (Ok(TensorResult::Host(d)), Ok(TensorResult::Host(c))) = (&on_device, &cpu) else {
        panic!("both answer on the host");
    };
    // Small integers: every order of the sums gives the same bits.
    assert_eq!(d, c);
    assert_eq!(job.agrees(&on_device, &cpu), Ok(()));
    let want: Vec<f32> = (0..3)
        .map(|j| {
            (0..64)
                .map(|p| values[p] * ((p * 3 + j) % 5) as f32 - 2.0 * values[p])
                .sum()
        })
        .collect();
    assert_eq!(f32s(d.clone()), want);

    // Lost (its device's context rebuilt): the product names operand 0, no device fault.
    dev.forget_table("array/arr_h");
    let Ok(Err(failed)) = next(held).run_device(&lease) else {
        panic!("a lost operand is the request's failure");
    };
    assert_eq!(failed.input, Some(0));
}
