//! General N-D dilated, strided, padded, grouped convolution (cross-correlation, like XLA's
//! `conv_general_dilated`) in the canonical layout x: (N, C, s..), k: (O, C/G, k..),
//! y: (N, O, o..), together with its two exact adjoints (w.r.t. the input and the kernel).
//!
//! All three kernels use the same scheme: a precomputed "plan" of valid
//! (input offset, output offset, run length, input step) runs per kernel offset (so no per-element
//! bounds checks), an im2col buffer per (batch, group), and a GEMM through ndarray's
//! `general_mat_mul` (which dispatches to `matrixmultiply` for f32/f64).

use crate::error::{Error, Result};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, IxDyn};
use num_traits::Float;

/// Geometry of a convolution over `d` spatial dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// Window strides, len d, each >= 1.
    pub strides: Vec<usize>,
    /// (lo, hi) padding per spatial dim, len d; negative values crop.
    pub padding: Vec<(i64, i64)>,
    /// Input dilation, len d, each >= 1 (inserts `lhs_dilation - 1` zeros between input elements).
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation, len d, each >= 1.
    pub rhs_dilation: Vec<usize>,
    /// Number of feature groups, >= 1; C and O must be divisible by it.
    pub feature_group_count: usize,
}

impl ConvGeometry {
    /// Spatial output size for each dim: dilated_in = (n-1)*lhs_dil+1; padded = dilated_in + lo + hi;
    /// dilated_k = (k-1)*rhs_dil+1; out = if padded >= dilated_k { (padded - dilated_k)/stride + 1 } else { 0 }.
    ///
    /// A zero-sized input dim has dilated size 0, a zero-sized kernel dim has dilated size 0.
    pub fn output_spatial(&self, in_spatial: &[usize], k_spatial: &[usize]) -> Result<Vec<usize>> {
        let d = in_spatial.len();
        self.validate(d)?;
        if k_spatial.len() != d {
            return Err(Error::invalid(
                "conv",
                format!(
                    "kernel has {} spatial dims but input has {}",
                    k_spatial.len(),
                    d
                ),
            ));
        }
        (0..d)
            .map(|i| {
                let dil_in = dilated_size(in_spatial[i], self.lhs_dilation[i])?;
                let (lo, hi) = self.padding[i];
                let padded = dil_in
                    .checked_add(lo)
                    .and_then(|v| v.checked_add(hi))
                    .ok_or_else(|| {
                        Error::invalid("conv", format!("padded size overflows in spatial dim {i}"))
                    })?;
                let dil_k = dilated_size(k_spatial[i], self.rhs_dilation[i])?;
                if padded >= dil_k {
                    let stride = i64::try_from(self.strides[i]).unwrap_or(i64::MAX);
                    let out = (padded - dil_k) / stride + 1;
                    usize::try_from(out).map_err(|_| {
                        Error::invalid("conv", format!("output size overflows in spatial dim {i}"))
                    })
                } else {
                    Ok(0)
                }
            })
            .collect()
    }

    /// Checks the per-dimension vectors have length `d` and all factors are >= 1.
    fn validate(&self, d: usize) -> Result<()> {
        if self.strides.len() != d
            || self.padding.len() != d
            || self.lhs_dilation.len() != d
            || self.rhs_dilation.len() != d
        {
            return Err(Error::invalid("conv", format!(
                "geometry has strides/padding/lhs_dilation/rhs_dilation of lengths {}/{}/{}/{} but there are {} spatial dims",
                self.strides.len(),
                self.padding.len(),
                self.lhs_dilation.len(),
                self.rhs_dilation.len(),
                d
            )));
        }
        if self.strides.contains(&0) {
            return Err(Error::invalid(
                "conv",
                format!("strides must be >= 1, got {:?}", self.strides),
            ));
        }
        if self.lhs_dilation.contains(&0) {
            return Err(Error::invalid(
                "conv",
                format!("lhs_dilation must be >= 1, got {:?}", self.lhs_dilation),
            ));
        }
        if self.rhs_dilation.contains(&0) {
            return Err(Error::invalid(
                "conv",
                format!("rhs_dilation must be >= 1, got {:?}", self.rhs_dilation),
            ));
        }
        if self.feature_group_count == 0 {
            return Err(Error::invalid("conv", "feature_group_count must be >= 1"));
        }
        Ok(())
    }
}

