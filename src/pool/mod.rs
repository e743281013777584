//! The job queue: a bounded channel in front of worker tasks that pick a backend, run
//! the job, fall back to the CPU when a device fails, and enforce deadlines. Generic over
//! `backend::Job`: knows no op by name, and neither HTTP nor maths.

mod batch;
mod device_run;
pub mod placement;
mod slot;

pub use batch::{BatchConfig, BatchMode};
// Used by the service (app, api), which is built with the `openapi` feature only.
#[cfg(feature = "openapi")]
pub(crate) use device_run::export_device_cache;
pub use placement::{Placement, PlacementConfig, PlacementMode};

use crate::backend::{
    BackendChoice, BackendKind, Backends, Batchable, DeviceErrorKind, GpuDevice, Job,
};
use crate::metrics::Metrics;
use placement::{Decision, Reason, Shape, Side};
use slot::{Runnable, Slot};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub capacity: usize,
    /// Jobs that may run at once.
    pub workers: usize,
    pub fallback: bool,
    pub default_timeout: Duration,
    /// Fraction of device jobs shadow-checked on the CPU (`--verify-fraction`).
    pub verify_fraction: f64,
    pub batch: BatchConfig,
    /// Run jobs that say `runs_inline` on the worker task (`--cpu-inline-small-jobs`).
    pub inline_small_jobs: bool,
}

/// A finished job's output and where and how long it ran.
pub struct Completed<T> {
    pub output: T,
    pub run: RunInfo,
}

#[derive(Clone, Copy, Debug)]
pub struct RunInfo {
    pub backend: BackendKind,
    pub device: Option<usize>,
    pub queue_time: Duration,
    pub compute_time: Duration,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum JobError {
    #[error("the job queue is full ({capacity} waiting)")]
    QueueFull {
        capacity: usize,
        retry_after_secs: u64,
    },
    #[error("the job's deadline passed before it finished")]
    DeadlineExceeded,
    #[error("{0}")]
    DeviceUnavailable(String),
    /// `backend: cuda` for a job whose shape the device path does not take.
    #[error("{0}")]
    NotOnDevice(String),
    #[error("the device failed and CPU fallback is off: {0}")]
    DeviceFailed(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("internal error: {0}")]
    Internal(String),
}

/// A job on the queue. Its output goes into the submitter's `Slot`; the reply says
/// where and how long it ran.
struct Queued {
    job: Arc<dyn Runnable>,
    backend: BackendChoice,
    deadline: Instant,
    enqueued: Instant,
    reply: oneshot::Sender<Result<RunInfo, JobError>>,
}

enum Target {
    Cpu,
    Device(Arc<GpuDevice>),
}

struct Shared {
    config: PoolConfig,
    metrics: Arc<Metrics>,
    backends: Arc<Backends>,
    placement: Arc<Placement>,
    depth: AtomicI64,
    paused: watch::Sender<bool>,
    /// Moving average of job compute time, for Retry-After.
    avg_compute_us: AtomicU64,
    /// Device jobs completed, for spacing the shadow checks.
    device_jobs: AtomicU64,
}

pub struct Pool {
    enqueuer: Enqueuer,
    batcher: batch::Batcher,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// What puts a job on the queue; the batcher holds a clone to submit its batches.
#[derive(Clone)]
struct Enqueuer {
    sender: Arc<RwLock<Option<mpsc::Sender<Queued>>>>,
    shared: Arc<Shared>,
}

impl Pool {
    /// Starts the workers on the current Tokio runtime.
    pub fn start(
        config: PoolConfig,
        metrics: Arc<Metrics>,
        backends: Arc<Backends>,
        placement: Arc<Placement>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.capacity);
        metrics.queue_capacity.set(config.capacity as i64);
        let shared = Arc::new(Shared {
            metrics,
            backends,
            placement,
            depth: AtomicI64::new(0),
            paused: watch::Sender::new(false),
            avg_compute_us: AtomicU64::new(1000),
            device_jobs: AtomicU64::new(0),
            config,
        });
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let workers = (0..shared.config.workers.max(1))
            .map(|_| tokio::spawn(worker(shared.clone(), rx.clone())))
            .collect();
        let batch = shared.config.batch;
        let enqueuer = Enqueuer {
            sender: Arc::new(RwLock::new(Some(tx))),
            shared,
        };
        Self {
            batcher: batch::Batcher::new(batch, enqueuer.clone()),
            enqueuer,
            workers: Mutex::new(workers),
        }
    }

    /// Queues `job` and waits for its output. `timeout` can only shorten the server's
    /// default deadline. Dropping the returned future before the job starts cancels it.
    pub async fn submit<J: Job>(
        &self,
        job: J,
        backend: BackendChoice,
        timeout: Option<Duration>,
    ) -> Result<Completed<J::Output>, JobError> {
        let deadline = self.admit(&job, backend, timeout)?;
        self.enqueuer.run(job, backend, deadline).await
    }

