//! General dilated, strided, padded, grouped convolution (cross-correlation,
//! like XLA's `conv_general_dilated`).
//!
//! Three primitives work on the canonical layouts x: `(N, C, s..)`,
//! k: `(O, C/G, k..)`, y: `(N, O, o..)`:
//!
//! * [`Conv`] `(x, k) -> y`,
//! * [`ConvTransposeLhs`] `(ct, k) -> dx`, the adjoint of `Conv` in `x`,
//! * [`ConvTransposeRhs`] `(x, ct) -> dk`, the adjoint of `Conv` in `k`.
//!
//! All three are bilinear, and the set is closed under transposition:
//! with `<·,·>` the sum of element-wise products,
//! `<ct, Conv(x, k)> = <TL(ct, k), x> = <TR(x, ct), k>`, so
//!
//! * `Conv`: w.r.t. `x` → `TL(ct, k)`, w.r.t. `k` → `TR(x, ct)`;
//! * `TL(ct, k)` with output cotangent `g` (x-shaped): w.r.t. `ct` →
//!   `Conv(g, k)`, w.r.t. `k` → `TR(g, ct)`;
//! * `TR(x, ct)` with output cotangent `G` (k-shaped): w.r.t. `x` →
//!   `TL(ct, G)`, w.r.t. `ct` → `Conv(x, G)`.
//!
//! [`conv_general`] (and [`Tensor::conv`]) handles layouts, SAME/VALID
//! padding and defaults, and binds [`Conv`] on canonical operands.

use super::check_arity;
use super::shape::broadcast_in_dim;
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Primitive};
use crate::kernels::conv::{
    conv_forward, conv_transpose_lhs, conv_transpose_rhs, same_padding, ConvGeometry,
};
use crate::map_float2;
use crate::tensor::{Aval, Tensor};
use std::any::Any;
use std::sync::Arc;

/// Padding of a convolution.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConvPadding {
    /// Output size `ceil(n / stride)`.
    Same,
    /// No padding.
    Valid,
    /// Explicit `(lo, hi)` per spatial axis.
    Explicit(Vec<(i64, i64)>),
}

/// Layouts of lhs, rhs and output, as strings like `"NCHW"`, `"OIHW"`, `"NCHW"`.
///
/// The lhs and output strings name the batch axis `N` and the feature axis
/// `C`; the rhs string names the output-feature axis `O` and the
/// input-feature axis `I`. Every other letter is a spatial axis; the three
/// strings must use the same spatial letters, and the order of the spatial
/// letters in the rhs string is the order of the per-axis lists of
/// [`ConvParams`] (strides, padding, dilations), as in JAX.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvDimensionNumbers {
    /// Input layout.
    pub lhs: String,
    /// Kernel layout.
    pub rhs: String,
    /// Output layout.
    pub out: String,
}

/// Parameters of [`conv_general`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvParams {
    /// Strides per spatial axis.
    pub strides: Vec<usize>,
    /// Padding.
    pub padding: ConvPadding,
    /// Input dilation per spatial axis (empty = 1).
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation per spatial axis (empty = 1).
    pub rhs_dilation: Vec<usize>,
    /// Layouts (`None` = channel-first `NC…`, `OI…`, `NC…`).
    pub dimension_numbers: Option<ConvDimensionNumbers>,
    /// Feature groups.
    pub feature_group_count: usize,
}

