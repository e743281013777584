//! Kept results held on the emulated device: an NTT → product → inverse NTT chain whose
//! intermediates stay on the device (nothing downloaded between the steps, each later
//! step placed where its operands are), read back only when read, with the CPU's answers;
//! a result the device lost is 410 array_lost at the operand that names it. And the job
//! alone: a result nobody adopts leaves the device, one the cache cannot hold comes back,
//! and one read on another stream waits for the kernel that wrote it.

use super::emulated_http::strings;
use crate::common::{problem, TestServer};
use gpu_ops::backend::{DeviceLease, GpuDevice, Job};
use gpu_ops::ops::zk::held::{FieldResult, FieldSource, FieldStep, KeptFieldJob};
use gpu_ops::ops::zk::ntt::{Direction, Order};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{Field, FieldOp, FieldVec};
use serde_json::{json, Value};
use std::sync::Arc;

/// A server of its own: the copy counters below count this test's jobs alone. No shadow
/// checks, which would read kept results back to compare them.
pub(super) async fn server() -> TestServer {
    TestServer::start(&[
        "--backend",
        "auto",
        "--emulate-device",
        "--verify-fraction",
        "0",
        "--job-timeout",
        "600s",
    ])
    .await
}

/// A lease of `dev` that keeps results there (`DeviceLease::set_handle`).
pub(super) fn lease_of(dev: &Arc<GpuDevice>) -> DeviceLease<'_> {
    let mut lease = dev.lease().unwrap();
    lease.set_handle(dev.clone());
    lease
}

/// Host bytes device jobs downloaded so far.
pub(super) fn downloaded(s: &TestServer) -> u64 {
    ["page_locked", "pageable"]
        .iter()
        .map(|memory| {
            s.state
                .metrics
                .device_copy_bytes
                .with_label_values(&["0", "from_device", memory])
                .get()
        })
        .sum()
}

pub(super) fn resident_placements(s: &TestServer, op: &str) -> u64 {
    s.state
        .metrics
        .placements
        .with_label_values(&[op, "emulated", "resident"])
        .get()
}

/// POSTs `body` to `path` and returns the answer (200, run on `ran_on`).
async fn run(s: &TestServer, path: &str, body: Value, ran_on: &str) -> Value {
    let res = s.post(path, body).send().await.unwrap();
    assert_eq!(res.status(), 200, "{path}");
    assert_eq!(res.headers()["x-backend"], ran_on, "{path}");
    res.json().await.unwrap()
}

/// POSTs `body` over `field` to `path` on the CPU, and returns its result.
async fn on_cpu(s: &TestServer, field: &str, path: &str, mut body: Value) -> Value {
    body["field"] = json!(field);
    body["backend"] = json!("cpu");
    run(s, path, body, "cpu").await["result"].clone()
}

/// The id of the array an answer kept, which must be held on the device only.
fn kept_on_device(answer: &Value) -> String {
    assert!(answer.get("result").is_none(), "{answer}");
    assert_eq!(answer["kept"]["held"], json!(["device"]), "{answer}");
    answer["kept"]["id"].as_str().unwrap().to_string()
}

const KEEP: &str = r#"{"with_data": false}"#;

fn keep() -> Value {
    serde_json::from_str(KEEP).unwrap()
}

