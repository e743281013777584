//! Rényi DP accounting for the sampled Gaussian mechanism (Mironov, Talwar & Zhang 2019),
//! computed as TF Privacy's `rdp_accountant` and Opacus do, with the RDP → (ε, δ)
//! conversion of Balle et al. 2020 (Theorem 21). Everything works in log space.

/// Opacus' default orders: 1.1, 1.2, …, 10.9, then 12, 13, …, 63.
pub fn opacus_orders() -> Vec<f64> {
    (1..100)
        .map(|x| 1.0 + f64::from(x) / 10.0)
        .chain((12..64).map(f64::from))
        .collect()
}

/// TF Privacy's `compute_dp_sgd_privacy` orders.
pub fn tf_orders() -> Vec<f64> {
    [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5]
        .into_iter()
        .chain((5..64).map(f64::from))
        .chain([128.0, 256.0, 512.0])
        .collect()
}

/// The orders a privacy budget tracks: Opacus' plus large ones, which strong privacy
/// (small ε, large σ) needs to be converted tightly.
pub fn budget_orders() -> Vec<f64> {
    let mut orders = opacus_orders();
    orders.extend([
        80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 768.0, 1024.0, 1536.0, 2048.0,
        3072.0, 4096.0,
    ]);
    // Only the plain Gaussian uses these (small ε needs α ≈ ln(1/δ)/ε); for subsampled
    // steps they are charged as +∞ (see `sampled_gaussian_rdp_capped`).
    orders.extend((13..=20).map(|k| f64::from(1u32 << k)));
    orders
}

/// Above this order budget charges of subsampled steps count +∞ (a valid bound) instead
/// of paying O(order) terms per step.
pub const SAMPLED_ORDER_CAP: f64 = 4096.0;

/// `sampled_gaussian_rdp` for budgets: +∞ above `SAMPLED_ORDER_CAP` unless q = 1.
pub fn sampled_gaussian_rdp_capped(q: f64, sigma: f64, order: f64) -> f64 {
    if q < 1.0 && order > SAMPLED_ORDER_CAP {
        return f64::INFINITY;
    }
    sampled_gaussian_rdp(q, sigma, order)
}

/// The largest order accepted from a client: integer orders cost O(order) terms.
pub const MAX_ORDER: f64 = 65536.0;

fn log_add(x: f64, y: f64) -> f64 {
    let (a, b) = if x < y { (x, y) } else { (y, x) };
    if a == f64::NEG_INFINITY {
        return b;
    }
    (a - b).exp().ln_1p() + b
}

/// log(exp(x) - exp(y)) for x >= y.
fn log_sub(x: f64, y: f64) -> f64 {
    if y == f64::NEG_INFINITY {
        return x;
    }
    if x == y {
        return f64::NEG_INFINITY;
    }
    (x - y).exp_m1().ln() + y
}

/// ln(erfc(x)), accurate where erfc underflows: the asymptotic series takes over at 20.
fn log_erfc(x: f64) -> f64 {
    if x < 20.0 {
        return libm::erfc(x).ln();
    }
    let x2 = x * x;
    let series = 1.0 - 1.0 / (2.0 * x2) + 3.0 / (4.0 * x2 * x2) - 15.0 / (8.0 * x2 * x2 * x2)
        + 105.0 / (16.0 * x2 * x2 * x2 * x2);
    -x2 - x.ln() - 0.5 * std::f64::consts::PI.ln() + series.ln()
}

fn log_a_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (log_q, log_1q) = (q.ln(), (-q).ln_1p());
    let a = alpha as f64;
    let mut log_a = f64::NEG_INFINITY;
    let mut log_binom = 0.0;
    for i in 0..=alpha {
        let fi = i as f64;
        if i > 0 {
            log_binom += (a - fi + 1.0).ln() - fi.ln();
        }
        let s = log_binom + fi * log_q + (a - fi) * log_1q + (fi * fi - fi) / (2.0 * sigma * sigma);
        log_a = log_add(log_a, s);
    }
    log_a
}

fn log_a_frac(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let (log_q, log_1q) = (q.ln(), (-q).ln_1p());
    let sqrt2_sigma = std::f64::consts::SQRT_2 * sigma;
    let mut coef = 1.0f64;
    let mut i = 0u64;
    loop {
        let fi = i as f64;
        if i > 0 {
            coef *= (alpha - fi + 1.0) / fi;
        }
        let log_coef = coef.abs().ln();
        let j = alpha - fi;
        let log_t0 = log_coef + fi * log_q + j * log_1q;
        let log_t1 = log_coef + j * log_q + fi * log_1q;
        let log_e0 = 0.5f64.ln() + log_erfc((fi - z0) / sqrt2_sigma);
        let log_e1 = 0.5f64.ln() + log_erfc((z0 - j) / sqrt2_sigma);
        let log_s0 = log_t0 + (fi * fi - fi) / (2.0 * sigma * sigma) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * sigma * sigma) + log_e1;
        if coef > 0.0 {
            log_a0 = log_add(log_a0, log_s0);
            log_a1 = log_add(log_a1, log_s1);
        } else {
            log_a0 = log_sub(log_a0, log_s0);
            log_a1 = log_sub(log_a1, log_s1);
        }
        i += 1;
        // Stops on NaN terms too (σ² underflowing to 0): they never fall below the bound.
        let largest = log_s0.max(log_s1);
        if largest.is_nan() || largest < -30.0 || i > 1_000_000 {
            break;
        }
    }
    log_add(log_a0, log_a1)
}

