//! The `iq_raw` dataset's recordings. Every accepted sample's receivers go back to back
//! into `iq.cf32` as interleaved little-endian f32 I/Q (SigMF `cf32_le`), its truth as
//! one JSON document into `iq.meta`, and a fixed-size record into `iq.index`, so serving
//! one recording takes two positioned reads. The three files are written as `.partial`
//! and renamed into place when the job completes; the catalog marks a job completed only
//! after that, so a reader never sees half a dataset.

use super::artifacts::{ArtifactError, ReadAt};
use super::OutputError;
use crate::ops::rf::dataset::SampleRecord;
use rustfft::num_complex::Complex32;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

const FILES: [&str; 3] = ["iq.cf32", "iq.meta", "iq.index"];
/// data offset u64 ‖ meta offset u64 ‖ meta length u32 ‖ receivers u32, little-endian.
const INDEX_RECORD: u64 = 24;

/// How far the three files were written at a checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct IqLengths {
    pub data: u64,
    pub meta: u64,
    pub samples: u64,
}

/// Where sample k's recordings and truth lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IqEntry {
    pub data_offset: u64,
    pub meta_offset: u64,
    pub meta_len: u32,
    pub receivers: u32,
}

/// The truth stored per sample (and served in its SigMF metadata).
#[derive(Serialize)]
struct SampleTruth<'a> {
    sample_index: u64,
    tx: &'a crate::ops::rf::generate::TxTruth,
    receivers: &'a [crate::ops::rf::generate::RxTruth],
    quality: &'a crate::ops::rf::dataset::Quality,
}

pub struct IqWriter {
    dir: PathBuf,
    data: BufWriter<File>,
    meta: BufWriter<File>,
    index: BufWriter<File>,
    data_offset: u64,
    meta_offset: u64,
    samples: u64,
    /// Complex samples per recording; every recording has exactly this many.
    len: usize,
}

fn partial(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.partial"))
}

impl IqWriter {
    /// Opens the partial files cut back to `at` (all zero for a new job; a resumed job
    /// passes its checkpoint's), appending from there.
    pub fn open(dir: &Path, len: usize, at: IqLengths) -> Result<Self, OutputError> {
        let open = |name: &str, keep: u64| {
            let p = partial(dir, name);
            // Renamed by a finish whose completion the catalog never recorded (a crash
            // in between): take the file back.
            if keep > 0 && !p.exists() && dir.join(name).exists() {
                std::fs::rename(dir.join(name), &p).map_err(OutputError::io(&p))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(keep == 0)
                .open(&p)
                .map_err(OutputError::io(&p))?;
            let have = f.metadata().map_err(OutputError::io(&p))?.len();
            if have < keep {
                return Err(OutputError::ShorterThanCheckpoint {
                    path: p,
                    have,
                    keep,
                });
            }
            f.set_len(keep).map_err(OutputError::io(&p))?;
            let mut f = f;
            std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).map_err(OutputError::io(&p))?;
            Ok::<_, OutputError>(BufWriter::with_capacity(1 << 20, f))
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            data: open(FILES[0], at.data)?,
            meta: open(FILES[1], at.meta)?,
            index: open(FILES[2], at.samples * INDEX_RECORD)?,
            data_offset: at.data,
            meta_offset: at.meta,
            samples: at.samples,
            len,
        })
    }

    /// Flushes and syncs the three files; returns how far they reach.
    pub fn checkpoint(&mut self) -> Result<IqLengths, OutputError> {
        for (name, w) in FILES
            .iter()
            .zip([&mut self.data, &mut self.meta, &mut self.index])
        {
            let p = partial(&self.dir, name);
            w.flush().map_err(OutputError::io(&p))?;
            w.get_ref().sync_data().map_err(OutputError::io(&p))?;
        }
        Ok(IqLengths {
            data: self.data_offset,
            meta: self.meta_offset,
            samples: self.samples,
        })
    }

    pub fn push(&mut self, rec: &SampleRecord, iq: &[Vec<Complex32>]) -> Result<(), OutputError> {
        let write_err = |name: &str, source| OutputError::Io {
            path: partial(&self.dir, name),
            source,
        };
        let mut bytes = Vec::with_capacity(self.len * 8);
        for x in iq {
            if x.len() != self.len {
                return Err(OutputError::RecordingLength {
                    got: x.len(),
                    want: self.len,
                });
            }
            super::sigmf::cf32_le_into(x, &mut bytes);
            self.data
                .write_all(&bytes)
                .map_err(|e| write_err(FILES[0], e))?;
        }
        let truth = serde_json::to_vec(&SampleTruth {
            sample_index: rec.index,
            tx: &rec.tx,
            receivers: &rec.receivers,
            quality: &rec.quality,
        })
        .map_err(|source| OutputError::Json {
            path: partial(&self.dir, FILES[1]),
            source,
        })?;
        self.meta
            .write_all(&truth)
            .map_err(|e| write_err(FILES[1], e))?;
        let mut record = Vec::with_capacity(INDEX_RECORD as usize);
        record.extend_from_slice(&self.data_offset.to_le_bytes());
        record.extend_from_slice(&self.meta_offset.to_le_bytes());
        record.extend_from_slice(&(truth.len() as u32).to_le_bytes());
        record.extend_from_slice(&(iq.len() as u32).to_le_bytes());
        self.index
            .write_all(&record)
            .map_err(|e| write_err(FILES[2], e))?;
        self.data_offset += (iq.len() * self.len * 8) as u64;
        self.meta_offset += truth.len() as u64;
        self.samples += 1;
        Ok(())
    }

    /// Flushes and syncs the three files and renames them into place.
    pub fn finish(self) -> Result<(), OutputError> {
        let dir = self.dir.clone();
        for (name, w) in FILES.iter().zip([self.data, self.meta, self.index]) {
            let p = partial(&dir, name);
            let file = w
                .into_inner()
                .map_err(|e| e.into_error())
                .map_err(OutputError::io(&p))?;
            file.sync_all().map_err(OutputError::io(&p))?;
        }
        for name in FILES {
            let p = partial(&dir, name);
            std::fs::rename(&p, dir.join(name)).map_err(OutputError::io(&p))?;
        }
        Ok(())
    }
}

