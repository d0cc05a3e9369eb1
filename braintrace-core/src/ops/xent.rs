//! Softmax cross-entropy against integer class labels, row by row, as one
//! primitive: `softmax_xent(logits, labels)` is, for each row of `logits`
//! `(*lead, C)` and its label `l` (`labels` of shape `*lead`),
//!
//! ```text
//! loss = −Σ_c 1[l = c] (z_c − log Σ_k e^{z_k}),   z = x − max_k x_k
//! ```
//!
//! (a label that is no class of `0..C` has an all-zero one-hot row and a
//! loss of 0, as the one-hot written with core ops gives). Its JVP is the
//! linear primitive `softmax_xent_linear`, `Σ_c (p_c S − 1[l = c]) t_c` per
//! row with `p = softmax(x)` and `S = Σ_c 1[l = c]`; that primitive's
//! transpose is the same matrix the other way round, `(p_c S − 1[l = c]) ct`,
//! and the transpose of that is the first again.
//!
//! Written with core ops, the loss of a `(B, C)` batch is some thirty tiny
//! equations per step (the row maximum as `C` slices, the one-hot, two
//! broadcasts, the reductions, and as many again in the backward pass), each
//! of which costs the executor a dispatch; as one equation forward and one
//! backward it costs two. Derivatives of the second order with respect to
//! the logits are not provided (a typed [`Error::MissingRule`]).

use super::check_arity;
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Primitive};
use crate::tensor::{ArrayData, Aval, DType, Tensor};
use ndarray::{ArrayD, IxDyn};
use num_traits::Float;
use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

const OP: &str = "softmax_xent";
const OP_LIN: &str = "softmax_xent_linear";

/// Validate `logits (*lead, C)` (float, `C ≥ 1`) and `labels (*lead)`.
fn check_operands(op: &str, logits: &Aval, labels: &Aval) -> Result<()> {
    if !logits.dtype().is_float() {
        return Err(Error::dtype_with(
            op,
            "logits",
            DType::FLOATS,
            logits.dtype(),
            format!("shape {:?}", logits.shape()),
        ));
    }
    let Some((&c, lead)) = logits.shape().split_last() else {
        return Err(Error::shapes(
            op,
            [logits.shape()],
            "logits need a class axis (rank >= 1)",
        ));
    };
    if c == 0 {
        return Err(Error::shapes(
            op,
            [logits.shape()],
            "no classes on the last axis",
        ));
    }
    if labels.shape() != lead {
        return Err(Error::shapes(
            op,
            [logits.shape(), labels.shape()],
            "labels must have the logits' shape without the class axis",
        ));
    }
    Ok(())
}

/// One row's `z = x − max x` into `z` and `e^z` into `e`; returns
/// `(Σ e^z, log Σ e^z)`.
fn row_softmax<T: Float>(x: &[T], z: &mut [T], e: &mut [T]) -> (T, T) {
    let mut m = x[0];
    for &v in &x[1..] {
        m = m.max(v);
    }
    let mut s = T::zero();
    for ((zc, ec), &v) in z.iter_mut().zip(e.iter_mut()).zip(x) {
        *zc = v - m;
        *ec = zc.exp();
        s = s + *ec;
    }
    (s, s.ln())
}

/// The one-hot entry of class `c` for label `l`.
fn hot<T: Float>(l: f64, c: usize) -> T {
    if l == c as f64 {
        T::one()
    } else {
        T::zero()
    }
}

/// What a kernel computes per row.
#[derive(Clone, Copy)]
enum Kernel {
    /// The loss.
    Loss,
    /// `Σ_c (p_c S − 1[l = c]) t_c` (the tangent `t` has the logits' shape).
    Tangent,
    /// `(p_c S − 1[l = c]) ct` (the cotangent `ct` has the labels' shape).
    Cotangent,
}

/// Run `kernel` on rows of `c` logits; `t` is the third operand (empty for
/// the loss). Returns the output, row-major.
fn rows<T: Float>(kernel: Kernel, x: &[T], labels: &[f64], t: &[T], c: usize) -> Vec<T> {
    let n = labels.len();
    let mut out = match kernel {
        Kernel::Cotangent => vec![T::zero(); n * c],
        _ => vec![T::zero(); n],
    };
    let mut buf = vec![T::zero(); 2 * c];
    let (z, e) = buf.split_at_mut(c);
    for (r, &l) in labels.iter().enumerate() {
        let xr = &x[r * c..(r + 1) * c];
        let (s, lse) = row_softmax(xr, z, e);
        match kernel {
            Kernel::Loss => {
                let mut acc = T::zero();
                for (k, &zk) in z.iter().enumerate() {
                    acc = acc + hot::<T>(l, k) * (zk - lse);
                }
                out[r] = -acc;
            }
            Kernel::Tangent | Kernel::Cotangent => {
                let hots = (0..c).fold(T::zero(), |a, k| a + hot::<T>(l, k));
                let scale = hots / s;
                match kernel {
                    Kernel::Tangent => {
                        let tr = &t[r * c..(r + 1) * c];
                        let mut acc = T::zero();
                        for (k, (&ek, &tk)) in e.iter().zip(tr).enumerate() {
                            acc = acc + (ek * scale - hot::<T>(l, k)) * tk;
                        }
                        out[r] = acc;
                    }
                    _ => {
                        let ct = t[r];
                        for (k, &ek) in e.iter().enumerate() {
                            out[r * c + k] = (ek * scale - hot::<T>(l, k)) * ct;
                        }
                    }
                }
            }
        }
    }
    out
}

