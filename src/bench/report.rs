//! What a bench run measured: per concurrency, throughput, latency percentiles, the
//! server's queue and compute times, and GFLOP/s; as a table and as JSON.

use super::anchors::{comparisons, Comparison};
use super::{Length, Plan};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// One answered request.
pub struct Sample {
    pub latency_ms: f64,
    pub status: u16,
    pub queue_ms: Option<f64>,
    pub compute_ms: Option<f64>,
}

/// The p-th percentile (0 < p ≤ 100) of `sorted` by nearest rank; None when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p95, p99, max and mean of some milliseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Spread {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Option<Self> {
        values.sort_by(f64::total_cmp);
        let at = |p| percentile(&values, p);
        Some(Self {
            p50: at(50.0)?,
            p95: at(95.0)?,
            p99: at(99.0)?,
            max: *values.last()?,
            mean: values.iter().sum::<f64>() / values.len() as f64,
        })
    }
}

/// One concurrency's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub concurrency: usize,
    pub seconds: f64,
    /// Answered 2xx.
    pub ok: usize,
    /// Other answers, by status; 0 counts requests that got no HTTP answer (refused,
    /// reset, or past --timeout).
    pub errors: BTreeMap<u16, usize>,
    pub throughput_per_second: f64,
    /// Of the 2xx answers, as the client saw them (the body read whole).
    pub latency_ms: Option<Spread>,
    pub queue_ms: Option<Spread>,
    pub compute_ms: Option<Spread>,
    /// flops × answers per second.
    pub gflops_end_to_end: Option<f64>,
    /// flops over the server's mean compute time.
    pub gflops_compute: Option<f64>,
    /// The median latency over (the median compute time + one memcpy of the request and
    /// answer bytes, `Report::memcpy_ms`): 1 would be a service that costs nothing beyond
    /// the work and one copy of its data.
    pub over_compute_and_copy: Option<f64>,
}

impl Run {
    pub fn from_samples(
        concurrency: usize,
        elapsed: Duration,
        samples: &[Sample],
        flops: Option<f64>,
    ) -> Self {
        let ok: Vec<&Sample> = samples
            .iter()
            .filter(|s| (200..300).contains(&s.status))
            .collect();
        let mut errors = BTreeMap::new();
        for s in samples.iter().filter(|s| !(200..300).contains(&s.status)) {
            *errors.entry(s.status).or_insert(0) += 1;
        }
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let throughput = ok.len() as f64 / seconds;
        let compute_ms = Spread::of(ok.iter().filter_map(|s| s.compute_ms).collect());
        Self {
            concurrency,
            seconds,
            ok: ok.len(),
            errors,
            throughput_per_second: throughput,
            latency_ms: Spread::of(ok.iter().map(|s| s.latency_ms).collect()),
            queue_ms: Spread::of(ok.iter().filter_map(|s| s.queue_ms).collect()),
            gflops_end_to_end: flops.map(|f| f * throughput / 1e9),
            gflops_compute: flops
                .zip(compute_ms.as_ref())
                .filter(|(_, c)| c.mean > 0.0)
                .map(|(f, c)| f / (c.mean * 1e-3) / 1e9),
            compute_ms,
            over_compute_and_copy: None,
        }
    }
}

/// The fastest of five copies of `bytes` bytes into a buffer already touched, in ms:
/// what one memcpy of a request and its answer costs on this machine, at best.
pub fn memcpy_ms(bytes: usize) -> f64 {
    let from = vec![1u8; bytes];
    let mut to = vec![0u8; bytes];
    (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&to);
            started.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub url: String,
    pub path: String,
    pub label: String,
    pub body_bytes: usize,
    /// The first answer's bytes.
    pub answer_bytes: usize,
    /// One memcpy of the body and the answer on this machine (`memcpy_ms`).
    pub memcpy_ms: f64,
    /// The answer's `flops`, where it states them.
    pub flops: Option<f64>,
    pub warmup: String,
    pub length: String,
    /// When the report was made (RFC 3339, UTC).
    pub finished_at: String,
    /// The backend that answered the first request (`x-backend`).
    pub backend: Option<String>,
    pub runs: Vec<Run>,
    /// What the op is compared with on that backend (`bench::anchors`).
    pub comparisons: Vec<Comparison>,
}

fn describe(l: Length) -> String {
    match l {
        Length::Duration(d) => format!("{:.3}s", d.as_secs_f64()),
        Length::Requests(n) => format!("{n} requests"),
    }
}

impl Report {
    pub fn new(plan: &Plan, flops: Option<f64>, backend: Option<String>, runs: Vec<Run>) -> Self {
        let comparisons = comparisons(&plan.path, backend.as_deref().unwrap_or(""), &runs);
        Self {
            backend,
            comparisons,
            url: plan.url.clone(),
            path: plan.path.clone(),
            label: plan.label.clone(),
            body_bytes: plan.body.len(),
            answer_bytes: 0,
            memcpy_ms: 0.0,
            flops,
            warmup: describe(plan.warmup),
            length: describe(plan.length),
            finished_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string(),
            runs,
        }
    }

