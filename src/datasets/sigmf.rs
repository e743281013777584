//! One synthetic recording (a dataset's `iq_raw` sample, or `POST /rf/iq`'s) as SigMF 1.2:
//! the `.sigmf-meta` JSON (core fields, the receiver's position as `core:geolocation`, and
//! the sample's truth under the `gpu_ops` extension namespace) and the `cf32_le` data, or both in a `.sigmf` archive (a tar holding
//! `<stem>/<stem>.sigmf-meta` and `<stem>/<stem>.sigmf-data`, as the spec lays it out).

use crate::ops::rf::scenario::Scenario;
use serde_json::{json, Value};
use sha2::{Digest, Sha512};

pub const SIGMF_VERSION: &str = "1.2.0";

/// Where a recording comes from.
#[derive(Clone, Copy)]
pub enum Origin<'a> {
    /// Row `sample` of a stored dataset (`GET /datasets/{id}/iq/{sample}/{receiver}`).
    Dataset { dataset_id: &'a str, sample: u64 },
    /// Generated alone from its seed and scenario (`POST /rf/iq`).
    Generated,
}

/// Which recording this is.
pub struct RecordingId<'a> {
    pub origin: Origin<'a>,
    pub seed: u64,
    /// The generator's index of the sample (`truth.sample_index`).
    pub sample_index: u64,
    pub receiver: u32,
}

impl RecordingId<'_> {
    /// File name stem shared by the meta, data and archive files.
    pub fn stem(&self) -> String {
        match self.origin {
            Origin::Dataset { dataset_id, sample } => {
                format!("{dataset_id}_sample{sample}_rx{}", self.receiver)
            }
            Origin::Generated => format!(
                "seed{}_index{}_rx{}",
                self.seed, self.sample_index, self.receiver
            ),
        }
    }

    /// `core:description`'s opening: which sample this is.
    fn describe(&self) -> String {
        match self.origin {
            Origin::Dataset { dataset_id, sample } => format!(
                "dataset {dataset_id}, sample {sample} (generator index {})",
                self.sample_index
            ),
            Origin::Generated => {
                format!("seed {}, generator index {}", self.seed, self.sample_index)
            }
        }
    }
}

/// The metadata document for receiver `id.receiver` of a sample whose stored truth is
/// `truth` (`iq_out`), describing `data`.
pub fn meta(id: &RecordingId, s: &Scenario, truth: &Value, data: &[u8]) -> Value {
    let rx = &truth["receivers"][id.receiver as usize];
    let count = data.len() / 8;
    let sha512: String = Sha512::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let modulation = truth["tx"]["modulation"].as_str().unwrap_or("unknown");
    let mut doc = json!({
        "global": {
            "core:datatype": "cf32_le",
            "core:sample_rate": s.signal.sample_rate_hz,
            "core:version": SIGMF_VERSION,
            "core:num_channels": 1,
            "core:sha512": sha512,
            "core:recorder": concat!("gpu-ops ", env!("CARGO_PKG_VERSION"), " (synthetic)"),
            "core:description": format!(
                "Synthetic recording: {}, receiver {} of {}",
                id.describe(),
                id.receiver,
                truth["receivers"].as_array().map_or(0, Vec::len),
            ),
            "core:geolocation": {
                "type": "Point",
                "coordinates": [rx["lon"], rx["lat"], rx["alt_m"]],
            },
            "core:extensions": [
                {"name": "gpu_ops", "version": "1.0.0", "optional": true}
            ],
            "gpu_ops:seed": id.seed,
            "gpu_ops:sample_index": id.sample_index,
            "gpu_ops:receiver": id.receiver,
            "gpu_ops:transmitter": truth["tx"],
            "gpu_ops:receiver_truth": rx,
        },
        "captures": [{
            "core:sample_start": 0,
            "core:frequency": s.propagation.frequency_mhz * 1e6,
        }],
        "annotations": [{
            "core:sample_start": 0,
            "core:sample_count": count,
            "core:label": modulation,
            "core:comment": "the transmitter, heard for the whole recording",
        }],
    });
    let global = &mut doc["global"];
    if let Origin::Dataset { dataset_id, sample } = id.origin {
        global["gpu_ops:dataset_id"] = json!(dataset_id);
        global["gpu_ops:sample"] = json!(sample);
    }
    // A dataset's sample was judged (receivers detected, SNR, GDOP); one generated
    // alone was not.
    if !truth["quality"].is_null() {
        global["gpu_ops:quality"] = truth["quality"].clone();
    }
    doc
}

/// `samples` as SigMF's `cf32_le` (interleaved little-endian f32 I/Q) in `out`, which is
/// cleared first (a caller reuses one buffer across recordings).
pub fn cf32_le_into(samples: &[rustfft::num_complex::Complex32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(8 * samples.len());
    for c in samples {
        out.extend_from_slice(&c.re.to_le_bytes());
        out.extend_from_slice(&c.im.to_le_bytes());
    }
}

/// A `.sigmf` archive of one recording.
pub fn archive(stem: &str, meta: &[u8], data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::with_capacity(data.len() + meta.len() + 4096));
    let mut dir = tar::Header::new_ustar();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    tar.append_data(&mut dir, format!("{stem}/"), std::io::empty())?;
    for (ext, bytes) in [("sigmf-meta", meta), ("sigmf-data", data)] {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(bytes.len() as u64);
        tar.append_data(&mut h, format!("{stem}/{stem}.{ext}"), bytes)?;
    }
    tar.into_inner()
}
