//! Binary arithmetic on equal shapes (`add`, `mul`, `pow`, ...): kernels, the
//! folded multiply-add loops the executor uses, and their rules.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------- binary

pub use crate::graph::block_op::BinaryOp;

impl BinaryOp {
    pub(super) fn name(self) -> &'static str {
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
pub(super) fn mul_add_loop<T: Float>(a: &[T], b: &[T], c: &[T], out: &mut [T]) {
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
pub(super) fn scale_add_loop<T: Float>(value: f64, a: &[T], c: &[T], out: &mut [T]) {
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
pub(super) fn binary_loop<T: Float>(op: BinaryOp, a: &[T], b: &[T], out: &mut [T]) {
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
    fn block_op(&self) -> Option<crate::graph::BlockOp> {
        Some(crate::graph::BlockOp::Binary(self.0))
    }
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
        crate::ops::check_arity(&n, inputs, 2)?;
        let (a, b) = (&inputs[0], &inputs[1]);
        if a.dtype() != b.dtype() {
            return Err(Error::dtype_pair(
                &n,
                (a.dtype(), a.shape()),
                (b.dtype(), b.shape()),
                false,
                "cast one first",
            ));
        }
        float_aval(&n, a)?;
        let shape = crate::ops::broadcast_shapes(&n, &[a.shape(), b.shape()])?;
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
        let dt = dt.map(|t| crate::ops::lift(&t, y.shape())).transpose()?;
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