#[tokio::test]
async fn a_kept_chain_stays_on_the_emulated_device_until_read() {
    let s = server().await;
    for (i, field) in [Field::Goldilocks, Field::Bn254Fr].into_iter().enumerate() {
        let n = 1024;
        let (x, y) = (
            strings(field, n, 70 + i as u64),
            strings(field, n, 80 + i as u64),
        );
        let f = field.name();
        // The chain on the CPU, values sent and returned each step.
        let fx = on_cpu(&s, f, "/zk/ntt", json!({"values": x})).await;
        let fy = on_cpu(&s, f, "/zk/ntt", json!({"values": y})).await;
        let fz = on_cpu(&s, f, "/zk/field_mul", json!({"a": fx, "b": fy})).await;
        let want = on_cpu(&s, f, "/zk/intt", json!({"values": fz})).await;

        // The same chain on the device, keeping every intermediate there.
        let before = downloaded(&s);
        let dev = |path: &'static str, body: Value, backend: &str| {
            let mut b = body;
            b["field"] = json!(f);
            b["backend"] = json!(backend);
            run(&s, path, b, "emulated")
        };
        let keep = keep();
        let ax = kept_on_device(&dev("/zk/ntt", json!({"values": x, "keep": keep}), "gpu").await);
        let ay = kept_on_device(&dev("/zk/ntt", json!({"values": y, "keep": keep}), "gpu").await);
        // `auto` takes the product to the device that holds its operands.
        let resident = resident_placements(&s, "field_mul");
        let product = json!({"a": {"array": ax}, "b": {"array": ay}, "keep": keep});
        let az = kept_on_device(&dev("/zk/field_mul", product, "auto").await);
        assert_eq!(resident_placements(&s, "field_mul"), resident + 1);
        assert_eq!(
            downloaded(&s),
            before,
            "{f}: nothing downloaded between the steps"
        );
        let last = dev("/zk/intt", json!({"values": {"array": az}}), "auto").await;
        assert_eq!(last["result"], want, "{f}: the chain's answer is the CPU's");
        let width = if field == Field::Goldilocks { 8 } else { 32 };
        assert_eq!(
            downloaded(&s),
            before + (n * width) as u64,
            "{f}: the answer, and only it, came back"
        );

        // Read: the values come back once and are then held on the host and the disk.
        let reads = reads_back(&s, "read");
        let listed: Value = s.get(&format!("/arrays/{ax}")).await.json().await.unwrap();
        assert_eq!(listed["held"], json!(["device"]), "{listed}");
        let data: Value = s
            .get(&format!("/arrays/{ax}/data"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(data["values"], fx, "{f}: the kept NTT is the CPU's");
        assert_eq!(reads_back(&s, "read"), reads + 1);
        let listed: Value = s.get(&format!("/arrays/{ax}")).await.json().await.unwrap();
        assert_eq!(listed["held"], json!(["host", "disk"]), "{listed}");
        // A held array named on the CPU is read back for it.
        let forced = json!({"field": f, "a": {"array": ay}, "b": fx, "backend": "cpu"});
        let sum = run(&s, "/zk/field_add", forced, "cpu").await;
        let plain = json!({"field": f, "a": fy, "b": fx, "backend": "cpu"});
        assert_eq!(
            sum["result"],
            run(&s, "/zk/field_add", plain, "cpu").await["result"]
        );
        assert_eq!(reads_back(&s, "read"), reads + 2);

        // Deleting a held array takes the device's copy with it.
        let key = gpu_ops::arrays::device_key(&az);
        let gpus = s.state.backends.gpus();
        assert!(gpus[0].holds_table(&key));
        let deleted = s.delete(&format!("/arrays/{az}")).send().await.unwrap();
        assert_eq!(deleted.status(), 204);
        assert!(!gpus[0].holds_table(&key));
        assert_eq!(
            gpus[0].kept_bytes(),
            0,
            "{f}: nothing else is held only there"
        );
    }
    a_lost_result_is_gone(&s).await;
}

/// A power of a kept result stays on the device too, over every field (the word fields'
/// exponents are the kernel's u64 or u32 limbs): nothing is downloaded between the NTT
/// and the power, the step is placed where its base is, and the values read back are
/// the CPU's, with one exponent for all and one per element. So do the inverses of a kept
/// vector, its zeros counted on the device: a vector of zeros is 422 not_invertible.
#[tokio::test]
async fn a_kept_power_stays_on_the_emulated_device() {
    let s = server().await;
    for (i, field) in Field::ALL.into_iter().enumerate() {
        let (n, f) = (256, field.name());
        let x = strings(field, n, 90 + i as u64);
        let exponents: Vec<String> = (0..n).map(|j| (j * j + 3).to_string()).collect();
        for exponent in [json!(["65537"]), json!(exponents)] {
            let fx = on_cpu(&s, f, "/zk/ntt", json!({"values": x})).await;
            let want = on_cpu(
                &s,
                f,
                "/zk/field_pow",
                json!({"base": fx, "exponent": exponent}),
            )
            .await;

            let body = json!({"field": f, "values": x, "keep": keep(), "backend": "gpu"});
            let ax = kept_on_device(&run(&s, "/zk/ntt", body, "emulated").await);
            let before = downloaded(&s);
            let resident = resident_placements(&s, "field_pow");
            let power =
                json!({"field": f, "base": {"array": ax}, "exponent": exponent, "keep": keep()});
            let ap = kept_on_device(&run(&s, "/zk/field_pow", power, "emulated").await);
            assert_eq!(resident_placements(&s, "field_pow"), resident + 1, "{f}");
            assert_eq!(downloaded(&s), before, "{f}: nothing downloaded");
            let data: Value = s
                .get(&format!("/arrays/{ap}/data"))
                .await
                .json()
                .await
                .unwrap();
            assert_eq!(data["values"], want, "{f}: the kept power is the CPU's");
        }
        // The inverses of a held vector, kept there too; zeros are refused where held.
        let body = json!({"field": f, "values": x, "keep": keep(), "backend": "gpu"});
        let ax = kept_on_device(&run(&s, "/zk/ntt", body, "emulated").await);
        let before = downloaded(&s);
        let inverse = json!({"field": f, "values": {"array": ax}, "keep": keep()});
        let ai = kept_on_device(&run(&s, "/zk/field_inv", inverse, "emulated").await);
        // Four bytes came back: the device's flag of a zero (none).
        assert_eq!(
            downloaded(&s),
            before + 4,
            "{f}: the vector stayed on the device"
        );
        let fx = on_cpu(&s, f, "/zk/ntt", json!({"values": x})).await;
        let want = on_cpu(&s, f, "/zk/field_inv", json!({"values": fx})).await;
        let data: Value = s
            .get(&format!("/arrays/{ai}/data"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(data["values"], want, "{f}: the kept inverses are the CPU's");
        let zeros = json!({"field": f, "a": {"array": ax}, "b": {"array": ax}, "keep": keep()});
        let az = kept_on_device(&run(&s, "/zk/field_sub", zeros, "emulated").await);
        let res = s
            .post(
                "/zk/field_inv",
                json!({"field": f, "values": {"array": az}}),
            )
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, "not_invertible").await;
        assert_eq!(p["errors"][0]["path"], "/values/0", "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{n} zero")),
            "{p}"
        );
    }
}

