//! The feature-based dataset as Parquet: one row per accepted sample, with the
//! transmitter truth, the sample's quality, and per receiver slot r < max receivers its
//! truth and each feature's mean/std/min/max (`rx{r}_{feature}_{stat}`; null where a
//! sample has fewer receivers). Each row group is first sealed as a complete Parquet file
//! of its own under `features.parts/` (synced, renamed from `.partial`): a job resumes
//! from its last sealed part. On completion the parts' column chunks are spliced, without
//! re-encoding, into `features.parquet.partial`, which is synced and renamed into place,
//! so a reader never sees half a file.

use super::OutputError;
use crate::ops::rf::dataset::SampleRecord;
use crate::ops::rf::generate::GENERATOR_VERSION;
use crate::ops::rf::FEATURE_NAMES;
use parquet::basic::Compression;
use parquet::column::writer::ColumnCloseResult;
use parquet::column::writer::ColumnWriter;
use parquet::data_type::ByteArray;
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The finished features file of a job, in its directory (and its object store key).
pub const RESULT_FILE: &str = "features.parquet";

/// The file's key-value metadata entry naming the generator version that made it.
pub const GENERATOR_VERSION_KEY: &str = "gpu_ops.generator_version";

/// Rows per part (and row group) of a dataset of `num_samples`: small datasets seal parts
/// often, large ones every 4096 rows. Depends on the request only, so the file does too.
pub fn rows_per_part(num_samples: u64) -> usize {
    (num_samples / 16).clamp(64, 4096) as usize
}
const STATS: [&str; 4] = ["mean", "std", "min", "max"];
const RX_TRUTH: [&str; 8] = [
    "lat",
    "lon",
    "alt_m",
    "distance_m",
    "received_power_dbm",
    "carrier_offset_hz",
    "drift_hz_per_s",
    "rms_delay_spread_us",
];

enum Values {
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    Utf8(Vec<ByteArray>),
}

struct Column {
    values: Values,
    /// Definition levels of an OPTIONAL column (1 present, 0 null).
    defs: Option<Vec<i16>>,
}

pub struct FeatureWriter {
    schema: Arc<parquet::schema::types::Type>,
    props: Arc<WriterProperties>,
    columns: Vec<Column>,
    rows: usize,
    rows_per_part: usize,
    receivers: usize,
    parts_dir: PathBuf,
    /// Parts sealed so far.
    parts: usize,
    path: PathBuf,
}

fn part_path(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("part-{k:06}.parquet"))
}

/// The folder of sealed parts, next to the result file in the job's directory.
pub const PARTS_DIR: &str = "features.parts";

/// Part `k`'s path relative to the job's directory (and its object-store name).
pub fn part_name(k: usize) -> String {
    format!("{PARTS_DIR}/part-{k:06}.parquet")
}

/// `map_err(perr(&path))`: a Parquet error writing or reading the file at `path`.
fn perr(path: &Path) -> impl Fn(ParquetError) -> OutputError + '_ {
    move |source| OutputError::Parquet {
        path: path.to_path_buf(),
        source,
    }
}

/// Column names in file order, for `receivers` receiver slots.
pub fn column_names(receivers: usize) -> Vec<String> {
    let mut names: Vec<String> = [
        "sample_index",
        "tx_lat",
        "tx_lon",
        "tx_alt_m",
        "tx_power_dbm",
        "tx_modulation",
        "tx_inside",
        "receivers",
        "receivers_detected",
        "mean_snr_db",
        "gdop",
    ]
    .map(String::from)
    .to_vec();
    for r in 0..receivers {
        names.extend(RX_TRUTH.iter().map(|t| format!("rx{r}_{t}")));
        for f in FEATURE_NAMES {
            names.extend(STATS.iter().map(|s| format!("rx{r}_{f}_{s}")));
        }
    }
    names
}

fn schema(receivers: usize) -> String {
    let names = column_names(receivers);
    let mut msg = String::from("message rf_dataset {\n");
    for (i, n) in names.iter().enumerate() {
        let ty = match i {
            0 => "REQUIRED INT64",
            5 => "REQUIRED BYTE_ARRAY",
            6 => "REQUIRED BOOLEAN",
            7 | 8 => "REQUIRED INT32",
            1..=10 => "REQUIRED DOUBLE",
            _ => "OPTIONAL DOUBLE",
        };
        let annotation = if i == 5 { " (UTF8)" } else { "" };
        msg.push_str(&format!("  {ty} {n}{annotation};\n"));
    }
    msg.push('}');
    msg
}