/// RDP at `order` of one step of the Gaussian mechanism with noise multiplier `sigma`
/// applied to a Poisson sample of rate `q`.
pub fn sampled_gaussian_rdp(q: f64, sigma: f64, order: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        return order / (2.0 * sigma * sigma);
    }
    if order.is_infinite() {
        return f64::INFINITY;
    }
    let log_a = if order.fract() == 0.0 {
        log_a_int(q, sigma, order as u64)
    } else {
        log_a_frac(q, sigma, order)
    };
    log_a / (order - 1.0)
}

/// RDP at each order of `steps` compositions.
pub fn sampled_gaussian_rdp_steps(q: f64, sigma: f64, steps: u64, orders: &[f64]) -> Vec<f64> {
    orders
        .iter()
        .map(|&a| sampled_gaussian_rdp(q, sigma, a) * steps as f64)
        .collect()
}

/// RDP of the Gaussian mechanism with L2 sensitivity `sensitivity` and noise `sigma`
/// (continuous or discrete: Canonne, Kamath & Steinke 2020, Proposition 5).
pub fn gaussian_rdp(order: f64, sensitivity: f64, sigma: f64) -> f64 {
    order * sensitivity * sensitivity / (2.0 * sigma * sigma)
}

/// An RDP bound for any ε-DP mechanism: D_α ≤ ε, and ε-DP implies ε²/2-zCDP
/// (Bun & Steinke 2016, Proposition 3.3).
pub fn pure_dp_rdp(order: f64, epsilon: f64) -> f64 {
    epsilon.min(order * epsilon * epsilon / 2.0)
}

/// (ε, optimal order) from RDP values at `orders`, for `delta`.
pub fn epsilon_from_rdp(orders: &[f64], rdp: &[f64], delta: f64) -> (f64, f64) {
    let mut best = (f64::INFINITY, f64::NAN);
    for (&a, &r) in orders.iter().zip(rdp) {
        let eps = r - (delta.ln() + a.ln()) / (a - 1.0) + ((a - 1.0) / a).ln();
        if eps < best.0 {
            best = (eps, a);
        }
    }
    (best.0.max(0.0), best.1)
}

/// ε spent by `steps` DP-SGD steps.
pub fn epsilon(q: f64, sigma: f64, steps: u64, delta: f64, orders: &[f64]) -> (f64, f64) {
    let rdp = sampled_gaussian_rdp_steps(q, sigma, steps, orders);
    epsilon_from_rdp(orders, &rdp, delta)
}

/// Noise multipliers above this are refused as "the budget is too small" (as Opacus).
pub const MAX_NOISE_MULTIPLIER: f64 = 2.0e6;

/// The smallest noise multiplier whose ε after `steps` is at most `target` (to a relative
/// 1e-9), or None when even `MAX_NOISE_MULTIPLIER` does not meet it.
pub fn noise_multiplier(
    target: f64,
    delta: f64,
    q: f64,
    steps: u64,
    orders: &[f64],
) -> Option<(f64, f64)> {
    let eps_at = |sigma: f64| epsilon(q, sigma, steps, delta, orders).0;
    let (mut low, mut high) = (0.0f64, 1.0f64);
    let mut eps_high = eps_at(high);
    while eps_high > target {
        low = high;
        high *= 2.0;
        if high > MAX_NOISE_MULTIPLIER {
            return None;
        }
        eps_high = eps_at(high);
    }
    while high - low > 1e-9 * high {
        let mid = 0.5 * (low + high);
        let eps = eps_at(mid);
        if eps <= target {
            high = mid;
            eps_high = eps;
        } else {
            low = mid;
        }
    }
    Some((high, eps_high))
}

