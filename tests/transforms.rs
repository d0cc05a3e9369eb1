//! Acceptance tests of the transforms and their nesting: jit caching,
//! grad-of-grad (Hessian-vector products), vmap(grad), jvp/vjp duality,
//! jit(vmap(grad)), jvp(vmap) and vmap(jvp), closures capturing tensors of
//! an enclosing trace, make_graph printing and eval_shape. Expected values
//! come from finite differences, explicit loops or hand formulas.

mod common;

use braintrace::prelude::*;
use common::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn tanh_prime(z: f64) -> f64 {
    1.0 - z.tanh().powi(2)
}

// ------------------------------------------------------------------ jit

#[test]
fn jit_equals_f_and_caches_by_avals() {
    let traces = Arc::new(AtomicUsize::new(0));
    let c = traces.clone();
    // f(x, y) = sum_0(tanh(x) * y)
    let f = move |a: &[Tensor]| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(vec![a[0].tanh()?.mul(&a[1])?.sum(&[0])?])
    };
    let reference = |x: &Tensor, y: &Tensor| -> Vec<f64> {
        let (xv, yv) = (v(x), v(y));
        let (r, c) = (x.shape()[0], x.shape()[1]);
        (0..c)
            .map(|j| (0..r).map(|i| xv[i * c + j].tanh() * yv[i * c + j]).sum())
            .collect()
    };
    let jf = jit(f);
    let mut rng = Lcg::new(1);
    let (x, y) = (rng.normal(&[2, 3]), rng.normal(&[2, 3]));
    let out = jf(&[x.clone(), y.clone()]).unwrap();
    assert_eq!(traces.load(Ordering::SeqCst), 1, "first call traces once");
    assert_tensor("jit first call", &out[0], &[3], &reference(&x, &y));
    // Same avals, new data: no re-trace, fresh result.
    let (x2, y2) = (rng.normal(&[2, 3]), rng.normal(&[2, 3]));
    let out = jf(&[x2.clone(), y2.clone()]).unwrap();
    assert_eq!(traces.load(Ordering::SeqCst), 1, "same avals: no re-trace");
    assert_tensor("jit cached call", &out[0], &[3], &reference(&x2, &y2));
    // New shape: re-trace.
    let (x3, y3) = (rng.normal(&[4, 2]), rng.normal(&[4, 2]));
    let out = jf(&[x3.clone(), y3.clone()]).unwrap();
    assert_eq!(traces.load(Ordering::SeqCst), 2, "new shape: re-trace");
    assert_tensor("jit new shape", &out[0], &[2], &reference(&x3, &y3));
    // New dtype: re-trace.
    let out = jf(&[x.cast(DType::F32).unwrap(), y.cast(DType::F32).unwrap()]).unwrap();
    assert_eq!(traces.load(Ordering::SeqCst), 3, "new dtype: re-trace");
    assert_eq!(out[0].dtype(), DType::F32);
    assert_allclose("jit f32", &v(&out[0]), &reference(&x, &y), 1e-6, 1e-6);
    // Back to the first avals: still cached.
    jf(&[x.clone(), y.clone()]).unwrap();
    jf(&[x3, y3]).unwrap();
    assert_eq!(traces.load(Ordering::SeqCst), 3, "all avals cached");
}

#[test]
fn jit_struct_reports_trace_count_and_graph() {
    let j = braintrace::Jit::new(|a: &[Tensor]| Ok(vec![a[0].exp()?.sum_all()?]));
    let x = t(vec![0.0, 1.0, 2.0], &[3]);
    let want = 1.0 + 1f64.exp() + 2f64.exp();
    assert_allclose(
        "jit",
        &v(&j.call(std::slice::from_ref(&x)).unwrap()[0]),
        &[want],
        1e-14,
        0.0,
    );
    j.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(j.trace_count(), 1);
    let g = j.cached_graph(&[x.aval()]).expect("graph cached");
    assert_eq!(g.primitive_names(), vec!["exp", "reduce_sum"]);
    assert!(j.cached_graph(&[Aval::new(&[4], DType::F64)]).is_none());
}

#[test]
fn jit_with_captured_constant() {
    let w = t(vec![1.0, -2.0, 0.5], &[3]);
    let wv = v(&w);
    let jf = jit(move |a: &[Tensor]| Ok(vec![a[0].mul(&w)?.add_scalar(1.0)?]));
    for seed in 0..3 {
        let x = Lcg::new(seed).normal(&[2, 3]);
        let want: Vec<f64> = v(&x)
            .iter()
            .enumerate()
            .map(|(k, x)| x * wv[k % 3] + 1.0)
            .collect();
        assert_tensor("jit captured", &jf(&[x]).unwrap()[0], &[2, 3], &want);
    }
}

#[test]
fn jit_of_grad_equals_grad_and_does_not_retrace() {
    let traces = Arc::new(AtomicUsize::new(0));
    let c = traces.clone();
    let f = move |a: &[Tensor]| {
        c.fetch_add(1, Ordering::SeqCst);
        a[0].sin()?.mul(&a[1])?.sum_all()
    };
    let jg = jit(grad(f));
    let mut rng = Lcg::new(3);
    for _ in 0..3 {
        let (x, y) = (rng.normal(&[4]), rng.normal(&[4]));
        let g = jg(&[x.clone(), y.clone()]).unwrap();
        let (xv, yv) = (v(&x), v(&y));
        let gx: Vec<f64> = xv.iter().zip(&yv).map(|(x, y)| x.cos() * y).collect();
        let gy: Vec<f64> = xv.iter().map(|x| x.sin()).collect();
        assert_allclose("jit(grad) dx", &v(&g[0]), &gx, 1e-13, 1e-15);
        assert_allclose("jit(grad) dy", &v(&g[1]), &gy, 1e-13, 1e-15);
    }
    assert_eq!(
        traces.load(Ordering::SeqCst),
        1,
        "jit(grad(f)) traces f once"
    );
}

// ------------------------------------------------------------------ higher order

/// f(x) = sum(tanh(W x)) + 0.5 (x·x)^2, with hand-written gradient and Hessian.
struct Quartic {
    w: Vec<f64>, // (m, n) row-major
    m: usize,
    n: usize,
}

impl Quartic {
    fn f(&self, x: &Tensor) -> Result<Tensor> {
        let w = t(self.w.clone(), &[self.m, self.n]);
        let a = w.matmul(x)?.tanh()?.sum_all()?;
        let sq = x.mul(x)?.sum_all()?;
        a.add(&sq.square()?.mul_scalar(0.5)?)
    }
    fn z(&self, x: &[f64]) -> Vec<f64> {
        (0..self.m)
            .map(|i| (0..self.n).map(|j| self.w[i * self.n + j] * x[j]).sum())
            .collect()
    }
    fn grad(&self, x: &[f64]) -> Vec<f64> {
        let z = self.z(x);
        let s: f64 = x.iter().map(|x| x * x).sum();
        (0..self.n)
            .map(|j| {
                (0..self.m)
                    .map(|i| self.w[i * self.n + j] * tanh_prime(z[i]))
                    .sum::<f64>()
                    + 2.0 * s * x[j]
            })
            .collect()
    }
    fn hessian(&self, x: &[f64]) -> Vec<Vec<f64>> {
        let z = self.z(x);
        let s: f64 = x.iter().map(|x| x * x).sum();
        let n = self.n;
        let mut h = vec![vec![0.0; n]; n];
        for (j, row) in h.iter_mut().enumerate() {
            for (k, hjk) in row.iter_mut().enumerate() {
                let mut acc = 0.0;
                for (i, &zi) in z.iter().enumerate() {
                    let th = zi.tanh();
                    acc += self.w[i * n + j] * self.w[i * n + k] * (-2.0 * th * (1.0 - th * th));
                }
                acc += 4.0 * x[j] * x[k] + if j == k { 2.0 * s } else { 0.0 };
                *hjk = acc;
            }
        }
        h
    }
}

