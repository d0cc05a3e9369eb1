//! Two small recurrent models written with `Tensor` ops, end to end through
//! the tracing core: a GRU cell step and a leaky integrate-and-fire (LIF)
//! neuron step with a surrogate spike gradient. Each traces to a readable
//! graph, its gradients match central finite differences in `f64`, and
//! `jit` / `vmap` agree with eager evaluation.

#[path = "common/fixtures.rs"]
mod fixtures;

use braintrace::prelude::*;
use fixtures::{det, det_vec, gru_args, gru_step, GRU_HID, GRU_IN};

const PI: f64 = std::f64::consts::PI;

// ---------------------------------------------------------------- helpers

fn avals(xs: &[Tensor]) -> Vec<Aval> {
    xs.iter().map(Tensor::aval).collect()
}

/// `|a - b| <= rel * max(|a|, |b|) + abs` element-wise; panics with the worst element.
fn assert_close(what: &str, a: &Tensor, b: &Tensor, rel: f64, abs: f64) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes differ");
    let (va, vb) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for (i, (x, y)) in va.iter().zip(&vb).enumerate() {
        let tol = rel * x.abs().max(y.abs()) + abs;
        assert!(
            (x - y).abs() <= tol,
            "{what}: element {i} differs: {x} vs {y} (|diff| {:e} > tol {tol:e})",
            (x - y).abs()
        );
    }
}

/// Central finite differences of a scalar function with respect to argument `k`.
fn fd_grad<F>(f: &F, args: &[Tensor], k: usize, eps: f64) -> Tensor
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    let base = args[k].to_vec_f64().unwrap();
    let mut g = vec![0.0; base.len()];
    for (i, gi) in g.iter_mut().enumerate() {
        let eval = |delta: f64| {
            let mut v = base.clone();
            v[i] += delta;
            let mut a = args.to_vec();
            a[k] = Tensor::from_vec(v, args[k].shape()).unwrap();
            f(&a).unwrap().item().unwrap()
        };
        *gi = (eval(eps) - eval(-eps)) / (2.0 * eps);
    }
    Tensor::from_vec(g, args[k].shape()).unwrap()
}

/// Check a printed graph: a `lambda` header, one equation per line (each
/// with `=` and typed outputs), the closing `in (...)`, and the expected
/// primitives.
fn assert_readable(g: &Graph, expected: &[&str], input_types: &[&str]) {
    let text = g.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("{ lambda"), "header:\n{text}");
    for t in input_types {
        assert!(lines[0].contains(t), "header lacks {t}:\n{text}");
    }
    assert!(
        lines.last().unwrap().trim_start().starts_with("in ("),
        "{text}"
    );
    let names = g.primitive_names();
    assert_eq!(
        lines.len(),
        names.len() + 2,
        "one equation per line:\n{text}"
    );
    for (line, name) in lines[1..lines.len() - 1].iter().zip(&names) {
        let (lhs, rhs) = line.split_once(" = ").expect("an equation");
        assert!(lhs.contains(":f64["), "outputs carry their type: {line}");
        assert!(rhs.starts_with(name.as_str()), "{line} names {name}");
    }
    for p in expected {
        assert!(
            names.iter().any(|n| n == p),
            "no `{p}` equation in:\n{text}"
        );
    }
}

// ---------------------------------------------------------------- GRU

/// A scalar loss that weighs each hidden unit differently, so no gradient
/// is symmetric by accident.
fn gru_loss(a: &[Tensor]) -> Result<Tensor> {
    let w = Tensor::from_vec(vec![1.0, -2.0, 0.5, 3.0], &[GRU_HID])?;
    let h = gru_step(a)?.remove(0);
    h.mul(&w)?.add(&h.square()?)?.sum_all()
}

#[test]
fn gru_graph_is_readable() {
    let g = make_graph(gru_step, &avals(&gru_args(1))).unwrap();
    assert_readable(
        &g,
        &[
            "concatenate",
            "matmul",
            "add",
            "logistic",
            "mul",
            "tanh",
            "rsub_scalar",
        ],
        &["f64[3]", "f64[4]", "f64[7,4]"],
    );
    let text = g.to_string();
    assert!(text.contains(":f64[7] = concatenate"), "{text}");
    assert_eq!(g.out_avals(), vec![Aval::new(&[GRU_HID], DType::F64)]);
}

