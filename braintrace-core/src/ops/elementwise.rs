//! Element-wise core ops: unary math, binary arithmetic on equal shapes,
//! scalar ops, comparisons, select, cast and stop_gradient.

use super::{bcast_to_batch, lift, zeros_for};
use crate::error::{Error, Result};
use crate::graph::{bind1, Elementwise, LinearArg, Primitive};
use crate::kernels::avx2_dispatch;
use crate::kernels::broadcast::zip_flat;
use crate::tensor::{map_elements, ArrayData, Aval, DType, Tensor};
use crate::{map_float, map_float2};
use ndarray::{ArrayD, Zip};
use num_traits::Float;
use std::any::Any;
use std::sync::Arc;

fn same_avals(op: &str, a: &Aval, b: &Aval) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shapes(
            op,
            [a.shape(), b.shape()],
            "operands must have equal shapes",
        ));
    }
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(
            op,
            format!("operands have dtypes {} and {}", a.dtype(), b.dtype()),
        ));
    }
    Ok(())
}

fn float_aval(op: &str, a: &Aval) -> Result<()> {
    if a.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(
            op,
            format!("expected a float operand, got {a}"),
        ))
    }
}

// ---------------------------------------------------------------- unary

/// Unary element-wise functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `e^x`
    Exp,
    /// natural log
    Log,
    /// `tanh x`
    Tanh,
    /// logistic sigmoid
    Sigmoid,
    /// `max(x, 0)`
    Relu,
    /// square root
    Sqrt,
    /// absolute value
    Abs,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// `x*x`
    Square,
    /// `1/x`
    Reciprocal,
    /// `log(1 + e^x)`
    Softplus,
    /// Heaviside step `1[x > 0]` as a float (zero derivative); also the derivative of relu.
    Step,
    /// sign of x (zero derivative)
    Sign,
    /// arctangent
    Atan,
}

impl UnaryOp {
    fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "logistic",
            UnaryOp::Relu => "relu",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Square => "square",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Softplus => "softplus",
            UnaryOp::Step => "step",
            UnaryOp::Sign => "sign",
            UnaryOp::Atan => "atan",
        }
    }
    #[inline(always)]
    pub(crate) fn apply<T: Float>(self, x: T) -> T {
        let one = T::one();
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => {
                // One exp of -|x| (never overflows) for both signs: the
                // same values as exp(-x) for x >= 0 and exp(x) below, but
                // a loop the compiler if-converts no longer calls exp twice
                // per element.
                let e = (-x.abs()).exp();
                if x >= T::zero() {
                    one / (one + e)
                } else {
                    e / (one + e)
                }
            }
            UnaryOp::Relu => x.max(T::zero()),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Square => x * x,
            UnaryOp::Reciprocal => one / x,
            UnaryOp::Softplus => {
                // log(1+e^x) = max(x,0) + log1p(e^-|x|), stable for large |x|.
                x.max(T::zero()) + (-x.abs()).exp().ln_1p()
            }
            UnaryOp::Step => {
                if x > T::zero() {
                    one
                } else {
                    T::zero()
                }
            }
            UnaryOp::Atan => x.atan(),
            UnaryOp::Sign => {
                if x > T::zero() {
                    one
                } else if x < T::zero() {
                    -one
                } else {
                    T::zero()
                }
            }
        }
    }
}

/// `op` over every element. The op is matched once, outside the loop, so
/// each arm's loop is specialised (and vectorised where it can be): one
/// loop over the data's memory (see `map_elements`).
fn map_unary<T: Float>(op: UnaryOp, a: &ArrayD<T>) -> ArrayD<T> {
    macro_rules! arms {
        ($($v:ident),*) => {
            match op {
                $(UnaryOp::$v => map_elements(a, |x| UnaryOp::$v.apply(x)),)*
            }
        };
    }
    arms!(
        Neg, Exp, Log, Tanh, Sigmoid, Relu, Sqrt, Abs, Sin, Cos, Square, Reciprocal, Softplus,
        Step, Sign, Atan
    )
}

/// f32 uses the vectorisable `exp`/`sigmoid`/`tanh` of
/// [`crate::kernels::fastmath`] (a few ulp), through [`unary_block_f32`]
/// (compiled with FMA where the CPU has it); everything else as
/// [`map_unary`].
fn map_unary_f32(op: UnaryOp, a: &ArrayD<f32>) -> ArrayD<f32> {
    match op {
        UnaryOp::Exp | UnaryOp::Sigmoid | UnaryOp::Tanh => {
            let a = crate::tensor::standard_layout(a);
            let src = crate::tensor::row_major(&a);
            let mut out = vec![0f32; src.len()];
            unary_block_f32(op, src, &mut out);
            ArrayD::from_shape_vec(a.raw_dim(), out).expect("same number of elements")
        }
        _ => map_unary(op, a),
    }
}

avx2_dispatch!(avx512:
    /// `op` over one block (the fused executor's kernel); the same element
    /// functions as [`map_unary`].
    pub(crate) fn unary_block<T: Float>(op: UnaryOp, a: &[T], out: &mut [T]) => unary_loop
);

#[inline(always)]
fn unary_loop<T: Float>(op: UnaryOp, a: &[T], out: &mut [T]) {
    macro_rules! arms {
        ($($v:ident),*) => {
            match op {
                $(UnaryOp::$v => {
                    for (o, &x) in out.iter_mut().zip(a) {
                        *o = UnaryOp::$v.apply(x);
                    }
                })*
            }
        };
    }
    arms!(
        Neg, Exp, Log, Tanh, Sigmoid, Relu, Sqrt, Abs, Sin, Cos, Square, Reciprocal, Softplus,
        Step, Sign, Atan
    )
}

