//! Synthetic dataset jobs: a catalog row per job (`store::datasets`), one worker thread
//! that runs queued jobs in order on its own rayon pool, live progress, cancellation, and
//! the result files written atomically under `--data-dir/datasets/<id>/` (`features.parquet`,
//! and for `iq_raw` the recordings, `iq_out`). Submission refuses a job whose files could
//! outgrow the free disk space, and a running job stops before the disk fills.
//!
//! The dataset is the first `num_samples` accepted sample indices, in index order: the
//! worker evaluates indices in parallel batches but accepts them in order and stops at the
//! target, so the file does not depend on thread count or batch size.
//!
//! With a healthy GPU (and `--backend` not `cpu`) a batch's recordings are written and
//! reduced to chunk sums on the device (`dataset::samples_cuda`); the first device batch
//! of every job is checked against the CPU on its first sample. A disagreement keeps
//! datasets off every device until restart; a device error leaves the device for the rest
//! of that job. Either way the batch reruns on the CPU and nothing is lost.

pub mod iq_out;
pub mod parquet_out;
pub mod sigmf;

use crate::backend::{BackendChoice, Backends, CudaDevice};
use crate::metrics::Metrics;
use crate::ops::rf::dataset::{
    device_batch, fits_device, records_agree, sample, samples_cuda, Rejection, SampleRecord,
};
use crate::ops::rf::generate::{samples_per_recording, GENERATOR_VERSION};
use crate::ops::rf::rng::dataset_key;
use crate::ops::rf::scenario::Scenario;
use crate::store::{Counts, DatasetRow, DatasetStatus, NewDataset, Store};
use iq_out::IqWriter;
use parquet_out::FeatureWriter;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Dataset batches' name in the fallback metric.
const DATASET_OP: &str = "rf_dataset";
/// Attempts allowed per requested sample before a job fails as unsatisfiable.
pub const MAX_ATTEMPTS_PER_SAMPLE: u64 = 100;
/// How often running progress is written to the catalog.
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// Free space left under `--data-dir` for the catalog and the rest of the system: a job
/// that would take it is refused, and a running job that reaches it fails.
pub const DISK_RESERVE_BYTES: u64 = 256 << 20;

/// An upper bound of the bytes a dataset's files take: every Parquet value uncompressed
/// with its definition level, plus every recording for `iq_raw`.
pub fn estimate_bytes(s: &Scenario, iq_raw: bool, num_samples: u64) -> u64 {
    let slots = s.receiver_slots();
    let row = parquet_out::column_names(slots).len() as u64 * 9 + 64;
    let iq = if iq_raw {
        iq_out::bytes_per_sample(slots, samples_per_recording(s))
    } else {
        0
    };
    (row + iq).saturating_mul(num_samples)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The nice value dataset threads run at. They share the cores with request handling
/// (the CPU executor has `--cpu-threads` threads too): at nice 10 the kernel gives a
/// runnable request thread about ten times a dataset thread's share, so requests keep
/// their latency while a dataset job takes whatever CPU they leave.
pub const DATASET_NICE: i32 = 10;

/// The dataset job's own rayon pool, its threads at `DATASET_NICE`.
fn dataset_pool(threads: usize) -> Result<rayon::ThreadPool, String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("gpu-ops-dataset-{i}"))
        .start_handler(|_| lower_priority())
        .build()
        .map_err(|e| format!("dataset thread pool: {e}"))
}

/// Lowers the calling thread to `DATASET_NICE` (never raises it: an unprivileged process
/// cannot, and one started at a higher nice keeps it). Elsewhere than Linux, a no-op.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and getpriority/setpriority on this thread's own id read and set
        // only its scheduling priority.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            let current = libc::getpriority(libc::PRIO_PROCESS, tid);
            if current < DATASET_NICE
                && libc::setpriority(libc::PRIO_PROCESS, tid, DATASET_NICE) != 0
            {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "cannot lower a dataset thread's priority; it competes with requests as an equal"
                );
            }
        }
    }
}

