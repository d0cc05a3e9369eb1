//! Seeded initialisers: Kaiming normal, orthogonal and zeros, as braintrace's
//! layers use them by default; brainstate's variance-scaling family
//! (Xavier, Kaiming uniform, LeCun), truncated normal, uniform and identity.

use crate::error::{Error, Result};
pub use crate::random::Rng;
use crate::tensor::{byte_size, DType, Tensor};

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Initializer {
    /// All zeros.
    Zeros,
    /// A constant.
    Constant(f64),
    /// `N(0, scale / fan_in)` with `fan_in = shape[0]` (braintrace's
    /// `KaimingNormal`: `scale = 2`).
    KaimingNormal {
        /// The variance scale (2 for ReLU-style gain).
        scale: f64,
    },
    /// A (semi-)orthogonal matrix times `scale` (braintrace's `Orthogonal`).
    Orthogonal {
        /// The gain.
        scale: f64,
    },
    /// `N(0, std²)`.
    Normal {
        /// The standard deviation.
        std: f64,
    },
    /// brainstate's `VarianceScaling`: variance `scale / n` with `n` the fan
    /// chosen by `mode`, drawn from `distribution` (see
    /// [`Initializer::xavier_normal`] and its siblings; formulas in
    /// `nn/init/scaling.rs`).
    VarianceScaling {
        /// The variance's numerator.
        scale: f64,
        /// Which fan divides it.
        mode: FanMode,
        /// The distribution drawn from.
        distribution: Distribution,
    },
    /// `N(mean, std²)` truncated to `[lower, upper]` (absolute bounds, as
    /// brainstate's `TruncatedNormal`: `mean 0, std 1, [-2, 2]`).
    TruncatedNormal {
        /// Mean before truncating.
        mean: f64,
        /// Standard deviation before truncating (> 0).
        std: f64,
        /// Lower bound.
        lower: f64,
        /// Upper bound (> lower).
        upper: f64,
    },
    /// Uniform on `[min, max)` (brainstate's `Uniform`: `[0, 1)`).
    Uniform {
        /// Lower limit.
        min: f64,
        /// Upper limit (≥ min).
        max: f64,
    },
    /// `value` on the diagonal of a rank-2 (possibly rectangular) shape,
    /// zeros elsewhere (brainstate's `Identity`: `value = 1`).
    Identity {
        /// The diagonal's value.
        value: f64,
    },
}

mod scaling;

pub use scaling::{Distribution, FanMode};

impl Initializer {
    /// `KaimingNormal { scale: 2 }`, braintrace's default for `Linear`.
    pub fn kaiming_normal() -> Self {
        Initializer::KaimingNormal { scale: 2.0 }
    }
    /// `Orthogonal { scale: 1 }`, braintrace's default for `GRUCell`.
    pub fn orthogonal() -> Self {
        Initializer::Orthogonal { scale: 1.0 }
    }
    /// Draw a tensor of `shape` and `dtype` (errors name `Initializer::draw`;
    /// see [`Initializer::try_draw`]).
    pub fn draw(&self, shape: &[usize], dtype: DType, rng: &mut Rng) -> Result<Tensor> {
        self.try_draw("Initializer::draw", shape, dtype, rng)
    }
    /// Draw a tensor of `shape` and `dtype`, or an [`Error::Allocation`]
    /// naming `op` (a layer and its parameter) when the draw cannot be held
    /// in memory; that is decided before any memory is taken or written.
    pub fn try_draw(
        &self,
        op: &str,
        shape: &[usize],
        dtype: DType,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        // The draw is made in f64 and then cast: the f64 buffer is the
        // larger, and the cast needs room for its result besides.
        let (n, _) = byte_size(op, shape, DType::F64)?;
        byte_size(op, shape, dtype)?;
        let mut data: Vec<f64> = Vec::new();
        data.try_reserve_exact(n)
            .map_err(|_| Error::allocation(op, shape, n, DType::F64.size_bytes()))?;
        match *self {
            Initializer::Zeros => data.resize(n, 0.0),
            Initializer::Constant(c) => data.resize(n, c),
            Initializer::Normal { std } => data.extend((0..n).map(|_| std * rng.normal())),
            Initializer::KaimingNormal { scale } => {
                let fan_in = shape.first().copied().unwrap_or(1).max(1) as f64;
                let std = (scale / fan_in).sqrt();
                data.extend((0..n).map(|_| std * rng.normal()));
            }
            Initializer::Orthogonal { scale } => {
                drop(data);
                data = orthogonal(shape, scale, rng)?;
            }
            other => scaling::draw_into(&other, shape, n, rng, &mut data)?,
        }
        Tensor::from_vec(data, shape)?.cast(dtype)
    }
}