#[test]
fn gru_eager_matches_hand_computation() {
    let a = gru_args(2);
    let v: Vec<Vec<f64>> = a.iter().map(|t| t.to_vec_f64().unwrap()).collect();
    let (x, h) = (&v[0], &v[1]);
    let sig = |s: f64| 1.0 / (1.0 + (-s).exp());
    let affine = |inp: &[f64], w: &[f64], b: &[f64], j: usize| {
        inp.iter()
            .enumerate()
            .map(|(i, &u)| u * w[i * GRU_HID + j])
            .sum::<f64>()
            + b[j]
    };
    let xh: Vec<f64> = x.iter().chain(h).copied().collect();
    let z: Vec<f64> = (0..GRU_HID)
        .map(|j| sig(affine(&xh, &v[2], &v[3], j)))
        .collect();
    let r: Vec<f64> = (0..GRU_HID)
        .map(|j| sig(affine(&xh, &v[4], &v[5], j)))
        .collect();
    let xrh: Vec<f64> = x
        .iter()
        .copied()
        .chain(r.iter().zip(h).map(|(a, b)| a * b))
        .collect();
    let expect: Vec<f64> = (0..GRU_HID)
        .map(|j| {
            let hc = affine(&xrh, &v[6], &v[7], j).tanh();
            (1.0 - z[j]) * h[j] + z[j] * hc
        })
        .collect();
    let got = gru_step(&a).unwrap().remove(0);
    assert_close(
        "gru forward",
        &got,
        &Tensor::from_vec(expect, &[GRU_HID]).unwrap(),
        1e-14,
        1e-15,
    );
}

#[test]
fn gru_grads_match_finite_differences() {
    let a = gru_args(3);
    let g = grad(gru_loss)(&a).unwrap();
    let names = ["x", "h", "Wz", "bz", "Wr", "br", "Wh", "bh"];
    for (k, name) in names.iter().enumerate() {
        let fd = fd_grad(&gru_loss, &a, k, 1e-5);
        assert_close(&format!("dL/d{name}"), &g[k], &fd, 1e-6, 1e-9);
    }
}

#[test]
fn gru_jit_matches_eager() {
    let f = braintrace::Jit::new(gru_step);
    for seed in [4, 5] {
        let a = gru_args(seed);
        let eager = gru_step(&a).unwrap();
        let jitted = f.call(&a).unwrap();
        assert_close("jit gru", &jitted[0], &eager[0], 0.0, 0.0);
    }
    assert_eq!(f.trace_count(), 1, "same avals: traced once");

    let jg = jit(grad(gru_loss));
    let a = gru_args(6);
    let eager = grad(gru_loss)(&a).unwrap();
    for (j, e) in jg(&a).unwrap().iter().zip(&eager) {
        assert_close("jit(grad) gru", j, e, 1e-12, 1e-14);
    }
}

#[test]
fn gru_vmap_over_batch_matches_loop() {
    const B: usize = 5;
    let mut a = gru_args(7);
    a[0] = det(&[B, GRU_IN], 70, 1.0);
    a[1] = det(&[B, GRU_HID], 71, 0.8);
    let mut in_axes = vec![Some(0), Some(0)];
    in_axes.extend([None; 6]);

    let mapped = vmap(gru_step, in_axes.clone())(&a).unwrap().remove(0);
    let jit_mapped = jit(vmap(gru_step, in_axes.clone()))(&a).unwrap().remove(0);
    // The step is also written for a leading batch axis: eager batched.
    let eager_batched = gru_step(&a).unwrap().remove(0);
    assert_eq!(mapped.shape(), &[B, GRU_HID]);
    for i in 0..B {
        let mut ai = a.clone();
        ai[0] = a[0].index_axis0(i).unwrap();
        ai[1] = a[1].index_axis0(i).unwrap();
        let row = gru_step(&ai).unwrap().remove(0);
        assert_close(
            "vmap row",
            &mapped.index_axis0(i).unwrap(),
            &row,
            1e-14,
            1e-15,
        );
    }
    assert_close("jit(vmap)", &jit_mapped, &mapped, 0.0, 0.0);
    assert_close("eager batched", &eager_batched, &mapped, 1e-14, 1e-15);

    // Per-example weight gradients: vmap(grad) against a loop of grads.
    let per_ex = jit(vmap(grad(gru_loss), in_axes))(&a).unwrap();
    for i in 0..B {
        let mut ai = a.clone();
        ai[0] = a[0].index_axis0(i).unwrap();
        ai[1] = a[1].index_axis0(i).unwrap();
        let gi = grad(gru_loss)(&ai).unwrap();
        for k in 0..a.len() {
            assert_close(
                "vmap(grad) row",
                &per_ex[k].index_axis0(i).unwrap(),
                &gi[k],
                1e-12,
                1e-14,
            );
        }
    }
}

