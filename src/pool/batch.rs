//! Dynamic batching: small field-vector jobs of one (field, op, backend) that arrive
//! within `max_delay` of the first are coalesced into one job — one device launch —
//! up to `max_elements`, like Triton's `max_queue_delay_microseconds`. Each caller gets
//! its own slice of the result, in its own order, or its own 504 at its own deadline.

use super::{Completed, Enqueuer, JobError, Output, Work};
use crate::backend::BackendChoice;
use crate::ops::zk::{Field, FieldBinaryJob, FieldOp};
use clap::ValueEnum;
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

/// One caller's job waiting to be batched.
struct Pending {
    job: FieldBinaryJob,
    deadline: Instant,
    reply: oneshot::Sender<Result<Completed, JobError>>,
}

type Lane = (Field, FieldOp, BackendChoice);

pub(super) struct Batcher {
    config: BatchConfig,
    enqueuer: Enqueuer,
    lanes: Mutex<HashMap<Lane, mpsc::UnboundedSender<Pending>>>,
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
    pub(super) fn offer(
        &self,
        work: Work,
        backend: BackendChoice,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Result<Completed, JobError>>, Box<Work>> {
        let small = work.elements() < work.gpu_min_elements().min(self.config.max_elements);
        let enabled = match self.config.mode {
            BatchMode::Off => false,
            BatchMode::Always => true,
            BatchMode::Gpu => self
                .enqueuer
                .shared
                .backends
                .healthy_gpus()
                .next()
                .is_some(),
        };
        let Work::FieldBinary(job) = work else {
            return Err(Box::new(work));
        };
        if !enabled || !small || backend == BackendChoice::Cpu {
            return Err(Box::new(Work::FieldBinary(job)));
        }
        let lane = (job.field(), job.op(), backend);
        let (reply, rx) = oneshot::channel();
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let tx = lanes.entry(lane).or_insert_with(|| {
            let (tx, lane_rx) = mpsc::unbounded_channel();
            tokio::spawn(run_lane(lane_rx, lane, self.config, self.enqueuer.clone()));
            tx
        });
        match tx.send(Pending {
            job,
            deadline,
            reply,
        }) {
            Ok(()) => Ok(rx),
            Err(mpsc::error::SendError(p)) => Err(Box::new(Work::FieldBinary(p.job))),
        }
    }
}

async fn run_lane(
    mut rx: mpsc::UnboundedReceiver<Pending>,
    lane: Lane,
    config: BatchConfig,
    enqueuer: Enqueuer,
) {
    while let Some(first) = rx.recv().await {
        let until = tokio::time::Instant::now() + config.max_delay;
        let mut elements = first.job.len();
        let mut batch = vec![first];
        while elements < config.max_elements {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(p)) => {
                    elements += p.job.len();
                    batch.push(p);
                }
                _ => break,
            }
        }
        tokio::spawn(run_batch(batch, lane, enqueuer.clone()));
    }
}

async fn run_batch(batch: Vec<Pending>, lane: Lane, enqueuer: Enqueuer) {
    let (_, op, backend) = lane;
    enqueuer
        .shared
        .metrics
        .batch_size
        .with_label_values(&[op.name()])
        .observe(batch.len() as f64);
    // Callers that already left are dropped here, before any work is done.
    let (mut jobs, waiting): (Vec<FieldBinaryJob>, Vec<_>) = batch
        .into_iter()
        .filter(|p| !p.reply.is_closed())
        .map(|p| (p.job, (p.deadline, p.reply)))
        .unzip();
    if jobs.is_empty() {
        return;
    }
    let lens: Vec<usize> = jobs.iter().map(|j| j.len()).collect();
    let combined = if jobs.len() == 1 {
        jobs.pop().expect("one job")
    } else {
        FieldBinaryJob::concat(&jobs.iter().collect::<Vec<_>>())
    };
    // The latest deadline: each caller still times out at its own (its receiver is
    // dropped), and one impatient caller cannot expire the others' work.
    let deadline = waiting.iter().map(|(d, _)| *d).max().expect("non-empty");
    let result = enqueuer
        .submit(Work::FieldBinary(combined), backend, deadline)
        .await;
    let batch: Vec<_> = waiting.into_iter().map(|(_, reply)| reply).collect();
    match result {
        Ok(done) => {
            let Output::Field(values) = done.output else {
                for reply in batch {
                    let _ = reply.send(Err(JobError::Internal(
                        "a batch returned another op's output".into(),
                    )));
                }
                return;
            };
            for (reply, part) in batch.into_iter().zip(values.split(&lens)) {
                let _ = reply.send(Ok(Completed {
                    output: Output::Field(part),
                    run: done.run,
                }));
            }
        }
        Err(e) => {
            for reply in batch {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