avx2_dispatch!(avx512:
    /// `op` over one f32 block, as [`map_unary_f32`].
    pub(crate) fn unary_block_f32(op: UnaryOp, a: &[f32], out: &mut [f32]) => unary_loop_f32
);

#[inline(always)]
fn unary_loop_f32(op: UnaryOp, a: &[f32], out: &mut [f32]) {
    use crate::kernels::fastmath::{exp_f32, sigmoid_f32, tanh_f32};
    // One loop per function (not a function pointer): each is inlined and
    // vectorised.
    macro_rules! run {
        ($f:expr) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = $f(x);
            }
        };
    }
    match op {
        UnaryOp::Exp => run!(exp_f32),
        UnaryOp::Sigmoid => run!(sigmoid_f32),
        UnaryOp::Tanh => run!(tanh_f32),
        _ => unary_loop(op, a, out),
    }
}

/// A unary element-wise op.
#[derive(Clone, Debug)]
pub struct Unary(pub UnaryOp);

impl Elementwise for Unary {
    fn arity(&self) -> usize {
        1
    }
    fn block_f32(&self, ins: &[&[f32]], out: &mut [f32]) {
        unary_block_f32(self.0, ins[0], out)
    }
    fn block_f64(&self, ins: &[&[f64]], out: &mut [f64]) {
        unary_block(self.0, ins[0], out)
    }
}

impl Primitive for Unary {
    fn name(&self) -> String {
        self.0.name().to_string()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        super::check_arity(&self.name(), inputs, 1)?;
        float_aval(&self.name(), &inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        super::check_arity(&self.name(), inputs, 1)?;
        let op = self.0;
        let d = match inputs[0].data_for(op.name())? {
            ArrayData::F32(a) => ArrayData::F32(map_unary_f32(op, a)),
            other => map_float!(other, op.name(), |a| map_unary(op, a))?,
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let x = &p[0];
        let y = unary(self.0, x)?;
        let Some(t) = &t[0] else {
            return Ok((vec![y], vec![None]));
        };
        let dt = match self.0 {
            UnaryOp::Neg => t.neg()?,
            UnaryOp::Exp => t.mul(&y)?,
            UnaryOp::Log => t.div(x)?,
            UnaryOp::Tanh => t.mul(&y.square()?.rsub_scalar(1.0)?)?,
            UnaryOp::Sigmoid => t.mul(&y.mul(&y.rsub_scalar(1.0)?)?)?,
            UnaryOp::Relu => t.mul(&x.step()?)?,
            UnaryOp::Sqrt => t.div(&y)?.mul_scalar(0.5)?,
            UnaryOp::Abs => t.mul(&x.sign()?)?,
            UnaryOp::Sin => t.mul(&x.cos()?)?,
            UnaryOp::Cos => t.mul(&x.sin()?)?.neg()?,
            UnaryOp::Square => t.mul(x)?.mul_scalar(2.0)?,
            UnaryOp::Reciprocal => t.mul(&y.square()?)?.neg()?,
            UnaryOp::Atan => t.div(&x.square()?.add_scalar(1.0)?)?,
            UnaryOp::Softplus => t.mul(&x.sigmoid()?)?,
            UnaryOp::Step | UnaryOp::Sign => return Ok((vec![y], vec![None])),
        };
        Ok((vec![y], vec![Some(dt)]))
    }
    fn transpose(
        &self,
        cts: &[Option<Tensor>],
        _args: &[LinearArg],
    ) -> Result<Vec<Option<Tensor>>> {
        match self.0 {
            UnaryOp::Neg => Ok(vec![cts[0].as_ref().map(Tensor::neg).transpose()?]),
            _ => Err(Error::MissingRule {
                primitive: self.name(),
                rule: "transpose".into(),
                detail: " (not linear)".into(),
            }),
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((vec![unary(self.0, &args[0])?], vec![batched[0]]))
    }
    fn elementwise(&self) -> Option<&dyn Elementwise> {
        Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Apply a unary op.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    bind1(Arc::new(Unary(op)), std::slice::from_ref(x))
}

// ---------------------------------------------------------------- binary

/// Binary element-wise functions on operands of equal shape and dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// element-wise maximum
    Max,
    /// element-wise minimum
    Min,
    /// `a ^ b`
    Pow,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Pow => "pow",
        }
    }
    #[inline(always)]
    pub(crate) fn apply<T: Float>(self, a: T, b: T) -> T {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Pow => a.powf(b),
        }
    }
}