#[test]
fn grad_of_grad_hessian_vector_product() {
    let mut rng = Lcg::new(4);
    let (m, n) = (3, 4);
    let q = Arc::new(Quartic {
        w: rng.vec(m * n),
        m,
        n,
    });
    let x = rng.normal(&[n]);
    let vv = rng.normal(&[n]);
    let xv = v(&x);

    // First order against the hand formula.
    let q1 = q.clone();
    let gf = grad(move |a: &[Tensor]| q1.f(&a[0]));
    assert_allclose(
        "grad",
        &v(&gf(std::slice::from_ref(&x)).unwrap()[0]),
        &q.grad(&xv),
        1e-12,
        1e-14,
    );

    // HVP as the gradient of <grad f(x), v> (reverse over reverse).
    let q2 = q.clone();
    let v2 = vv.clone();
    let hvp = grad(move |a: &[Tensor]| {
        let q3 = q2.clone();
        let g = grad(move |b: &[Tensor]| q3.f(&b[0]))(a)?;
        g[0].mul(&v2)?.sum_all()
    });
    let got = v(&hvp(std::slice::from_ref(&x)).unwrap()[0]);

    // Finite differences of the (hand-written) gradient along v.
    let h = 1e-5;
    let vvv = v(&vv);
    let plus: Vec<f64> = xv.iter().zip(&vvv).map(|(x, d)| x + h * d).collect();
    let minus: Vec<f64> = xv.iter().zip(&vvv).map(|(x, d)| x - h * d).collect();
    let fd: Vec<f64> = q
        .grad(&plus)
        .iter()
        .zip(q.grad(&minus))
        .map(|(p, m)| (p - m) / (2.0 * h))
        .collect();
    assert_rel("HVP vs FD of gradient", &got, &fd, 1e-6);
    // Finite differences of the library's own gradient along v.
    let gx = |x: Vec<f64>| v(&gf(&[t(x, &[n])]).unwrap()[0]);
    let fd_lib: Vec<f64> = gx(plus)
        .iter()
        .zip(gx(minus))
        .map(|(p, m)| (p - m) / (2.0 * h))
        .collect();
    assert_rel("HVP vs FD of grad()", &got, &fd_lib, 1e-6);
    // And the hand Hessian.
    let hm = q.hessian(&xv);
    let want: Vec<f64> = hm.iter().map(|row| dot(row, &vvv)).collect();
    assert_rel("HVP vs hand Hessian", &got, &want, 1e-10);

    // Forward over reverse: jvp of grad.
    let q4 = q.clone();
    let gfv = move |a: &[Tensor]| grad(|b: &[Tensor]| q4.f(&b[0]))(a);
    let (_, tg) = jvp(gfv, std::slice::from_ref(&x), std::slice::from_ref(&vv)).unwrap();
    assert_rel("jvp(grad) vs hand Hessian", &v(&tg[0]), &want, 1e-10);

    // The full Hessian by vmap over the basis of HVPs.
    let q5 = q.clone();
    let x5 = x.clone();
    let hess_rows = vmap(
        move |a: &[Tensor]| {
            let q6 = q5.clone();
            let (_, t) = jvp(
                move |b: &[Tensor]| grad(|c: &[Tensor]| q6.f(&c[0]))(b),
                std::slice::from_ref(&x5),
                a,
            )?;
            Ok(t)
        },
        vec![Some(0)],
    );
    let mut eye = vec![0.0; n * n];
    for i in 0..n {
        eye[i * n + i] = 1.0;
    }
    let hv = hess_rows(&[t(eye, &[n, n])]).unwrap();
    let flat: Vec<f64> = hm.iter().flatten().copied().collect();
    assert_eq!(hv[0].shape(), &[n, n]);
    assert_rel("vmap(jvp(grad)) Hessian", &v(&hv[0]), &flat, 1e-10);
}

#[test]
fn scalar_derivatives_to_third_order() {
    // f(x) = sin(x) x^2
    let f = |a: &[Tensor]| a[0].sin()?.mul(&a[0].square()?)?.sum_all();
    let d1 = grad(f);
    let d2 = grad(move |a: &[Tensor]| d1(a)?.remove(0).sum_all());
    let d3 = grad(move |a: &[Tensor]| d2(a)?.remove(0).sum_all());
    for x in [0.3, -1.1, 2.0] {
        let got = v(&d3(&[Tensor::scalar(x)]).unwrap()[0])[0];
        // f''' = 6 cos x - 6 x sin x - x^2 cos x
        let want = 6.0 * x.cos() - 6.0 * x * x.sin() - x * x * x.cos();
        assert_allclose("third derivative", &[got], &[want], 1e-12, 1e-13);
    }
}

// ------------------------------------------------------------------ vmap of grad

fn loss(a: &[Tensor]) -> Result<Tensor> {
    // w: (3, 2), x: (3,), y: (2,)  ->  sum((tanh(x @ w) - y)^2)
    a[1].matmul(&a[0])?.tanh()?.sub(&a[2])?.square()?.sum_all()
}

fn hand_loss_grad(w: &[f64], x: &[f64], y: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let z: Vec<f64> = (0..2)
        .map(|j| (0..3).map(|i| x[i] * w[i * 2 + j]).sum())
        .collect();
    let r: Vec<f64> = (0..2)
        .map(|j| 2.0 * (z[j].tanh() - y[j]) * tanh_prime(z[j]))
        .collect();
    let gw = (0..6).map(|k| x[k / 2] * r[k % 2]).collect();
    let gx = (0..3)
        .map(|i| (0..2).map(|j| w[i * 2 + j] * r[j]).sum())
        .collect();
    let gy = (0..2).map(|j| -2.0 * (z[j].tanh() - y[j])).collect();
    (gw, gx, gy)
}

#[test]
fn vmap_of_grad_equals_per_example_gradients() {
    let mut rng = Lcg::new(5);
    let w = rng.normal(&[3, 2]);
    let xs = rng.normal(&[4, 3]);
    let ys = rng.normal(&[4, 2]);
    let per_ex = vmap(grad(loss), vec![None, Some(0), Some(0)]);
    let g = per_ex(&[w.clone(), xs.clone(), ys.clone()]).unwrap();
    assert_eq!(g[0].shape(), &[4, 3, 2]);
    assert_eq!(g[1].shape(), &[4, 3]);
    assert_eq!(g[2].shape(), &[4, 2]);
    let (wv, xv, yv) = (v(&w), v(&xs), v(&ys));
    let (mut gw, mut gx, mut gy) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..4 {
        let (a, c, d) = hand_loss_grad(&wv, &xv[b * 3..b * 3 + 3], &yv[b * 2..b * 2 + 2]);
        gw.extend(a);
        gx.extend(c);
        gy.extend(d);
    }
    assert_allclose("vmap(grad) dw", &v(&g[0]), &gw, 1e-12, 1e-14);
    assert_allclose("vmap(grad) dx", &v(&g[1]), &gx, 1e-12, 1e-14);
    assert_allclose("vmap(grad) dy", &v(&g[2]), &gy, 1e-12, 1e-14);
    // The same with the example axis of x last and w mapped too, against a
    // loop of grad calls.
    let ws = rng.normal(&[4, 3, 2]);
    let xt = rng.normal(&[3, 4]);
    check_vmap(
        "vmap(grad) axes",
        &grad(loss),
        &[ws, xt, ys.clone()],
        &[Some(0), Some(1), Some(0)],
    );
}