    /// With the answer's size and the cost of one copy of the body and answer, and each
    /// run's latency over (its compute + that copy).
    pub fn with_transfer(mut self, answer_bytes: usize, memcpy_ms: f64) -> Self {
        self.answer_bytes = answer_bytes;
        self.memcpy_ms = memcpy_ms;
        for r in &mut self.runs {
            r.over_compute_and_copy = r
                .latency_ms
                .as_ref()
                .zip(r.compute_ms.as_ref())
                .map(|(l, c)| l.p50 / (c.p50 + memcpy_ms))
                .filter(|x| x.is_finite());
        }
        self
    }

    /// A fixed-width table, one row per concurrency.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} {} ({}; body {} bytes, answer {} bytes, one memcpy of both {:.3} ms; warm-up {}, each run {})\n",
            self.label,
            self.path,
            self.url,
            self.body_bytes,
            self.answer_bytes,
            self.memcpy_ms,
            self.warmup,
            self.length
        );
        out.push_str(&format!(
            "{:>5} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9}\n",
            "conc",
            "ok",
            "errors",
            "req/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "queue p50",
            "comp p50",
            "GFLOP/s",
            "comp GF/s",
            "p50/(c+cp)"
        ));
        let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        for r in &self.runs {
            let l = r.latency_ms.as_ref();
            out.push_str(&format!(
                "{:>5} {:>8} {:>6} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9}\n",
                r.concurrency,
                r.ok,
                r.errors.values().sum::<usize>(),
                r.throughput_per_second,
                f(l.map(|s| s.p50)),
                f(l.map(|s| s.p95)),
                f(l.map(|s| s.p99)),
                f(r.queue_ms.as_ref().map(|s| s.p50)),
                f(r.compute_ms.as_ref().map(|s| s.p50)),
                f(r.gflops_end_to_end),
                f(r.gflops_compute),
                f(r.over_compute_and_copy),
            ));
        }
        if let Some(b) = &self.backend {
            out.push_str(&format!("answered on: {b}\n"));
        }
        for c in &self.comparisons {
            let ratio = c.ratio.map_or(String::new(), |r| format!(": {r:.3} of it"));
            out.push_str(&format!(
                "compared with {}{ratio} ({})\n",
                c.reference, c.note
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), Some(2.0));
    }

    #[test]
    fn runs_count_errors_apart_and_derive_gflops() {
        let s = |latency_ms, status, compute| Sample {
            latency_ms,
            status,
            queue_ms: Some(0.5),
            compute_ms: Some(compute),
        };
        let samples = [
            s(10.0, 200, 4.0),
            s(20.0, 200, 6.0),
            s(1.0, 503, 0.0),
            s(1.0, 503, 0.0),
        ];
        let r = Run::from_samples(2, Duration::from_secs(2), &samples, Some(2e9));
        assert_eq!((r.ok, r.errors[&503]), (2, 2));
        assert_eq!(r.throughput_per_second, 1.0);
        assert_eq!(r.latency_ms.as_ref().unwrap().p50, 10.0);
        assert_eq!(r.latency_ms.as_ref().unwrap().max, 20.0);
        assert_eq!(r.gflops_end_to_end, Some(2.0));
        // 2 GFLOP over a mean of 5 ms.
        assert!((r.gflops_compute.unwrap() - 400.0).abs() < 1e-9);
    }

    #[test]
    fn latency_is_set_against_compute_and_one_copy() {
        let s = |latency_ms, compute| Sample {
            latency_ms,
            status: 200,
            queue_ms: Some(0.1),
            compute_ms: Some(compute),
        };
        let run = Run::from_samples(
            1,
            Duration::from_secs(1),
            &[s(12.0, 8.0), s(12.0, 8.0)],
            None,
        );
        let plan = Plan {
            url: "http://x".into(),
            path: "/linalg/matmul".into(),
            body: vec![0; 10],
            content_type: "application/json".into(),
            accept: None,
            label: "t".into(),
            concurrency: vec![1],
            warmup: Length::Requests(0),
            length: Length::Requests(2),
            api_key: None,
            timeout: Duration::from_secs(1),
        };
        let report = Report::new(&plan, None, None, vec![run]).with_transfer(90, 2.0);
        assert_eq!((report.answer_bytes, report.memcpy_ms), (90, 2.0));
        // 12 ms over (8 ms of compute + 2 ms of copying).
        assert_eq!(report.runs[0].over_compute_and_copy, Some(1.2));
        assert!(report.table().contains("1.200"), "{}", report.table());
        // A copy of 1 MiB takes some time, and not a second.
        let copy = memcpy_ms(1 << 20);
        assert!(copy > 0.0 && copy < 1e3, "{copy} ms");
    }
}
