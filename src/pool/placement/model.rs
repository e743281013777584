//! The cost model behind `auto`: for each op, lane and side (the CPU pool or one
//! device), the times measured on this host, by size class, and a prediction for a job
//! of any size from them.
//!
//! A size class is half an octave of the job's `size`. Each class keeps its last five
//! runs and takes the median of their log seconds (and the mean of their log sizes), so
//! one run slowed by a neighbour moves nothing, and a device that slows down or recovers
//! is followed from its third run on. Between measured classes the time is interpolated on log-log axes (a power law
//! between neighbours); beyond them it is taken as proportional to the size, an
//! overestimate for both sides (a fixed cost does not grow), which keeps the two sides'
//! ratio where it was last measured.
//!
//! Lanes of one op (fields, dtypes, shapes) share what they have measured on a second
//! axis, the job's input bytes: a lane never measured near a size borrows the op's other
//! lanes at the same bytes, where a device round trip costs about the same per byte.

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a job can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Cpu,
    /// A device, by ordinal.
    Device(usize),
}

impl Side {
    pub fn label(self) -> String {
        match self {
            Side::Cpu => "cpu".into(),
            Side::Device(n) => format!("gpu{n}"),
        }
    }
}

/// How far (in octaves) a measured class may be from a job's size for the prediction
/// to count as resting on measurements near it.
const NEAR_OCTAVES: f64 = 2.0;
/// The runs a class remembers: its time is their median, so one run slowed by a
/// neighbour moves nothing, and a side that really slowed down (or recovered) is
/// followed from its third run on.
const RECENT_RUNS: usize = 5;
/// No time reads below this (a run the clock rounded to nothing).
const MIN_SECONDS: f64 = 1e-7;

/// A size class: half an octave.
pub fn class_of(size: usize) -> i32 {
    (2.0 * (size.max(1) as f64).log2()).round() as i32
}

#[derive(Clone, Debug)]
struct Class {
    /// The last `RECENT_RUNS` runs, (log2 size, log2 seconds), oldest first.
    recent: std::collections::VecDeque<(f64, f64)>,
    /// Their mean log size and median log seconds.
    log_size: f64,
    log_seconds: f64,
    samples: u64,
    updated: Instant,
}

impl Class {
    fn new(now: Instant) -> Self {
        Self {
            recent: std::collections::VecDeque::with_capacity(RECENT_RUNS),
            log_size: 0.0,
            log_seconds: 0.0,
            samples: 0,
            updated: now,
        }
    }

    fn add(&mut self, log_size: f64, log_seconds: f64, now: Instant) {
        if self.recent.len() == RECENT_RUNS {
            self.recent.pop_front();
        }
        self.recent.push_back((log_size, log_seconds));
        let n = self.recent.len() as f64;
        self.log_size = self.recent.iter().map(|r| r.0).sum::<f64>() / n;
        let mut times: Vec<f64> = self.recent.iter().map(|r| r.1).collect();
        times.sort_by(f64::total_cmp);
        let mid = times.len() / 2;
        self.log_seconds = if times.len() % 2 == 1 {
            times[mid]
        } else {
            (times[mid - 1] + times[mid]) / 2.0
        };
        self.samples += 1;
        self.updated = now;
    }
}

/// One axis of one (op, lane, side): its classes in order.
#[derive(Clone, Debug, Default)]
struct Curve {
    classes: BTreeMap<i32, Class>,
}

impl Curve {
    fn add(&mut self, x: usize, seconds: f64, now: Instant) {
        let (lx, ly) = ((x.max(1) as f64).log2(), seconds.max(MIN_SECONDS).log2());
        self.classes
            .entry(class_of(x))
            .or_insert_with(|| Class::new(now))
            .add(lx, ly, now);
    }

    fn points(&self) -> Vec<(f64, f64)> {
        self.classes
            .values()
            .map(|c| (c.log_size, c.log_seconds))
            .collect()
    }

    fn nearest(&self, x: usize) -> Option<&Class> {
        let lx = (x.max(1) as f64).log2();
        self.classes
            .values()
            .min_by(|a, b| (a.log_size - lx).abs().total_cmp(&(b.log_size - lx).abs()))
    }
}

