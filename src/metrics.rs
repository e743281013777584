//! Every metric the service exports, in one place: each declared once, one line of
//! name, help and labels (`metrics!` below makes the field, registers it and lists it in
//! `NAMES`). Names carry the `gpu_ops_` prefix and base units (seconds, bytes, ratios
//! 0–1). One registry per app instance, so tests can run several servers in one process.

use prometheus::{
    exponential_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Declares the metrics: `field: Type = ("name", "help", [labels], buckets?);` each,
/// then after `@also` the names another collector exports (for `NAMES`).
macro_rules! metrics {
    (
        $( $field:ident : $ty:ident = ($name:literal, $help:literal, [$($label:literal),*] $(, $buckets:expr)?); )*
        @also $( ($xname:literal, $xhelp:literal) ),* $(,)?
    ) => {
        pub struct Metrics {
            registry: Registry,
            $( pub $field: $ty, )*
        }

        /// (name, help) of every metric, for the README and the test that checks them.
        pub const NAMES: &[(&str, &str)] = &[ $( ($name, $help), )* $( ($xname, $xhelp), )* ];

        impl Metrics {
            /// Every declared metric, registered in `registry`.
            fn declared(registry: Registry) -> Self {
                let r = &registry;
                Self {
                    $( $field: reg(r, <$ty as Declare>::declare(
                        $name, $help, &[$($label),*], None $(.or(Some($buckets)))?,
                    )), )*
                    registry,
                }
            }
        }
    };
}

metrics! {
    http_requests: IntCounterVec = ("gpu_ops_http_requests_total", "HTTP requests by route, method and status", ["route", "method", "status"]);
    http_duration: HistogramVec = ("gpu_ops_http_request_duration_seconds", "HTTP request latency by route", ["route"], latency_buckets());
    queue_depth: IntGauge = ("gpu_ops_queue_depth", "Jobs waiting in the queue", []);
    queue_capacity: IntGauge = ("gpu_ops_queue_capacity", "Queue capacity (--queue-capacity)", []);
    jobs_running: IntGauge = ("gpu_ops_jobs_running", "Jobs executing now", []);
    http_body_bytes_in_flight: IntGauge = ("gpu_ops_http_body_bytes_in_flight", "Request body bytes admitted and not yet answered, against --max-inflight-body-bytes", []);
    body_pool_bytes: IntGauge = ("gpu_ops_body_pool_bytes", "Bytes of finished request bodies' buffers kept for the next large bodies, against --body-pool-bytes", []);
    body_pool_reused: IntCounter = ("gpu_ops_body_pool_reused_total", "Request bodies read into a kept buffer (--body-pool-bytes) rather than fresh memory", []);
    staging_bytes: IntGauge = ("gpu_ops_staging_bytes", "Page-locked host memory the devices hold for staging copies (in use or kept for reuse), against --gpu-staging-mib", []);
    pinned_body_bytes: IntGauge = ("gpu_ops_pinned_body_bytes", "Page-locked host memory request bodies in the bulk form are read into on a host with a GPU (in use or kept for reuse), against --gpu-pinned-body-mib", []);
    pinned_body_fallbacks: IntCounter = ("gpu_ops_pinned_body_fallbacks_total", "Bulk request bodies declaring 1 MiB or more on a host with a GPU read into pageable memory because --gpu-pinned-body-mib was spent or the registration failed", []);
    connections_open: IntGauge = ("gpu_ops_connections_open", "TCP connections open now, against --max-connections", []);
    connections_refused: IntCounterVec = ("gpu_ops_connections_refused_total", "Connections closed unserved, by reason: max_connections (accepted past --max-connections)", ["reason"]);
    tenant_requests_refused: IntCounterVec = ("gpu_ops_tenant_requests_refused_total", "API requests refused 429 by the tenant's limits, by tenant (anonymous without keys) and reason: rate (--tenant-requests-per-second), concurrency (--tenant-max-concurrent-requests)", ["tenant", "reason"]);
    http_bodies_refused: IntCounterVec = ("gpu_ops_http_bodies_refused_total", "Request bodies refused, by reason: inflight_budget (--max-inflight-body-bytes), tenant_share (--max-tenant-inflight-body-percent), too_slow (--min-body-rate), decoded (the body's parsed values would pass --max-inflight-body-bytes)", ["reason"]);
    secagg_rounds_expired: IntCounter = ("gpu_ops_secagg_rounds_expired_total", "Secure-aggregation rounds deleted, with all they stored, after --secagg-round-ttl without a change", []);
    array_bytes: IntGaugeVec = ("gpu_ops_array_bytes", "Bytes of resident arrays held, by tier: host (parsed, in this replica's memory), disk (under --data-dir), device (kept results held only on a device, not read back yet), object_store (all replicas' arrays in the artifact store, when they share them); against --max-arrays-mib", ["tier"]);
    arrays: IntGauge = ("gpu_ops_arrays", "Resident arrays held, all tenants (of all replicas, when they share them)", []);
    arrays_refused: IntCounterVec = ("gpu_ops_arrays_refused_total", "Array uploads refused, by reason: tenant_bytes (--max-tenant-array-mib), tenant_count (--max-tenant-arrays), server_bytes (--max-arrays-mib), server_count (--max-arrays), io (the disk or the artifact store), storage (the shared catalog)", ["reason"]);
    arrays_expired: IntCounter = ("gpu_ops_arrays_expired_total", "Resident arrays deleted, with their files (or objects), after their time to live", []);
    array_uses: IntCounterVec = ("gpu_ops_array_uses_total", "Operands that named a resident array instead of carrying data, by kind (field_elements, points, tensor, recording, bytes)", ["kind"]);
    array_reads_back: IntCounterVec = ("gpu_ops_array_reads_back_total", "Kept results held only on a device, read back to the host at their first read or use there, by result: read (downloaded, then held on the host and disk), lost (the device no longer had them: the array is gone, 410 array_lost), deadline (no lease on the device came free within --job-timeout: 504 deadline_exceeded, still held there)", ["result"]);
    cpu_inline_jobs: IntCounterVec = ("gpu_ops_cpu_inline_jobs_total", "CPU jobs small enough to run on the queue's worker task rather than the compute threads, by op", ["op"]);
    job_queue_wait: HistogramVec = ("gpu_ops_job_queue_wait_seconds", "Time a job waited in the queue, by op and backend", ["op", "backend"], latency_buckets());
    job_compute: HistogramVec = ("gpu_ops_job_compute_seconds", "Time a job computed, by op and backend", ["op", "backend"], latency_buckets());
    jobs: IntCounterVec = ("gpu_ops_jobs_total", "Jobs by op, backend and outcome", ["op", "backend", "outcome"]);
    placements: IntCounterVec = ("gpu_ops_placements_total", "Jobs placed, by op, backend and reason: measured (predicted to finish first there, backlog counted), explored (to measure a side predicted slower or never run at that size), forced (the request or --backend named it), only_choice (no usable device, or a shape the device refuses), prior (nothing measured of the op yet: its size threshold decided), threshold (--placement threshold), resident (the device holding kept results the job reads)", ["op", "backend", "reason"]);
    fallbacks: IntCounterVec = ("gpu_ops_fallbacks_total", "Jobs rerun on the CPU after a device failure, by op and reason", ["op", "reason"]);
    elements: IntCounterVec = ("gpu_ops_processed_elements_total", "Input elements processed, by op and backend", ["op", "backend"]);
    bytes: IntCounterVec = ("gpu_ops_processed_bytes_total", "Input bytes processed, by op and backend", ["op", "backend"]);
    device_healthy: IntGaugeVec = ("gpu_ops_device_healthy", "1 while a GPU is in service, 0 after it was taken out", ["gpu", "uuid"]);
    device_jobs_running: IntGaugeVec = ("gpu_ops_device_jobs_running", "Jobs holding a lease on a device now (a stream and a share of its job memory), against --gpu-jobs-per-device", ["gpu"]);
    device_lease_waits: IntCounterVec = ("gpu_ops_device_lease_waits_total", "Device jobs that waited for a lease: every one of --gpu-jobs-per-device held, or less than the job's share of the device's job memory unreserved", ["gpu"]);
    device_copy_bytes: IntCounterVec = ("gpu_ops_device_copy_bytes_total", "Host bytes device jobs copied to and from their devices, by direction (to_device, from_device) and host memory (page_locked: through a staging buffer; request_body: straight from a request body read into page-locked memory; pageable)", ["gpu", "direction", "host_memory"]);
    device_cache_bytes: IntGaugeVec = ("gpu_ops_device_cache_bytes", "Device memory held by copies kept between jobs, by kind: array (resident arrays' copies, embedding tables among them), table (NTT twiddles and scale factors); together against --gpu-table-cache-mib", ["gpu", "kind"]);
    device_cache_lookups: IntCounterVec = ("gpu_ops_device_cache_total", "Lookups of copies kept on a device between jobs, by kind (array, table) and result: hit (used without an upload), miss (uploaded, then kept if it fits), evicted (dropped, least recently used, to make room)", ["gpu", "kind", "result"]);
    staging_fallbacks: IntCounterVec = ("gpu_ops_staging_fallbacks_total", "Chunked device jobs and device copies of 1 MiB or more that found no page-locked staging buffer (the engine has none, or --gpu-staging-mib was spent) and ran on pageable copies", ["gpu"]);
    kernel_verified: IntGaugeVec = ("gpu_ops_kernel_verified", "1 while an op passes its self-test and shadow checks on a device, 0 while it is quarantined there", ["gpu", "op"]);
    shadow_checks: IntCounterVec = ("gpu_ops_shadow_checks_total", "Device jobs recomputed on the CPU and compared, by op and outcome (agree, mismatch)", ["op", "outcome"]);
    gpu_utilization: GaugeVec = ("gpu_ops_gpu_utilization_ratio", "GPU busy fraction (0-1): NVML's over its sample period, or ROCm SMI's busy percent on AMD", ["gpu", "uuid"]);
    gpu_memory_used: GaugeVec = ("gpu_ops_gpu_memory_used_bytes", "GPU memory in use", ["gpu", "uuid"]);
    gpu_memory_total: GaugeVec = ("gpu_ops_gpu_memory_total_bytes", "GPU memory installed", ["gpu", "uuid"]);
    gpu_temperature: GaugeVec = ("gpu_ops_gpu_temperature_celsius", "GPU temperature", ["gpu", "uuid"]);
    gpu_power: GaugeVec = ("gpu_ops_gpu_power_watts", "GPU power draw", ["gpu", "uuid"]);
    gpu_sm_clock: GaugeVec = ("gpu_ops_gpu_sm_clock_hertz", "GPU SM clock", ["gpu", "uuid"]);
    dp_budget_charges: IntCounterVec = ("gpu_ops_dp_budget_charges_total", "Privacy-budget charges by outcome: charged, exhausted (refused with 409), refunded", ["outcome"]);
    dp_noise_values: IntCounterVec = ("gpu_ops_dp_noise_values_total", "Values released with privacy noise, by mechanism", ["mechanism"]);
    shamir_share_checks: IntCounterVec = ("gpu_ops_shamir_share_checks_total", "Shares checked, by check (verify: against Feldman commitments; combine: beyond the threshold) and result", ["check", "result"]);
    secagg_rounds: IntCounterVec = ("gpu_ops_secagg_rounds_total", "Secure-aggregation rounds, by event: created, finished (the sum was unmasked) or failed", ["event"]);
    secagg_submissions: IntCounterVec = ("gpu_ops_secagg_submissions_total", "Secure-aggregation submissions accepted from clients, by stage", ["stage"]);
    he_ciphertexts: IntCounterVec = ("gpu_ops_he_ciphertexts_aggregated_total", "BFV ciphertexts summed by /he/aggregate, by parameter set", ["parameters"]);
    dataset_samples: IntCounterVec = ("gpu_ops_dataset_samples_total", "Synthetic dataset samples evaluated, by outcome: accepted or the rejection reason", ["outcome"]);
    dataset_jobs: IntCounterVec = ("gpu_ops_dataset_jobs_total", "Synthetic dataset jobs ended, by final status", ["status"]);
    dataset_batches: IntCounterVec = ("gpu_ops_dataset_batches_total", "Synthetic dataset batches evaluated, by the backend that wrote and reduced the recordings", ["backend"]);
    dataset_submissions_refused: IntCounterVec = ("gpu_ops_dataset_submissions_refused_total", "Dataset jobs refused at submission or resume, by the problem's code (queue_full, tenant_dataset_queue_full, tenant_dataset_work_pending, dataset_sample_too_large, dataset_work_too_large, dataset_too_large, dataset_quota_exceeded, insufficient_storage, …)", ["code"]);
    batch_size: HistogramVec = ("gpu_ops_batch_size", "Requests coalesced into one job by dynamic batching, by op", ["op"], size_buckets());
    build_info: IntGaugeVec = ("gpu_ops_build_info", "Always 1; labels carry the version", ["version"]);
    @also
    ("gpu_ops_process_cpu_seconds_total", "Process CPU time"),
    ("gpu_ops_process_resident_memory_bytes", "Process resident memory"),
}

/// Request and job latencies: 100 µs to about 15 minutes.
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.0001, 2.5, 14).expect("valid buckets")
}

