//! The dataset worker: runs one job at a time on its own low-priority rayon pool, batch
//! by batch on the device the backends hand out (or the CPU), accepting samples in
//! index order, checkpointing at every sealed Parquet part.

use super::checkpoint::{attempt_folder, Checkpoint, CHECKPOINT, CHECKPOINTS};
use super::job_files::JobFiles;
use super::memory;
use super::parquet_out;
use super::published::{fetch_checkpoint, publish, Published};
use super::{
    Active, DatasetError, Datasets, DATASET_OP, DISK_RESERVE_BYTES, MAX_ATTEMPTS_PER_SAMPLE,
    PERSIST_EVERY,
};
use crate::backend::{BackendChoice, GpuDevice};
use crate::ops::rf::dataset::{
    device_batch, fits_device, records_agree, sample, samples_on_device, segment_len, SampleRecord,
};
use crate::ops::rf::rng::dataset_key;
use crate::ops::rf::scenario::Scenario;
use crate::store::{ClaimedDataset, Counts, DatasetRow, DatasetStatus, Lease};
use rayon::prelude::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The nice value dataset threads run at. They share the cores with request handling
/// (the CPU executor has `--cpu-threads` threads too): at nice 10 the kernel gives a
/// runnable request thread about ten times a dataset thread's share, so requests keep
/// their latency while a dataset job takes whatever CPU they leave.
pub const DATASET_NICE: i32 = 10;

/// The dataset job's own rayon pool, its threads at `DATASET_NICE`.
pub(super) fn dataset_pool(threads: usize) -> Result<rayon::ThreadPool, DatasetError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("gpu-ops-dataset-{i}"))
        .start_handler(|_| lower_priority())
        .build()
        .map_err(DatasetError::Pool)
}

