//! `custom_jvp` (a function with its own JVP rule) and the surrogate
//! `spike` built for the same purpose: one equation in a traced graph, the
//! rule respected by every transform (jvp, vjp/grad, vmap, jit) and their
//! nestings. Rules here are often deliberately *not* the true derivative,
//! so a transform that bypassed the rule would be caught. Expected values
//! are written as plain `f64` formulas or finite differences.

mod common;

use braintrace::prelude::*;
use braintrace::transform::CustomJvp;
use common::{assert_allclose, check_grads, check_vmap, t, v, Lcg};

const PI: f64 = std::f64::consts::PI;

// ---------------------------------------------------------------- custom_jvp

/// `x²` whose declared derivative is `3x` (not `2x`).
fn square3() -> CustomJvp {
    CustomJvp::new(
        "square3",
        |a: &[Tensor]| Ok(vec![a[0].square()?]),
        |p: &[Tensor], t: &[Tensor]| {
            Ok((
                vec![p[0].square()?],
                vec![t[0].mul(&p[0].mul_scalar(3.0)?)?],
            ))
        },
    )
}

fn sum_square3(a: &[Tensor]) -> Result<Tensor> {
    square3().call(&a[..1])?[0].sum_all()
}

fn x0() -> Tensor {
    t(vec![-1.5, -0.2, 0.4, 2.0], &[4])
}

fn times(x: &Tensor, k: f64) -> Vec<f64> {
    v(x).iter().map(|x| k * x).collect()
}

#[test]
fn custom_jvp_traces_to_one_equation() {
    let f = square3();
    let g = make_graph(|a: &[Tensor]| f.call(a), &[x0().aval()]).unwrap();
    assert_eq!(g.primitive_names(), vec!["custom_jvp_call"]);
    let text = g.to_string();
    assert!(
        text.contains("custom_jvp_call[name=square3 eqns=1]"),
        "{text}"
    );
    // Eagerly it is the primal function.
    let y = f.call(&[x0()]).unwrap();
    let want: Vec<f64> = v(&x0()).iter().map(|x| x * x).collect();
    assert_eq!(v(&y[0]), want);
    // The traced graph evaluates to the same values.
    assert_eq!(v(&g.eval(&[x0()]).unwrap()[0]), want);
}

#[test]
fn custom_jvp_rule_drives_jvp_and_grad() {
    let x = x0();
    let tan = t(vec![1.0, -2.0, 0.5, 3.0], &[4]);
    let f = square3();
    let (y, ty) = jvp(
        |a: &[Tensor]| f.call(a),
        std::slice::from_ref(&x),
        std::slice::from_ref(&tan),
    )
    .unwrap();
    assert_eq!(v(&y[0]), v(&x.square().unwrap()));
    let want: Vec<f64> = v(&x)
        .iter()
        .zip(v(&tan))
        .map(|(x, t)| 3.0 * x * t)
        .collect();
    assert_allclose("jvp uses the rule", &v(&ty[0]), &want, 1e-15, 0.0);

    let g = grad(sum_square3)(std::slice::from_ref(&x)).unwrap();
    assert_allclose("grad uses the rule", &v(&g[0]), &times(&x, 3.0), 1e-15, 0.0);

    // vjp with a non-trivial cotangent: transposed rule is 3x ⊙ ct.
    let (_, pb) = vjp(|a: &[Tensor]| f.call(a), std::slice::from_ref(&x)).unwrap();
    let ct = t(vec![0.5, 1.0, -1.0, 2.0], &[4]);
    let gx = pb.apply(std::slice::from_ref(&ct)).unwrap();
    let want: Vec<f64> = v(&x).iter().zip(v(&ct)).map(|(x, c)| 3.0 * x * c).collect();
    assert_allclose("vjp", &v(&gx[0]), &want, 1e-15, 0.0);
}

/// `softplus(x) · y` and `x + y²` with their true derivatives as the rule
/// (written with a stable σ), checked against finite differences.
fn two_in_two_out() -> CustomJvp {
    CustomJvp::new(
        "sp_mix",
        |a: &[Tensor]| {
            let (x, y) = (&a[0], &a[1]);
            Ok(vec![x.softplus()?.mul(y)?, x.add(&y.square()?)?])
        },
        |p: &[Tensor], t: &[Tensor]| {
            let (x, y, tx, ty) = (&p[0], &p[1], &t[0], &t[1]);
            let sp = x.softplus()?;
            let o1 = sp.mul(y)?;
            let o2 = x.add(&y.square()?)?;
            let t1 = tx.mul(&x.sigmoid()?.mul(y)?)?.add(&ty.mul(&sp)?)?;
            let t2 = tx.add(&ty.mul(&y.mul_scalar(2.0)?)?)?;
            Ok((vec![o1, o2], vec![t1, t2]))
        },
    )
}