#[test]
fn jit_of_vmap_of_grad_equals_unjitted() {
    let traces = Arc::new(AtomicUsize::new(0));
    let c = traces.clone();
    let counted = move |a: &[Tensor]| {
        c.fetch_add(1, Ordering::SeqCst);
        loss(a)
    };
    let jf = jit(vmap(grad(counted), vec![None, Some(0), Some(0)]));
    let plain = vmap(grad(loss), vec![None, Some(0), Some(0)]);
    let mut rng = Lcg::new(6);
    for round in 0..3 {
        let args = [
            rng.normal(&[3, 2]),
            rng.normal(&[5, 3]),
            rng.normal(&[5, 2]),
        ];
        let a = jf(&args).unwrap();
        let b = plain(&args).unwrap();
        assert_eq!(a.len(), 3);
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.shape(), y.shape());
            assert_allclose(
                &format!("jit(vmap(grad)) round {round} output {k}"),
                &v(x),
                &v(y),
                1e-14,
                1e-15,
            );
        }
    }
    assert_eq!(
        traces.load(Ordering::SeqCst),
        1,
        "one trace for three calls"
    );
}

// ------------------------------------------------------------------ jvp / vjp duality

#[test]
fn jvp_vjp_duality() {
    let mut rng = Lcg::new(7);
    // Two inputs, two outputs, with broadcasting and reductions.
    let f = |a: &[Tensor]| {
        let (x, w) = (&a[0], &a[1]);
        let h = w.matmul(x)?.tanh()?; // (3,)
        let s = x.pow_scalar(3.0)?.sum_all()?.mul(&h.sum_all()?)?; // ()
        Ok(vec![h.mul(&x.slice_axis(0, 0, 3)?)?, s])
    };
    for _ in 0..3 {
        let args = [rng.normal(&[4]), rng.normal(&[3, 4])];
        let tang = [rng.normal(&[4]), rng.normal(&[3, 4])];
        let (outs, jv) = jvp(f, &args, &tang).unwrap();
        let cts: Vec<Tensor> = outs.iter().map(|o| rng.normal(o.shape())).collect();
        let (_, pb) = vjp(f, &args).unwrap();
        let jtu = pb.apply(&cts).unwrap();
        let lhs: f64 = cts.iter().zip(&jv).map(|(u, j)| dot(&v(u), &v(j))).sum();
        let rhs: f64 = jtu.iter().zip(&tang).map(|(g, t)| dot(&v(g), &v(t))).sum();
        assert!(
            (lhs - rhs).abs() <= 1e-12 * lhs.abs().max(rhs.abs()).max(1.0),
            "<u, Jv> = {lhs} but <J^T u, v> = {rhs}"
        );
        // And both against finite differences.
        check_grads("duality function", &f, &args, &mut rng);
    }
}

#[test]
fn value_and_grad_and_integer_arguments() {
    let x = t(vec![0.5, -1.0, 2.0], &[3]);
    let idx = Tensor::from_vec_typed(vec![2i64, 2, 0], &[3]).unwrap();
    let vg = value_and_grad(|a: &[Tensor]| a[0].take(&a[1], 0)?.exp()?.sum_all());
    let (val, g) = vg(&[x.clone(), idx.clone()]).unwrap();
    let want = 2.0 * 2f64.exp() + 0.5f64.exp();
    assert_allclose("value", &v(&val), &[want], 1e-14, 0.0);
    assert_eq!(val.shape(), &[] as &[usize]);
    assert_allclose(
        "grad x",
        &v(&g[0]),
        &[0.5f64.exp(), 0.0, 2.0 * 2f64.exp()],
        1e-14,
        0.0,
    );
    assert_eq!(
        g[1].dtype(),
        DType::I64,
        "integer argument gets an integer zero"
    );
    assert_eq!(v(&g[1]), vec![0.0; 3]);
    // An input the output does not depend on gets zeros.
    let g = grad(|a: &[Tensor]| a[0].sum_all())(&[x.clone(), x.clone()]).unwrap();
    assert_tensor("unused input", &g[1], &[3], &[0.0; 3]);
    // Multi-output vjp with a zero cotangent for one output.
    let (_, pb) = vjp(
        |a: &[Tensor]| Ok(vec![a[0].square()?, a[0].exp()?]),
        std::slice::from_ref(&x),
    )
    .unwrap();
    let g = pb.apply(&[x.ones_like(), x.zeros_like()]).unwrap();
    assert_tensor("vjp first output only", &g[0], &[3], &[1.0, -2.0, 4.0]);
}

// ------------------------------------------------------------------ jvp and vmap

#[test]
fn jvp_of_vmap_and_vmap_of_jvp() {
    let mut rng = Lcg::new(8);
    // Per example: f(x) = sin(x) * sum(x),  x: (3,)
    let f = |a: &[Tensor]| Ok(vec![a[0].sin()?.mul(&a[0].sum_all()?)?]);
    let hand = |x: &[f64], t: &[f64]| -> (Vec<f64>, Vec<f64>) {
        let s: f64 = x.iter().sum();
        let ts: f64 = t.iter().sum();
        let y = x.iter().map(|x| x.sin() * s).collect();
        let dy = x
            .iter()
            .zip(t)
            .map(|(x, t)| x.cos() * t * s + x.sin() * ts)
            .collect();
        (y, dy)
    };
    let xs = rng.normal(&[4, 3]);
    let ts = rng.normal(&[4, 3]);
    let (xv, tv) = (v(&xs), v(&ts));
    let (mut wy, mut wt) = (Vec::new(), Vec::new());
    for b in 0..4 {
        let (y, d) = hand(&xv[b * 3..b * 3 + 3], &tv[b * 3..b * 3 + 3]);
        wy.extend(y);
        wt.extend(d);
    }
    // jvp(vmap(f))
    let (y, dy) = jvp(
        vmap(f, vec![Some(0)]),
        std::slice::from_ref(&xs),
        std::slice::from_ref(&ts),
    )
    .unwrap();
    assert_allclose("jvp(vmap) primal", &v(&y[0]), &wy, 1e-13, 1e-15);
    assert_allclose("jvp(vmap) tangent", &v(&dy[0]), &wt, 1e-13, 1e-15);
    // vmap(jvp(f)) over primals and tangents.
    let jf = move |a: &[Tensor]| {
        let (p, t) = jvp(f, &a[..1], &a[1..])?;
        Ok(vec![p[0].clone(), t[0].clone()])
    };
    let out = vmap(jf, vec![Some(0), Some(0)])(&[xs.clone(), ts.clone()]).unwrap();
    assert_allclose("vmap(jvp) primal", &v(&out[0]), &wy, 1e-13, 1e-15);
    assert_allclose("vmap(jvp) tangent", &v(&out[1]), &wt, 1e-13, 1e-15);
    // Mapped over a non-zero axis, one tangent shared (unmapped).
    let xt = rng.normal(&[3, 4]);
    let t0 = rng.normal(&[3]);
    check_vmap("vmap(jvp) axis 1", &jf, &[xt, t0], &[Some(1), None]);
    // jvp of a vmap over axis 1 with an unmapped operand, against FD.
    let g = vmap(
        |a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.tanh()?.sum_all()?]),
        vec![Some(1), None],
    );
    check_grads(
        "jvp/vjp of vmap",
        &g,
        &[rng.normal(&[3, 5]), rng.normal(&[3])],
        &mut rng,
    );
}

