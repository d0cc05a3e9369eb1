//! Structural core ops: reshape, transpose, broadcast_in_dim, reduce-sum,
//! slice, pad and concatenate.

use super::check_arity;
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Planned, Primitive};
use crate::kernels::broadcast::{broadcast_rows, concat_rows};
use crate::kernels::reduce::sum_axes;
use crate::tensor::{
    checked_size, copy_array, copy_to_vec, row_major, standard_layout, to_standard, ArrayData,
    Aval, DType, Tensor,
};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use std::any::Any;
use std::sync::Arc;

macro_rules! map_any {
    ($data:expr, |$a:ident| $body:expr) => {
        match $data {
            ArrayData::F32($a) => ArrayData::F32($body),
            ArrayData::F64($a) => ArrayData::F64($body),
            ArrayData::I64($a) => ArrayData::I64($body),
            ArrayData::Bool($a) => ArrayData::Bool($body),
        }
    };
}

/// [`map_any!`] for a body that returns a `Result` of an array.
macro_rules! try_map_any {
    ($data:expr, |$a:ident| $body:expr) => {
        match $data {
            ArrayData::F32($a) => ArrayData::F32($body?),
            ArrayData::F64($a) => ArrayData::F64($body?),
            ArrayData::I64($a) => ArrayData::I64($body?),
            ArrayData::Bool($a) => ArrayData::Bool($body?),
        }
    };
}

/// An ndarray shape error met after the op's own checks passed, as an error
/// naming the op and the shape it was building.
fn internal<'a>(
    op: &'static str,
    shape: &'a [usize],
) -> impl Fn(ndarray::ShapeError) -> Error + 'a {
    move |e| Error::shapes(op, [shape], format!("internal shape error: {e}"))
}

fn avals_of(inputs: &[Tensor]) -> Vec<Aval> {
    inputs.iter().map(Tensor::aval).collect()
}

fn fmt_list<T: std::fmt::Debug>(v: &[T]) -> String {
    format!("{v:?}").replace(' ', "")
}

// ---------------------------------------------------------------- reshape

/// Reshape to a new shape with the same number of elements (row-major).
#[derive(Clone, Debug)]
pub struct Reshape {
    /// The new shape.
    pub shape: Vec<usize>,
}

