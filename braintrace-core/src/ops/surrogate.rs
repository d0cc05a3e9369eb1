//! The surrogate derivatives a [`spike`](fn@crate::ops::spike) uses in its JVP:
//! [`Surrogate`], its derivative `g(u)` written with core ops (and its own
//! derivative, so derivatives of every order are exact), and the block
//! kernel the fused executor runs. The surrogates follow brainstate's
//! (braintools') definitions; `alpha` sets the sharpness (see the table in
//! [`ops::spike`](super::spike)).

use super::check_arity;
use crate::error::{Error, Result};
use crate::graph::{bind1, Elementwise, Primitive};
use crate::tensor::{ArrayData, Aval, DType, Tensor};
use ndarray::ArrayD;
use num_traits::Float;
use std::any::Any;
use std::f64::consts::PI;
use std::sync::Arc;

pub use crate::graph::block_op::Surrogate;

pub(super) fn float_operand(op: &str, inputs: &[Aval]) -> Result<Aval> {
    check_arity(op, inputs, 1)?;
    if !inputs[0].dtype().is_float() {
        return Err(Error::dtype_with(
            op,
            "the membrane potential",
            DType::FLOATS,
            inputs[0].dtype(),
            format!("shape {:?}", inputs[0].shape()),
        ));
    }
    Ok(inputs[0].clone())
}

/// The surrogate derivative `g(u)` as a primitive (one fused kernel).
#[derive(Clone, Debug)]
pub struct SurrogateGrad(pub Surrogate);

impl Elementwise for SurrogateGrad {
    fn block_op(&self) -> Option<crate::graph::BlockOp> {
        Some(crate::graph::BlockOp::Surrogate(self.0))
    }
    fn arity(&self) -> usize {
        1
    }
    fn block_f32(&self, ins: &[&[f32]], out: &mut [f32]) {
        surrogate_block(self.0, ins[0], out)
    }
    fn block_f64(&self, ins: &[&[f64]], out: &mut [f64]) {
        surrogate_block(self.0, ins[0], out)
    }
}