#[test]
fn vmap_out_axes_and_nested_vmap() {
    let mut rng = Lcg::new(9);
    let x = rng.normal(&[4, 3]);
    let xv = v(&x);
    // Output axis 1: y[j, b] = 2 x[b, j]
    let f = braintrace::vmap_out(
        |a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?]),
        vec![Some(0)],
        Some(vec![1]),
    );
    let y = f(std::slice::from_ref(&x)).unwrap();
    let want: Vec<f64> = (0..12).map(|k| 2.0 * xv[(k % 4) * 3 + k / 4]).collect();
    assert_tensor("vmap_out axis 1", &y[0], &[3, 4], &want);
    // Nested vmap: the inner closure captures the outer batched tracer.
    let a = rng.normal(&[3]);
    let b = rng.normal(&[5]);
    let outer = vmap(
        |p: &[Tensor]| {
            let xi = p[0].clone();
            vmap(
                move |q: &[Tensor]| Ok(vec![q[0].mul(&xi)?.sin()?]),
                vec![Some(0)],
            )(&p[1..])
        },
        vec![Some(0), None],
    );
    let y = outer(&[a.clone(), b.clone()]).unwrap();
    let (av, bv) = (v(&a), v(&b));
    let want: Vec<f64> = (0..15).map(|k| (av[k / 5] * bv[k % 5]).sin()).collect();
    assert_tensor("nested vmap outer product", &y[0], &[3, 5], &want);
    // Unmapped outputs are broadcast over the batch.
    let f = vmap(
        |a: &[Tensor]| Ok(vec![a[0].clone(), a[1].exp()?]),
        vec![None, Some(0)],
    );
    let c = t(vec![1.0, 2.0], &[2]);
    let y = f(&[c, rng.normal(&[3])]).unwrap();
    assert_tensor(
        "unmapped output",
        &y[0],
        &[3, 2],
        &[1.0, 2.0, 1.0, 2.0, 1.0, 2.0],
    );
}

// ------------------------------------------------------------------ captured tracers

#[test]
fn grad_of_function_calling_grad_with_captured_tracer() {
    // g(x) = sum( d/dy [ sum(sin(x * y)) ] at y0 ) = sum(x cos(x y0))
    // dg/dx = cos(x y0) - x y0 sin(x y0)
    let mut rng = Lcg::new(10);
    let x = rng.normal(&[4]);
    let y0 = rng.normal(&[4]);
    let y0c = y0.clone();
    let outer = grad(move |a: &[Tensor]| {
        let xc = a[0].clone(); // a tracer of the outer trace
        let inner = grad(move |b: &[Tensor]| xc.mul(&b[0])?.sin()?.sum_all());
        inner(std::slice::from_ref(&y0c))?.remove(0).sum_all()
    });
    let g = outer(std::slice::from_ref(&x)).unwrap();
    let want: Vec<f64> = v(&x)
        .iter()
        .zip(v(&y0))
        .map(|(x, y)| (x * y).cos() - x * y * (x * y).sin())
        .collect();
    assert_allclose("grad(grad with captured x)", &v(&g[0]), &want, 1e-12, 1e-14);
}

#[test]
fn transforms_capturing_outer_tracers() {
    let mut rng = Lcg::new(11);
    let w = rng.normal(&[3]);
    let xs = rng.normal(&[5, 3]);
    let (wv, xv) = (v(&w), v(&xs));
    let z: Vec<f64> = (0..5)
        .map(|b| (0..3).map(|i| xv[b * 3 + i] * wv[i]).sum())
        .collect();
    // grad over w of sum(vmap(x -> tanh(x·w))(X)), w captured by the vmapped closure.
    let xs2 = xs.clone();
    let g = grad(move |a: &[Tensor]| {
        let wc = a[0].clone();
        let per = vmap(
            move |b: &[Tensor]| Ok(vec![b[0].mul(&wc)?.sum_all()?.tanh()?]),
            vec![Some(0)],
        );
        per(std::slice::from_ref(&xs2))?.remove(0).sum_all()
    })(std::slice::from_ref(&w))
    .unwrap();
    let want: Vec<f64> = (0..3)
        .map(|i| (0..5).map(|b| tanh_prime(z[b]) * xv[b * 3 + i]).sum())
        .collect();
    assert_allclose("grad over captured in vmap", &v(&g[0]), &want, 1e-12, 1e-14);

    // grad over w of a jitted function capturing w (not cacheable).
    let xs3 = xs.clone();
    let g = grad(move |a: &[Tensor]| {
        let wc = a[0].clone();
        let jf = jit(move |b: &[Tensor]| Ok(vec![b[0].mul(&wc)?.sum(&[1])?.tanh()?.sum_all()?]));
        let first = jf(std::slice::from_ref(&xs3))?.remove(0);
        let second = jf(std::slice::from_ref(&xs3))?.remove(0);
        first.add(&second)
    })(std::slice::from_ref(&w))
    .unwrap();
    let want2: Vec<f64> = want.iter().map(|g| 2.0 * g).collect();
    assert_allclose("grad over captured in jit", &v(&g[0]), &want2, 1e-12, 1e-14);

    // jvp inside vmap, the jvp'd closure capturing the vmapped tracer.
    let ts = rng.normal(&[5, 3]);
    let out = vmap(
        |a: &[Tensor]| {
            let xi = a[0].clone();
            let (_, tt) = jvp(
                move |b: &[Tensor]| Ok(vec![b[0].mul(&xi)?.sum_all()?.tanh()?]),
                &a[1..2],
                &a[2..3],
            )?;
            Ok(tt)
        },
        vec![Some(0), None, Some(0)],
    )(&[xs.clone(), w.clone(), ts.clone()])
    .unwrap();
    let tv = v(&ts);
    let want: Vec<f64> = (0..5)
        .map(|b| tanh_prime(z[b]) * (0..3).map(|i| xv[b * 3 + i] * tv[b * 3 + i]).sum::<f64>())
        .collect();
    assert_allclose("jvp in vmap capturing", &v(&out[0]), &want, 1e-12, 1e-14);
}

#[test]
fn escaped_tracer_is_an_error_not_a_panic() {
    let leaked: std::rc::Rc<std::cell::RefCell<Option<Tensor>>> = Default::default();
    let l2 = leaked.clone();
    make_graph(
        move |a: &[Tensor]| {
            *l2.borrow_mut() = Some(a[0].clone());
            Ok(vec![a[0].exp()?])
        },
        &[Aval::new(&[2], DType::F64)],
    )
    .unwrap();
    let tr = leaked.borrow().clone().unwrap();
    let e = tr.exp().unwrap_err();
    assert!(matches!(e, Error::EscapedTracer { .. }), "{e}");
    assert!(tr.to_vec_f64().is_err());
}

