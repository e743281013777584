//! DP-SGD planning: from a noise multiplier and per-example clipping (flat, or per layer
//! over consecutive column ranges) to the noise plan of a privatize job, the sensitivity
//! once snapping to the grid is counted, the effective noise multiplier the accountant
//! charges, and the step's RDP curve.

use super::accountant;
use super::noise::NoiseKey;
use super::plan::{self, GaussianPlan, MAX_SNAPPED};
use super::privatize::{Gradients, PrivatizeJob};
use crate::ops::invalid::{FieldPath, Invalid};

/// How per-example gradients are clipped.
#[derive(Clone, Debug, PartialEq)]
pub enum Clipping {
    /// Every example's whole gradient to this L2 norm.
    Flat(f64),
    /// (columns, clip norm) per layer, in column order, covering every column.
    Layers(Vec<(usize, f64)>),
}

/// A validated step: everything a `PrivatizeJob` needs but the gradients and the key.
#[derive(Clone, Debug)]
pub struct SgdPlan {
    /// Layer l covers columns bounds[l]..bounds[l + 1]; bounds[0] = 0, last = cols.
    pub bounds: Vec<u64>,
    pub clip_norms: Vec<f64>,
    pub noise: GaussianPlan,
    /// L2 sensitivity of the snapped sum: ‖C‖ plus what snapping can add.
    pub sensitivity: f64,
    /// σ over the snapped sensitivity: what the accountant charges.
    pub effective_noise_multiplier: f64,
}

fn positive(v: f64, path: FieldPath) -> Result<f64, Invalid> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Invalid::new(path, "must be a finite number greater than 0"))
    }
}

/// The noise multiplier on its own: callers check it before anything else.
pub fn check_noise_multiplier(noise_multiplier: f64) -> Result<f64, Invalid> {
    positive(
        noise_multiplier,
        FieldPath::root().field("noise_multiplier"),
    )
}

impl Clipping {
    /// Every clip norm positive and every layer at least one column wide: checkable
    /// before the gradients are decoded. Returns (columns, clip norm) per layer, `None`
    /// columns for flat clipping (all of them).
    pub fn check(&self) -> Result<Vec<(Option<usize>, f64)>, Invalid> {
        let layer = |i: usize| FieldPath::root().field("layers").index(i);
        match self {
            Clipping::Flat(c) => Ok(vec![(
                None,
                positive(*c, FieldPath::root().field("clip_norm"))?,
            )]),
            Clipping::Layers(l) if l.is_empty() => {
                Err(Invalid::field("layers", "must not be empty"))
            }
            Clipping::Layers(l) => l
                .iter()
                .enumerate()
                .map(|(i, &(columns, clip))| {
                    if columns == 0 {
                        return Err(Invalid::new(
                            layer(i).field("columns"),
                            "must be at least 1",
                        ));
                    }
                    Ok((Some(columns), positive(clip, layer(i).field("clip_norm"))?))
                })
                .collect(),
        }
    }
}

impl SgdPlan {
    /// The plan for a `rows` × `cols` batch. Errors name the field of the spec at fault
    /// (`noise_multiplier`, `clip_norm`, `layers/i/...`).
    pub fn new(
        noise_multiplier: f64,
        clipping: &Clipping,
        rows: usize,
        cols: usize,
    ) -> Result<Self, Invalid> {
        let nm = check_noise_multiplier(noise_multiplier)?;
        let layers: Vec<(usize, f64)> = clipping
            .check()?
            .into_iter()
            .map(|(columns, clip)| (columns.unwrap_or(cols), clip))
            .collect();
        let mut bounds = vec![0u64];
        for (columns, _) in &layers {
            bounds.push(bounds[bounds.len() - 1] + *columns as u64);
        }
        let covered = bounds[bounds.len() - 1];
        if covered != cols as u64 {
            return Err(Invalid::field(
                "layers",
                format!("the layers cover {covered} columns but the gradients have {cols}"),
            ));
        }
        let clip_norms: Vec<f64> = layers.iter().map(|l| l.1).collect();
        let clip_total = clip_norms.iter().map(|c| c * c).sum::<f64>().sqrt();
        let root_d = (cols as f64).sqrt();
        let noise = GaussianPlan::new(nm * clip_total, clip_total * plan::GRID_SLACK / root_d)
            .map_err(|m| Invalid::field("noise_multiplier", m))?;
        let max_clip = clip_norms.iter().copied().fold(0.0, f64::max);
        if rows as f64 * max_clip / noise.grid >= MAX_SNAPPED {
            return Err(Invalid::field(
                "noise_multiplier",
                "too small for this batch: the clipped sum would not fit the noise grid",
            ));
        }
        let sensitivity = clip_total + root_d * noise.grid;
        Ok(Self {
            bounds,
            clip_norms,
            effective_noise_multiplier: noise.sigma() / sensitivity,
            noise,
            sensitivity,
        })
    }

    /// The step's RDP at each order, for a batch Poisson-sampled at rate `q`.
    pub fn rdp(&self, q: f64) -> impl Fn(&[f64]) -> Vec<f64> + Send + 'static {
        let sigma = self.effective_noise_multiplier;
        move |orders| {
            orders
                .iter()
                .map(|&a| accountant::sampled_gaussian_rdp_capped(q, sigma, a))
                .collect()
        }
    }

    /// The job over `gradients` (`rows` × `cols`, as planned), divided by `divisor`.
    pub fn job(
        self,
        gradients: Gradients,
        rows: usize,
        cols: usize,
        divisor: f64,
        key: NoiseKey,
    ) -> PrivatizeJob {
        PrivatizeJob {
            gradients,
            rows,
            cols,
            bounds: self.bounds,
            clip_norms: self.clip_norms,
            plan: self.noise,
            divisor,
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_must_cover_the_columns_and_name_the_bad_one() {
        let layers = Clipping::Layers(vec![(2, 1.0), (0, 1.0)]);
        let e = SgdPlan::new(1.0, &layers, 4, 3).unwrap_err();
        assert_eq!(
            e.path,
            FieldPath::root().field("layers").index(1).field("columns")
        );
        let e = SgdPlan::new(1.0, &Clipping::Layers(vec![(2, 1.0)]), 4, 3).unwrap_err();
        assert_eq!(e.path, FieldPath::root().field("layers"));
        let e = SgdPlan::new(0.0, &Clipping::Flat(1.0), 4, 3).unwrap_err();
        assert_eq!(e.path, FieldPath::root().field("noise_multiplier"));
    }

    #[test]
    fn per_layer_noise_scales_with_the_norm_of_the_clip_norms() {
        let flat = SgdPlan::new(1.0, &Clipping::Flat(5.0), 8, 4).unwrap();
        let layers = SgdPlan::new(1.0, &Clipping::Layers(vec![(1, 3.0), (3, 4.0)]), 8, 4).unwrap();
        assert_eq!(flat.noise.sigma(), layers.noise.sigma());
        assert_eq!(layers.bounds, vec![0, 1, 4]);
        assert!(layers.sensitivity > 5.0 && layers.sensitivity < 5.0 * (1.0 + 1e-3));
        assert!(layers.effective_noise_multiplier < 1.0);
    }
}