#[test]
fn custom_jvp_true_rule_matches_finite_differences() {
    let mut rng = Lcg::new(7);
    let f = two_in_two_out();
    let args = [rng.normal(&[2, 3]), rng.normal(&[2, 3])];
    check_grads("sp_mix", &|a: &[Tensor]| f.call(a), &args, &mut rng);
    // Also inside a bigger function, with the arguments built from others.
    let big = |a: &[Tensor]| {
        let x = a[0].matmul(&a[1])?;
        let y = x.tanh()?;
        let o = f.call(&[x, y])?;
        Ok(vec![o[0].add(&o[1].sin()?)?.sum(&[1])?])
    };
    let args = [rng.normal(&[2, 3]), rng.normal(&[3, 4])];
    check_grads("sp_mix inside", &big, &args, &mut rng);
}

#[test]
fn custom_jvp_vmap_matches_loop_and_keeps_one_equation() {
    let mut rng = Lcg::new(11);
    let f = two_in_two_out();
    let call = |a: &[Tensor]| f.call(a);
    let xs = rng.normal(&[3, 4]);
    let ys = rng.normal(&[4, 3]);
    check_vmap(
        "both mapped",
        &call,
        &[xs.clone(), ys.clone()],
        &[Some(0), Some(1)],
    );
    let y1 = rng.normal(&[4]);
    check_vmap(
        "x mapped",
        &call,
        &[xs.clone(), y1.clone()],
        &[Some(0), None],
    );
    check_vmap(
        "y mapped",
        &call,
        &[y1.clone(), ys.clone()],
        &[None, Some(1)],
    );

    // The batched call is still one custom_jvp equation, with the rule.
    let mapped = vmap(call, vec![Some(0), None]);
    let g = make_graph(&mapped, &[xs.aval(), y1.aval()]).unwrap();
    let names = g.primitive_names();
    assert_eq!(
        names.iter().filter(|n| *n == "custom_jvp_call").count(),
        1,
        "{g}"
    );
}

#[test]
fn custom_jvp_rule_survives_vmap_in_either_order() {
    let f = square3();
    let xs = t(vec![1.0, -2.0, 0.5, 3.0, -0.25, 1.5], &[3, 2]);
    let want = times(&xs, 3.0);
    // grad of vmap
    let g = grad(|a: &[Tensor]| vmap(|b: &[Tensor]| f.call(b), vec![Some(0)])(a)?[0].sum_all())(
        std::slice::from_ref(&xs),
    )
    .unwrap();
    assert_allclose("grad(vmap)", &v(&g[0]), &want, 1e-15, 0.0);
    // vmap of grad
    let g = vmap(
        grad_scalar(|a: &[Tensor]| Ok(vec![f.call(a)?[0].sum_all()?])),
        vec![Some(0)],
    )(std::slice::from_ref(&xs))
    .unwrap();
    assert_allclose("vmap(grad)", &v(&g[0]), &want, 1e-15, 0.0);
    // jvp of vmap and vmap of jvp
    let tan = xs.ones_like();
    let (_, tj) = jvp(
        vmap(|b: &[Tensor]| f.call(b), vec![Some(0)]),
        std::slice::from_ref(&xs),
        std::slice::from_ref(&tan),
    )
    .unwrap();
    assert_allclose("jvp(vmap)", &v(&tj[0]), &want, 1e-15, 0.0);
    let vj = vmap(
        |b: &[Tensor]| {
            let (_, t) = jvp(|c: &[Tensor]| f.call(c), &b[..1], &b[1..])?;
            Ok(t)
        },
        vec![Some(0), Some(0)],
    )(&[xs.clone(), tan])
    .unwrap();
    assert_allclose("vmap(jvp)", &v(&vj[0]), &want, 1e-15, 0.0);
}

#[test]
fn custom_jvp_under_jit() {
    let f = square3();
    let x = x0();
    let j = braintrace::Jit::new(|a: &[Tensor]| f.call(a));
    assert_eq!(
        v(&j.call(std::slice::from_ref(&x)).unwrap()[0]),
        v(&x.square().unwrap())
    );
    j.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(j.trace_count(), 1);
    // jit executes core ops: the primal is inlined.
    let g = j.cached_graph(&[x.aval()]).unwrap();
    assert_eq!(g.primitive_names(), vec!["square"]);
    // jit of grad uses the rule.
    let g = jit(grad_scalar(|a: &[Tensor]| Ok(vec![sum_square3(a)?])))(std::slice::from_ref(&x))
        .unwrap();
    assert_allclose("jit(grad)", &v(&g[0]), &times(&x, 3.0), 1e-15, 0.0);
}