/// Live state of a queued or running job.
pub struct Active {
    cancel: AtomicBool,
    progress: Mutex<Progress>,
    /// `estimate_bytes` of the whole job, and its target, to reserve what is left.
    estimate: u64,
    target: u64,
}

impl Active {
    /// Bytes the job may still write.
    fn outstanding(&self) -> u64 {
        let valid = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counts
            .valid;
        remaining_bytes(self.estimate, self.target, valid)
    }
}

/// The share of a job's `estimate` still to write with `valid` of `target` rows done.
fn remaining_bytes(estimate: u64, target: u64, valid: u64) -> u64 {
    let left = target.saturating_sub(valid) as f64 / target.max(1) as f64;
    (estimate as f64 * left) as u64
}

#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub counts: Counts,
    pub started: Option<Instant>,
    /// Samples recovered from a checkpoint when the job was resumed.
    pub resumed_from: u64,
}

const CHECKPOINT: &str = "checkpoint.json";

/// Where a job stands after its last sealed Parquet part: the accepted rows so far are
/// exactly the sample indices below `next_index` that passed, so resuming from here
/// gives the same dataset as running on.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    next_index: u64,
    counts: Counts,
    parts: usize,
    iq: Option<iq_out::IqLengths>,
    /// The `GENERATOR_VERSION` that wrote the rows so far (absent before version 2).
    #[serde(default = "first_generator")]
    generator: u32,
}

fn first_generator() -> u32 {
    1
}

impl Checkpoint {
    /// Refuses a checkpoint another generator version wrote: resuming it would mix two
    /// generators' samples in one dataset.
    fn check_generator(&self) -> Result<(), String> {
        if self.generator == GENERATOR_VERSION {
            return Ok(());
        }
        Err(format!(
            "its first {} samples were generated by generator version {}, and this server generates version {GENERATOR_VERSION}; resuming would mix the two in one dataset, so delete it and submit the job again (the same seed gives the same dataset within a version)",
            self.next_index, self.generator
        ))
    }

    fn load(dir: &Path) -> Result<Option<Self>, String> {
        let p = dir.join(CHECKPOINT);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("{}: {e}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }

    /// Written to a temporary file, synced and renamed, so it is whole or absent.
    fn save(&self, dir: &Path) -> Result<(), String> {
        let (tmp, p) = (dir.join("checkpoint.json.partial"), dir.join(CHECKPOINT));
        let bytes = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &p)
        };
        write().map_err(|e| format!("{}: {e}", p.display()))
    }
}

pub struct Datasets {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    dir: PathBuf,
    active: Arc<Mutex<HashMap<String, Arc<Active>>>>,
    queue: SyncSender<String>,
    max_queued: usize,
    /// Set at shutdown: running and queued jobs end as `interrupted`, not `cancelled`.
    stopping: AtomicBool,
    backends: Arc<Backends>,
    /// Set when a device's dataset batch disagreed with the CPU: datasets stay on the CPU.
    device_distrusted: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{0} dataset jobs are already waiting")]
    QueueFull(usize),
    #[error("the dataset may take up to {} and the disk under --data-dir has {} free, of which {} is promised to queued and running jobs and {} kept in reserve", gib(*.need), gib(*.free), gib(*.promised), gib(DISK_RESERVE_BYTES))]
    NoSpace { need: u64, free: u64, promised: u64 },
    #[error("{0}")]
    Storage(String),
    #[error("the job cannot be resumed: {0}")]
    NotResumable(String),
    #[error("the dataset may take up to {} and the tenant's other datasets up to {}, beyond --max-tenant-dataset-bytes ({}); delete datasets (DELETE /datasets/{{id}}) or ask for fewer samples", gib(*.need), gib(*.used), gib(*.quota))]
    QuotaExceeded { need: u64, used: u64, quota: u64 },
}