/// The log2 seconds at log2 size `lx` from points sorted by size: interpolated between
/// neighbours, proportional to the size beyond them.
fn interpolate(points: &[(f64, f64)], lx: f64) -> Option<f64> {
    let (first, last) = (points.first()?, points.last()?);
    if lx <= first.0 {
        return Some(first.1 + (lx - first.0));
    }
    if lx >= last.0 {
        return Some(last.1 + (lx - last.0));
    }
    points.windows(2).find_map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        (x0..=x1).contains(&lx).then(|| {
            if x1 - x0 < 1e-9 {
                y0
            } else {
                y0 + (y1 - y0) * (lx - x0) / (x1 - x0)
            }
        })
    })
}

fn near(points: &[(f64, f64)], lx: f64) -> bool {
    points.iter().any(|p| (p.0 - lx).abs() <= NEAR_OCTAVES)
}

/// What a prediction rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// This lane's own runs, within two octaves of the size.
    Lane,
    /// The op's other lanes of the same shape class (the part of the lane after its
    /// `/`, as `batched` in `bn254_fr/batched`), at about the same input bytes.
    Shape,
    /// The op's other lanes, at about the same input bytes.
    Op,
    /// This lane's runs, all more than two octaves away: scaled in proportion to size.
    LaneExtrapolated,
    /// The op's other lanes, far from these bytes: scaled in proportion.
    OpExtrapolated,
}

/// A predicted run time on one side.
#[derive(Clone, Copy, Debug)]
pub struct Estimate {
    pub seconds: f64,
    pub basis: Basis,
    /// Samples in the lane's class nearest the size (0 when the op's other lanes
    /// answered).
    pub samples: u64,
    /// Since the nearest class last had a sample.
    pub age: Option<Duration>,
    /// Whether this side has run this very size class of this lane.
    pub class_seen: bool,
}

/// What is known of one (op, lane, side).
#[derive(Clone, Debug, Default)]
struct Entry {
    by_size: Curve,
    by_bytes: Curve,
    /// Input bytes per work item of the last job (for `/device`'s crossovers, which
    /// scan sizes).
    bytes_per_item: f64,
}

/// A job as the model sees it.
#[derive(Clone, Copy, Debug)]
pub struct Shape<'a> {
    pub op: &'static str,
    pub lane: &'a str,
    pub size: usize,
    /// Input bytes (`Job::input_bytes`); 0 where not known.
    pub bytes: usize,
}

