//! Broadcast (`broadcast_in_dim`) and its transpose, reduce-sum.

use super::{avals_of, fmt_list};
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Planned, Primitive};
use crate::kernels::broadcast::broadcast_rows;
use crate::kernels::reduce::sum_axes;
use crate::ops::check_arity;
use crate::tensor::{checked_size, row_major, standard_layout, ArrayData, Aval, DType, Tensor};
use std::any::Any;
use std::sync::Arc;

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
    fn planned(&self) -> Option<Planned<'_>> {
        Some(Planned::Broadcast)
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
        Some(Planned::Sum { axes: &self.axes })
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