impl FeatureWriter {
    /// A writer for `path` whose first `parts` parts are already sealed (0 for a new job;
    /// a resumed job passes its checkpoint's). Parts beyond them are removed.
    pub fn open(
        path: &Path,
        receivers: usize,
        rows_per_part: usize,
        parts: usize,
    ) -> Result<Self, OutputError> {
        let parts_dir = path.with_extension("parts");
        std::fs::create_dir_all(&parts_dir).map_err(OutputError::io(&parts_dir))?;
        for entry in std::fs::read_dir(&parts_dir)
            .map_err(OutputError::io(&parts_dir))?
            .flatten()
        {
            let keep = (0..parts).any(|k| entry.path() == part_path(&parts_dir, k));
            if !keep {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        for k in 0..parts {
            if !part_path(&parts_dir, k).exists() {
                return Err(OutputError::MissingPart(k));
            }
        }
        let schema = parse_message_type(&schema(receivers)).map_err(OutputError::Schema)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by("gpu-ops".into())
            .set_key_value_metadata(Some(vec![KeyValue::new(
                GENERATOR_VERSION_KEY.to_string(),
                GENERATOR_VERSION.to_string(),
            )]))
            .build();
        let columns = column_names(receivers)
            .iter()
            .enumerate()
            .map(|(i, _)| Column {
                values: match i {
                    0 => Values::I64(Vec::new()),
                    5 => Values::Utf8(Vec::new()),
                    6 => Values::Bool(Vec::new()),
                    7 | 8 => Values::I32(Vec::new()),
                    _ => Values::F64(Vec::new()),
                },
                defs: (i > 10).then(Vec::new),
            })
            .collect();
        Ok(Self {
            schema: Arc::new(schema),
            props: Arc::new(props),
            columns,
            rows: 0,
            rows_per_part,
            receivers,
            parts_dir,
            parts,
            path: path.to_path_buf(),
        })
    }

    /// Parts sealed so far.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Buffers a row; true when it completed a part, which is then sealed on disk.
    pub fn push(&mut self, rec: &SampleRecord) -> Result<bool, OutputError> {
        let mut c = self.columns.iter_mut();
        let f64s = |c: &mut std::slice::IterMut<'_, Column>, v: Option<f64>| {
            let col = c.next().expect("one column per value");
            if let (Values::F64(vals), defs) = (&mut col.values, &mut col.defs) {
                if let Some(x) = v {
                    vals.push(x);
                }
                if let Some(d) = defs {
                    d.push(i16::from(v.is_some()));
                }
            }
        };
        if let Values::I64(v) = &mut c.next().expect("sample_index").values {
            v.push(rec.index as i64);
        }
        for x in [rec.tx.lat, rec.tx.lon, rec.tx.alt_m, rec.tx.power_dbm] {
            f64s(&mut c, Some(x));
        }
        if let Values::Utf8(v) = &mut c.next().expect("tx_modulation").values {
            v.push(ByteArray::from(rec.tx.modulation.name()));
        }
        if let Values::Bool(v) = &mut c.next().expect("tx_inside").values {
            v.push(rec.tx.inside);
        }
        for n in [rec.receivers.len(), rec.quality.receivers_detected] {
            if let Values::I32(v) = &mut c.next().expect("receiver counts").values {
                v.push(n as i32);
            }
        }
        f64s(&mut c, Some(rec.quality.mean_snr_db));
        f64s(&mut c, Some(rec.quality.gdop));
        for r in 0..self.receivers {
            let truth = rec.receivers.get(r);
            let values = truth.map(|t| {
                [
                    t.lat,
                    t.lon,
                    t.alt_m,
                    t.distance_m,
                    t.received_power_dbm,
                    t.carrier_offset_hz,
                    t.drift_hz_per_s,
                    t.rms_delay_spread_us,
                ]
            });
            for k in 0..RX_TRUTH.len() {
                f64s(&mut c, values.map(|v| v[k]));
            }
            let features = rec.features.get(r);
            for f in 0..FEATURE_NAMES.len() {
                let s = features.map(|v| v[f]);
                for x in [
                    s.map(|s| s.mean),
                    s.map(|s| s.std),
                    s.map(|s| s.min),
                    s.map(|s| s.max),
                ] {
                    f64s(&mut c, x);
                }
            }
        }
        self.rows += 1;
        if self.rows == self.rows_per_part {
            self.seal()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Writes the buffered rows as the next part: a one-row-group Parquet file, synced
    /// and renamed from `.partial`.
    fn seal(&mut self) -> Result<(), OutputError> {
        if self.rows == 0 {
            return Ok(());
        }
        let path = part_path(&self.parts_dir, self.parts);
        let partial = path.with_extension("parquet.partial");
        let err = perr(&partial);
        let file = File::create(&partial).map_err(OutputError::io(&partial))?;
        let mut writer = SerializedFileWriter::new(file, self.schema.clone(), self.props.clone())
            .map_err(&err)?;
        let mut rg = writer.next_row_group().map_err(&err)?;
        let mut columns = self.columns.iter_mut();
        while let Some(mut w) = rg.next_column().map_err(&err)? {
            let col = columns
                .next()
                .ok_or(OutputError::Columns("more parquet columns than buffers"))?;
            let defs = col.defs.as_deref();
            match (w.untyped(), &mut col.values) {
                (ColumnWriter::DoubleColumnWriter(w), Values::F64(v)) => {
                    w.write_batch(v, defs, None).map_err(&err)?;
                    v.clear();
                }
                (ColumnWriter::Int64ColumnWriter(w), Values::I64(v)) => {
                    w.write_batch(v, defs, None).map_err(&err)?;
                    v.clear();
                }
                (ColumnWriter::Int32ColumnWriter(w), Values::I32(v)) => {
                    w.write_batch(v, defs, None).map_err(&err)?;
                    v.clear();
                }
                (ColumnWriter::BoolColumnWriter(w), Values::Bool(v)) => {
                    w.write_batch(v, defs, None).map_err(&err)?;
                    v.clear();
                }
                (ColumnWriter::ByteArrayColumnWriter(w), Values::Utf8(v)) => {
                    w.write_batch(v, defs, None).map_err(&err)?;
                    v.clear();
                }
                _ => {
                    return Err(OutputError::Columns(
                        "a parquet column of an unexpected type",
                    ))
                }
            }
            if let Some(d) = &mut col.defs {
                d.clear();
            }
            w.close().map_err(&err)?;
        }
        rg.close().map_err(&err)?;
        let file = writer.into_inner().map_err(&err)?;
        file.sync_all().map_err(OutputError::io(&partial))?;
        std::fs::rename(&partial, &path).map_err(OutputError::io(&path))?;
        self.rows = 0;
        self.parts += 1;
        Ok(())
    }

    /// Seals the last rows, splices every part's row group into one file (column chunks
    /// copied as encoded), syncs it and renames it into place. The parts stay until the
    /// catalog records the job completed (`remove_parts`), so a crash in between resumes.
    pub fn finish(mut self) -> Result<(), OutputError> {
        self.seal()?;
        let partial = self.path.with_extension("parquet.partial");
        let err = perr(&partial);
        let out = File::create(&partial).map_err(OutputError::io(&partial))?;
        let mut writer = SerializedFileWriter::new(out, self.schema.clone(), self.props.clone())
            .map_err(&err)?;
        for k in 0..self.parts {
            let path = part_path(&self.parts_dir, k);
            let file = File::open(&path).map_err(OutputError::io(&path))?;
            let reader =
                SerializedFileReader::new(file.try_clone().map_err(OutputError::io(&path))?)
                    .map_err(perr(&path))?;
            for group in reader.metadata().row_groups() {
                let mut rg = writer.next_row_group().map_err(&err)?;
                for column in group.columns() {
                    let close = ColumnCloseResult {
                        bytes_written: column.compressed_size() as u64,
                        rows_written: group.num_rows() as u64,
                        metadata: column.clone(),
                        bloom_filter: None,
                        column_index: None,
                        offset_index: None,
                    };
                    rg.append_column(&file, close).map_err(&err)?;
                }
                rg.close().map_err(&err)?;
            }
        }
        let file = writer.into_inner().map_err(&err)?;
        file.sync_all().map_err(OutputError::io(&partial))?;
        std::fs::rename(&partial, &self.path).map_err(OutputError::io(&self.path))
    }
}

/// Removes the parts of the dataset whose file is `path`.
pub fn remove_parts(path: &Path) {
    let _ = std::fs::remove_dir_all(path.with_extension("parts"));
}