/// `f` element-wise over `a` and `b` broadcast (numpy rules) to `shape`.
fn zip2<T: Float>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    shape: &[usize],
    f: impl Fn(T, T) -> T,
) -> ArrayD<T> {
    // Equal shapes, a scalar, a bias row or a column: flat loops over
    // row-major data (see `kernels::broadcast`).
    if let Some(r) = zip_flat(a, b, shape, &f) {
        return r;
    }
    let sh = ndarray::IxDyn(shape);
    let av = a
        .broadcast(sh.clone())
        .expect("shape rule checked broadcasting");
    let bv = b.broadcast(sh).expect("shape rule checked broadcasting");
    // Iterating broadcast views with a fixed dimension is several times
    // faster than with IxDyn.
    macro_rules! fixed {
        ($d:ty) => {{
            let av = av.into_dimensionality::<$d>().expect("rank matches");
            let bv = bv.into_dimensionality::<$d>().expect("rank matches");
            Zip::from(&av)
                .and(&bv)
                .map_collect(|&x, &y| f(x, y))
                .into_dyn()
        }};
    }
    match shape.len() {
        1 => fixed!(ndarray::Ix1),
        2 => fixed!(ndarray::Ix2),
        3 => fixed!(ndarray::Ix3),
        4 => fixed!(ndarray::Ix4),
        5 => fixed!(ndarray::Ix5),
        _ => Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)),
    }
}

/// Sum `x` down to `shape` (the transpose of numpy broadcasting).
pub(crate) fn unbroadcast(x: Tensor, shape: &[usize]) -> Result<Tensor> {
    if x.shape() == shape {
        return Ok(x);
    }
    let lead = x.ndim() - shape.len();
    let axes: Vec<usize> = (0..x.ndim())
        .filter(|&i| i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1))
        .collect();
    x.sum(&axes)?.reshape(shape)
}

/// `op` element-wise with broadcasting; matched once, outside the loop.
fn zip_binary<T: Float>(op: BinaryOp, a: &ArrayD<T>, b: &ArrayD<T>, shape: &[usize]) -> ArrayD<T> {
    macro_rules! arms {
        ($($v:ident),*) => {
            match op {
                $(BinaryOp::$v => zip2(a, b, shape, |x, y| BinaryOp::$v.apply(x, y)),)*
            }
        };
    }
    arms!(Add, Sub, Mul, Div, Max, Min, Pow)
}

avx2_dispatch!(avx512:
    /// `a·b + c` over one block: a `mul` whose only reader is an `add`,
    /// fused by the planned executor. The product is rounded before the
    /// sum (no fused multiply-add), so the bits are those of the two ops.
    pub(crate) fn mul_add_block<T: Float>(a: &[T], b: &[T], c: &[T], out: &mut [T]) => mul_add_loop
);

#[inline(always)]
fn mul_add_loop<T: Float>(a: &[T], b: &[T], c: &[T], out: &mut [T]) {
    for (((o, &x), &y), &z) in out.iter_mut().zip(a).zip(b).zip(c) {
        *o = x * y + z;
    }
}

avx2_dispatch!(avx512:
    /// `a·s + c` over one block: a `mul_scalar` whose only reader is an
    /// `add`, fused by the planned executor; `s` converts as in
    /// [`scalar_block`], and the bits are those of the two ops.
    pub(crate) fn scale_add_block<T: Float>(value: f64, a: &[T], c: &[T], out: &mut [T]) => scale_add_loop
);

#[inline(always)]
fn scale_add_loop<T: Float>(value: f64, a: &[T], c: &[T], out: &mut [T]) {
    let s = T::from(value).unwrap_or_else(T::nan);
    for ((o, &x), &z) in out.iter_mut().zip(a).zip(c) {
        *o = x * s + z;
    }
}

/// A binary element-wise op (operands of equal shape; broadcasting happens
/// in the `Tensor` methods before binding).
#[derive(Clone, Debug)]
pub struct Binary(pub BinaryOp);

avx2_dispatch!(avx512:
    /// `op` over one block (the fused executor's kernel).
    pub(crate) fn binary_block<T: Float>(op: BinaryOp, a: &[T], b: &[T], out: &mut [T]) => binary_loop
);

#[inline(always)]
fn binary_loop<T: Float>(op: BinaryOp, a: &[T], b: &[T], out: &mut [T]) {
    macro_rules! arms {
        ($($v:ident),*) => {
            match op {
                $(BinaryOp::$v => {
                    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                        *o = BinaryOp::$v.apply(x, y);
                    }
                })*
            }
        };
    }
    arms!(Add, Sub, Mul, Div, Max, Min, Pow)
}

impl Elementwise for Binary {
    fn arity(&self) -> usize {
        2
    }
    fn block_f32(&self, ins: &[&[f32]], out: &mut [f32]) {
        binary_block(self.0, ins[0], ins[1], out)
    }
    fn block_f64(&self, ins: &[&[f64]], out: &mut [f64]) {
        binary_block(self.0, ins[0], ins[1], out)
    }
}