impl Datasets {
    /// Marks jobs a previous process left unfinished as interrupted, removes their
    /// partial files, and starts the worker.
    pub fn start(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        data_dir: &Path,
        threads: usize,
        max_queued: usize,
        backends: Arc<Backends>,
    ) -> Result<Arc<Self>, String> {
        let dir = data_dir.join("datasets");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for id in store.interrupt_unfinished_datasets()? {
            tracing::warn!(dataset = %id, "dataset job interrupted by the previous shutdown; its files are kept for resume");
        }
        let pool = dataset_pool(threads)?;
        let (tx, rx) = sync_channel::<String>(max_queued);
        let this = Arc::new(Self {
            store,
            metrics,
            dir,
            active: Arc::new(Mutex::new(HashMap::new())),
            queue: tx,
            max_queued,
            stopping: AtomicBool::new(false),
            backends,
            device_distrusted: AtomicBool::new(false),
        });
        let worker = this.clone();
        std::thread::Builder::new()
            .name("gpu-ops-datasets".into())
            .spawn(move || {
                lower_priority();
                while let Ok(id) = rx.recv() {
                    worker.run(&id, &pool);
                }
            })
            .map_err(|e| format!("dataset worker: {e}"))?;
        Ok(this)
    }

    /// Where a job's files live.
    pub fn dataset_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    pub fn result_path(&self, id: &str) -> PathBuf {
        self.dir.join(id).join("features.parquet")
    }

    /// Queues a job whose files take at most `estimate` bytes (`estimate_bytes`).
    pub fn submit(
        &self,
        id: &str,
        new: NewDataset,
        estimate: u64,
        tenant_quota: u64,
    ) -> Result<DatasetRow, SubmitError> {
        let mut active = self.reserve(estimate)?;
        // Under the reservation's lock, so two submissions cannot both take the quota.
        if tenant_quota > 0 {
            let used = self
                .tenant_bytes(&new.tenant)
                .map_err(SubmitError::Storage)?;
            if used.saturating_add(estimate) > tenant_quota {
                return Err(SubmitError::QuotaExceeded {
                    need: estimate,
                    used,
                    quota: tenant_quota,
                });
            }
        }
        let row = self
            .store
            .create_dataset(id, new)
            .map_err(|e| SubmitError::Storage(e.into()))?;
        self.enqueue(&mut active, id, estimate, row.num_samples)
            .inspect_err(|_| {
                let _ = self.store.delete_dataset(&row.tenant, id);
            })?;
        Ok(row)
    }

    /// What a tenant's datasets may take: `estimate_bytes` of each not failed or cancelled
    /// (those keep no files).
    fn tenant_bytes(&self, tenant: &str) -> Result<u64, String> {
        let mut used = 0u64;
        for row in self.store.datasets(tenant)? {
            if matches!(row.status, DatasetStatus::Failed | DatasetStatus::Cancelled) {
                continue;
            }
            let s: Scenario = serde_json::from_str(&row.config)
                .map_err(|e| format!("{}: stored config: {e}", row.id))?;
            used = used.saturating_add(estimate_bytes(
                &s,
                row.dataset_type == "iq_raw",
                row.num_samples,
            ));
        }
        Ok(used)
    }

    /// Queues an interrupted job again; it continues from its checkpoint. False when the
    /// job is not interrupted. `estimate` is the whole job's (`estimate_bytes`).
    pub fn resume(&self, row: &DatasetRow, estimate: u64) -> Result<bool, SubmitError> {
        if let Some(c) = Checkpoint::load(&self.dir.join(&row.id)).map_err(SubmitError::Storage)? {
            c.check_generator().map_err(SubmitError::NotResumable)?;
        }
        let mut active =
            self.reserve(remaining_bytes(estimate, row.num_samples, row.counts.valid))?;
        if !self
            .store
            .requeue_dataset(&row.id)
            .map_err(|e| SubmitError::Storage(e.into()))?
        {
            return Ok(false);
        }
        self.enqueue(&mut active, &row.id, estimate, row.num_samples)
            .inspect_err(|_| {
                let _ = self.store.update_dataset(
                    &row.id,
                    DatasetStatus::Interrupted,
                    &row.counts,
                    row.error.as_deref(),
                );
            })?;
        Ok(true)
    }