/// Takes `dev`'s lease on a thread of its own, held until the sender is sent to.
fn hold_lease(dev: Arc<GpuDevice>) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (taken, release) = std::sync::mpsc::channel::<()>();
    let (held, wait) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _lease = dev.lease().unwrap();
        held.send(()).unwrap();
        let _ = release.recv();
    });
    wait.recv().unwrap();
    (taken, holder)
}

pub(super) fn reads_back(s: &TestServer, result: &str) -> u64 {
    s.state
        .metrics
        .array_reads_back
        .with_label_values(&[result])
        .get()
}

/// A kept result the device no longer has (as after its context was rebuilt): the step
/// that names it and a read of it are 410 array_lost, and the array is gone.
async fn a_lost_result_is_gone(s: &TestServer) {
    let x = strings(Field::BabyBear, 64, 5);
    let body = json!({"field": "babybear", "values": x, "keep": keep(), "backend": "gpu"});
    let kept = run(s, "/zk/ntt", body.clone(), "emulated").await;
    let gone = kept_on_device(&kept);
    let other = kept_on_device(&run(s, "/zk/ntt", body, "emulated").await);
    let gpus = s.state.backends.gpus();
    for id in [&gone, &other] {
        gpus[0].forget_table(&gpu_ops::arrays::device_key(id));
    }
    let step = json!({"field": "babybear", "a": x, "b": {"array": gone}});
    let res = s.post("/zk/field_add", step).send().await.unwrap();
    let p = problem(res, 410, "array_lost").await;
    assert_eq!(p["errors"][0]["path"], "/b/array", "{p}");
    let lost = reads_back(s, "lost");
    let res = s.get(&format!("/arrays/{other}/data")).await;
    problem(res, 410, "array_lost").await;
    assert_eq!(reads_back(s, "lost"), lost + 1);
    let res = s.get(&format!("/arrays/{other}")).await;
    assert_eq!(res.status(), 404, "a lost array is gone");
}

