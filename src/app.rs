//! The service assembled: stores, executors, the pool and the API's state, and serving
//! them with a graceful shutdown. Behind the `openapi` feature with the API itself.

use crate::api::{self, AppState};
use crate::backend::{self, BackendChoice, Backends, CpuExecutor};
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::pool::{Pool, PoolConfig};
use crate::serve;
use crate::store::{self, Store};
use crate::{arrays, datasets, ops, pool, tables, EMULATED_DEVICE_BYTES};
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// `--emulate-device`: one emulated device in place of CUDA discovery.
fn emulated_devices() -> (Vec<Arc<backend::GpuDevice>>, String) {
    let dev = backend::GpuDevice::emulated(0, EMULATED_DEVICE_BYTES);
    (
        vec![Arc::new(dev)],
        "1 emulated device (--emulate-device): our kernels compiled for the host, for testing; not a GPU".into(),
    )
}

pub struct App {
    pub state: Arc<AppState>,
    discovered: watch::Receiver<bool>,
}

impl App {
    /// Builds the executors and the pool, and starts device discovery and kernel
    /// compilation in the background (`/health/ready` is 503 until they finish).
    /// Must be called inside a Tokio runtime.
    pub fn start(settings: Settings) -> Result<Self, String> {
        let cfg = &settings.config;
        // Checked first, whatever the backend: a misspelt op is a start-up error.
        let wgsl_library = ops::wgsl_library().select(&cfg.wgpu_ops)?;
        let metrics = Arc::new(Metrics::new());
        let database = store::DatabaseUrl::parse(&cfg.database_url, cfg.database_max_connections)?;
        let mut store = Store::open_with(&cfg.data_dir, &database)?;
        // Datasets are shared when both their catalog and their files can be.
        if store.is_shared() && !cfg.artifact_store.is_empty() {
            store = store.with_catalog_in_shared_database();
        }
        let store = Arc::new(store);
        tracing::info!(
            database = %database.redacted(),
            datasets_shared = store.is_catalog_shared(),
            "store opened"
        );
        if cfg.dp_allow_client_seed {
            tracing::warn!("--dp-allow-client-seed is on: clients can make privacy noise and Shamir coefficients predictable; never in production");
        }
        let backends = Arc::new(Backends::new(
            cfg.backend,
            CpuExecutor::new(settings.cpu_threads)?,
            metrics.clone(),
        ));
        let artifacts = (!cfg.artifact_store.is_empty())
            .then(|| {
                datasets::artifacts::ObjectArtifacts::open(
                    &cfg.artifact_store,
                    tokio::runtime::Handle::current(),
                )
            })
            .transpose()
            .map_err(|e| e.to_string())?
            .map(Arc::new);
        if let Some(a) = &artifacts {
            tracing::info!(
                location = a.location(),
                "finished dataset files kept in object storage"
            );
        }
        let datasets = datasets::Datasets::start(
            store.clone(),
            metrics.clone(),
            &cfg.data_dir,
            datasets::WorkerSettings {
                threads: settings.cpu_threads,
                caps: crate::store::QueueCaps {
                    queued: cfg.max_dataset_jobs,
                    tenant_queued: cfg.max_tenant_queued_datasets,
                    tenant_work: cfg.max_tenant_dataset_work,
                },
                lease: cfg.dataset_lease,
                memory_budget: cfg.dataset_memory_mib << 20,
            },
            backends.clone(),
            artifacts.clone(),
        )
        .map_err(|e| e.to_string())?;
        let placement = Arc::new(pool::Placement::new(pool::PlacementConfig {
            mode: cfg.placement,
            explore_every: cfg.placement_explore_every,
            cpu_slots: settings.cpu_threads,
        }));
        let pool = Arc::new(Pool::start(
            PoolConfig {
                capacity: cfg.queue_capacity,
                workers: settings.cpu_threads,
                fallback: cfg.fallback,
                default_timeout: cfg.job_timeout,
                verify_fraction: cfg.verify_fraction,
                inline_small_jobs: cfg.cpu_inline_small_jobs,
                batch: pool::BatchConfig {
                    mode: cfg.batching,
                    max_delay: cfg.batch_max_delay,
                    max_elements: cfg.batch_max_elements,
                },
            },
            metrics.clone(),
            backends.clone(),
            placement.clone(),
        ));
        let (done_tx, discovered) = watch::channel(false);
        if cfg.backend == BackendChoice::Cpu {
            backends.set_hip(backend::hip::not_probed("--backend cpu"));
            backends.set_gpus(Vec::new(), "CUDA not used: --backend cpu".into());
            done_tx.send_replace(true);
        } else {
            let (b, m) = (backends.clone(), metrics.clone());
            let (selection, cache) = (cfg.devices.clone(), cfg.data_dir.join("kernel-cache"));
            let interval = cfg.device_sample_interval;
            let memory_limit = cfg.gpu_memory_limit_mib << 20;
            let jobs_per_device = cfg.gpu_jobs_per_device;
            let staging = backend::device::StagingBudget::new(
                cfg.gpu_staging_mib.saturating_mul(1 << 20) as usize,
            );
            let table_cache = cfg.gpu_table_cache_mib << 20;
            let vendor_libraries = !cfg.no_cuda_libraries;
            let (emulate, backoff) = (cfg.emulate_device, cfg.device_reprobe_backoff);
            let software_adapters = cfg.wgpu_software_adapters;
            let calibration_budget = cfg.placement_calibration_budget;
            tokio::task::spawn_blocking(move || {
                let library = ops::kernel_library();
                let hip_compiler = backend::hip::discover::Compiler::for_this_binary(cache.clone());
                let (gpus, reason) = if emulate {
                    tracing::warn!(
                        "--emulate-device: GPU work runs on the emulated device, for testing only"
                    );
                    emulated_devices()
                } else {
                    let (cuda, why) = backend::cuda::discover_guarded(&selection, &cache, &library);
                    if cuda.is_empty() {
                        // No usable CUDA device: AMD's, where the HIP runtime has some.
                        let (amd, hip_why) = match &hip_compiler {
                            Ok(c) => {
                                backend::hip::discover::discover_guarded(&selection, &library, c)
                            }
                            Err(e) => (Vec::new(), format!("AMD GPUs are not used: {e}")),
                        };
                        if amd.is_empty() {
                            // Neither: any GPU wgpu reaches (Metal, Vulkan, DX12).
                            let (adapters, wgpu_why) = backend::wgpu::discover(
                                &selection,
                                software_adapters,
                                &wgsl_library,
                            );
                            (adapters, format!("{why}; {hip_why}; {wgpu_why}"))
                        } else {
                            (amd, format!("{why}; {hip_why}"))
                        }
                    } else {
                        (cuda, why)
                    }
                };
                let on = |kind| gpus.iter().any(|g| g.backend_kind() == kind);
                let amd = on(backend::BackendKind::Hip);
                let wgpu = on(backend::BackendKind::Wgpu);
                let tests = Arc::new(ops::self_tests());
                for g in &gpus {
                    g.set_memory_limit(memory_limit);
                    g.set_jobs_per_device(jobs_per_device);
                    g.share_staging(staging.clone());
                    g.set_vendor_libraries_allowed(vendor_libraries);
                    if table_cache > 0 {
                        g.set_table_cache_limit(table_cache as usize);
                    }
                    // Before the device serves anything: readiness waits for set_gpus.
                    b.self_test(g, &tests);
                }
                b.set_probe(backend::Probe {
                    reopen: if emulate {
                        backend::reopen_emulated()
                    } else if wgpu {
                        backend::wgpu::reopen(software_adapters, wgsl_library)
                    } else if let (true, Ok(compiler)) = (amd, hip_compiler) {
                        backend::reopen_hip(compiler, library)
                    } else {
                        backend::reopen_cuda(cache, library)
                    },
                    tests,
                    backoff,
                });
                tracing::info!(devices = gpus.len(), reason = %reason, "device discovery finished");
                if amd {
                    let watched = gpus
                        .iter()
                        .map(|g| backend::hip::smi::Watched {
                            ordinal: g.info.ordinal,
                            uuid: g.info.uuid.clone(),
                            pci_bus_id: g.info.uuid.trim_start_matches("HIP-").to_string(),
                        })
                        .collect();
                    if let Err(why) = backend::hip::smi::spawn_sampler(m.clone(), interval, watched)
                    {
                        tracing::warn!(reason = %why, "AMD GPU gauges will not be exported");
                    }
                }
                if !gpus.is_empty() && !emulate && !amd && !wgpu {
                    if let Err(why) = backend::spawn_nvml_sampler(m, interval) {
                        tracing::warn!(reason = %why, "GPU gauges will not be exported");
                    }
                }
                b.set_hip(if emulate {
                    backend::hip::not_probed("--emulate-device")
                } else {
                    backend::hip::status(std::time::Duration::from_secs(10))
                });
                for g in gpus.iter().filter(|g| g.on_host_cores()) {
                    placement.set_shares_host(g.info.ordinal, true);
                }
                b.set_gpus(gpus.clone(), reason);
                done_tx.send_replace(true);
                // Ready: calibration runs beside the first requests, never before them.
                if !calibration_budget.is_zero() && !gpus.is_empty() {
                    let mut cases = ops::self_tests();
                    cases.extend(ops::check_cases(backend::measure::CheckLevel::Quick));
                    // A device `auto` keeps off (a software adapter) needs no calibration.
                    for g in gpus.iter().filter(|g| g.is_healthy() && g.auto_placement()) {
                        pool::placement::calibrate::calibrate(
                            &placement,
                            g,
                            &cases,
                            calibration_budget,
                        );
                    }
                }
            });
        }
        let array_limits = arrays::ArrayLimits {
            tenant_bytes: cfg.max_tenant_array_mib << 20,
            tenant_count: cfg.max_tenant_arrays,
            server_bytes: cfg.max_arrays_mib << 20,
            server_count: cfg.max_arrays,
            read_back_wait: cfg.job_timeout,
            tables: arrays::TableLimits {
                tenant_bytes: cfg.max_tenant_embedding_mib << 20,
                tenant_count: cfg.max_tenant_embedding_tables,
                server_bytes: cfg.max_embedding_tables_mib << 20,
            },
        };
        let array_metrics = arrays::ArrayMetrics {
            bytes: metrics.array_bytes.clone(),
            count: metrics.arrays.clone(),
            refused: metrics.arrays_refused.clone(),
            expired: metrics.arrays_expired.clone(),
            uses: metrics.array_uses.clone(),
            reads_back: metrics.array_reads_back.clone(),
        };
        let array_dir = cfg.data_dir.join("arrays");
        // Arrays are shared by replicas exactly when datasets are: their catalog in the
        // shared database, their values in the artifact store.
        let arrays = Arc::new(match artifacts.filter(|_| store.arrays_shared()) {
            Some(objects) => arrays::Arrays::open_shared(
                array_dir,
                array_limits,
                array_metrics,
                arrays::Shared {
                    store: store.clone(),
                    objects,
                },
            ),
            None => arrays::Arrays::open(array_dir, array_limits, array_metrics)?,
        });
        tracing::info!(shared = store.arrays_shared(), "resident arrays opened");
        // Embedding tables kept before they were arrays become arrays once.
        let imported = tables::import_legacy(&cfg.data_dir.join("embedding-tables"), &arrays);
        if imported.tables > 0 {
            tracing::info!(
                tables = imported.tables,
                "embedding tables imported as resident arrays"
            );
        }
        // A deleted or expired array's device copies go with it.
        let (devices, m) = (Arc::downgrade(&backends), metrics.clone());
        arrays.on_removed(move |id| {
            if let Some(backends) = devices.upgrade() {
                for g in backends.gpus() {
                    g.forget_table(&crate::arrays::device_key(id));
                    pool::export_device_cache(&m, g);
                }
            }
        });
        // Expiry is exact without the sweep (an expired array is refused at once); the
        // sweep frees its memory and files within a few seconds of its deadline.
        arrays::spawn_expiry(&arrays, std::time::Duration::from_secs(5));
        store::spawn_round_expiry(
            &store,
            cfg.secagg_round_ttl,
            metrics.secagg_rounds_expired.clone(),
        );
        let state = Arc::new(AppState::new(
            settings, metrics, pool, backends, store, datasets, arrays,
        ));
        Ok(Self { state, discovered })
    }

