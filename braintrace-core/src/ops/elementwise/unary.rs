//! Unary math ops (`neg`, `exp`, `tanh`, ...): their kernels, block loops and rules.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------- unary

pub use crate::graph::block_op::UnaryOp;

impl UnaryOp {
    pub(super) fn name(self) -> &'static str {
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
            UnaryOp::Erf => "erf",
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
            UnaryOp::Erf => T::from(erf_f64(x.to_f64().unwrap_or(f64::NAN))).unwrap_or(T::nan()),
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

/// `erf x` in f64 to a few ulps: for `|x| < 2.5` the series
/// `erf x = 2/√π · e^{−x²} · Σₙ 2ⁿ x^{2n+1} / (1·3·…·(2n+1))` (all terms
/// positive: no cancellation); beyond, `1 − erfc |x|` with `erfc` from its
/// continued fraction (Lentz), `±1` past 6.
pub(crate) fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a >= 6.0 {
        return x.signum();
    }
    if a < 2.5 {
        let x2 = x * x;
        let (mut term, mut sum, mut n) = (x, x, 0.0f64);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= 2.0 * x2 / (2.0 * n + 1.0);
            sum += term;
        }
        return std::f64::consts::FRAC_2_SQRT_PI * (-x2).exp() * sum;
    }
    // erfc(a) = e^{−a²}/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …)))),
    // evaluated as the continued fraction b₀ + K(aₖ/bₖ) with b = a,
    // aₖ = k/2, by the modified Lentz method.
    let tiny = 1e-300;
    let mut f = a;
    let (mut c, mut d) = (a, 0.0f64);
    for k in 1..200 {
        let ak = k as f64 / 2.0;
        d = a + ak * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = a + ak / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    let erfc = (-a * a).exp() / (std::f64::consts::PI.sqrt() * f);
    (1.0 - erfc).copysign(x)
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
        Step, Sign, Atan, Erf
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
pub(super) fn unary_loop<T: Float>(op: UnaryOp, a: &[T], out: &mut [T]) {
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
        Step, Sign, Atan, Erf
    )
}

avx2_dispatch!(avx512:
    /// `op` over one f32 block, as [`map_unary_f32`].
    pub(crate) fn unary_block_f32(op: UnaryOp, a: &[f32], out: &mut [f32]) => unary_loop_f32
);

#[inline(always)]
pub(super) fn unary_loop_f32(op: UnaryOp, a: &[f32], out: &mut [f32]) {
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
    fn block_op(&self) -> Option<crate::graph::BlockOp> {
        Some(crate::graph::BlockOp::Unary(self.0))
    }
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
        crate::ops::check_arity(&self.name(), inputs, 1)?;
        float_aval(&self.name(), &inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        crate::ops::check_arity(&self.name(), inputs, 1)?;
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
            // d erf / dx = 2/√π e^{−x²}
            UnaryOp::Erf => t.mul(
                &x.square()?
                    .neg()?
                    .exp()?
                    .mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?,
            )?,
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
