//! Every metric the service exports, in one place. Names carry the `gpu_ops_` prefix
//! and base units (seconds, bytes, ratios 0–1). One registry per app instance, so
//! tests can run several servers in one process.

use prometheus::{
    exponential_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub queue_depth: IntGauge,
    pub queue_capacity: IntGauge,
    pub jobs_running: IntGauge,
    pub cpu_inline_jobs: IntCounterVec,
    pub http_body_bytes_in_flight: IntGauge,
    pub connections_open: IntGauge,
    pub connections_refused: IntCounterVec,
    pub tenant_requests_refused: IntCounterVec,
    pub http_bodies_refused: IntCounterVec,
    pub secagg_rounds_expired: IntCounter,
    pub job_queue_wait: HistogramVec,
    pub job_compute: HistogramVec,
    pub jobs: IntCounterVec,
    pub fallbacks: IntCounterVec,
    pub elements: IntCounterVec,
    pub bytes: IntCounterVec,
    pub device_healthy: IntGaugeVec,
    pub kernel_verified: IntGaugeVec,
    pub shadow_checks: IntCounterVec,
    pub gpu_utilization: GaugeVec,
    pub gpu_memory_used: GaugeVec,
    pub gpu_memory_total: GaugeVec,
    pub gpu_temperature: GaugeVec,
    pub gpu_power: GaugeVec,
    pub gpu_sm_clock: GaugeVec,
    pub dp_budget_charges: IntCounterVec,
    pub dp_noise_values: IntCounterVec,
    pub shamir_share_checks: IntCounterVec,
    pub secagg_rounds: IntCounterVec,
    pub secagg_submissions: IntCounterVec,
    pub he_ciphertexts: IntCounterVec,
    pub batch_size: HistogramVec,
    pub dataset_samples: IntCounterVec,
    pub dataset_jobs: IntCounterVec,
    pub dataset_batches: IntCounterVec,
    pub dataset_submissions_refused: IntCounterVec,
}

/// (name, help) of every metric, for the README and the test that checks them.
pub const NAMES: &[(&str, &str)] = &[
    (
        "gpu_ops_http_requests_total",
        "HTTP requests by route, method and status",
    ),
    (
        "gpu_ops_http_request_duration_seconds",
        "HTTP request latency by route",
    ),
    ("gpu_ops_queue_depth", "Jobs waiting in the queue"),
    (
        "gpu_ops_queue_capacity",
        "Queue capacity (--queue-capacity)",
    ),
    ("gpu_ops_jobs_running", "Jobs executing now"),
    (
        "gpu_ops_http_body_bytes_in_flight",
        "Request body bytes admitted and not yet answered, against --max-inflight-body-bytes",
    ),
    (
        "gpu_ops_connections_open",
        "TCP connections open now, against --max-connections",
    ),
    (
        "gpu_ops_connections_refused_total",
        "Connections closed unserved, by reason: max_connections (accepted past --max-connections)",
    ),
    (
        "gpu_ops_tenant_requests_refused_total",
        "API requests refused 429 by the tenant's limits, by tenant (anonymous without keys) and reason: rate (--tenant-requests-per-second), concurrency (--tenant-max-concurrent-requests)",
    ),
    (
        "gpu_ops_http_bodies_refused_total",
        "Request bodies refused, by reason: inflight_budget (--max-inflight-body-bytes), tenant_share (--max-tenant-inflight-body-percent), too_slow (--min-body-rate), decoded (the body's parsed values would pass --max-inflight-body-bytes)",
    ),
    (
        "gpu_ops_secagg_rounds_expired_total",
        "Secure-aggregation rounds deleted, with all they stored, after --secagg-round-ttl without a change",
    ),
    (
        "gpu_ops_cpu_inline_jobs_total",
        "CPU jobs small enough to run on the queue's worker task rather than the compute threads, by op",
    ),
    (
        "gpu_ops_job_queue_wait_seconds",
        "Time a job waited in the queue, by op and backend",
    ),
    (
        "gpu_ops_job_compute_seconds",
        "Time a job computed, by op and backend",
    ),
    ("gpu_ops_jobs_total", "Jobs by op, backend and outcome"),
    (
        "gpu_ops_fallbacks_total",
        "Jobs rerun on the CPU after a device failure, by op and reason",
    ),
    (
        "gpu_ops_processed_elements_total",
        "Input elements processed, by op and backend",
    ),
    (
        "gpu_ops_processed_bytes_total",
        "Input bytes processed, by op and backend",
    ),
    ("gpu_ops_build_info", "Always 1; labels carry the version"),
    (
        "gpu_ops_batch_size",
        "Requests coalesced into one job by dynamic batching, by op",
    ),
    (
        "gpu_ops_dp_budget_charges_total",
        "Privacy-budget charges by outcome: charged, exhausted (refused with 409), refunded",
    ),
    (
        "gpu_ops_dp_noise_values_total",
        "Values released with privacy noise, by mechanism",
    ),
    (
        "gpu_ops_shamir_share_checks_total",
        "Shares checked, by check (verify: against Feldman commitments; combine: beyond the threshold) and result",
    ),
    (
        "gpu_ops_secagg_rounds_total",
        "Secure-aggregation rounds, by event: created, finished (the sum was unmasked) or failed",
    ),
    (
        "gpu_ops_secagg_submissions_total",
        "Secure-aggregation submissions accepted from clients, by stage",
    ),
    (
        "gpu_ops_he_ciphertexts_aggregated_total",
        "BFV ciphertexts summed by /he/aggregate, by parameter set",
    ),
    (
        "gpu_ops_dataset_samples_total",
        "Synthetic dataset samples evaluated, by outcome: accepted or the rejection reason",
    ),
    (
        "gpu_ops_dataset_jobs_total",
        "Synthetic dataset jobs ended, by final status",
    ),
    (
        "gpu_ops_dataset_batches_total",
        "Synthetic dataset batches evaluated, by the backend that wrote and reduced the recordings",
    ),
    (
        "gpu_ops_dataset_submissions_refused_total",
        "Dataset jobs refused at submission or resume, by the problem's code (queue_full, tenant_dataset_queue_full, tenant_dataset_work_pending, dataset_sample_too_large, dataset_work_too_large, dataset_too_large, dataset_quota_exceeded, insufficient_storage, …)",
    ),
    (
        "gpu_ops_device_healthy",
        "1 while a GPU is in service, 0 after it was taken out",
    ),
    (
        "gpu_ops_kernel_verified",
        "1 while an op passes its self-test and shadow checks on a device, 0 while it is quarantined there",
    ),
    (
        "gpu_ops_shadow_checks_total",
        "Device jobs recomputed on the CPU and compared, by op and outcome (agree, mismatch)",
    ),
    (
        "gpu_ops_gpu_utilization_ratio",
        "GPU busy fraction over NVML's sample period (0-1)",
    ),
    ("gpu_ops_gpu_memory_used_bytes", "GPU memory in use"),
    ("gpu_ops_gpu_memory_total_bytes", "GPU memory installed"),
    ("gpu_ops_gpu_temperature_celsius", "GPU temperature"),
    ("gpu_ops_gpu_power_watts", "GPU power draw"),
    ("gpu_ops_gpu_sm_clock_hertz", "GPU SM clock"),
    ("gpu_ops_process_cpu_seconds_total", "Process CPU time"),
    (
        "gpu_ops_process_resident_memory_bytes",
        "Process resident memory",
    ),
];

