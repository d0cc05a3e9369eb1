//! Concatenation along an axis.

use super::avals_of;
use super::slice::SliceOp;
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Planned, Primitive};
use crate::kernels::broadcast::concat_rows;
use crate::tensor::{checked_size, ArrayData, Aval, Tensor};
use std::any::Any;
use std::sync::Arc;

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
            .map(|(t, &b)| crate::ops::bcast_to_batch(t, b, size))
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
