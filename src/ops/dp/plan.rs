//! Noise plans: the power-of-two grid values are snapped to, the integer noise scale on
//! that grid, and the sensitivity the snapping leaves, so the privacy claimed is the
//! privacy of the exact discrete mechanism that runs.

use super::accountant;
use crate::ops::invalid::Invalid;

/// Snapping may add at most this fraction to the sensitivity; calibration accounts for it.
pub const GRID_SLACK: f64 = 1.0 / 1024.0;
/// The grid is at most this fraction of the noise scale, so rounding the integer scale up
/// adds at most about 1e-6 of it.
const RESOLUTION: f64 = 1.0 / 1_048_576.0;
/// Discrete Gaussian scales are kept below 2^31 grid steps (t and c fit 32 bits, so the
/// sampler's arithmetic stays inside 128 bits).
const MAX_GAUSSIAN_STEPS: f64 = 2_147_483_648.0;
/// Discrete Laplace scales are kept below 2^50 grid steps.
const MAX_LAPLACE_STEPS: f64 = 1_125_899_906_842_624.0;
/// Snapped values must fit an i64 with room for the noise.
pub const MAX_SNAPPED: f64 = 4_611_686_018_427_387_904.0; // 2^62

/// The largest power of two at most `x`, for x in a sane range.
fn pow2_at_most(x: f64) -> Option<f64> {
    if !(x.is_finite() && x > 0.0) {
        return None;
    }
    let mut e = x.log2().floor() as i32;
    if !(-1000..=1000).contains(&e) {
        return None;
    }
    while 2f64.powi(e) > x {
        e -= 1;
    }
    while 2f64.powi(e + 1) <= x {
        e += 1;
    }
    Some(2f64.powi(e))
}

/// Discrete Gaussian noise N_Z(0, t·c) in units of `grid`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GaussianPlan {
    pub grid: f64,
    pub t: u64,
    pub c: u64,
}

impl GaussianPlan {
    /// Noise with standard deviation at least `sigma`, on a grid no coarser than
    /// `max_grid` or sigma/2^20.
    pub fn new(sigma: f64, max_grid: f64) -> Result<Self, String> {
        let grid = pow2_at_most((sigma * RESOLUTION).min(max_grid))
            .ok_or_else(|| format!("noise scale {sigma:e} is out of the supported range"))?;
        let steps = sigma / grid;
        if steps >= MAX_GAUSSIAN_STEPS {
            return Err(format!(
                "the noise ({sigma:e}) is more than 2^31 grid steps of {grid:e}: lower the noise \
                 or raise the sensitivity, or release fewer values at once"
            ));
        }
        let t = steps.floor() as u64 + 1;
        // t·c >= steps², checked after rounding so float error can only add noise.
        let mut c = (steps * steps / t as f64).ceil() as u64;
        while (t as f64) * (c as f64) < steps * steps * (1.0 + 1e-15) {
            c += 1;
        }
        Ok(Self { grid, t, c })
    }

    /// The standard deviation of the noise that is actually added.
    pub fn sigma(&self) -> f64 {
        ((self.t as f64) * (self.c as f64)).sqrt() * self.grid
    }
}

/// Discrete Laplace noise with scale `t` grid steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaplacePlan {
    pub grid: f64,
    pub t: u64,
}

impl LaplacePlan {
    pub fn new(scale: f64, max_grid: f64) -> Result<Self, String> {
        let grid = pow2_at_most((scale * RESOLUTION).min(max_grid))
            .ok_or_else(|| format!("noise scale {scale:e} is out of the supported range"))?;
        let steps = scale / grid;
        if steps >= MAX_LAPLACE_STEPS {
            return Err(format!(
                "the noise ({scale:e}) is more than 2^50 grid steps of {grid:e}: raise epsilon \
                 or release fewer values at once"
            ));
        }
        Ok(Self {
            grid,
            t: (steps.ceil() as u64).max(1),
        })
    }

    pub fn scale(&self) -> f64 {
        self.t as f64 * self.grid
    }
}

/// The value snapped to the grid (ties to even), as the kernels do.
pub fn snap(x: f64, grid: f64) -> i64 {
    (x * (1.0 / grid)).round_ties_even() as i64
}

/// What one Gaussian release costs, for a given δ, and the plan that achieves it.
#[derive(Clone, Debug)]
pub struct GaussianCalibration {
    pub plan: GaussianPlan,
    /// L2 sensitivity after snapping: the given one plus sqrt(n) grid steps.
    pub sensitivity: f64,
    pub epsilon: f64,
}