// ------------------------------------------------------------------ graphs

#[test]
fn make_graph_display() {
    let b = t(vec![0.1, 0.2, 0.3, 0.4], &[4]);
    let g = make_graph(
        move |a: &[Tensor]| Ok(vec![a[0].matmul(&a[1])?.add(&b)?.tanh()?.sum(&[1])?]),
        &[
            Aval::new(&[2, 3], DType::F64),
            Aval::new(&[3, 4], DType::F64),
        ],
    )
    .unwrap();
    let s = g.to_string();
    println!("{s}");
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(
        lines.len(),
        g.eqns().len() + 2,
        "header, one line per equation, footer:\n{s}"
    );
    assert_eq!(
        g.primitive_names(),
        // add broadcasts the bias itself: no separate broadcast equation.
        vec!["matmul", "add", "tanh", "reduce_sum"]
    );
    assert!(
        lines[0].contains("f64[2,3]") && lines[0].contains("f64[3,4]"),
        "inputs in header: {}",
        lines[0]
    );
    assert!(
        lines[0].contains("f64[4]"),
        "captured constant in header: {}",
        lines[0]
    );
    for (line, name) in lines[1..lines.len() - 1].iter().zip(g.primitive_names()) {
        assert!(
            line.contains(" = ") && line.contains(&name),
            "equation line `{line}` names {name}"
        );
    }
    assert!(
        lines[1].contains("f64[2,4]") && lines[1].contains("matmul"),
        "{}",
        lines[1]
    );
    assert!(s.contains("reduce_sum[axes=[1]]"), "params shown:\n{s}");
    assert!(lines[4].contains("f64[2] = reduce_sum"), "{}", lines[4]);
    assert!(
        lines.last().unwrap().contains("in ("),
        "footer names outputs"
    );
    assert_eq!(
        g.in_avals(),
        vec![
            Aval::new(&[2, 3], DType::F64),
            Aval::new(&[3, 4], DType::F64)
        ]
    );
    assert_eq!(g.out_avals(), vec![Aval::new(&[2], DType::F64)]);
    // Evaluating the graph equals the explicit computation.
    let mut rng = Lcg::new(12);
    let (x, w) = (rng.normal(&[2, 3]), rng.normal(&[3, 4]));
    let y = g.eval(&[x.clone(), w.clone()]).unwrap();
    let (xv, wv) = (v(&x), v(&w));
    let want: Vec<f64> = (0..2)
        .map(|i| {
            (0..4)
                .map(|j| {
                    ((0..3).map(|k| xv[i * 3 + k] * wv[k * 4 + j]).sum::<f64>()
                        + 0.1 * (j + 1) as f64)
                        .tanh()
                })
                .sum()
        })
        .collect();
    assert_allclose("graph eval", &v(&y[0]), &want, 1e-13, 1e-15);
    // Dead code is removed.
    let g = make_graph(
        |a: &[Tensor]| {
            let _unused = a[0].exp()?;
            Ok(vec![a[0].sin()?])
        },
        &[Aval::new(&[2], DType::F32)],
    )
    .unwrap();
    assert_eq!(g.primitive_names(), vec!["sin"]);
    assert!(g.to_string().contains("f32[2] = sin"), "{g}");
}

#[test]
fn eval_shape_does_not_compute() {
    let saw_symbolic = Cell::new(true);
    let out = eval_shape(
        |a: &[Tensor]| {
            saw_symbolic.set(saw_symbolic.get() && a.iter().all(Tensor::is_symbolic));
            let y = a[0].matmul(&a[1])?;
            Ok(vec![y.sum(&[0])?, y.cast(DType::F32)?, a[0].gt(&a[0])?])
        },
        &[
            Aval::new(&[5, 3], DType::F64),
            Aval::new(&[3, 7], DType::F64),
        ],
    )
    .unwrap();
    assert!(saw_symbolic.get(), "eval_shape passes symbolic tensors");
    assert_eq!(
        out,
        vec![
            Aval::new(&[7], DType::F64),
            Aval::new(&[5, 7], DType::F32),
            Aval::new(&[5, 3], DType::Bool)
        ]
    );
    // A shape error is reported without evaluating anything.
    let e = eval_shape(
        |a: &[Tensor]| Ok(vec![a[0].matmul(&a[1])?]),
        &[
            Aval::new(&[5, 3], DType::F64),
            Aval::new(&[4, 7], DType::F64),
        ],
    )
    .unwrap_err();
    assert!(e.to_string().contains("matmul"), "{e}");
}

// ------------------------------------------------------------------ models

/// A GRU cell step: h' = (1 - z) * n + z * h.
fn gru(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, h, wz, uz, wr, ur, wn, un) = (&a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7]);
    let z = x.matmul(wz)?.add(&h.matmul(uz)?)?.sigmoid()?;
    let r = x.matmul(wr)?.add(&h.matmul(ur)?)?.sigmoid()?;
    let n = x.matmul(wn)?.add(&r.mul(h)?.matmul(un)?)?.tanh()?;
    Ok(vec![z.rsub_scalar(1.0)?.mul(&n)?.add(&z.mul(h)?)?])
}

#[test]
fn gru_cell_graph_and_gradients() {
    let (b, i, hd) = (2, 3, 4);
    let mut rng = Lcg::new(13);
    let mut args = vec![rng.normal(&[b, i]), rng.normal(&[b, hd])];
    for _ in 0..3 {
        args.push(rng.normal(&[i, hd]).mul_scalar(0.7).unwrap());
        args.push(rng.normal(&[hd, hd]).mul_scalar(0.7).unwrap());
    }
    let g = make_graph(gru, &braintrace::ops::avals(&args)).unwrap();
    let s = g.to_string();
    assert!(
        s.contains("logistic") && s.contains("tanh") && s.contains("matmul"),
        "{s}"
    );
    assert_eq!(s.lines().count(), g.eqns().len() + 2);
    // Forward against explicit loops.
    let y = gru(&args).unwrap().remove(0);
    let av: Vec<Vec<f64>> = args.iter().map(v).collect();
    let mm = |x: &[f64], w: &[f64], n_in: usize, r: usize, j: usize| -> f64 {
        (0..n_in).map(|k| x[r * n_in + k] * w[k * hd + j]).sum()
    };
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let mut want = Vec::new();
    for r in 0..b {
        let h = &av[1][r * hd..(r + 1) * hd];
        let rr: Vec<f64> = (0..hd)
            .map(|j| sig(mm(&av[0], &av[4], i, r, j) + mm(&av[1], &av[5], hd, r, j)))
            .collect();
        let rh: Vec<f64> = (0..hd).map(|j| rr[j] * h[j]).collect();
        for (j, &hj) in h.iter().enumerate() {
            let z = sig(mm(&av[0], &av[2], i, r, j) + mm(&av[1], &av[3], hd, r, j));
            let n = (mm(&av[0], &av[6], i, r, j) + mm(&rh, &av[7], hd, 0, j)).tanh();
            want.push((1.0 - z) * n + z * hj);
        }
    }
    assert_allclose("gru forward", &v(&y), &want, 1e-13, 1e-15);
    check_grads("gru", &gru, &args, &mut rng);
    check_vmap(
        "gru vmap",
        &gru,
        &{
            let mut a = args.clone();
            a[0] = rng.normal(&[5, b, i]);
            a
        },
        &[Some(0), None, None, None, None, None, None, None],
    );
}