impl ConvParams {
    /// Stride 1, VALID padding, no dilation, channel-first layouts, one group.
    ///
    /// ```
    /// use braintrace_core::ops::{ConvPadding, ConvParams};
    /// let p = ConvParams::default_for(2)
    ///     .with_strides(&[2, 2])
    ///     .with_padding(ConvPadding::Same)
    ///     .with_dimension_numbers("NHWC", "HWIO", "NHWC");
    /// assert_eq!(p.strides, vec![2, 2]);
    /// ```
    pub fn default_for(spatial_dims: usize) -> Self {
        ConvParams {
            strides: vec![1; spatial_dims],
            padding: ConvPadding::Valid,
            lhs_dilation: vec![1; spatial_dims],
            rhs_dilation: vec![1; spatial_dims],
            dimension_numbers: None,
            feature_group_count: 1,
        }
    }
    /// Set the window strides.
    pub fn with_strides(mut self, strides: &[usize]) -> Self {
        self.strides = strides.to_vec();
        self
    }
    /// Set the padding.
    pub fn with_padding(mut self, padding: ConvPadding) -> Self {
        self.padding = padding;
        self
    }
    /// Set the kernel (rhs, "atrous") dilation.
    pub fn with_rhs_dilation(mut self, dilation: &[usize]) -> Self {
        self.rhs_dilation = dilation.to_vec();
        self
    }
    /// Set the input (lhs, "transposed conv") dilation.
    pub fn with_lhs_dilation(mut self, dilation: &[usize]) -> Self {
        self.lhs_dilation = dilation.to_vec();
        self
    }
    /// Set the layouts, e.g. `("NHWC", "HWIO", "NHWC")`.
    pub fn with_dimension_numbers(mut self, lhs: &str, rhs: &str, out: &str) -> Self {
        self.dimension_numbers = Some(ConvDimensionNumbers {
            lhs: lhs.to_string(),
            rhs: rhs.to_string(),
            out: out.to_string(),
        });
        self
    }
    /// Set the number of feature groups.
    pub fn with_groups(mut self, groups: usize) -> Self {
        self.feature_group_count = groups;
        self
    }
}

// ---------------------------------------------------------------- shape rules

fn fmt_list<T: std::fmt::Debug>(v: &[T]) -> String {
    format!("{v:?}").replace(' ', "")
}

fn geometry_params(g: &ConvGeometry) -> Vec<(String, String)> {
    vec![
        ("window_strides".into(), fmt_list(&g.strides)),
        ("padding".into(), fmt_list(&g.padding)),
        ("lhs_dilation".into(), fmt_list(&g.lhs_dilation)),
        ("rhs_dilation".into(), fmt_list(&g.rhs_dilation)),
        (
            "feature_group_count".into(),
            g.feature_group_count.to_string(),
        ),
    ]
}

/// The operands of a conv op as its shape errors report them: each one's
/// role and shape (typed in the error), plus context such as the layouts.
pub(crate) struct Operands {
    roles: Vec<(&'static str, Vec<usize>)>,
    extra: String,
}

impl Operands {
    fn new(roles: &[(&'static str, &[usize])]) -> Self {
        Operands {
            roles: roles.iter().map(|&(r, s)| (r, s.to_vec())).collect(),
            extra: String::new(),
        }
    }
    fn with_extra(mut self, extra: String) -> Self {
        self.extra = extra;
        self
    }
    /// An [`Error::Shape`] of `op` with these operands' shapes.
    fn err(&self, op: &str, reason: impl std::fmt::Display) -> Error {
        let roles: Vec<&str> = self.roles.iter().map(|(r, _)| *r).collect();
        Error::shapes(
            op,
            self.roles.iter().map(|(_, s)| s),
            format!("{reason} (operands: {}{})", roles.join(", "), self.extra),
        )
    }
}

impl std::fmt::Display for Operands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (r, s)) in self.roles.iter().enumerate() {
            if i > 0 {
                f.write_str(" and ")?;
            }
            write!(f, "{r} {s:?}")?;
        }
        f.write_str(&self.extra)
    }
}

/// Both operands floats of one dtype.
fn check_dtypes(op: &str, a: &Aval, b: &Aval) -> Result<()> {
    if a.dtype() != b.dtype() || !a.dtype().is_float() {
        return Err(Error::dtype_pair(
            op,
            (a.dtype(), a.shape()),
            (b.dtype(), b.shape()),
            true,
            "operands must be floats of one dtype (f32 or f64)",
        ));
    }
    Ok(())
}

/// Checks the rank of the N-carrying operand (`>= 3`) and that the other
/// operand has the same rank.
fn check_ranks(op: &str, shapes: &Operands, a: &[usize], b: &[usize]) -> Result<()> {
    if a.len() < 3 {
        return Err(shapes.err(
            op,
            "operands must have rank >= 3 (batch, feature and at least one spatial axis)",
        ));
    }
    if a.len() != b.len() {
        return Err(shapes.err(op, format!("rank mismatch ({} vs {})", a.len(), b.len())));
    }
    Ok(())
}

