//! Synthetic dataset jobs: a catalog row per job (`store::datasets`), whose queue lives in
//! the catalog: one worker thread claims the front job under a lease it renews as it
//! writes progress, and runs it on its own rayon pool; live progress, cancellation, and
//! the result files written atomically under `--data-dir/datasets/<id>/` (`features.parquet`,
//! and for `iq_raw` the recordings, `iq_out`). Submission refuses a job whose files could
//! outgrow the free disk space, and a running job stops before the disk fills.
//!
//! The dataset is the first `num_samples` accepted sample indices, in index order: the
//! worker evaluates indices in parallel batches but accepts them in order and stops at the
//! target, so the file does not depend on thread count or batch size.
//!
//! With a healthy GPU (and `--backend` not `cpu`) a batch's recordings are written and
//! reduced to chunk sums on the device (`dataset::samples_on_device`). The device comes from
//! `Backends::pick_gpu`, the choice request jobs get, so batches spread over the GPUs;
//! a job's first batch on each device is checked against the CPU on its first sample. A
//! disagreement keeps datasets off every device until restart; a device error leaves the
//! devices for the rest of that job. Either way the batch reruns on the CPU and nothing
//! is lost.

pub mod artifacts;
mod checkpoint;
mod error;
pub mod iq_out;
mod job_files;
pub mod memory;
pub mod parquet_out;
mod published;
pub mod sigmf;
mod worker;

use artifacts::{ArtifactError, ObjectArtifacts};
use checkpoint::Checkpoint;
pub use checkpoint::GeneratorMismatch;
pub use error::{DatasetError, OutputError};
pub use worker::DATASET_NICE;
use worker::{dataset_pool, lower_priority};

use crate::backend::Backends;
use crate::metrics::Metrics;
use crate::ops::rf::generate::samples_per_recording;
use crate::ops::rf::scenario::Scenario;
use crate::store::{
    Counts, DatasetRow, DatasetStatus, NewDataset, QueueCaps, QueueRefusal, Requeue, Store,
    StoreError,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ops::rf::dataset::DATASET_OP;
/// Attempts allowed per requested sample before a job fails as unsatisfiable.
pub const MAX_ATTEMPTS_PER_SAMPLE: u64 = 100;
/// How often running progress is written to the catalog, renewing the worker's lease.
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// How often an idle worker looks for a job it was not woken for.
const IDLE_POLL: Duration = Duration::from_secs(1);
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
    /// Claimed by this process's worker (else still waiting in the queue).
    running: AtomicBool,
    /// The claim was lost (the job deleted, or taken over): stop, write nothing more.
    lost: AtomicBool,
    progress: Mutex<Progress>,
    /// `estimate_bytes` of the whole job, and its target, to reserve what is left.
    estimate: u64,
    target: u64,
}

impl Active {
    fn new(estimate: u64, target: u64) -> Self {
        Self {
            cancel: AtomicBool::new(false),
            running: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            progress: Mutex::new(Progress::default()),
            estimate,
            target,
        }
    }

