//! The CPU executor: a dedicated rayon pool, so compute never blocks the async runtime.

use serde::Serialize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tokio::sync::oneshot;

pub struct CpuExecutor {
    pool: rayon::ThreadPool,
    pub info: CpuInfo,
}

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CpuInfo {
    /// Processor model as the OS reports it.
    pub model: String,
    /// Threads in the compute pool.
    pub threads: usize,
}

/// A job panicked; the panic message is kept for the log.
#[derive(Debug, thiserror::Error)]
#[error("job panicked: {0}")]
pub struct Panicked(pub String);

impl CpuExecutor {
    pub fn new(threads: usize) -> Result<Self, String> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gpu-ops-cpu-{i}"))
            .build()
            .map_err(|e| format!("cannot start {threads} CPU compute threads: {e}"))?;
        Ok(Self {
            pool,
            info: CpuInfo {
                model: cpu_model(),
                threads,
            },
        })
    }

    /// Runs `f` on the pool and waits without blocking the runtime. A panic becomes an error.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, Panicked> {
        let (tx, rx) = oneshot::channel();
        self.pool.spawn(move || {
            let _ =
                tx.send(catch_unwind(AssertUnwindSafe(f)).map_err(|p| Panicked(panic_message(&p))));
        });
        rx.await
            .unwrap_or_else(|_| Err(Panicked("the compute thread died".into())))
    }

    /// Runs `f` inside the pool on the calling thread (benchmarks, tests).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_on_the_pool_and_turns_panics_into_errors() {
        let cpu = CpuExecutor::new(2).unwrap();
        let name = cpu
            .run(|| std::thread::current().name().map(str::to_string))
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("gpu-ops-cpu-"));
        let err = cpu.run(|| -> u32 { panic!("boom") }).await.unwrap_err();
        assert_eq!(err.0, "boom");
        assert_eq!(cpu.run(|| 41 + 1).await.unwrap(), 42);
    }
}