/// Sample k's entry, or None past the end.
pub fn entry(files: &dyn ReadAt, k: u64) -> Result<Option<IqEntry>, ArtifactError> {
    if k >= files.len(FILES[2])? / INDEX_RECORD {
        return Ok(None);
    }
    let b = files.read_at(FILES[2], k * INDEX_RECORD, INDEX_RECORD as usize)?;
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    Ok(Some(IqEntry {
        data_offset: u64_at(0),
        meta_offset: u64_at(8),
        meta_len: u32_at(16),
        receivers: u32_at(20),
    }))
}

/// The sample's stored truth JSON.
pub fn truth(files: &dyn ReadAt, e: &IqEntry) -> Result<serde_json::Value, ArtifactError> {
    let b = files.read_at(FILES[1], e.meta_offset, e.meta_len as usize)?;
    serde_json::from_slice(&b).map_err(|source| ArtifactError::Corrupt {
        name: FILES[1],
        source,
    })
}

/// Receiver `rx`'s recording as `cf32_le` bytes (`len` complex samples).
pub fn recording(
    files: &dyn ReadAt,
    e: &IqEntry,
    rx: u32,
    len: usize,
) -> Result<Vec<u8>, ArtifactError> {
    let bytes = len as u64 * 8;
    files.read_at(FILES[0], e.data_offset + rx as u64 * bytes, bytes as usize)
}

/// The finished files, as they are published to an artifact store.
pub fn published_files() -> [&'static str; 3] {
    FILES
}

/// What each file grew by between two checkpoints: (finished name, partial file name,
/// from, to) in bytes.
pub fn grown(from: IqLengths, to: IqLengths) -> [(&'static str, String, u64, u64); 3] {
    let ends = |l: IqLengths| [l.data, l.meta, l.samples * INDEX_RECORD];
    let (a, b) = (ends(from), ends(to));
    [0, 1, 2].map(|i| (FILES[i], format!("{}.partial", FILES[i]), a[i], b[i]))
}

/// Bytes one sample takes on disk at most: its recordings, truth and index record.
pub fn bytes_per_sample(receivers: usize, len: usize) -> u64 {
    (receivers * len * 8) as u64 + 512 * (receivers as u64 + 1) + INDEX_RECORD
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasets::artifacts::LocalFiles;
    use crate::ops::rf::dataset::sample;
    use crate::ops::rf::rng::dataset_key;
    use crate::ops::rf::scenario::Scenario;

    #[test]
    fn recordings_and_truth_read_back_as_written() {
        let mut s = Scenario::default();
        s.signal.duration_ms = 20.0;
        s.chunk_ms = 10.0;
        s.quality.min_receivers = 0;
        s.quality.min_snr_db = -1e9;
        s.quality.max_gdop = f64::INFINITY;
        let dir = std::env::temp_dir().join(format!("gpu-ops-iq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let len = crate::ops::rf::generate::samples_per_recording(&s);
        let mut w = IqWriter::open(&dir, len, IqLengths::default()).unwrap();
        let recs: Vec<_> = (0..3)
            .map(|n| sample(&s, dataset_key(4), n, true).0)
            .collect();
        w.push(&recs[0], recs[0].iq.as_ref().unwrap()).unwrap();
        let at = w.checkpoint().unwrap();
        w.push(&recs[1], recs[1].iq.as_ref().unwrap()).unwrap();
        w.checkpoint().unwrap();
        drop(w);
        // A resumed writer cuts sample 1 back off and writes it again.
        let mut w = IqWriter::open(&dir, len, at).unwrap();
        for r in &recs[1..] {
            w.push(r, r.iq.as_ref().unwrap()).unwrap();
        }
        assert!(!dir.join("iq.index").exists(), "renamed before finish");
        w.finish().unwrap();
        for (k, r) in recs.iter().enumerate() {
            let e = entry(&LocalFiles(&dir), k as u64).unwrap().unwrap();
            assert_eq!(e.receivers as usize, r.receivers.len());
            let t = truth(&LocalFiles(&dir), &e).unwrap();
            assert_eq!(t["sample_index"], r.index);
            assert_eq!(t["tx"]["lat"], r.tx.lat);
            let last = e.receivers - 1;
            let b = recording(&LocalFiles(&dir), &e, last, len).unwrap();
            let x = &r.iq.as_ref().unwrap()[last as usize];
            assert_eq!(f32::from_le_bytes(b[8..12].try_into().unwrap()), x[1].re);
            assert_eq!(
                f32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()),
                x[len - 1].im
            );
        }
        assert_eq!(entry(&LocalFiles(&dir), 3).unwrap(), None);
        // A crash after finish but before the catalog said completed: resuming takes the
        // renamed files back and cuts them to the checkpoint.
        let w = IqWriter::open(&dir, len, at).unwrap();
        assert_eq!(w.samples, 1);
        drop(w);
        assert!(!dir.join("iq.index").exists());
        assert_eq!(
            std::fs::metadata(partial(&dir, "iq.index")).unwrap().len(),
            INDEX_RECORD
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