/// Checks a geometry for `d` spatial dims.
fn check_geometry(op: &str, shapes: &Operands, g: &ConvGeometry, d: usize) -> Result<()> {
    for (name, len) in [
        ("window_strides", g.strides.len()),
        ("padding", g.padding.len()),
        ("lhs_dilation", g.lhs_dilation.len()),
        ("rhs_dilation", g.rhs_dilation.len()),
    ] {
        if len != d {
            return Err(shapes.err(
                op,
                format!("{name} has length {len} but there are {d} spatial dims"),
            ));
        }
    }
    for (name, v) in [
        ("window_strides", &g.strides),
        ("lhs_dilation", &g.lhs_dilation),
        ("rhs_dilation", &g.rhs_dilation),
    ] {
        if v.contains(&0) {
            return Err(Error::invalid(
                op,
                format!("{name} must be >= 1, got {v:?} (shapes {shapes})"),
            ));
        }
    }
    if g.feature_group_count == 0 {
        return Err(Error::invalid(
            op,
            format!("feature_group_count must be >= 1 (shapes {shapes})"),
        ));
    }
    Ok(())
}

/// The canonical output shape `(N, O, o..)` of `Conv(x, k)`; validates everything.
fn conv_out_shape(
    op: &str,
    shapes: &Operands,
    x: &[usize],
    k: &[usize],
    g: &ConvGeometry,
) -> Result<Vec<usize>> {
    check_ranks(op, shapes, x, k)?;
    let d = x.len() - 2;
    check_geometry(op, shapes, g, d)?;
    let groups = g.feature_group_count;
    let (n, c, o) = (x[0], x[1], k[0]);
    if c % groups != 0 {
        return Err(shapes.err(
            op,
            format!("feature_group_count {groups} does not divide the {c} input channels"),
        ));
    }
    if o % groups != 0 {
        return Err(shapes.err(
            op,
            format!("feature_group_count {groups} does not divide the {o} output channels"),
        ));
    }
    if k[1] != c / groups {
        return Err(shapes.err(op, format!(
                "channel mismatch: the kernel has {} input channels but the input has {c} channels / {groups} group(s) = {}",
                k[1],
                c / groups
            )));
    }
    let ys = g.output_spatial(&x[2..], &k[2..]).map_err(|e| match e {
        Error::Invalid { reason, .. } => shapes.err(op, reason),
        other => other,
    })?;
    let mut out = vec![n, o];
    out.extend(ys);
    crate::tensor::checked_size(op, &out)?;
    Ok(out)
}

// ---------------------------------------------------------------- Conv

/// `y = conv(x, k)` on canonical layouts x `(N, C, s..)`, k `(O, C/G, k..)`,
/// y `(N, O, o..)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv {
    /// Strides, explicit padding, dilations and groups.
    pub geometry: ConvGeometry,
}