    /// As `submit`, but a small job may share one run with others of its lane that
    /// arrive within `--batch-max-delay` (`batch.rs`).
    pub async fn submit_batched<J: Batchable>(
        &self,
        job: J,
        backend: BackendChoice,
        timeout: Option<Duration>,
    ) -> Result<Completed<J::Output>, JobError> {
        let deadline = self.admit(&job, backend, timeout)?;
        match self.batcher.offer(job, backend, deadline) {
            Ok(rx) => reply_by(rx, deadline).await,
            Err(job) => self.enqueuer.run(job, backend, deadline).await,
        }
    }

    /// The job's deadline, or why it cannot be queued at all.
    fn admit<J: Job>(
        &self,
        job: &J,
        backend: BackendChoice,
        timeout: Option<Duration>,
    ) -> Result<Instant, JobError> {
        let s = &self.enqueuer.shared;
        if backend == BackendChoice::Gpu {
            if let Some(why) = job.device_refusal() {
                return Err(JobError::NotOnDevice(why));
            }
            // Checked again when the job runs: a device can be lost while it waits.
            if s.backends.gpus_for(job.name()).next().is_none() {
                return Err(s.no_device_for(job.name()));
            }
        }
        let timeout = timeout.map_or(s.config.default_timeout, |t| {
            t.min(s.config.default_timeout)
        });
        Ok(Instant::now() + timeout)
    }

    /// Placement's model and choice (`/device` reports them).
    pub fn placement(&self) -> &Arc<Placement> {
        &self.enqueuer.shared.placement
    }

    /// Workers stop taking jobs until `resume`; jobs keep queueing. Used to hold work
    /// still (maintenance, tests of overload and deadlines).
    pub fn pause(&self) {
        self.enqueuer.shared.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.enqueuer.shared.paused.send_replace(false);
    }

    /// Stops intake; queued jobs still run. Await `drain` for them to finish.
    pub fn close(&self) {
        self.enqueuer
            .sender
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    pub async fn drain(&self) {
        let handles: Vec<_> =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let _ = h.await;
        }
    }
}

/// Waits for a job's reply until its deadline.
async fn reply_by<T>(
    rx: oneshot::Receiver<Result<T, JobError>>,
    deadline: Instant,
) -> Result<T, JobError> {
    match tokio::time::timeout_at(deadline.into(), rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(JobError::Internal("the worker dropped the job".into())),
        Err(_) => Err(JobError::DeadlineExceeded),
    }
}

impl Enqueuer {
    /// Queues `job`, waits until `deadline` for it to run, and hands back its output.
    async fn run<J: Job>(
        &self,
        job: J,
        backend: BackendChoice,
        deadline: Instant,
    ) -> Result<Completed<J::Output>, JobError> {
        let slot = Arc::new(Slot::new(job));
        let run = self.submit(slot.clone(), backend, deadline).await?;
        slot.completed(run)
    }

    /// Queues `job` and waits until `deadline` for it to run; its output is then in its
    /// slot. Dropping the returned future before the job starts cancels it.
    async fn submit(
        &self,
        job: Arc<dyn Runnable>,
        backend: BackendChoice,
        deadline: Instant,
    ) -> Result<RunInfo, JobError> {
        let s = &self.shared;
        let now = Instant::now();
        let (reply, rx) = oneshot::channel();
        let job = Queued {
            job,
            backend,
            deadline,
            enqueued: now,
            reply,
        };
        {
            let sender = self.sender.read().unwrap_or_else(|e| e.into_inner());
            let Some(sender) = sender.as_ref() else {
                return Err(JobError::ShuttingDown);
            };
            s.set_depth(s.depth.fetch_add(1, Ordering::SeqCst) + 1);
            if let Err(e) = sender.try_send(job) {
                s.set_depth(s.depth.fetch_sub(1, Ordering::SeqCst) - 1);
                return Err(match e {
                    mpsc::error::TrySendError::Full(_) => JobError::QueueFull {
                        capacity: s.config.capacity,
                        retry_after_secs: s.retry_after_secs(),
                    },
                    mpsc::error::TrySendError::Closed(_) => JobError::ShuttingDown,
                });
            }
        }
        reply_by(rx, deadline).await
    }
}

impl Shared {
    fn set_depth(&self, d: i64) {
        self.metrics.queue_depth.set(d.max(0));
    }

