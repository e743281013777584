//! Where an `auto` job runs: on the side (the CPU pool or a device) where it is predicted
//! to finish first on this host, from times measured here (`model`): a short calibration
//! when a device comes up (`calibrate`), then every job that runs and every shadow check,
//! plus the backlog each side already has. No size threshold decides; a job's
//! `Job::gpu_threshold` is only the prior for an op nothing has been measured of yet,
//! and the whole rule under `--placement threshold`.
//!
//! The side that has a size class keeps it until another is predicted `SWITCH_MARGIN`
//! (10 %) faster, so noisy samples under load do not flip the class job by job.
//!
//! Exploration, and what it may cost (docs/ARCHITECTURE.md, "Placement"):
//! - a side that has measured nothing of an op gets its next job of a size class, one
//!   at a time;
//! - a side that has not run a lane's size class gets one of its jobs, one at a time,
//!   when predicted at most `EXPLORE_MAX_RATIO` times slower than the fastest;
//! - after that, one job in `--placement-explore-every` of a class goes to the side
//!   predicted slower (the one measured longest ago), under the same bound, so a side
//!   that slowed down and recovered wins its work back; a side whose last run of the
//!   class is older than `STALE_AFTER` is explored under no bound (so at most one job
//!   per class in that time).

pub mod calibrate;
pub mod model;
pub mod replay;

pub use model::{Basis, CostModel, Estimate, Shape, Side};

use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// `--placement`: how `auto` chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PlacementMode {
    /// Where the job is predicted to finish first, from times measured on this host.
    #[default]
    Measured,
    /// The old fixed rule, for comparison: a job of at least its op's size threshold
    /// goes to a device.
    Threshold,
}

/// Why a job went where it did (`gpu_ops_placements_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The side predicted to finish first, backlog counted.
    Measured,
    /// A side predicted slower or never measured at this size, to measure it.
    Explored,
    /// The request or the server (`--backend`) named the side.
    Forced,
    /// One side only could take it (no usable device, or a shape the device refuses).
    OnlyChoice,
    /// Nothing measured of the op yet: its size threshold decided.
    Prior,
    /// `--placement threshold`.
    Threshold,
    /// The device holding the job's operands (`Job::resident_on`).
    Resident,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::Measured => "measured",
            Reason::Explored => "explored",
            Reason::Forced => "forced",
            Reason::OnlyChoice => "only_choice",
            Reason::Prior => "prior",
            Reason::Threshold => "threshold",
            Reason::Resident => "resident",
        }
    }
}

/// A side predicted at most this many times slower than the fastest may be explored.
pub const EXPLORE_MAX_RATIO: f64 = 4.0;
/// How much faster (predicted finish) another side must be to take a class from the
/// side that has it.
pub const SWITCH_MARGIN: f64 = 1.1;
/// A side whose last run of a class is older than this is explored whatever its
/// prediction.
pub const STALE_AFTER: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug)]
pub struct PlacementConfig {
    pub mode: PlacementMode,
    /// One job in this many of a size class explores the side predicted slower.
    pub explore_every: u64,
    /// Jobs the CPU pool runs at once (its workers): the CPU's backlog is waited out that
    /// many at a time. A device's lease is exclusive, so its backlog is waited out whole.
    pub cpu_slots: usize,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            mode: PlacementMode::Measured,
            explore_every: 32,
            cpu_slots: 1,
        }
    }
}

/// Where one job goes, and why.
#[derive(Clone, Copy, Debug)]
pub struct Decision {
    pub side: Side,
    pub reason: Reason,
    /// The run time predicted on that side, if the model had one: booked as backlog.
    pub predicted: Option<f64>,
}