/// `(n-1)*dil+1` (0 when n == 0) as i64.
fn dilated_size(n: usize, dil: usize) -> Result<i64> {
    if n == 0 {
        return Ok(0);
    }
    let (n, dil) = (i64::try_from(n).ok(), i64::try_from(dil).ok());
    n.zip(dil)
        .and_then(|(n, dil)| (n - 1).checked_mul(dil))
        .and_then(|v| v.checked_add(1))
        .ok_or_else(|| Error::invalid("conv", "dilated size overflows"))
}

/// SAME padding per JAX: out = ceil(n/s); pad_total = max((out-1)*s + (k-1)*d + 1 - n, 0); lo = pad_total/2; hi = pad_total - lo.
///
/// A stride or dilation of 0 is treated as 1.
/// Computed in `i128` and saturated to `i64`, so huge sizes or dilations
/// cannot overflow; a saturated padding makes the output size overflow,
/// which [`ConvGeometry::output_spatial`] reports as an error.
pub fn same_padding(n: usize, k: usize, stride: usize, rhs_dilation: usize) -> (i64, i64) {
    let s = stride.max(1) as i128;
    let d = rhs_dilation.max(1) as i128;
    let (n, k) = (n as i128, k as i128);
    let out = (n + s - 1) / s;
    let total = ((out - 1) * s + (k - 1) * d + 1 - n).max(0);
    let lo = total / 2;
    let sat = |v: i128| i64::try_from(v).unwrap_or(i64::MAX);
    (sat(lo), sat(total - lo))
}

/// Validated shapes of one convolution.
struct Dims {
    n: usize,
    c: usize,
    o: usize,
    groups: usize,
    /// Input spatial sizes.
    xs: Vec<usize>,
    /// Kernel spatial sizes.
    ks: Vec<usize>,
    /// Output spatial sizes.
    ys: Vec<usize>,
}

impl Dims {
    fn cg(&self) -> usize {
        self.c / self.groups
    }
    fn og(&self) -> usize {
        self.o / self.groups
    }
    fn s_in(&self) -> usize {
        self.xs.iter().product()
    }
    fn k_len(&self) -> usize {
        self.ks.iter().product()
    }
    fn p_len(&self) -> usize {
        self.ys.iter().product()
    }
    fn x_shape(&self) -> Vec<usize> {
        [self.n, self.c].iter().chain(&self.xs).copied().collect()
    }
    fn k_shape(&self) -> Vec<usize> {
        [self.o, self.cg()]
            .iter()
            .chain(&self.ks)
            .copied()
            .collect()
    }
    fn y_shape(&self) -> Vec<usize> {
        [self.n, self.o].iter().chain(&self.ys).copied().collect()
    }
}

/// Validates x/k shapes and geometry; returns the dims (output spatial computed).
fn check_dims(x_shape: &[usize], k_shape: &[usize], geo: &ConvGeometry) -> Result<Dims> {
    if x_shape.len() < 3 {
        return Err(Error::shapes(
            "conv",
            [x_shape, k_shape],
            "the input must have shape (N, C, spatial..) with >= 1 spatial dim",
        ));
    }
    if k_shape.len() != x_shape.len() {
        return Err(Error::shapes(
            "conv",
            [x_shape, k_shape],
            "the kernel must have the same rank as the input",
        ));
    }
    let d = x_shape.len() - 2;
    geo.validate(d)?;
    let g = geo.feature_group_count;
    let (n, c, o) = (x_shape[0], x_shape[1], k_shape[0]);
    if c % g != 0 || o % g != 0 {
        return Err(Error::shapes(
            "conv",
            [x_shape, k_shape],
            format!("input channels {c} and output channels {o} must be divisible by feature_group_count {g}"),
        ));
    }
    if k_shape[1] != c / g {
        return Err(Error::shapes(
            "conv",
            [x_shape, k_shape],
            format!(
                "the kernel must have C/G = {c}/{g} = {} input channels",
                c / g
            ),
        ));
    }
    let ys = geo.output_spatial(&x_shape[2..], &k_shape[2..])?;
    Ok(Dims {
        n,
        c,
        o,
        groups: g,
        xs: x_shape[2..].to_vec(),
        ks: k_shape[2..].to_vec(),
        ys,
    })
}

/// A run of valid (output position, input position) pairs along one spatial dim:
/// output positions `p0..p0+len`, input positions `i0, i0+istep, ..`.
#[derive(Clone, Copy, Debug)]
struct Run {
    p0: usize,
    i0: usize,
    len: usize,
    istep: usize,
}

