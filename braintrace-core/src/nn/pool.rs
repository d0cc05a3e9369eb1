//! Max and average pooling in 1-D and 2-D, channels last as brainstate's
//! `MaxPool1d`/`MaxPool2d`/`AvgPool1d`/`AvgPool2d` (input `(…, L, C)` or
//! `(…, H, W, C)`, leading axes are batch), with a kernel, a stride
//! (default: the kernel) and zero or more padded positions on each side.
//!
//! A max pool pads with `−∞`; an average pool divides each window by the
//! number of positions that are not padding (brainstate's
//! `window_counts`), which is the window size without padding. A 2-D window
//! is pooled one spatial axis after the other (max and sum are separable),
//! each axis by `kernel` strided slices of the padded input.

use super::layers::layer_op;
use crate::error::{Error, Result};
use crate::learn::{Init, Model, StepCtx};
use crate::tensor::Tensor;

/// Max or average.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The largest entry of each window.
    Max,
    /// The mean of each window's non-padded entries.
    Avg,
}

/// Pooling over the `D` spatial axes just before the channel axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool<const D: usize> {
    /// Max or average.
    pub kind: PoolKind,
    /// Window size per spatial axis.
    pub kernel: [usize; D],
    /// Step between windows per spatial axis.
    pub stride: [usize; D],
    /// Padded positions `(before, after)` per spatial axis.
    pub padding: [(usize, usize); D],
}

/// brainstate's `MaxPool1d`/`AvgPool1d`: input `(…, L, C)`.
pub type Pool1d = Pool<1>;
/// brainstate's `MaxPool2d`/`AvgPool2d`: input `(…, H, W, C)`.
pub type Pool2d = Pool<2>;

impl<const D: usize> Pool<D> {
    /// A pool with `kernel`, stride = kernel and no padding (brainstate's
    /// defaults, `"VALID"`).
    pub fn new(kind: PoolKind, kernel: [usize; D]) -> Self {
        Pool {
            kind,
            kernel,
            stride: kernel,
            padding: [(0, 0); D],
        }
    }
    /// A max pool.
    pub fn max(kernel: [usize; D]) -> Self {
        Self::new(PoolKind::Max, kernel)
    }
    /// An average pool.
    pub fn avg(kernel: [usize; D]) -> Self {
        Self::new(PoolKind::Avg, kernel)
    }
    /// With another stride.
    pub fn with_stride(mut self, stride: [usize; D]) -> Self {
        self.stride = stride;
        self
    }
    /// With `p` padded positions on both sides of every spatial axis.
    pub fn with_padding(mut self, p: usize) -> Self {
        self.padding = [(p, p); D];
        self
    }
    fn name(&self) -> String {
        let k = match self.kind {
            PoolKind::Max => "MaxPool",
            PoolKind::Avg => "AvgPool",
        };
        format!("{k}{D}d")
    }
    /// Check kernel ≥ 1, stride ≥ 1 and padding < kernel (a window of
    /// padding only has no value).
    pub fn validate(&self) -> Result<()> {
        let op = self.name();
        for d in 0..D {
            if self.kernel[d] == 0 || self.stride[d] == 0 {
                return Err(Error::invalid(
                    &op,
                    format!(
                        "kernel {:?} and stride {:?} must be at least 1",
                        self.kernel, self.stride
                    ),
                ));
            }
            let (lo, hi) = self.padding[d];
            if lo >= self.kernel[d] || hi >= self.kernel[d] {
                return Err(Error::invalid(
                    &op,
                    format!(
                        "padding {:?} must be smaller than the kernel {:?}",
                        self.padding, self.kernel
                    ),
                ));
            }
        }
        Ok(())
    }
    /// Pool `x` (`(…, spatial…, C)`).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        self.validate()?;
        let op = self.name();
        let n = x.ndim();
        if n < D + 1 {
            return Err(Error::shapes(
                &op,
                [x.shape()],
                format!("the input needs {D} spatial axes and a channel axis"),
            ));
        }
        let mut y = x.clone();
        let mut count: Option<Tensor> = None;
        for d in 0..D {
            let axis = n - 1 - D + d;
            let (s, c) = pool_axis(&op, &y, axis, self, d)?;
            y = s;
            if let Some(c) = c {
                count = Some(match count {
                    None => c,
                    Some(prev) => prev.mul(&c)?,
                });
            }
        }
        match (self.kind, count) {
            (PoolKind::Avg, Some(c)) => y.div(&c),
            _ => Ok(y),
        }
    }
}