impl Primitive for Conv {
    fn name(&self) -> String {
        "conv".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        geometry_params(&self.geometry)
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("conv", inputs, 2)?;
        let (x, k) = (&inputs[0], &inputs[1]);
        check_dtypes("conv", x, k)?;
        let shapes = Operands::new(&[("input", x.shape()), ("kernel", k.shape())]);
        let out = conv_out_shape("conv", &shapes, x.shape(), k.shape(), &self.geometry)?;
        Ok(vec![x.with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity("conv", inputs, 2)?;
        self.abstract_eval(&[inputs[0].aval(), inputs[1].aval()])?;
        let g = &self.geometry;
        let d = map_float2!(
            inputs[0].data_for("conv")?,
            inputs[1].data_for("conv")?,
            "conv",
            |x, k| conv_forward(&x.view(), &k.view(), g)?
        )?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let g = &self.geometry;
        super::bilinear_jvp(p, t, |a, b| conv_raw(a, b, g))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        check_arity("conv", args, 2)?;
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        let g = &self.geometry;
        match (args[0].is_linear(), args[1].is_linear()) {
            (true, true) => Err(Error::invalid(
                "conv",
                "transpose with both operands linear (the op is bilinear)",
            )),
            (true, false) => {
                let k = args[1].known("conv")?;
                let xs = args[0].aval().shape()[2..].to_vec();
                Ok(vec![Some(conv_transpose_lhs_raw(ct, k, g, &xs)?), None])
            }
            (false, true) => {
                let x = args[0].known("conv")?;
                let ks = args[1].aval().shape()[2..].to_vec();
                Ok(vec![None, Some(conv_transpose_rhs_raw(x, ct, g, &ks)?)])
            }
            (false, false) => Ok(vec![None, None]),
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        if size == 0 {
            return batch_empty(self, args, batched);
        }
        let g = &self.geometry;
        let (x, k) = (&args[0], &args[1]);
        if batched[0] && !batched[1] {
            // Fold the vmap axis into N.
            let y = conv_raw(&fold_batch(x)?, k, g)?;
            return Ok((vec![unfold_batch(&y, size)?], vec![true]));
        }
        // A batched kernel: one feature group per (batch element, group).
        let xg = lhs_to_groups(x, batched[0], size)?;
        let kg = rhs_to_groups(k, batched[1], size)?;
        let y = conv_raw(&xg, &kg, &scaled_groups(g, size))?;
        Ok((vec![lhs_from_groups(&y, size)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- ConvTransposeLhs

/// `dx = TL(ct, k)`: the adjoint of [`Conv`] in its input, mapping an
/// output-shaped `ct` `(N, O, o..)` to an input-shaped `(N, C, s..)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTransposeLhs {
    /// The geometry of the forward convolution.
    pub geometry: ConvGeometry,
    /// The spatial sizes `s..` of the forward input (not recoverable from `ct`
    /// when strides exceed 1).
    pub lhs_spatial: Vec<usize>,
}

impl ConvTransposeLhs {
    fn x_shape(&self, ct: &[usize], k: &[usize]) -> Vec<usize> {
        let mut s = vec![ct[0], k[1] * self.geometry.feature_group_count];
        s.extend(&self.lhs_spatial);
        s
    }
}

impl Primitive for ConvTransposeLhs {
    fn name(&self) -> String {
        "conv_transpose_lhs".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        let mut p = geometry_params(&self.geometry);
        p.push(("lhs_spatial".into(), fmt_list(&self.lhs_spatial)));
        p
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let op = "conv_transpose_lhs";
        check_arity(op, inputs, 2)?;
        let (ct, k) = (&inputs[0], &inputs[1]);
        check_dtypes(op, ct, k)?;
        let shapes = Operands::new(&[("cotangent", ct.shape()), ("kernel", k.shape())])
            .with_extra(format!("; input spatial {:?}", self.lhs_spatial));
        check_ranks(op, &shapes, ct.shape(), k.shape())?;
        check_spatial_len(op, &shapes, "lhs_spatial", &self.lhs_spatial, ct.ndim() - 2)?;
        let xs = self.x_shape(ct.shape(), k.shape());
        let y = conv_out_shape(op, &shapes, &xs, k.shape(), &self.geometry)?;
        check_cotangent_shape(op, &shapes, &y, ct.shape())?;
        Ok(vec![ct.with_shape(&xs)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let op = "conv_transpose_lhs";
        check_arity(op, inputs, 2)?;
        let out = self
            .abstract_eval(&[inputs[0].aval(), inputs[1].aval()])?
            .remove(0);
        let g = &self.geometry;
        let d = map_float2!(
            inputs[0].data_for(op)?,
            inputs[1].data_for(op)?,
            op,
            |ct, k| conv_transpose_lhs(&ct.view(), &k.view(), g, out.shape())?
        )?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let (g, s) = (&self.geometry, &self.lhs_spatial);
        super::bilinear_jvp(p, t, |a, b| conv_transpose_lhs_raw(a, b, g, s))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let op = "conv_transpose_lhs";
        check_arity(op, args, 2)?;
        let Some(gx) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        let g = &self.geometry;
        match (args[0].is_linear(), args[1].is_linear()) {
            (true, true) => Err(Error::invalid(
                op,
                "transpose with both operands linear (the op is bilinear)",
            )),
            // <gx, TL(ct, k)> = <Conv(gx, k), ct>
            (true, false) => {
                let k = args[1].known(op)?;
                Ok(vec![Some(conv_raw(gx, k, g)?), None])
            }
            // <gx, TL(ct, k)> = <Conv(gx, k), ct> = <TR(gx, ct), k>
            (false, true) => {
                let ct = args[0].known(op)?;
                let ks = args[1].aval().shape()[2..].to_vec();
                Ok(vec![None, Some(conv_transpose_rhs_raw(gx, ct, g, &ks)?)])
            }
            (false, false) => Ok(vec![None, None]),
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        if size == 0 {
            return batch_empty(self, args, batched);
        }
        let (g, s) = (&self.geometry, &self.lhs_spatial);
        let (ct, k) = (&args[0], &args[1]);
        if batched[0] && !batched[1] {
            let dx = conv_transpose_lhs_raw(&fold_batch(ct)?, k, g, s)?;
            return Ok((vec![unfold_batch(&dx, size)?], vec![true]));
        }
        let cg = lhs_to_groups(ct, batched[0], size)?;
        let kg = rhs_to_groups(k, batched[1], size)?;
        let dx = conv_transpose_lhs_raw(&cg, &kg, &scaled_groups(g, size), s)?;
        Ok((vec![lhs_from_groups(&dx, size)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- ConvTransposeRhs

/// `dk = TR(x, ct)`: the adjoint of [`Conv`] in its kernel, mapping an input
/// `x` `(N, C, s..)` and an output-shaped `ct` `(N, O, o..)` to a
/// kernel-shaped `(O, C/G, k..)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTransposeRhs {
    /// The geometry of the forward convolution.
    pub geometry: ConvGeometry,
    /// The kernel spatial sizes `k..`.
    pub rhs_spatial: Vec<usize>,
}

impl Primitive for ConvTransposeRhs {
    fn name(&self) -> String {
        "conv_transpose_rhs".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        let mut p = geometry_params(&self.geometry);
        p.push(("rhs_spatial".into(), fmt_list(&self.rhs_spatial)));
        p
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let op = "conv_transpose_rhs";
        check_arity(op, inputs, 2)?;
        let (x, ct) = (&inputs[0], &inputs[1]);
        check_dtypes(op, x, ct)?;
        let shapes = Operands::new(&[("input", x.shape()), ("cotangent", ct.shape())])
            .with_extra(format!("; kernel spatial {:?}", self.rhs_spatial));
        check_ranks(op, &shapes, x.shape(), ct.shape())?;
        check_spatial_len(op, &shapes, "rhs_spatial", &self.rhs_spatial, x.ndim() - 2)?;
        let groups = self.geometry.feature_group_count.max(1);
        let c = x.shape()[1];
        if c % groups != 0 {
            return Err(shapes.err(
                op,
                format!("feature_group_count {groups} does not divide the {c} input channels"),
            ));
        }
        let mut ks = vec![ct.shape()[1], c / groups];
        ks.extend(&self.rhs_spatial);
        let y = conv_out_shape(op, &shapes, x.shape(), &ks, &self.geometry)?;
        check_cotangent_shape(op, &shapes, &y, ct.shape())?;
        Ok(vec![x.with_shape(&ks)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let op = "conv_transpose_rhs";
        check_arity(op, inputs, 2)?;
        let out = self
            .abstract_eval(&[inputs[0].aval(), inputs[1].aval()])?
            .remove(0);
        let g = &self.geometry;
        let d = map_float2!(
            inputs[0].data_for(op)?,
            inputs[1].data_for(op)?,
            op,
            |x, ct| conv_transpose_rhs(&x.view(), &ct.view(), g, out.shape())?
        )?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let (g, s) = (&self.geometry, &self.rhs_spatial);
        super::bilinear_jvp(p, t, |a, b| conv_transpose_rhs_raw(a, b, g, s))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let op = "conv_transpose_rhs";
        check_arity(op, args, 2)?;
        let Some(gk) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        let g = &self.geometry;
        match (args[0].is_linear(), args[1].is_linear()) {
            (true, true) => Err(Error::invalid(
                op,
                "transpose with both operands linear (the op is bilinear)",
            )),
            // <gk, TR(x, ct)> = <Conv(x, gk), ct> = <TL(ct, gk), x>
            (true, false) => {
                let ct = args[1].known(op)?;
                let xs = args[0].aval().shape()[2..].to_vec();
                Ok(vec![Some(conv_transpose_lhs_raw(ct, gk, g, &xs)?), None])
            }
            // <gk, TR(x, ct)> = <Conv(x, gk), ct>
            (false, true) => {
                let x = args[0].known(op)?;
                Ok(vec![None, Some(conv_raw(x, gk, g)?)])
            }
            (false, false) => Ok(vec![None, None]),
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        if size == 0 {
            return batch_empty(self, args, batched);
        }
        // dk sums over N, so the vmap axis cannot fold into N; it becomes
        // extra feature groups instead: x (B,N,C,..) -> (N, B*C, ..),
        // ct (B,N,O,..) -> (N, B*O, ..), B*G groups, dk (B*O, C/G, ..).
        let (x, ct) = (&args[0], &args[1]);
        let xg = lhs_to_groups(x, batched[0], size)?;
        let cg = lhs_to_groups(ct, batched[1], size)?;
        let dk = conv_transpose_rhs_raw(
            &xg,
            &cg,
            &scaled_groups(&self.geometry, size),
            &self.rhs_spatial,
        )?;
        let mut sh = vec![size, dk.shape()[0] / size];
        sh.extend(&dk.shape()[1..]);
        Ok((vec![dk.reshape(&sh)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- batching helpers

/// `(B, N, ..) -> (B*N, ..)`.
fn fold_batch(x: &Tensor) -> Result<Tensor> {
    let s = x.shape();
    let mut sh = vec![s[0] * s[1]];
    sh.extend(&s[2..]);
    x.reshape(&sh)
}

/// `(B*N, ..) -> (B, N, ..)`.
fn unfold_batch(y: &Tensor, size: usize) -> Result<Tensor> {
    let s = y.shape();
    let mut sh = vec![size, s[0] / size];
    sh.extend(&s[1..]);
    y.reshape(&sh)
}

/// `(B, N, C, ..)` (or unbatched `(N, C, ..)`, broadcast) -> `(N, B*C, ..)`.
fn lhs_to_groups(x: &Tensor, batched: bool, size: usize) -> Result<Tensor> {
    let x = if batched {
        x.clone()
    } else {
        let mut sh = vec![size];
        sh.extend(x.shape());
        let dims: Vec<usize> = (1..=x.ndim()).collect();
        broadcast_in_dim(x, &sh, &dims)?
    };
    let mut perm: Vec<usize> = (0..x.ndim()).collect();
    perm.swap(0, 1);
    let xt = x.transpose(&perm)?;
    let s = xt.shape();
    let mut sh = vec![s[0], s[1] * s[2]];
    sh.extend(&s[3..]);
    xt.reshape(&sh)
}

/// `(N, B*O, ..) -> (B, N, O, ..)`.
fn lhs_from_groups(y: &Tensor, size: usize) -> Result<Tensor> {
    let s = y.shape();
    let mut sh = vec![s[0], size, s[1] / size];
    sh.extend(&s[2..]);
    let y = y.reshape(&sh)?;
    let mut perm: Vec<usize> = (0..y.ndim()).collect();
    perm.swap(0, 1);
    y.transpose(&perm)
}

/// `(B, O, I, ..)` (or unbatched `(O, I, ..)`, broadcast) -> `(B*O, I, ..)`.
fn rhs_to_groups(k: &Tensor, batched: bool, size: usize) -> Result<Tensor> {
    if batched {
        return fold_batch(k);
    }
    let mut sh = vec![size];
    sh.extend(k.shape());
    let dims: Vec<usize> = (1..=k.ndim()).collect();
    fold_batch(&broadcast_in_dim(k, &sh, &dims)?)
}

fn scaled_groups(g: &ConvGeometry, size: usize) -> ConvGeometry {
    ConvGeometry {
        feature_group_count: g.feature_group_count * size,
        ..g.clone()
    }
}

/// Batching with a batch of size 0: zeros of the right shape.
fn batch_empty(
    prim: &dyn Primitive,
    args: &[Tensor],
    batched: &[bool],
) -> Result<(Vec<Tensor>, Vec<bool>)> {
    let avals: Vec<Aval> = args
        .iter()
        .zip(batched)
        .map(|(a, &b)| {
            let av = a.aval();
            if b {
                av.with_shape(&av.shape()[1..])
            } else {
                av
            }
        })
        .collect();
    let outs = prim.abstract_eval(&avals)?;
    let n = outs.len();
    let outs = outs
        .into_iter()
        .map(|o| {
            let mut sh = vec![0];
            sh.extend(o.shape());
            Tensor::zeros(&sh, o.dtype())
        })
        .collect();
    Ok((outs, vec![true; n]))
}

// ---------------------------------------------------------------- binders

/// Bind [`Conv`] on canonical operands x `(N, C, s..)`, k `(O, C/G, k..)`.
pub fn conv_raw(x: &Tensor, k: &Tensor, geometry: &ConvGeometry) -> Result<Tensor> {
    bind1(
        Arc::new(Conv {
            geometry: geometry.clone(),
        }),
        &[x.clone(), k.clone()],
    )
}

/// Bind [`ConvTransposeLhs`]: the adjoint of [`conv_raw`] in `x`, whose
/// spatial sizes are `lhs_spatial`.
pub fn conv_transpose_lhs_raw(
    ct: &Tensor,
    k: &Tensor,
    geometry: &ConvGeometry,
    lhs_spatial: &[usize],
) -> Result<Tensor> {
    bind1(
        Arc::new(ConvTransposeLhs {
            geometry: geometry.clone(),
            lhs_spatial: lhs_spatial.to_vec(),
        }),
        &[ct.clone(), k.clone()],
    )
}

/// Bind [`ConvTransposeRhs`]: the adjoint of [`conv_raw`] in `k`, whose
/// spatial sizes are `rhs_spatial`.
pub fn conv_transpose_rhs_raw(
    x: &Tensor,
    ct: &Tensor,
    geometry: &ConvGeometry,
    rhs_spatial: &[usize],
) -> Result<Tensor> {
    bind1(
        Arc::new(ConvTransposeRhs {
            geometry: geometry.clone(),
            rhs_spatial: rhs_spatial.to_vec(),
        }),
        &[x.clone(), ct.clone()],
    )
}

// ---------------------------------------------------------------- conv_general

/// Permutations taking the lhs, rhs and output layouts to canonical order
/// (`perm[j]` = axis of the layout that is canonical axis `j`).
pub(crate) fn layout_perms(
    dn: &ConvDimensionNumbers,
    rank: usize,
    shapes: &str,
) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let parse = |spec: &str, which: &str, pair: (char, char)| -> Result<Vec<char>> {
        let cs: Vec<char> = spec.chars().collect();
        if cs.len() != rank {
            return Err(Error::invalid(
                "conv",
                format!(
                    "{which} layout {spec:?} has {} axes but the operands have rank {rank} ({shapes})",
                    cs.len()
                ),
            ));
        }
        for (i, c) in cs.iter().enumerate() {
            if cs[..i].contains(c) {
                return Err(Error::invalid(
                    "conv",
                    format!("{which} layout {spec:?} repeats the axis letter {c:?}"),
                ));
            }
        }
        if !cs.contains(&pair.0) || !cs.contains(&pair.1) {
            return Err(Error::invalid(
                "conv",
                format!(
                    "{which} layout {spec:?} must name the axes {:?} and {:?}",
                    pair.0, pair.1
                ),
            ));
        }
        Ok(cs)
    };
    let lhs = parse(&dn.lhs, "lhs", ('N', 'C'))?;
    let rhs = parse(&dn.rhs, "rhs", ('O', 'I'))?;
    let out = parse(&dn.out, "out", ('N', 'C'))?;
    let spatial: Vec<char> = rhs
        .iter()
        .copied()
        .filter(|&c| c != 'O' && c != 'I')
        .collect();
    let pos = |cs: &[char], c: char| cs.iter().position(|&x| x == c);
    let perm = |cs: &[char], spec: &str, which: &str, pair: (char, char)| -> Result<Vec<usize>> {
        let mut p = vec![
            pos(cs, pair.0).expect("checked"),
            pos(cs, pair.1).expect("checked"),
        ];
        for &c in &spatial {
            p.push(pos(cs, c).ok_or_else(|| {
                Error::invalid(
                    "conv",
                    format!(
                        "{which} layout {spec:?} and rhs layout {:?} must use the same spatial axis letters",
                        dn.rhs
                    ),
                )
            })?);
        }
        Ok(p)
    };
    Ok((
        perm(&lhs, &dn.lhs, "lhs", ('N', 'C'))?,
        perm(&rhs, &dn.rhs, "rhs", ('O', 'I'))?,
        perm(&out, &dn.out, "out", ('N', 'C'))?,
    ))
}

/// A transpose's stored spatial sizes must match the operands' spatial rank.
fn check_spatial_len(
    op: &str,
    shapes: &Operands,
    name: &str,
    sizes: &[usize],
    d: usize,
) -> Result<()> {
    if sizes.len() != d {
        return Err(shapes.err(
            op,
            format!(
                "{name} has length {} but there are {d} spatial dims",
                sizes.len()
            ),
        ));
    }
    Ok(())
}

/// A transpose's cotangent must have the shape of the conv output `y`.
fn check_cotangent_shape(op: &str, shapes: &Operands, y: &[usize], ct: &[usize]) -> Result<()> {
    if y != ct {
        return Err(shapes.err(
            op,
            format!("the cotangent must have the conv output shape {y:?}"),
        ));
    }
    Ok(())
}

/// Per-axis list of length `d`, or all ones when empty.
fn per_axis(name: &str, v: &[usize], d: usize, shapes: &Operands) -> Result<Vec<usize>> {
    if v.is_empty() {
        return Ok(vec![1; d]);
    }
    if v.len() != d {
        return Err(shapes.err(
            "conv",
            format!(
                "{name} has length {} but there are {d} spatial dims",
                v.len()
            ),
        ));
    }
    Ok(v.to_vec())
}

/// General dilated convolution (cross-correlation, like XLA's).
///
/// Operands are laid out as [`ConvParams::dimension_numbers`] says
/// (default channel-first: x `(N, C, s..)`, k `(O, C/G, k..)`, output
/// `(N, O, o..)`); per-axis lists are in the kernel layout's spatial order.
/// SAME padding follows JAX (`kernels::conv::same_padding` with the kernel
/// dilation); with input dilation, the input size used is the dilated size.
///
/// ```
/// use braintrace_core::ops::{conv_general, ConvParams};
/// use braintrace_core::Tensor;
/// let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[1, 1, 4])?;
/// let k = Tensor::from_vec(vec![1.0, -1.0], &[1, 1, 2])?;
/// let y = conv_general(&x, &k, &ConvParams::default_for(1))?;
/// assert_eq!(y.to_vec_f64()?, vec![-1.0, -1.0, -1.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn conv_general(x: &Tensor, k: &Tensor, p: &ConvParams) -> Result<Tensor> {
    let shapes = Operands::new(&[("input", x.shape()), ("kernel", k.shape())]);
    check_dtypes("conv", &x.aval(), &k.aval())?;
    check_ranks("conv", &shapes, x.shape(), k.shape())?;
    let rank = x.ndim();
    let d = rank - 2;
    let (lp, rp, op) = match &p.dimension_numbers {
        None => {
            let id: Vec<usize> = (0..rank).collect();
            (id.clone(), id.clone(), id)
        }
        Some(dn) => layout_perms(dn, rank, &shapes.to_string())?,
    };
    if p.strides.len() != d {
        return Err(shapes.err(
            "conv",
            format!(
                "window_strides has length {} but there are {d} spatial dims",
                p.strides.len()
            ),
        ));
    }
    let lhs_dilation = per_axis("lhs_dilation", &p.lhs_dilation, d, &shapes)?;
    let rhs_dilation = per_axis("rhs_dilation", &p.rhs_dilation, d, &shapes)?;
    let xc = x.transpose(&lp)?;
    let kc = k.transpose(&rp)?;
    let (xs, ks) = (&xc.shape()[2..], &kc.shape()[2..]);
    let padding = match &p.padding {
        ConvPadding::Valid => vec![(0, 0); d],
        ConvPadding::Same => (0..d)
            .map(|i| {
                let n = if xs[i] == 0 {
                    0
                } else {
                    (xs[i] - 1) * lhs_dilation[i].max(1) + 1
                };
                same_padding(n, ks[i], p.strides[i], rhs_dilation[i])
            })
            .collect(),
        ConvPadding::Explicit(v) => {
            if v.len() != d {
                return Err(shapes.err(
                    "conv",
                    format!(
                        "padding has length {} but there are {d} spatial dims",
                        v.len()
                    ),
                ));
            }
            v.clone()
        }
    };
    let geometry = ConvGeometry {
        strides: p.strides.clone(),
        padding,
        lhs_dilation,
        rhs_dilation,
        feature_group_count: p.feature_group_count,
    };
    // Validate here too, so errors show the shapes as the caller gave them.
    let shapes = match &p.dimension_numbers {
        Some(dn) => shapes.with_extra(format!(
            "; input {:?} ({}) and kernel {:?} ({}), canonically {:?} and {:?}",
            x.shape(),
            dn.lhs,
            k.shape(),
            dn.rhs,
            xc.shape(),
            kc.shape()
        )),
        None => shapes,
    };
    conv_out_shape("conv", &shapes, xc.shape(), kc.shape(), &geometry)?;
    let y = conv_raw(&xc, &kc, &geometry)?;
    // Output axis i of the layout is canonical axis j with op[j] == i.
    let mut inv = vec![0; rank];
    for (j, &i) in op.iter().enumerate() {
        inv[i] = j;
    }
    y.transpose(&inv)
}

impl Tensor {
    /// Convolution of `self` (the input) with the kernel `k`; see [`conv_general`].
    pub fn conv(&self, k: &Tensor, p: &ConvParams) -> Result<Tensor> {
        conv_general(self, k, p)
    }
}
