//! Dynamic batching: small jobs of one lane (`Batchable::lane`, e.g. field and op) and
//! one requested backend that arrive within `max_delay` of the first are concatenated
//! into one job — one device launch — up to `max_elements`, like Triton's
//! `max_queue_delay_microseconds`. Each caller gets its own part of the output, in its
//! own order, or its own 504 at its own deadline.

use super::{Completed, Enqueuer, JobError};
use crate::backend::{BackendChoice, Batchable};
use clap::ValueEnum;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// When small jobs are batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BatchMode {
    /// Only while a GPU is in service: batching exists to fill device launches.
    Gpu,
    /// Also on the CPU (tests, benchmarks of the batcher itself).
    Always,
    Off,
}

#[derive(Clone, Copy, Debug)]
pub struct BatchConfig {
    pub mode: BatchMode,
    pub max_delay: Duration,
    pub max_elements: usize,
}

/// What a batched caller gets back: its own part of the output, or the batch's error.
type Answer<J> = Result<Completed<<J as crate::backend::Job>::Output>, JobError>;
type Reply<J> = oneshot::Sender<Answer<J>>;

/// One caller's job waiting to be batched.
struct Pending<J: Batchable> {
    job: J,
    deadline: Instant,
    reply: Reply<J>,
}

/// The lanes of one job type: a collecting task per (lane, backend).
type Lanes<J> = HashMap<(<J as Batchable>::Lane, BackendChoice), mpsc::UnboundedSender<Pending<J>>>;

pub(super) struct Batcher {
    config: BatchConfig,
    enqueuer: Enqueuer,
    /// `Lanes<J>` per job type, keyed by the type: the entry under `TypeId::of::<J>()`
    /// is always a `Lanes<J>`.
    lanes: Mutex<HashMap<TypeId, Box<dyn Any + Send>>>,
}

impl Batcher {
    pub(super) fn new(config: BatchConfig, enqueuer: Enqueuer) -> Self {
        Self {
            config,
            enqueuer,
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Takes the job when it should be batched; gives it back otherwise.
    pub(super) fn offer<J: Batchable>(
        &self,
        job: J,
        backend: BackendChoice,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Answer<J>>, J> {
        let small = job.size() < job.gpu_threshold().min(self.config.max_elements);
        let enabled = match self.config.mode {
            BatchMode::Off => false,
            BatchMode::Always => true,
            BatchMode::Gpu => self
                .enqueuer
                .shared
                .backends
                .gpus_for(job.name())
                .any(|d| d.auto_placement()),
        };
        if !enabled || !small || backend == BackendChoice::Cpu {
            return Err(job);
        }
        let key = (job.lane(), backend);
        let (reply, rx) = oneshot::channel();
        let mut by_type = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(lanes) = by_type
            .entry(TypeId::of::<J>())
            .or_insert_with(|| Box::new(Lanes::<J>::new()))
            .downcast_mut::<Lanes<J>>()
        else {
            return Err(job);
        };
        let tx = lanes.entry(key).or_insert_with(|| {
            let (tx, lane_rx) = mpsc::unbounded_channel();
            tokio::spawn(run_lane(
                lane_rx,
                backend,
                self.config,
                self.enqueuer.clone(),
            ));
            tx
        });
        match tx.send(Pending {
            job,
            deadline,
            reply,
        }) {
            Ok(()) => Ok(rx),
            Err(mpsc::error::SendError(p)) => Err(p.job),
        }
    }
}

async fn run_lane<J: Batchable>(
    mut rx: mpsc::UnboundedReceiver<Pending<J>>,
    backend: BackendChoice,
    config: BatchConfig,
    enqueuer: Enqueuer,
) {
    while let Some(first) = rx.recv().await {
        let until = tokio::time::Instant::now() + config.max_delay;
        let mut elements = first.job.size();
        let mut batch = vec![first];
        while elements < config.max_elements {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(p)) => {
                    elements += p.job.size();
                    batch.push(p);
                }
                _ => break,
            }
        }
        tokio::spawn(run_batch(batch, backend, enqueuer.clone()));
    }
}

async fn run_batch<J: Batchable>(
    batch: Vec<Pending<J>>,
    backend: BackendChoice,
    enqueuer: Enqueuer,
) {
    let op = batch[0].job.name();
    enqueuer
        .shared
        .metrics
        .batch_size
        .with_label_values(&[op])
        .observe(batch.len() as f64);
    // Callers that already left are dropped here, before any work is done.
    let (mut jobs, waiting): (Vec<J>, Vec<_>) = batch
        .into_iter()
        .filter(|p| !p.reply.is_closed())
        .map(|p| (p.job, (p.deadline, p.reply)))
        .unzip();
    if jobs.is_empty() {
        return;
    }
    let sizes: Vec<usize> = jobs.iter().map(|j| j.size()).collect();
    let combined = if jobs.len() == 1 {
        jobs.pop().expect("one job")
    } else {
        J::concat(jobs)
    };
    // The latest deadline: each caller still times out at its own (its receiver is
    // dropped), and one impatient caller cannot expire the others' work.
    let deadline = waiting.iter().map(|(d, _)| *d).max().expect("non-empty");
    let result = enqueuer.run(combined, backend, deadline).await;
    let replies = waiting.into_iter().map(|(_, reply)| reply);
    match result {
        Ok(done) => {
            for (reply, part) in replies.zip(J::split(done.output, &sizes)) {
                let _ = reply.send(Ok(Completed {
                    output: part,
                    run: done.run,
                }));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