    /// Seconds until a slot is likely free, rounded up so clients do not retry too early.
    fn retry_after_secs(&self) -> u64 {
        let per_job = self.avg_compute_us.load(Ordering::Relaxed) as f64 / 1e6;
        let depth = self.depth.load(Ordering::SeqCst).max(1) as f64;
        ((depth * per_job / self.config.workers.max(1) as f64).ceil() as u64).clamp(1, 60)
    }

    fn record_compute(&self, d: Duration) {
        let old = self.avg_compute_us.load(Ordering::Relaxed) as f64;
        let new = 0.8 * old + 0.2 * d.as_micros() as f64;
        self.avg_compute_us.store(new as u64, Ordering::Relaxed);
    }

    fn no_device(&self) -> JobError {
        JobError::DeviceUnavailable(format!("no usable GPU: {}", self.backends.reason()))
    }

    /// No device takes `op`: none usable, or (a wgpu adapter's) none that serves it,
    /// each with why.
    fn no_device_for(&self, op: &str) -> JobError {
        let without: Vec<String> = self
            .backends
            .healthy_gpus()
            .filter(|d| !d.serves(op))
            .map(|d| format!("{} ({})", d.label(), d.why_not_served(op)))
            .collect();
        if without.is_empty() {
            return self.no_device();
        }
        JobError::DeviceUnavailable(format!("no usable GPU runs {op}: {}", without.join(", ")))
    }

    /// Where the job runs, and the decision placement books it under.
    fn choose(
        &self,
        job: &dyn Runnable,
        shape: Shape<'_>,
        requested: BackendChoice,
    ) -> Result<(Target, Decision), JobError> {
        let p = &self.placement;
        let on_cpu = |reason| (Target::Cpu, p.decided(shape, Side::Cpu, reason));
        let on = |dev: Arc<GpuDevice>, reason| {
            let d = p.decided(shape, Side::Device(dev.info.ordinal), reason);
            (Target::Device(dev), d)
        };
        // Where the job's device-only operands are, while that device can take it.
        let holder = (requested != BackendChoice::Cpu && job.device_refusal().is_none())
            .then(|| job.resident_on())
            .flatten()
            .and_then(|n| {
                self.backends
                    .gpus_for(job.name())
                    .find(|d| d.info.ordinal == n)
                    .cloned()
            });
        if let Some(dev) = holder {
            return Ok(on(dev, Reason::Resident));
        }
        match (requested, job.device_refusal()) {
            (BackendChoice::Cpu, _) => Ok(on_cpu(Reason::Forced)),
            (BackendChoice::Gpu, Some(why)) => Err(JobError::NotOnDevice(why)),
            (BackendChoice::Gpu, None) => self
                .backends
                .pick_gpu(job.name())
                .map(|dev| on(dev, Reason::Forced))
                .ok_or_else(|| self.no_device_for(job.name())),
            (BackendChoice::Auto, Some(_)) => Ok(on_cpu(Reason::OnlyChoice)),
            (BackendChoice::Auto, None) if self.backends.gpus().is_empty() => Ok((
                Target::Cpu,
                Decision {
                    side: Side::Cpu,
                    reason: Reason::OnlyChoice,
                    predicted: None,
                },
            )),
            (BackendChoice::Auto, None) => {
                let devices: Vec<Arc<GpuDevice>> = self
                    .backends
                    .gpus_for(job.name())
                    .filter(|d| d.auto_placement())
                    .cloned()
                    .collect();
                if devices.is_empty() {
                    return Ok(on_cpu(Reason::OnlyChoice));
                }
                let ordinals: Vec<usize> = devices.iter().map(|d| d.info.ordinal).collect();
                let decision = p.choose(shape, job.gpu_threshold(), &ordinals);
                let target = match decision.side {
                    Side::Cpu => Target::Cpu,
                    Side::Device(n) => Target::Device(
                        devices
                            .into_iter()
                            .find(|d| d.info.ordinal == n)
                            .expect("placement picks among the devices it was given"),
                    ),
                };
                Ok((target, decision))
            }
        }
    }