/// For one spatial dim: per kernel offset u, the runs of valid (p, input index) pairs.
fn dim_runs(
    n_in: usize,
    k: usize,
    n_out: usize,
    s: usize,
    ld: usize,
    rd: usize,
    lo: i64,
) -> Vec<Vec<Run>> {
    let dil_in = if n_in == 0 {
        0
    } else {
        (n_in as i64 - 1) * ld as i64 + 1
    };
    (0..k)
        .map(|u| {
            let mut runs: Vec<Run> = Vec::new();
            for p in 0..n_out {
                let q = (p * s + u * rd) as i64 - lo;
                if q < 0 || q >= dil_in || q % ld as i64 != 0 {
                    continue;
                }
                let i = (q / ld as i64) as usize;
                if let Some(r) = runs.last_mut() {
                    if r.p0 + r.len == p {
                        if r.len == 1 {
                            r.istep = i - r.i0;
                            r.len = 2;
                            continue;
                        } else if i == r.i0 + r.len * r.istep {
                            r.len += 1;
                            continue;
                        }
                    }
                }
                runs.push(Run {
                    p0: p,
                    i0: i,
                    len: 1,
                    istep: 1,
                });
            }
            runs
        })
        .collect()
}

/// Flattened plan: for each flat kernel offset `ku` (row-major over kernel spatial dims),
/// `entries[starts[ku]..starts[ku+1]]` are runs of (input spatial offset, output spatial offset,
/// length, input step) in flat (row-major) spatial coordinates, the output step being 1.
/// Within one kernel offset the output positions of all runs are disjoint.
struct Plan {
    starts: Vec<usize>,
    entries: Vec<Run>,
}

fn build_plan(dims: &Dims, geo: &ConvGeometry) -> Plan {
    let d = dims.xs.len();
    let maps: Vec<Vec<Vec<Run>>> = (0..d)
        .map(|i| {
            dim_runs(
                dims.xs[i],
                dims.ks[i],
                dims.ys[i],
                geo.strides[i],
                geo.lhs_dilation[i],
                geo.rhs_dilation[i],
                geo.padding[i].0,
            )
        })
        .collect();
    // Row-major strides of the input and output spatial blocks.
    let mut xst = vec![1usize; d];
    let mut yst = vec![1usize; d];
    for i in (0..d.saturating_sub(1)).rev() {
        xst[i] = xst[i + 1] * dims.xs[i + 1];
        yst[i] = yst[i + 1] * dims.ys[i + 1];
    }
    let k_len = dims.k_len();
    let mut starts = Vec::with_capacity(k_len + 1);
    let mut entries = Vec::new();
    let mut u = vec![0usize; d];
    for _ in 0..k_len {
        starts.push(entries.len());
        expand(&maps, &u, &xst, &yst, 0, 0, 0, &mut entries);
        // Advance the row-major kernel multi-index.
        for i in (0..d).rev() {
            u[i] += 1;
            if u[i] < dims.ks[i] {
                break;
            }
            u[i] = 0;
        }
    }
    starts.push(entries.len());
    Plan { starts, entries }
}

#[allow(clippy::too_many_arguments)]
fn expand(
    maps: &[Vec<Vec<Run>>],
    u: &[usize],
    xst: &[usize],
    yst: &[usize],
    dim: usize,
    in_off: usize,
    out_off: usize,
    out: &mut Vec<Run>,
) {
    let runs = &maps[dim][u[dim]];
    if dim + 1 == maps.len() {
        out.extend(runs.iter().map(|r| Run {
            p0: out_off + r.p0,
            i0: in_off + r.i0,
            len: r.len,
            istep: r.istep,
        }));
    } else {
        for r in runs {
            for j in 0..r.len {
                expand(
                    maps,
                    u,
                    xst,
                    yst,
                    dim + 1,
                    in_off + (r.i0 + j * r.istep) * xst[dim],
                    out_off + (r.p0 + j) * yst[dim],
                    out,
                );
            }
        }
    }
}

/// Fills `col` ((Cg*K) x P, row-major) from the Cg input planes in `xg` (Cg x S, row-major).
/// Positions not covered by the plan are never written (they stay zero).
fn im2col<T: Copy>(plan: &Plan, xg: &[T], s_in: usize, p_len: usize, cg: usize, col: &mut [T]) {
    let k_len = plan.starts.len() - 1;
    for c in 0..cg {
        let plane = &xg[c * s_in..(c + 1) * s_in];
        for ku in 0..k_len {
            let row_start = (c * k_len + ku) * p_len;
            let row = &mut col[row_start..row_start + p_len];
            for r in &plan.entries[plan.starts[ku]..plan.starts[ku + 1]] {
                let dst = &mut row[r.p0..r.p0 + r.len];
                if r.istep == 1 {
                    dst.copy_from_slice(&plane[r.i0..r.i0 + r.len]);
                } else {
                    for (j, v) in dst.iter_mut().enumerate() {
                        *v = plane[r.i0 + j * r.istep];
                    }
                }
            }
        }
    }
}