// ---------------------------------------------------------------- LIF

const LIF_IN: usize = 3;
const LIF_HID: usize = 6;
/// Integration constant `dt / tau`.
const ALPHA: f64 = 0.2;
const V_REST: f64 = 0.0;
const V_TH: f64 = 1.0;

/// The surrogate derivative of the spike, `1 / (1 + (π u)²)` (braintrace's
/// default arctan surrogate), in plain `f64`.
fn surrogate_grad(u: f64) -> f64 {
    1.0 / (1.0 + (PI * u).powi(2))
}

/// The Heaviside spike with braintrace's default surrogate gradient: one
/// `spike` equation under tracing.
fn spike(u: &Tensor) -> Result<Tensor> {
    braintrace::spike(u, Surrogate::default())
}

/// One LIF step with a spike function. Arguments `[x, v, w, b]`: input
/// `x` `(I,)`, membrane potential `v` `(H,)`, weight `w` `(I, H)`, bias
/// `b` `(H,)`; results `[spike, v']`.
///
/// v⁻ = v + α (v_rest − v + x@W + b); spike = Θ(v⁻ − v_th);
/// v' = v⁻ − spike · (v_th − v_rest) (soft reset).
fn lif_step_with<S>(a: &[Tensor], spike_fn: S) -> Result<Vec<Tensor>>
where
    S: Fn(&Tensor) -> Result<Tensor>,
{
    let (x, v, w, b) = (&a[0], &a[1], &a[2], &a[3]);
    let current = x.matmul(w)?.add(b)?;
    let dv = v.rsub_scalar(V_REST)?.add(&current)?.mul_scalar(ALPHA)?;
    let v_pre = v.add(&dv)?;
    let s = spike_fn(&v_pre.sub_scalar(V_TH)?)?;
    let v_next = v_pre.sub(&s.mul_scalar(V_TH - V_REST)?)?;
    Ok(vec![s, v_next])
}

fn lif_step(a: &[Tensor]) -> Result<Vec<Tensor>> {
    lif_step_with(a, spike)
}

/// Inputs where `u = v⁻ − v_th` is at least 0.1 away from the threshold,
/// half the neurons above it (spiking) and half below.
fn lif_args(seed: u64) -> Vec<Tensor> {
    let x = det(&[LIF_IN], seed, 1.0);
    let w = det(&[LIF_IN, LIF_HID], seed + 1, 0.8);
    let b = det(&[LIF_HID], seed + 2, 0.3);
    let current = x.matmul(&w).unwrap().add(&b).unwrap().to_vec_f64().unwrap();
    let mags = det_vec(LIF_HID, seed + 3, 1.0);
    let v: Vec<f64> = (0..LIF_HID)
        .map(|j| {
            let u = (0.1 + 0.4 * mags[j].abs()) * if j % 2 == 0 { 1.0 } else { -1.0 };
            // Solve v + α (v_rest − v + I) = v_th + u for v.
            (V_TH + u - ALPHA * (V_REST + current[j])) / (1.0 - ALPHA)
        })
        .collect();
    vec![x, Tensor::from_vec(v, &[LIF_HID]).unwrap(), w, b]
}