impl Primitive for Reshape {
    fn name(&self) -> String {
        "reshape".into()
    }
    fn planned(&self) -> Option<Planned<'_>> {
        Some(Planned::Reshape)
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("new_sizes".into(), fmt_list(&self.shape))]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("reshape", inputs, 1)?;
        let from = inputs[0].shape();
        let n = checked_size("reshape", &self.shape)?;
        let have = checked_size("reshape", from)?;
        if n != have {
            return Err(Error::shapes(
                "reshape",
                [from, &self.shape[..]],
                format!("{have} elements cannot be reshaped into {n}"),
            ));
        }
        Ok(vec![inputs[0].with_shape(&self.shape)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&avals_of(inputs))?;
        let sh = IxDyn(&self.shape);
        let bad = internal("reshape", &self.shape);
        // `eval` only borrows its operand, so even an operand the
        // interpreter moved here (its last use) cannot give up its buffer:
        // one copy, a memcpy for standard data.
        let d = try_map_any!(inputs[0].data_for("reshape")?, |a| {
            let std = standard_layout(a);
            ArrayD::from_shape_vec(sh.clone(), copy_to_vec(row_major(&std))).map_err(&bad)
        });
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((
            vec![p[0].reshape(&self.shape)?],
            vec![t[0].as_ref().map(|t| t.reshape(&self.shape)).transpose()?],
        ))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let sh = args[0].aval().shape().to_vec();
        Ok(vec![cts[0].as_ref().map(|c| c.reshape(&sh)).transpose()?])
    }
    fn batch(
        &self,
        args: &[Tensor],
        _batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let mut sh = vec![size];
        sh.extend(&self.shape);
        Ok((vec![args[0].reshape(&sh)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- transpose

/// Permute axes: output axis `i` is input axis `perm[i]`.
#[derive(Clone, Debug)]
pub struct Transpose {
    /// The permutation.
    pub perm: Vec<usize>,
}

pub(crate) fn check_perm(op: &str, perm: &[usize], shape: &[usize]) -> Result<()> {
    let mut seen = vec![false; shape.len()];
    let bad = || {
        Error::shapes(
            op,
            [shape],
            format!("the permutation {perm:?} must name every axis once"),
        )
    };
    if perm.len() != shape.len() {
        return Err(bad());
    }
    for &p in perm {
        if p >= shape.len() || seen[p] {
            return Err(bad());
        }
        seen[p] = true;
    }
    Ok(())
}

impl Primitive for Transpose {
    fn name(&self) -> String {
        "transpose".into()
    }
    fn planned(&self) -> Option<Planned<'_>> {
        Some(Planned::Transpose { perm: &self.perm })
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("permutation".into(), fmt_list(&self.perm))]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("transpose", inputs, 1)?;
        check_perm("transpose", &self.perm, inputs[0].shape())?;
        let sh: Vec<usize> = self.perm.iter().map(|&p| inputs[0].shape()[p]).collect();
        Ok(vec![inputs[0].with_shape(&sh)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&avals_of(inputs))?;
        // Only the strides are permuted (plus a buffer copy): every kernel
        // accepts non-standard layouts, and matmul reads transposed operands
        // directly, so a gather into standard order here would be wasted.
        let d = map_any!(inputs[0].data_for("transpose")?, |a| copy_array(a)
            .permuted_axes(IxDyn(&self.perm)));
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((
            vec![p[0].transpose(&self.perm)?],
            vec![t[0].as_ref().map(|t| t.transpose(&self.perm)).transpose()?],
        ))
    }
    fn transpose(
        &self,
        cts: &[Option<Tensor>],
        _args: &[LinearArg],
    ) -> Result<Vec<Option<Tensor>>> {
        let mut inv = vec![0; self.perm.len()];
        for (i, &p) in self.perm.iter().enumerate() {
            inv[p] = i;
        }
        Ok(vec![cts[0]
            .as_ref()
            .map(|c| c.transpose(&inv))
            .transpose()?])
    }
    fn batch(
        &self,
        args: &[Tensor],
        _batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let mut perm = vec![0];
        perm.extend(self.perm.iter().map(|p| p + 1));
        Ok((vec![args[0].transpose(&perm)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- broadcast_in_dim

/// Broadcast to `shape`; operand axis `i` becomes output axis `dims[i]`
/// (operand size must be 1 or equal to the output size there).
#[derive(Clone, Debug)]
pub struct BroadcastInDim {
    /// The output shape.
    pub shape: Vec<usize>,
    /// Where each operand axis lands (strictly increasing).
    pub dims: Vec<usize>,
}

impl Primitive for BroadcastInDim {
    fn name(&self) -> String {
        "broadcast_in_dim".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("shape".into(), fmt_list(&self.shape)),
            ("broadcast_dimensions".into(), fmt_list(&self.dims)),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("broadcast_in_dim", inputs, 1)?;
        let ish = inputs[0].shape();
        let bad = |why: &str| {
            Error::shapes(
                "broadcast_to",
                [ish, &self.shape[..]],
                format!("{why} (broadcast_dimensions {:?})", self.dims),
            )
        };
        if self.dims.len() != ish.len() {
            return Err(bad(
                "broadcast_dimensions must name one output axis per operand axis",
            ));
        }
        for (i, &d) in self.dims.iter().enumerate() {
            if d >= self.shape.len()
                || (i > 0 && d <= self.dims[i - 1])
                || (ish[i] != 1 && ish[i] != self.shape[d])
            {
                return Err(bad(
                    "operand dimensions must be 1 or match the target, in increasing output axes",
                ));
            }
        }
        checked_size("broadcast_to", &self.shape)?;
        Ok(vec![inputs[0].with_shape(&self.shape)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&avals_of(inputs))?;
        // Reshape the operand to the output rank (1 where not mapped), then broadcast.
        let mut mid = vec![1usize; self.shape.len()];
        for (i, &d) in self.dims.iter().enumerate() {
            mid[d] = inputs[0].shape()[i];
        }
        ArrayData::check_alloc("broadcast_to", &self.shape, inputs[0].dtype())?;
        // Operand axes keep their order, so its row-major data is also that
        // of the `mid`-shaped operand; broadcast as repeated rows or
        // spread elements where it can be (see `kernels::broadcast`).
        let d = map_any!(inputs[0].data_for("broadcast_in_dim")?, |a| {
            let std = standard_layout(a);
            broadcast_rows(row_major(&std), &mid, &self.shape)
        });
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let f = |x: &Tensor| broadcast_in_dim(x, &self.shape, &self.dims);
        Ok((vec![f(&p[0])?], vec![t[0].as_ref().map(f).transpose()?]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None]);
        };
        let in_shape = args[0].aval().shape().to_vec();
        let mut axes = Vec::new();
        for ax in 0..self.shape.len() {
            match self.dims.iter().position(|&d| d == ax) {
                None => axes.push(ax),
                Some(i) if in_shape[i] == 1 && self.shape[ax] != 1 => axes.push(ax),
                _ => {}
            }
        }
        let s = if axes.is_empty() {
            ct.clone()
        } else {
            ct.sum(&axes)?
        };
        Ok(vec![Some(s.reshape(&in_shape)?)])
    }
    fn batch(
        &self,
        args: &[Tensor],
        _batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let mut shape = vec![size];
        shape.extend(&self.shape);
        let mut dims = vec![0];
        dims.extend(self.dims.iter().map(|d| d + 1));
        Ok((vec![broadcast_in_dim(&args[0], &shape, &dims)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bind [`BroadcastInDim`] (a no-op when nothing changes).
pub fn broadcast_in_dim(x: &Tensor, shape: &[usize], dims: &[usize]) -> Result<Tensor> {
    let identity = dims.len() == x.ndim() && dims.iter().enumerate().all(|(i, &d)| i == d);
    if x.shape() == shape && identity {
        return Ok(x.clone());
    }
    bind1(
        Arc::new(BroadcastInDim {
            shape: shape.to_vec(),
            dims: dims.to_vec(),
        }),
        std::slice::from_ref(x),
    )
}

// ---------------------------------------------------------------- reduce_sum

/// Sum over axes (removed from the shape).
#[derive(Clone, Debug)]
pub struct ReduceSum {
    /// Sorted, distinct axes.
    pub axes: Vec<usize>,
}

impl Primitive for ReduceSum {
    fn name(&self) -> String {
        "reduce_sum".into()
    }
    fn planned(&self) -> Option<Planned<'_>> {
        Some(Planned::Sum)
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("axes".into(), fmt_list(&self.axes))]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("sum", inputs, 1)?;
        let sh = inputs[0].shape();
        for (i, &a) in self.axes.iter().enumerate() {
            if a >= sh.len() || (i > 0 && a <= self.axes[i - 1]) {
                return Err(Error::axis("sum", a as isize, sh));
            }
        }
        if !inputs[0].dtype().is_float() {
            return Err(Error::dtype_with(
                "sum",
                "operand",
                DType::FLOATS,
                inputs[0].dtype(),
                format!("shape {sh:?}"),
            ));
        }
        let out: Vec<usize> = sh
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        Ok(vec![inputs[0].with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&avals_of(inputs))?;
        let d = crate::map_float!(inputs[0].data_for("sum")?, "sum", |a| {
            sum_axes(a, &self.axes)
        })?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((
            vec![p[0].sum(&self.axes)?],
            vec![t[0].as_ref().map(|t| t.sum(&self.axes)).transpose()?],
        ))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None]);
        };
        let in_shape = args[0].aval().shape().to_vec();
        let dims: Vec<usize> = (0..in_shape.len())
            .filter(|i| !self.axes.contains(i))
            .collect();
        Ok(vec![Some(broadcast_in_dim(ct, &in_shape, &dims)?)])
    }
    fn batch(
        &self,
        args: &[Tensor],
        _batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let axes: Vec<usize> = self.axes.iter().map(|a| a + 1).collect();
        Ok((vec![args[0].sum(&axes)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- slice

/// Contiguous slice `[start, limit)` on every axis.
#[derive(Clone, Debug)]
pub struct SliceOp {
    /// Start per axis.
    pub starts: Vec<usize>,
    /// Limit (exclusive) per axis.
    pub limits: Vec<usize>,
}

impl Primitive for SliceOp {
    fn name(&self) -> String {
        "slice".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("start_indices".into(), fmt_list(&self.starts)),
            ("limit_indices".into(), fmt_list(&self.limits)),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("slice", inputs, 1)?;
        let sh = inputs[0].shape();
        let bad = |why: String| {
            Error::shapes(
                "slice",
                [sh],
                format!("starts {:?} limits {:?}: {why}", self.starts, self.limits),
            )
        };
        if self.starts.len() != sh.len() || self.limits.len() != sh.len() {
            return Err(bad("one start and limit per axis".into()));
        }
        let mut out = Vec::new();
        for (i, ((&start, &limit), &size)) in
            self.starts.iter().zip(&self.limits).zip(sh).enumerate()
        {
            if start > limit || limit > size {
                return Err(bad(format!("axis {i}: need start <= limit <= size")));
            }
            out.push(limit - start);
        }
        Ok(vec![inputs[0].with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&avals_of(inputs))?;
        let d = map_any!(inputs[0].data_for("slice")?, |a| {
            let mut v = a.view();
            for i in 0..self.starts.len() {
                v.slice_axis_inplace(Axis(i), Slice::from(self.starts[i]..self.limits[i]));
            }
            to_standard(v)
        });
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let f = |x: &Tensor| bind1(Arc::new(self.clone()), std::slice::from_ref(x));
        Ok((vec![f(&p[0])?], vec![t[0].as_ref().map(f).transpose()?]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None]);
        };
        let sh = args[0].aval().shape().to_vec();
        let hi: Vec<usize> = (0..sh.len()).map(|i| sh[i] - self.limits[i]).collect();
        Ok(vec![Some(pad(ct, &self.starts, &hi)?)])
    }
    fn batch(
        &self,
        args: &[Tensor],
        _batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let mut s = self.clone();
        s.starts.insert(0, 0);
        s.limits.insert(0, size);
        Ok((vec![bind1(Arc::new(s), &args[..1])?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- pad

/// Zero padding by `lo`/`hi` elements per axis.
#[derive(Clone, Debug)]
pub struct Pad {
    /// Elements added before, per axis.
    pub lo: Vec<usize>,
    /// Elements added after, per axis.
    pub hi: Vec<usize>,
}

impl Primitive for Pad {
    fn name(&self) -> String {
        "pad".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("lo".into(), fmt_list(&self.lo)),
            ("hi".into(), fmt_list(&self.hi)),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("pad", inputs, 1)?;
        let sh = inputs[0].shape();
        let bad = |why: &str| {
            Error::shapes(
                "pad",
                [sh],
                format!("lo {:?} hi {:?}: {why}", self.lo, self.hi),
            )
        };
        if self.lo.len() != sh.len() || self.hi.len() != sh.len() {
            return Err(bad("one lo and hi per axis"));
        }
        let out = (0..sh.len())
            .map(|i| sh[i].checked_add(self.lo[i])?.checked_add(self.hi[i]))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad("the padded size overflows"))?;
        checked_size("pad", &out)?;
        Ok(vec![inputs[0].with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let out = self.abstract_eval(&avals_of(inputs))?.remove(0);
        // Padding with the dtype's zero (`false` for bool), like lax.pad with 0.
        let mut r = ArrayData::try_zeros("pad", out.shape(), out.dtype())?;
        macro_rules! put {
            ($r:expr, $a:expr) => {{
                let mut v = $r.view_mut();
                for i in 0..self.lo.len() {
                    v.slice_axis_inplace(
                        Axis(i),
                        Slice::from(self.lo[i]..self.lo[i] + $a.shape()[i]),
                    );
                }
                v.assign($a);
            }};
        }
        match (&mut r, inputs[0].data_for("pad")?) {
            (ArrayData::F32(r), ArrayData::F32(a)) => put!(r, a),
            (ArrayData::F64(r), ArrayData::F64(a)) => put!(r, a),
            (ArrayData::I64(r), ArrayData::I64(a)) => put!(r, a),
            (ArrayData::Bool(r), ArrayData::Bool(a)) => put!(r, a),
            (r, a) => {
                return Err(Error::dtype_with(
                    "pad",
                    "operand",
                    [r.dtype()],
                    a.dtype(),
                    format!("internal: the result is {}", r.dtype()),
                ))
            }
        }
        Ok(vec![Tensor::from_data(r)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((
            vec![pad(&p[0], &self.lo, &self.hi)?],
            vec![t[0]
                .as_ref()
                .map(|t| pad(t, &self.lo, &self.hi))
                .transpose()?],
        ))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None]);
        };
        let sh = args[0].aval().shape().to_vec();
        let limits: Vec<usize> = (0..sh.len()).map(|i| self.lo[i] + sh[i]).collect();
        Ok(vec![Some(bind1(
            Arc::new(SliceOp {
                starts: self.lo.clone(),
                limits,
            }),
            std::slice::from_ref(ct),
        )?)])
    }
    fn batch(
        &self,
        args: &[Tensor],
        _batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let mut lo = vec![0];
        lo.extend(&self.lo);
        let mut hi = vec![0];
        hi.extend(&self.hi);
        Ok((vec![pad(&args[0], &lo, &hi)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Zero-pad `x`.
pub fn pad(x: &Tensor, lo: &[usize], hi: &[usize]) -> Result<Tensor> {
    bind1(
        Arc::new(Pad {
            lo: lo.to_vec(),
            hi: hi.to_vec(),
        }),
        std::slice::from_ref(x),
    )
}

// ---------------------------------------------------------------- concatenate

/// Concatenate operands along an axis.
#[derive(Clone, Debug)]
pub struct Concat {
    /// The axis.
    pub axis: usize,
}

impl Primitive for Concat {
    fn name(&self) -> String {
        "concatenate".into()
    }
    fn planned(&self) -> Option<Planned<'_>> {
        Some(Planned::Concat { axis: self.axis })
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("dimension".into(), self.axis.to_string())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        if inputs.is_empty() {
            return Err(Error::arity("concatenate", "at least 1", 0));
        }
        let first = &inputs[0];
        if self.axis >= first.ndim() {
            return Err(Error::axis(
                "concatenate",
                self.axis as isize,
                first.shape(),
            ));
        }
        let mut out = first.shape().to_vec();
        out[self.axis] = 0;
        if let Some((i, a)) = inputs
            .iter()
            .enumerate()
            .find(|(_, a)| a.dtype() != first.dtype())
        {
            let all: Vec<String> = inputs.iter().map(Aval::to_string).collect();
            return Err(Error::dtype_with(
                "concatenate",
                format!("operand {i}"),
                [first.dtype()],
                a.dtype(),
                format!("operands must have one dtype, got {}", all.join(", ")),
            ));
        }
        for a in inputs {
            let ok = a.ndim() == first.ndim()
                && (0..a.ndim()).all(|i| i == self.axis || a.shape()[i] == first.shape()[i]);
            if !ok {
                return Err(Error::shapes(
                    "concatenate",
                    inputs.iter().map(Aval::shape),
                    format!("all operands must agree except on axis {}", self.axis),
                ));
            }
            out[self.axis] = out[self.axis]
                .checked_add(a.shape()[self.axis])
                .ok_or_else(|| {
                    Error::shapes(
                        "concatenate",
                        inputs.iter().map(Aval::shape),
                        format!("the size along axis {} overflows", self.axis),
                    )
                })?;
        }
        checked_size("concatenate", &out)?;
        Ok(vec![first.with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let out = self.abstract_eval(&avals_of(inputs))?.remove(0);
        ArrayData::check_alloc("concatenate", out.shape(), out.dtype())?;
        let datas = inputs
            .iter()
            .map(|t| t.data_for("concatenate"))
            .collect::<Result<Vec<_>>>()?;
        // One contiguous row per operand and leading index (ndarray's
        // `concatenate` builds a result laid out along `axis`, which every
        // later reshape then has to gather back into row-major order).
        macro_rules! cat {
            ($v:ident) => {{
                let parts: Vec<_> = datas
                    .iter()
                    .map(|d| {
                        if let ArrayData::$v(a) = d {
                            a
                        } else {
                            unreachable!("dtypes checked")
                        }
                    })
                    .collect();
                ArrayData::$v(concat_rows(&parts, self.axis, out.shape()))
            }};
        }
        let d = match datas[0] {
            ArrayData::F32(_) => cat!(F32),
            ArrayData::F64(_) => cat!(F64),
            ArrayData::I64(_) => cat!(I64),
            ArrayData::Bool(_) => cat!(Bool),
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = concat(p, self.axis)?;
        if t.iter().all(Option::is_none) {
            return Ok((vec![y], vec![None]));
        }
        let ts: Vec<Tensor> = p
            .iter()
            .zip(t)
            .map(|(p, t)| t.clone().unwrap_or_else(|| p.zeros_like()))
            .collect();
        Ok((vec![y], vec![Some(concat(&ts, self.axis)?)]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None; args.len()]);
        };
        let mut off = 0;
        let mut out = Vec::new();
        for a in args {
            let sh = a.aval().shape().to_vec();
            let n = sh[self.axis];
            if a.is_linear() {
                let mut starts = vec![0; sh.len()];
                let mut limits = ct.shape().to_vec();
                starts[self.axis] = off;
                limits[self.axis] = off + n;
                out.push(Some(bind1(
                    Arc::new(SliceOp { starts, limits }),
                    std::slice::from_ref(ct),
                )?));
            } else {
                out.push(None);
            }
            off += n;
        }
        Ok(out)
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let a: Vec<Tensor> = args
            .iter()
            .zip(batched)
            .map(|(t, &b)| super::bcast_to_batch(t, b, size))
            .collect::<Result<_>>()?;
        Ok((vec![concat(&a, self.axis + 1)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Concatenate tensors along `axis`.
pub fn concat(xs: &[Tensor], axis: usize) -> Result<Tensor> {
    if xs.len() == 1 {
        if axis >= xs[0].ndim() {
            return Err(Error::axis("concatenate", axis as isize, xs[0].shape()));
        }
        return Ok(xs[0].clone());
    }
    bind1(Arc::new(Concat { axis }), xs)
}
