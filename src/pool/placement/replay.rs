//! Placement held to a finished measurement run: each case of a report (a `gpu-ops
//! check`, or a committed one such as docs/gpu-runs/2026-11-28-h200) predicted from every
//! other case of the report, as if those were what the server had measured on that host,
//! and the side it then picks compared with the side that was faster. `gpu-ops check`
//! prints this for its own cases; a test replays the H200 run.

use super::model::{Basis, CostModel, Shape, Side};
use std::collections::HashSet;
use std::sync::Mutex;

/// One measured case: its device round trip and CPU twin times.
#[derive(Clone, Debug)]
pub struct Row {
    /// The op placement records the case under (`Job::name`; a library's case runs the
    /// jobs of the op it serves, so a server keeps both under one name).
    pub op: String,
    pub lane: String,
    pub size: usize,
    /// Input bytes; 0 where the report did not say.
    pub input_bytes: usize,
    pub device_seconds: f64,
    pub cpu_seconds: f64,
    /// Whether the case is predicted (held out in turn); the others only teach.
    pub held_out: bool,
}

/// What placement would have picked for one held-out case.
#[derive(Clone, Debug)]
pub struct Pick {
    /// Index into the rows.
    pub row: usize,
    /// The side picked: true for the device. With nothing measured of the op, the old
    /// threshold rule's pick at production sizes (the device).
    pub device: bool,
    /// What the pick rests on; None: nothing else of the op was measured.
    pub basis: Option<Basis>,
    pub predicted_device_seconds: Option<f64>,
    pub predicted_cpu_seconds: Option<f64>,
}

impl Pick {
    /// Whether the pick was the faster side.
    pub fn right(&self, row: &Row) -> bool {
        self.device == (row.device_seconds < row.cpu_seconds)
    }
}

/// The slower side's time over the faster's.
pub fn ratio(row: &Row) -> f64 {
    let (a, b) = (row.device_seconds, row.cpu_seconds);
    a.max(b) / a.min(b).max(1e-9)
}

/// Model keys name ops by `&'static str`; a replay's come from a file. Each distinct
/// name is leaked once.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let set = names.get_or_insert_with(HashSet::new);
    if let Some(n) = set.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    set.insert(leaked);
    leaked
}

fn shape(row: &Row) -> Shape<'_> {
    Shape {
        op: intern(&row.op),
        lane: &row.lane,
        size: row.size,
        bytes: row.input_bytes,
    }
}

/// Every held-out row predicted from all the other rows.
pub fn leave_one_out(rows: &[Row]) -> Vec<Pick> {
    (0..rows.len())
        .filter(|&i| rows[i].held_out)
        .map(|i| {
            let model = CostModel::new();
            for (j, r) in rows.iter().enumerate() {
                if j != i {
                    model.record(shape(r), Side::Device(0), r.device_seconds);
                    model.record(shape(r), Side::Cpu, r.cpu_seconds);
                }
            }
            let got = model.predict(shape(&rows[i]), &[Side::Cpu, Side::Device(0)]);
            match (got[0], got[1]) {
                (Some(cpu), Some(dev)) => Pick {
                    row: i,
                    device: dev.seconds < cpu.seconds,
                    basis: Some(dev.basis),
                    predicted_device_seconds: Some(dev.seconds),
                    predicted_cpu_seconds: Some(cpu.seconds),
                },
                _ => Pick {
                    row: i,
                    device: true,
                    basis: None,
                    predicted_device_seconds: None,
                    predicted_cpu_seconds: None,
                },
            }
        })
        .collect()
}