/// `u = v⁻ − v_th` of a step (a spike function of zero leaves `v' = v⁻`).
fn lif_u(a: &[Tensor]) -> Tensor {
    let v_pre = lif_step_with(a, |u| Ok(u.zeros_like()))
        .unwrap()
        .remove(1)
        .to_vec_f64()
        .unwrap();
    let u: Vec<f64> = v_pre.iter().map(|v| v - V_TH).collect();
    Tensor::from_vec(u, &[LIF_HID]).unwrap()
}

/// A loss that uses both outputs, with unit-specific weights.
fn lif_loss_with<S>(a: &[Tensor], spike_fn: S) -> Result<Tensor>
where
    S: Fn(&Tensor) -> Result<Tensor>,
{
    let out = lif_step_with(a, spike_fn)?;
    let c = Tensor::from_vec(vec![1.0, -0.5, 2.0, 0.7, -1.5, 0.3], &[LIF_HID])?;
    out[0].mul(&c)?.add(&out[1].square()?)?.sum_all()
}

fn lif_loss(a: &[Tensor]) -> Result<Tensor> {
    lif_loss_with(a, spike)
}

#[test]
fn lif_graph_is_readable() {
    let g = make_graph(lif_step, &avals(&lif_args(10))).unwrap();
    assert_readable(
        &g,
        &["matmul", "rsub_scalar", "mul_scalar", "spike", "sub"],
        &["f64[3]", "f64[6]", "f64[3,6]"],
    );
    assert_eq!(g.out_avals().len(), 2);
    // The spike is one equation (no step/atan/stop_gradient expansion).
    let names = g.primitive_names();
    assert_eq!(names.iter().filter(|n| *n == "spike").count(), 1, "{g}");
    for gone in ["step", "atan", "stop_gradient"] {
        assert!(!names.iter().any(|n| n == gone), "{gone} in:\n{g}");
    }
    assert!(
        g.to_string().contains("spike[surrogate=arctan(alpha=2)]"),
        "{g}"
    );
}

#[test]
fn lif_spike_forward_is_heaviside() {
    let u = Tensor::from_vec(vec![-2.0, -0.3, -1e-9, 1e-9, 0.25, 3.0], &[6]).unwrap();
    assert_eq!(
        spike(&u).unwrap().to_vec_f64().unwrap(),
        vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    );
    let a = lif_args(11);
    let out = lif_step(&a).unwrap();
    let u = lif_u(&a).to_vec_f64().unwrap();
    let s = out[0].to_vec_f64().unwrap();
    for (ui, si) in u.iter().zip(&s) {
        assert_eq!(*si, if *ui > 0.0 { 1.0 } else { 0.0 });
    }
    assert!(s.contains(&0.0) && s.contains(&1.0), "both cases present");
}

#[test]
fn lif_spike_gradient_is_arctan_surrogate() {
    let vals = vec![-1.5, -0.4, -0.05, 0.0, 0.05, 0.3, 2.0];
    let n = vals.len();
    let u = Tensor::from_vec(vals.clone(), &[n]).unwrap();
    let g = grad(|a: &[Tensor]| spike(&a[0])?.sum_all())(std::slice::from_ref(&u))
        .unwrap()
        .remove(0);
    let expect: Vec<f64> = vals.iter().map(|&u| surrogate_grad(u)).collect();
    assert_close(
        "spike'(u)",
        &g,
        &Tensor::from_vec(expect.clone(), &[n]).unwrap(),
        1e-15,
        0.0,
    );
    // It is the derivative of atan(πu)/π: compare with finite differences
    // of that antiderivative in plain f64.
    for (ui, ei) in vals.iter().zip(&expect) {
        let h = 1e-5;
        let fd = (((ui + h) * PI).atan() - ((ui - h) * PI).atan()) / PI / (2.0 * h);
        assert!((fd - ei).abs() <= 1e-6 * ei.abs(), "u={ui}: {fd} vs {ei}");
    }
    // Forward mode agrees with reverse mode.
    let (_, t) = jvp(
        |a: &[Tensor]| Ok(vec![spike(&a[0])?]),
        std::slice::from_ref(&u),
        &[u.ones_like()],
    )
    .unwrap();
    assert_close("jvp spike", &t[0], &g, 1e-15, 0.0);
}