fn name(n: &str) -> &'static str {
    NAMES
        .iter()
        .find(|(k, _)| *k == n)
        .map(|(k, _)| *k)
        .expect("metric listed in NAMES")
}

fn help(n: &str) -> &'static str {
    NAMES
        .iter()
        .find(|(k, _)| *k == n)
        .map(|(_, h)| *h)
        .expect("metric listed in NAMES")
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        let latency = exponential_buckets(0.0001, 2.5, 14).expect("valid buckets");
        let m = Metrics {
            http_requests: reg(
                r,
                IntCounterVec::new(
                    opts("gpu_ops_http_requests_total"),
                    &["route", "method", "status"],
                ),
            ),
            http_duration: reg(
                r,
                HistogramVec::new(
                    hopts("gpu_ops_http_request_duration_seconds", &latency),
                    &["route"],
                ),
            ),
            queue_depth: reg(r, IntGauge::with_opts(opts("gpu_ops_queue_depth"))),
            queue_capacity: reg(r, IntGauge::with_opts(opts("gpu_ops_queue_capacity"))),
            jobs_running: reg(r, IntGauge::with_opts(opts("gpu_ops_jobs_running"))),
            http_body_bytes_in_flight: reg(
                r,
                IntGauge::with_opts(opts("gpu_ops_http_body_bytes_in_flight")),
            ),
            connections_open: reg(r, IntGauge::with_opts(opts("gpu_ops_connections_open"))),
            connections_refused: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_connections_refused_total"), &["reason"]),
            ),
            tenant_requests_refused: reg(
                r,
                IntCounterVec::new(
                    opts("gpu_ops_tenant_requests_refused_total"),
                    &["tenant", "reason"],
                ),
            ),
            http_bodies_refused: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_http_bodies_refused_total"), &["reason"]),
            ),
            secagg_rounds_expired: reg(
                r,
                IntCounter::with_opts(opts("gpu_ops_secagg_rounds_expired_total")),
            ),
            cpu_inline_jobs: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_cpu_inline_jobs_total"), &["op"]),
            ),
            job_queue_wait: reg(
                r,
                HistogramVec::new(
                    hopts("gpu_ops_job_queue_wait_seconds", &latency),
                    &["op", "backend"],
                ),
            ),
            job_compute: reg(
                r,
                HistogramVec::new(
                    hopts("gpu_ops_job_compute_seconds", &latency),
                    &["op", "backend"],
                ),
            ),
            jobs: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_jobs_total"), &["op", "backend", "outcome"]),
            ),
            fallbacks: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_fallbacks_total"), &["op", "reason"]),
            ),
            elements: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_processed_elements_total"), &["op", "backend"]),
            ),
            bytes: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_processed_bytes_total"), &["op", "backend"]),
            ),
            device_healthy: reg(
                r,
                IntGaugeVec::new(opts("gpu_ops_device_healthy"), &["gpu", "uuid"]),
            ),
            kernel_verified: reg(
                r,
                IntGaugeVec::new(opts("gpu_ops_kernel_verified"), &["gpu", "op"]),
            ),
            shadow_checks: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_shadow_checks_total"), &["op", "outcome"]),
            ),
            gpu_utilization: reg(
                r,
                GaugeVec::new(opts("gpu_ops_gpu_utilization_ratio"), &["gpu", "uuid"]),
            ),
            gpu_memory_used: reg(
                r,
                GaugeVec::new(opts("gpu_ops_gpu_memory_used_bytes"), &["gpu", "uuid"]),
            ),
            gpu_memory_total: reg(
                r,
                GaugeVec::new(opts("gpu_ops_gpu_memory_total_bytes"), &["gpu", "uuid"]),
            ),
            gpu_temperature: reg(
                r,
                GaugeVec::new(opts("gpu_ops_gpu_temperature_celsius"), &["gpu", "uuid"]),
            ),
            gpu_power: reg(
                r,
                GaugeVec::new(opts("gpu_ops_gpu_power_watts"), &["gpu", "uuid"]),
            ),
            gpu_sm_clock: reg(
                r,
                GaugeVec::new(opts("gpu_ops_gpu_sm_clock_hertz"), &["gpu", "uuid"]),
            ),
            dp_budget_charges: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_dp_budget_charges_total"), &["outcome"]),
            ),
            dp_noise_values: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_dp_noise_values_total"), &["mechanism"]),
            ),
            shamir_share_checks: reg(
                r,
                IntCounterVec::new(
                    opts("gpu_ops_shamir_share_checks_total"),
                    &["check", "result"],
                ),
            ),
            secagg_rounds: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_secagg_rounds_total"), &["event"]),
            ),
            secagg_submissions: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_secagg_submissions_total"), &["stage"]),
            ),
            he_ciphertexts: reg(
                r,
                IntCounterVec::new(
                    opts("gpu_ops_he_ciphertexts_aggregated_total"),
                    &["parameters"],
                ),
            ),
            dataset_samples: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_dataset_samples_total"), &["outcome"]),
            ),
            dataset_jobs: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_dataset_jobs_total"), &["status"]),
            ),
            dataset_batches: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_dataset_batches_total"), &["backend"]),
            ),
            dataset_submissions_refused: reg(
                r,
                IntCounterVec::new(opts("gpu_ops_dataset_submissions_refused_total"), &["code"]),
            ),
            batch_size: reg(
                r,
                HistogramVec::new(
                    hopts(
                        "gpu_ops_batch_size",
                        &exponential_buckets(1.0, 2.0, 11).expect("valid buckets"),
                    ),
                    &["op"],
                ),
            ),
            registry,
        };
        let build = reg(
            &m.registry,
            IntGaugeVec::new(opts("gpu_ops_build_info"), &["version"]),
        );
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        // Every outcome exported from the start at 0, so rate() and dashboards see the
        // series before the first dataset job.
        for outcome in ["accepted", "too_few_receivers", "low_snr", "high_gdop"] {
            m.dataset_samples.with_label_values(&[outcome]);
        }
        for status in ["completed", "failed", "cancelled", "interrupted"] {
            m.dataset_jobs.with_label_values(&[status]);
        }
        for backend in ["cpu", "cuda"] {
            m.dataset_batches.with_label_values(&[backend]);
        }
        // Zero from the start, so a rate over them is defined before the first refusal.
        for code in [
            "queue_full",
            "tenant_dataset_queue_full",
            "tenant_dataset_work_pending",
            "dataset_sample_too_large",
            "dataset_work_too_large",
        ] {
            m.dataset_submissions_refused.with_label_values(&[code]);
        }
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::new(
                std::process::id() as i32,
                "gpu_ops",
            );
            m.registry
                .register(Box::new(pc))
                .expect("process collector registers once");
        }
        m
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn opts(n: &str) -> Opts {
    Opts::new(name(n), help(n))
}

fn hopts(n: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name(n), help(n)).buckets(buckets.to_vec())
}

fn reg<C: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    c: prometheus::Result<C>,
) -> C {
    let c = c.expect("metric definition is valid");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}
