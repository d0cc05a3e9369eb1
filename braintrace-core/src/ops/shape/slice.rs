//! Slice and zero padding, each the transpose of the other.

use super::{avals_of, fmt_list};
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Primitive};
use crate::ops::check_arity;
use crate::tensor::{checked_size, to_standard, ArrayData, Aval, Tensor};
use ndarray::{Axis, Slice};
use std::any::Any;
use std::sync::Arc;

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