    /// Waits for device discovery to finish.
    pub async fn discovery_finished(&self) {
        let _ = self.discovered.clone().wait_for(|d| *d).await;
    }

    pub fn router(&self) -> axum::Router {
        api::router(self.state.clone())
    }

    /// Serves until `shutdown` resolves, then stops accepting connections, lets
    /// in-flight requests and queued jobs finish within `--shutdown-grace`, and returns.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let router = self.router();
        self.serve_router(listener, router, shutdown).await
    }

    /// As `serve`, with a router the caller built from `api::routes` (tests).
    pub async fn serve_router(
        self,
        listener: TcpListener,
        router: axum::Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let state = self.state.clone();
        let grace = state.settings.config.shutdown_grace;
        let (stopping_tx, mut stopping) = watch::channel(false);
        let signalled = {
            let state = state.clone();
            async move {
                shutdown.await;
                tracing::info!(grace = ?grace, "shutdown requested: no new connections, draining");
                state.begin_shutdown();
                stopping_tx.send_replace(true);
            }
        };
        let limits = serve::ConnectionLimits {
            header_read_timeout: state.settings.config.header_read_timeout,
            max_connections: state.settings.config.max_connections,
        };
        let server = serve::serve(listener, router, limits, state.metrics.clone(), signalled);
        let deadline = async {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = server => {},
            _ = deadline => tracing::warn!("shutdown grace period over with requests still open"),
        }
        state.pool.close();
        // Jobs whose clients are gone still hold workers; give them what is left of the grace.
        if tokio::time::timeout(grace, state.pool.drain())
            .await
            .is_err()
        {
            tracing::warn!("jobs still running at exit");
        }
        // The dataset job stops at its next batch and records how it ended (interrupted,
        // or handed back to a shared queue); leaving before that would leave it to its
        // lease.
        let until = tokio::time::Instant::now() + grace;
        while state.datasets.is_running_a_job() {
            if tokio::time::Instant::now() >= until {
                tracing::warn!("the dataset job had not stopped at exit");
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}
