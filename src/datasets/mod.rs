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
//! reduced to chunk sums on the device (`dataset::samples_cuda`). The device comes from
//! `Backends::pick_gpu`, the choice request jobs get, so batches spread over the GPUs;
//! a job's first batch on each device is checked against the CPU on its first sample. A
//! disagreement keeps datasets off every device until restart; a device error leaves the
//! devices for the rest of that job. Either way the batch reruns on the CPU and nothing
//! is lost.

mod checkpoint;
pub mod iq_out;
pub mod parquet_out;
pub mod sigmf;
mod worker;

use checkpoint::Checkpoint;
pub use worker::DATASET_NICE;
use worker::{dataset_pool, lower_priority};

use crate::backend::Backends;
use crate::metrics::Metrics;
use crate::ops::rf::generate::samples_per_recording;
use crate::ops::rf::scenario::Scenario;
use crate::store::{Counts, DatasetRow, DatasetStatus, NewDataset, Store, StoreError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ops::rf::dataset::DATASET_OP;
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

/// Live state of a queued or running job.
pub struct Active {
    cancel: AtomicBool,
    progress: Mutex<Progress>,
    /// `estimate_bytes` of the whole job, and its target, to reserve what is left.
    estimate: u64,
    target: u64,
}

impl Active {
    fn set_progress(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }

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
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{0} dataset jobs are already waiting")]
    QueueFull(usize),
    #[error("the dataset may take up to {} and the disk under --data-dir has {} free, of which {} is promised to queued and running jobs and {} kept in reserve", gib(*.need), gib(*.free), gib(*.promised), gib(DISK_RESERVE_BYTES))]
    NoSpace { need: u64, free: u64, promised: u64 },
    #[error("{0}")]
    Storage(String),
    #[error(transparent)]
    Catalog(#[from] StoreError),
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
        let row = self.store.create_dataset(id, new)?;
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
        if !self.store.requeue_dataset(&row.id)? {
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
}
