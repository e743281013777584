use super::geometry::{dft_codebook, phasor, spatial};
use super::self_test::{array, spec, sweep};
use super::*;
use crate::backend::Job;
use crate::ops::linalg::Dtype;
use crate::ops::rf::noise::Noise;
use crate::ops::rf::rng::Stream;

/// Unit-norm steering vector of `a` toward (azimuth, elevation) in degrees, written from
/// the definition: element (row, column) at e^{jπ(column·sin φ cos θ + row·sin θ)}/√N.
fn steering(a: Array, az: f64, el: f64) -> Vec<(f64, f64)> {
    let (az, el) = (az.to_radians(), el.to_radians());
    let n = a.elements() as f64;
    (0..a.rows)
        .flat_map(|row| (0..a.columns).map(move |col| (row, col)))
        .map(|(row, col)| {
            let x =
                std::f64::consts::PI * (col as f64 * az.sin() * el.cos() + row as f64 * el.sin());
            (x.cos() / n.sqrt(), x.sin() / n.sqrt())
        })
        .collect()
}

fn mul(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

fn conj(a: (f64, f64)) -> (f64, f64) {
    (a.0, -a.1)
}

#[test]
fn channels_are_the_textbook_sum_over_paths() {
    let s = spec(array(2, 3), array(1, 4), 3, 5);
    let job = ChannelsJob::new(s.clone(), Dtype::F64).unwrap();
    let h = job.run_cpu();
    let (nr, nt) = (4, 6);
    let scale = ((nr * nt) as f64 / 3.0).sqrt();
    for b in 0..5 {
        for i in 0..nr {
            for j in 0..nt {
                let mut want = (0.0, 0.0);
                for p in &job.drawn[b * 3..(b + 1) * 3] {
                    let ar = steering(s.rx, p.arrival_deg.0, p.arrival_deg.1)[i];
                    let at = steering(s.tx, p.departure_deg.0, p.departure_deg.1)[j];
                    let term = mul(mul(p.gain, ar), conj(at));
                    want = (want.0 + scale * term.0, want.1 + scale * term.1);
                }
                let k = 2 * ((b * nr + i) * nt + j);
                assert!(
                    (h[k] - want.0).abs() < 1e-12 && (h[k + 1] - want.1).abs() < 1e-12,
                    "channel {b} ({i}, {j}): {:?} vs {want:?}",
                    (h[k], h[k + 1])
                );
            }
        }
    }
}

#[test]
fn a_channel_is_the_same_whatever_batch_it_came_in() {
    let whole = ChannelsJob::new(spec(array(1, 4), array(1, 2), 4, 10), Dtype::F32).unwrap();
    let mut part = spec(array(1, 4), array(1, 2), 4, 3);
    part.first = 3 + 4;
    let part = ChannelsJob::new(part, Dtype::F32).unwrap();
    let per = 2 * 8;
    assert_eq!(part.run_cpu(), whole.run_cpu()[4 * per..7 * per]);
    assert_eq!(part.drawn, whole.drawn[4 * 4..7 * 4]);
    let mut other = spec(array(1, 4), array(1, 2), 4, 10);
    other.seed += 1;
    let other = ChannelsJob::new(other, Dtype::F32).unwrap();
    assert_ne!(other.drawn[0], whole.drawn[0]);
}

#[test]
fn draws_cover_their_ranges_and_the_channels_have_unit_mean_power_per_entry() {
    let mut s = spec(array(2, 4), array(1, 4), 6, 4000);
    s.azimuth_deg = (-30.0, 45.0);
    s.elevation_deg = (0.0, 10.0);
    let job = ChannelsJob::new(s, Dtype::F64).unwrap();
    for p in &job.drawn {
        for (az, el) in [p.departure_deg, p.arrival_deg] {
            assert!((-30.0..=45.0).contains(&az) && (0.0..=10.0).contains(&el));
        }
    }
    let az: Vec<f64> = job.drawn.iter().map(|p| p.departure_deg.0).collect();
    let mean = az.iter().sum::<f64>() / az.len() as f64;
    assert!((mean - 7.5).abs() < 0.6, "mean azimuth {mean}");
    let gain2 = job
        .drawn
        .iter()
        .map(|p| p.gain.0 * p.gain.0 + p.gain.1 * p.gain.1)
        .sum::<f64>()
        / job.drawn.len() as f64;
    assert!((gain2 - 1.0).abs() < 0.03, "E|α|² {gain2}");
    // E‖H‖²_F = N_r·N_t: mean |H_ij|² is 1.
    let h = job.run_cpu();
    let power = h.iter().map(|x| x * x).sum::<f64>() / (h.len() / 2) as f64;
    assert!((power - 1.0).abs() < 0.05, "mean |H_ij|² {power}");
}

#[test]
fn dft_codebooks_are_unitary_without_oversampling() {
    for a in [array(1, 8), array(2, 4), array(4, 1)] {
        let book = dft_codebook(a, 1);
        let n = a.elements();
        assert_eq!(book.len(), 2 * n * n);
        for p in 0..n {
            for q in 0..n {
                let dot = (0..n).fold((0.0, 0.0), |acc, e| {
                    let x = (book[2 * (p * n + e)], book[2 * (p * n + e) + 1]);
                    let y = (book[2 * (q * n + e)], book[2 * (q * n + e) + 1]);
                    let t = mul(conj(x), y);
                    (acc.0 + t.0, acc.1 + t.1)
                });
                let want = if p == q { 1.0 } else { 0.0 };
                assert!(
                    (dot.0 - want).abs() < 1e-12 && dot.1.abs() < 1e-12,
                    "{a:?} {p},{q}"
                );
            }
        }
    }
}

/// One path along codebook directions: the best pair is that pair, with the whole
/// array gain N_r·N_t·|g|², on linear and planar arrays, oversampled or not.
#[test]
fn the_best_pair_of_a_single_on_grid_path_is_known() {
    for (tx, rx, over, kt_pick, kr_pick) in [
        (array(1, 16), array(1, 8), 1, 5usize, 2usize),
        (array(1, 8), array(1, 4), 4, 27, 9),
        (array(4, 4), array(2, 2), 2, 8 * 3 + 6, 4 + 1),
    ] {
        let grid = |n: usize| if n == 1 { 1 } else { n * over };
        let dir = |a: Array, k: usize| {
            let (kr, kc) = (grid(a.rows), grid(a.columns));
            let (ka, kb) = (k / kc, k % kc);
            let v = if kr == 1 {
                0.0
            } else {
                -1.0 + 2.0 * ka as f64 / kr as f64
            };
            (-1.0 + 2.0 * kb as f64 / kc as f64, v)
        };
        let (th, tv) = dir(tx, kt_pick);
        let (rh, rv) = dir(rx, kr_pick);
        let g = (0.6, -0.8);
        let (nr, nt) = (rx.elements(), tx.elements());
        let mut h = Vec::new();
        for i in 0..nr {
            for j in 0..nt {
                let v = mul(
                    mul(g, phasor(rx.phase(i, rh, rv))),
                    conj(phasor(tx.phase(j, th, tv))),
                );
                h.extend([v.0, v.1]);
            }
        }
        let root = crate::ops::FieldPath::root();
        let job = SweepJob::new(
            Channels::Uploaded(h),
            0,
            tx,
            rx,
            Codebook::dft(tx, over, root.clone()).unwrap(),
            Codebook::dft(rx, over, root).unwrap(),
            None,
            true,
            Dtype::F64,
        )
        .unwrap();
        let out = job.run_cpu();
        let best = out.best[0];
        assert_eq!(
            (best.rx, best.tx),
            (kr_pick, kt_pick),
            "{tx:?} {rx:?} ×{over}"
        );
        assert!(
            (best.power - (nr * nt) as f64).abs() < 1e-9,
            "{}",
            best.power
        );
    }
}

#[test]
fn spatial_frequencies_put_a_linear_array_in_its_plane() {
    let (h, v) = spatial(30.0, 0.0);
    assert!((h - 0.5).abs() < 1e-15 && v == 0.0);
    let (h, v) = spatial(90.0, 30.0);
    assert!((h - 0.75f64.sqrt()).abs() < 1e-15 && (v - 0.5).abs() < 1e-15);
}

/// Every power against w_rᴴ(H f_t) + scale·n formed term by term, noise from the stream.
#[test]
fn sweep_powers_are_the_direct_products_with_their_noise() {
    let job = sweep(
        spec(array(1, 6), array(2, 2), 3, 4),
        true,
        2,
        Some(3.0),
        true,
        Dtype::F64,
    );
    let Channels::Uploaded(h) = &job.channels else {
        unreachable!()
    };
    let (nr, nt) = (4, 6);
    let (kr, kt) = (job.rx_book.beams, job.tx_book.beams);
    let (w, f) = (&job.rx_book.values, &job.tx_book.values);
    let keys = job.noise_keys().unwrap();
    let sigma = 10f64.powf(-3.0 / 20.0);
    let out = job.run_cpu();
    let grid = out.grid.as_ref().unwrap();
    for b in 0..4 {
        let noise = Noise(Stream::from_key(keys[b]));
        for r in 0..kr {
            for t in 0..kt {
                let mut g = (0.0, 0.0);
                for i in 0..nr {
                    for j in 0..nt {
                        let hij = (
                            h[2 * ((b * nr + i) * nt + j)],
                            h[2 * ((b * nr + i) * nt + j) + 1],
                        );
                        let wi = (w[2 * (r * nr + i)], w[2 * (r * nr + i) + 1]);
                        let fj = (f[2 * (t * nt + j)], f[2 * (t * nt + j) + 1]);
                        let term = mul(mul(conj(wi), hij), fj);
                        g = (g.0 + term.0, g.1 + term.1);
                    }
                }
                let (nre, nim) = noise.at((r * kt + t) as u64);
                let s = sigma * job.rx_book.norm(r) / 2f64.sqrt();
                let g = (g.0 + s * f64::from(nre), g.1 + s * f64::from(nim));
                let want = g.0 * g.0 + g.1 * g.1;
                let got = grid[(b * kr + r) * kt + t];
                assert!(
                    (got - want).abs() < 1e-10 * want.max(1.0),
                    "{b} {r} {t}: {got} vs {want}"
                );
            }
        }
        let p = &grid[b * kr * kt..][..kr * kt];
        let top = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let at = p.iter().position(|&x| x == top).unwrap();
        assert_eq!((out.best[b].rx, out.best[b].tx), (at / kt, at % kt));
    }
}

/// On a zero channel the measured power is the noise's alone: mean σ²‖w‖² = 10^(−SNR/10).
#[test]
fn noise_has_the_power_its_snr_gives() {
    let rx = array(1, 4);
    let tx = array(1, 4);
    let root = crate::ops::FieldPath::root();
    let job = SweepJob::new(
        Channels::Uploaded(vec![0.0; 2 * 16 * 500]),
        0,
        tx,
        rx,
        Codebook::dft(tx, 2, root.clone()).unwrap(),
        Codebook::dft(rx, 2, root).unwrap(),
        Some(MeasurementNoise {
            snr_db: 10.0,
            seed: 1,
        }),
        true,
        Dtype::F64,
    )
    .unwrap();
    let grid = job.run_cpu().grid.unwrap();
    let mean = grid.iter().sum::<f64>() / grid.len() as f64;
    assert!((mean - 0.1).abs() < 0.003, "mean noise power {mean}");
}

#[test]
fn refusals_name_their_fields() {
    let root = crate::ops::FieldPath::root();
    assert!(Array::new(33, 32, root.clone()).is_err());
    assert!(Array::new(0, 4, root.clone()).is_err());
    let mut s = spec(array(1, 4), array(1, 4), 65, 1);
    let e = ChannelsJob::new(s.clone(), Dtype::F32).unwrap_err();
    assert!(format!("{e:?}").contains("paths"), "{e:?}");
    s.paths = 2;
    s.azimuth_deg = (10.0, -10.0);
    let e = ChannelsJob::new(s, Dtype::F32).unwrap_err();
    assert!(format!("{e:?}").contains("azimuth_deg"), "{e:?}");
    let tx = array(1, 4);
    let big = Codebook::dft(tx, 1, root.clone()).unwrap();
    let e = SweepJob::new(
        Channels::Uploaded(vec![1e30; 2 * 16]),
        0,
        tx,
        tx,
        big.clone(),
        big.clone(),
        None,
        false,
        Dtype::F32,
    )
    .unwrap_err();
    assert!(format!("{e:?}").contains("overflow"), "{e:?}");
    let e = SweepJob::new(
        Channels::Uploaded(vec![1.0; 2 * 15]),
        0,
        tx,
        tx,
        big.clone(),
        big,
        None,
        false,
        Dtype::F32,
    )
    .unwrap_err();
    assert!(format!("{e:?}").contains("channels"), "{e:?}");
    assert!(Codebook::dft(array(32, 32), 2, root.clone()).is_err());
    assert!(Codebook::new(vec![0.0; 10], 4, root).is_err());
}

/// `agrees` passes the CPU against itself and catches a power moved past its tolerance
/// and a best pair pointing elsewhere.
#[test]
fn agreement_catches_wrong_powers_and_pairs() {
    let job = sweep(
        spec(array(1, 8), array(1, 4), 2, 3),
        false,
        1,
        None,
        true,
        Dtype::F32,
    );
    let cpu = job.run_cpu();
    job.agrees(&cpu, &cpu).unwrap();
    let mut wrong = cpu.clone();
    wrong.grid.as_mut().unwrap()[5] *= 1.001;
    assert!(job.agrees(&wrong, &cpu).is_err());
    let mut wrong = cpu.clone();
    wrong.best[1].rx = (wrong.best[1].rx + 1) % 4;
    assert!(job.agrees(&wrong, &cpu).is_err());
    let channels = ChannelsJob::new(spec(array(1, 8), array(1, 4), 2, 3), Dtype::F32).unwrap();
    let h = channels.run_cpu();
    channels.agrees(&h, &h).unwrap();
    let mut bad = h.clone();
    bad[7] += 1e-3;
    assert!(channels.agrees(&bad, &h).is_err());
}

#[test]
fn powers_that_could_overflow_are_refused_for_generated_channels_too() {
    let s = spec(array(1, 2), array(1, 2), 3, 1);
    let job = ChannelsJob::new(s.clone(), Dtype::F64).unwrap();
    let root = crate::ops::FieldPath::root();
    let huge = Codebook::new(vec![1e200, 0.0, 0.0, 1.0], 2, root.clone()).unwrap();
    let e = SweepJob::new(
        Channels::Generated {
            spec: s.clone(),
            drawn: job.drawn,
            words: job.words,
        },
        s.first,
        s.tx,
        s.rx,
        Codebook::dft(s.tx, 1, root.clone()).unwrap(),
        huge,
        None,
        false,
        Dtype::F32,
    )
    .unwrap_err();
    assert!(format!("{e:?}").contains("rx_codebook"), "{e:?}");
}