/// One calibration of a device (`calibrate`).
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CalibrationRecord {
    pub device: usize,
    /// Seconds since the Unix epoch when it finished.
    pub finished_unix: u64,
    pub seconds: f64,
    /// Cases run on the device and on the CPU, each recorded as a sample of both.
    pub cases: usize,
    /// Tests not started: the time budget was spent.
    pub over_budget: usize,
    /// Cases left out because they failed (their errors are logged).
    pub failed: usize,
    /// The longest test's seconds: calibration ends within its budget and this.
    pub longest_test_seconds: f64,
    /// The first failure, if any: nothing is retired or quarantined for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

type ClassKey = (&'static str, String, i32);

#[derive(Default)]
struct ClassState {
    placements: u64,
    /// The side the last measured placement of this class chose: it keeps the class
    /// until another is predicted `SWITCH_MARGIN` faster, so noise in the samples does
    /// not flip every job.
    winner: Option<Side>,
    /// Sides with an exploring job of this class in flight.
    exploring: HashSet<Side>,
}

/// The model, the choice and what `/device` reports of them. One per server.
pub struct Placement {
    config: PlacementConfig,
    model: CostModel,
    /// Seconds of predicted work placed on each side and not finished.
    backlog: Mutex<HashMap<Side, f64>>,
    classes: Mutex<HashMap<ClassKey, ClassState>>,
    calibrations: Mutex<BTreeMap<usize, CalibrationRecord>>,
    /// Devices that compute on the host's own cores (the emulated device): their work
    /// counts in the CPU pool's backlog, since it adds no capacity (`backlogs`).
    shares_host: Mutex<HashSet<usize>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Placement {
    pub fn new(config: PlacementConfig) -> Self {
        Self {
            config: PlacementConfig {
                explore_every: config.explore_every.max(1),
                cpu_slots: config.cpu_slots.max(1),
                ..config
            },
            model: CostModel::new(),
            backlog: Mutex::new(HashMap::new()),
            classes: Mutex::new(HashMap::new()),
            calibrations: Mutex::new(BTreeMap::new()),
            shares_host: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `device` runs on the host's cores (the emulated device does): if so its
    /// backlog counts in the CPU's too (`backlogs`).
    pub fn set_shares_host(&self, device: usize, shares: bool) {
        let mut set = lock(&self.shares_host);
        if shares {
            set.insert(device);
        } else {
            set.remove(&device);
        }
    }

    pub fn config(&self) -> PlacementConfig {
        self.config
    }

    pub fn model(&self) -> &CostModel {
        &self.model
    }

    /// Where an `auto` job goes among the CPU and `devices` (ordinals of the usable
    /// devices, non-empty). `threshold` is the op's old fixed size threshold: the prior.
    pub fn choose(&self, job: Shape<'_>, threshold: usize, devices: &[usize]) -> Decision {
        let by_threshold = |reason| Decision {
            side: if job.size < threshold {
                Side::Cpu
            } else {
                Side::Device(devices[0])
            },
            reason,
            predicted: None,
        };
        if self.config.mode == PlacementMode::Threshold {
            return by_threshold(Reason::Threshold);
        }
        let sides: Vec<Side> = std::iter::once(Side::Cpu)
            .chain(devices.iter().map(|&d| Side::Device(d)))
            .collect();
        let estimates = self.model.predict(job, &sides);
        if estimates.iter().all(Option::is_none) {
            return by_threshold(Reason::Prior);
        }
        let backlog = self.backlogs(&sides);
        let finish = |i: usize| estimates[i].map(|e| e.seconds + backlog[i]);
        let fastest = (0..sides.len())
            .filter(|&i| estimates[i].is_some())
            .min_by(|&a, &b| finish(a).unwrap().total_cmp(&finish(b).unwrap()))
            .expect("a side has an estimate");
        let key = (job.op, job.lane.to_string(), model::class_of(job.size));
        let mut classes = lock(&self.classes);
        let class = classes.entry(key).or_default();
        class.placements += 1;
        let holder = class
            .winner
            .and_then(|w| sides.iter().position(|&s| s == w))
            .filter(|&i| finish(i).is_some_and(|f| f <= SWITCH_MARGIN * finish(fastest).unwrap()));
        let best = holder.unwrap_or(fastest);
        let best_seconds = estimates[best].map_or(0.0, |e| e.seconds);
        let explorable = |i: usize, bound: bool| {
            i != best
                && !class.exploring.contains(&sides[i])
                && estimates[i].is_none_or(|e| {
                    !bound || e.seconds <= EXPLORE_MAX_RATIO * best_seconds.max(1e-9)
                })
        };
        // A side that never ran this class (or nothing of the op) first.
        let unseen = (0..sides.len()).find(|&i| {
            estimates[i].is_none_or(|e| !e.class_seen) && explorable(i, estimates[i].is_some())
        });
        let periodic = || {
            (0..sides.len())
                .filter(|&i| {
                    let stale =
                        estimates[i].is_some_and(|e| e.age.is_some_and(|a| a > STALE_AFTER));
                    explorable(i, !stale)
                        && (stale || class.placements % self.config.explore_every == 0)
                })
                .max_by_key(|&i| estimates[i].and_then(|e| e.age).unwrap_or(Duration::MAX))
        };
        let explore = unseen.or_else(periodic);
        if let Some(i) = explore {
            class.exploring.insert(sides[i]);
            return Decision {
                side: sides[i],
                reason: Reason::Explored,
                predicted: estimates[i].map(|e| e.seconds),
            };
        }
        class.winner = Some(sides[best]);
        Decision {
            side: sides[best],
            reason: Reason::Measured,
            predicted: Some(best_seconds),
        }
    }

    /// A side chosen for the job, not by the model (forced, or the only one): booked
    /// with what the model predicts there, so the backlog counts it too.
    pub fn decided(&self, job: Shape<'_>, side: Side, reason: Reason) -> Decision {
        Decision {
            side,
            reason,
            predicted: self.model.predict(job, &[side])[0].map(|e| e.seconds),
        }
    }

    /// A placed job starts: its predicted time counts against its side until `finished`.
    pub fn started(&self, d: &Decision) {
        if let Some(p) = d.predicted {
            *lock(&self.backlog).entry(d.side).or_insert(0.0) += p;
        }
    }

    /// A placed job ended. `ran`: where it ran and how long it took, when it ran to the
    /// end (a device failure records nothing of the device).
    pub fn finished(&self, job: Shape<'_>, d: &Decision, ran: Option<(Side, f64)>) {
        if let Some(p) = d.predicted {
            let mut backlog = lock(&self.backlog);
            let left = backlog.entry(d.side).or_insert(0.0);
            *left = (*left - p).max(0.0);
        }
        if d.reason == Reason::Explored {
            let key = (job.op, job.lane.to_string(), model::class_of(job.size));
            if let Some(c) = lock(&self.classes).get_mut(&key) {
                c.exploring.remove(&d.side);
            }
        }
        if let Some((side, seconds)) = ran {
            self.model.record(job, side, seconds);
        }
    }

    /// A run outside placement (a forced job, a shadow check, calibration): a sample.
    pub fn observed(&self, job: Shape<'_>, side: Side, seconds: f64) {
        self.model.record(job, side, seconds);
    }

    /// Predicted seconds of unfinished work on `side`.
    pub fn backlog(&self, side: Side) -> f64 {
        lock(&self.backlog).get(&side).copied().unwrap_or(0.0)
    }

    /// Each side's backlog as a job placed there would wait on it. The CPU pool runs
    /// `cpu_slots` jobs at once, and a CPU job's measured time is its wall time among the
    /// others it ran beside, so its backlog is waited out `cpu_slots` at a time. A
    /// device's lease is exclusive: a job there waits for all of the device's backlog.
    /// A device on the host's own cores (the emulated device) adds no cores: a CPU job
    /// waits on the device's work too, and a job there waits for whichever is longer,
    /// the device's own queue or the host's.
    fn backlogs(&self, sides: &[Side]) -> Vec<f64> {
        let backlog = lock(&self.backlog);
        let shares = lock(&self.shares_host);
        let on_host = |s: &Side| match s {
            Side::Cpu => true,
            Side::Device(d) => shares.contains(d),
        };
        let host: f64 = backlog
            .iter()
            .filter(|(s, _)| on_host(s))
            .map(|(_, b)| b)
            .sum();
        let host_wait = host / self.config.cpu_slots as f64;
        sides
            .iter()
            .map(|s| {
                let own = backlog.get(s).copied().unwrap_or(0.0);
                match s {
                    Side::Cpu => host_wait,
                    Side::Device(_) if on_host(s) => own.max(host_wait),
                    Side::Device(_) => own,
                }
            })
            .collect()
    }

    pub fn calibrated(&self, record: CalibrationRecord) {
        lock(&self.calibrations).insert(record.device, record);
    }

    /// What `/device` shows: per op and lane, the sides measured, the crossover the
    /// model implies against each device, and what it rests on.
    pub fn report(&self) -> PlacementReport {
        let lanes = self
            .model
            .lanes()
            .into_iter()
            .map(|(op, lane, sides)| self.lane_report(op, lane, &sides))
            .collect();
        PlacementReport {
            mode: self.config.mode,
            explore_every: self.config.explore_every,
            calibrations: lock(&self.calibrations).values().cloned().collect(),
            lanes,
        }
    }

    fn lane_report(&self, op: &'static str, lane: String, sides: &[Side]) -> LaneReport {
        let measured = sides
            .iter()
            .map(|&s| {
                let (samples, age) = self.model.evidence(op, &lane, s);
                SideEvidence {
                    side: s.label(),
                    samples,
                    last_sample_seconds_ago: age.map(|a| a.as_secs_f64()),
                }
            })
            .collect();
        let range = self.model.size_range(op, &lane);
        let bytes_per_item = self.model.bytes_per_item(op, &lane);
        let crossovers = sides
            .iter()
            .filter_map(|&s| match s {
                Side::Device(d) => Some(d),
                Side::Cpu => None,
            })
            .filter(|_| sides.contains(&Side::Cpu))
            .map(|d| {
                let segments = match range {
                    Some(_) => self.segments(op, &lane, d, bytes_per_item),
                    None => Vec::new(),
                };
                Crossover {
                    device: d,
                    faster: segments,
                }
            })
            .collect();
        LaneReport {
            op,
            lane,
            measured,
            smallest_size: range.map(|r| r.0),
            largest_size: range.map(|r| r.1),
            crossovers,
        }
    }

    /// Which side the model predicts faster (idle, no backlog), size class by size class
    /// from 1 to 2^34 items: where it changes.
    fn segments(
        &self,
        op: &'static str,
        lane: &str,
        device: usize,
        bytes_per_item: f64,
    ) -> Vec<Segment> {
        let mut out: Vec<Segment> = Vec::new();
        for class in 0..=68 {
            let size = (f64::from(class) / 2.0).exp2().round() as usize;
            let job = Shape {
                op,
                lane,
                size,
                bytes: (size as f64 * bytes_per_item).round() as usize,
            };
            let got = self.model.predict(job, &[Side::Cpu, Side::Device(device)]);
            let (Some(cpu), Some(dev)) = (got[0], got[1]) else {
                continue;
            };
            let side = if dev.seconds < cpu.seconds {
                Side::Device(device).label()
            } else {
                Side::Cpu.label()
            };
            if out.last().is_none_or(|s| s.side != side) {
                out.push(Segment {
                    from_size: size,
                    side,
                    basis: dev.basis,
                });
            }
        }
        out
    }
}

/// `/device`'s `placement`.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlacementReport {
    pub mode: PlacementMode,
    /// One job in this many of a size class explores the side predicted slower.
    pub explore_every: u64,
    /// The last calibration of each device.
    pub calibrations: Vec<CalibrationRecord>,
    /// Every op and lane measured on any side.
    pub lanes: Vec<LaneReport>,
}

/// One op and lane.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LaneReport {
    pub op: &'static str,
    /// The field, dtype or shape class ("" for an op with one lane).
    pub lane: String,
    pub measured: Vec<SideEvidence>,
    /// The smallest job size measured on any side, in the op's work items.
    pub smallest_size: Option<usize>,
    /// The largest.
    pub largest_size: Option<usize>,
    /// Against each device: from which sizes each side is predicted faster.
    pub crossovers: Vec<Crossover>,
}

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SideEvidence {
    /// `cpu`, or `gpu<ordinal>`.
    pub side: String,
    pub samples: u64,
    pub last_sample_seconds_ago: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Crossover {
    pub device: usize,
    /// In order of size: from `from_size` items on, `side` is predicted faster (until the
    /// next entry).
    pub faster: Vec<Segment>,
}

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Segment {
    pub from_size: usize,
    pub side: String,
    /// What the device's prediction at that size rests on.
    pub basis: Basis,
}

#[cfg(test)]
mod tests;
