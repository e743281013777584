use super::replay::{leave_one_out, ratio, Row};
use super::*;

const OP: &str = "field_mul";

fn job(size: usize) -> Shape<'static> {
    Shape {
        op: OP,
        lane: "bn254_fr",
        size,
        bytes: 64 * size,
    }
}

fn placement(explore_every: u64) -> Placement {
    Placement::new(PlacementConfig {
        mode: PlacementMode::Measured,
        explore_every,
        cpu_slots: 1,
    })
}

/// Runs `n` jobs of `size` through choose/started/finished, each taking what `cost`
/// says on the side it went to; returns the decisions.
fn run(p: &Placement, size: usize, n: usize, cost: impl Fn(Side) -> f64) -> Vec<Decision> {
    (0..n)
        .map(|_| {
            let d = p.choose(job(size), 1 << 12, &[0]);
            p.started(&d);
            p.finished(job(size), &d, Some((d.side, cost(d.side))));
            d
        })
        .collect()
}

/// The sides of the decisions made for `reason`.
fn sides(decisions: &[Decision], reason: Reason) -> Vec<Side> {
    decisions
        .iter()
        .filter(|d| d.reason == reason)
        .map(|d| d.side)
        .collect()
}

const GPU: Side = Side::Device(0);

#[test]
fn with_nothing_measured_the_ops_threshold_is_the_prior() {
    let p = placement(32);
    let small = p.choose(job(100), 1 << 12, &[0]);
    assert_eq!((small.side, small.reason), (Side::Cpu, Reason::Prior));
    let large = p.choose(job(1 << 20), 1 << 12, &[0]);
    assert_eq!((large.side, large.reason), (GPU, Reason::Prior));
}

#[test]
fn threshold_mode_keeps_the_old_rule_whatever_was_measured() {
    let p = Placement::new(PlacementConfig {
        mode: PlacementMode::Threshold,
        explore_every: 32,
        cpu_slots: 1,
    });
    p.observed(job(1 << 20), GPU, 1.0);
    p.observed(job(1 << 20), Side::Cpu, 0.001);
    let d = p.choose(job(1 << 20), 1 << 12, &[0]);
    assert_eq!((d.side, d.reason), (GPU, Reason::Threshold));
}

#[test]
fn auto_picks_the_side_measured_faster_size_class_by_size_class() {
    let p = placement(1_000_000);
    // The device costs 1 ms plus 1 ns an item, the CPU 10 ns an item: the CPU is faster
    // below about 111 000 items, the device above.
    let cost = |side: Side, n: usize| match side {
        Side::Cpu => 10e-9 * n as f64,
        Side::Device(_) => 1e-3 + 1e-9 * n as f64,
    };
    for k in [8, 12, 16, 20, 24] {
        let n = 1usize << k;
        // Both sides measured in each class first (calibration's work).
        p.observed(job(n), Side::Cpu, cost(Side::Cpu, n));
        p.observed(job(n), GPU, cost(GPU, n));
    }
    for k in [8, 10, 12, 14, 16, 18, 20, 22, 24] {
        let n = 1usize << k;
        let decisions = run(&p, n, 6, |s| cost(s, n));
        let faster = if cost(GPU, n) < cost(Side::Cpu, n) {
            GPU
        } else {
            Side::Cpu
        };
        let measured = sides(&decisions, Reason::Measured);
        assert!(measured.len() >= 5, "2^{k}: {decisions:?}");
        assert!(
            measured.iter().all(|&s| s == faster),
            "2^{k}: {decisions:?}"
        );
        // A class never run (the odd powers) is explored on the other side once.
        let explored = sides(&decisions, Reason::Explored);
        assert!(explored.len() <= 1, "2^{k}: {decisions:?}");
        assert!(
            explored.iter().all(|&s| s != faster),
            "2^{k}: {decisions:?}"
        );
    }
    // /device's crossover says the same.
    let report = p.report();
    let lane = report.lanes.iter().find(|l| l.op == OP).unwrap();
    let faster = &lane.crossovers[0].faster;
    assert_eq!(faster[0].side, "cpu", "{faster:?}");
    assert_eq!(faster.last().unwrap().side, "gpu0", "{faster:?}");
    let from = faster.last().unwrap().from_size;
    assert!((1 << 16..=1 << 18).contains(&from), "{faster:?}");
}