/// Adds `col` ((Cg*K) x P) into the Cg input planes `xg` (Cg x S): the adjoint of `im2col`.
fn col2im<T: Float>(plan: &Plan, col: &[T], s_in: usize, p_len: usize, cg: usize, xg: &mut [T]) {
    let k_len = plan.starts.len() - 1;
    for c in 0..cg {
        let plane = &mut xg[c * s_in..(c + 1) * s_in];
        for ku in 0..k_len {
            let row_start = (c * k_len + ku) * p_len;
            let row = &col[row_start..row_start + p_len];
            for r in &plan.entries[plan.starts[ku]..plan.starts[ku + 1]] {
                let src = &row[r.p0..r.p0 + r.len];
                if r.istep == 1 {
                    for (d, &v) in plane[r.i0..r.i0 + r.len].iter_mut().zip(src) {
                        *d = *d + v;
                    }
                } else {
                    for (j, &v) in src.iter().enumerate() {
                        let d = &mut plane[r.i0 + j * r.istep];
                        *d = *d + v;
                    }
                }
            }
        }
    }
}

fn contiguous<'a, T>(a: &'a ndarray::CowArray<'_, T, IxDyn>, what: &str) -> Result<&'a [T]> {
    a.as_slice()
        .ok_or_else(|| Error::invalid("conv", format!("internal error: {what} is not contiguous")))
}

fn shape_err<E: std::fmt::Display>(e: E) -> Error {
    Error::invalid("conv", format!("internal shape error: {e}"))
}

/// Forward convolution: `y[n,o,p] = Σ_{c in group(o), u} xpad[n, c, p*stride + u*rhs_dil] * k[o, c - group_start, u]`.
pub fn conv_forward<T>(
    x: &ArrayViewD<T>,
    k: &ArrayViewD<T>,
    geo: &ConvGeometry,
) -> Result<ArrayD<T>>
where
    T: Float + 'static + Send + Sync,
{
    let dims = check_dims(x.shape(), k.shape(), geo)?;
    let mut y = ArrayD::<T>::zeros(IxDyn(&dims.y_shape()));
    let (cg, og, s_in, k_len, p_len) = (
        dims.cg(),
        dims.og(),
        dims.s_in(),
        dims.k_len(),
        dims.p_len(),
    );
    if y.is_empty() || cg * k_len == 0 {
        return Ok(y);
    }
    let xc = crate::tensor::standard_layout(x);
    let kc = crate::tensor::standard_layout(k);
    let xs = contiguous(&xc, "x")?;
    let ks = contiguous(&kc, "k")?;
    let plan = build_plan(&dims, geo);
    let ck = cg * k_len;
    let kmat = ArrayView2::from_shape((dims.o, ck), ks).map_err(shape_err)?;
    let mut col = vec![T::zero(); ck * p_len];
    let ys = y
        .as_slice_mut()
        .ok_or_else(|| Error::invalid("conv", "internal error: y is not contiguous"))?;
    for n in 0..dims.n {
        for g in 0..dims.groups {
            let x_off = (n * dims.c + g * cg) * s_in;
            im2col(
                &plan,
                &xs[x_off..x_off + cg * s_in],
                s_in,
                p_len,
                cg,
                &mut col,
            );
            let colv = ArrayView2::from_shape((ck, p_len), &col[..]).map_err(shape_err)?;
            let y_off = (n * dims.o + g * og) * p_len;
            let mut yv = ArrayViewMut2::from_shape((og, p_len), &mut ys[y_off..y_off + og * p_len])
                .map_err(shape_err)?;
            let kg = kmat.slice(ndarray::s![g * og..(g + 1) * og, ..]);
            general_mat_mul(T::one(), &kg, &colv, T::zero(), &mut yv);
        }
    }
    Ok(y)
}

