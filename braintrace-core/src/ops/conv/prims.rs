//! The three conv primitives: [`Conv`], [`ConvTransposeLhs`] and
//! [`ConvTransposeRhs`].

use super::batching::{
    batch_empty, fold_batch, lhs_from_groups, lhs_to_groups, rhs_to_groups, scaled_groups,
    unfold_batch,
};
use super::check::{
    check_cotangent_shape, check_dtypes, check_ranks, check_spatial_len, conv_out_shape, fmt_list,
    geometry_params, Operands,
};
use super::general::{conv_raw, conv_transpose_lhs_raw, conv_transpose_rhs_raw};
use crate::error::{Error, Result};
use crate::graph::{LinearArg, Primitive};
use crate::kernels::conv::{conv_forward, conv_transpose_lhs, conv_transpose_rhs, ConvGeometry};
use crate::map_float2;
use crate::ops::check_arity;
use crate::tensor::{Aval, Tensor};
use std::any::Any;

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
        crate::ops::bilinear_jvp(p, t, |a, b| conv_raw(a, b, g))
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
        crate::ops::bilinear_jvp(p, t, |a, b| conv_transpose_lhs_raw(a, b, g, s))
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
        crate::ops::bilinear_jvp(p, t, |a, b| conv_transpose_rhs_raw(a, b, g, s))
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