#[test]
fn a_size_class_a_side_never_ran_is_explored_once_at_a_time() {
    let p = placement(1_000_000);
    p.observed(job(1 << 10), Side::Cpu, 0.0001);
    p.observed(job(1 << 10), GPU, 0.0002);
    // 2^16: neither side ran it; the device, predicted slower but within 4× of the
    // CPU, is sent one job to measure it.
    let first = p.choose(job(1 << 16), 1 << 12, &[0]);
    assert_eq!((first.side, first.reason), (GPU, Reason::Explored));
    // Not a second while that one runs.
    let second = p.choose(job(1 << 16), 1 << 12, &[0]);
    assert_eq!((second.side, second.reason), (Side::Cpu, Reason::Measured));
    // Measured at last: faster than predicted, it wins the class.
    p.finished(job(1 << 16), &first, Some((GPU, 0.001)));
    p.observed(job(1 << 16), Side::Cpu, 0.0064);
    let third = p.choose(job(1 << 16), 1 << 12, &[0]);
    assert_eq!((third.side, third.reason), (GPU, Reason::Measured));
}

#[test]
fn a_side_predicted_far_slower_is_not_explored_at_a_new_size() {
    let p = placement(1_000_000);
    p.observed(job(1 << 10), Side::Cpu, 0.0001);
    p.observed(job(1 << 10), GPU, 0.01);
    p.observed(job(1 << 16), Side::Cpu, 0.0064);
    // 2^16 on the device is predicted 100× slower: never sent there to look.
    for d in run(&p, 1 << 16, 50, |s| if s == GPU { 0.64 } else { 0.0064 }) {
        assert_eq!(d.side, Side::Cpu, "{d:?}");
    }
}

#[test]
fn a_device_made_slower_loses_its_work_within_a_few_jobs_and_wins_it_back() {
    let p = placement(4);
    let n = 1 << 16;
    p.observed(job(n), Side::Cpu, 0.010);
    p.observed(job(n), GPU, 0.004);
    let slow = std::cell::Cell::new(false);
    let cost = |s: Side| match s {
        Side::Cpu => 0.010,
        Side::Device(_) if slow.get() => 0.030,
        Side::Device(_) => 0.004,
    };
    // The CPU, 2.5× slower, gets only the explorations: one job in 4.
    let before = run(&p, n, 8, cost);
    assert!(
        sides(&before, Reason::Measured).iter().all(|&s| s == GPU),
        "{before:?}"
    );
    assert!(sides(&before, Reason::Explored).len() <= 2, "{before:?}");
    slow.set(true);
    let during = run(&p, n, 24, cost);
    let measured = sides(&during, Reason::Measured);
    let moved = measured.iter().position(|&s| s == Side::Cpu).unwrap();
    assert!(
        moved <= 4,
        "the device kept the work for {moved} jobs: {during:?}"
    );
    assert!(
        measured[moved..].iter().all(|&s| s == Side::Cpu),
        "{during:?}"
    );
    slow.set(false);
    // Recovered: the explorations find it fast again, and it takes the work back.
    let after = run(&p, n, 40, cost);
    let measured = sides(&after, Reason::Measured);
    let back = measured
        .iter()
        .position(|&s| s == GPU)
        .expect("the device wins back");
    assert!(back < 30, "{after:?}");
    assert!(measured[back..].iter().all(|&s| s == GPU), "{after:?}");
}

#[test]
fn a_saturated_cpu_sends_work_to_a_device_that_loses_on_an_idle_host() {
    let p = placement(1_000_000);
    let n = 1 << 16;
    p.observed(job(n), Side::Cpu, 0.010);
    p.observed(job(n), GPU, 0.025);
    assert_eq!(p.choose(job(n), 1, &[0]).side, Side::Cpu);
    // Two CPU jobs placed and not finished: 20 ms of backlog, so a third would finish
    // at 30 ms there against 25 on the device.
    let queued: Vec<Decision> = (0..2)
        .map(|_| {
            let d = p.choose(job(n), 1, &[0]);
            assert_eq!(d.side, Side::Cpu);
            p.started(&d);
            d
        })
        .collect();
    assert!((p.backlog(Side::Cpu) - 0.020).abs() < 1e-9);
    let d = p.choose(job(n), 1, &[0]);
    assert_eq!((d.side, d.reason), (GPU, Reason::Measured));
    for q in &queued {
        p.finished(job(n), q, None);
    }
    assert_eq!(p.backlog(Side::Cpu), 0.0);
    assert_eq!(p.choose(job(n), 1, &[0]).side, Side::Cpu);
}