type Key = (&'static str, String, Side);

/// Every measurement, per (op, lane, side).
#[derive(Default)]
pub struct CostModel {
    entries: Mutex<HashMap<Key, Entry>>,
}

impl CostModel {
    pub fn new() -> Self {
        Self::default()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One run of `job` on `side` took `seconds`.
    pub fn record(&self, job: Shape<'_>, side: Side, seconds: f64) {
        self.record_at(job, side, seconds, Instant::now());
    }

    pub fn record_at(&self, job: Shape<'_>, side: Side, seconds: f64, now: Instant) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let mut entries = self.entries();
        let e = entries
            .entry((job.op, job.lane.to_string(), side))
            .or_default();
        e.by_size.add(job.size, seconds, now);
        // 0 bytes: not known (a replayed report that did not print them).
        if job.bytes > 0 {
            e.by_bytes.add(job.bytes, seconds, now);
            e.bytes_per_item = job.bytes as f64 / job.size.max(1) as f64;
        }
    }

    /// Input bytes per work item of the lane's last job on any side (1 if none).
    pub fn bytes_per_item(&self, op: &'static str, lane: &str) -> f64 {
        self.entries()
            .iter()
            .find(|((o, l, _), _)| *o == op && l == lane)
            .map_or(1.0, |(_, e)| e.bytes_per_item)
    }

    /// The predicted time of `job` on each of `sides`, every answer on the same basis
    /// (the best that all sides with any measurement share); None for a side that has
    /// measured nothing of this op.
    pub fn predict(&self, job: Shape<'_>, sides: &[Side]) -> Vec<Option<Estimate>> {
        let entries = self.entries();
        let own: Vec<Option<&Entry>> = sides
            .iter()
            .map(|&s| entries.get(&(job.op, job.lane.to_string(), s)))
            .collect();
        // Lanes are pooled on the bytes axis: a job of unknown bytes borrows nothing.
        let pooled: Vec<Vec<(f64, f64)>> = sides
            .iter()
            .map(|&s| {
                if job.bytes == 0 {
                    Vec::new()
                } else {
                    pooled_points(&entries, job.op, s, None)
                }
            })
            .collect();
        let shape_class = job.lane.split_once('/').map(|(_, shape)| shape);
        let same_shape: Vec<Vec<(f64, f64)>> = sides
            .iter()
            .map(|&s| match shape_class {
                Some(shape) if job.bytes > 0 => pooled_points(&entries, job.op, s, Some(shape)),
                _ => Vec::new(),
            })
            .collect();
        let (ls, lb) = (
            (job.size.max(1) as f64).log2(),
            (job.bytes.max(1) as f64).log2(),
        );
        let own_points: Vec<Option<Vec<(f64, f64)>>> =
            own.iter().map(|e| e.map(|e| e.by_size.points())).collect();
        let known: Vec<usize> = (0..sides.len())
            .filter(|&i| own_points[i].is_some() || !pooled[i].is_empty())
            .collect();
        if known.is_empty() {
            return vec![None; sides.len()];
        }
        let all_own = known.iter().all(|&i| own_points[i].is_some());
        let all_pooled = known.iter().all(|&i| !pooled[i].is_empty());
        let own_near = all_own
            && known
                .iter()
                .all(|&i| near(own_points[i].as_deref().unwrap_or(&[]), ls));
        let pooled_near = all_pooled && known.iter().all(|&i| near(&pooled[i], lb));
        let shape_near = known.iter().all(|&i| near(&same_shape[i], lb));
        let basis = if own_near {
            Basis::Lane
        } else if shape_near {
            Basis::Shape
        } else if pooled_near {
            Basis::Op
        } else if all_own {
            Basis::LaneExtrapolated
        } else {
            Basis::OpExtrapolated
        };
        (0..sides.len())
            .map(|i| {
                if !known.contains(&i) {
                    return None;
                }
                let log_seconds = match basis {
                    Basis::Lane | Basis::LaneExtrapolated => {
                        interpolate(own_points[i].as_deref()?, ls)?
                    }
                    Basis::Shape => interpolate(&same_shape[i], lb)?,
                    Basis::Op | Basis::OpExtrapolated => interpolate(&pooled[i], lb)?,
                };
                let nearest = own[i].and_then(|e| e.by_size.nearest(job.size));
                let class_seen =
                    own[i].is_some_and(|e| e.by_size.classes.contains_key(&class_of(job.size)));
                Some(Estimate {
                    seconds: log_seconds.exp2(),
                    basis,
                    samples: nearest.map_or(0, |c| c.samples),
                    age: nearest.map(|c| c.updated.elapsed()),
                    class_seen,
                })
            })
            .collect()
    }

    /// The lanes measured of each op, with the sides that measured them: what `/device`
    /// reports on.
    pub fn lanes(&self) -> Vec<(&'static str, String, Vec<Side>)> {
        let mut by: BTreeMap<(&'static str, String), Vec<Side>> = BTreeMap::new();
        for (op, lane, side) in self.entries().keys() {
            by.entry((op, lane.clone())).or_default().push(*side);
        }
        by.into_iter()
            .map(|((op, lane), mut sides)| {
                sides.sort();
                (op, lane, sides)
            })
            .collect()
    }

    /// Samples and the newest sample's age of one (op, lane, side).
    pub fn evidence(&self, op: &'static str, lane: &str, side: Side) -> (u64, Option<Duration>) {
        let entries = self.entries();
        let Some(e) = entries.get(&(op, lane.to_string(), side)) else {
            return (0, None);
        };
        let samples = e.by_size.classes.values().map(|c| c.samples).sum();
        let newest = e.by_size.classes.values().map(|c| c.updated).max();
        (samples, newest.map(|t| t.elapsed()))
    }

    /// The measured size classes of one (op, lane) on any side: where `/device` looks
    /// for the crossover.
    pub fn size_range(&self, op: &'static str, lane: &str) -> Option<(usize, usize)> {
        let entries = self.entries();
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for ((o, l, _), e) in entries.iter() {
            if *o == op && l == lane {
                for c in e.by_size.classes.values() {
                    lo = lo.min(c.log_size);
                    hi = hi.max(c.log_size);
                }
            }
        }
        (lo <= hi).then(|| (lo.exp2().round() as usize, hi.exp2().round() as usize))
    }
}

/// One op's lanes on one side (those of shape class `shape`, if given), on the bytes
/// axis: per class, the mean of the lanes' points (each lane counted once, however
/// often it ran).
fn pooled_points(
    entries: &HashMap<Key, Entry>,
    op: &'static str,
    side: Side,
    shape: Option<&str>,
) -> Vec<(f64, f64)> {
    let mut by_class: BTreeMap<i32, (f64, f64, u32)> = BTreeMap::new();
    for ((o, lane, s), e) in entries {
        if *o != op || *s != side {
            continue;
        }
        if shape.is_some_and(|want| lane.split_once('/').map(|(_, s)| s) != Some(want)) {
            continue;
        }
        for (&k, c) in &e.by_bytes.classes {
            let acc = by_class.entry(k).or_insert((0.0, 0.0, 0));
            acc.0 += c.log_size;
            acc.1 += c.log_seconds;
            acc.2 += 1;
        }
    }
    by_class
        .values()
        .map(|&(x, y, n)| (x / f64::from(n), y / f64::from(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(lane: &str, size: usize) -> Shape<'_> {
        Shape {
            op: "field_add",
            lane,
            size,
            bytes: size * 64,
        }
    }

    #[test]
    fn a_prediction_interpolates_between_measured_classes_and_scales_beyond_them() {
        let m = CostModel::new();
        m.record(job("bn254_fr", 1 << 10), Side::Cpu, 0.001);
        m.record(job("bn254_fr", 1 << 14), Side::Cpu, 0.016);
        let at = |n| m.predict(job("bn254_fr", n), &[Side::Cpu])[0].unwrap();
        // Halfway on log-log axes: 2^12 → 4 ms.
        assert!((at(1 << 12).seconds - 0.004).abs() < 1e-9);
        assert_eq!(at(1 << 12).basis, Basis::Lane);
        // Past the last class, in proportion: 2^20 → 64 × 16 ms.
        let far = at(1 << 20);
        assert!((far.seconds - 1.024).abs() < 1e-6, "{far:?}");
        assert_eq!(far.basis, Basis::LaneExtrapolated);
    }

    #[test]
    fn a_class_follows_a_change_within_a_few_samples() {
        let m = CostModel::new();
        let j = job("goldilocks", 1 << 16);
        for _ in 0..10 {
            m.record(j, Side::Device(0), 0.001);
        }
        for _ in 0..5 {
            m.record(j, Side::Device(0), 0.010);
        }
        let e = m.predict(j, &[Side::Device(0)])[0].unwrap();
        assert!((e.seconds - 0.010).abs() < 1e-9, "{e:?}");
        assert_eq!(e.samples, 15);
        assert!(e.class_seen);
        // One outlier among them moves nothing.
        m.record(j, Side::Device(0), 1.0);
        let e = m.predict(j, &[Side::Device(0)])[0].unwrap();
        assert!((e.seconds - 0.010).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn a_lane_never_measured_borrows_the_ops_other_lanes_at_the_same_bytes() {
        let m = CostModel::new();
        // Another lane at 2^20 elements of 64 bytes: 64 MiB.
        m.record(job("bls12_381_fr", 1 << 20), Side::Cpu, 0.008);
        m.record(job("bls12_381_fr", 1 << 20), Side::Device(0), 0.250);
        let sides = [Side::Cpu, Side::Device(0)];
        let got = m.predict(job("bn254_fr", 1 << 20), &sides);
        let (cpu, dev) = (got[0].unwrap(), got[1].unwrap());
        assert_eq!(cpu.basis, Basis::Op);
        assert!(cpu.seconds < dev.seconds);
        assert!(!cpu.class_seen);
        // Nothing of another op is borrowed.
        let other = Shape {
            op: "field_mul",
            ..job("bn254_fr", 1 << 20)
        };
        assert!(m.predict(other, &sides).iter().all(Option::is_none));
    }

    #[test]
    fn every_side_is_predicted_on_one_basis() {
        let m = CostModel::new();
        // The CPU has this lane's own runs near the size; the device only another lane's.
        m.record(job("bn254_fr", 1 << 20), Side::Cpu, 0.008);
        m.record(job("babybear", 1 << 20), Side::Device(0), 0.02);
        m.record(job("babybear", 1 << 20), Side::Cpu, 0.001);
        let got = m.predict(job("bn254_fr", 1 << 20), &[Side::Cpu, Side::Device(0)]);
        assert_eq!(got[0].unwrap().basis, Basis::Op);
        assert_eq!(got[1].unwrap().basis, Basis::Op);
    }

    #[test]
    fn a_side_that_measured_nothing_of_the_op_has_no_estimate() {
        let m = CostModel::new();
        m.record(job("bn254_fr", 1 << 12), Side::Cpu, 0.001);
        let got = m.predict(job("bn254_fr", 1 << 12), &[Side::Cpu, Side::Device(0)]);
        assert!(got[0].is_some());
        assert!(got[1].is_none());
    }
}
