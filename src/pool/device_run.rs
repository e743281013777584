//! A job's run on a device: its lease, its shadow check.

use super::placement::{Shape, Side};
use super::slot::Runnable;
use super::{Queued, Shared};
use crate::backend::device::{CopyCounts, Stop};
use crate::backend::{DeviceError, GpuDevice};
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device memory a job asks its lease for, per byte of its input: room for the input,
/// an output as large and scratch besides. A job given less runs in more passes; one given
/// more leaves it to the jobs beside it (`backend::device::lease`).
const DEVICE_BYTES_PER_INPUT_BYTE: usize = 4;

/// Adds a finished lease's copies to the device's counters.
fn count_copies(metrics: &Metrics, gpu: &str, copies: &CopyCounts) {
    let bytes = [
        ("to_device", "page_locked", &copies.staged_to_device),
        ("from_device", "page_locked", &copies.staged_from_device),
        ("to_device", "request_body", &copies.body_to_device),
        ("to_device", "pageable", &copies.pageable_to_device),
        ("from_device", "pageable", &copies.pageable_from_device),
    ];
    for (direction, memory, counter) in bytes {
        metrics
            .device_copy_bytes
            .with_label_values(&[gpu, direction, memory])
            .inc_by(CopyCounts::get(counter));
    }
    let fallbacks = metrics.staging_fallbacks.with_label_values(&[gpu]);
    fallbacks.inc_by(CopyCounts::get(&copies.staging_fallbacks));
}

/// Exports `dev`'s cache of copies kept between jobs (its bytes by kind, and its lookups
/// as increments of the totals it keeps).
pub(crate) fn export_device_cache(metrics: &Metrics, dev: &GpuDevice) {
    let gpu = dev.info.ordinal.to_string();
    dev.with_cache_counts(|kind, counts| {
        let labels = [gpu.as_str(), kind.name()];
        metrics
            .device_cache_bytes
            .with_label_values(&labels)
            .set(counts.bytes as i64);
        let results = [
            ("hit", counts.hits),
            ("miss", counts.misses),
            ("evicted", counts.evictions),
        ];
        for (result, total) in results {
            let counter = metrics
                .device_cache_lookups
                .with_label_values(&[labels[0], labels[1], result]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    });
}

impl Shared {
    /// Runs the job on `dev` on a blocking thread, on a lease of its own (a stream and a
    /// share of the device's memory, beside other jobs'); returns the seconds from the
    /// hand-off to the blocking thread to the job's end, less only a wait for another
    /// job's lease (that wait is the backlog's, not the job's). A placement sample then
    /// covers what a caller waits for on this path (the hop, the lease, the staging), as
    /// the CPU side's covers its pool's hop. It is dropped (`Abandoned`) if its deadline
    /// passes or its caller leaves while it waits for the device or between its passes.
    pub(super) async fn run_device(
        &self,
        q: &mut Queued,
        dev: &Arc<GpuDevice>,
    ) -> Result<f64, DeviceError> {
        let abandoned = Arc::new(AtomicBool::new(false));
        let stop = Stop {
            deadline: q.deadline,
            abandoned: abandoned.clone(),
        };
        let (job, d, metrics) = (q.job.clone(), dev.clone(), self.metrics.clone());
        let handed_off = Instant::now();
        let run = tokio::task::spawn_blocking(move || {
            let label = d.info.ordinal.to_string();
            let running = metrics.device_jobs_running.with_label_values(&[&label]);
            let wanted = job
                .input_bytes()
                .saturating_mul(DEVICE_BYTES_PER_INPUT_BYTE);
            let asked = Instant::now();
            let lease = d.lease_for(Some(stop), wanted);
            let waited_for = match &lease {
                Ok(l) if l.waited() => asked.elapsed(),
                _ => Duration::ZERO,
            };
            running.set(d.jobs_running() as i64);
            let mut lease = lease?;
            lease.set_handle(d.clone());
            // Exported from the device's first job on, at 0 until a job waits.
            let waits = metrics.device_lease_waits.with_label_values(&[&label]);
            if lease.waited() {
                waits.inc();
            }
            let outcome = job.run_device(&lease);
            count_copies(&metrics, &label, lease.copies());
            drop(lease);
            export_device_cache(&metrics, &d);
            metrics.staging_bytes.set(d.staging_bytes() as i64);
            running.set(d.jobs_running() as i64);
            outcome?;
            Ok(waited_for)
        });
        tokio::pin!(run);
        let joined = tokio::select! {
            r = &mut run => r,
            _ = q.reply.closed() => {
                abandoned.store(true, Ordering::Relaxed);
                run.await
            }
        };
        let waited_for = joined
            .unwrap_or_else(|e| Err(DeviceError::fatal(format!("device job panicked: {e}"))))?;
        Ok(handed_off
            .elapsed()
            .saturating_sub(waited_for)
            .as_secs_f64())
    }

    /// Whether this device job is one of the `--verify-fraction` shadow-checked: the
    /// k-th job is when ⌊k·f⌋ steps up, so checks are evenly spaced (every job at 1).
    pub(super) fn shadow_due(&self) -> bool {
        let f = self.config.verify_fraction;
        let k = self.device_jobs.fetch_add(1, Ordering::Relaxed) as f64;
        ((k + 1.0) * f).floor() > (k * f).floor()
    }

    /// Recomputes `job` on the CPU after its caller has the device's output, and reports
    /// the comparison (`Backends::shadow_checked`: counted, a mismatch quarantines).
    pub(super) fn shadow_check(&self, job: Arc<dyn Runnable>, dev: Arc<GpuDevice>) {
        let op = job.name();
        let lane = job.placement_lane();
        let (size, bytes) = (job.size(), job.input_bytes());
        let Some(check) = job.shadow() else {
            return;
        };
        let (cpu, backends) = (self.backends.cpu.clone(), self.backends.clone());
        let placement = self.placement.clone();
        tokio::spawn(async move {
            let outcome = match cpu.run(check).await {
                Ok((outcome, seconds)) => {
                    let shape = Shape {
                        op,
                        lane: &lane,
                        size,
                        bytes,
                    };
                    placement.observed(shape, Side::Cpu, seconds);
                    outcome
                }
                Err(p) => Err(format!("the CPU twin panicked: {p}")),
            };
            backends.shadow_checked(&dev, op, outcome);
        });
    }
}