/// The float data of `t` in row-major order as `T`: borrowed when it is
/// already a contiguous array of `T`, else converted.
fn float_rows<T: Float + 'static>(t: &ArrayData) -> Cow<'_, [T]> {
    match t {
        ArrayData::F32(a) => borrow_or_convert(a),
        ArrayData::F64(a) => borrow_or_convert(a),
        other => Cow::Owned(
            other
                .to_vec_f64()
                .into_iter()
                .map(|v| T::from(v).unwrap_or(T::nan()))
                .collect(),
        ),
    }
}

fn borrow_or_convert<S: Float + 'static, T: Float + 'static>(a: &ArrayD<S>) -> Cow<'_, [T]> {
    if let Some(s) = (a as &dyn Any)
        .downcast_ref::<ArrayD<T>>()
        .and_then(|a| a.as_slice())
    {
        return Cow::Borrowed(s);
    }
    Cow::Owned(a.iter().map(|&v| T::from(v).unwrap_or(T::nan())).collect())
}

/// Evaluate `kernel` on concrete operands (`t` absent for the loss).
fn eval_kernel(
    op: &str,
    kernel: Kernel,
    x: &Tensor,
    labels: &Tensor,
    t: Option<&Tensor>,
) -> Result<Tensor> {
    let xa = x.aval();
    check_operands(op, &xa, &labels.aval())?;
    let c = *xa.shape().last().expect("checked: rank >= 1");
    let lead = &xa.shape()[..xa.ndim() - 1];
    if let Some(t) = t {
        let want: &[usize] = match kernel {
            Kernel::Cotangent => lead,
            _ => xa.shape(),
        };
        if t.shape() != want || t.dtype() != xa.dtype() {
            return Err(Error::shapes(
                op,
                [xa.shape(), labels.shape(), t.shape()],
                format!(
                    "the linear operand must be a {:?} of shape {want:?}, got a {:?}",
                    xa.dtype(),
                    t.dtype()
                ),
            ));
        }
    }
    let labels = labels.to_vec_f64()?;
    let out_shape: Vec<usize> = match kernel {
        Kernel::Cotangent => xa.shape().to_vec(),
        _ => lead.to_vec(),
    };
    let xd = x.data_for(op)?;
    let td = t.map(|t| t.data_for(op)).transpose()?;
    fn go<T: Float + 'static>(
        kernel: Kernel,
        xd: &ArrayData,
        td: Option<&ArrayData>,
        labels: &[f64],
        c: usize,
    ) -> Vec<T> {
        let x = float_rows::<T>(xd);
        let t = td.map(float_rows::<T>).unwrap_or_default();
        rows(kernel, &x, labels, &t, c)
    }
    let data = match xa.dtype() {
        DType::F32 => ArrayData::F32(shaped(&out_shape, go::<f32>(kernel, xd, td, &labels, c))?),
        _ => ArrayData::F64(shaped(&out_shape, go::<f64>(kernel, xd, td, &labels, c))?),
    };
    Ok(Tensor::from_data(data))
}

fn shaped<T>(shape: &[usize], v: Vec<T>) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v)
        .map_err(|e| Error::invalid(OP, format!("output of shape {shape:?}: {e}")))
}

/// Batch a primitive that maps rows: every batched operand carries the
/// batch axis in front; the unbatched ones are broadcast to it.
fn batch_rows(
    prim: Arc<dyn Primitive>,
    args: &[Tensor],
    batched: &[bool],
    size: usize,
) -> Result<(Vec<Tensor>, Vec<bool>)> {
    let args: Vec<Tensor> = args
        .iter()
        .zip(batched)
        .map(|(a, &b)| {
            if b {
                Ok(a.clone())
            } else {
                let mut s = vec![size];
                s.extend(a.shape());
                a.expand_dims(0)?.broadcast_to(&s)
            }
        })
        .collect::<Result<_>>()?;
    Ok((vec![bind1(prim, &args)?], vec![true]))
}

/// Softmax cross-entropy of each row of `logits` against its integer label
/// (`softmax_xent`); one equation under tracing.
#[derive(Clone, Debug)]
pub struct SoftmaxXent;