impl Primitive for SurrogateGrad {
    fn name(&self) -> String {
        "spike_surrogate_grad".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("surrogate".into(), self.0.describe())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        Ok(vec![float_operand("spike_surrogate_grad", inputs)?])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        const OP: &str = "spike_surrogate_grad";
        check_arity(OP, inputs, 1)?;
        let s = self.0;
        let d = match inputs[0].data_for(OP)? {
            ArrayData::F32(a) => ArrayData::F32(surrogate_kernel(s, a)),
            ArrayData::F64(a) => ArrayData::F64(surrogate_kernel(s, a)),
            other => {
                return Err(Error::dtype_with(
                    OP,
                    "the membrane potential",
                    DType::FLOATS,
                    other.dtype(),
                    format!("shape {:?}", other.shape()),
                ))
            }
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        check_arity("spike_surrogate_grad", p, 1)?;
        let y = bind1(Arc::new(self.clone()), &p[..1])?;
        let dt = match t.first().and_then(Option::as_ref) {
            Some(t) => Some(t.mul(&self.0.second_derivative(&p[0])?)?),
            None => None,
        };
        Ok((vec![y], vec![dt]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        check_arity("spike_surrogate_grad", args, 1)?;
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

impl Default for Surrogate {
    /// braintrace's default: the arctan surrogate with `alpha = 2`, i.e.
    /// `g(u) = 1 / (1 + (πu)²)`.
    fn default() -> Self {
        Surrogate::Arctan { alpha: 2.0 }
    }
}

impl Surrogate {
    /// brainstate's `ReluGrad` defaults: `alpha = 0.3`, `width = 1`.
    pub fn relu_grad() -> Self {
        Surrogate::ReluGrad {
            alpha: 0.3,
            width: 1.0,
        }
    }
    /// brainstate's `Sigmoid` default: `alpha = 4`.
    pub fn sigmoid() -> Self {
        Surrogate::Sigmoid { alpha: 4.0 }
    }
    /// braintools' `PiecewiseQuadratic` default: `alpha = 1`.
    pub fn piecewise_quadratic() -> Self {
        Surrogate::PiecewiseQuadratic { alpha: 1.0 }
    }
    /// braintools' `PiecewiseExp` default: `alpha = 1`.
    pub fn piecewise_exp() -> Self {
        Surrogate::PiecewiseExp { alpha: 1.0 }
    }
    /// braintools' `SoftSign` default: `alpha = 1`.
    pub fn soft_sign() -> Self {
        Surrogate::SoftSign { alpha: 1.0 }
    }
    /// braintools' `ERF` default: `alpha = 1`.
    pub fn erf() -> Self {
        Surrogate::Erf { alpha: 1.0 }
    }
    /// braintools' `GaussianGrad` defaults: `sigma = 0.5`, `alpha = 0.5`.
    pub fn gaussian() -> Self {
        Surrogate::Gaussian {
            sigma: 0.5,
            alpha: 0.5,
        }
    }
    /// braintools' `MultiGaussianGrad` defaults: `h = 0.15`, `s = 6`,
    /// `sigma = 0.5`, `scale = 0.5`.
    pub fn multi_gaussian() -> Self {
        Surrogate::MultiGaussian {
            h: 0.15,
            s: 6.0,
            sigma: 0.5,
            scale: 0.5,
        }
    }
    /// braintools' `InvSquareGrad` default: `alpha = 100`.
    pub fn inv_square() -> Self {
        Surrogate::InvSquare { alpha: 100.0 }
    }
    /// braintools' `SlayerGrad` default: `alpha = 1`.
    pub fn slayer() -> Self {
        Surrogate::Slayer { alpha: 1.0 }
    }
    /// braintools' `LeakyRelu` defaults: `alpha = 0.1`, `beta = 1`.
    pub fn leaky_relu() -> Self {
        Surrogate::LeakyRelu {
            alpha: 0.1,
            beta: 1.0,
        }
    }
    /// braintools' `QPseudoSpike` default: `alpha = 2`.
    pub fn q_pseudo_spike() -> Self {
        Surrogate::QPseudoSpike { alpha: 2.0 }
    }
    /// Every surrogate with its braintools defaults (arctan with braintrace's
    /// `alpha = 2`), in declaration order: for tests and tables.
    pub fn all_defaults() -> Vec<Surrogate> {
        vec![
            Surrogate::default(),
            Surrogate::sigmoid(),
            Surrogate::relu_grad(),
            Surrogate::piecewise_quadratic(),
            Surrogate::piecewise_exp(),
            Surrogate::soft_sign(),
            Surrogate::erf(),
            Surrogate::gaussian(),
            Surrogate::multi_gaussian(),
            Surrogate::inv_square(),
            Surrogate::slayer(),
            Surrogate::leaky_relu(),
            Surrogate::q_pseudo_spike(),
        ]
    }
    /// The surrogate's short name and parameters, as printed in graphs.
    pub fn describe(&self) -> String {
        let (name, params) = self.parts();
        let p: Vec<String> = params.iter().map(|(k, v, _)| format!("{k}={v}")).collect();
        format!("{name}({})", p.join(","))
    }
    /// The name, and each parameter with its value and whether zero is
    /// allowed (a leaky ReLU's slope, a multi-Gaussian's side weight).
    fn parts(&self) -> (&'static str, Vec<(&'static str, f64, bool)>) {
        match *self {
            Surrogate::Arctan { alpha } => ("arctan", vec![("alpha", alpha, false)]),
            Surrogate::Sigmoid { alpha } => ("sigmoid", vec![("alpha", alpha, false)]),
            Surrogate::ReluGrad { alpha, width } => (
                "relu_grad",
                vec![("alpha", alpha, false), ("width", width, false)],
            ),
            Surrogate::PiecewiseQuadratic { alpha } => {
                ("piecewise_quadratic", vec![("alpha", alpha, false)])
            }
            Surrogate::PiecewiseExp { alpha } => ("piecewise_exp", vec![("alpha", alpha, false)]),
            Surrogate::SoftSign { alpha } => ("soft_sign", vec![("alpha", alpha, false)]),
            Surrogate::Erf { alpha } => ("erf", vec![("alpha", alpha, false)]),
            Surrogate::Gaussian { sigma, alpha } => (
                "gaussian",
                vec![("sigma", sigma, false), ("alpha", alpha, false)],
            ),
            Surrogate::MultiGaussian { h, s, sigma, scale } => (
                "multi_gaussian",
                vec![
                    ("h", h, true),
                    ("s", s, false),
                    ("sigma", sigma, false),
                    ("scale", scale, false),
                ],
            ),
            Surrogate::InvSquare { alpha } => ("inv_square", vec![("alpha", alpha, false)]),
            Surrogate::Slayer { alpha } => ("slayer", vec![("alpha", alpha, false)]),
            Surrogate::LeakyRelu { alpha, beta } => (
                "leaky_relu",
                vec![("alpha", alpha, true), ("beta", beta, true)],
            ),
            Surrogate::QPseudoSpike { alpha } => ("q_pseudo_spike", vec![("alpha", alpha, false)]),
        }
    }
    /// Parameters must be finite and positive (a leaky ReLU's slopes and a
    /// multi-Gaussian's `h` may be zero).
    pub fn validate(&self, op: &str) -> Result<()> {
        for (name, v, zero_ok) in self.parts().1 {
            let ok = v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0));
            if !ok {
                let want = if zero_ok {
                    "finite and non-negative"
                } else {
                    "finite and positive"
                };
                return Err(Error::Param {
                    op: op.to_string(),
                    param: name.to_string(),
                    reason: format!("must be {want}, got {v} (surrogate {})", self.describe()),
                });
            }
        }
        Ok(())
    }
    /// The surrogate derivative `g(u)` as a tensor (one
    /// `spike_surrogate_grad` equation under tracing).
    pub fn grad(&self, u: &Tensor) -> Result<Tensor> {
        self.validate("spike_surrogate_grad")?;
        bind1(Arc::new(SurrogateGrad(*self)), std::slice::from_ref(u))
    }
    /// The two constants of the element function `g` in `T` (see
    /// `with_surrogate!`): arctan `[α/2, πα/2]`, sigmoid `[α, 0]`, relu
    /// `[α, α·width]`. The optional code generator (`exec`'s `codegen`
    /// feature) takes them from here too; it knows only these three kinds (any other runs
    /// through [`surrogate_block`], whose arms read the parameters
    /// themselves; its constants here are unused zeros).
    pub(crate) fn constants<T: Float>(&self) -> [T; 2] {
        let c = |v: f64| T::from(v).unwrap_or_else(T::nan);
        match *self {
            Surrogate::Arctan { alpha } => [c(alpha / 2.0), c(PI * alpha / 2.0)],
            Surrogate::Sigmoid { alpha } => [c(alpha), T::zero()],
            Surrogate::ReluGrad { alpha, width } => [c(alpha), c(alpha * width)],
            _ => [T::zero(); 2],
        }
    }
    /// `g'(u)` written with core ops (the JVP of [`Surrogate::grad`]).
    pub(super) fn second_derivative(&self, u: &Tensor) -> Result<Tensor> {
        match *self {
            Surrogate::Arctan { alpha } => {
                // g = (α/2) / d, d = 1 + (c u)², c = πα/2: g' = -α c² u / d².
                let c = PI * alpha / 2.0;
                let d = u.mul_scalar(c)?.square()?.add_scalar(1.0)?;
                u.mul_scalar(-alpha * c * c)?.div(&d.square()?)
            }
            Surrogate::Sigmoid { alpha } => {
                // g = α s (1 − s), s = σ(αu): g' = α² s (1 − s)(1 − 2s).
                let s = u.mul_scalar(alpha)?.sigmoid()?;
                s.mul(&s.rsub_scalar(1.0)?)?
                    .mul(&s.mul_scalar(-2.0)?.add_scalar(1.0)?)?
                    .mul_scalar(alpha * alpha)
            }
            Surrogate::ReluGrad { alpha, width } => {
                // g' = −α sign(u) on |u| < width, 0 outside.
                let inside = u.abs()?.rsub_scalar(width)?.step()?;
                u.sign()?.mul(&inside)?.mul_scalar(-alpha)
            }
            Surrogate::PiecewiseQuadratic { alpha } => {
                // g' = −α² sign(u) on |u| < 1/α, 0 outside.
                let inside = u.abs()?.rsub_scalar(1.0 / alpha)?.step()?;
                u.sign()?.mul(&inside)?.mul_scalar(-alpha * alpha)
            }
            // g = c·exp(−α|u|): g' = −α sign(u) g.
            Surrogate::PiecewiseExp { alpha } | Surrogate::Slayer { alpha } => {
                u.sign()?.mul(&self.grad(u)?)?.mul_scalar(-alpha)
            }
            Surrogate::SoftSign { alpha } => {
                // g = (α/2) d⁻², d = 1 + α|u|: g' = −α² sign(u) d⁻³.
                let d = u.abs()?.mul_scalar(alpha)?.add_scalar(1.0)?;
                u.sign()?
                    .mul(&d.pow_scalar(-3.0)?)?
                    .mul_scalar(-alpha * alpha)
            }
            // g ∝ exp(−α² u²): g' = −2α² u g.
            Surrogate::Erf { alpha } => u.mul(&self.grad(u)?)?.mul_scalar(-2.0 * alpha * alpha),
            // g ∝ exp(−u²/(2σ²)): g' = −u/σ² g.
            Surrogate::Gaussian { sigma, .. } => {
                u.mul(&self.grad(u)?)?.mul_scalar(-1.0 / (sigma * sigma))
            }
            Surrogate::MultiGaussian { h, s, sigma, scale } => {
                // Each bell w·N(u; μ, σᵢ) has derivative −(u − μ)/σᵢ² times itself.
                let bell = |mu: f64, sd: f64, w: f64| -> Result<Tensor> {
                    let z = u.sub_scalar(mu)?;
                    let n = z
                        .square()?
                        .mul_scalar(-1.0 / (2.0 * sd * sd))?
                        .exp()?
                        .mul_scalar(w / ((2.0 * PI).sqrt() * sd))?;
                    z.mul(&n)?.mul_scalar(-1.0 / (sd * sd))
                };
                let side = s * sigma;
                bell(0.0, sigma, scale * (1.0 + h))?
                    .sub(&bell(sigma, side, scale * h)?)?
                    .sub(&bell(-sigma, side, scale * h)?)
            }
            Surrogate::InvSquare { alpha } => {
                // g = d⁻², d = α|u| + 1: g' = −2α sign(u) d⁻³.
                let d = u.abs()?.mul_scalar(alpha)?.add_scalar(1.0)?;
                u.sign()?
                    .mul(&d.pow_scalar(-3.0)?)?
                    .mul_scalar(-2.0 * alpha)
            }
            // Piecewise constant: g' = 0 (sign keeps u's shape, dtype and NaNs).
            Surrogate::LeakyRelu { .. } => u.sign()?.mul_scalar(0.0),
            Surrogate::QPseudoSpike { alpha } => {
                // g = d^(−α), d = 1 + c|u|, c = 2/(α + 1): g' = −α c sign(u) d^(−α−1).
                let c = 2.0 / (alpha + 1.0);
                let d = u.abs()?.mul_scalar(c)?.add_scalar(1.0)?;
                u.sign()?
                    .mul(&d.pow_scalar(-alpha - 1.0)?)?
                    .mul_scalar(-alpha * c)
            }
        }
    }
}

/// Bind `$f` to the element function `g` of surrogate `$s` on `$t` and
/// run `$body`; the surrogate is matched once, outside any loop in `$body`.
macro_rules! with_surrogate {
    ($s:expr, $t:ty, |$f:ident| $body:expr) => {{
        let [c0, c1] = $s.constants::<$t>();
        let (one, zero) = (<$t>::one(), <$t>::zero());
        match $s {
            Surrogate::Arctan { .. } => {
                let (h, k) = (c0, c1);
                let $f = |x: $t| {
                    let z = k * x;
                    h / (one + z * z)
                };
                $body
            }
            Surrogate::Sigmoid { .. } => {
                let al = c0;
                let $f = |x: $t| {
                    // σ(z)(1 − σ(z)) = e / (1 + e)² with e = exp(−|z|): no
                    // overflow, and no cancellation in 1 − σ for large |z|.
                    let e = exp_of(-(al * x).abs());
                    let d = one + e;
                    al * e / (d * d)
                };
                $body
            }
            Surrogate::ReluGrad { .. } => {
                let (al, top) = (c0, c1);
                let $f = |x: $t| (top - al * x.abs()).max(zero);
                $body
            }
            // The others in braintools' order of operations; their
            // constants are derived here from the parameters.
            Surrogate::PiecewiseQuadratic { alpha } => {
                let (a, a2, edge) = (
                    cv::<$t>(alpha),
                    cv::<$t>(alpha * alpha),
                    cv::<$t>(1.0 / alpha),
                );
                let $f = |x: $t| {
                    let ax = x.abs();
                    if ax > edge {
                        zero
                    } else {
                        a - a2 * ax
                    }
                };
                $body
            }
            Surrogate::PiecewiseExp { alpha } => {
                let (half, a) = (cv::<$t>(alpha / 2.0), cv::<$t>(alpha));
                let $f = |x: $t| half * exp_of(-(a * x.abs()));
                $body
            }
            Surrogate::SoftSign { alpha } => {
                let (half, a) = (cv::<$t>(alpha * 0.5), cv::<$t>(alpha));
                let $f = |x: $t| {
                    let d = one + (a * x).abs();
                    half / (d * d)
                };
                $body
            }
            Surrogate::Erf { alpha } => {
                let (h, a2) = (cv::<$t>(alpha / PI.sqrt()), cv::<$t>(alpha * alpha));
                let $f = |x: $t| h * exp_of(-(a2 * x * x));
                $body
            }
            Surrogate::Gaussian { sigma, alpha } => {
                let k = cv::<$t>(2.0 * sigma * sigma);
                let norm = cv::<$t>((2.0 * PI).sqrt() * sigma);
                let a = cv::<$t>(alpha);
                let $f = |x: $t| a * (exp_of(-(x * x) / k) / norm);
                $body
            }
            Surrogate::MultiGaussian { h, s, sigma, scale } => {
                let (k1, n1) = (
                    cv::<$t>(2.0 * sigma * sigma),
                    cv::<$t>((2.0 * PI).sqrt() * sigma),
                );
                let side = s * sigma;
                let (k2, n2) = (
                    cv::<$t>(2.0 * side * side),
                    cv::<$t>((2.0 * PI).sqrt() * side),
                );
                let (hh, h1, sg, sc) = (
                    cv::<$t>(h),
                    cv::<$t>(1.0 + h),
                    cv::<$t>(sigma),
                    cv::<$t>(scale),
                );
                let $f = |x: $t| {
                    let g1 = exp_of(-(x * x) / k1) / n1;
                    let (l, r) = (x - sg, x + sg);
                    let g2 = exp_of(-(l * l) / k2) / n2;
                    let g3 = exp_of(-(r * r) / k2) / n2;
                    sc * (g1 * h1 - g2 * hh - g3 * hh)
                };
                $body
            }
            Surrogate::InvSquare { alpha } => {
                let a = cv::<$t>(alpha);
                let $f = |x: $t| {
                    let d = a * x.abs() + one;
                    one / (d * d)
                };
                $body
            }
            Surrogate::Slayer { alpha } => {
                let a = cv::<$t>(alpha);
                let $f = |x: $t| exp_of(-(a * x.abs()));
                $body
            }
            Surrogate::LeakyRelu { alpha, beta } => {
                let (a, b) = (cv::<$t>(alpha), cv::<$t>(beta));
                let $f = |x: $t| if x < zero { a } else { b };
                $body
            }
            Surrogate::QPseudoSpike { alpha } => {
                let (c, p) = (cv::<$t>(2.0 / (alpha + 1.0)), cv::<$t>(-alpha));
                let $f = |x: $t| (one + c * x.abs()).powf(p);
                $body
            }
        }
    }};
}

/// A parameter in `T` (NaN where it does not convert, as `constants`).
#[inline(always)]
fn cv<T: Float>(v: f64) -> T {
    T::from(v).unwrap_or_else(T::nan)
}

/// `e^x`: in `f32` the vectorisable `exp` of
/// [`fastmath`](crate::kernels::fastmath) (a few ulp, as the `f32` unary
/// ops use it); `libm`'s elsewhere. `f32` is the only 4-byte [`Float`], and
/// its conversions to and from `f32` are the identity (optimised away).
#[inline(always)]
fn exp_of<T: Float>(x: T) -> T {
    if std::mem::size_of::<T>() == 4 {
        let y = crate::kernels::fastmath::exp_f32(x.to_f32().unwrap_or(f32::NAN));
        T::from(y).unwrap_or_else(T::nan)
    } else {
        x.exp()
    }
}

/// `g(u)` element by element, through the block kernel: it is compiled
/// with fused multiply-adds where the CPU has them, and the `f32`
/// exponential's multiply-adds are library calls without (a plain map of
/// the sigmoid surrogate took 22 ns an element, the block kernel 0.4).
pub(super) fn surrogate_kernel<T: Float>(s: Surrogate, a: &ArrayD<T>) -> ArrayD<T> {
    let a = crate::tensor::standard_layout(a);
    let src = crate::tensor::row_major(&a);
    let mut out = vec![T::zero(); src.len()];
    surrogate_block(s, src, &mut out);
    ArrayD::from_shape_vec(a.raw_dim(), out).expect("as many elements as the operand")
}

crate::kernels::avx2_dispatch!(
    /// `g(u)` over one block (the fused executor's kernel).
    pub(crate) fn surrogate_block<T: Float>(s: Surrogate, a: &[T], out: &mut [T]) => surrogate_loop
);

#[inline(always)]
pub(super) fn surrogate_loop<T: Float>(s: Surrogate, a: &[T], out: &mut [T]) {
    with_surrogate!(s, T, |g| for (o, &x) in out.iter_mut().zip(a) {
        *o = g(x);
    })
}