/// A leaky integrate-and-fire step with a sigmoid surrogate spike gradient:
/// v' = v + (i - v) / tau; s = H(v' - 1) forward, sigmoid'(k (v' - 1)) k backward.
fn lif(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (vm, x, w) = (&a[0], &a[1], &a[2]);
    let v2 = vm.add(&x.matmul(w)?.sub(vm)?.mul_scalar(0.5)?)?;
    let u = v2.add_scalar(-1.0)?;
    let sur = u.mul_scalar(4.0)?.sigmoid()?;
    let spike = sur
        .sub(&sur.stop_gradient()?)?
        .add(&u.step()?.stop_gradient()?)?;
    let v3 = v2.sub(&spike.stop_gradient()?)?; // soft reset
    Ok(vec![v3, spike])
}

#[test]
fn lif_neuron_graph_and_gradients() {
    let mut rng = Lcg::new(14);
    let vm = rng.normal(&[3]);
    let x = rng.positive(&[2]);
    let w = rng.normal(&[2, 3]);
    let g = make_graph(lif, &[vm.aval(), x.aval(), w.aval()]).unwrap();
    let s = g.to_string();
    assert!(
        s.contains("step") && s.contains("stop_gradient") && s.contains("logistic"),
        "{s}"
    );
    let out = lif(&[vm.clone(), x.clone(), w.clone()]).unwrap();
    let (vv, xv, wv) = (v(&vm), v(&x), v(&w));
    let v2: Vec<f64> = (0..3)
        .map(|j| vv[j] + 0.5 * ((0..2).map(|k| xv[k] * wv[k * 3 + j]).sum::<f64>() - vv[j]))
        .collect();
    let spikes: Vec<f64> = v2
        .iter()
        .map(|&p| if p > 1.0 { 1.0 } else { 0.0 })
        .collect();
    assert_allclose("lif spikes", &v(&out[1]), &spikes, 1e-15, 1e-15);
    let reset: Vec<f64> = v2.iter().zip(&spikes).map(|(a, s)| a - s).collect();
    assert_allclose("lif v", &v(&out[0]), &reset, 1e-13, 1e-15);
    // Membrane output: smooth, check against FD.
    let mem = |a: &[Tensor]| Ok(vec![lif(a)?.remove(0)]);
    check_grads(
        "lif membrane",
        &mem,
        &[vm.clone(), x.clone(), w.clone()],
        &mut rng,
    );
    // Spike output: surrogate gradient by hand, d s / d w[k, j] = 0.5 x[k] 4 σ'(4 u).
    let gw = grad(|a: &[Tensor]| lif(a)?.remove(1).sum_all())(&[vm, x, w]).unwrap();
    let sp = |u: f64| {
        let s = 1.0 / (1.0 + (-4.0 * u).exp());
        4.0 * s * (1.0 - s)
    };
    let want: Vec<f64> = (0..6)
        .map(|k| 0.5 * xv[k / 3] * sp(v2[k % 3] - 1.0))
        .collect();
    assert_allclose("lif surrogate grad", &v(&gw[2]), &want, 1e-12, 1e-15);
}

// ------------------------------------------------------------------ every op, nested

type Op = fn(&[Tensor]) -> Result<Tensor>;

/// One function per core op (with broadcasting where it applies) and
/// inputs away from kinks; used for second-order and nested-vmap checks.
fn op_table(rng: &mut Lcg) -> Vec<(&'static str, Op, Vec<Tensor>)> {
    let idx = Tensor::from_vec_typed(vec![2i64, 0, 2, 1], &[2, 2]).unwrap();
    let cond =
        Tensor::from_vec_typed(vec![true, false, false, true, true, false], &[2, 3]).unwrap();
    vec![
        ("neg", |a| a[0].neg(), vec![rng.normal(&[2, 3])]),
        ("exp", |a| a[0].exp(), vec![rng.normal(&[2, 3])]),
        ("log", |a| a[0].log(), vec![rng.positive(&[2, 3])]),
        ("tanh", |a| a[0].tanh(), vec![rng.normal(&[2, 3])]),
        ("sigmoid", |a| a[0].sigmoid(), vec![rng.normal(&[2, 3])]),
        (
            "relu",
            |a| a[0].relu()?.square(),
            vec![rng.away_from_zero(&[2, 3])],
        ),
        ("sqrt", |a| a[0].sqrt(), vec![rng.positive(&[2, 3])]),
        (
            "abs",
            |a| a[0].abs()?.mul(&a[0]),
            vec![rng.away_from_zero(&[2, 3])],
        ),
        ("sin", |a| a[0].sin(), vec![rng.normal(&[2, 3])]),
        ("cos", |a| a[0].cos(), vec![rng.normal(&[2, 3])]),
        ("square", |a| a[0].square(), vec![rng.normal(&[2, 3])]),
        (
            "reciprocal",
            |a| a[0].reciprocal(),
            vec![rng.positive(&[2, 3])],
        ),
        ("softplus", |a| a[0].softplus(), vec![rng.normal(&[2, 3])]),
        (
            "mul_scalar",
            |a| a[0].mul_scalar(-1.3),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "add_scalar",
            |a| a[0].add_scalar(0.4),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "rsub_scalar",
            |a| a[0].rsub_scalar(0.4),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "rdiv_scalar",
            |a| a[0].rdiv_scalar(0.7),
            vec![rng.positive(&[2, 3])],
        ),
        (
            "pow_scalar",
            |a| a[0].pow_scalar(2.5),
            vec![rng.positive(&[2, 3])],
        ),
        (
            "max_scalar",
            |a| a[0].max_scalar(0.0)?.square(),
            vec![rng.away_from_zero(&[2, 3])],
        ),
        (
            "min_scalar",
            |a| a[0].min_scalar(0.0)?.square(),
            vec![rng.away_from_zero(&[2, 3])],
        ),
        (
            "add",
            |a| a[0].add(&a[1]),
            vec![rng.normal(&[3, 1]), rng.normal(&[1, 4])],
        ),
        (
            "sub",
            |a| a[0].sub(&a[1]),
            vec![rng.normal(&[2, 3]), rng.normal(&[3])],
        ),
        (
            "mul",
            |a| a[0].mul(&a[1]),
            vec![rng.normal(&[2, 3]), rng.normal(&[3])],
        ),
        (
            "div",
            |a| a[0].div(&a[1]),
            vec![rng.normal(&[3, 1]), rng.positive(&[1, 4])],
        ),
        (
            "maximum",
            |a| a[0].maximum(&a[1])?.square(),
            vec![rng.lattice(&[2, 3], 0.5), rng.lattice(&[3], 0.0)],
        ),
        (
            "minimum",
            |a| a[0].minimum(&a[1])?.square(),
            vec![rng.lattice(&[2, 3], 0.5), rng.lattice(&[], 0.0)],
        ),
        (
            "pow",
            |a| a[0].pow(&a[1]),
            vec![rng.positive(&[2, 3]), rng.normal(&[3])],
        ),
        (
            "matmul 2-D",
            |a| a[0].matmul(&a[1]),
            vec![rng.normal(&[2, 3]), rng.normal(&[3, 4])],
        ),
        (
            "matmul 1-D",
            |a| a[0].matmul(&a[1]),
            vec![rng.normal(&[3]), rng.normal(&[3, 2])],
        ),
        (
            "matmul batched",
            |a| a[0].matmul(&a[1]),
            vec![rng.normal(&[2, 1, 2, 3]), rng.normal(&[2, 3, 2])],
        ),
        (
            "transpose",
            |a| {
                a[0].transpose(&[2, 0, 1])?
                    .mul(&a[0].transpose(&[2, 0, 1])?.sin()?)
            },
            vec![rng.normal(&[2, 3, 2])],
        ),
        (
            "reshape",
            |a| a[0].reshape(&[3, 2])?.matmul(&a[0]),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "expand_dims",
            |a| a[0].expand_dims(1)?.mul(&a[0]),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "squeeze",
            |a| a[0].squeeze(&[0])?.mul(&a[0]),
            vec![rng.normal(&[1, 3])],
        ),
        (
            "broadcast_to",
            |a| a[0].broadcast_to(&[2, 3, 4])?.mul(&a[0]),
            vec![rng.normal(&[3, 1])],
        ),
        (
            "sum",
            |a| a[0].sum(&[1])?.square()?.sum_all()?.mul(&a[0]),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "mean",
            |a| a[0].mean(&[0])?.exp(),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "slice",
            |a| {
                a[0].slice(&[0, 1], &[2, 3])?
                    .mul(&a[0].slice_axis(1, 0, 2)?)
            },
            vec![rng.normal(&[2, 3])],
        ),
        (
            "index_axis",
            |a| {
                a[0].index_axis(1, 2)?
                    .mul(&a[0].index_axis(0, 1)?.sum_all()?)
            },
            vec![rng.normal(&[2, 3])],
        ),
        (
            "pad",
            |a| a[0].pad(&[1, 0], &[0, 2])?.sin(),
            vec![rng.normal(&[2, 3])],
        ),
        (
            "concat",
            |a| concat(&[a[0].clone(), a[1].square()?], 1),
            vec![rng.normal(&[2, 3]), rng.normal(&[2, 2])],
        ),
        (
            "stack",
            |a| stack(&[a[0].clone(), a[1].exp()?], 1),
            vec![rng.normal(&[2, 3]), rng.normal(&[2, 3])],
        ),
        (
            "take",
            |a| a[0].take(&a[1], 1)?.mul(&a[0].take(&a[1], 1)?),
            vec![rng.normal(&[2, 3]), idx.clone()],
        ),
        (
            "scatter_add",
            |a| braintrace::ops::index::scatter_add(&a[1], &a[0], 0, &[3, 2])?.square(),
            vec![rng.normal(&[2, 2, 2]), idx.clone()],
        ),
        (
            "where",
            |a| where_(&a[2], &a[0].square()?, &a[1].exp()?),
            vec![rng.normal(&[2, 3]), rng.normal(&[3]), cond],
        ),
        (
            "cast",
            |a| a[0].cast(DType::F32)?.cast(DType::F64)?.square(),
            vec![t(vec![0.5, -0.25, 1.0, 0.75, -1.5, 2.0], &[2, 3])],
        ),
        (
            "stop_gradient",
            |a| a[0].stop_gradient()?.mul(&a[0].square()?),
            vec![rng.normal(&[2, 3])],
        ),
    ]
}

