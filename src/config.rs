//! Flags and `GPU_OPS_*` environment variables: one struct, validated once at start-up.

use crate::backend::cuda::DeviceSelection;
use crate::backend::BackendChoice;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "gpu-ops",
    version,
    about = "GPU operations behind a REST API, with a CPU fallback",
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: Config,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the HTTP server (the default).
    Serve(Box<Config>),
    /// Print the OpenAPI document.
    Openapi,
    /// Load-test a running server: one operation and shape over a sweep of
    /// concurrencies; throughput, latency percentiles, server queue and compute time,
    /// GFLOP/s; a table and optionally JSON.
    Bench(Box<crate::bench::BenchArgs>),
    /// Take part in a secure-aggregation round as one client (docs/SECAGG.md): register,
    /// send sealed shares, upload the masked vector read from --input, reveal shares.
    SecaggClient(Box<crate::secagg_client::CliArgs>),
    /// Prove every op on each GPU (or the emulated device): environment, kernel
    /// compilation, self-tests, parity with the CPU twins at the level's sizes, timings;
    /// a markdown table and optionally JSON. Exit 1 when any parity fails, 3 when there
    /// is no device to check.
    Check(Box<crate::check::CheckArgs>),
    /// Make an API key: 256 random bits, base64url. With --file, append "KEY TENANT" to
    /// the file (created owner-only), else print that line.
    NewKey(crate::new_key::NewKeyArgs),
    /// Compile one kernel module for an AMD architecture with hipRTC and write its code
    /// object: what the server runs in a child process, so that a compiler crash is one
    /// module's error and not the server's end (docs/GPU.md, "AMD GPUs").
    #[command(hide = true)]
    HipCompile {
        /// The kernel module (`field`, `ntt`, `msm`, …).
        #[arg(long)]
        module: String,
        /// The architecture, e.g. gfx90a.
        #[arg(long)]
        arch: String,
        /// Where the code object is written.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Exit 0 when a server answers 200 on /health/live (container HEALTHCHECK; the
    /// runtime image has no curl).
    Healthcheck {
        /// host:port of the server.
        #[arg(
            long,
            env = "GPU_OPS_HEALTHCHECK_ADDR",
            default_value = "127.0.0.1:8080"
        )]
        addr: String,
        /// Path to probe.
        #[arg(long, default_value = "/health/live")]
        path: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "GPU_OPS_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,
    /// Backend for work: auto (each job where it is predicted to finish first, a usable
    /// GPU or the CPU, by measurement), cuda (required), cpu.
    #[arg(long, env = "GPU_OPS_BACKEND", value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Rerun a job on the CPU when the device fails (true/false).
    #[arg(long, env = "GPU_OPS_FALLBACK", default_value_t = true, action = ArgAction::Set)]
    pub fallback: bool,
    /// GPUs to use: "all" or ordinals such as "0,1".
    #[arg(long, env = "GPU_OPS_DEVICES", default_value = "all")]
    pub devices: DeviceSelection,
    /// Fraction of device jobs recomputed on the CPU, off the request path, and compared
    /// (integers bit for bit, floats within the op's tolerance); a mismatch quarantines
    /// the op on that device. Evenly spaced: 0.01 checks every 100th device job.
    #[arg(long, env = "GPU_OPS_VERIFY_FRACTION", default_value_t = 0.01)]
    pub verify_fraction: f64,
    /// How `auto` places a job: measured (where it is predicted to finish first, from
    /// times measured on this host, backlog counted) or threshold (the old fixed per-op
    /// size thresholds, for comparison).
    #[arg(
        long,
        env = "GPU_OPS_PLACEMENT",
        value_enum,
        default_value = "measured"
    )]
    pub placement: crate::pool::PlacementMode,
    /// One `auto` job in this many of an op's size class runs on the side predicted
    /// slower (at most 4× slower), so a side that slowed down and recovered wins its
    /// work back.
    #[arg(long, env = "GPU_OPS_PLACEMENT_EXPLORE_EVERY", default_value_t = 32)]
    pub placement_explore_every: u64,
    /// Time a device's placement calibration may take when it comes up (after its
    /// self-test, once the server is ready): every op's self-test and quick check cases
    /// timed on the device and the CPU while this lasts. 0s: none (placement learns
    /// from the jobs it runs).
    #[arg(long, env = "GPU_OPS_PLACEMENT_CALIBRATION_BUDGET", default_value = "5s", value_parser = humantime::parse_duration)]
    pub placement_calibration_budget: Duration,
    /// How long a device taken out of service waits before its first re-probe (its
    /// context rebuilt and self-test rerun); later waits double, up to 10 minutes.
    #[arg(long, env = "GPU_OPS_DEVICE_REPROBE_BACKOFF", default_value = "30s", value_parser = humantime::parse_duration)]
    pub device_reprobe_backoff: Duration,
    /// For testing: serve GPU work on the emulated device (our kernels compiled for the
    /// host, run with CUDA's execution model) instead of CUDA devices. `/device` says so.
    /// Correct answers, slowly; never for production.
    #[arg(long, env = "GPU_OPS_EMULATE_DEVICE", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub emulate_device: bool,
    /// wgpu adapters that are the CPU (lavapipe, llvmpipe, WARP), looked for with the
    /// other wgpu adapters when no CUDA or HIP device is usable: off (not opened),
    /// forced (opened and self-tested; only requests naming the GPU backend run there),
    /// auto (also a side `auto` places work on by measured time).
    #[arg(
        long,
        env = "GPU_OPS_WGPU_SOFTWARE_ADAPTERS",
        value_enum,
        default_value = "off"
    )]
    pub wgpu_software_adapters: crate::backend::wgpu::SoftwareAdapters,
    /// The ops wgpu adapters serve (comma-separated, as /device names them): only their
    /// kernels compile when an adapter opens, and the others are `unavailable` there and
    /// run on the CPU. `all`: every op with WGSL kernels (the field ops, NTT, MSM; the
    /// MSM's take about a minute to compile on a CPU driver).
    #[arg(
        long,
        env = "GPU_OPS_WGPU_OPS",
        value_delimiter = ',',
        default_value = "all"
    )]
    pub wgpu_ops: Vec<String>,
    /// Jobs that may wait in the queue; beyond it requests get 503 queue_full.
    #[arg(long, env = "GPU_OPS_QUEUE_CAPACITY", default_value_t = 1024)]
    pub queue_capacity: usize,
    /// CPU compute threads (default: the machine's cores).
    #[arg(long, env = "GPU_OPS_CPU_THREADS")]
    pub cpu_threads: Option<usize>,
    /// Run CPU jobs of microseconds (small field-vector ops) on the queue's worker task
    /// instead of handing them to the compute threads and back (true/false).
    #[arg(long, env = "GPU_OPS_CPU_INLINE_SMALL_JOBS", default_value_t = true, action = ArgAction::Set)]
    pub cpu_inline_small_jobs: bool,
    /// Default and longest deadline of a job, e.g. 30s or 500ms.
    #[arg(long, env = "GPU_OPS_JOB_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub job_timeout: Duration,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, env = "GPU_OPS_MAX_BODY_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Request bodies the server holds at once, in bytes, summed over requests by their
    /// declared length (a body of unknown length counts as --max-body-bytes); a request
    /// that would pass it gets 503 body_budget_exhausted with Retry-After. A parsed JSON
    /// body's numbers and field elements are charged too, on top of its bytes. 0: four
    /// times --max-body-bytes.
    #[arg(long, env = "GPU_OPS_MAX_INFLIGHT_BODY_BYTES", default_value_t = 0)]
    pub max_inflight_body_bytes: u64,
    /// Longest pause while a request body arrives, e.g. 30s; past it the upload is
    /// dropped (400) and its share of --max-inflight-body-bytes returned, so stalled
    /// uploads cannot hold the budget.
    #[arg(long, env = "GPU_OPS_BODY_IDLE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_idle_timeout: Duration,
    /// Slowest a request body may arrive, bytes per second averaged from its start, once
    /// --min-body-rate-grace has passed; slower gets 408 body_too_slow and the
    /// connection closed, its share of --max-inflight-body-bytes returned. 0: no minimum.
    #[arg(long, env = "GPU_OPS_MIN_BODY_RATE", default_value_t = 16 * 1024)]
    pub min_body_rate: u64,
    /// How long a body may arrive at any rate before --min-body-rate applies, e.g. 10s.
    #[arg(long, env = "GPU_OPS_MIN_BODY_RATE_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub min_body_rate_grace: Duration,
    /// Buffers of finished large request bodies (8 MiB and up) kept for the next ones, in
    /// bytes in all: a kept buffer is written without the kernel first zeroing fresh
    /// pages, and is lent only to a body at least half its size. A buffer unused for 10 s
    /// is freed (within 15 s). Default: one --max-body-bytes; 0 keeps none.
    #[arg(long, env = "GPU_OPS_BODY_POOL_BYTES")]
    pub body_pool_bytes: Option<usize>,
    /// With keys, the most of --max-inflight-body-bytes one tenant's bodies may hold
    /// together, in percent; past it 503 body_budget_exhausted.
    #[arg(
        long,
        env = "GPU_OPS_MAX_TENANT_INFLIGHT_BODY_PERCENT",
        default_value_t = 50
    )]
    pub max_tenant_inflight_body_percent: u8,
    /// Most elements in one input vector; more gets 413.
    #[arg(long, env = "GPU_OPS_MAX_ELEMENTS", default_value_t = 1 << 24)]
    pub max_elements: usize,
    /// Dynamic batching of small field-vector requests: gpu (while a GPU is in service),
    /// always, off.
    #[arg(long, env = "GPU_OPS_BATCHING", value_enum, default_value = "gpu")]
    pub batching: crate::pool::BatchMode,
    /// How long the first small request of a batch waits for others.
    #[arg(long, env = "GPU_OPS_BATCH_MAX_DELAY", default_value = "500us", value_parser = humantime::parse_duration)]
    pub batch_max_delay: Duration,
    /// Elements at which a batch is launched without waiting further.
    #[arg(long, env = "GPU_OPS_BATCH_MAX_ELEMENTS", default_value_t = 1 << 16)]
    pub batch_max_elements: usize,
    /// Largest NTT size as a power of two (also capped by each field's two-adicity).
    #[arg(long, env = "GPU_OPS_MAX_NTT_LOG2", default_value_t = 24)]
    pub max_ntt_log2: u32,
    /// Device memory the jobs on one GPU may use together, in MiB, shared among them by
    /// reservation; larger work (field vectors, NTT batches, MSM points) runs in passes
    /// that fit its share. 0: half the memory free when a job starts on the idle device.
    #[arg(long, env = "GPU_OPS_GPU_MEMORY_LIMIT_MIB", default_value_t = 0)]
    pub gpu_memory_limit_mib: u64,
    /// Jobs one GPU runs at once, each on its own stream with its share of the device's
    /// job memory; more wait for a lease (`gpu_ops_device_lease_waits_total`).
    #[arg(long, env = "GPU_OPS_GPU_JOBS_PER_DEVICE", default_value_t = crate::backend::device::DEFAULT_JOBS_PER_DEVICE, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub gpu_jobs_per_device: usize,
    /// Page-locked host memory all GPUs together may hold for staging copies, in MiB, in
    /// buffers of 8 MiB kept for reuse; a chunked device job takes two (its lanes), as
    /// does any other device copy of 1 MiB or more. A job or copy that finds none runs on
    /// pageable copies, at a fraction of the bus's speed
    /// (`gpu_ops_staging_fallbacks_total`). 0: no staging.
    #[arg(long, env = "GPU_OPS_GPU_STAGING_MIB", default_value_t = crate::backend::device::DEFAULT_STAGING_MIB)]
    pub gpu_staging_mib: u64,
    /// Page-locked host memory in MiB for bulk bodies of 1 MiB or more on a GPU host, so a
    /// device job copies operands read in place straight from the body; past it bodies
    /// are pageable (`gpu_ops_pinned_body_fallbacks_total`). 0: none.
    #[arg(long, env = "GPU_OPS_GPU_PINNED_BODY_MIB", default_value_t = crate::backend::device::DEFAULT_PINNED_BODY_MIB)]
    pub gpu_pinned_body_mib: u64,
    /// Device memory each GPU keeps for cached tables (NTT twiddles, resident embedding
    /// tables), least recently used out, in MiB. 0: an eighth of the device, at least
    /// 512 MiB, at most 4 GiB, never over a quarter.
    #[arg(long, env = "GPU_OPS_GPU_TABLE_CACHE_MIB", default_value_t = 0)]
    pub gpu_table_cache_mib: u64,
    /// Multiples of each point of a resident point array a GPU precomputes (at most) on
    /// the first MSM over it and keeps in its table cache in place of the points (counted
    /// under --gpu-table-cache-mib, and built only where they fit half the room kept
    /// results leave it): factor t leaves ⌈windows / t⌉ windows of buckets to sort and
    /// reduce, for up to t times the points' device memory. 1: none.
    #[arg(long, env = "GPU_OPS_MSM_PRECOMPUTE_FACTOR", default_value_t = crate::ops::zk::msm::DEFAULT_PRECOMPUTE_FACTOR, value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=16))]
    pub msm_precompute_factor: u32,
    /// Keep matrix products and convolutions on our own kernels even where cuBLASLt and
    /// cuDNN are installed and passed their self-tests.
    #[arg(long, env = "GPU_OPS_NO_CUDA_LIBRARIES")]
    pub no_cuda_libraries: bool,
    /// Most MiB one tenant's resident embedding tables may take together (tables are
    /// resident arrays: the arrays' quotas hold too).
    #[arg(long, env = "GPU_OPS_MAX_TENANT_EMBEDDING_MIB", default_value_t = 1024)]
    pub max_tenant_embedding_mib: u64,
    /// Most embedding tables one tenant may hold, however small; more gets 422
    /// embedding_quota_exceeded.
    #[arg(
        long,
        env = "GPU_OPS_MAX_TENANT_EMBEDDING_TABLES",
        default_value_t = 1000
    )]
    pub max_tenant_embedding_tables: usize,
    /// Most MiB all resident embedding tables may take (each is held in host memory and
    /// on disk under --data-dir).
    #[arg(long, env = "GPU_OPS_MAX_EMBEDDING_TABLES_MIB", default_value_t = 4096)]
    pub max_embedding_tables_mib: u64,
    /// Most MiB one tenant's resident arrays (`/arrays`) may take together; more gets
    /// 422 array_quota_exceeded.
    #[arg(long, env = "GPU_OPS_MAX_TENANT_ARRAY_MIB", default_value_t = 1024)]
    pub max_tenant_array_mib: u64,
    /// Most resident arrays one tenant may hold, however small; more gets 422
    /// array_quota_exceeded.
    #[arg(long, env = "GPU_OPS_MAX_TENANT_ARRAYS", default_value_t = 1000)]
    pub max_tenant_arrays: usize,
    /// Most MiB all resident arrays may take (each is held in host memory and on disk
    /// under --data-dir); more gets 507 arrays_full.
    #[arg(long, env = "GPU_OPS_MAX_ARRAYS_MIB", default_value_t = 4096)]
    pub max_arrays_mib: u64,
    /// Most resident arrays all tenants may hold together, however small (each keeps
    /// its metadata in memory and two files under --data-dir); more gets 507 arrays_full.
    #[arg(long, env = "GPU_OPS_MAX_ARRAYS", default_value_t = 100_000)]
    pub max_arrays: usize,
    /// How long a resident array lives when its upload names no `ttl_seconds`, e.g. 24h.
    #[arg(long, env = "GPU_OPS_ARRAY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub array_ttl: Duration,
    /// The longest `ttl_seconds` an upload may ask for, e.g. 30days; longer gets 422
    /// invalid_parameter.
    #[arg(long, env = "GPU_OPS_MAX_ARRAY_TTL", default_value = "30days", value_parser = humantime::parse_duration)]
    pub max_array_ttl: Duration,
    /// Synthetic dataset jobs that may wait behind the running one; more gets 503.
    #[arg(long, env = "GPU_OPS_MAX_DATASET_JOBS", default_value_t = 16)]
    pub max_dataset_jobs: usize,
    /// Synthetic dataset jobs one tenant may have waiting at once (within
    /// --max-dataset-jobs); more gets 429 tenant_dataset_queue_full.
    #[arg(long, env = "GPU_OPS_MAX_TENANT_QUEUED_DATASETS", default_value_t = 4)]
    pub max_tenant_queued_datasets: usize,
    /// Most work one tenant's queued and running dataset jobs may ask for together, in
    /// complex samples to synthesise (samples × receivers × samples per recording); a job
    /// past it gets 429 tenant_dataset_work_pending, one past it alone 422.
    #[arg(
        long,
        env = "GPU_OPS_MAX_TENANT_DATASET_WORK",
        default_value_t = 1_000_000_000_000
    )]
    pub max_tenant_dataset_work: u64,
    /// Host memory a dataset job's samples in flight may hold, in MiB: a batch holds as
    /// many samples as fit (on the CPU and in what a device batch copies back), and a job
    /// whose one sample does not fit is refused at submission (422
    /// dataset_sample_too_large).
    #[arg(long, env = "GPU_OPS_DATASET_MEMORY_MIB", default_value_t = 1024)]
    pub dataset_memory_mib: u64,
    /// Most samples one synthetic dataset may ask for.
    #[arg(long, env = "GPU_OPS_MAX_DATASET_SAMPLES", default_value_t = 5_000_000)]
    pub max_dataset_samples: u64,
    /// Most bytes one synthetic dataset's files may take (estimated as an upper bound at
    /// submission; `iq_raw` recordings are 8 bytes per complex sample per receiver).
    #[arg(long, env = "GPU_OPS_MAX_DATASET_BYTES", default_value_t = 64 << 30)]
    pub max_dataset_bytes: u64,
    /// Progress streams (`/datasets/{id}/events`) one tenant may hold open at once; more
    /// gets 429 too_many_streams.
    #[arg(long, env = "GPU_OPS_MAX_TENANT_EVENT_STREAMS", default_value_t = 16)]
    pub max_tenant_event_streams: usize,
    /// Most bytes one tenant's synthetic datasets may take together: every dataset of the
    /// tenant not failed or cancelled, by the same upper-bound estimate; 0 for no limit.
    #[arg(long, env = "GPU_OPS_MAX_TENANT_DATASET_BYTES", default_value_t = 0)]
    pub max_tenant_dataset_bytes: u64,
    /// Most values in one `[B, D]` tensor (/dp/privatize); more gets 413.
    #[arg(long, env = "GPU_OPS_MAX_TENSOR_ELEMENTS", default_value_t = 1 << 26)]
    pub max_tensor_elements: usize,
    /// Accept a client `seed` for privacy noise and Shamir coefficients. For tests only:
    /// seeded noise and coefficients are predictable.
    #[arg(long, env = "GPU_OPS_DP_ALLOW_CLIENT_SEED", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub dp_allow_client_seed: bool,
    /// Serve BFV key generation and decryption (`/he/keys`, `/he/decrypt`): the server
    /// then holds secret keys. For tests and demonstrations only.
    #[arg(long, env = "GPU_OPS_HE_DEALER_MODE", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub he_dealer_mode: bool,
    /// Directory for persistent state (privacy budgets, kernel cache).
    #[arg(long, env = "GPU_OPS_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Where privacy budgets and their ledger live: empty for the embedded SQLite file in
    /// --data-dir, or a `postgres://user:password@host:port/db` URL that every replica
    /// shares (charges of one budget then serialise across replicas).
    #[arg(
        long,
        env = "GPU_OPS_DATABASE_URL",
        default_value = "",
        hide_env_values = true
    )]
    pub database_url: String,
    /// Where finished dataset files are kept: empty for --data-dir, or
    /// `s3://bucket[/prefix]` in S3-compatible object storage (endpoint, region and
    /// credentials from the AWS_* variables), where every replica can serve them. With
    /// --database-url too, resident arrays are shared there as well.
    #[arg(long, env = "GPU_OPS_ARTIFACT_STORE", default_value = "")]
    pub artifact_store: String,
    /// How long a replica's claim on a running dataset job lasts without renewal (it
    /// renews every second): past it the replica is taken for dead and another one
    /// resumes the job. Only with a shared catalog (--database-url and --artifact-store).
    #[arg(long, env = "GPU_OPS_DATASET_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub dataset_lease: std::time::Duration,
    /// Most PostgreSQL connections one replica holds open.
    #[arg(long, env = "GPU_OPS_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,
    /// Log format.
    #[arg(long, env = "GPU_OPS_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// File of API keys, one "KEY TENANT" per line (`gpu-ops new-key` writes one); when
    /// set, every API route needs `Authorization: Bearer KEY`, and its objects belong to
    /// the key's tenant. Required when --bind is not a loopback address.
    #[arg(long, env = "GPU_OPS_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Serve without API keys on an address other than loopback: for a server behind
    /// something that authenticates (a gateway, a mesh). It warns at start and on
    /// `/device`. Without it, such a server refuses to start.
    #[arg(long, env = "GPU_OPS_ALLOW_UNAUTHENTICATED", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_unauthenticated: bool,
    /// Longest time a client may take to send a request's headers, from its first byte
    /// (or from the connection's opening, or the previous answer on a kept-alive
    /// connection); past it the connection is closed.
    #[arg(long, env = "GPU_OPS_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// Most TCP connections open at once; a connection beyond it is closed as soon as it
    /// is accepted (counted in gpu_ops_connections_refused_total).
    #[arg(long, env = "GPU_OPS_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Requests per second each tenant may make to the API routes (a token bucket; one
    /// tenant without keys); past it 429 tenant_rate_limited with Retry-After. 0: no limit.
    #[arg(
        long,
        env = "GPU_OPS_TENANT_REQUESTS_PER_SECOND",
        default_value_t = 0.0
    )]
    pub tenant_requests_per_second: f64,
    /// Requests a quiet tenant may send at once before the rate applies (the bucket's
    /// size). 0: one second's worth of --tenant-requests-per-second.
    #[arg(long, env = "GPU_OPS_TENANT_BURST", default_value_t = 0)]
    pub tenant_burst: u32,
    /// Requests each tenant may have in flight on the API routes; past it 429
    /// tenant_concurrency_limited. 0: no limit.
    #[arg(
        long,
        env = "GPU_OPS_TENANT_MAX_CONCURRENT_REQUESTS",
        default_value_t = 0
    )]
    pub tenant_max_concurrent_requests: usize,
    /// Secure-aggregation rounds not changed for this long (finished, failed or
    /// abandoned) are deleted with everything they stored, e.g. 24h.
    #[arg(long, env = "GPU_OPS_SECAGG_ROUND_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub secagg_round_ttl: Duration,
    /// How long shutdown waits for queued and running jobs.
    #[arg(long, env = "GPU_OPS_SHUTDOWN_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// How often GPU gauges are sampled from NVML.
    #[arg(long, env = "GPU_OPS_DEVICE_SAMPLE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub device_sample_interval: Duration,
    /// Shortest time between two `/device/bandwidth` measurements: a `refresh=true`
    /// sooner than this after the last one answers that one, so refreshes cannot keep the
    /// devices leased. 0s: every refresh measures again.
    #[arg(long, env = "GPU_OPS_BANDWIDTH_MIN_REFRESH", default_value = "5s", value_parser = humantime::parse_duration)]
    pub bandwidth_min_refresh: Duration,
}

