//! Surrogate-gradient spikes: `spike(u, surrogate)` is the Heaviside step
//! `1[u > 0]` (in `u`'s dtype) in the forward pass, and its JVP is
//! `surrogate'(u) ⊙ tangent`. Under tracing it is **one** `spike` equation
//! (a dedicated core op rather than a `custom_jvp`, so the learning compiler
//! and `jit` see one cheap kernel). The surrogate derivative is itself a
//! core op, `spike_surrogate_grad`, whose JVP is written with core ops, so
//! derivatives of every order are exact.
//!
//! The surrogates follow brainstate's definitions (`alpha` sets the
//! sharpness):
//!
//! | surrogate | derivative `g(u)` |
//! |---|---|
//! | `Arctan { alpha }` | `alpha/2 / (1 + (π/2 · alpha · u)²)` (`alpha = 2`: braintrace's default `1/(1+(πu)²)`) |
//! | `Sigmoid { alpha }` | `alpha · σ(alpha u) (1 − σ(alpha u))` |
//! | `ReluGrad { alpha, width }` | `max(alpha·width − alpha·|u|, 0)` |

use super::check_arity;
use crate::error::Result;
use crate::graph::{bind1, Elementwise, Primitive};
use crate::tensor::{Aval, Tensor};
use std::any::Any;
use std::sync::Arc;

use super::surrogate::float_operand;
pub use super::surrogate::Surrogate;
pub use super::surrogate::SurrogateGrad;

/// The spike primitive: Heaviside forward, surrogate JVP.
#[derive(Clone, Debug)]
pub struct Spike(pub Surrogate);