/// The smallest Gaussian noise whose RDP-converted ε for one release is at most `epsilon`,
/// or None when no noise reaches it at these orders (ε too small for δ).
pub fn gaussian_sigma(sensitivity: f64, epsilon: f64, delta: f64, orders: &[f64]) -> Option<f64> {
    let eps_at = |sigma: f64| {
        let rdp: Vec<f64> = orders
            .iter()
            .map(|&a| gaussian_rdp(a, sensitivity, sigma))
            .collect();
        epsilon_from_rdp(orders, &rdp, delta).0
    };
    let (mut low, mut high) = (0.0f64, sensitivity);
    // Doubling stops at 1e12 × the sensitivity, and at the end of the f64 range: past it
    // `high` is infinite, ε(∞) is not below anything, and the loop never ended.
    let ceiling = sensitivity * 1e12;
    if !ceiling.is_finite() {
        return None;
    }
    while eps_at(high) > epsilon {
        low = high;
        high *= 2.0;
        if high > ceiling {
            return None;
        }
    }
    while high - low > 1e-12 * high {
        let mid = 0.5 * (low + high);
        if eps_at(mid) <= epsilon {
            high = mid;
        } else {
            low = mid;
        }
    }
    Some(high)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn gaussian_sigma_gives_up_past_the_f64_range() {
        let orders = budget_orders();
        for sensitivity in [1e300, f64::MAX, f64::INFINITY] {
            assert_eq!(gaussian_sigma(sensitivity, 2.0, 1e-5, &orders), None);
        }
        assert!(gaussian_sigma(1e150, 2.0, 1e-5, &orders).is_some());
    }

    fn vectors() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/dp_accountant_vectors.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn orders(v: &Value) -> Vec<f64> {
        match v {
            Value::String(s) if s == "opacus" => opacus_orders(),
            Value::String(s) if s == "tf" => tf_orders(),
            Value::Array(a) => a.iter().map(|x| x.as_f64().unwrap()).collect(),
            other => panic!("unknown orders {other}"),
        }
    }

    #[test]
    fn published_epsilon_cases() {
        for case in vectors()["epsilon_cases"].as_array().unwrap() {
            let f = |k: &str| case[k].as_f64().unwrap();
            let (eps, order) = epsilon(
                f("sample_rate"),
                f("noise_multiplier"),
                case["steps"].as_u64().unwrap(),
                f("delta"),
                &orders(&case["orders"]),
            );
            let want = f("epsilon");
            let tol = case["tolerance"].as_f64().unwrap_or(1e-6 * want);
            assert!((eps - want).abs() <= tol, "{case}: got {eps}");
            assert_eq!(order, f("optimal_order"), "{case}");
        }
    }

    #[test]
    fn published_rdp_cases() {
        for case in vectors()["rdp_cases"].as_array().unwrap() {
            let f = |k: &str| case[k].as_f64().unwrap();
            let got = sampled_gaussian_rdp_steps(
                f("sample_rate"),
                f("noise_multiplier"),
                case["steps"].as_u64().unwrap(),
                &orders(&case["orders"]),
            );
            for (g, w) in got.iter().zip(case["rdp"].as_array().unwrap()) {
                let w = w.as_f64().unwrap();
                assert!((g - w).abs() <= f("tolerance"), "{case}: got {got:?}");
            }
        }
    }

    #[test]
    fn published_noise_multiplier_cases() {
        for case in vectors()["noise_multiplier_cases"].as_array().unwrap() {
            let f = |k: &str| case[k].as_f64().unwrap();
            let (sigma, eps) = noise_multiplier(
                f("target_epsilon"),
                f("delta"),
                f("sample_rate"),
                case["steps"].as_u64().unwrap(),
                &opacus_orders(),
            )
            .unwrap();
            assert!(
                (sigma - f("noise_multiplier")).abs() <= f("tolerance"),
                "{case}: {sigma}"
            );
            assert!(eps <= f("target_epsilon"));
            // Smallest: a hair less noise overspends.
            let (over, _) = epsilon(
                f("sample_rate"),
                sigma * (1.0 - 1e-6),
                case["steps"].as_u64().unwrap(),
                f("delta"),
                &opacus_orders(),
            );
            assert!(over > f("target_epsilon"));
        }
    }

    #[test]
    fn unreachable_epsilon_is_none_not_a_hang() {
        assert!(gaussian_sigma(1.0, 1e-9, 1e-9, &budget_orders()).is_none());
        assert!(gaussian_sigma(1.0, 1e-3, 1e-9, &budget_orders()).is_some());
    }

    #[test]
    fn full_batch_is_the_plain_gaussian() {
        for a in [1.5, 2.0, 10.0] {
            assert_eq!(sampled_gaussian_rdp(1.0, 2.0, a), a / 8.0);
        }
        assert_eq!(sampled_gaussian_rdp(0.0, 2.0, 3.0), 0.0);
    }

    #[test]
    fn integer_and_fractional_series_agree_near_integers() {
        // The two formulas are different series; at an order a hair off an integer the
        // fractional one must land on the integer one.
        for &(q, s) in &[(0.01, 1.0), (0.1, 2.0), (0.5, 0.8)] {
            for a in [2u64, 5, 17] {
                let int = sampled_gaussian_rdp(q, s, a as f64);
                let frac = sampled_gaussian_rdp(q, s, a as f64 + 1e-9);
                assert!(
                    (int - frac).abs() <= 1e-6 * int.abs().max(1e-12),
                    "{q} {s} {a}"
                );
            }
        }
    }

    #[test]
    fn gaussian_calibration_meets_epsilon_tightly() {
        let orders = budget_orders();
        for &(eps, delta) in &[(0.5, 1e-6), (1.0, 1e-5), (8.0, 1e-5)] {
            let sigma = gaussian_sigma(1.0, eps, delta, &orders).unwrap();
            let at = |s: f64| {
                let rdp: Vec<f64> = orders.iter().map(|&a| gaussian_rdp(a, 1.0, s)).collect();
                epsilon_from_rdp(&orders, &rdp, delta).0
            };
            assert!(at(sigma) <= eps && at(sigma * (1.0 - 1e-9)) > eps * (1.0 - 1e-6));
        }
    }
}
