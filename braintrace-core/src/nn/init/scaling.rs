//! brainstate's variance-scaling initialisers and the truncated normal,
//! uniform and identity draws of [`Initializer`].
//!
//! Fans follow brainstate's `_compute_fans(shape, in_axis=-2, out_axis=-1)`:
//! with `rf = prod(shape) / (shape[-2] · shape[-1])` (the receptive field of
//! a convolution kernel `(…, in, out)`), `fan_in = shape[-2] · rf` and
//! `fan_out = shape[-1] · rf`; a rank-1 shape has `fan_in = fan_out =
//! shape[0]`. The variance is `scale / n`, `n` the fan of the mode (the mean
//! of both for `FanAvg`), drawn as
//!
//! * `TruncatedNormal`: a standard normal truncated to `[-2, 2]` times
//!   `√variance / 0.87962566103423978` (the truncated normal's standard
//!   deviation, so the draw has the requested variance);
//! * `Normal`: a standard normal times `√variance`;
//! * `Uniform`: uniform on `[-1, 1)` times `√(3 · variance)`.

use super::Initializer;
use crate::error::{Error, Result};
use crate::random::Rng;

/// The standard deviation of a standard normal truncated to `[-2, 2]`.
pub const TRUNC2_STD: f64 = 0.879_625_661_034_239_8;

/// Which fan divides a variance-scaling initialiser's `scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanMode {
    /// `fan_in`.
    FanIn,
    /// `fan_out`.
    FanOut,
    /// `(fan_in + fan_out) / 2`.
    FanAvg,
}

/// The distribution a variance-scaling initialiser draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    /// Standard normal truncated to `[-2, 2]`, rescaled to unit variance.
    TruncatedNormal,
    /// Normal.
    Normal,
    /// Uniform on `[-√3, √3)` (unit variance).
    Uniform,
}

/// `(fan_in, fan_out)` of `shape` (brainstate's convention).
pub fn fans(shape: &[usize]) -> (f64, f64) {
    match shape.len() {
        0 => (1.0, 1.0),
        1 => (shape[0] as f64, shape[0] as f64),
        n => {
            let (i, o) = (shape[n - 2] as f64, shape[n - 1] as f64);
            let rf: f64 = shape[..n - 2].iter().map(|&d| d as f64).product();
            (i * rf, o * rf)
        }
    }
}

impl Initializer {
    /// brainstate's `XavierNormal`: scale 1, `FanAvg`, truncated normal.
    pub fn xavier_normal() -> Self {
        Self::vs(1.0, FanMode::FanAvg, Distribution::TruncatedNormal)
    }
    /// brainstate's `XavierUniform`: scale 1, `FanAvg`, uniform.
    pub fn xavier_uniform() -> Self {
        Self::vs(1.0, FanMode::FanAvg, Distribution::Uniform)
    }
    /// brainstate's `KaimingUniform`: scale 2, `FanIn`, uniform.
    pub fn kaiming_uniform() -> Self {
        Self::vs(2.0, FanMode::FanIn, Distribution::Uniform)
    }
    /// brainstate's `KaimingNormal` (scale 2, `FanIn`, *truncated* normal;
    /// [`Initializer::kaiming_normal`] is today's untruncated form that
    /// `Linear` uses).
    pub fn kaiming_truncated_normal() -> Self {
        Self::vs(2.0, FanMode::FanIn, Distribution::TruncatedNormal)
    }
    /// brainstate's `LecunNormal`: scale 1, `FanIn`, truncated normal.
    pub fn lecun_normal() -> Self {
        Self::vs(1.0, FanMode::FanIn, Distribution::TruncatedNormal)
    }
    /// brainstate's `LecunUniform`: scale 1, `FanIn`, uniform.
    pub fn lecun_uniform() -> Self {
        Self::vs(1.0, FanMode::FanIn, Distribution::Uniform)
    }
    /// brainstate's `TruncatedNormal` defaults: `N(0, 1)` in `[-2, 2]`.
    pub fn truncated_normal() -> Self {
        Initializer::TruncatedNormal {
            mean: 0.0,
            std: 1.0,
            lower: -2.0,
            upper: 2.0,
        }
    }
    /// brainstate's `Uniform` defaults: `[0, 1)`.
    pub fn uniform() -> Self {
        Initializer::Uniform { min: 0.0, max: 1.0 }
    }
    /// brainstate's `Identity` default: ones on the diagonal.
    pub fn identity() -> Self {
        Initializer::Identity { value: 1.0 }
    }
    fn vs(scale: f64, mode: FanMode, distribution: Distribution) -> Self {
        Initializer::VarianceScaling {
            scale,
            mode,
            distribution,
        }
    }
}

