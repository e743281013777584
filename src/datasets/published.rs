//! A job's files in the object store: its checkpoints as they are sealed (the new part,
//! the recordings since the last, then the checkpoint itself), the latest published
//! checkpoint fetched back on another worker, and the finished files.

use super::artifacts::{ArtifactError, ObjectArtifacts};
use super::checkpoint::{attempt_folder, Checkpoint, CHECKPOINT, SEGMENTS};
use super::iq_out;
use super::parquet_out;
use super::DatasetError;
use std::path::Path;
use std::sync::Arc;

/// A job's checkpoints in the object store (under its claim's folder), and how far its
/// recordings were published.
pub(super) struct Published {
    pub(super) store: Arc<ObjectArtifacts>,
    pub(super) id: String,
    pub(super) folder: String,
    pub(super) iq_at: iq_out::IqLengths,
}

impl Published {
    /// Publishes the checkpoint just saved in `dir`: its new part, the recordings since
    /// the last one, then the checkpoint itself (so a published checkpoint names only
    /// published objects).
    pub(super) fn checkpoint(&mut self, dir: &Path, c: &Checkpoint) -> Result<(), DatasetError> {
        let k = c
            .parts
            .checked_sub(1)
            .ok_or(DatasetError::CheckpointWithoutPart)?;
        let part = parquet_out::part_name(k);
        let folder = &self.folder;
        self.store
            .upload(&self.id, &format!("{folder}/{part}"), &dir.join(&part))?;
        if let Some(iq) = c.iq {
            for (name, partial, from, to) in iq_out::grown(self.iq_at, iq) {
                self.store.upload_range(
                    &self.id,
                    &format!("{folder}/{SEGMENTS}/{name}.{k:06}"),
                    &dir.join(partial),
                    from,
                    to - from,
                )?;
            }
            self.iq_at = iq;
        }
        self.store.upload(
            &self.id,
            &format!("{folder}/{CHECKPOINT}"),
            &dir.join(CHECKPOINT),
        )?;
        Ok(())
    }
}

/// Brings the job's latest published checkpoint (of the claims before `attempt`) into
/// its empty scratch directory `dir`: the checkpoint, its parts, and its recordings
/// rebuilt from their segments; the parts and segments are copied into this claim's
/// folder too, so its own checkpoints are whole. Nothing when none was published.
pub(super) fn fetch_checkpoint(
    store: &ObjectArtifacts,
    id: &str,
    dir: &Path,
    attempt: u64,
) -> Result<(), DatasetError> {
    let fetched = dir.join("checkpoint.json.fetched");
    let mut source = None;
    // Claims follow one another, and a checkpoint is never published without its
    // parts: the latest claim that published one has the furthest.
    for earlier in (1..attempt).rev().take(64) {
        let folder = attempt_folder(earlier);
        if store.download(id, &format!("{folder}/{CHECKPOINT}"), &fetched)? {
            source = Some(folder);
            break;
        }
    }
    let Some(from) = source else {
        return Ok(());
    };
    let to = attempt_folder(attempt);
    let c: Checkpoint =
        serde_json::from_slice(&std::fs::read(&fetched).map_err(DatasetError::io(&fetched))?)
            .map_err(|source| DatasetError::PublishedCheckpoint {
                id: id.into(),
                source,
            })?;
    let missing = |name: &str| DatasetError::Unpublished {
        id: id.into(),
        name: name.into(),
    };
    for k in 0..c.parts {
        let part = parquet_out::part_name(k);
        if !store.download(id, &format!("{from}/{part}"), &dir.join(&part))? {
            return Err(missing(&part));
        }
        store.copy(id, &format!("{from}/{part}"), &format!("{to}/{part}"))?;
    }
    if let Some(iq) = c.iq {
        let segment = dir.join("segment");
        for (name, partial, _, end) in iq_out::grown(iq_out::IqLengths::default(), iq) {
            let partial = dir.join(partial);
            let mut out = std::fs::File::create(&partial).map_err(DatasetError::io(&partial))?;
            for k in 0..c.parts {
                let seg = format!("{SEGMENTS}/{name}.{k:06}");
                if !store.download(id, &format!("{from}/{seg}"), &segment)? {
                    return Err(missing(&seg));
                }
                store.copy(id, &format!("{from}/{seg}"), &format!("{to}/{seg}"))?;
                let mut bytes =
                    std::fs::File::open(&segment).map_err(DatasetError::io(&segment))?;
                std::io::copy(&mut bytes, &mut out).map_err(DatasetError::io(&partial))?;
            }
            let len = out.metadata().map_err(DatasetError::io(&partial))?.len();
            if len != end {
                return Err(DatasetError::Rebuilt {
                    id: id.into(),
                    name,
                    len,
                    end,
                });
            }
        }
        let _ = std::fs::remove_file(segment);
    }
    std::fs::rename(&fetched, dir.join(CHECKPOINT)).map_err(DatasetError::io(&fetched))?;
    tracing::info!(dataset = %id, from = %from, parts = c.parts, valid = c.counts.valid, "fetched the published checkpoint");
    Ok(())
}

/// Uploads a finished job's files: the features, and the recordings of an `iq_raw` job.
pub(super) fn publish(
    store: &ObjectArtifacts,
    id: &str,
    dir: &Path,
    keep_iq: bool,
) -> Result<(), ArtifactError> {
    store.upload(
        id,
        parquet_out::RESULT_FILE,
        &dir.join(parquet_out::RESULT_FILE),
    )?;
    if keep_iq {
        for name in iq_out::published_files() {
            store.upload(id, name, &dir.join(name))?;
        }
    }
    Ok(())
}