    fn set_progress(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Bytes the job may still write.
    fn outstanding(&self) -> u64 {
        remaining_bytes(self.estimate, self.target, self.counts().valid)
    }

    /// The counts as the job last reported them.
    fn counts(&self) -> Counts {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counts
            .clone()
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
    /// Wakes the worker when a job is queued here (jobs queued elsewhere are found by
    /// polling).
    wake: SyncSender<()>,
    /// This process's worker, as lease owner: host, pid and a random tag.
    owner: String,
    /// What the queue admits, in all and per tenant.
    caps: QueueCaps,
    /// Host bytes a job's samples in flight may hold (`--dataset-memory-mib`).
    memory_budget: u64,
    /// How long a claimed job stays this worker's without a renewal (`--dataset-lease`):
    /// past it the worker is taken for dead and another may claim the job. Many
    /// renewals fit in it, so a slow batch or a busy database does not lose a live
    /// worker its job.
    lease: Duration,
    /// Set at shutdown: running and queued jobs end as `interrupted`, not `cancelled`.
    stopping: AtomicBool,
    backends: Arc<Backends>,
    /// Where finished files are published (`--artifact-store`); `None`: they stay where
    /// the worker wrote them.
    artifacts: Option<Arc<ObjectArtifacts>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{}", queue_refusal(.0))]
    Queue(QueueRefusal),
    #[error("the dataset may take up to {} and the disk under --data-dir has {} free, of which {} is promised to queued and running jobs and {} kept in reserve", gib(*.need), gib(*.free), gib(*.promised), gib(DISK_RESERVE_BYTES))]
    NoSpace { need: u64, free: u64, promised: u64 },
    /// The disk, a job's checkpoint or the tenant's stored datasets could not be read.
    #[error(transparent)]
    Storage(DatasetError),
    #[error(transparent)]
    Catalog(#[from] StoreError),
    #[error("the job cannot be resumed: {0}")]
    NotResumable(#[source] GeneratorMismatch),
    #[error("the dataset may take up to {} and the tenant's other datasets up to {}, beyond --max-tenant-dataset-bytes ({}); delete datasets (DELETE /datasets/{{id}}) or ask for fewer samples", gib(*.need), gib(*.used), gib(*.quota))]
    QuotaExceeded { need: u64, used: u64, quota: u64 },
}

/// Why the queue refused a job, for its problem's detail.
fn queue_refusal(r: &QueueRefusal) -> String {
    match *r {
        QueueRefusal::Full { queued } => {
            format!("{queued} dataset jobs are already waiting (--max-dataset-jobs)")
        }
        QueueRefusal::TenantFull { queued } => format!(
            "the tenant has {queued} dataset jobs waiting already (--max-tenant-queued-datasets); \
             submit more as they start"
        ),
        QueueRefusal::TenantWork {
            work,
            pending,
            limit,
        } => format!(
            "the job asks for {work} complex samples of synthesis and the tenant's queued and \
             running jobs for {pending}, beyond --max-tenant-dataset-work ({limit}); submit it \
             as they finish"
        ),
    }
}

/// How the dataset worker runs: its threads, what its queue admits, its claims' lease,
/// and the host memory a job's samples in flight may hold.
pub struct WorkerSettings {
    pub threads: usize,
    pub caps: QueueCaps,
    pub lease: Duration,
    pub memory_budget: u64,
}

impl Datasets {
    /// Marks jobs a previous process left unfinished as interrupted (an embedded
    /// catalog), and starts the worker.
    pub fn start(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        data_dir: &Path,
        settings: WorkerSettings,
        backends: Arc<Backends>,
        artifacts: Option<Arc<ObjectArtifacts>>,
    ) -> Result<Arc<Self>, DatasetError> {
        let WorkerSettings {
            threads,
            caps,
            lease,
            memory_budget,
        } = settings;
        let dir = data_dir.join("datasets");
        std::fs::create_dir_all(&dir).map_err(DatasetError::io(&dir))?;
        // A shared queue outlives any one replica: what this one left running is resumed
        // by whichever replica claims it when its lease runs out.
        if !store.is_catalog_shared() {
            for id in store.interrupt_unfinished_datasets()? {
                tracing::warn!(dataset = %id, "dataset job interrupted by the previous shutdown; its files are kept for resume");
            }
        }
        let pool = dataset_pool(threads)?;
        let (wake, woken) = sync_channel::<()>(1);
        let this = Arc::new(Self {
            store,
            metrics,
            dir,
            active: Arc::new(Mutex::new(HashMap::new())),
            wake,
            owner: worker_id()?,
            caps,
            memory_budget,
            lease,
            stopping: AtomicBool::new(false),
            backends,
            artifacts,
        });
        let worker = this.clone();
        std::thread::Builder::new()
            .name("gpu-ops-datasets".into())
            .spawn(move || {
                lower_priority();
                worker.work(&woken, &pool);
            })
            .map_err(DatasetError::Spawn)?;
        Ok(this)
    }

    /// The worker's loop: claim the next job and run it; when there is none, wait to be
    /// woken or for the next poll. Ends at shutdown.
    fn work(&self, woken: &Receiver<()>, pool: &rayon::ThreadPool) {
        while !self.stopping.load(Ordering::SeqCst) {
            if self.store.is_catalog_shared() {
                self.forget_jobs_claimed_elsewhere();
            }
            match self.store.claim_dataset(&self.owner, self.lease) {
                Ok(Some(job)) => {
                    self.run(job, pool);
                    continue;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "cannot claim a dataset job"),
            }
            if let Err(RecvTimeoutError::Disconnected) = woken.recv_timeout(IDLE_POLL) {
                return;
            }
        }
    }

    /// Drops the entries of jobs queued here that another replica claimed (or that ended
    /// otherwise): they hold no disk here, and their progress is the catalog's.
    fn forget_jobs_claimed_elsewhere(&self) {
        let waiting: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, a)| !a.running.load(Ordering::SeqCst))
            .map(|(id, _)| id.clone())
            .collect();
        for id in waiting {
            let still_queued = matches!(
                self.store.dataset_any(&id),
                Ok(Some(row)) if row.status == DatasetStatus::Queued
            );
            if !still_queued {
                let mut active = self.lock();
                // Only this thread claims, so the entry cannot have started meanwhile.
                if active
                    .get(&id)
                    .is_some_and(|a| !a.running.load(Ordering::SeqCst))
                {
                    active.remove(&id);
                }
            }
        }
    }

    fn wake_worker(&self) {
        // A full channel already holds a wake-up.
        let _ = self.wake.try_send(());
    }

    /// Where a job's files live.
    pub fn dataset_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    pub fn result_path(&self, id: &str) -> PathBuf {
        self.dir.join(id).join(parquet_out::RESULT_FILE)
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
            .create_dataset(id, new, self.caps)?
            .map_err(SubmitError::Queue)?;
        active.insert(
            id.to_string(),
            Arc::new(Active::new(estimate, row.num_samples)),
        );
        drop(active);
        self.wake_worker();
        Ok(row)
    }

    /// What a tenant's datasets may take: `estimate_bytes` of each not failed or cancelled
    /// (those keep no files).
    fn tenant_bytes(&self, tenant: &str) -> Result<u64, DatasetError> {
        let mut used = 0u64;
        for row in self.store.datasets(tenant)? {
            if matches!(row.status, DatasetStatus::Failed | DatasetStatus::Cancelled) {
                continue;
            }
            let s: Scenario =
                serde_json::from_str(&row.config).map_err(|source| DatasetError::StoredConfig {
                    id: row.id.clone(),
                    source,
                })?;
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
        let checkpoint = Checkpoint::load(&self.dir.join(&row.id))
            .map_err(|e| SubmitError::Storage(e.into()))?;
        if let Some(c) = checkpoint {
            c.check_generator().map_err(SubmitError::NotResumable)?;
        }
        let mut active =
            self.reserve(remaining_bytes(estimate, row.num_samples, row.counts.valid))?;
        match self.store.requeue_dataset(&row.id, self.caps)? {
            Requeue::NotInterrupted => return Ok(false),
            Requeue::Refused(why) => return Err(SubmitError::Queue(why)),
            Requeue::Queued => {}
        }
        active.insert(
            row.id.clone(),
            Arc::new(Active::new(estimate, row.num_samples)),
        );
        drop(active);
        self.wake_worker();
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
            .map_err(DatasetError::io(&self.dir))
            .map_err(SubmitError::Storage)?;
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Active>>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Live progress of a job this process runs (others: the catalog's counts).
    pub fn progress(&self, id: &str) -> Option<Progress> {
        self.lock()
            .get(id)
            .filter(|a| a.running.load(Ordering::SeqCst))
            .map(|a| a.progress.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Cancels a queued job (at once) or asks a running one to stop (its worker sees it
    /// within a second); false when the job has already ended.
    pub fn cancel(&self, id: &str) -> Result<bool, StoreError> {
        let was = self.store.request_dataset_cancel(id)?;
        self.stop_local(id);
        if was == Some(DatasetStatus::Queued) {
            self.metrics
                .dataset_jobs
                .with_label_values(&[DatasetStatus::Cancelled.name()])
                .inc();
            // A resumed job waiting in the queue has its earlier parts on disk.
            let _ = std::fs::remove_dir_all(self.dir.join(id));
        }
        Ok(was.is_some())
    }

    /// Flags this process's worker to stop the job, or forgets it if it waits unclaimed.
    fn stop_local(&self, id: &str) {
        let mut active = self.lock();
        let running = active.get(id).map(|a| {
            a.cancel.store(true, Ordering::SeqCst);
            a.running.load(Ordering::SeqCst)
        });
        if running == Some(false) {
            active.remove(id);
        }
    }

    /// Stops the running job, and claims nothing more. With an embedded catalog the job
    /// is recorded as interrupted (resumed by `POST /datasets/{id}/resume`), and jobs
    /// still queued are marked so at the next start; with a shared one it goes back to
    /// the queue, where another replica takes it over.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for a in self.lock().values() {
            a.cancel.store(true, Ordering::SeqCst);
        }
        self.wake_worker();
    }

    /// Whether this process's worker is running a job now.
    pub fn is_running_a_job(&self) -> bool {
        self.lock()
            .values()
            .any(|a| a.running.load(Ordering::SeqCst))
    }

    /// Where a completed job's files are served from: the object store, when there is one.
    pub fn artifacts(&self) -> Option<&ObjectArtifacts> {
        self.artifacts.as_deref()
    }

    /// Removes the job's files, here and in the object store (stopping it first if it
    /// runs here).
    pub fn remove_files(&self, id: &str) -> Result<(), ArtifactError> {
        self.stop_local(id);
        let _ = std::fs::remove_dir_all(self.dir.join(id));
        if let Some(a) = &self.artifacts {
            a.delete_dataset(id)?;
        }
        Ok(())
    }
}

/// This process's lease-owner id: unique across replicas and restarts.
fn worker_id() -> Result<String, DatasetError> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "host".into());
    let mut tag = [0u8; 4];
    getrandom::fill(&mut tag).map_err(DatasetError::Entropy)?;
    Ok(format!(
        "{host}/{}/{:08x}",
        std::process::id(),
        u32::from_le_bytes(tag)
    ))
}