/// The least noise that makes one release of `n` values with L2 `sensitivity`
/// (ε, δ)-DP, by RDP over `accountant::budget_orders()`.
pub fn calibrate_gaussian(
    n: usize,
    sensitivity: f64,
    epsilon: f64,
    delta: f64,
) -> Result<GaussianCalibration, Invalid> {
    let orders = accountant::budget_orders();
    let sigma =
        accountant::gaussian_sigma(sensitivity * (1.0 + GRID_SLACK), epsilon, delta, &orders)
            .ok_or_else(|| {
                Invalid::field(
                    "epsilon",
                    format!(
                "no amount of noise reaches epsilon {epsilon} at delta {delta}; raise one of them"
            ),
                )
            })?;
    let root_n = (n.max(1) as f64).sqrt();
    let plan = GaussianPlan::new(sigma, sensitivity * GRID_SLACK / root_n)
        .map_err(|m| Invalid::field("epsilon", m))?;
    let snapped = sensitivity + root_n * plan.grid;
    let rdp: Vec<f64> = orders
        .iter()
        .map(|&a| accountant::gaussian_rdp(a, snapped, plan.sigma()))
        .collect();
    Ok(GaussianCalibration {
        plan,
        sensitivity: snapped,
        epsilon: accountant::epsilon_from_rdp(&orders, &rdp, delta).0,
    })
}

impl GaussianCalibration {
    /// The release's RDP at each order.
    pub fn rdp(&self) -> impl Fn(&[f64]) -> Vec<f64> + Send + 'static {
        let (sensitivity, sigma) = (self.sensitivity, self.plan.sigma());
        move |orders| {
            orders
                .iter()
                .map(|&a| accountant::gaussian_rdp(a, sensitivity, sigma))
                .collect()
        }
    }
}

#[derive(Clone, Debug)]
pub struct LaplaceCalibration {
    pub plan: LaplacePlan,
    /// L1 sensitivity after snapping: the given one plus n grid steps.
    pub sensitivity: f64,
    pub epsilon: f64,
}

/// The least noise that makes one release of `n` values with L1 `sensitivity` ε-DP.
pub fn calibrate_laplace(
    n: usize,
    sensitivity: f64,
    epsilon: f64,
) -> Result<LaplaceCalibration, Invalid> {
    let n = n.max(1) as f64;
    let plan = LaplacePlan::new(
        sensitivity * (1.0 + GRID_SLACK) / epsilon,
        sensitivity * GRID_SLACK / n,
    )
    .map_err(|m| Invalid::field("epsilon", m))?;
    let snapped = sensitivity + n * plan.grid;
    Ok(LaplaceCalibration {
        plan,
        sensitivity: snapped,
        epsilon: snapped / plan.scale(),
    })
}

impl LaplaceCalibration {
    /// The release's RDP at each order: that of an ε-DP mechanism.
    pub fn rdp(&self) -> impl Fn(&[f64]) -> Vec<f64> + Send + 'static {
        let epsilon = self.epsilon;
        move |orders| {
            orders
                .iter()
                .map(|&a| accountant::pure_dp_rdp(a, epsilon))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_powers_of_two_within_bounds() {
        for x in [1e-9, 0.3, 1.0, 3.0, 1024.5, 7e12] {
            let g = pow2_at_most(x).unwrap();
            assert!(g <= x && 2.0 * g > x && g.log2().fract() == 0.0, "{x}");
        }
        assert!(pow2_at_most(0.0).is_none() && pow2_at_most(f64::NAN).is_none());
    }

    #[test]
    fn plans_never_add_less_noise_than_asked() {
        for sigma in [1e-3, 0.7, 1.0, 12.5, 4e6] {
            let p = GaussianPlan::new(sigma, f64::INFINITY).unwrap();
            assert!(
                p.sigma() >= sigma && p.sigma() <= sigma * (1.0 + 1e-5),
                "{sigma} {p:?}"
            );
            let l = LaplacePlan::new(sigma, f64::INFINITY).unwrap();
            assert!(l.scale() >= sigma && l.scale() <= sigma * (1.0 + 1e-5));
        }
    }

    #[test]
    fn calibrations_deliver_at_most_the_epsilon_asked_and_close_to_it() {
        for n in [1, 1000, 1 << 20] {
            let g = calibrate_gaussian(n, 1.0, 1.0, 1e-5).unwrap();
            assert!(g.epsilon <= 1.0 && g.epsilon > 0.99, "{n}: {g:?}");
            assert!(g.sensitivity <= 1.0 + GRID_SLACK);
            let l = calibrate_laplace(n, 2.0, 0.5).unwrap();
            assert!(l.epsilon <= 0.5 && l.epsilon > 0.499, "{n}: {l:?}");
        }
    }

    #[test]
    fn impossible_precision_is_refused_not_wrapped() {
        // ε tiny and n huge: the noise would need more than 2^31 grid steps.
        assert!(calibrate_gaussian(1 << 24, 1.0, 1e-4, 1e-9).is_err());
        assert!(calibrate_laplace(1 << 24, 1.0, 1e-9).is_err());
    }
}
