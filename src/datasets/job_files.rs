//! A running job's local files: the features' Parquet parts, the recordings of an
//! `iq_raw` job, and the checkpoint saved (and published, with an object store) whenever a
//! part is sealed.

use super::checkpoint::Checkpoint;
use super::iq_out::IqWriter;
use super::parquet_out::{self, FeatureWriter};
use super::published::Published;
use super::{DatasetError, OutputError};
use crate::ops::rf::dataset::{Rejection, SampleRecord};
use crate::ops::rf::generate::{samples_per_recording, GENERATOR_VERSION};
use crate::ops::rf::scenario::Scenario;
use crate::store::{Counts, DatasetRow};
use std::path::{Path, PathBuf};

/// A running job's files: the features' Parquet parts, the recordings for `iq_raw`, and
/// the checkpoint written whenever a part is sealed.
pub(super) struct JobFiles {
    pub(super) dir: PathBuf,
    pub(super) features: FeatureWriter,
    pub(super) recordings: Option<IqWriter>,
    /// Where each checkpoint is published, with an object store.
    pub(super) published: Option<Published>,
}

impl JobFiles {
    /// Opens the job's files, cut back to the checkpoint `at` (the default for a new job).
    pub(super) fn open(
        dir: PathBuf,
        result: &Path,
        scenario: &Scenario,
        row: &DatasetRow,
        keep_iq: bool,
        at: &Checkpoint,
    ) -> Result<Self, OutputError> {
        let features = FeatureWriter::open(
            result,
            scenario.receiver_slots(),
            parquet_out::rows_per_part(row.num_samples),
            at.parts,
        )?;
        let recordings = keep_iq
            .then(|| {
                IqWriter::open(
                    &dir,
                    samples_per_recording(scenario),
                    at.iq.unwrap_or_default(),
                )
            })
            .transpose()?;
        Ok(Self {
            dir,
            features,
            recordings,
            published: None,
        })
    }

    /// Counts `rec` and, when it passed the filters, writes it; returns its outcome
    /// for the samples metric.
    pub(super) fn accept(
        &mut self,
        rec: &SampleRecord,
        counts: &mut Counts,
    ) -> Result<&'static str, DatasetError> {
        counts.attempted += 1;
        let outcome = match rec.rejected {
            None => "accepted",
            Some(Rejection::TooFewReceivers) => {
                counts.rejected_too_few_receivers += 1;
                return Ok("too_few_receivers");
            }
            Some(Rejection::LowSnr) => {
                counts.rejected_low_snr += 1;
                return Ok("low_snr");
            }
            Some(Rejection::HighGdop) => {
                counts.rejected_high_gdop += 1;
                return Ok("high_gdop");
            }
        };
        let sealed = self.features.push(rec)?;
        if let (Some(w), Some(iq)) = (self.recordings.as_mut(), rec.iq.as_ref()) {
            w.push(rec, iq)?;
        }
        counts.valid += 1;
        if sealed {
            let iq = self
                .recordings
                .as_mut()
                .map(IqWriter::checkpoint)
                .transpose()?;
            let checkpoint = Checkpoint {
                next_index: rec.index + 1,
                counts: counts.clone(),
                parts: self.features.parts(),
                iq,
                generator: GENERATOR_VERSION,
            };
            checkpoint.save(&self.dir)?;
            if let Some(p) = &mut self.published {
                p.checkpoint(&self.dir, &checkpoint)?;
            }
        }
        Ok(outcome)
    }

    pub(super) fn finish(self) -> Result<(), OutputError> {
        if let Some(w) = self.recordings {
            w.finish()?;
        }
        self.features.finish()
    }
}