/// Rows of `(prod(shape[..-1]), shape[-1])` made orthonormal (or columns,
/// when there are fewer rows than columns), by Gram–Schmidt on a normal draw
/// with the QR sign convention (`q · sign(diag(r))`).
fn orthogonal(shape: &[usize], scale: f64, rng: &mut Rng) -> Result<Vec<f64>> {
    if shape.len() < 2 {
        return Err(Error::shapes(
            "Initializer::Orthogonal",
            [shape],
            "needs a shape of rank 2 or more",
        ));
    }
    let cols = *shape.last().expect("rank >= 2");
    let rows: usize = shape[..shape.len() - 1].iter().product();
    // Orthonormalise the columns of a tall (m, k) matrix, k <= m.
    let (m, k, transpose) = if rows < cols {
        (cols, rows, true)
    } else {
        (rows, cols, false)
    };
    let mut a: Vec<Vec<f64>> = (0..k)
        .map(|_| (0..m).map(|_| rng.normal()).collect())
        .collect();
    for j in 0..k {
        let (head, tail) = a.split_at_mut(j);
        let aj = &mut tail[0];
        for ai in head.iter() {
            let d = dot(ai, aj);
            for (x, y) in aj.iter_mut().zip(ai) {
                *x -= d * y;
            }
        }
        let norm = dot(aj, aj).sqrt();
        if norm == 0.0 {
            return Err(Error::invalid("Initializer::Orthogonal", "degenerate draw"));
        }
        for x in a[j].iter_mut() {
            *x /= norm;
        }
    }
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[r * cols + c] = scale * if transpose { a[r][c] } else { a[c][r] };
        }
    }
    Ok(out)
}

/// `a · b` summed in 16 interleaved partial sums, so that the loop is
/// vectorised and not one chain of dependent additions (a GRU of hidden
/// 512 orthogonalises 512 columns of 528: 70 M multiply-adds in dots).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    const L: usize = 16;
    let mut acc = [0.0f64; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..L {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f64>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_rows_and_columns_are_orthonormal() {
        // Columns shorter than, longer than and not a multiple of the 16
        // partial sums of `dot`.
        for shape in [[6usize, 4], [3, 7], [37, 21], [20, 45], [64, 64]] {
            let t = Initializer::orthogonal()
                .draw(&shape, DType::F64, &mut Rng::seed(3))
                .unwrap();
            let v = t.to_vec_f64().unwrap();
            let (r, c) = (shape[0], shape[1]);
            // Gram matrix of the smaller side must be the identity.
            let tall = r >= c;
            let (n, len) = if tall { (c, r) } else { (r, c) };
            let at = |i: usize, p: usize| if tall { v[p * c + i] } else { v[i * c + p] };
            for i in 0..n {
                for j in 0..n {
                    let d: f64 = (0..len).map(|p| at(i, p) * at(j, p)).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((d - want).abs() < 1e-12, "{shape:?} gram[{i},{j}] = {d}");
                }
            }
        }
    }

    #[test]
    fn kaiming_normal_has_the_fan_in_variance() {
        let t = Initializer::kaiming_normal()
            .draw(&[200, 300], DType::F64, &mut Rng::seed(1))
            .unwrap();
        let v = t.to_vec_f64().unwrap();
        let var = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
        assert!(
            (var - 2.0 / 200.0).abs() < 0.05 * 2.0 / 200.0,
            "variance {var}"
        );
    }

    #[test]
    fn same_seed_same_draw() {
        let a = Initializer::kaiming_normal()
            .draw(&[4, 5], DType::F32, &mut Rng::seed(9))
            .unwrap();
        let b = Initializer::kaiming_normal()
            .draw(&[4, 5], DType::F32, &mut Rng::seed(9))
            .unwrap();
        assert_eq!(a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    }
}