    async fn run_cpu(&self, job: Arc<dyn Runnable>) -> Result<(), JobError> {
        let outcome = if self.config.inline_small_jobs && job.runs_inline() {
            // Microseconds on this thread: less than the hop to a compute thread and the
            // two wake-ups around it. A panic is caught as on the compute threads.
            self.metrics
                .cpu_inline_jobs
                .with_label_values(&[job.name()])
                .inc();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run_cpu()))
                .map_err(|p| crate::backend::cpu::panic_message(&p))
        } else {
            self.backends
                .cpu
                .run(move || job.run_cpu())
                .await
                .map_err(|p| p.0)
        };
        outcome.map_err(|p| {
            tracing::error!(error = %p, "CPU job panicked");
            JobError::Internal("the computation failed unexpectedly; it has been logged".into())
        })
    }

    /// Runs the job where `choose` says; on a device failure reruns it on the CPU when
    /// fallback is on. Returns the backend that produced the output, and the device.
    /// Every run that ends is a sample for placement.
    async fn execute(&self, q: &mut Queued) -> Result<(BackendKind, Option<usize>), JobError> {
        let lane = q.job.placement_lane();
        let shape = shape_of(q.job.as_ref(), &lane);
        let (target, decision) = self.choose(q.job.as_ref(), shape, q.backend)?;
        let backend = match &target {
            Target::Cpu => BackendKind::Cpu,
            Target::Device(dev) => dev.backend_kind(),
        };
        self.metrics
            .placements
            .with_label_values(&[shape.op, backend.name(), decision.reason.label()])
            .inc();
        self.placement.started(&decision);
        let dev = match target {
            Target::Cpu => {
                let started = Instant::now();
                let result = self.run_cpu(q.job.clone()).await;
                let ran = result
                    .is_ok()
                    .then(|| (Side::Cpu, started.elapsed().as_secs_f64()));
                self.placement.finished(shape, &decision, ran);
                result?;
                return Ok((BackendKind::Cpu, None));
            }
            Target::Device(dev) => dev,
        };
        let result = self.run_device(q, &dev).await;
        let side = Side::Device(dev.info.ordinal);
        self.placement
            .finished(shape, &decision, result.as_ref().ok().map(|&s| (side, s)));
        let err = match result {
            Ok(_) => {
                self.backends.device_succeeded(&dev);
                if self.shadow_due() {
                    self.shadow_check(q.job.clone(), dev.clone());
                }
                return Ok((dev.backend_kind(), Some(dev.info.ordinal)));
            }
            // Nobody waits for it: neither a device failure nor a reason to rerun it.
            Err(e) if e.kind == DeviceErrorKind::Abandoned => {
                return Err(JobError::DeadlineExceeded)
            }
            Err(e) => e,
        };
        self.backends
            .device_failed(&dev, q.job.name(), &err, self.config.fallback);
        if !self.config.fallback {
            return Err(JobError::DeviceFailed(err.message));
        }
        let started = Instant::now();
        self.run_cpu(q.job.clone()).await?;
        self.placement
            .observed(shape, Side::Cpu, started.elapsed().as_secs_f64());
        Ok((BackendKind::Cpu, None))
    }
}

/// A queued job as placement's model sees it; `lane` is its `placement_lane`.
fn shape_of<'a>(job: &dyn Runnable, lane: &'a str) -> Shape<'a> {
    Shape {
        op: job.name(),
        lane,
        size: job.size(),
        bytes: job.input_bytes(),
    }
}

async fn worker(s: Arc<Shared>, rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Queued>>>) {
    let mut paused = s.paused.subscribe();
    loop {
        let Some(mut job) = rx.lock().await.recv().await else {
            break;
        };
        // A paused worker holds the job it took, as a busy one would; the job still
        // waits, so it counts in the queue's depth until the worker goes on.
        let _ = paused.wait_for(|p| !*p).await;
        s.set_depth(s.depth.fetch_sub(1, Ordering::SeqCst) - 1);
        let op = job.job.name();
        if Instant::now() >= job.deadline {
            s.metrics
                .jobs
                .with_label_values(&[op, "none", "expired"])
                .inc();
            let _ = job.reply.send(Err(JobError::DeadlineExceeded));
            continue;
        }
        if job.reply.is_closed() {
            s.metrics
                .jobs
                .with_label_values(&[op, "none", "cancelled"])
                .inc();
            continue;
        }
        let started = Instant::now();
        let queue_time = started - job.enqueued;
        s.metrics.jobs_running.inc();
        let result = s.execute(&mut job).await;
        s.metrics.jobs_running.dec();
        let compute_time = started.elapsed();
        s.record_compute(compute_time);
        let result = result.map(|(backend, device)| {
            let b = backend.name();
            s.metrics
                .job_queue_wait
                .with_label_values(&[op, b])
                .observe(queue_time.as_secs_f64());
            s.metrics
                .job_compute
                .with_label_values(&[op, b])
                .observe(compute_time.as_secs_f64());
            s.metrics.jobs.with_label_values(&[op, b, "ok"]).inc();
            s.metrics
                .elements
                .with_label_values(&[op, b])
                .inc_by(job.job.size() as u64);
            s.metrics
                .bytes
                .with_label_values(&[op, b])
                .inc_by(job.job.input_bytes() as u64);
            RunInfo {
                backend,
                device,
                queue_time,
                compute_time,
            }
        });
        if result.is_err() {
            s.metrics
                .jobs
                .with_label_values(&[op, "none", "error"])
                .inc();
        }
        let _ = job.reply.send(result);
    }
}