impl Primitive for Binary {
    fn name(&self) -> String {
        self.0.name().to_string()
    }
    fn neutral_operands(&self) -> [Option<f64>; 2] {
        match self.0 {
            BinaryOp::Add => [Some(0.0), Some(0.0)],
            BinaryOp::Sub => [None, Some(0.0)],
            BinaryOp::Mul => [Some(1.0), Some(1.0)],
            BinaryOp::Div => [None, Some(1.0)],
            _ => [None, None],
        }
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let n = self.name();
        super::check_arity(&n, inputs, 2)?;
        let (a, b) = (&inputs[0], &inputs[1]);
        if a.dtype() != b.dtype() {
            return Err(Error::dtype(
                &n,
                format!(
                    "operands have dtypes {} and {} (shapes {:?} and {:?}); cast one first",
                    a.dtype(),
                    b.dtype(),
                    a.shape(),
                    b.shape()
                ),
            ));
        }
        float_aval(&n, a)?;
        let shape = super::broadcast_shapes(&n, &[a.shape(), b.shape()])?;
        Ok(vec![a.with_shape(&shape)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let avals: Vec<Aval> = inputs.iter().map(Tensor::aval).collect();
        let out = self.abstract_eval(&avals)?.remove(0);
        let op = self.0;
        let n = op.name();
        let d = map_float2!(inputs[0].data_for(n)?, inputs[1].data_for(n)?, n, |a, b| {
            zip_binary(op, a, b, out.shape())
        })?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let (a, b) = (&p[0], &p[1]);
        let y = binary(self.0, a, b)?;
        let (ta, tb) = (&t[0], &t[1]);
        let dt = match self.0 {
            BinaryOp::Add => add_opt(ta.clone(), tb.clone())?,
            BinaryOp::Sub => sub_opt(ta.clone(), tb.clone())?,
            BinaryOp::Mul => add_opt(
                ta.as_ref().map(|t| t.mul(b)).transpose()?,
                tb.as_ref().map(|t| a.mul(t)).transpose()?,
            )?,
            BinaryOp::Div => {
                let l = ta.as_ref().map(|t| t.div(b)).transpose()?;
                let r = tb.as_ref().map(|t| t.mul(&y)?.div(b)).transpose()?;
                sub_opt(l, r)?
            }
            BinaryOp::Max | BinaryOp::Min => {
                // The winner takes the tangent; exact ties split it evenly, as JAX does.
                let wins = if self.0 == BinaryOp::Max {
                    a.gt(b)?
                } else {
                    a.lt(b)?
                };
                let ties = a.eq_elem(b)?;
                let dtype = a.dtype();
                let w_a = wins.cast(dtype)?.add(&ties.cast(dtype)?.mul_scalar(0.5)?)?;
                let l = ta.as_ref().map(|t| t.mul(&w_a)).transpose()?;
                let r = tb
                    .as_ref()
                    .map(|t| t.mul(&w_a.rsub_scalar(1.0)?))
                    .transpose()?;
                add_opt(l, r)?
            }
            BinaryOp::Pow => {
                let l = ta
                    .as_ref()
                    .map(|t| t.mul(&b.mul(&a.pow(&b.add_scalar(-1.0)?)?)?))
                    .transpose()?;
                let r = tb.as_ref().map(|t| t.mul(&a.log()?.mul(&y)?)).transpose()?;
                add_opt(l, r)?
            }
        };
        // A tangent of a broadcast operand alone has the operand's shape.
        let dt = dt.map(|t| super::lift(&t, y.shape())).transpose()?;
        Ok((vec![y], vec![dt]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        let lin = |i: usize| args[i].is_linear();
        let back = |i: usize, t: Tensor| unbroadcast(t, args[i].aval().shape()).map(Some);
        match self.0 {
            BinaryOp::Add => Ok(vec![
                if lin(0) { back(0, ct.clone())? } else { None },
                if lin(1) { back(1, ct.clone())? } else { None },
            ]),
            BinaryOp::Sub => Ok(vec![
                if lin(0) { back(0, ct.clone())? } else { None },
                if lin(1) { back(1, ct.neg()?)? } else { None },
            ]),
            BinaryOp::Mul => {
                if lin(0) && lin(1) {
                    return Err(Error::invalid(
                        "mul",
                        "transpose of mul with both operands linear",
                    ));
                }
                if lin(0) {
                    Ok(vec![back(0, ct.mul(args[1].known("mul")?)?)?, None])
                } else {
                    Ok(vec![None, back(1, args[0].known("mul")?.mul(ct)?)?])
                }
            }
            BinaryOp::Div if lin(0) && !lin(1) => {
                Ok(vec![back(0, ct.div(args[1].known("div")?)?)?, None])
            }
            _ => Err(Error::MissingRule {
                primitive: self.name(),
                rule: "transpose".into(),
                detail: " (not linear in these operands)".into(),
            }),
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let _ = size;
        // Per-example ranks; a batched operand of lower rank gets unit axes
        // after its batch axis so numpy's right alignment still holds.
        let rank = |i: usize| args[i].ndim() - usize::from(batched[i]);
        let out_rank = rank(0).max(rank(1));
        let align = |i: usize| -> Result<Tensor> {
            let x = &args[i];
            if !batched[i] || rank(i) == out_rank {
                return Ok(x.clone());
            }
            let mut sh = vec![x.shape()[0]];
            sh.extend(std::iter::repeat_n(1, out_rank - rank(i)));
            sh.extend(&x.shape()[1..]);
            x.reshape(&sh)
        };
        let (a, b) = (align(0)?, align(1)?);
        Ok((vec![binary(self.0, &a, &b)?], vec![true]))
    }
    fn elementwise(&self) -> Option<&dyn Elementwise> {
        Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Sum of optional tangents (`None` = zero).
pub(crate) fn add_opt(a: Option<Tensor>, b: Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(match (a, b) {
        (None, None) => None,
        (Some(a), None) => Some(a),
        (None, Some(b)) => Some(b),
        (Some(a), Some(b)) => Some(binary(BinaryOp::Add, &a, &b)?),
    })
}

/// `a - b` of optional tangents (a missing one is zero): one `sub`, not
/// `a + neg(b)` (the same bits, one pass fewer).
pub(crate) fn sub_opt(a: Option<Tensor>, b: Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(match (a, b) {
        (None, None) => None,
        (Some(a), None) => Some(a),
        (None, Some(b)) => Some(b.neg()?),
        (Some(a), Some(b)) => Some(binary(BinaryOp::Sub, &a, &b)?),
    })
}

/// Apply a binary op to equal-shaped operands (no broadcasting).
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    bind1(Arc::new(Binary(op)), &[a.clone(), b.clone()])
}

// ---------------------------------------------------------------- scalar

/// Ops of a tensor and a static scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarOp {
    /// `x + s`
    Add,
    /// `x * s`
    Mul,
    /// `x / s` (a true division: `x * (1/s)` overflows for a subnormal `s`)
    Div,
    /// `s - x`
    RSub,
    /// `s / x`
    RDiv,
    /// `x ^ s`
    Pow,
    /// `max(x, s)`
    Max,
    /// `min(x, s)`
    Min,
}

/// A tensor-scalar op; the scalar is a static parameter.
#[derive(Clone, Debug)]
pub struct Scalar {
    /// Which op.
    pub op: ScalarOp,
    /// The scalar.
    pub value: f64,
}

impl Scalar {
    fn kernel_name(&self) -> &'static str {
        match self.op {
            ScalarOp::Add => "add_scalar",
            ScalarOp::Mul => "mul_scalar",
            ScalarOp::Div => "div_scalar",
            ScalarOp::RSub => "rsub_scalar",
            ScalarOp::RDiv => "rdiv_scalar",
            ScalarOp::Pow => "pow_scalar",
            ScalarOp::Max => "max_scalar",
            ScalarOp::Min => "min_scalar",
        }
    }
}

impl ScalarOp {
    /// The op on one element (the in-place kernels use it; [`map_scalar`]
    /// is the allocating form).
    #[inline(always)]
    pub(crate) fn apply<T: Float>(self, x: T, s: T) -> T {
        match self {
            ScalarOp::Add => x + s,
            ScalarOp::Mul => x * s,
            ScalarOp::Div => x / s,
            ScalarOp::RSub => s - x,
            ScalarOp::RDiv => s / x,
            ScalarOp::Pow => x.powf(s),
            ScalarOp::Max => x.max(s),
            ScalarOp::Min => x.min(s),
        }
    }
}

/// `op` with a scalar over every element; matched once, outside the loop.
fn map_scalar<T: Float>(op: ScalarOp, value: f64, a: &ArrayD<T>) -> ArrayD<T> {
    let s = T::from(value).expect("f64 converts to a float type");
    match op {
        ScalarOp::Add => map_elements(a, |x| x + s),
        ScalarOp::Mul => map_elements(a, |x| x * s),
        ScalarOp::Div => map_elements(a, |x| x / s),
        ScalarOp::RSub => map_elements(a, |x| s - x),
        ScalarOp::RDiv => map_elements(a, |x| s / x),
        ScalarOp::Pow => map_elements(a, |x| x.powf(s)),
        ScalarOp::Max => map_elements(a, |x| x.max(s)),
        ScalarOp::Min => map_elements(a, |x| x.min(s)),
    }
}

avx2_dispatch!(avx512:
    /// `op` with a scalar over one block (the fused executor's kernel), as
    /// [`map_scalar`].
    pub(crate) fn scalar_block<T: Float>(op: ScalarOp, value: f64, a: &[T], out: &mut [T]) => scalar_loop
);

#[inline(always)]
fn scalar_loop<T: Float>(op: ScalarOp, value: f64, a: &[T], out: &mut [T]) {
    let s = T::from(value).unwrap_or_else(T::nan);
    macro_rules! arms {
        ($($v:ident),*) => {
            match op {
                $(ScalarOp::$v => {
                    for (o, &x) in out.iter_mut().zip(a) {
                        *o = ScalarOp::$v.apply(x, s);
                    }
                })*
            }
        };
    }
    arms!(Add, Mul, Div, RSub, RDiv, Pow, Max, Min)
}

impl Elementwise for Scalar {
    fn arity(&self) -> usize {
        1
    }
    fn block_f32(&self, ins: &[&[f32]], out: &mut [f32]) {
        scalar_block(self.op, self.value, ins[0], out)
    }
    fn block_f64(&self, ins: &[&[f64]], out: &mut [f64]) {
        scalar_block(self.op, self.value, ins[0], out)
    }
}

impl Primitive for Scalar {
    fn name(&self) -> String {
        self.kernel_name().to_string()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("s".into(), format!("{}", self.value))]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        super::check_arity(&self.name(), inputs, 1)?;
        float_aval(&self.name(), &inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        super::check_arity(&self.name(), inputs, 1)?;
        let n = self.kernel_name();
        let d = map_float!(inputs[0].data_for(n)?, n, |a| map_scalar(
            self.op, self.value, a
        ))?;
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let x = &p[0];
        let y = bind1(Arc::new(self.clone()), std::slice::from_ref(x))?;
        let Some(t) = &t[0] else {
            return Ok((vec![y], vec![None]));
        };
        let s = self.value;
        let dt = match self.op {
            ScalarOp::Add => t.clone(),
            ScalarOp::Mul => t.mul_scalar(s)?,
            ScalarOp::Div => t.div_scalar(s)?,
            ScalarOp::RSub => t.neg()?,
            // d(s/x) = -s/x^2 (not -y^2/s, which is NaN for s = 0).
            ScalarOp::RDiv => t.mul(&x.square()?.rdiv_scalar(-s)?)?,
            // x^0 is constant (x^-1 * 0 would be NaN at x = 0).
            ScalarOp::Pow if s == 0.0 => return Ok((vec![y], vec![None])),
            ScalarOp::Pow => t.mul(&x.pow_scalar(s - 1.0)?)?.mul_scalar(s)?,
            ScalarOp::Max => t.mul(&x.add_scalar(-s)?.step()?)?,
            ScalarOp::Min => t.mul(&x.rsub_scalar(s)?.step()?)?,
        };
        Ok((vec![y], vec![Some(dt)]))
    }
    fn transpose(
        &self,
        cts: &[Option<Tensor>],
        _args: &[LinearArg],
    ) -> Result<Vec<Option<Tensor>>> {
        match self.op {
            ScalarOp::Mul => Ok(vec![cts[0]
                .as_ref()
                .map(|c| c.mul_scalar(self.value))
                .transpose()?]),
            ScalarOp::Div => Ok(vec![cts[0]
                .as_ref()
                .map(|c| c.div_scalar(self.value))
                .transpose()?]),
            _ => Err(Error::MissingRule {
                primitive: self.name(),
                rule: "transpose".into(),
                detail: " (not linear)".into(),
            }),
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((
            vec![bind1(Arc::new(self.clone()), &args[..1])?],
            vec![batched[0]],
        ))
    }
    fn elementwise(&self) -> Option<&dyn Elementwise> {
        Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Apply a tensor-scalar op (`x * 1` and `x / 1` of a float `x` are `x`
/// itself: no equation is recorded).
pub fn scalar_op(op: ScalarOp, x: &Tensor, value: f64) -> Result<Tensor> {
    // `x * 1` and `x / 1` are `x`, bit for bit: no equation (a model's
    // `v - v_th * s` with `v_th = 1`, and its derivatives, would otherwise
    // add a full pass over the data to every step).
    if value == 1.0 && matches!(op, ScalarOp::Mul | ScalarOp::Div) && x.dtype().is_float() {
        return Ok(x.clone());
    }
    bind1(Arc::new(Scalar { op, value }), std::slice::from_ref(x))
}

// ---------------------------------------------------------------- compare

/// Comparisons, producing bool tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
}

/// An element-wise comparison of equal-shaped operands (no derivative).
#[derive(Clone, Debug)]
pub struct Compare(pub CompareOp);

impl Compare {
    fn test<T: PartialOrd>(&self, a: T, b: T) -> bool {
        match self.0 {
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
        }
    }
}

impl Primitive for Compare {
    fn name(&self) -> String {
        match self.0 {
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
        }
        .to_string()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        super::check_arity(&self.name(), inputs, 2)?;
        same_avals(&self.name(), &inputs[0], &inputs[1])?;
        Ok(vec![inputs[0].with_dtype(DType::Bool)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let avals: Vec<Aval> = inputs.iter().map(Tensor::aval).collect();
        self.abstract_eval(&avals)?;
        let n = self.name();
        fn cmp<T: Copy + PartialOrd>(c: &Compare, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<bool> {
            // Equal shapes (checked): one flat loop over row-major data.
            zip_flat(a, b, a.shape(), |x, y| c.test(x, y))
                .unwrap_or_else(|| Zip::from(a).and(b).map_collect(|&x, &y| c.test(x, y)))
        }
        let r = match (inputs[0].data_for(&n)?, inputs[1].data_for(&n)?) {
            (ArrayData::F32(a), ArrayData::F32(b)) => cmp(self, a, b),
            (ArrayData::F64(a), ArrayData::F64(b)) => cmp(self, a, b),
            (ArrayData::I64(a), ArrayData::I64(b)) => cmp(self, a, b),
            (ArrayData::Bool(a), ArrayData::Bool(b)) => cmp(self, a, b),
            _ => unreachable!("dtypes checked equal"),
        };
        Ok(vec![Tensor::from_array(r)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        _t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((vec![bind1(Arc::new(self.clone()), p)?], vec![None]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let a = bcast_to_batch(&args[0], batched[0], size)?;
        let b = bcast_to_batch(&args[1], batched[1], size)?;
        Ok((vec![bind1(Arc::new(self.clone()), &[a, b])?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Compare two tensors (broadcasting).
pub fn compare(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = super::broadcast_pair("compare", a, b)?;
    bind1(Arc::new(Compare(op)), &[a, b])
}

// ---------------------------------------------------------------- select

/// `where(cond, a, b)` for equal shapes; `cond` is bool.
#[derive(Clone, Debug)]
pub struct Select;

impl Primitive for Select {
    fn name(&self) -> String {
        "select".into()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        super::check_arity("select", inputs, 3)?;
        if inputs[0].dtype() != DType::Bool {
            return Err(Error::dtype(
                "select",
                format!("condition must be bool, got {}", inputs[0]),
            ));
        }
        if inputs[0].shape() != inputs[1].shape() {
            return Err(Error::shapes(
                "select",
                inputs.iter().map(Aval::shape),
                "condition and values must have equal shapes",
            ));
        }
        same_avals("select", &inputs[1], &inputs[2])?;
        Ok(vec![inputs[1].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let avals: Vec<Aval> = inputs.iter().map(Tensor::aval).collect();
        self.abstract_eval(&avals)?;
        let c = inputs[0].data_for("select")?.as_bool("select")?;
        fn sel<T: Copy>(c: &ArrayD<bool>, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<T> {
            Zip::from(c)
                .and(a)
                .and(b)
                .map_collect(|&c, &x, &y| if c { x } else { y })
        }
        let d = match (inputs[1].data_for("select")?, inputs[2].data_for("select")?) {
            (ArrayData::F32(a), ArrayData::F32(b)) => ArrayData::F32(sel(c, a, b)),
            (ArrayData::F64(a), ArrayData::F64(b)) => ArrayData::F64(sel(c, a, b)),
            (ArrayData::I64(a), ArrayData::I64(b)) => ArrayData::I64(sel(c, a, b)),
            (ArrayData::Bool(a), ArrayData::Bool(b)) => ArrayData::Bool(sel(c, a, b)),
            _ => unreachable!("dtypes checked equal"),
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = select(&p[0], &p[1], &p[2])?;
        let dt = match (&t[1], &t[2]) {
            (None, None) => None,
            (ta, tb) => {
                let ta = ta.clone().unwrap_or_else(|| zeros_for(&p[1]));
                let tb = tb.clone().unwrap_or_else(|| zeros_for(&p[2]));
                Some(select(&p[0], &ta, &tb)?)
            }
        };
        Ok((vec![y], vec![dt]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None, None]);
        };
        let c = args[0].known("select")?;
        let z = ct.zeros_like();
        let a = if args[1].is_linear() {
            Some(select(c, ct, &z)?)
        } else {
            None
        };
        let b = if args[2].is_linear() {
            Some(select(c, &z, ct)?)
        } else {
            None
        };
        Ok(vec![None, a, b])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let a: Vec<Tensor> = (0..3)
            .map(|i| bcast_to_batch(&args[i], batched[i], size))
            .collect::<Result<_>>()?;
        Ok((vec![bind1(Arc::new(Select), &a)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `where(cond, a, b)` with broadcasting of all three.
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = super::broadcast_shapes("select", &[cond.shape(), a.shape(), b.shape()])?;
    let c = lift(cond, &shape)?;
    let a = lift(a, &shape)?;
    let b = lift(b, &shape)?;
    bind1(Arc::new(Select), &[c, a, b])
}

// ---------------------------------------------------------------- cast

/// Convert to another dtype.
#[derive(Clone, Debug)]
pub struct Cast(pub DType);

impl Primitive for Cast {
    fn name(&self) -> String {
        "convert_element_type".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("new_dtype".into(), self.0.to_string())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        super::check_arity(&self.name(), inputs, 1)?;
        Ok(vec![inputs[0].with_dtype(self.0)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        super::check_arity(&self.name(), inputs, 1)?;
        Ok(vec![Tensor::from_data(
            inputs[0].data_for("cast")?.cast(self.0),
        )])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = p[0].cast(self.0)?;
        let dt = match &t[0] {
            Some(t) if self.0.is_float() && p[0].dtype().is_float() => Some(t.cast(self.0)?),
            _ => None,
        };
        Ok((vec![y], vec![dt]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let back = args[0].aval().dtype();
        Ok(vec![cts[0].as_ref().map(|c| c.cast(back)).transpose()?])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((vec![args[0].cast(self.0)?], vec![batched[0]]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- stop_gradient

/// Identity whose derivative is zero.
#[derive(Clone, Debug)]
pub struct StopGradient;

impl Primitive for StopGradient {
    fn name(&self) -> String {
        "stop_gradient".into()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        super::check_arity("stop_gradient", inputs, 1)?;
        Ok(vec![inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        super::check_arity("stop_gradient", inputs, 1)?;
        Ok(vec![inputs[0].clone()])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        _t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((vec![p[0].stop_gradient()?], vec![None]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((vec![args[0].stop_gradient()?], vec![batched[0]]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Values across signs and magnitudes, with the edge cases the element
    /// functions branch on (zero, ±1, the fast `exp`'s clamps, infinities).
    fn data<T: Float>(seed: u64, n: usize) -> Vec<T> {
        let mut rng = StdRng::seed_from_u64(seed);
        let edges = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.39,
            0.41,
            88.5,
            -88.5,
            1e-30,
            f64::INFINITY,
        ];
        (0..n)
            .map(|i| match i % 5 {
                0 => edges[(i / 5) % edges.len()],
                1 => rng.random_range(-100.0..100.0),
                _ => rng.random_range(-4.0..4.0),
            })
            .map(|x| T::from(x).expect("finite or infinite floats convert"))
            .collect()
    }

    fn same_bits<T: Float + std::fmt::Debug>(what: &str, a: &[T], b: &[T]) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let same = (x.is_nan() && y.is_nan()) || x.integer_decode() == y.integer_decode();
            assert!(same, "{what}: element {i}: dispatched {x:?}, plain {y:?}");
        }
    }

    /// The dispatched block kernels (AVX-512 or AVX2 where the CPU has it) give the
    /// same bits as the plain loops, for every op, in f32 and f64, on a
    /// length that is not a multiple of the vector width. (On a CPU without
    /// AVX2 both sides run the same code.)
    fn check<T: Float + std::fmt::Debug>(seed: u64) {
        let n = 261;
        let (a, b) = (data::<T>(seed, n), data::<T>(seed + 1, n));
        let (mut got, mut want) = (vec![T::zero(); n], vec![T::zero(); n]);
        use UnaryOp as U;
        for op in [
            U::Neg,
            U::Exp,
            U::Log,
            U::Tanh,
            U::Sigmoid,
            U::Relu,
            U::Sqrt,
            U::Abs,
            U::Sin,
            U::Cos,
            U::Square,
            U::Reciprocal,
            U::Softplus,
            U::Step,
            U::Sign,
            U::Atan,
        ] {
            unary_block(op, &a, &mut got);
            unary_loop(op, &a, &mut want);
            same_bits(op.name(), &got, &want);
        }
        use BinaryOp as B;
        for op in [B::Add, B::Sub, B::Mul, B::Div, B::Max, B::Min, B::Pow] {
            binary_block(op, &a, &b, &mut got);
            binary_loop(op, &a, &b, &mut want);
            same_bits(op.name(), &got, &want);
        }
        use ScalarOp as S;
        for op in [
            S::Add,
            S::Mul,
            S::Div,
            S::RSub,
            S::RDiv,
            S::Pow,
            S::Max,
            S::Min,
        ] {
            scalar_block(op, -1.7, &a, &mut got);
            scalar_loop(op, -1.7, &a, &mut want);
            same_bits(&format!("{op:?}"), &got, &want);
        }
    }

    /// `x * 1` and `x / 1` record no equation (and are `x`); other values,
    /// and integer operands, still do.
    #[test]
    fn multiplying_or_dividing_by_one_records_nothing() {
        use crate::graph::trace;
        use crate::tensor::Aval;
        let g = trace(
            |x: &[Tensor]| {
                Ok(vec![
                    x[0].mul_scalar(1.0)?.div_scalar(1.0)?,
                    x[0].mul_scalar(2.0)?.div_scalar(-1.0)?,
                ])
            },
            &[Aval::new(&[3], DType::F32)],
        )
        .unwrap();
        assert_eq!(g.eqns.len(), 2, "{g}");
        assert_eq!(g.outvars[0], g.invars[0], "{g}");
        let i = Tensor::from_vec_typed(vec![1i64, 2], &[2]).unwrap();
        let x = Tensor::from_vec(vec![1.5, -0.0, f64::INFINITY], &[3]).unwrap();
        let y = x.mul_scalar(1.0).unwrap().div_scalar(1.0).unwrap();
        assert_eq!(y.to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
        assert!(y.to_vec_f64().unwrap()[1].is_sign_negative());
        // Integers keep the op, and its checks.
        assert_eq!(
            i.mul_scalar(1.0)
                .map(|t| t.dtype())
                .map_err(|e| e.to_string()),
            i.mul_scalar(2.0)
                .map(|t| t.dtype())
                .map_err(|e| e.to_string()),
        );
    }

    /// The tangent of `a - b` (and of `a / b`) is one `sub`, not an `add`
    /// of a `neg`; the values are checked against the formulas.
    #[test]
    fn sub_and_div_tangents_subtract() {
        use crate::graph::trace;
        use crate::tensor::Aval;
        let f = |x: &[Tensor]| -> Result<Vec<Tensor>> {
            let (_, t) = crate::transform::jvp(
                |p: &[Tensor]| Ok(vec![p[0].sub(&p[1])?, p[0].div(&p[1])?]),
                &x[..2],
                &x[2..],
            )?;
            Ok(t)
        };
        let av = Aval::new(&[3], DType::F64);
        let g = trace(f, &[av.clone(), av.clone(), av.clone(), av]).unwrap();
        let names: Vec<String> = g.eqns.iter().map(|e| e.prim.name()).collect();
        assert!(!names.iter().any(|n| n == "neg"), "{g}");
        let v = |d: [f64; 3]| Tensor::from_vec(d.to_vec(), &[3]).unwrap();
        let (a, b, ta, tb) = (
            [1.0, -2.0, 3.0],
            [0.5, 4.0, -1.5],
            [0.3, 0.1, -2.0],
            [1.0, -0.7, 0.2],
        );
        let t = f(&[v(a), v(b), v(ta), v(tb)]).unwrap();
        let (dsub, ddiv) = (t[0].to_vec_f64().unwrap(), t[1].to_vec_f64().unwrap());
        for k in 0..3 {
            assert_eq!(dsub[k], ta[k] - tb[k]);
            let want = ta[k] / b[k] - tb[k] * (a[k] / b[k]) / b[k];
            assert!((ddiv[k] - want).abs() <= 1e-15 * want.abs().max(1.0), "{k}");
        }
    }

    /// Every copy the CPU can run: the widest, then (on a CPU with
    /// AVX-512) the AVX2 one.
    #[test]
    fn dispatched_block_kernels_match_the_plain_loops_bit_for_bit() {
        let all = || {
            for seed in [1, 7, 42] {
                check::<f64>(seed);
                check::<f32>(seed);
            }
            // f32's own kernels (the fast exp/sigmoid/tanh), and the
            // folded `a·b + c` and `a·s + c`.
            let (a, b, c) = (
                data::<f32>(3, 261),
                data::<f32>(4, 261),
                data::<f32>(5, 261),
            );
            let (mut got, mut want) = (vec![0.0; 261], vec![0.0; 261]);
            for op in [UnaryOp::Exp, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Log] {
                unary_block_f32(op, &a, &mut got);
                unary_loop_f32(op, &a, &mut want);
                same_bits(op.name(), &got, &want);
            }
            mul_add_block(&a, &b, &c, &mut got);
            mul_add_loop(&a, &b, &c, &mut want);
            same_bits("mul_add", &got, &want);
            scale_add_block(-0.3, &a, &c, &mut got);
            scale_add_loop(-0.3, &a, &c, &mut want);
            same_bits("scale_add", &got, &want);
        };
        all();
        crate::kernels::without_avx512(all);
    }
}
