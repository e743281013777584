//! Why a dataset job's files could not be written, and why the worker or a job failed.
//! Every message names the file, object or job and ends with its cause: they reach the
//! log, the catalog's `error` column and API problems as text, not as an error chain.

use super::artifacts::ArtifactError;
use super::{gib, DISK_RESERVE_BYTES, MAX_ATTEMPTS_PER_SAMPLE};
use crate::store::StoreError;
use parquet::errors::ParquetError;
use std::path::PathBuf;

/// A job's local files (`iq_out`'s recordings, `parquet_out`'s parts and file, the
/// checkpoint) could not be written, or do not match the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: parquet: {source}", path.display())]
    Parquet {
        path: PathBuf,
        #[source]
        source: ParquetError,
    },
    #[error("schema: {0}")]
    Schema(#[source] ParquetError),
    /// A partial file the checkpoint says is longer.
    #[error("{}: {have} bytes, the checkpoint needs {keep}", path.display())]
    ShorterThanCheckpoint { path: PathBuf, have: u64, keep: u64 },
    #[error("checkpoint names part {0}, which is missing")]
    MissingPart(usize),
    #[error("a recording of {got} samples where {want} were expected")]
    RecordingLength { got: usize, want: usize },
    /// The buffers and the Parquet schema disagree (a bug).
    #[error("{0}")]
    Columns(&'static str),
}

impl OutputError {
    /// `map_err(OutputError::io(&path))`.
    pub(super) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Why the dataset worker could not start, a job failed (the text recorded as its
/// `error`), or a submission could not be checked against the disk or the catalog.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Catalog(#[from] StoreError),
    #[error(transparent)]
    Generator(#[from] super::GeneratorMismatch),
    /// A directory or scratch file of the worker's.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{id}: stored config: {source}")]
    StoredConfig {
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{id}: published checkpoint: {source}")]
    PublishedCheckpoint {
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{id}: the published checkpoint names {name}, which is missing")]
    Unpublished { id: String, name: String },
    #[error("{id}: {name} rebuilt to {len} bytes, the checkpoint says {end}")]
    Rebuilt {
        id: String,
        name: &'static str,
        len: u64,
        end: u64,
    },
    /// Only a sealed part makes a checkpoint (a bug).
    #[error("a checkpoint without a part")]
    CheckpointWithoutPart,
    #[error("the disk under --data-dir has only {} free (the reserve is {}); the job stopped before filling it", gib(*.free), gib(DISK_RESERVE_BYTES))]
    DiskFull { free: u64 },
    #[error("only {valid} of {attempted} attempted samples passed the quality filters; at most {MAX_ATTEMPTS_PER_SAMPLE} attempts per requested sample are made (relax config.quality)")]
    TooManyRejected { valid: u64, attempted: u64 },
    #[error("one sample of this job holds up to {sample_mib} MiB in memory and --dataset-memory-mib is {budget_mib} on this replica")]
    SampleOverMemory { sample_mib: u64, budget_mib: u64 },
    #[error("dataset thread pool: {0}")]
    Pool(#[source] rayon::ThreadPoolBuildError),
    #[error("dataset worker: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("no OS entropy: {0}")]
    Entropy(#[source] getrandom::Error),
}

impl DatasetError {
    /// `map_err(DatasetError::io(&path))`.
    pub(super) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