/// A read of a result held on a device waits for a lease there no longer than
/// `--job-timeout`: with the device's one lease taken, the read is 504
/// deadline_exceeded after about that long and the array is still held; freed, the
/// same read answers the values. A step that names a held result deleted while it
/// waited for the device is 422 unknown_array, not 410 array_lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_back_waits_for_the_device_no_longer_than_a_job() {
    let s = TestServer::start(&[
        "--backend",
        "auto",
        "--emulate-device",
        "--verify-fraction",
        "0",
        "--gpu-jobs-per-device",
        "1",
        "--job-timeout",
        "5s",
        // No calibration jobs: the only jobs that wait for the device are the test's.
        "--placement-calibration-budget",
        "0s",
    ])
    .await;
    let x = strings(Field::Goldilocks, 256, 11);
    let body = json!({"field": "goldilocks", "values": x, "keep": keep(), "backend": "gpu"});
    let id = kept_on_device(&run(&s, "/zk/ntt", body, "emulated").await);
    let want = run(
        &s,
        "/zk/ntt",
        json!({"field": "goldilocks", "values": x, "backend": "cpu"}),
        "cpu",
    )
    .await["result"]
        .clone();
    let dev = s.state.backends.gpus()[0].clone();
    let (taken, holder) = hold_lease(dev);
    let deadlines = reads_back(&s, "deadline");
    let started = std::time::Instant::now();
    let res = s.get(&format!("/arrays/{id}/data")).await;
    let waited = started.elapsed();
    problem(res, 504, "deadline_exceeded").await;
    assert!(
        waited >= std::time::Duration::from_millis(4900)
            && waited < std::time::Duration::from_secs(30),
        "{waited:?}"
    );
    assert_eq!(reads_back(&s, "deadline"), deadlines + 1);
    let listed: Value = s.get(&format!("/arrays/{id}")).await.json().await.unwrap();
    assert_eq!(listed["held"], json!(["device"]), "still held: {listed}");
    taken.send(()).unwrap();
    holder.join().unwrap();
    let data: Value = s
        .get(&format!("/arrays/{id}/data"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(data["values"], want);

    // A step that names a held result deleted while the step waited for the device is
    // 422 unknown_array at the operand, as if it had been deleted before.
    let body = json!({"field": "goldilocks", "values": x, "keep": keep(), "backend": "gpu"});
    let doomed = kept_on_device(&run(&s, "/zk/ntt", body, "emulated").await);
    let dev = s.state.backends.gpus()[0].clone();
    let (taken, holder) = hold_lease(dev);
    let step = s
        .post(
            "/zk/field_add",
            json!({"field": "goldilocks", "a": x, "b": {"array": doomed}, "backend": "gpu"}),
        )
        .send();
    let step = tokio::spawn(step);
    // Deleted once the step waits for the device (its operand resolved before).
    let dev = s.state.backends.gpus()[0].clone();
    // (Within the step's 5 s deadline, however busy the machine.)
    for _ in 0..800 {
        if dev.jobs_waiting() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(dev.jobs_waiting() >= 1, "the step waits for the device");
    let deleted = s.delete(&format!("/arrays/{doomed}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    taken.send(()).unwrap();
    holder.join().unwrap();
    let p = problem(step.await.unwrap().unwrap(), 422, "unknown_array").await;
    assert_eq!(p["errors"][0]["path"], "/b/array", "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("while this step waited"), "{p}");
}

/// The job alone, on a lease with its device's handle: a result kept on the device and
/// dropped before any array adopted it (its request gone) leaves the device; a result
/// the cache has no room for comes back to the host, equal to the CPU's.
#[test]
fn a_kept_result_nobody_stores_leaves_the_device() {
    let dev = Arc::new(GpuDevice::emulated(0, 64 << 20));
    let values = FieldVec::from_integers(
        Field::Goldilocks,
        &random_elements(Field::Goldilocks, 256, 9),
    )
    .unwrap();
    let step = forward_ntt();
    let job = |key: &str| {
        let source = FieldSource::Host {
            values: values.clone(),
            key: None,
        };
        KeptFieldJob::ntt(source, step.clone(), 32, Some(key.to_string())).unwrap()
    };
    let run = |job: &KeptFieldJob| job.run_device(&lease_of(&dev)).unwrap().unwrap();
    let kept = run(&job("array/arr_dropped"));
    assert!(matches!(kept, FieldResult::Held(_)));
    // A shadow check whose CPU twin found an operand gone has nothing to compare: that
    // is no mismatch (which would quarantine the kernels).
    let gone = Err(gpu_ops::ops::zk::held::StepFailed {
        input: Some(0),
        message: "deleted".into(),
        not_invertible: None,
    });
    assert_eq!(job("array/x").agrees(&Ok(kept.clone()), &gone), Ok(()));
    assert!(dev.holds_table("array/arr_dropped") && dev.kept_bytes() == 256 * 8);
    drop(kept);
    assert!(
        !dev.holds_table("array/arr_dropped"),
        "its pinned copy went with it"
    );
    assert_eq!(dev.kept_bytes(), 0);

    // No room in the cache: downloaded instead, the CPU twin's answer.
    dev.set_table_cache_limit(1024);
    let cpu = job("array/arr_full").run_cpu().unwrap();
    let (FieldResult::Host(on_host), FieldResult::Host(want)) = (run(&job("array/arr_full")), cpu)
    else {
        panic!("a result the cache cannot hold is not held");
    };
    assert_eq!(on_host, want);
    assert!(!dev.holds_table("array/arr_full"));
}

/// A result kept by one lease's stream, read by another lease's while the first still
/// holds its own: the reader waits for the event that ends the writing kernel (without
/// it the emulated device's order check refuses the read), and the sum is the CPU's.
#[test]
fn a_kept_result_is_read_on_another_stream_after_its_kernel() {
    let dev = Arc::new(GpuDevice::emulated(0, 64 << 20));
    let field = Field::Bn254Fr;
    let vector = |seed| FieldVec::from_integers(field, &random_elements(field, 512, seed)).unwrap();
    let (x, y) = (vector(3), vector(4));
    let lease = || {
        let mut l = dev.lease_for(None, 1 << 20).unwrap();
        l.set_handle(dev.clone());
        l
    };
    let (first, second) = (lease(), lease());
    let host = |values: &FieldVec| FieldSource::Host {
        values: values.clone(),
        key: None,
    };
    let step = forward_ntt();
    let ntt = KeptFieldJob::ntt(host(&x), step, 32, Some("array/arr_x".into())).unwrap();
    let FieldResult::Held(held) = ntt.run_device(&first).unwrap().unwrap() else {
        panic!("kept on the device");
    };
    let sum = KeptFieldJob::binary(FieldOp::Add, FieldSource::Held(held), host(&y), None).unwrap();
    let on_device = sum.run_device(&second).unwrap().unwrap();
    let fx = on_host(ntt.run_cpu().unwrap());
    let want = KeptFieldJob::binary(FieldOp::Add, host(&fx), host(&y), None).unwrap();
    assert_eq!(on_host(on_device), on_host(want.run_cpu().unwrap()));
    drop((first, second));
}

/// An inversion of a held vector, on the lease of its device: the inverses are the
/// CPU's (every width of element), and a held vector with one zero, late in it, is
/// refused naming that element, found where the vector lies; the shadow check holds a
/// side that missed the zero against the other.
#[test]
fn a_held_vector_is_inverted_where_it_lies_and_its_zeros_are_named() {
    let dev = Arc::new(GpuDevice::emulated(0, 64 << 20));
    let lease = lease_of(&dev);
    // Each width of element: 8, 2 and 1 u32 words.
    for field in [Field::Bn254Fr, Field::Goldilocks, Field::BabyBear] {
        let x = FieldVec::from_integers(field, &random_elements(field, 256, 11)).unwrap();
        let mut with_zero = random_elements(field, 256, 12);
        with_zero[237] = gpu_ops::ops::zk::U256::ZERO;
        let y = FieldVec::from_integers(field, &with_zero).unwrap();
        let host = |values: &FieldVec| FieldSource::Host {
            values: values.clone(),
            key: None,
        };
        let held = |job: KeptFieldJob| match job.run_device(&lease).unwrap().unwrap() {
            FieldResult::Held(h) => h,
            FieldResult::Host(_) => panic!("{}: kept on the device", field.name()),
        };
        let hx = held(
            KeptFieldJob::ntt(
                host(&x),
                forward_ntt(),
                32,
                Some(format!("array/arr_nx_{}", field.name())),
            )
            .unwrap(),
        );
        let inverse = KeptFieldJob::inv(FieldSource::Held(hx), None).unwrap();
        let got = on_host(inverse.run_device(&lease).unwrap().unwrap());
        assert_eq!(got, on_host(inverse.run_cpu().unwrap()), "{}", field.name());
        let xy = KeptFieldJob::binary(
            FieldOp::Mul,
            host(&x),
            host(&y),
            Some(format!("array/arr_xy_{}", field.name())),
        )
        .unwrap();
        let inverse = KeptFieldJob::inv(FieldSource::Held(held(xy)), None).unwrap();
        let Ok(Err(refused)) = inverse.run_device(&lease) else {
            panic!("{}: a zero is refused", field.name());
        };
        let zeros = gpu_ops::ops::zk::InvError::Zeros {
            indices: vec![237],
            count: 1,
        };
        assert_eq!(refused.not_invertible, Some(zeros), "{}", field.name());
        let cpu = inverse.run_cpu();
        assert!(inverse.agrees(&Err(refused), &cpu).is_ok());
        let missed = Ok(FieldResult::Host(y.clone()));
        assert!(inverse.agrees(&missed, &cpu).is_err(), "{}", field.name());
    }
}

/// One forward transform in natural order.
fn forward_ntt() -> FieldStep {
    FieldStep::Ntt {
        direction: Direction::Forward,
        batch: 1,
        input_order: Order::Natural,
        output_order: Order::Natural,
        coset_shift: None,
    }
}

/// The values of a result on the host.
fn on_host(r: FieldResult) -> FieldVec {
    match r {
        FieldResult::Host(v) => v,
        FieldResult::Held(_) => panic!("expected the values on the host"),
    }
}