impl Primitive for SoftmaxXent {
    fn name(&self) -> String {
        OP.into()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity(OP, inputs, 2)?;
        check_operands(OP, &inputs[0], &inputs[1])?;
        Ok(vec![inputs[1].with_dtype(inputs[0].dtype())])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity(OP, inputs, 2)?;
        Ok(vec![eval_kernel(
            OP,
            Kernel::Loss,
            &inputs[0],
            &inputs[1],
            None,
        )?])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        check_arity(OP, p, 2)?;
        let y = bind1(Arc::new(self.clone()), p)?;
        // The labels are piecewise constant: their tangent contributes nothing.
        let dt = match t.first().and_then(Option::as_ref) {
            Some(t) => Some(bind1(
                Arc::new(SoftmaxXentLinear { transposed: false }),
                &[p[0].clone(), p[1].clone(), t.clone()],
            )?),
            None => None,
        };
        Ok((vec![y], vec![dt]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        check_arity(OP, args, 2)?;
        batch_rows(Arc::new(self.clone()), args, batched, size)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The derivative of [`SoftmaxXent`] with respect to the logits, linear in
/// its third operand: `(logits, labels, t)` gives `Σ_c (p_c S − 1[l = c]) t_c`
/// per row (`t` of the logits' shape), or with `transposed`
/// `(logits, labels, ct)` gives `(p_c S − 1[l = c]) ct` (`ct` of the labels'
/// shape, the output of the logits' shape).
#[derive(Clone, Debug)]
pub struct SoftmaxXentLinear {
    /// The transposed map (cotangent of a row's loss to the row's logits).
    pub transposed: bool,
}

impl SoftmaxXentLinear {
    fn kernel(&self) -> Kernel {
        if self.transposed {
            Kernel::Cotangent
        } else {
            Kernel::Tangent
        }
    }
}

impl Primitive for SoftmaxXentLinear {
    fn name(&self) -> String {
        OP_LIN.into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("transposed".into(), self.transposed.to_string())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity(OP_LIN, inputs, 3)?;
        let (x, labels, t) = (&inputs[0], &inputs[1], &inputs[2]);
        check_operands(OP_LIN, x, labels)?;
        let (want, out) = if self.transposed {
            (labels.shape(), x.clone())
        } else {
            (x.shape(), labels.with_dtype(x.dtype()))
        };
        if t.shape() != want || t.dtype() != x.dtype() {
            return Err(Error::shapes(
                OP_LIN,
                [x.shape(), labels.shape(), t.shape()],
                format!(
                    "the linear operand must be a {:?} of shape {want:?}, got a {:?}",
                    x.dtype(),
                    t.dtype()
                ),
            ));
        }
        Ok(vec![out])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity(OP_LIN, inputs, 3)?;
        Ok(vec![eval_kernel(
            OP_LIN,
            self.kernel(),
            &inputs[0],
            &inputs[1],
            Some(&inputs[2]),
        )?])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        check_arity(OP_LIN, p, 3)?;
        if t.first().is_some_and(Option::is_some) {
            return Err(Error::MissingRule {
                primitive: OP_LIN.into(),
                rule: "jvp".into(),
                detail: " with respect to the logits (second derivatives of softmax_xent)".into(),
            });
        }
        let y = bind1(Arc::new(self.clone()), p)?;
        let dt = match t.get(2).and_then(Option::as_ref) {
            Some(t) => Some(bind1(
                Arc::new(self.clone()),
                &[p[0].clone(), p[1].clone(), t.clone()],
            )?),
            None => None,
        };
        Ok((vec![y], vec![dt]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        if args.len() != 3 || args[0].is_linear() || args[1].is_linear() {
            return Err(Error::invalid(
                OP_LIN,
                "transpose: only the third operand may be linear",
            ));
        }
        let Some(ct) = cts.first().and_then(Option::as_ref) else {
            return Ok(vec![None, None, None]);
        };
        let back = bind1(
            Arc::new(SoftmaxXentLinear {
                transposed: !self.transposed,
            }),
            &[
                args[0].known(OP_LIN)?.clone(),
                args[1].known(OP_LIN)?.clone(),
                ct.clone(),
            ],
        )?;
        Ok(vec![None, None, Some(back)])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        check_arity(OP_LIN, args, 3)?;
        batch_rows(Arc::new(self.clone()), args, batched, size)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Softmax cross-entropy of each row of `logits (*lead, C)` against its
/// class index in `labels (*lead)` (any dtype; whole numbers), without the
/// mean: one `softmax_xent` equation under tracing. Its derivative is
/// [`SoftmaxXentLinear`], `p S − onehot` per row (`p = softmax(x)`,
/// `S` the number of classes equal to the label, 1 for a class index).
pub fn softmax_xent(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    bind1(Arc::new(SoftmaxXent), &[logits.clone(), labels.clone()])
}
