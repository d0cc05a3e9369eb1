//! Ops of a tensor and a scalar (`add_scalar`, `mul_scalar`, `pow_scalar`, ...).

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------- scalar

pub use crate::graph::block_op::ScalarOp;

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
pub(super) fn scalar_loop<T: Float>(op: ScalarOp, value: f64, a: &[T], out: &mut [T]) {
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
    fn block_op(&self) -> Option<crate::graph::BlockOp> {
        Some(crate::graph::BlockOp::Scalar(self.op, self.value))
    }
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
        crate::ops::check_arity(&self.name(), inputs, 1)?;
        float_aval(&self.name(), &inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        crate::ops::check_arity(&self.name(), inputs, 1)?;
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