/// Batch sizes: 1 to 1024.
fn size_buckets() -> Vec<f64> {
    exponential_buckets(1.0, 2.0, 11).expect("valid buckets")
}

/// How a metric of each type is made from its name, help, labels and buckets.
trait Declare: Sized {
    fn declare(
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Option<Vec<f64>>,
    ) -> prometheus::Result<Self>;
}

macro_rules! declare_labelled {
    ($($ty:ident),*) => {$(
        impl Declare for $ty {
            fn declare(name: &str, help: &str, labels: &[&str], _: Option<Vec<f64>>) -> prometheus::Result<Self> {
                $ty::new(Opts::new(name, help), labels)
            }
        }
    )*};
}
declare_labelled!(IntCounterVec, IntGaugeVec, GaugeVec);

macro_rules! declare_plain {
    ($($ty:ident),*) => {$(
        impl Declare for $ty {
            fn declare(name: &str, help: &str, labels: &[&str], _: Option<Vec<f64>>) -> prometheus::Result<Self> {
                debug_assert!(labels.is_empty(), "{name}: a plain metric has no labels");
                $ty::with_opts(Opts::new(name, help))
            }
        }
    )*};
}
declare_plain!(IntCounter, IntGauge);

impl Declare for HistogramVec {
    fn declare(
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Option<Vec<f64>>,
    ) -> prometheus::Result<Self> {
        let opts = HistogramOpts::new(name, help);
        let opts = match buckets {
            Some(b) => opts.buckets(b),
            None => opts,
        };
        HistogramVec::new(opts, labels)
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Self::declared(Registry::new());
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Every outcome exported from the start at 0, so rate() and dashboards see the
        // series before the first dataset job.
        for outcome in ["accepted", "too_few_receivers", "low_snr", "high_gdop"] {
            m.dataset_samples.with_label_values(&[outcome]);
        }
        for status in ["completed", "failed", "cancelled", "interrupted"] {
            m.dataset_jobs.with_label_values(&[status]);
        }
        for backend in ["cpu", "cuda", "hip", "emulated"] {
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
        for reason in [
            "tenant_bytes",
            "tenant_count",
            "server_bytes",
            "server_count",
            "io",
            "storage",
        ] {
            m.arrays_refused.with_label_values(&[reason]);
        }
        for tier in ["host", "disk", "device", "object_store"] {
            m.array_bytes.with_label_values(&[tier]);
        }
        for result in ["read", "lost", "deadline"] {
            m.array_reads_back.with_label_values(&[result]);
        }
        for kind in ["field_elements", "points", "tensor", "recording", "bytes"] {
            m.array_uses.with_label_values(&[kind]);
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

fn reg<C: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    c: prometheus::Result<C>,
) -> C {
    let c = c.expect("metric definition is valid");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}