#[test]
fn noise_within_a_tenth_does_not_move_a_class() {
    let p = placement(1_000_000);
    let n = 1 << 16;
    p.observed(job(n), Side::Cpu, 0.010);
    p.observed(job(n), GPU, 0.0099);
    assert_eq!(p.choose(job(n), 1, &[0]).side, GPU);
    // The CPU now reads 5 % faster than the device: the device keeps the class...
    p.observed(job(n), Side::Cpu, 0.0085);
    let d = p.choose(job(n), 1, &[0]);
    assert_eq!((d.side, d.reason), (GPU, Reason::Measured));
    // ...until the CPU is clearly faster.
    for _ in 0..3 {
        p.observed(job(n), Side::Cpu, 0.006);
    }
    assert_eq!(p.choose(job(n), 1, &[0]).side, Side::Cpu);
}

#[test]
fn a_device_on_the_hosts_own_cores_shares_the_cpus_backlog() {
    let p = placement(1_000_000);
    p.set_shares_host(0, true);
    let n = 1 << 16;
    p.observed(job(n), Side::Cpu, 0.010);
    p.observed(job(n), GPU, 0.025);
    for _ in 0..5 {
        let d = p.choose(job(n), 1, &[0]);
        p.started(&d);
        // However much waits, the emulated device adds no capacity: the CPU stays faster.
        assert_eq!((d.side, d.reason), (Side::Cpu, Reason::Measured));
    }
}

/// Books `n` jobs of `size` without finishing any; returns the sides they went to.
fn queue(p: &Placement, size: usize, n: usize) -> Vec<Side> {
    (0..n)
        .map(|_| {
            let d = p.choose(job(size), 1, &[0]);
            p.started(&d);
            d.side
        })
        .collect()
}

#[test]
fn a_cpu_pool_that_runs_four_at_once_waits_out_its_backlog_four_at_a_time() {
    let p = Placement::new(PlacementConfig {
        cpu_slots: 4,
        explore_every: 1_000_000,
        ..PlacementConfig::default()
    });
    let n = 1 << 16;
    p.observed(job(n), Side::Cpu, 0.010);
    p.observed(job(n), GPU, 0.015);
    // Counted whole, the CPU's backlog would send the second job to the device (10 ms
    // waiting + 10 > 15); four at a time, the first three wait at most 5 ms.
    assert_eq!(queue(&p, n, 3), [Side::Cpu; 3]);
    let after = queue(&p, n, 4);
    assert!(after.contains(&GPU), "{after:?}");
}

#[test]
fn a_device_on_the_hosts_cores_that_is_faster_per_job_still_runs_one_job_at_a_time() {
    let p = Placement::new(PlacementConfig {
        cpu_slots: 2,
        explore_every: 1_000_000,
        ..PlacementConfig::default()
    });
    p.set_shares_host(0, true);
    let n = 1 << 16;
    p.observed(job(n), Side::Cpu, 0.012);
    p.observed(job(n), GPU, 0.010);
    // Its lease is exclusive: a second job there waits for the first, while the CPU's
    // two workers take one each (counted as one backlog, every job went to the device).
    let sides = queue(&p, n, 8);
    let on_device = sides.iter().filter(|s| **s == GPU).count();
    assert!(sides[0] == GPU && on_device <= 4, "{sides:?}");
}

#[test]
fn of_two_devices_the_one_with_less_backlog_gets_the_job() {
    let p = placement(1_000_000);
    let n = 1 << 20;
    p.observed(job(n), Side::Cpu, 1.0);
    for d in [0, 1] {
        p.observed(job(n), Side::Device(d), 0.1);
    }
    let first = p.choose(job(n), 1, &[0, 1]);
    p.started(&first);
    let second = p.choose(job(n), 1, &[0, 1]);
    assert_ne!(first.side, second.side);
    assert_ne!(second.side, Side::Cpu);
}