/// A validated configuration, ready to serve with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    pub cpu_threads: usize,
    /// `--max-inflight-body-bytes`, its default resolved.
    pub max_inflight_body_bytes: u64,
    /// `--body-pool-bytes`, its default resolved.
    pub body_pool_bytes: usize,
    /// API key -> tenant, when auth is on.
    pub api_keys: Option<HashMap<String, String>>,
}

impl Config {
    /// Checks what clap cannot; every error is one line naming the flag.
    pub fn validate(self) -> Result<Settings, String> {
        if self.queue_capacity == 0 {
            return Err("--queue-capacity must be at least 1".into());
        }
        let cpu_threads = match self.cpu_threads {
            Some(0) => return Err("--cpu-threads must be at least 1".into()),
            Some(n) if n > 4096 => return Err(format!("--cpu-threads {n} is more than 4096")),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if self.job_timeout.is_zero() {
            return Err("--job-timeout must be longer than 0".into());
        }
        if self.max_body_bytes < 1024 {
            return Err("--max-body-bytes must be at least 1024".into());
        }
        if self.max_elements == 0 {
            return Err("--max-elements must be at least 1".into());
        }
        // Permits are KiB in a u32: bodies up to 4 TiB.
        if self.max_body_bytes as u64 >= 1 << 42 {
            return Err("--max-body-bytes must be below 4 TiB".into());
        }
        if self.body_idle_timeout.is_zero() {
            return Err("--body-idle-timeout must be longer than 0".into());
        }
        let max_inflight_body_bytes = match self.max_inflight_body_bytes {
            0 => 4 * self.max_body_bytes as u64,
            n if n < self.max_body_bytes as u64 => {
                return Err(format!(
                    "--max-inflight-body-bytes {n} is less than --max-body-bytes {}: a largest body could never be taken",
                    self.max_body_bytes
                ))
            }
            n => n,
        };
        if self.batch_max_delay > Duration::from_secs(1) {
            return Err("--batch-max-delay must be at most 1s".into());
        }
        if self.batch_max_elements == 0 {
            return Err("--batch-max-elements must be at least 1".into());
        }
        if !(1..=32).contains(&self.max_ntt_log2) {
            return Err("--max-ntt-log2 must be 1 to 32".into());
        }
        if self.placement_explore_every == 0 {
            return Err("--placement-explore-every must be at least 1".into());
        }
        if self.placement_calibration_budget > std::time::Duration::from_secs(120) {
            return Err("--placement-calibration-budget must be at most 120s".into());
        }
        if !(0.0..=1.0).contains(&self.verify_fraction) {
            return Err("--verify-fraction must be between 0 and 1".into());
        }
        if !(std::time::Duration::from_secs(2)..=std::time::Duration::from_secs(600))
            .contains(&self.dataset_lease)
        {
            return Err(
                "--dataset-lease must be 2s to 10m (leases are renewed every second)".into(),
            );
        }
        if !(1..=1024).contains(&self.database_max_connections) {
            return Err("--database-max-connections must be 1 to 1024".into());
        }
        crate::store::DatabaseUrl::parse(&self.database_url, self.database_max_connections)?;
        if self.max_dataset_jobs == 0 {
            return Err("--max-dataset-jobs must be at least 1".into());
        }
        if self.max_tenant_queued_datasets == 0 {
            return Err("--max-tenant-queued-datasets must be at least 1".into());
        }
        if self.max_tenant_dataset_work == 0 {
            return Err("--max-tenant-dataset-work must be at least 1".into());
        }
        if !(16..=1 << 24).contains(&self.dataset_memory_mib) {
            return Err("--dataset-memory-mib must be 16 to 16777216".into());
        }
        if !(1..=5_000_000).contains(&self.max_dataset_samples) {
            return Err("--max-dataset-samples must be 1 to 5000000".into());
        }
        if self.max_tensor_elements == 0 {
            return Err("--max-tensor-elements must be at least 1".into());
        }
        if self.max_tenant_event_streams == 0 {
            return Err("--max-tenant-event-streams must be at least 1".into());
        }
        if !(1..=100).contains(&self.max_tenant_inflight_body_percent) {
            return Err("--max-tenant-inflight-body-percent must be 1 to 100".into());
        }
        if self.array_ttl < Duration::from_secs(1) || self.array_ttl > self.max_array_ttl {
            return Err("--array-ttl must be at least 1s and at most --max-array-ttl".into());
        }
        if self.secagg_round_ttl < Duration::from_secs(1) {
            return Err("--secagg-round-ttl must be at least 1s".into());
        }
        if !(self.tenant_requests_per_second.is_finite() && self.tenant_requests_per_second >= 0.0)
        {
            return Err(
                "--tenant-requests-per-second must be 0 (no limit) or a positive number".into(),
            );
        }
        if self.device_sample_interval < Duration::from_millis(100) {
            return Err("--device-sample-interval must be at least 100ms".into());
        }
        if self.header_read_timeout < Duration::from_millis(100) {
            return Err("--header-read-timeout must be at least 100ms".into());
        }
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.api_keys_file.is_none()
            && !self.allow_unauthenticated
            && !self.bind.ip().is_loopback()
        {
            return Err(format!(
                "--bind {} is reachable from the network and no --api-keys-file is given: \
                 every API route, every tenant's budgets and datasets included, would be open \
                 to anyone who can reach it. Give --api-keys-file FILE (lines \"KEY TENANT\"; \
                 `gpu-ops new-key --tenant NAME --file FILE` writes one), or \
                 --allow-unauthenticated when something in front of the server authenticates, \
                 or bind 127.0.0.1",
                self.bind
            ));
        }
        let api_keys = self
            .api_keys_file
            .as_ref()
            .map(|p| load_api_keys(p))
            .transpose()?;
        let body_pool_bytes = self.body_pool_bytes.unwrap_or(self.max_body_bytes);
        Ok(Settings {
            cpu_threads,
            max_inflight_body_bytes,
            body_pool_bytes,
            api_keys,
            config: self,
        })
    }

    /// The defaults, as if no flag or variable were given (tests, benchmarks).
    pub fn defaults() -> Self {
        Cli::parse_from(["gpu-ops"]).config
    }
}

mod api_keys;
use api_keys::load_api_keys;

#[cfg(test)]
mod tests;
