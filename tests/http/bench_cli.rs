//! `gpu-ops bench` against a live server: counts, percentiles, the server's timing
//! headers and GFLOP/s in the report; the binary's JSON; a refused body fails the bench
//! before any load.

use crate::common;

use common::TestServer;
use gpu_ops::bench::{bodies, run, Length, Plan};
use std::time::Duration;

fn plan(s: &TestServer, op: &str, shape: &[usize]) -> Plan {
    plan_in(s, op, shape, bodies::Wire::Base64)
}

fn plan_in(s: &TestServer, op: &str, shape: &[usize], wire: bodies::Wire) -> Plan {
    let (path, body) = bodies::body(op, shape, "cpu", wire).unwrap();
    Plan {
        url: s.url.clone(),
        path: path.into(),
        body: body.bytes,
        content_type: body.content_type.into(),
        accept: body.accept.map(String::from),
        label: op.into(),
        concurrency: vec![1, 3],
        warmup: Length::Requests(2),
        length: Length::Requests(12),
        api_key: None,
        timeout: Duration::from_secs(30),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matmul_sweep_reports_every_request_and_its_gflops() {
    let s = TestServer::start(&[]).await;
    let report = run(&plan(&s, "matmul", &[2, 16, 8, 32])).await.unwrap();
    assert_eq!(report.flops, Some(2.0 * 2.0 * 16.0 * 8.0 * 32.0));
    assert_eq!(report.runs.len(), 2);
    for (run, c) in report.runs.iter().zip([1, 3]) {
        assert_eq!((run.concurrency, run.ok), (c, 12), "{run:?}");
        assert!(run.errors.is_empty());
        let l = run.latency_ms.as_ref().unwrap();
        assert!(0.0 < l.p50 && l.p50 <= l.p95 && l.p95 <= l.p99 && l.p99 <= l.max);
        let compute = run.compute_ms.as_ref().unwrap();
        // The server's compute time is part of what the client waited for.
        assert!(compute.p50 <= l.max, "{run:?}");
        assert!(run.queue_ms.is_some() && run.gflops_end_to_end.unwrap() > 0.0);
        // The latency over (compute + one copy of the body and answer) is at least the
        // share of it that compute and the copy explain.
        let over = run.over_compute_and_copy.unwrap();
        assert!(over > 0.0 && over.is_finite(), "{run:?}");
    }
    assert!(
        report.answer_bytes > 0 && report.memcpy_ms >= 0.0,
        "{report:?}"
    );
    let table = report.table();
    // Heading, columns, two runs; the backend that answered and what matmul is compared
    // with there (on the CPU: NumPy, no ratio claimed).
    assert!(
        table.contains("p99 ms") && table.lines().count() == 6,
        "{table}"
    );
    assert_eq!(report.backend.as_deref(), Some("cpu"));
    assert!(table.contains("answered on: cpu"), "{table}");
    assert_eq!(report.comparisons.len(), 1);
    assert_eq!(report.comparisons[0].ratio, None);
    assert!(report.comparisons[0].note.contains("NumPy"), "{table}");
    // Every known op's body is accepted, in every wire form.
    for wire in [
        bodies::Wire::Json,
        bodies::Wire::Base64,
        bodies::Wire::Binary,
    ] {
        for (op, shape) in [
            ("attention", vec![1, 2, 8, 4]),
            ("conv2d", vec![1, 2, 6, 6, 3, 3, 3]),
            ("embeddings_sinusoidal", vec![16, 8]),
            ("beam_channels", vec![2, 8, 4]),
            ("beam_sweep", vec![2, 8, 4]),
            ("field_add", vec![64]),
            ("ntt", vec![64]),
            ("msm", vec![32]),
            ("dp_privatize", vec![4, 16]),
        ] {
            let mut p = plan_in(&s, op, &shape, wire);
            p.concurrency = vec![2];
            p.warmup = Length::Requests(0);
            p.length = Length::Duration(Duration::from_millis(100));
            let r = run(&p)
                .await
                .unwrap_or_else(|e| panic!("{op} {wire:?}: {e}"));
            assert!(
                r.runs[0].ok > 0 && r.runs[0].errors.is_empty(),
                "{op} {wire:?}: {:?}",
                r.runs
            );
        }
    }
    // The bulk form states its flops in the answer's header as JSON does.
    let binary = run(&plan_in(
        &s,
        "matmul",
        &[2, 16, 8, 32],
        bodies::Wire::Binary,
    ))
    .await
    .unwrap();
    assert_eq!(binary.flops, report.flops);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_body_or_shape_fails_before_any_load() {
    let s = TestServer::start(&[]).await;
    let mut p = plan(&s, "matmul", &[4, 4, 4]);
    p.body = br#"{"a": [[1]], "b": [[1, 2], [3, 4]]}"#.to_vec();
    let e = run(&p).await.unwrap_err();
    assert!(e.contains("422"), "{e}");
    assert!(bodies::body("matmul", &[4, 4], "cpu", bodies::Wire::Json).is_err());
    assert!(bodies::body("nope", &[4], "cpu", bodies::Wire::Json)
        .unwrap_err()
        .contains("unknown op"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_writes_its_report_as_json() {
    let s = TestServer::start(&[]).await;
    let url = s.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
            .args([
                "bench",
                "--url",
                &url,
                "--op",
                "embeddings_sinusoidal",
                "--shape",
                "32,16",
            ])
            .args([
                "--concurrency",
                "1,2",
                "--duration",
                "5",
                "--warmup",
                "1",
                "--json",
                "-",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["path"], "/embeddings/sinusoidal");
    assert_eq!(report["runs"][1]["concurrency"], 2);
    assert_eq!(report["runs"][1]["ok"], 5);
    assert!(report["runs"][0]["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    // A bad argument exits 2 with one line.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
        .args(["bench", "--op", "matmul", "--shape", "4,x,4"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--shape"));
}