/// The committed H200 run (docs/gpu-runs/2026-11-28-h200/check.md), with each case's
/// job (`Job::name`: what the server's placement records it under; a library's case runs
/// the jobs of the op it serves), lane, `Job::size` and input bytes written beside it.
fn h200_rows() -> Vec<(Row, String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture =
        std::fs::read_to_string(root.join("tests/data/placement-replay-h200-2026-11-28.tsv"))
            .unwrap();
    let check =
        std::fs::read_to_string(root.join("docs/gpu-runs/2026-11-28-h200/check.md")).unwrap();
    let rows: Vec<(Row, String, String)> = fixture
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            assert_eq!(c.len(), 9, "{l}");
            let ms = |s: &str| s.parse::<f64>().unwrap() / 1e3;
            let row = Row {
                op: c[1].to_string(),
                lane: c[3].to_string(),
                size: c[4].parse().unwrap(),
                input_bytes: c[5].parse().unwrap(),
                // The report rounds CPU times to 0.1 ms: a 0.0 is under 0.05.
                device_seconds: ms(c[6]),
                cpu_seconds: ms(c[7]).max(0.025e-3),
                held_out: c[2] == "parity",
            };
            (
                row,
                c[2].to_string(),
                format!("| {} | {} | {} |", c[0], c[2], c[8]),
            )
        })
        .collect();
    // Every row is the report's: its op, phase and case, and its times.
    for (row, _, prefix) in &rows {
        let line = check
            .lines()
            .find(|l| {
                l.starts_with(prefix.as_str()) && {
                    let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                    (cells[6].parse::<f64>().unwrap() / 1e3 - row.device_seconds).abs() < 1e-9
                }
            })
            .unwrap_or_else(|| panic!("no row of check.md is {prefix} at {}", row.device_seconds));
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let cpu = cells[8].parse::<f64>().unwrap() / 1e3;
        assert!((cpu.max(0.025e-3) - row.cpu_seconds).abs() < 1e-9, "{line}");
    }
    let parity = rows.iter().filter(|r| r.1 == "parity").count();
    assert_eq!(parity, 82, "the run's 82 parity cases");
    rows
}

#[test]
fn a_replay_of_the_h200_run_picks_the_faster_side_where_they_differ_by_more_than_a_quarter() {
    let rows: Vec<Row> = h200_rows().into_iter().map(|r| r.0).collect();
    let picks = leave_one_out(&rows);
    let decided: Vec<_> = picks
        .iter()
        .filter(|p| ratio(&rows[p.row]) > 1.25)
        .collect();
    let right = decided.iter().filter(|p| p.right(&rows[p.row])).count();
    let misses: Vec<String> = decided
        .iter()
        .filter(|p| !p.right(&rows[p.row]))
        .map(|p| {
            let r = &rows[p.row];
            format!(
                "{} {} 2^{:.1}: device {:.1} ms, CPU {:.1} ms, picked {} on {:?}",
                r.op,
                r.lane,
                (r.size as f64).log2(),
                r.device_seconds * 1e3,
                r.cpu_seconds * 1e3,
                if p.device { "device" } else { "CPU" },
                p.basis
            )
        })
        .collect();
    let share = right as f64 / decided.len() as f64;
    eprintln!(
        "replay: {right} of {} right ({:.1} %); misses:\n{}",
        decided.len(),
        share * 100.0,
        misses.join("\n")
    );
    // The old rule sent every one of these to the device.
    let old_right = decided
        .iter()
        .filter(|p| rows[p.row].device_seconds < rows[p.row].cpu_seconds)
        .count();
    assert!(
        right > old_right + 20,
        "{right} against the threshold rule's {old_right}"
    );
    assert!(share >= MIN_REPLAY_SHARE, "{share}: {misses:#?}");
}

/// What the replay must reach (the issue asks 0.90; docs/PERFORMANCE.md says what this
/// model reaches and which cases it misses).
const MIN_REPLAY_SHARE: f64 = 0.90;
