//! Reshape and transpose.

use super::{avals_of, fmt_list, internal};
use crate::error::{Error, Result};
use crate::graph::{LinearArg, Planned, Primitive};
use crate::ops::check_arity;
use crate::tensor::{
    checked_size, copy_array, copy_to_vec, row_major, standard_layout, ArrayData, Aval, Tensor,
};
use ndarray::{ArrayD, IxDyn};
use std::any::Any;

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