/// Pool `x` along `axis` with the `d`-th kernel of `p`: the pooled tensor
/// and, for an average, the count of non-padded positions per output
/// position (shaped to broadcast along `axis`).
fn pool_axis<const D: usize>(
    op: &str,
    x: &Tensor,
    axis: usize,
    p: &Pool<D>,
    d: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    let (k, s, (lo, hi)) = (p.kernel[d], p.stride[d], p.padding[d]);
    let len = x.shape()[axis];
    let padded = len + lo + hi;
    if padded < k {
        return Err(Error::shapes(
            op,
            [x.shape()],
            format!(
                "spatial axis {axis} of {len} (+{lo}+{hi} padding) is shorter than the kernel {k}"
            ),
        ));
    }
    let out = (padded - k) / s + 1;
    let fill = match p.kind {
        PoolKind::Max => f64::NEG_INFINITY,
        PoolKind::Avg => 0.0,
    };
    let xp = if lo + hi > 0 {
        let side = |m: usize| {
            let mut sh = x.shape().to_vec();
            sh[axis] = m;
            Tensor::full(&sh, fill, x.dtype())
        };
        let mut parts = Vec::new();
        if lo > 0 {
            parts.push(side(lo));
        }
        parts.push(x.clone());
        if hi > 0 {
            parts.push(side(hi));
        }
        crate::ops::concat(&parts, axis)?
    } else {
        x.clone()
    };
    let window = |j: usize| -> Result<Tensor> {
        if s == 1 {
            xp.slice_axis(axis, j, j + out)
        } else {
            let idx: Vec<i64> = (0..out).map(|i| (i * s + j) as i64).collect();
            xp.take(&Tensor::from_vec_typed(idx, &[out])?, axis)
        }
    };
    let mut acc = window(0)?;
    for j in 1..k {
        let w = window(j)?;
        acc = match p.kind {
            PoolKind::Max => acc.maximum(&w)?,
            PoolKind::Avg => acc.add(&w)?,
        };
    }
    let count = match p.kind {
        PoolKind::Max => None,
        PoolKind::Avg => {
            // Non-padded positions of each window, along `axis` only.
            let c: Vec<f64> = (0..out)
                .map(|i| {
                    let start = i * s;
                    (start..start + k)
                        .filter(|&q| q >= lo && q < lo + len)
                        .count() as f64
                })
                .collect();
            let mut shape = vec![1; x.ndim()];
            shape[axis] = out;
            Some(Tensor::from_vec(c, &shape)?.cast(x.dtype())?)
        }
    };
    Ok((acc, count))
}

impl<const D: usize> Model for Pool<D> {
    fn init(&self, _init: &mut Init) -> Result<()> {
        self.validate()
    }
    fn step(&self, _ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
}

/// brainstate's `Flatten` with `in_size` given: the per-sample axes
/// `start_axis ..= end_axis` (negative from the end) of an input whose
/// last `in_rank` axes are per sample (leading axes are batch) merged into
/// one. `Flatten::new(in_rank)` merges all of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Flatten {
    /// The rank of one sample.
    pub in_rank: usize,
    /// First per-sample axis merged.
    pub start_axis: isize,
    /// Last per-sample axis merged.
    pub end_axis: isize,
}

impl Flatten {
    /// Merge all `in_rank` per-sample axes.
    pub fn new(in_rank: usize) -> Self {
        Flatten {
            in_rank,
            start_axis: 0,
            end_axis: -1,
        }
    }
    /// Merge the per-sample axes `start ..= end` only.
    pub fn with_axes(mut self, start: isize, end: isize) -> Self {
        self.start_axis = start;
        self.end_axis = end;
        self
    }
    fn axes(&self) -> Result<(usize, usize)> {
        let r = self.in_rank as isize;
        let at = |a: isize| if a < 0 { a + r } else { a };
        let (s, e) = (at(self.start_axis), at(self.end_axis));
        if self.in_rank == 0 || s < 0 || e >= r || s > e {
            return Err(Error::invalid(
                "Flatten",
                format!(
                    "axes {}..={} must be ordered axes of a sample of rank {} (at least 1)",
                    self.start_axis, self.end_axis, self.in_rank
                ),
            ));
        }
        Ok((s as usize, e as usize))
    }
    /// Flatten `x`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let (s, e) = self.axes()?;
        let n = x.ndim();
        if n < self.in_rank {
            return Err(Error::shapes(
                "Flatten",
                [x.shape()],
                format!("the input must have rank >= {}", self.in_rank),
            ));
        }
        let lead = n - self.in_rank;
        let sh = x.shape();
        let mut out: Vec<usize> = sh[..lead + s].to_vec();
        out.push(sh[lead + s..=lead + e].iter().product());
        out.extend_from_slice(&sh[lead + e + 1..]);
        x.reshape(&out)
    }
}

impl Model for Flatten {
    fn init(&self, _init: &mut Init) -> Result<()> {
        self.axes().map(|_| ())
    }
    fn step(&self, _ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
}

/// brainstate's `Unflatten`: the input's axis `axis` (negative from the
/// end, so batch axes do not move it) split into `sizes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Unflatten {
    /// The axis split.
    pub axis: isize,
    /// Its new sizes (their product must be the axis' length).
    pub sizes: Vec<usize>,
}

impl Unflatten {
    /// Split `axis` into `sizes`.
    pub fn new(axis: isize, sizes: &[usize]) -> Self {
        Unflatten {
            axis,
            sizes: sizes.to_vec(),
        }
    }
    /// Unflatten `x`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let op = layer_op("Unflatten", &format!("{:?}", self.sizes));
        let n = x.ndim() as isize;
        let a = if self.axis < 0 {
            self.axis + n
        } else {
            self.axis
        };
        if a < 0 || a >= n {
            return Err(Error::axis(&op, self.axis, x.shape()));
        }
        let a = a as usize;
        let len = x.shape()[a];
        if self.sizes.iter().product::<usize>() != len || self.sizes.is_empty() {
            return Err(Error::shapes(
                &op,
                [x.shape()],
                format!(
                    "sizes {:?} do not multiply to the {len} entries of axis {}",
                    self.sizes, self.axis
                ),
            ));
        }
        let mut out = x.shape()[..a].to_vec();
        out.extend_from_slice(&self.sizes);
        out.extend_from_slice(&x.shape()[a + 1..]);
        x.reshape(&out)
    }
}

impl Model for Unflatten {
    fn init(&self, _init: &mut Init) -> Result<()> {
        if self.sizes.is_empty() || self.sizes.contains(&0) {
            return Err(Error::invalid(
                "Unflatten",
                format!(
                    "sizes {:?} must be non-empty and at least 1 each",
                    self.sizes
                ),
            ));
        }
        Ok(())
    }
    fn step(&self, _ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
}