/// Lowers the calling thread to `DATASET_NICE` (never raises it: an unprivileged process
/// cannot, and one started at a higher nice keeps it). Elsewhere than Linux, a no-op.
pub(super) fn lower_priority() {
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

impl Datasets {
    /// The device a dataset batch runs on, if any: the backends' next healthy GPU (the
    /// choice request jobs get), `--backend` not `cpu`, no earlier disagreement, and a
    /// scenario whose segments `rf_chunk_reduce` takes.
    fn dataset_device(&self, s: &Scenario) -> Option<Arc<GpuDevice>> {
        if self.backends.mode == BackendChoice::Cpu || !fits_device(s) {
            return None;
        }
        self.backends.pick_gpu(DATASET_OP)
    }

    /// A batch's records from the device, or None when it failed or (on a job's first
    /// device batch, `checked` false) its first sample disagreed with the CPU's: the
    /// caller then runs the batch on the CPU. A fatal error takes the device out of
    /// service, a disagreement quarantines datasets on that device.
    #[allow(clippy::too_many_arguments)]
    fn device_records(
        &self,
        dev: &GpuDevice,
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
            samples_on_device(s, key, indices, keep_iq, &lease)
        });
        let records = match result {
            Ok(records) => {
                self.backends.device_succeeded(dev);
                records
            }
            Err(e) => {
                self.backends.device_failed(dev, DATASET_OP, &e, true);
                return None;
            }
        };
        if !checked {
            let cpu = pool.install(|| sample(s, key, first, keep_iq).0);
            if let Err(why) = records_agree(&records[0], &cpu, segment_len(s)) {
                tracing::error!(device = dev.info.ordinal, sample = first, disagreement = %why, "the device's dataset sample disagrees with the CPU's");
                self.backends.quarantine(
                    dev,
                    DATASET_OP,
                    &format!("dataset sample {first}: {why}"),
                );
                self.backends.count_fallback(DATASET_OP, "parity");
                return None;
            }
        }
        self.metrics
            .dataset_batches
            .with_label_values(&[dev.backend_kind().name()])
            .inc();
        Some(records)
    }

    /// Runs a job this worker claimed, and records how it ended (fenced by the claim:
    /// nothing is recorded when the lease was lost meanwhile).
    pub(super) fn run(&self, job: ClaimedDataset, pool: &rayon::ThreadPool) {
        let id = job.row.id.clone();
        let id = id.as_str();
        // A job queued through another process (or before a restart) has no entry yet.
        let active = self
            .lock()
            .entry(id.to_string())
            .or_insert_with(|| {
                let s: Option<Scenario> = serde_json::from_str(&job.row.config).ok();
                let estimate = s.map_or(0, |s| {
                    super::estimate_bytes(&s, job.row.dataset_type == "iq_raw", job.row.num_samples)
                });
                Arc::new(Active::new(estimate, job.row.num_samples))
            })
            .clone();
        active.running.store(true, Ordering::SeqCst);
        let lease = JobLease {
            owner: &self.owner,
            attempt: job.attempt,
        };
        let done = AtomicBool::new(false);
        let outcome = std::thread::scope(|s| {
            s.spawn(|| self.heartbeat(id, &lease, &active, &done));
            let out = self.run_job(&job.row, &active, &lease, pool);
            done.store(true, Ordering::SeqCst);
            out
        });
        let outcome = if active.lost.load(Ordering::SeqCst) {
            Err(JobEnd::LeaseLost)
        } else {
            outcome
        };
        if let Err(JobEnd::LeaseLost) = outcome {
            tracing::warn!(dataset = %id, attempt = job.attempt, "the dataset job's lease was lost (it was deleted, or taken over after this worker stalled); this worker stopped and records nothing");
            // Deleted: what this worker published after the delete's sweep goes too.
            if matches!(self.store.dataset_any(id), Ok(None)) {
                let _ = std::fs::remove_dir_all(self.dir.join(id));
                if let Some(store) = &self.artifacts {
                    let _ = store.delete_dataset(id);
                }
            }
            self.lock().remove(id);
            return;
        }
        let counts = active.counts();
        // A replica shutting down hands a shared queue's job back at once.
        if self.stopping.load(Ordering::SeqCst)
            && self.store.is_catalog_shared()
            && matches!(outcome, Ok(DatasetStatus::Cancelled))
        {
            match self
                .store
                .release_dataset(id, lease.owner, lease.attempt, &counts)
            {
                Ok(true) => {
                    tracing::info!(dataset = %id, "dataset job handed back to the queue at shutdown")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(dataset = %id, error = %e, "cannot hand the dataset job back; another replica takes it when its lease runs out")
                }
            }
            self.lock().remove(id);
            return;
        }
        let (status, error) = match outcome {
            Ok(DatasetStatus::Cancelled) if self.stopping.load(Ordering::SeqCst) => (
                DatasetStatus::Interrupted,
                Some("the server shut down before the job finished; POST /datasets/{id}/resume continues it from its last checkpoint".to_string()),
            ),
            Ok(status) => (status, None),
            Err(JobEnd::Failed(e)) => {
                tracing::error!(dataset = %id, error = %e, "dataset job failed");
                (DatasetStatus::Failed, Some(e.to_string()))
            }
            Err(JobEnd::LeaseLost) => unreachable!("handled above"),
        };
        self.metrics
            .dataset_jobs
            .with_label_values(&[status.name()])
            .inc();
        let local = self.dir.join(id);
        // Recorded first: only a worker that still holds the job may remove what others
        // could be using.
        match self.store.finish_dataset(
            id,
            lease.owner,
            lease.attempt,
            status,
            &counts,
            error.as_deref(),
        ) {
            Ok(true) => match status {
                // Only now are the parts and the checkpoint no longer needed for a
                // resume; with an object store, nothing here is (files are served there).
                DatasetStatus::Completed => match &self.artifacts {
                    Some(store) => {
                        let _ = std::fs::remove_dir_all(&local);
                        if let Err(e) = store.delete_under(id, CHECKPOINTS) {
                            tracing::warn!(dataset = %id, error = %e, "a completed job's checkpoint objects were left behind (DELETE removes them)");
                        }
                    }
                    None => {
                        parquet_out::remove_parts(&self.result_path(id));
                        let _ = std::fs::remove_file(local.join(CHECKPOINT));
                    }
                },
                // Kept for `resume`.
                DatasetStatus::Interrupted => {}
                _ => {
                    let _ = std::fs::remove_dir_all(&local);
                    if let Some(store) = &self.artifacts {
                        if let Err(e) = store.delete_dataset(id) {
                            tracing::warn!(dataset = %id, error = %e, "a failed or cancelled job's checkpoint objects were left behind (DELETE removes them)");
                        }
                    }
                }
            },
            Ok(false) => {
                tracing::warn!(dataset = %id, "the dataset job was deleted or taken over as it ended; its end is not recorded");
                let _ = std::fs::remove_dir_all(&local);
                // Deleted meanwhile: take out what this worker published after the delete.
                if let Some(store) = &self.artifacts {
                    if matches!(self.store.dataset_any(id), Ok(None)) {
                        let _ = store.delete_dataset(id);
                    }
                }
            }
            Err(e) => {
                tracing::error!(dataset = %id, error = %e, "cannot record the dataset job's end");
                if !matches!(
                    status,
                    DatasetStatus::Completed | DatasetStatus::Interrupted
                ) {
                    let _ = std::fs::remove_dir_all(&local);
                }
            }
        }
        self.lock().remove(id);
    }

    fn run_job(
        &self,
        row: &DatasetRow,
        active: &Active,
        lease: &JobLease<'_>,
        pool: &rayon::ThreadPool,
    ) -> Result<DatasetStatus, JobEnd> {
        let id = row.id.as_str();
        // Cancelled or deleted while queued.
        if active.cancel.load(Ordering::SeqCst) {
            return Ok(DatasetStatus::Cancelled);
        }
        let scenario: Scenario =
            serde_json::from_str(&row.config).map_err(|source| DatasetError::StoredConfig {
                id: id.into(),
                source,
            })?;
        let dir = self.dir.join(id);
        if let Some(store) = &self.artifacts {
            // The published checkpoint is the job's: this replica's scratch copy may be
            // older (it lost the job once) or newer by an unpublished part.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(DatasetError::io(&dir))?;
            fetch_checkpoint(store, id, &dir, lease.attempt)?;
        }
        std::fs::create_dir_all(&dir).map_err(DatasetError::io(&dir))?;
        // A resumed job continues from its last checkpoint; anything written after it is
        // cut off. A new job (or one interrupted before its first checkpoint) starts at 0.
        let at = match Checkpoint::load(&dir)? {
            Some(c) => {
                c.check_generator()?;
                tracing::info!(dataset = %id, valid = c.counts.valid, next = c.next_index, "resuming dataset job from its checkpoint");
                c
            }
            None => Checkpoint::default(),
        };
        let keep_iq = row.dataset_type == "iq_raw";
        // The most samples a batch may hold. Admitted under another replica's budget,
        // perhaps: this one holds the job to its own.
        let per_sample = memory::sample_bytes(&scenario, keep_iq);
        let within = memory::batch_within(per_sample, self.memory_budget).ok_or(
            DatasetError::SampleOverMemory {
                sample_mib: memory::mib(per_sample),
                budget_mib: memory::mib(self.memory_budget),
            },
        )?;
        let mut files = JobFiles::open(dir, &self.result_path(id), &scenario, row, keep_iq, &at)?;
        files.published = self.artifacts.as_ref().map(|store| Published {
            store: store.clone(),
            id: id.to_string(),
            folder: attempt_folder(lease.attempt),
            iq_at: at.iq.unwrap_or_default(),
        });
        let mut counts = at.counts.clone();
        active.set_progress(|p| {
            p.started = Some(Instant::now());
            p.resumed_from = counts.valid;
            p.counts = counts.clone();
        });
        let key = dataset_key(row.seed);
        let target = row.num_samples;
        let mut device = DeviceUse::default();
        let mut next = at.next_index;
        while counts.valid < target {
            // Cancelled, deleted, lost (the heartbeat's flags) or shutting down.
            if active.cancel.load(Ordering::SeqCst) || self.stopping.load(Ordering::SeqCst) {
                return Ok(DatasetStatus::Cancelled);
            }
            may_continue(&files.dir, &counts, next, target)?;
            let records =
                self.next_records(&mut device, pool, &scenario, key, next, keep_iq, within);
            next += records.len() as u64;
            for rec in &records {
                let outcome = files.accept(rec, &mut counts)?;
                self.metrics
                    .dataset_samples
                    .with_label_values(&[outcome])
                    .inc();
                if counts.valid == target {
                    break;
                }
            }
            active.set_progress(|p| p.counts = counts.clone());
        }
        // Still ours before the result is made whole.
        self.renew(id, lease, active, &counts)?;
        files.finish()?;
        if let Some(store) = &self.artifacts {
            publish(store, id, &self.dir.join(id), keep_iq)?;
        }
        Ok(DatasetStatus::Completed)
    }

    /// Renews the job's lease with its progress every second for as long as the job runs,
    /// long steps included (fetching a checkpoint, the final splice, uploads). A lost
    /// lease flags the job to stop; a cancellation requested through any replica is
    /// passed on; a store out of reach is retried until the lease itself would run out.
    fn heartbeat(&self, id: &str, lease: &JobLease<'_>, active: &Active, done: &AtomicBool) {
        let mut held_until = Instant::now() + self.lease;
        let mut due = Instant::now();
        while !done.load(Ordering::SeqCst) {
            if Instant::now() < due {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            due = Instant::now() + PERSIST_EVERY;
            let counts = active.counts();
            let asked = Instant::now();
            match self.store.renew_dataset_lease(
                id,
                lease.owner,
                lease.attempt,
                self.lease,
                &counts,
            ) {
                Ok(Lease::Held { cancel }) => {
                    held_until = asked + self.lease;
                    if cancel {
                        active.cancel.store(true, Ordering::SeqCst);
                    }
                }
                Ok(Lease::Lost) => {
                    active.lost.store(true, Ordering::SeqCst);
                    active.cancel.store(true, Ordering::SeqCst);
                    return;
                }
                Err(e) if Instant::now() >= held_until => {
                    tracing::error!(dataset = %id, error = %e, "the dataset job's lease ran out while the store was out of reach; stopping");
                    active.lost.store(true, Ordering::SeqCst);
                    active.cancel.store(true, Ordering::SeqCst);
                    return;
                }
                Err(e) => {
                    tracing::warn!(dataset = %id, error = %e, "cannot renew the dataset job's lease; retrying")
                }
            }
        }
    }

    /// Renews the job's lease with its progress, now; a cancellation requested through
    /// any replica is passed to the job.
    fn renew(
        &self,
        id: &str,
        lease: &JobLease<'_>,
        active: &Active,
        counts: &Counts,
    ) -> Result<(), JobEnd> {
        match self
            .store
            .renew_dataset_lease(id, lease.owner, lease.attempt, self.lease, counts)
            .map_err(|e| JobEnd::Failed(e.into()))?
        {
            Lease::Held { cancel } => {
                if cancel {
                    active.cancel.store(true, Ordering::SeqCst);
                }
                Ok(())
            }
            Lease::Lost => Err(JobEnd::LeaseLost),
        }
    }

    /// The next batch from `next` on: on the device while the job may use one, else on
    /// the dataset pool's CPU threads. Either holds at most `within` samples, what
    /// `--dataset-memory-mib` pays for.
    #[allow(clippy::too_many_arguments)]
    fn next_records(
        &self,
        device: &mut DeviceUse,
        pool: &rayon::ThreadPool,
        scenario: &Scenario,
        key: u64,
        next: u64,
        keep_iq: bool,
        within: u64,
    ) -> Vec<SampleRecord> {
        let dev = device
            .usable
            .then(|| self.dataset_device(scenario))
            .flatten();
        let on_device = dev.and_then(|dev| {
            let indices = next..next + device_batch(scenario).min(within);
            let ordinal = dev.info.ordinal;
            let checked = device.checked.contains(&ordinal);
            let records = self.device_records(&dev, pool, scenario, key, indices, keep_iq, checked);
            device.usable = records.is_some();
            if !checked && device.usable {
                device.checked.push(ordinal);
            }
            records
        });
        on_device.unwrap_or_else(|| {
            self.metrics
                .dataset_batches
                .with_label_values(&["cpu"])
                .inc();
            // Four samples a thread evens out their uneven costs.
            let batch = within.min(pool.current_num_threads() as u64 * 4);
            pool.install(|| {
                (next..next + batch)
                    .into_par_iter()
                    .map(|n| sample(scenario, key, n, keep_iq).0)
                    .collect()
            })
        })
    }
}