/// A scalar function of the op's output with a non-zero Hessian.
fn scalar_of(op: Op) -> impl Fn(&[Tensor]) -> Result<Tensor> + Copy {
    move |a: &[Tensor]| op(a)?.sin()?.add_scalar(0.3)?.square()?.sum_all()
}

/// Second order through every op: Hessian-vector products by
/// reverse-over-reverse and forward-over-reverse against central finite
/// differences of the (first-order tested) gradient.
#[test]
fn hessian_vector_products_through_every_op() {
    let mut rng = Lcg::new(40);
    for (name, op, args) in op_table(&mut rng) {
        if name == "stop_gradient" {
            // Its derivative is zero by definition at every order, which
            // finite differences of the gradient cannot see.
            continue;
        }
        let s = scalar_of(op);
        let diff: Vec<bool> = args.iter().map(|a| a.dtype() == DType::F64).collect();
        let dirs: Vec<Tensor> = args
            .iter()
            .zip(&diff)
            .map(|(a, &d)| {
                if !d {
                    a.zeros_like()
                } else if name == "cast" {
                    // Multiples of 1/4: x ± h d stays exact in f32.
                    let r = v(&rng.normal(a.shape()))
                        .iter()
                        .map(|x| (x * 4.0).round() / 4.0)
                        .collect();
                    t(r, a.shape())
                } else {
                    rng.normal(a.shape())
                }
            })
            .collect();
        let g = grad(s);
        // FD of the gradient along dirs (cast goes through f32: exact with a dyadic step).
        let h = if name == "cast" { 1.0 / 1024.0 } else { 1e-5 };
        // Through cast the cotangents themselves pass through f32.
        let tol = if name == "cast" { 1e-4 } else { 1e-6 };
        let shifted = |sign: f64| -> Vec<Tensor> {
            args.iter()
                .zip(&dirs)
                .zip(&diff)
                .map(|((a, d), &df)| {
                    if !df {
                        return a.clone();
                    }
                    t(
                        v(a).iter()
                            .zip(v(d))
                            .map(|(x, d)| x + sign * h * d)
                            .collect(),
                        a.shape(),
                    )
                })
                .collect()
        };
        let gp = g(&shifted(1.0)).unwrap();
        let gm = g(&shifted(-1.0)).unwrap();
        let fd: Vec<f64> = gp
            .iter()
            .zip(&gm)
            .zip(&diff)
            .filter(|(_, &d)| d)
            .flat_map(|((p, m), _)| {
                v(p).into_iter()
                    .zip(v(m))
                    .map(|(p, m)| (p - m) / (2.0 * h))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Reverse over reverse: grad of <grad s, dirs>.
        let d2 = dirs.clone();
        let dfl = diff.clone();
        let hvp = grad(move |a: &[Tensor]| {
            let gs = grad(s)(a)?;
            let mut acc = Tensor::scalar(0.0);
            for ((gi, di), &d) in gs.iter().zip(&d2).zip(&dfl) {
                if d {
                    acc = acc.add(&gi.mul(di)?.sum_all()?)?;
                }
            }
            Ok(acc)
        })(&args)
        .unwrap_or_else(|e| panic!("{name}: grad of grad failed: {e}"));
        let got: Vec<f64> = hvp
            .iter()
            .zip(&diff)
            .filter(|(_, &d)| d)
            .flat_map(|(g, _)| v(g))
            .collect();
        assert_rel(&format!("{name}: grad(grad) HVP vs FD"), &got, &fd, tol);
        // Forward over reverse: jvp of grad.
        let (_, tg) = jvp(grad(s), &args, &dirs)
            .unwrap_or_else(|e| panic!("{name}: jvp of grad failed: {e}"));
        let got: Vec<f64> = tg
            .iter()
            .zip(&diff)
            .filter(|(_, &d)| d)
            .flat_map(|(g, _)| v(g))
            .collect();
        assert_rel(&format!("{name}: jvp(grad) HVP vs FD"), &got, &fd, tol);
        // Reverse over forward: grad of the directional derivative.
        let d3 = dirs.clone();
        let rof = grad(move |a: &[Tensor]| {
            let (_, t) = jvp(move |b: &[Tensor]| Ok(vec![s(b)?]), a, &d3)?;
            Ok(t[0].clone())
        })(&args)
        .unwrap_or_else(|e| panic!("{name}: grad of jvp failed: {e}"));
        let got: Vec<f64> = rof
            .iter()
            .zip(&diff)
            .filter(|(_, &d)| d)
            .flat_map(|(g, _)| v(g))
            .collect();
        assert_rel(&format!("{name}: grad(jvp) HVP vs FD"), &got, &fd, tol);
    }
}

/// vmap(grad), vmap(vmap) and jit(vmap) through every op, against loops.
#[test]
fn nested_vmap_and_vmap_of_grad_through_every_op() {
    let mut rng = Lcg::new(41);
    for (name, op, args) in op_table(&mut rng) {
        let n = 3;
        // Map the first argument over a new axis 0; others unmapped.
        let mut bargs = args.clone();
        let mut sh = args[0].shape().to_vec();
        sh.insert(0, n);
        bargs[0] = if name == "log"
            || name == "sqrt"
            || name == "reciprocal"
            || name == "rdiv_scalar"
            || name == "pow_scalar"
            || name == "pow"
        {
            rng.positive(&sh)
        } else {
            rng.away_from_zero(&sh)
        };
        let mut axes = vec![None; args.len()];
        axes[0] = Some(0);
        let s = scalar_of(op);
        check_vmap(&format!("{name}: vmap(grad)"), &grad(s), &bargs, &axes);
        let f = move |a: &[Tensor]| Ok(vec![op(a)?]);
        check_vmap(&format!("{name}: jit(f)"), &jit(f), &bargs, &axes);
        // jit(vmap(f)) against the loop, and jvp/vjp of vmap(f) against FD.
        check_vmap(&format!("{name}: jit(vmap(f)) vs loop"), &f, &bargs, &axes);
        let jv = jit(vmap(f, axes.clone()));
        let plain = vmap(f, axes.clone())(&bargs).unwrap();
        let jitted = jv(&bargs).unwrap();
        assert_allclose(
            &format!("{name}: jit(vmap)"),
            &v(&jitted[0]),
            &v(&plain[0]),
            1e-15,
            0.0,
        );
        // (stop_gradient: FD sees through it; cast: f32 rounding of random
        // data defeats FD; both are checked by hand in core_ops.)
        if name != "stop_gradient" && name != "cast" {
            check_grads(
                &format!("{name}: vmap(f)"),
                &vmap(f, axes.clone()),
                &bargs,
                &mut rng,
            );
        }
        // vmap of vmap: the outer maps axis 0, the inner maps the new
        // leading axis of every example of the first argument.
        let mut sh2 = sh.clone();
        sh2.insert(0, 2);
        let mut b2 = bargs.clone();
        b2[0] = t(
            v(&rng.normal(&sh2)).iter().map(|x| x.abs() + 0.5).collect(),
            &sh2,
        );
        let inner_axes = axes.clone();
        let vv = move |a: &[Tensor]| vmap(f, inner_axes.clone())(a);
        check_vmap(&format!("{name}: vmap(vmap)"), &vv, &b2, &axes);
        // And a non-zero axis for the outer map.
        let mut b3 = b2.clone();
        b3[0] = t(
            v(&rng.normal(&sh2)).iter().map(|x| x.abs() + 0.5).collect(),
            &sh2,
        );
        let mut axes1 = axes.clone();
        axes1[0] = Some(1);
        let inner_axes = axes.clone();
        let vv = move |a: &[Tensor]| vmap(f, inner_axes.clone())(a);
        let mut sh3 = sh.clone();
        sh3.insert(1, 2);
        b3[0] = t(
            v(&rng.normal(&sh3)).iter().map(|x| x.abs() + 0.5).collect(),
            &sh3,
        );
        check_vmap(&format!("{name}: vmap(vmap) axis 1"), &vv, &b3, &axes1);
    }
}

#[test]
fn vmap_over_an_empty_axis() {
    let x = Tensor::zeros(&[0, 3], DType::F64);
    let idx = Tensor::zeros(&[0, 2], DType::I64);
    let y = vmap(
        |a: &[Tensor]| Ok(vec![a[0].take(&a[1], 0)?]),
        vec![Some(0), Some(0)],
    )(&[x.clone(), idx])
    .unwrap();
    assert_eq!(y[0].shape(), &[0, 2]);
    let y = vmap(
        |a: &[Tensor]| Ok(vec![a[0].exp()?.sum_all()?]),
        vec![Some(0)],
    )(std::slice::from_ref(&x))
    .unwrap();
    assert_eq!(y[0].shape(), &[0]);
    let y = vmap(grad(|a: &[Tensor]| a[0].exp()?.sum_all()), vec![Some(1)])(&[Tensor::zeros(
        &[3, 0],
        DType::F64,
    )])
    .unwrap();
    assert_eq!(y[0].shape(), &[0, 3]);
}

#[test]
fn three_levels_of_capture_and_grad_of_jit_of_grad() {
    // d/dx sum_i jvp_z[sin(z x y_i)](z0 = 0.5, dz = 1) = d/dx sum_i x y_i cos(0.5 x y_i)
    let x = t(vec![0.3, -0.7], &[2]);
    let ys = t(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let ys2 = ys.clone();
    let g = grad(move |a: &[Tensor]| {
        let xc = a[0].clone();
        let r = vmap(
            move |b: &[Tensor]| {
                let (xc2, yb) = (xc.clone(), b[0].clone());
                let (_, tt) = jvp(
                    move |c: &[Tensor]| Ok(vec![c[0].mul(&xc2)?.mul(&yb)?.sin()?]),
                    &[Tensor::full(&[2], 0.5, DType::F64)],
                    &[Tensor::ones(&[2], DType::F64)],
                )?;
                Ok(tt)
            },
            vec![Some(0)],
        )(std::slice::from_ref(&ys2))?;
        r[0].sum_all()
    })(std::slice::from_ref(&x))
    .unwrap();
    let (xv, yv) = (v(&x), v(&ys));
    let want: Vec<f64> = (0..2)
        .map(|j| {
            (0..3)
                .map(|i| {
                    let (x, y) = (xv[j], yv[i * 2 + j]);
                    y * (0.5 * x * y).cos() - 0.5 * x * y * y * (0.5 * x * y).sin()
                })
                .sum()
        })
        .collect();
    assert_allclose(
        "grad(vmap(jvp)) with captures",
        &v(&g[0]),
        &want,
        1e-13,
        1e-15,
    );
    // grad of a jitted gradient: d/dx sum(cos x) = -sin x.
    let h = grad(|a: &[Tensor]| {
        jit(grad(|b: &[Tensor]| b[0].sin()?.sum_all()))(a)?
            .remove(0)
            .sum_all()
    })(std::slice::from_ref(&x))
    .unwrap();
    let want: Vec<f64> = xv.iter().map(|x| -x.sin()).collect();
    assert_allclose("grad(jit(grad))", &v(&h[0]), &want, 1e-14, 1e-15);
}