/// `N(0, 1)` truncated to `[a, b]` by rejection (the caller checks that the
/// interval holds enough mass).
fn trunc_std_normal(a: f64, b: f64, rng: &mut Rng) -> f64 {
    loop {
        let z = rng.normal();
        if z >= a && z <= b {
            return z;
        }
    }
}

/// `Φ(z)`, the standard normal's distribution function.
fn norm_cdf(z: f64) -> f64 {
    0.5 * (1.0 + crate::ops::elementwise::erf_f64(z / std::f64::consts::SQRT_2))
}

/// Draw the `n` values of `how` for `shape` into `data` (the variants not
/// drawn in `init.rs`).
pub(super) fn draw_into(
    how: &Initializer,
    shape: &[usize],
    n: usize,
    rng: &mut Rng,
    data: &mut Vec<f64>,
) -> Result<()> {
    let op = format!("Initializer::{how:?}");
    let bad = |msg: String| Err(Error::invalid(&op, msg));
    match *how {
        Initializer::VarianceScaling {
            scale,
            mode,
            distribution,
        } => {
            if !(scale.is_finite() && scale > 0.0) {
                return bad(format!("scale must be finite and > 0, got {scale}"));
            }
            let (fi, fo) = fans(shape);
            let denom = match mode {
                FanMode::FanIn => fi,
                FanMode::FanOut => fo,
                FanMode::FanAvg => (fi + fo) / 2.0,
            }
            .max(1.0);
            let var = scale / denom;
            match distribution {
                Distribution::TruncatedNormal => {
                    let sd = var.sqrt() / TRUNC2_STD;
                    data.extend((0..n).map(|_| sd * trunc_std_normal(-2.0, 2.0, rng)));
                }
                Distribution::Normal => {
                    let sd = var.sqrt();
                    data.extend((0..n).map(|_| sd * rng.normal()));
                }
                Distribution::Uniform => {
                    let h = (3.0 * var).sqrt();
                    data.extend((0..n).map(|_| h * (2.0 * rng.uniform() - 1.0)));
                }
            }
        }
        Initializer::TruncatedNormal {
            mean,
            std,
            lower,
            upper,
        } => {
            if !(std.is_finite() && std > 0.0 && mean.is_finite()) {
                return bad(format!(
                    "std must be finite and > 0 (got {std}), mean finite (got {mean})"
                ));
            }
            if lower.partial_cmp(&upper) != Some(std::cmp::Ordering::Less) {
                return bad(format!("lower {lower} must be below upper {upper}"));
            }
            let (a, b) = ((lower - mean) / std, (upper - mean) / std);
            let mass = norm_cdf(b) - norm_cdf(a);
            if mass.is_nan() || mass < 1e-3 {
                return bad(format!(
                    "[{lower}, {upper}] holds {mass:e} of N({mean}, {std}²): too little to draw from"
                ));
            }
            data.extend((0..n).map(|_| mean + std * trunc_std_normal(a, b, rng)));
        }
        Initializer::Uniform { min, max } => {
            if !(min.is_finite() && max.is_finite() && min <= max) {
                return bad(format!("needs finite min <= max, got [{min}, {max})"));
            }
            data.extend((0..n).map(|_| min + (max - min) * rng.uniform()));
        }
        Initializer::Identity { value } => {
            if shape.len() != 2 {
                return Err(Error::shapes(
                    &op,
                    [shape],
                    "the identity initialiser needs a rank-2 shape",
                ));
            }
            let cols = shape[1];
            data.extend((0..n).map(|i| if i / cols == i % cols { value } else { 0.0 }));
        }
        _ => unreachable!("drawn in init.rs"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn draw(how: Initializer, shape: &[usize], seed: u64) -> Vec<f64> {
        how.draw(shape, DType::F64, &mut Rng::seed(seed))
            .unwrap()
            .to_vec_f64()
            .unwrap()
    }

    fn mean_var(v: &[f64]) -> (f64, f64) {
        let n = v.len() as f64;
        let m = v.iter().sum::<f64>() / n;
        (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
    }

    /// For `N` draws the sample mean's standard error is `σ/√N` and the
    /// sample variance's about `σ²√(2/N)` (normal; smaller for the
    /// uniform and truncated ones): 5 standard errors is the tolerance.
    fn check_moments(v: &[f64], mean: f64, var: f64) {
        let (m, s2) = mean_var(v);
        let n = v.len() as f64;
        assert!(
            (m - mean).abs() < 5.0 * (var / n).sqrt(),
            "mean {m} vs {mean}"
        );
        assert!(
            (s2 - var).abs() < 5.0 * var * (2.0 / n).sqrt(),
            "variance {s2} vs {var}"
        );
    }

    #[test]
    fn fans_follow_brainstate() {
        assert_eq!(fans(&[3, 5]), (3.0, 5.0));
        // A conv kernel (kh, kw, in, out): receptive field 3·3.
        assert_eq!(fans(&[3, 3, 4, 8]), (36.0, 72.0));
        assert_eq!(fans(&[7]), (7.0, 7.0));
    }

    #[test]
    fn variance_scaling_moments_and_formula() {
        let shape = [3, 3, 40, 60]; // fan_in 360, fan_out 540
        let (fi, fo) = (360.0, 540.0);
        let cases = [
            (Initializer::xavier_normal(), 2.0 / (fi + fo)),
            (Initializer::xavier_uniform(), 2.0 / (fi + fo)),
            (Initializer::kaiming_uniform(), 2.0 / fi),
            (Initializer::kaiming_truncated_normal(), 2.0 / fi),
            (Initializer::lecun_normal(), 1.0 / fi),
            (Initializer::lecun_uniform(), 1.0 / fi),
        ];
        for (i, (how, var)) in cases.into_iter().enumerate() {
            let v = draw(how, &shape, 10 + i as u64);
            check_moments(&v, 0.0, var);
            // Support: uniform within √(3 var), truncated within 2 sd.
            let bound = match how {
                Initializer::VarianceScaling {
                    distribution: Distribution::Uniform,
                    ..
                } => (3.0 * var).sqrt(),
                _ => 2.0 * var.sqrt() / TRUNC2_STD,
            };
            let worst = v.iter().fold(0.0f64, |a, x| a.max(x.abs()));
            assert!(worst <= bound, "{how:?}: {worst} > {bound}");
            // ... and reaches close to it (not a narrower law).
            assert!(worst > 0.97 * bound, "{how:?}: {worst} vs {bound}");
        }
    }

    #[test]
    fn truncated_normal_respects_bounds_and_moments() {
        let how = Initializer::TruncatedNormal {
            mean: 1.0,
            std: 2.0,
            lower: 0.0,
            upper: 3.0,
        };
        let v = draw(how, &[200_000], 3);
        assert!(v.iter().all(|&x| (0.0..=3.0).contains(&x)));
        // Moments of N(1, 4) truncated to [0, 3], i.e. a = -0.5, b = 1:
        // mean = μ + σ (φ(a) − φ(b)) / Z, var = σ² (1 + (aφ(a) − bφ(b))/Z
        // − ((φ(a) − φ(b))/Z)²).
        let phi = |z: f64| (-z * z / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let (a, b) = (-0.5, 1.0);
        let z = norm_cdf(b) - norm_cdf(a);
        let d = (phi(a) - phi(b)) / z;
        let mean = 1.0 + 2.0 * d;
        let var = 4.0 * (1.0 + (a * phi(a) - b * phi(b)) / z - d * d);
        check_moments(&v, mean, var);
        // Defaults: [-2, 2] standard, variance TRUNC2_STD².
        let v = draw(Initializer::truncated_normal(), &[200_000], 4);
        assert!(v.iter().all(|&x| x.abs() <= 2.0));
        check_moments(&v, 0.0, TRUNC2_STD * TRUNC2_STD);
    }

    #[test]
    fn uniform_and_identity() {
        let v = draw(
            Initializer::Uniform {
                min: -1.0,
                max: 3.0,
            },
            &[100_000],
            5,
        );
        assert!(v.iter().all(|&x| (-1.0..3.0).contains(&x)));
        check_moments(&v, 1.0, 16.0 / 12.0);
        let v = draw(Initializer::Identity { value: 2.5 }, &[2, 3], 0);
        assert_eq!(v, vec![2.5, 0.0, 0.0, 0.0, 2.5, 0.0]);
        let v = draw(Initializer::identity(), &[3, 2], 0);
        assert_eq!(v, vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn bad_hyperparameters_are_errors() {
        let mut r = Rng::seed(0);
        let bad = [
            Initializer::Identity { value: 1.0 },
            Initializer::TruncatedNormal {
                mean: 0.0,
                std: 1.0,
                lower: 1.0,
                upper: 0.0,
            },
            Initializer::TruncatedNormal {
                mean: 0.0,
                std: 1.0,
                lower: 30.0,
                upper: 31.0,
            },
            Initializer::TruncatedNormal {
                mean: 0.0,
                std: 0.0,
                lower: -1.0,
                upper: 1.0,
            },
            Initializer::Uniform { min: 1.0, max: 0.0 },
            Initializer::VarianceScaling {
                scale: -1.0,
                mode: FanMode::FanIn,
                distribution: Distribution::Normal,
            },
        ];
        for how in bad {
            let e = how.draw(&[4], DType::F64, &mut r).unwrap_err();
            assert!(e.to_string().contains("Initializer"), "{how:?}: {e}");
        }
    }
}