#[test]
fn grad_of_jit_uses_the_custom_rule() {
    // Regression: `jit` called inside another transform's trace spliced in
    // its *lowered* graph, which inlines custom_jvp calls, so the outer
    // `grad` differentiated the primal (2x) instead of the rule (3x).
    let f = square3();
    let x = x0();
    let jf = jit(move |a: &[Tensor]| f.call(a));
    let g = grad(|a: &[Tensor]| jf(a)?[0].sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_allclose("grad(jit)", &v(&g[0]), &times(&x, 3.0), 1e-15, 0.0);
}

#[test]
fn custom_jvp_second_order_differentiates_the_rule() {
    // d/dx of the rule's tangent 3x·t is 3 (the primal's would be 2).
    let x = x0();
    let dd =
        grad(|a: &[Tensor]| grad(sum_square3)(a)?[0].sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_allclose("grad(grad)", &v(&dd[0]), &[3.0; 4], 1e-15, 0.0);
}

#[test]
fn nested_custom_jvp_lowers_fully_and_keeps_the_outer_rule() {
    let inner = square3();
    let outer = CustomJvp::new(
        "outer",
        move |a: &[Tensor]| Ok(vec![inner.call(a)?[0].mul_scalar(2.0)?]),
        // Declared derivative 10·t, nothing like the truth.
        |p: &[Tensor], t: &[Tensor]| {
            Ok((
                vec![p[0].square()?.mul_scalar(2.0)?],
                vec![t[0].mul_scalar(10.0)?],
            ))
        },
    );
    let x = x0();
    let traced = make_graph(|a: &[Tensor]| outer.call(a), &[x.aval()]).unwrap();
    assert_eq!(traced.primitive_names(), vec!["custom_jvp_call"]);
    let lowered = traced.lower().unwrap();
    assert!(
        !lowered.to_string().contains("custom_jvp_call"),
        "lowering is recursive:\n{lowered}"
    );
    assert_eq!(
        v(&lowered.eval(std::slice::from_ref(&x)).unwrap()[0]),
        times(&x.square().unwrap(), 2.0)
    );
    let g = grad(|a: &[Tensor]| outer.call(a)?[0].sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_eq!(v(&g[0]), vec![10.0; 4]);
}

#[test]
fn custom_jvp_capturing_concrete_and_traced_values() {
    // A concrete capture stays a constant of the primal graph.
    let w = t(vec![1.0, 2.0, 3.0, 4.0], &[4]);
    let wc = w.clone();
    let scaled = CustomJvp::new("scaled", move |a: &[Tensor]| Ok(vec![a[0].mul(&wc)?]), {
        let w = w.clone();
        move |p: &[Tensor], t: &[Tensor]| Ok((vec![p[0].mul(&w)?], vec![t[0].mul(&w)?]))
    });
    let g = grad(|a: &[Tensor]| scaled.call(a)?[0].sum_all())(&[x0()]).unwrap();
    assert_eq!(v(&g[0]), v(&w));

    // A traced capture becomes an operand: fine forward and under vmap...
    let f = square3();
    let through = |a: &[Tensor]| {
        let c = a[1].mul_scalar(2.0)?;
        let h = CustomJvp::new(
            "capture",
            move |b: &[Tensor]| Ok(vec![b[0].mul(&c)?]),
            |p: &[Tensor], t: &[Tensor]| Ok((vec![p[0].clone()], vec![t[0].clone()])),
        );
        Ok(vec![f.call(&h.call(&a[..1])?)?[0].clone()])
    };
    let mut rng = Lcg::new(3);
    let xs = rng.normal(&[3, 4]);
    let cs = rng.normal(&[3, 4]);
    let g = make_graph(through, &[x0().aval(), x0().aval()]).unwrap();
    assert!(g.to_string().contains("captured=1"), "{g}");
    check_vmap(
        "captured mapped",
        &through,
        &[xs.clone(), cs.clone()],
        &[Some(0), Some(0)],
    );
    check_vmap("captured unmapped", &through, &[xs, x0()], &[Some(0), None]);
    // ...but differentiating with respect to it is refused, naming the call.
    let e = grad(|a: &[Tensor]| through(a)?[0].sum_all())(&[x0(), x0()]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("custom_jvp `capture`") && msg.contains("pass that value as an argument"),
        "{msg}"
    );
}

#[test]
fn custom_jvp_bad_rules_are_errors() {
    let x = x0();
    let wrong_count = CustomJvp::new(
        "wrong_count",
        |a: &[Tensor]| Ok(vec![a[0].clone()]),
        |p: &[Tensor], _t: &[Tensor]| Ok((vec![p[0].clone()], vec![])),
    );
    let e = jvp(
        |a: &[Tensor]| wrong_count.call(a),
        std::slice::from_ref(&x),
        std::slice::from_ref(&x),
    )
    .unwrap_err();
    assert!(e.to_string().contains("custom_jvp `wrong_count`"), "{e}");

    let wrong_shape = CustomJvp::new(
        "wrong_shape",
        |a: &[Tensor]| Ok(vec![a[0].clone()]),
        |p: &[Tensor], t: &[Tensor]| Ok((vec![p[0].clone()], vec![t[0].sum_all()?])),
    );
    let e = jvp(
        |a: &[Tensor]| wrong_shape.call(a),
        std::slice::from_ref(&x),
        std::slice::from_ref(&x),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("custom_jvp `wrong_shape`") && msg.contains("f64[]"),
        "{msg}"
    );

    // A rule not linear in the tangent works forward but cannot be transposed.
    let nonlinear = CustomJvp::new(
        "nonlinear",
        |a: &[Tensor]| Ok(vec![a[0].clone()]),
        |p: &[Tensor], t: &[Tensor]| Ok((vec![p[0].clone()], vec![t[0].square()?])),
    );
    let (_, tt) = jvp(
        |a: &[Tensor]| nonlinear.call(a),
        std::slice::from_ref(&x),
        std::slice::from_ref(&x),
    )
    .unwrap();
    assert_eq!(v(&tt[0]), v(&x.square().unwrap()));
    let e = grad(|a: &[Tensor]| nonlinear.call(a)?[0].sum_all())(&[x]).unwrap_err();
    assert!(e.to_string().contains("transpose"), "{e}");

    // Arguments of other avals than traced are refused by the equation.
    let f = square3();
    let g = make_graph(|a: &[Tensor]| f.call(a), &[x0().aval()]).unwrap();
    let prim = g.eqns()[0].prim().clone();
    let e = prim
        .abstract_eval(&[Aval::new(&[5], DType::F64)])
        .unwrap_err();
    assert!(e.to_string().contains("custom_jvp `square3`"), "{e}");
}

#[test]
fn cse_does_not_merge_custom_jvp_calls_with_different_rules() {
    // Regression: two calls print alike (same name, same primal) but hold
    // different rules; merging them would give both the first rule.
    let twice = |k: f64| {
        CustomJvp::new(
            "same",
            |a: &[Tensor]| Ok(vec![a[0].square()?]),
            move |p: &[Tensor], t: &[Tensor]| {
                Ok((vec![p[0].square()?], vec![t[0].mul(&p[0])?.mul_scalar(k)?]))
            },
        )
    };
    let (f3, f5) = (twice(3.0), twice(5.0));
    let both = |a: &[Tensor]| Ok(vec![f3.call(a)?[0].clone(), f5.call(a)?[0].clone()]);
    let mut g = make_graph(both, &[x0().aval()]).unwrap();
    assert_eq!(g.cse(), 0, "nothing merged:\n{g}");
    assert_eq!(g.primitive_names().len(), 2);
    // The graph's JVP still uses both rules.
    let x = x0();
    let (_, tt) = jvp(
        |a: &[Tensor]| g.eval(a),
        std::slice::from_ref(&x),
        &[x.ones_like()],
    )
    .unwrap();
    assert_eq!(v(&tt[0]), times(&x, 3.0));
    assert_eq!(v(&tt[1]), times(&x, 5.0));
}

// ---------------------------------------------------------------- spike

/// The surrogate derivative `g(u)` by its formula, in plain f64.
fn g_formula(s: Surrogate, u: f64) -> f64 {
    match s {
        Surrogate::Arctan { alpha } => alpha / 2.0 / (1.0 + (PI / 2.0 * alpha * u).powi(2)),
        Surrogate::Sigmoid { alpha } => {
            // α σ(αu) σ(−αu), both factors computed directly (1 − σ would
            // lose digits for large |u|).
            let sg = |z: f64| 1.0 / (1.0 + (-z).exp());
            alpha * sg(alpha * u) * sg(-alpha * u)
        }
        Surrogate::ReluGrad { alpha, width } => (alpha * width - alpha * u.abs()).max(0.0),
        // braintools' definitions (braintools.surrogate, 0.3.0).
        Surrogate::PiecewiseQuadratic { alpha } => {
            if u.abs() > 1.0 / alpha {
                0.0
            } else {
                alpha - alpha * alpha * u.abs()
            }
        }
        Surrogate::PiecewiseExp { alpha } => alpha / 2.0 * (-alpha * u.abs()).exp(),
        Surrogate::SoftSign { alpha } => alpha * 0.5 / (1.0 + (alpha * u).abs()).powi(2),
        Surrogate::Erf { alpha } => alpha / PI.sqrt() * (-(alpha * alpha) * u * u).exp(),
        Surrogate::Gaussian { sigma, alpha } => alpha * normal(u, 0.0, sigma),
        Surrogate::MultiGaussian { h, s, sigma, scale } => {
            scale
                * ((1.0 + h) * normal(u, 0.0, sigma)
                    - h * normal(u, sigma, s * sigma)
                    - h * normal(u, -sigma, s * sigma))
        }
        Surrogate::InvSquare { alpha } => 1.0 / (alpha * u.abs() + 1.0).powi(2),
        Surrogate::Slayer { alpha } => (-alpha * u.abs()).exp(),
        Surrogate::LeakyRelu { alpha, beta } => {
            if u < 0.0 {
                alpha
            } else {
                beta
            }
        }
        Surrogate::QPseudoSpike { alpha } => (1.0 + 2.0 / (alpha + 1.0) * u.abs()).powf(-alpha),
    }
}

/// The normal density `N(u; mu, sd)`.
fn normal(u: f64, mu: f64, sd: f64) -> f64 {
    (-(u - mu).powi(2) / (2.0 * sd * sd)).exp() / ((2.0 * PI).sqrt() * sd)
}

/// Whether [`smooth`] has a closed form for `s` (the Gaussians' needs erf).
fn has_smooth(s: Surrogate) -> bool {
    !matches!(
        s,
        Surrogate::Gaussian { .. } | Surrogate::MultiGaussian { .. }
    )
}

/// A smooth antiderivative of `g` (the "surrogate-replaced" spike), plain f64.
fn smooth(s: Surrogate, u: f64) -> f64 {
    match s {
        Surrogate::Arctan { alpha } => (PI / 2.0 * alpha * u).atan() / PI + 0.5,
        Surrogate::Sigmoid { alpha } => 1.0 / (1.0 + (-alpha * u).exp()),
        Surrogate::ReluGrad { alpha, width } => {
            let w = width;
            if u <= -w {
                0.0
            } else if u < 0.0 {
                alpha * (w * u + u * u / 2.0) + alpha * w * w / 2.0
            } else if u < w {
                alpha * w * w / 2.0 + alpha * (w * u - u * u / 2.0)
            } else {
                alpha * w * w
            }
        }
        // braintools' `surrogate_fun`s where it has one (up to constants).
        Surrogate::PiecewiseQuadratic { alpha } => {
            if u < -1.0 / alpha {
                0.0
            } else if u > 1.0 / alpha {
                1.0
            } else {
                (-alpha * u.abs() / 2.0 + 1.0) * alpha * u + 0.5
            }
        }
        Surrogate::PiecewiseExp { alpha } => {
            if u < 0.0 {
                (alpha * u).exp() / 2.0
            } else {
                1.0 - (-alpha * u).exp() / 2.0
            }
        }
        Surrogate::SoftSign { alpha } => u / (2.0 / alpha + 2.0 * u.abs()) + 0.5,
        Surrogate::Erf { alpha } => {
            // ∫ g by Simpson's rule from 0 (std has no erf); exact enough
            // for the differences taken of it.
            let n = 2000;
            let h = u / n as f64;
            let g = |x: f64| alpha / PI.sqrt() * (-(alpha * alpha) * x * x).exp();
            (0..n)
                .map(|i| {
                    let a = i as f64 * h;
                    h / 6.0 * (g(a) + 4.0 * g(a + h / 2.0) + g(a + h))
                })
                .sum::<f64>()
                + 0.5
        }
        Surrogate::InvSquare { alpha } => {
            u.signum() * (1.0 - 1.0 / (alpha * u.abs() + 1.0)) / alpha
        }
        Surrogate::Slayer { alpha } => u.signum() * (1.0 - (-alpha * u.abs()).exp()) / alpha,
        Surrogate::LeakyRelu { alpha, beta } => {
            if u < 0.0 {
                alpha * u
            } else {
                beta * u
            }
        }
        Surrogate::QPseudoSpike { alpha } => {
            let base = 1.0 + 2.0 / (alpha + 1.0) * u.abs();
            0.5 + u.signum() * (alpha + 1.0) / (2.0 * (1.0 - alpha))
                * (base.powf(1.0 - alpha) - 1.0)
        }
        Surrogate::Gaussian { .. } | Surrogate::MultiGaussian { .. } => {
            unreachable!("no closed form: see has_smooth")
        }
    }
}

fn surrogates() -> Vec<Surrogate> {
    vec![
        Surrogate::default(),
        Surrogate::Arctan { alpha: 1.0 },
        Surrogate::sigmoid(),
        Surrogate::Sigmoid { alpha: 1.5 },
        Surrogate::relu_grad(),
        Surrogate::ReluGrad {
            alpha: 1.0,
            width: 0.5,
        },
        Surrogate::piecewise_quadratic(),
        Surrogate::PiecewiseQuadratic { alpha: 2.5 },
        Surrogate::piecewise_exp(),
        Surrogate::soft_sign(),
        Surrogate::erf(),
        Surrogate::gaussian(),
        Surrogate::multi_gaussian(),
        Surrogate::inv_square(),
        Surrogate::InvSquare { alpha: 3.0 },
        Surrogate::slayer(),
        Surrogate::leaky_relu(),
        Surrogate::q_pseudo_spike(),
        Surrogate::QPseudoSpike { alpha: 3.5 },
    ]
}

/// Potentials away from 0 and from ReluGrad's kinks at ±width.
fn u_vals() -> Vec<f64> {
    vec![-2.0, -0.8, -0.3, -0.05, 0.07, 0.2, 0.45, 0.9, 1.7]
}

#[test]
fn surrogate_default_is_braintrace_arctan() {
    assert_eq!(Surrogate::default(), Surrogate::Arctan { alpha: 2.0 });
    assert_eq!(
        Surrogate::relu_grad(),
        Surrogate::ReluGrad {
            alpha: 0.3,
            width: 1.0
        }
    );
    for u in u_vals() {
        let want = 1.0 / (1.0 + (PI * u).powi(2));
        assert!((g_formula(Surrogate::default(), u) - want).abs() < 1e-15);
    }
}

#[test]
fn spike_forward_is_heaviside_in_the_input_dtype() {
    let u = t(vec![-2.0, -1e-300, 0.0, 1e-300, 0.5], &[5]);
    for s in surrogates() {
        assert_eq!(v(&spike(&u, s).unwrap()), vec![0.0, 0.0, 0.0, 1.0, 1.0]);
    }
    let u32 = u.cast(DType::F32).unwrap();
    let s32 = u32.spike(Surrogate::default()).unwrap();
    assert_eq!(s32.dtype(), DType::F32);
    assert_eq!(v(&s32), vec![0.0, 0.0, 0.0, 0.0, 1.0]); // 1e-300 is 0 in f32
}

#[test]
fn spike_gradient_matches_each_surrogate_formula() {
    let vals = u_vals();
    let n = vals.len();
    let u = t(vals.clone(), &[n]);
    for s in surrogates() {
        let want: Vec<f64> = vals.iter().map(|&u| g_formula(s, u)).collect();
        let g = grad(|a: &[Tensor]| spike(&a[0], s)?.sum_all())(std::slice::from_ref(&u)).unwrap();
        assert_allclose(&format!("grad {s:?}"), &v(&g[0]), &want, 1e-14, 1e-16);
        let (y, tt) = jvp(
            |a: &[Tensor]| Ok(vec![spike(&a[0], s)?]),
            std::slice::from_ref(&u),
            &[u.ones_like()],
        )
        .unwrap();
        assert_eq!(
            v(&y[0]),
            vals.iter().map(|&u| f64::from(u > 0.0)).collect::<Vec<_>>()
        );
        assert_allclose(&format!("jvp {s:?}"), &v(&tt[0]), &want, 1e-14, 1e-16);
        // The formula is the derivative of its smooth antiderivative (a
        // check of the test's own formulas against brainstate's definitions).
        for &x in vals.iter().filter(|_| has_smooth(s)) {
            let h = 1e-6;
            let fd = (smooth(s, x + h) - smooth(s, x - h)) / (2.0 * h);
            assert!(
                (fd - g_formula(s, x)).abs() < 1e-7,
                "{s:?} at {x}: {fd} vs {}",
                g_formula(s, x)
            );
        }
        // f32 follows the same formula.
        let u32 = u.cast(DType::F32).unwrap();
        let g32 = grad(|a: &[Tensor]| spike(&a[0], s)?.sum_all())(&[u32]).unwrap();
        assert_eq!(g32[0].dtype(), DType::F32);
        assert_allclose(&format!("f32 {s:?}"), &v(&g32[0]), &want, 1e-5, 1e-7);
    }
}

#[test]
fn spike_second_derivative_matches_finite_differences_of_the_formula() {
    let vals = u_vals();
    let u = t(vals.clone(), &[vals.len()]);
    for s in surrogates() {
        let dd =
            grad(|a: &[Tensor]| grad(|b: &[Tensor]| spike(&b[0], s)?.sum_all())(a)?[0].sum_all())(
                std::slice::from_ref(&u),
            )
            .unwrap();
        let want: Vec<f64> = vals
            .iter()
            .map(|&x| (g_formula(s, x + 1e-6) - g_formula(s, x - 1e-6)) / 2e-6)
            .collect();
        assert_allclose(&format!("g' {s:?}"), &v(&dd[0]), &want, 1e-6, 1e-8);
    }
}

#[test]
fn spike_is_one_equation_and_survives_jit() {
    let u = t(u_vals(), &[9]);
    let s = Surrogate::Sigmoid { alpha: 1.5 };
    let g = make_graph(|a: &[Tensor]| Ok(vec![spike(&a[0], s)?]), &[u.aval()]).unwrap();
    assert_eq!(g.primitive_names(), vec!["spike"]);
    assert!(
        g.to_string()
            .contains("spike[surrogate=sigmoid(alpha=1.5)]"),
        "{g}"
    );
    let j = braintrace::Jit::new(move |a: &[Tensor]| Ok(vec![spike(&a[0], s)?]));
    assert_eq!(
        v(&j.call(std::slice::from_ref(&u)).unwrap()[0]),
        v(&spike(&u, s).unwrap())
    );
    assert_eq!(
        j.cached_graph(&[u.aval()]).unwrap().primitive_names(),
        vec!["spike"]
    );
    let gj = jit(grad_scalar(move |a: &[Tensor]| {
        Ok(vec![spike(&a[0], s)?.sum_all()?])
    }))(std::slice::from_ref(&u))
    .unwrap();
    let want: Vec<f64> = u_vals().iter().map(|&x| g_formula(s, x)).collect();
    assert_allclose("jit(grad(spike))", &v(&gj[0]), &want, 1e-14, 1e-16);
    // The reverse-mode graph holds the fused surrogate kernel.
    let vg = make_graph(
        grad_scalar(move |a: &[Tensor]| Ok(vec![spike(&a[0], s)?.sum_all()?])),
        &[u.aval()],
    )
    .unwrap();
    assert!(
        vg.primitive_names()
            .iter()
            .any(|n| n == "spike_surrogate_grad"),
        "{vg}"
    );
}

#[test]
fn spike_vmap_matches_loop() {
    let mut rng = Lcg::new(5);
    for s in surrogates() {
        let f = move |a: &[Tensor]| Ok(vec![spike(&a[0], s)?, s.grad(&a[0])?]);
        check_vmap(&format!("{s:?}"), &f, &[rng.normal(&[3, 4])], &[Some(1)]);
        let fg = move |a: &[Tensor]| grad(|b: &[Tensor]| spike(&b[0].mul(&b[1])?, s)?.sum_all())(a);
        check_vmap(
            &format!("grad {s:?}"),
            &fg,
            &[rng.normal(&[3, 4]), rng.normal(&[4])],
            &[Some(0), None],
        );
    }
}

#[test]
fn spike_inside_a_model_matches_finite_differences_of_the_smooth_surrogate() {
    // L = Σ c ⊙ spike(x @ W + b) + Σ tanh(x @ W): linear in the spike, so
    // the surrogate gradient equals the exact gradient of the function with
    // the spike replaced by its smooth antiderivative.
    let mut rng = Lcg::new(9);
    let x = rng.normal(&[2, 3]);
    let w = rng.normal(&[3, 4]);
    let b = rng.normal(&[4]).mul_scalar(0.1).unwrap();
    let c = rng.normal(&[4]);
    for s in surrogates().into_iter().filter(|&s| has_smooth(s)) {
        let cc = c.clone();
        let loss = move |a: &[Tensor]| {
            let u = a[0].matmul(&a[1])?.add(&a[2])?;
            spike(&u, s)?
                .mul(&cc)?
                .sum_all()?
                .add(&a[0].matmul(&a[1])?.tanh()?.sum_all()?)
        };
        let args = [x.clone(), w.clone(), b.clone()];
        // Keep clear of ReluGrad's kinks (|u| = width or 0) for FD.
        let u = v(&x.matmul(&w).unwrap().add(&b).unwrap());
        if let Surrogate::ReluGrad { width, .. } = s {
            assert!(u
                .iter()
                .all(|u| u.abs() > 1e-3 && (u.abs() - width).abs() > 1e-3));
        }
        let g = grad(loss)(&args).unwrap();
        // The smooth function in plain f64 loops.
        let (xv, wv, bv, cv) = (v(&x), v(&w), v(&b), v(&c));
        let smooth_loss = |xv: &[f64], wv: &[f64], bv: &[f64]| {
            let mut l = 0.0;
            for i in 0..2 {
                for j in 0..4 {
                    let z: f64 = (0..3).map(|k| xv[i * 3 + k] * wv[k * 4 + j]).sum();
                    l += cv[j] * smooth(s, z + bv[j]) + z.tanh();
                }
            }
            l
        };
        let h = 1e-6;
        let fd = |which: usize| -> Vec<f64> {
            let base = [xv.clone(), wv.clone(), bv.clone()];
            (0..base[which].len())
                .map(|k| {
                    let mut p = base.clone();
                    let mut m = base.clone();
                    p[which][k] += h;
                    m[which][k] -= h;
                    (smooth_loss(&p[0], &p[1], &p[2]) - smooth_loss(&m[0], &m[1], &m[2]))
                        / (2.0 * h)
                })
                .collect()
        };
        for (k, name) in ["x", "W", "b"].iter().enumerate() {
            assert_allclose(&format!("{s:?} dL/d{name}"), &v(&g[k]), &fd(k), 1e-6, 1e-8);
        }
    }
}

#[test]
fn spike_built_with_custom_jvp_agrees_with_the_primitive() {
    let s = Surrogate::default();
    let via_custom = CustomJvp::new(
        "arctan_spike",
        |a: &[Tensor]| Ok(vec![a[0].step()?]),
        |p: &[Tensor], t: &[Tensor]| {
            let g = p[0]
                .mul_scalar(PI)?
                .square()?
                .add_scalar(1.0)?
                .reciprocal()?;
            Ok((vec![p[0].step()?], vec![t[0].mul(&g)?]))
        },
    );
    let mut rng = Lcg::new(13);
    let x = rng.normal(&[3, 4]);
    let w = rng.normal(&[4, 5]);
    let lp = |a: &[Tensor]| spike(&a[0].matmul(&a[1])?, s)?.tanh()?.sum_all();
    let lc = |a: &[Tensor]| {
        via_custom.call(&[a[0].matmul(&a[1])?])?[0]
            .tanh()?
            .sum_all()
    };
    let (yp, gp) = value_and_grad(lp)(&[x.clone(), w.clone()]).unwrap();
    let (yc, gc) = value_and_grad(lc)(&[x, w]).unwrap();
    assert_eq!(v(&yp), v(&yc));
    for (a, b) in gp.iter().zip(&gc) {
        assert_allclose("custom vs spike", &v(a), &v(b), 1e-14, 1e-15);
    }
}

#[test]
fn spike_rejects_bad_surrogates_and_non_floats() {
    let u = t(vec![0.5], &[1]);
    for bad in [
        Surrogate::Arctan { alpha: 0.0 },
        Surrogate::Sigmoid { alpha: f64::NAN },
        Surrogate::ReluGrad {
            alpha: 0.3,
            width: -1.0,
        },
    ] {
        let e = spike(&u, bad).unwrap_err();
        assert!(matches!(e, Error::Param { .. }), "{e}");
        assert!(e.to_string().contains("spike"), "{e}");
    }
    let i = Tensor::from_vec_typed(vec![1i64, -1], &[2]).unwrap();
    let e = spike(&i, Surrogate::default()).unwrap_err();
    assert!(
        matches!(e, Error::DType { .. }) && e.to_string().contains("spike"),
        "{e}"
    );
    let e = make_graph(
        |a: &[Tensor]| Ok(vec![spike(&a[0], Surrogate::default())?]),
        &[Aval::new(&[2], DType::Bool)],
    )
    .unwrap_err();
    assert!(e.to_string().contains("spike"), "{e}");
}