    /// Refuses a job that may write `need` more bytes than the disk has free after what
    /// active jobs may still write and the reserve. The returned guard is held until the
    /// job is queued, so two submissions cannot both take the same free space.
    fn reserve(
        &self,
        need: u64,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<String, Arc<Active>>>, SubmitError> {
        let free = fs4::available_space(&self.dir)
            .map_err(|e| SubmitError::Storage(format!("{}: {e}", self.dir.display())))?;
        let active = self.lock();
        let promised: u64 = active.values().map(|a| a.outstanding()).sum();
        if need
            .saturating_add(promised)
            .saturating_add(DISK_RESERVE_BYTES)
            > free
        {
            return Err(SubmitError::NoSpace {
                need,
                free,
                promised,
            });
        }
        Ok(active)
    }

    /// Registers the job as active and hands it to the worker; on a full queue it is
    /// unregistered again (the caller restores the catalog).
    fn enqueue(
        &self,
        active: &mut HashMap<String, Arc<Active>>,
        id: &str,
        estimate: u64,
        target: u64,
    ) -> Result<(), SubmitError> {
        active.insert(
            id.to_string(),
            Arc::new(Active {
                cancel: AtomicBool::new(false),
                progress: Mutex::new(Progress::default()),
                estimate,
                target,
            }),
        );
        self.queue.try_send(id.to_string()).map_err(|e| {
            active.remove(id);
            match e {
                TrySendError::Full(_) => SubmitError::QueueFull(self.max_queued),
                TrySendError::Disconnected(_) => {
                    SubmitError::Storage("the dataset worker stopped".into())
                }
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Active>>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Live progress of a queued or running job.
    pub fn progress(&self, id: &str) -> Option<Progress> {
        self.lock()
            .get(id)
            .map(|a| a.progress.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Asks a queued or running job to stop; false when it is not active.
    pub fn cancel(&self, id: &str) -> bool {
        match self.lock().get(id) {
            Some(a) => {
                a.cancel.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Stops every queued and running job; they are recorded as interrupted.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for a in self.lock().values() {
            a.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// Removes the job's files (cancelling it first if it runs).
    pub fn remove_files(&self, id: &str) {
        self.cancel(id);
        let _ = std::fs::remove_dir_all(self.dir.join(id));
    }

    /// The device a dataset batch runs on, if any: the backends' next healthy GPU (the
    /// choice request jobs get), `--backend` not `cpu`, no earlier disagreement, and a
    /// scenario whose segments `rf_chunk_reduce` takes.
    fn dataset_device(&self, s: &Scenario) -> Option<Arc<CudaDevice>> {
        if self.backends.mode == BackendChoice::Cpu
            || self.device_distrusted.load(Ordering::Relaxed)
            || !fits_device(s)
        {
            return None;
        }
        self.backends.pick_gpu()
    }

    /// A batch's records from the device, or None when it failed or (on a job's first
    /// device batch, `checked` false) its first sample disagreed with the CPU's: the
    /// caller then runs the batch on the CPU. A fatal error takes the device out of
    /// service, a disagreement takes every device off datasets.
    #[allow(clippy::too_many_arguments)]
    fn device_records(
        &self,
        dev: &CudaDevice,
        pool: &rayon::ThreadPool,
        s: &Scenario,
        key: u64,
        indices: std::ops::Range<u64>,
        keep_iq: bool,
        checked: bool,
    ) -> Option<Vec<SampleRecord>> {
        let first = indices.start;
        // The lease binds the device's context to the thread that runs the batch.
        let result = pool.install(|| {
            let lease = dev.lease()?;
            samples_cuda(s, key, indices, keep_iq, &lease)
        });
        let records = match result {
            Ok(records) => records,
            Err(e) => {
                self.backends.device_failed(dev, DATASET_OP, &e, true);
                return None;
            }
        };
        if !checked {
            let cpu = pool.install(|| sample(s, key, first, keep_iq).0);
            if let Err(why) = records_agree(&records[0], &cpu) {
                tracing::error!(device = dev.info.ordinal, sample = first, disagreement = %why, "the device's dataset sample disagrees with the CPU's; datasets stay on the CPU");
                self.device_distrusted.store(true, Ordering::Relaxed);
                self.backends.count_fallback(DATASET_OP, "parity");
                return None;
            }
        }
        self.metrics
            .dataset_batches
            .with_label_values(&["cuda"])
            .inc();
        Some(records)
    }

    fn run(&self, id: &str, pool: &rayon::ThreadPool) {
        let Some(active) = self.lock().get(id).cloned() else {
            return;
        };
        let outcome = self.run_job(id, &active, pool);
        let counts = active
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counts
            .clone();
        let (status, error) = match outcome {
            Ok(DatasetStatus::Cancelled) if self.stopping.load(Ordering::SeqCst) => (
                DatasetStatus::Interrupted,
                Some("the server shut down before the job finished; POST /datasets/{id}/resume continues it from its last checkpoint".to_string()),
            ),
            Ok(status) => (status, None),
            Err(e) => {
                tracing::error!(dataset = %id, error = %e, "dataset job failed");
                (DatasetStatus::Failed, Some(e))
            }
        };
        // An interrupted job keeps its parts and checkpoint for `resume`.
        if status != DatasetStatus::Completed && status != DatasetStatus::Interrupted {
            let _ = std::fs::remove_dir_all(self.dir.join(id));
        }
        self.metrics
            .dataset_jobs
            .with_label_values(&[status.name()])
            .inc();
        match self
            .store
            .update_dataset(id, status, &counts, error.as_deref())
        {
            // Only now are the parts and the checkpoint no longer needed for a resume.
            Ok(()) if status == DatasetStatus::Completed => {
                parquet_out::remove_parts(&self.result_path(id));
                let _ = std::fs::remove_file(self.dir.join(id).join(CHECKPOINT));
            }
            Ok(()) => {}
            Err(e) => {
                tracing::error!(dataset = %id, error = %e, "cannot record the dataset job's end")
            }
        }
        self.lock().remove(id);
    }

    fn run_job(
        &self,
        id: &str,
        active: &Active,
        pool: &rayon::ThreadPool,
    ) -> Result<DatasetStatus, String> {
        // Cancelled or deleted while queued.
        if active.cancel.load(Ordering::SeqCst) {
            return Ok(DatasetStatus::Cancelled);
        }
        let row = self
            .store
            .dataset_any(id)?
            .ok_or("the job was deleted before it started")?;
        let scenario: Scenario =
            serde_json::from_str(&row.config).map_err(|e| format!("stored config: {e}"))?;
        let slots = scenario.receiver_slots();
        let dir = self.dir.join(id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{id}: {e}"))?;
        // A resumed job continues from its last checkpoint; anything written after it is
        // cut off. A new job (or one interrupted before its first checkpoint) starts at 0.
        let resumed = Checkpoint::load(&dir)?;
        let at = resumed.clone().unwrap_or_default();
        if let Some(c) = &resumed {
            c.check_generator()?;
            tracing::info!(dataset = %id, valid = c.counts.valid, next = c.next_index, "resuming dataset job from its checkpoint");
        }
        let mut writer = FeatureWriter::open(
            &self.result_path(id),
            slots,
            parquet_out::rows_per_part(row.num_samples),
            at.parts,
        )?;
        let keep_iq = row.dataset_type == "iq_raw";
        let mut iq_writer = if keep_iq {
            Some(IqWriter::open(
                &dir,
                samples_per_recording(&scenario),
                at.iq.unwrap_or_default(),
            )?)
        } else {
            None
        };
        let set_progress = |f: &dyn Fn(&mut Progress)| {
            f(&mut active.progress.lock().unwrap_or_else(|e| e.into_inner()));
        };
        let mut counts = at.counts.clone();
        let c = counts.clone();
        set_progress(&|p| {
            p.started = Some(Instant::now());
            p.resumed_from = c.valid;
            p.counts = c.clone();
        });
        self.store
            .update_dataset(id, DatasetStatus::Running, &counts, None)?;
        let key = dataset_key(row.seed);
        let target = row.num_samples;
        let max_attempts = target.saturating_mul(MAX_ATTEMPTS_PER_SAMPLE).max(1000);
        let cpu_batch = (pool.current_num_threads() * 4) as u64;
        // The device is checked on a job's first batch there, and left for the rest of
        // the job after any failure (an out-of-memory batch would fail again).
        let (mut device_checked, mut device_ok) = (false, true);
        let mut next = at.next_index;
        let mut persisted = Instant::now();
        while counts.valid < target {
            if active.cancel.load(Ordering::SeqCst) {
                return Ok(DatasetStatus::Cancelled);
            }
            let free = fs4::available_space(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if free < DISK_RESERVE_BYTES {
                return Err(format!(
                    "the disk under --data-dir has only {} free (the reserve is {}); the job stopped before filling it",
                    gib(free),
                    gib(DISK_RESERVE_BYTES)
                ));
            }
            if next >= max_attempts {
                return Err(format!(
                    "only {} of {} attempted samples passed the quality filters; at most {MAX_ATTEMPTS_PER_SAMPLE} attempts per requested sample are made (relax config.quality)",
                    counts.valid, counts.attempted
                ));
            }
            let device = device_ok.then(|| self.dataset_device(&scenario)).flatten();
            let on_device = device.and_then(|dev| {
                let indices = next..next + device_batch(&scenario);
                let records = self.device_records(
                    &dev,
                    pool,
                    &scenario,
                    key,
                    indices,
                    keep_iq,
                    device_checked,
                );
                (device_checked, device_ok) = (true, records.is_some());
                records
            });
            let records = on_device.unwrap_or_else(|| {
                self.metrics
                    .dataset_batches
                    .with_label_values(&["cpu"])
                    .inc();
                pool.install(|| {
                    (next..next + cpu_batch)
                        .into_par_iter()
                        .map(|n| sample(&scenario, key, n, keep_iq).0)
                        .collect()
                })
            });
            next += records.len() as u64;
            for rec in &records {
                counts.attempted += 1;
                let outcome = match rec.rejected {
                    None => {
                        let sealed = writer.push(rec)?;
                        if let (Some(w), Some(iq)) = (iq_writer.as_mut(), rec.iq.as_ref()) {
                            w.push(rec, iq)?;
                        }
                        counts.valid += 1;
                        if sealed {
                            let iq = iq_writer.as_mut().map(IqWriter::checkpoint).transpose()?;
                            Checkpoint {
                                next_index: rec.index + 1,
                                counts: counts.clone(),
                                parts: writer.parts(),
                                iq,
                                generator: GENERATOR_VERSION,
                            }
                            .save(&dir)?;
                        }
                        "accepted"
                    }
                    Some(Rejection::TooFewReceivers) => {
                        counts.rejected_too_few_receivers += 1;
                        "too_few_receivers"
                    }
                    Some(Rejection::LowSnr) => {
                        counts.rejected_low_snr += 1;
                        "low_snr"
                    }
                    Some(Rejection::HighGdop) => {
                        counts.rejected_high_gdop += 1;
                        "high_gdop"
                    }
                };
                self.metrics
                    .dataset_samples
                    .with_label_values(&[outcome])
                    .inc();
                if counts.valid == target {
                    break;
                }
            }
            let c = counts.clone();
            set_progress(&|p| p.counts = c.clone());
            if persisted.elapsed() >= PERSIST_EVERY {
                self.store
                    .update_dataset(id, DatasetStatus::Running, &counts, None)?;
                persisted = Instant::now();
            }
        }
        if let Some(w) = iq_writer {
            w.finish()?;
        }
        writer.finish()?;
        Ok(DatasetStatus::Completed)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nice() -> i32 {
        // SAFETY: reads the calling thread's own priority.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn dataset_threads_run_below_request_threads() {
        let own = nice();
        let pool = dataset_pool(2).unwrap();
        let theirs = pool.broadcast(|_| nice());
        assert_eq!(theirs.len(), 2);
        for n in theirs {
            assert!(n >= DATASET_NICE, "a dataset thread at nice {n}");
        }
        // Only the pool's threads: the caller keeps its own priority.
        assert_eq!(nice(), own);
    }
}