#[test]
fn lif_grads_match_finite_differences_of_linearised_spike() {
    // With the surrogate, the gradient treats the spike as if it were
    // `step(u0) + g(u0) (u − u0)` near the current `u0`. That function is
    // smooth, so finite differences of the model built with it are the
    // reference for the surrogate gradient of every weight.
    let a = lif_args(12);
    let u0 = lif_u(&a);
    let g0: Vec<f64> = u0
        .to_vec_f64()
        .unwrap()
        .into_iter()
        .map(surrogate_grad)
        .collect();
    let g0 = Tensor::from_vec(g0, &[LIF_HID]).unwrap();
    let s0: Vec<f64> = u0
        .to_vec_f64()
        .unwrap()
        .into_iter()
        .map(|u| f64::from(u > 0.0))
        .collect();
    let s0 = Tensor::from_vec(s0, &[LIF_HID]).unwrap();
    let linearised =
        |args: &[Tensor]| lif_loss_with(args, |u: &Tensor| s0.add(&g0.mul(&u.sub(&u0)?)?));
    let g = grad(lif_loss)(&a).unwrap();
    for (k, name) in ["x", "v", "W", "b"].iter().enumerate() {
        let fd = fd_grad(&linearised, &a, k, 1e-5);
        assert_close(&format!("dL/d{name}"), &g[k], &fd, 1e-6, 1e-9);
    }
    // The surrogate matters: without it the weight gradient differs.
    let hard = grad(|args: &[Tensor]| lif_loss_with(args, |u: &Tensor| u.step()))(&a).unwrap();
    let diff = hard[2]
        .sub(&g[2])
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap();
    assert!(diff.item().unwrap() > 1e-3);
}

#[test]
fn lif_jit_and_vmap_match_eager() {
    const B: usize = 4;
    let f = braintrace::Jit::new(lif_step);
    let a = lif_args(13);
    let eager = lif_step(&a).unwrap();
    let jitted = f.call(&a).unwrap();
    f.call(&a).unwrap();
    assert_eq!(f.trace_count(), 1);
    for (j, e) in jitted.iter().zip(&eager) {
        assert_close("jit lif", j, e, 0.0, 0.0);
    }

    // A batch: each example has its own input and membrane potential.
    let rows: Vec<Vec<Tensor>> = (0..B as u64).map(|i| lif_args(20 + 3 * i)).collect();
    let w = rows[0][2].clone();
    let b = rows[0][3].clone();
    let rows: Vec<Vec<Tensor>> = rows
        .into_iter()
        .map(|r| vec![r[0].clone(), r[1].clone(), w.clone(), b.clone()])
        .collect();
    let xs = stack(&rows.iter().map(|r| r[0].clone()).collect::<Vec<_>>(), 0).unwrap();
    let vs = stack(&rows.iter().map(|r| r[1].clone()).collect::<Vec<_>>(), 0).unwrap();
    let batch = [xs, vs, w, b];
    let in_axes = vec![Some(0), Some(0), None, None];
    let mapped = vmap(lif_step, in_axes.clone())(&batch).unwrap();
    let jit_mapped = jit(vmap(lif_step, in_axes.clone()))(&batch).unwrap();
    let per_ex = jit(vmap(grad(lif_loss), in_axes))(&batch).unwrap();
    for (i, r) in rows.iter().enumerate() {
        let e = lif_step(r).unwrap();
        let ge = grad(lif_loss)(r).unwrap();
        for k in 0..2 {
            let m = mapped[k].index_axis0(i).unwrap();
            assert_close("vmap lif", &m, &e[k], 1e-14, 1e-15);
            assert_close(
                "jit(vmap) lif",
                &jit_mapped[k].index_axis0(i).unwrap(),
                &m,
                0.0,
                0.0,
            );
        }
        for k in 0..4 {
            assert_close(
                "vmap(grad) lif",
                &per_ex[k].index_axis0(i).unwrap(),
                &ge[k],
                1e-12,
                1e-14,
            );
        }
    }
}
