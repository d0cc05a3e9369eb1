//! Index select (`take` along an axis) and its adjoint, `scatter_add`.

use super::check_arity;
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Primitive};
use crate::kernels::gather;
use crate::tensor::{ArrayData, Aval, DType, Tensor};
use std::any::Any;
use std::sync::Arc;

fn take_shape(x: &[usize], idx: &[usize], axis: usize) -> Vec<usize> {
    let mut s = x[..axis].to_vec();
    s.extend(idx);
    s.extend(&x[axis + 1..]);
    s
}

/// `take(x, indices, axis)`: numpy's take with i64 indices.
#[derive(Clone, Debug)]
pub struct Take {
    /// The axis of `x` indexed.
    pub axis: usize,
}

impl Primitive for Take {
    fn name(&self) -> String {
        "take".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("axis".into(), self.axis.to_string())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("take", inputs, 2)?;
        let (x, i) = (&inputs[0], &inputs[1]);
        if self.axis >= x.ndim() {
            return Err(Error::axis("take", self.axis as isize, x.shape()));
        }
        if i.dtype() != DType::I64 {
            return Err(Error::dtype_with(
                "take",
                "indices",
                [DType::I64],
                i.dtype(),
                format!("shape {:?}", i.shape()),
            ));
        }
        let out = take_shape(x.shape(), i.shape(), self.axis);
        crate::tensor::checked_size("take", &out)?;
        Ok(vec![x.with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity("take", inputs, 2)?;
        self.abstract_eval(&[inputs[0].aval(), inputs[1].aval()])?;
        let idx = inputs[1].data_for("take")?.as_i64("take")?.view();
        let d = match inputs[0].data_for("take")? {
            ArrayData::F32(a) => ArrayData::F32(gather::take(&a.view(), &idx, self.axis)?),
            ArrayData::F64(a) => ArrayData::F64(gather::take(&a.view(), &idx, self.axis)?),
            ArrayData::I64(a) => ArrayData::I64(gather::take(&a.view(), &idx, self.axis)?),
            ArrayData::Bool(a) => {
                let a = a.mapv(|v| v as i64);
                ArrayData::Bool(gather::take(&a.view(), &idx, self.axis)?.mapv(|v| v != 0))
            }
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = p[0].take(&p[1], self.axis)?;
        Ok((
            vec![y],
            vec![t[0]
                .as_ref()
                .map(|t| t.take(&p[1], self.axis))
                .transpose()?],
        ))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        let idx = args[1].known("take")?;
        let shape = args[0].aval().shape().to_vec();
        Ok(vec![Some(scatter_add(idx, ct, self.axis, &shape)?), None])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        if batched[1] {
            return super::batch_by_loop(self, args, batched, size);
        }
        Ok((vec![args[0].take(&args[1], self.axis + 1)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `scatter_add(indices, updates)`: zeros of `shape` with each update slice
/// added at its index along `axis` (the adjoint of [`Take`]).
#[derive(Clone, Debug)]
pub struct ScatterAdd {
    /// The indexed axis of the result.
    pub axis: usize,
    /// The result shape.
    pub shape: Vec<usize>,
}

impl Primitive for ScatterAdd {
    fn name(&self) -> String {
        "scatter_add".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("axis".into(), self.axis.to_string()),
            ("shape".into(), format!("{:?}", self.shape).replace(' ', "")),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("scatter_add", inputs, 2)?;
        let (i, u) = (&inputs[0], &inputs[1]);
        if i.dtype() != DType::I64 {
            return Err(Error::dtype_with(
                "scatter_add",
                "indices",
                [DType::I64],
                i.dtype(),
                format!("shape {:?}", i.shape()),
            ));
        }
        // The kernel adds floats; checked here so tracing refuses what eager
        // evaluation would.
        if !u.dtype().is_float() {
            return Err(Error::dtype_with(
                "scatter_add",
                "updates",
                DType::FLOATS,
                u.dtype(),
                format!("shape {:?}", u.shape()),
            ));
        }
        if self.axis >= self.shape.len() {
            return Err(Error::axis("scatter_add", self.axis as isize, &self.shape));
        }
        let want = take_shape(&self.shape, i.shape(), self.axis);
        if u.shape() != want.as_slice() {
            return Err(Error::shapes(
                "scatter_add",
                [u.shape(), i.shape(), &self.shape[..]],
                format!("updates (the first, with indices and result after it) must have shape {want:?}"),
            ));
        }
        crate::tensor::checked_size("scatter_add", &self.shape)?;
        Ok(vec![u.with_shape(&self.shape)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity("scatter_add", inputs, 2)?;
        self.abstract_eval(&[inputs[0].aval(), inputs[1].aval()])?;
        let idx = inputs[0]
            .data_for("scatter_add")?
            .as_i64("scatter_add")?
            .view();
        let d = crate::map_float!(inputs[1].data_for("scatter_add")?, "scatter_add", |u| {
            gather::scatter_add(&self.shape, &idx, &u.view(), self.axis)?
        })?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = scatter_add(&p[0], &p[1], self.axis, &self.shape)?;
        Ok((
            vec![y],
            vec![t[1]
                .as_ref()
                .map(|t| scatter_add(&p[0], t, self.axis, &self.shape))
                .transpose()?],
        ))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        let idx = args[0].known("scatter_add")?;
        Ok(vec![None, Some(ct.take(idx, self.axis)?)])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        if batched[0] {
            return super::batch_by_loop(self, args, batched, size);
        }
        let mut shape = vec![size];
        shape.extend(&self.shape);
        Ok((
            vec![scatter_add(&args[0], &args[1], self.axis + 1, &shape)?],
            vec![true],
        ))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bind [`ScatterAdd`].
pub fn scatter_add(
    indices: &Tensor,
    updates: &Tensor,
    axis: usize,
    shape: &[usize],
) -> Result<Tensor> {
    bind1(
        Arc::new(ScatterAdd {
            axis,
            shape: shape.to_vec(),
        }),
        &[indices.clone(), updates.clone()],
    )
}

/// Bind [`Take`].
pub(crate) fn take(x: &Tensor, indices: &Tensor, axis: usize) -> Result<Tensor> {
    bind1(Arc::new(Take { axis }), &[x.clone(), indices.clone()])
}