/// Adjoint w.r.t. x: given ct shaped like y, returns an x-shaped array (x_shape given in full: N, C, spatial).
pub fn conv_transpose_lhs<T>(
    ct: &ArrayViewD<T>,
    k: &ArrayViewD<T>,
    geo: &ConvGeometry,
    x_shape: &[usize],
) -> Result<ArrayD<T>>
where
    T: Float + 'static + Send + Sync,
{
    let dims = check_dims(x_shape, k.shape(), geo)?;
    if ct.shape() != dims.y_shape().as_slice() {
        return Err(Error::shapes(
            "conv_transpose_lhs",
            [ct.shape(), &dims.y_shape()[..]],
            "the cotangent must have the conv output shape (the second)",
        ));
    }
    let mut dx = ArrayD::<T>::zeros(IxDyn(&dims.x_shape()));
    let (cg, og, s_in, k_len, p_len) = (
        dims.cg(),
        dims.og(),
        dims.s_in(),
        dims.k_len(),
        dims.p_len(),
    );
    if dx.is_empty() || ct.is_empty() || cg * k_len == 0 {
        return Ok(dx);
    }
    let ctc = crate::tensor::standard_layout(ct);
    let kc = crate::tensor::standard_layout(k);
    let cts = contiguous(&ctc, "ct")?;
    let ks = contiguous(&kc, "k")?;
    let plan = build_plan(&dims, geo);
    let ck = cg * k_len;
    let kmat = ArrayView2::from_shape((dims.o, ck), ks).map_err(shape_err)?;
    let mut col = vec![T::zero(); ck * p_len];
    let dxs = dx
        .as_slice_mut()
        .ok_or_else(|| Error::invalid("conv", "internal error: dx is not contiguous"))?;
    for n in 0..dims.n {
        for g in 0..dims.groups {
            let c_off = (n * dims.o + g * og) * p_len;
            let ctv = ArrayView2::from_shape((og, p_len), &cts[c_off..c_off + og * p_len])
                .map_err(shape_err)?;
            let kg = kmat.slice(ndarray::s![g * og..(g + 1) * og, ..]);
            {
                let mut colv =
                    ArrayViewMut2::from_shape((ck, p_len), &mut col[..]).map_err(shape_err)?;
                general_mat_mul(T::one(), &kg.t(), &ctv, T::zero(), &mut colv);
            }
            let x_off = (n * dims.c + g * cg) * s_in;
            col2im(
                &plan,
                &col,
                s_in,
                p_len,
                cg,
                &mut dxs[x_off..x_off + cg * s_in],
            );
        }
    }
    Ok(dx)
}

/// Adjoint w.r.t. k: given x and ct shaped like y, returns a kernel-shaped array (k_shape given in full: O, C/G, kspatial).
pub fn conv_transpose_rhs<T>(
    x: &ArrayViewD<T>,
    ct: &ArrayViewD<T>,
    geo: &ConvGeometry,
    k_shape: &[usize],
) -> Result<ArrayD<T>>
where
    T: Float + 'static + Send + Sync,
{
    let dims = check_dims(x.shape(), k_shape, geo)?;
    if ct.shape() != dims.y_shape().as_slice() {
        return Err(Error::shapes(
            "conv_transpose_rhs",
            [ct.shape(), &dims.y_shape()[..]],
            "the cotangent must have the conv output shape (the second)",
        ));
    }
    let mut dk = ArrayD::<T>::zeros(IxDyn(&dims.k_shape()));
    let (cg, og, s_in, k_len, p_len) = (
        dims.cg(),
        dims.og(),
        dims.s_in(),
        dims.k_len(),
        dims.p_len(),
    );
    if dk.is_empty() || ct.is_empty() || x.is_empty() {
        return Ok(dk);
    }
    let xc = crate::tensor::standard_layout(x);
    let ctc = crate::tensor::standard_layout(ct);
    let xs = contiguous(&xc, "x")?;
    let cts = contiguous(&ctc, "ct")?;
    let plan = build_plan(&dims, geo);
    let ck = cg * k_len;
    let mut col = vec![T::zero(); ck * p_len];
    let dks = dk
        .as_slice_mut()
        .ok_or_else(|| Error::invalid("conv", "internal error: dk is not contiguous"))?;
    let mut dkmat = ArrayViewMut2::from_shape((dims.o, ck), dks).map_err(shape_err)?;
    for n in 0..dims.n {
        for g in 0..dims.groups {
            let x_off = (n * dims.c + g * cg) * s_in;
            im2col(
                &plan,
                &xs[x_off..x_off + cg * s_in],
                s_in,
                p_len,
                cg,
                &mut col,
            );
            let colv = ArrayView2::from_shape((ck, p_len), &col[..]).map_err(shape_err)?;
            let c_off = (n * dims.o + g * og) * p_len;
            let ctv = ArrayView2::from_shape((og, p_len), &cts[c_off..c_off + og * p_len])
                .map_err(shape_err)?;
            let mut dkg = dkmat.slice_mut(ndarray::s![g * og..(g + 1) * og, ..]);
            general_mat_mul(T::one(), &ctv, &colv.t(), T::one(), &mut dkg);
        }
    }
    Ok(dk)
}

#[cfg(test)]
mod tests;