impl Primitive for Spike {
    fn name(&self) -> String {
        "spike".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("surrogate".into(), self.0.describe())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        Ok(vec![float_operand("spike", inputs)?])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity("spike", inputs, 1)?;
        float_operand("spike", &[inputs[0].aval()])?;
        // The step kernel of the core `step` op.
        super::elementwise::Unary(super::UnaryOp::Step).eval(inputs)
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        check_arity("spike", p, 1)?;
        let y = bind1(Arc::new(self.clone()), &p[..1])?;
        let dt = match t.first().and_then(Option::as_ref) {
            Some(t) => Some(t.mul(&self.0.grad(&p[0])?)?),
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
        check_arity("spike", args, 1)?;
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

impl Elementwise for Spike {
    fn block_op(&self) -> Option<crate::graph::BlockOp> {
        Some(crate::graph::BlockOp::Unary(super::UnaryOp::Step))
    }
    fn arity(&self) -> usize {
        1
    }
    fn block_f32(&self, ins: &[&[f32]], out: &mut [f32]) {
        super::elementwise::Unary(super::UnaryOp::Step).block_f32(ins, out)
    }
    fn block_f64(&self, ins: &[&[f64]], out: &mut [f64]) {
        super::elementwise::Unary(super::UnaryOp::Step).block_f64(ins, out)
    }
}

/// A spike: `1[u > 0]` in `u`'s dtype, with the JVP `surrogate'(u) ⊙ du`.
/// One `spike` equation under tracing.
///
/// ```
/// use braintrace_core::{grad, ops::{spike, Surrogate}, Tensor};
/// let u = Tensor::from_vec(vec![-0.5, 0.0, 0.5], &[3])?;
/// assert_eq!(spike(&u, Surrogate::default())?.to_vec_f64()?, vec![0.0, 0.0, 1.0]);
/// let g = grad(|a: &[Tensor]| spike(&a[0], Surrogate::default())?.sum_all())(&[u])?;
/// let pi = std::f64::consts::PI;
/// assert!((g[0].to_vec_f64()?[0] - 1.0 / (1.0 + (0.5 * pi).powi(2))).abs() < 1e-15);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn spike(u: &Tensor, surrogate: Surrogate) -> Result<Tensor> {
    surrogate.validate("spike")?;
    bind1(Arc::new(Spike(surrogate)), std::slice::from_ref(u))
}

impl Tensor {
    /// `spike(self, surrogate)`: see [`spike`].
    pub fn spike(&self, surrogate: Surrogate) -> Result<Tensor> {
        spike(self, surrogate)
    }
}

#[cfg(test)]
mod tests {
    use super::super::surrogate::{surrogate_block, surrogate_loop};
    use super::*;
    use crate::tensor::DType;
    use num_traits::Float;
    use std::f64::consts::PI;

    fn formula(s: Surrogate, u: f64) -> f64 {
        match s {
            Surrogate::Arctan { alpha } => alpha / 2.0 / (1.0 + (PI / 2.0 * alpha * u).powi(2)),
            Surrogate::Sigmoid { alpha } => {
                let sg = 1.0 / (1.0 + (-alpha * u).exp());
                alpha * sg * (1.0 - sg)
            }
            Surrogate::ReluGrad { alpha, width } => (alpha * width - alpha * u.abs()).max(0.0),
            // The others are checked against braintools' values
            // (tests/golden_snn.rs) and by the finite differences below.
            _ => {
                let u = Tensor::from_vec(vec![u], &[1]).unwrap();
                s.grad(&u).unwrap().to_vec_f64().unwrap()[0]
            }
        }
    }

    #[test]
    fn surrogate_derivative_jvp_matches_finite_differences() {
        // The JVP of `spike_surrogate_grad` (g') against central
        // differences of the f64 kernel g, away from each kink.
        let us = [-2.3, -0.77, -0.21, -0.04, 0.03, 0.18, 0.61, 1.7];
        for s in Surrogate::all_defaults().into_iter().chain([
            Surrogate::MultiGaussian {
                h: 0.3,
                s: 2.0,
                sigma: 0.4,
                scale: 1.0,
            },
            Surrogate::QPseudoSpike { alpha: 1.0 },
            Surrogate::PiecewiseQuadratic { alpha: 2.5 },
        ]) {
            let g = |x: f64| {
                let t = Tensor::from_vec(vec![x], &[1]).unwrap();
                s.grad(&t).unwrap().to_vec_f64().unwrap()[0]
            };
            let u = Tensor::from_vec(us.to_vec(), &[us.len()]).unwrap();
            let d = crate::grad(|a: &[Tensor]| s.grad(&a[0])?.sum_all())(&[u]).unwrap();
            let h = 1e-6;
            for (got, &x) in d[0].to_vec_f64().unwrap().iter().zip(&us) {
                let fd = (g(x + h) - g(x - h)) / (2.0 * h);
                assert!(
                    (got - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                    "{s:?} at {x}: jvp {got} vs finite difference {fd}"
                );
            }
        }
    }

    #[test]
    fn every_surrogate_is_finite_positive_and_even_where_braintools_is() {
        // Each derivative is finite, also far out, and ≥ 0 but the
        // multi-Gaussian's (its side bells dip below 0); all but the leaky
        // ReLU's are even in u.
        for s in Surrogate::all_defaults() {
            for x in [0.0, 0.3, 2.0, 1e3, -1e3] {
                let t = Tensor::from_vec(vec![x, -x], &[2]).unwrap();
                let v = s.grad(&t).unwrap().to_vec_f64().unwrap();
                let dips = matches!(s, Surrogate::MultiGaussian { .. });
                assert!(
                    v.iter().all(|g| g.is_finite() && (dips || *g >= 0.0)),
                    "{s:?} {x}"
                );
                if !matches!(s, Surrogate::LeakyRelu { .. }) {
                    assert_eq!(v[0], v[1], "{s:?} at ±{x}");
                }
            }
        }
    }

    #[test]
    fn surrogate_kernel_matches_formula_in_f32_and_f64() {
        let us = [-3.0, -0.7, -0.1, 0.0, 0.2, 0.95, 40.0, -800.0];
        for s in Surrogate::all_defaults() {
            let u = Tensor::from_vec(us.to_vec(), &[us.len()]).unwrap();
            for dt in [DType::F64, DType::F32] {
                let g = s.grad(&u.cast(dt).unwrap()).unwrap();
                assert_eq!(g.dtype(), dt);
                let tol = if dt == DType::F64 { 1e-13 } else { 1e-6 };
                for (got, &x) in g.to_vec_f64().unwrap().iter().zip(&us) {
                    let want = formula(s, x);
                    assert!(
                        (got - want).abs() <= tol * want.abs().max(1.0),
                        "{s:?} {dt} at {x}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn dispatched_surrogate_block_matches_the_plain_loop_bit_for_bit() {
        // AVX2 where the CPU has it vs the plain loop (the same code on a
        // CPU without AVX2); 131 elements: not a multiple of any width.
        fn same<T: Float + std::fmt::Debug>(s: Surrogate) {
            let u: Vec<T> = (0..131)
                .map(|i| T::from((i as f64 - 65.0) * 0.07).expect("small values convert"))
                .collect();
            let (mut a, mut b) = (vec![T::zero(); 131], vec![T::zero(); 131]);
            surrogate_block(s, &u, &mut a);
            surrogate_loop(s, &u, &mut b);
            let bits = |v: &[T]| v.iter().map(|x| x.integer_decode()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{s:?}");
        }
        for s in Surrogate::all_defaults() {
            same::<f64>(s);
            same::<f32>(s);
        }
    }

    #[test]
    fn surrogate_params_print_and_validate() {
        assert_eq!(Surrogate::default().describe(), "arctan(alpha=2)");
        assert_eq!(
            Surrogate::relu_grad().describe(),
            "relu_grad(alpha=0.3,width=1)"
        );
        assert!(Surrogate::Sigmoid { alpha: -1.0 }
            .validate("spike")
            .is_err());
        assert!(Surrogate::ReluGrad {
            alpha: 1.0,
            width: f64::INFINITY
        }
        .validate("spike")
        .is_err());
        assert!(Surrogate::sigmoid().validate("spike").is_ok());
        assert_eq!(
            Surrogate::multi_gaussian().describe(),
            "multi_gaussian(h=0.15,s=6,sigma=0.5,scale=0.5)"
        );
        assert!(Surrogate::LeakyRelu {
            alpha: 0.0,
            beta: 1.0
        }
        .validate("spike")
        .is_ok());
        let e = Surrogate::Erf { alpha: 0.0 }.validate("spike").unwrap_err();
        assert!(e.to_string().contains("alpha"), "{e}");
        assert!(Surrogate::Gaussian {
            sigma: f64::NAN,
            alpha: 1.0
        }
        .validate("spike")
        .is_err());
    }

    #[test]
    fn spike_rules_check_arity() {
        let u = Tensor::scalar(1.0);
        let p = Spike(Surrogate::default());
        assert!(p.eval(&[u.clone(), u.clone()]).is_err());
        assert!(p.jvp(&[], &[]).is_err());
        assert!(p.batch(&[], &[], 1).is_err());
        assert!(SurrogateGrad(Surrogate::default())
            .abstract_eval(&[])
            .is_err());
    }
}