/// Whose run of a job this is: the lease's owner and the claim's attempt number.
struct JobLease<'a> {
    owner: &'a str,
    attempt: u64,
}

/// How a job ended other than with a status of its own.
enum JobEnd {
    /// Recorded as the job's `error`.
    Failed(DatasetError),
    /// The lease passed to another worker, or the job was deleted: write nothing more.
    LeaseLost,
}

/// So `?` fails the job with any of the datasets' errors.
impl<E: Into<DatasetError>> From<E> for JobEnd {
    fn from(e: E) -> Self {
        JobEnd::Failed(e.into())
    }
}

/// Whether a job's batches may use a device: each device is checked against the CPU on
/// the job's first batch there, and the job leaves devices after any failure (an
/// out-of-memory batch would fail again).
struct DeviceUse {
    /// Ordinals of the devices whose first batch of this job agreed with the CPU.
    checked: Vec<usize>,
    usable: bool,
}

impl Default for DeviceUse {
    fn default() -> Self {
        Self {
            checked: Vec::new(),
            usable: true,
        }
    }
}

/// Stops a job that would fill the disk or whose filters reject nearly everything.
fn may_continue(dir: &Path, counts: &Counts, next: u64, target: u64) -> Result<(), DatasetError> {
    let free = fs4::available_space(dir).map_err(DatasetError::io(dir))?;
    if free < DISK_RESERVE_BYTES {
        return Err(DatasetError::DiskFull { free });
    }
    if next >= target.saturating_mul(MAX_ATTEMPTS_PER_SAMPLE).max(1000) {
        return Err(DatasetError::TooManyRejected {
            valid: counts.valid,
            attempted: counts.attempted,
        });
    }
    Ok(())
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
