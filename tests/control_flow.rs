//! Control flow in the core IR (`cond` / `switch`, `scan`, `while_loop`):
//! each checked against the same computation written with an explicit Rust
//! loop or branch, derivatives against central finite differences (f64),
//! `vmap` against a loop over the batch, `jit` against eager evaluation,
//! and nesting (bad input: `control_flow_errors.rs`).

use braintrace::prelude::*;
use braintrace::transform::control::Branch;
use braintrace::transform::{cond, scan, switch, while_loop};

fn data(shape: &[usize], seed: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as f64 + 1.0) * 0.731 + seed).sin() * 0.8)
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (x, y) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!(
            (p - q).abs() <= tol * (1.0 + q.abs()),
            "{what}: element {i}: {p} vs {q}"
        );
    }
}

fn boolean(b: bool) -> Tensor {
    Tensor::scalar(if b { 1.0 } else { 0.0 })
        .cast(DType::Bool)
        .unwrap()
}

/// Central finite differences of a scalar function of `args`, per element.
fn fd_grad(f: &dyn Fn(&[Tensor]) -> f64, args: &[Tensor], h: f64) -> Vec<Tensor> {
    let mut out = Vec::new();
    for (k, a) in args.iter().enumerate() {
        let v = a.to_vec_f64().unwrap();
        let mut g = vec![0.0; v.len()];
        for i in 0..v.len() {
            let at = |d: f64| {
                let mut w = v.clone();
                w[i] += d;
                let mut xs = args.to_vec();
                xs[k] = Tensor::from_vec(w, a.shape()).unwrap();
                f(&xs)
            };
            g[i] = (at(h) - at(-h)) / (2.0 * h);
        }
        out.push(Tensor::from_vec(g, a.shape()).unwrap());
    }
    out
}

// ------------------------------------------------------------------ scan

/// An RNN over a sequence: `h = tanh(h W + x_t)`, `y_t = h²`.
fn rnn_scan(a: &[Tensor]) -> Result<(Tensor, Tensor)> {
    let (w, h0, xs) = (&a[0], &a[1], &a[2]);
    let (c, ys) = scan(
        |c: &[Tensor], x: &[Tensor]| {
            let h = c[0].matmul(w)?.add(&x[0])?.tanh()?;
            let y = h.square()?;
            Ok((vec![h], vec![y]))
        },
        std::slice::from_ref(h0),
        std::slice::from_ref(xs),
        None,
    )?;
    Ok((c[0].clone(), ys[0].clone()))
}

fn rnn_loop(a: &[Tensor]) -> Result<(Tensor, Tensor)> {
    let (w, xs) = (&a[0], &a[2]);
    let mut h = a[1].clone();
    let mut ys = Vec::new();
    for t in 0..xs.shape()[0] {
        h = h.matmul(w)?.add(&xs.index_axis0(t)?)?.tanh()?;
        ys.push(h.square()?);
    }
    Ok((h, stack(&ys, 0)?))
}

fn rnn_args() -> Vec<Tensor> {
    vec![data(&[3, 3], 0.1), data(&[3], 0.7), data(&[5, 3], 1.3)]
}

fn rnn_loss(f: fn(&[Tensor]) -> Result<(Tensor, Tensor)>) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |a: &[Tensor]| {
        let (h, ys) = f(a)?;
        h.sum_all()?.add(&ys.mul(&ys.sin()?)?.sum_all()?)
    }
}

#[test]
fn scan_matches_explicit_loop() {
    let a = rnn_args();
    let (h, ys) = rnn_scan(&a).unwrap();
    let (h2, ys2) = rnn_loop(&a).unwrap();
    close(&h, &h2, 1e-15, "final carry");
    close(&ys, &ys2, 1e-15, "ys");
    assert_eq!(ys.shape(), &[5, 3]);
}

#[test]
fn scan_is_one_equation_printed_with_its_body() {
    let g = make_graph(
        |a: &[Tensor]| {
            let (h, ys) = rnn_scan(a)?;
            Ok(vec![h, ys])
        },
        &avals(&rnn_args()),
    )
    .unwrap();
    assert_eq!(g.primitive_names(), vec!["scan"]);
    let text = g.to_string();
    assert!(
        text.contains("scan[length=5 reverse=false num_consts=1 num_carry=1 body={ lambda"),
        "{text}"
    );
    assert!(text.contains("tanh"), "{text}");
    let shapes = eval_shape(
        |a: &[Tensor]| {
            let (h, ys) = rnn_scan(a)?;
            Ok(vec![h, ys])
        },
        &avals(&rnn_args()),
    )
    .unwrap();
    assert_eq!(shapes[0].shape(), &[3]);
    assert_eq!(shapes[1].shape(), &[5, 3]);
}

#[test]
fn scan_grad_matches_finite_differences() {
    let a = rnn_args();
    let g = grad(rnn_loss(rnn_scan))(&a).unwrap();
    let loss = rnn_loss(rnn_loop);
    let fd = fd_grad(&|x: &[Tensor]| loss(x).unwrap().item().unwrap(), &a, 1e-6);
    for (k, (g, f)) in g.iter().zip(&fd).enumerate() {
        close(g, f, 1e-7, &format!("grad {k}"));
    }
    // and exactly the gradient of the unrolled loop
    let gl = grad(rnn_loss(rnn_loop))(&a).unwrap();
    for (k, (g, f)) in g.iter().zip(&gl).enumerate() {
        close(g, f, 1e-12, &format!("grad {k} vs loop"));
    }
}

#[test]
fn scan_jvp_matches_explicit_loop() {
    let a = rnn_args();
    let t = vec![data(&[3, 3], 2.0), data(&[3], 2.5), data(&[5, 3], 3.0)];
    let f = |x: &[Tensor]| {
        let (h, ys) = rnn_scan(x)?;
        Ok(vec![h, ys])
    };
    let fl = |x: &[Tensor]| {
        let (h, ys) = rnn_loop(x)?;
        Ok(vec![h, ys])
    };
    let (o, to) = jvp(f, &a, &t).unwrap();
    let (o2, to2) = jvp(fl, &a, &t).unwrap();
    for k in 0..2 {
        close(&o[k], &o2[k], 1e-14, "primal");
        close(&to[k], &to2[k], 1e-12, "tangent");
    }
}

#[test]
fn scan_vmap_matches_a_loop_over_the_batch() {
    let a = rnn_args();
    let b = 4;
    let h0s = data(&[b, 3], 0.3);
    let xss = data(&[b, 5, 3], 0.9);
    let f = |x: &[Tensor]| {
        let (h, ys) = rnn_scan(x)?;
        Ok(vec![h, ys])
    };
    let v =
        vmap(f, vec![None, Some(0), Some(0)])(&[a[0].clone(), h0s.clone(), xss.clone()]).unwrap();
    assert_eq!(v[1].shape(), &[b, 5, 3]);
    for i in 0..b {
        let (h, ys) = rnn_loop(&[
            a[0].clone(),
            h0s.index_axis0(i).unwrap(),
            xss.index_axis0(i).unwrap(),
        ])
        .unwrap();
        close(&v[0].index_axis0(i).unwrap(), &h, 1e-14, "vmap carry");
        close(&v[1].index_axis0(i).unwrap(), &ys, 1e-14, "vmap ys");
    }
    // only the initial carry batched: the xs stay shared
    let v = vmap(f, vec![None, Some(0), None])(&[a[0].clone(), h0s.clone(), a[2].clone()]).unwrap();
    for i in 0..b {
        let (h, _) = rnn_loop(&[a[0].clone(), h0s.index_axis0(i).unwrap(), a[2].clone()]).unwrap();
        close(
            &v[0].index_axis0(i).unwrap(),
            &h,
            1e-14,
            "vmap carry (h0 only)",
        );
    }
    // only the weight batched: the carry becomes batched through the body
    let ws = data(&[b, 3, 3], 0.4);
    let v = vmap(f, vec![Some(0), None, None])(&[ws.clone(), a[1].clone(), a[2].clone()]).unwrap();
    for i in 0..b {
        let (h, ys) = rnn_loop(&[ws.index_axis0(i).unwrap(), a[1].clone(), a[2].clone()]).unwrap();
        close(
            &v[0].index_axis0(i).unwrap(),
            &h,
            1e-14,
            "vmap carry (w only)",
        );
        close(
            &v[1].index_axis0(i).unwrap(),
            &ys,
            1e-14,
            "vmap ys (w only)",
        );
    }
}

#[test]
fn scan_grad_under_vmap_and_jit() {
    let a = rnn_args();
    let b = 3;
    let xss = data(&[b, 5, 3], 0.2);
    let g = grad(rnn_loss(rnn_scan));
    let per = vmap(|x: &[Tensor]| g(x), vec![None, None, Some(0)])(&[
        a[0].clone(),
        a[1].clone(),
        xss.clone(),
    ])
    .unwrap();
    let gl = grad(rnn_loss(rnn_loop));
    for i in 0..b {
        let want = gl(&[a[0].clone(), a[1].clone(), xss.index_axis0(i).unwrap()]).unwrap();
        close(
            &per[0].index_axis0(i).unwrap(),
            &want[0],
            1e-12,
            "vmap(grad) dW",
        );
        close(
            &per[2].index_axis0(i).unwrap(),
            &want[2],
            1e-12,
            "vmap(grad) dxs",
        );
    }
    let j = jit(move |x: &[Tensor]| g(x));
    let got = j(&a).unwrap();
    let want = gl(&a).unwrap();
    for k in 0..3 {
        close(&got[k], &want[k], 1e-12, "jit(grad)");
    }
}

#[test]
fn scan_jit_matches_eager() {
    let a = rnn_args();
    let j = jit(|x: &[Tensor]| {
        let (h, ys) = rnn_scan(x)?;
        Ok(vec![h, ys])
    });
    let got = j(&a).unwrap();
    let got2 = j(&a).unwrap();
    let (h, ys) = rnn_loop(&a).unwrap();
    close(&got[0], &h, 1e-15, "jit carry");
    close(&got[1], &ys, 1e-15, "jit ys");
    close(&got2[1], &ys, 1e-15, "jit ys (second call)");
}

#[test]
fn scan_without_xs_and_with_an_integer_carry() {
    // x ← x·0.9 + 1, four times, counting the iterations in an i64 carry
    let (c, ys) = scan(
        |c: &[Tensor], _x: &[Tensor]| {
            let x = c[0].mul_scalar(0.9)?.add_scalar(1.0)?;
            let n = c[1].cast(DType::F64)?.add_scalar(1.0)?.cast(DType::I64)?;
            Ok((vec![x.clone(), n], vec![x]))
        },
        &[Tensor::scalar(2.0), Tensor::scalar_of(0.0, DType::I64)],
        &[],
        Some(4),
    )
    .unwrap();
    let mut x = 2.0;
    let mut want = Vec::new();
    for _ in 0..4 {
        x = x * 0.9 + 1.0;
        want.push(x);
    }
    assert!((c[0].item().unwrap() - x).abs() < 1e-15);
    assert_eq!(c[1].item().unwrap(), 4.0);
    close(&ys[0], &Tensor::from_vec(want, &[4]).unwrap(), 1e-15, "ys");
    // d(final)/d(x0) = 0.9⁴, through the integer carry too
    let g = grad(|a: &[Tensor]| {
        let (c, _) = scan(
            |c: &[Tensor], _x: &[Tensor]| {
                let x = c[0].mul_scalar(0.9)?.add_scalar(1.0)?;
                let n = c[1].cast(DType::F64)?.add_scalar(1.0)?.cast(DType::I64)?;
                Ok((vec![x, n], vec![]))
            },
            &[a[0].clone(), Tensor::scalar_of(0.0, DType::I64)],
            &[],
            Some(4),
        )?;
        Ok(c[0].clone())
    })(&[Tensor::scalar(2.0)])
    .unwrap();
    assert!((g[0].item().unwrap() - 0.9f64.powi(4)).abs() < 1e-15);
}

#[test]
fn scan_of_length_zero_returns_init_and_empty_ys() {
    let xs = Tensor::zeros(&[0, 2], DType::F64);
    let (c, ys) = scan(
        |c: &[Tensor], x: &[Tensor]| Ok((vec![c[0].add(&x[0])?], vec![x[0].clone()])),
        &[data(&[2], 0.0)],
        &[xs],
        None,
    )
    .unwrap();
    close(&c[0], &data(&[2], 0.0), 0.0, "carry");
    assert_eq!(ys[0].shape(), &[0, 2]);
}

// ------------------------------------------------------------------ cond

fn branchy(p: bool) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |a: &[Tensor]| {
        let (x, w) = (&a[0], &a[1]);
        let y = cond(
            &boolean(p),
            |b: &[Tensor]| Ok(vec![b[0].mul(w)?.sin()?]),
            |b: &[Tensor]| Ok(vec![b[0].exp()?.mul_scalar(0.5)?]),
            std::slice::from_ref(x),
        )?;
        y[0].square()?.sum_all()
    }
}

fn branchy_explicit(p: bool) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |a: &[Tensor]| {
        let (x, w) = (&a[0], &a[1]);
        let y = if p {
            x.mul(w)?.sin()?
        } else {
            x.exp()?.mul_scalar(0.5)?
        };
        y.square()?.sum_all()
    }
}

#[test]
fn cond_matches_an_explicit_branch_and_its_gradient() {
    let a = vec![data(&[4], 0.2), data(&[4], 0.8)];
    for p in [true, false] {
        let v = branchy(p)(&a).unwrap();
        let w = branchy_explicit(p)(&a).unwrap();
        close(&v, &w, 1e-15, "value");
        let g = grad(branchy(p))(&a).unwrap();
        let f = branchy_explicit(p);
        let fd = fd_grad(&|x: &[Tensor]| f(x).unwrap().item().unwrap(), &a, 1e-6);
        for k in 0..2 {
            close(&g[k], &fd[k], 1e-7, &format!("grad {k} (pred {p})"));
        }
        let j = jit(move |x: &[Tensor]| Ok(vec![branchy(p)(x)?]));
        close(&j(&a).unwrap()[0], &w, 1e-15, "jit");
    }
}

#[test]
fn cond_on_a_traced_predicate_is_one_equation() {
    let f = |a: &[Tensor]| {
        let p = a[0].sum_all()?.gt(&Tensor::scalar(0.0))?;
        cond(
            &p,
            |b: &[Tensor]| Ok(vec![b[0].mul_scalar(2.0)?]),
            |b: &[Tensor]| Ok(vec![b[0].mul_scalar(-3.0)?]),
            &a[..1],
        )
    };
    let g = make_graph(f, &[Aval::new(&[3], DType::F64)]).unwrap();
    assert!(g.primitive_names().contains(&"cond".to_string()));
    assert!(g.to_string().contains("branch1={ lambda"), "{g}");
    let x = data(&[3], 0.1); // sum > 0
    let neg = x.neg().unwrap();
    close(
        &f(std::slice::from_ref(&x)).unwrap()[0],
        &x.mul_scalar(2.0).unwrap(),
        0.0,
        "true",
    );
    close(
        &f(std::slice::from_ref(&neg)).unwrap()[0],
        &neg.mul_scalar(-3.0).unwrap(),
        0.0,
        "false",
    );
    let j = jit(f);
    close(
        &j(std::slice::from_ref(&neg)).unwrap()[0],
        &neg.mul_scalar(-3.0).unwrap(),
        0.0,
        "jit false",
    );
    close(
        &j(std::slice::from_ref(&x)).unwrap()[0],
        &x.mul_scalar(2.0).unwrap(),
        0.0,
        "jit true",
    );
}

#[test]
fn cond_vmap_with_a_batched_and_a_shared_predicate() {
    let b = 5;
    let xs = data(&[b, 3], 0.4);
    let f = |a: &[Tensor]| {
        let p = a[0].sum_all()?.gt(&Tensor::scalar(0.0))?;
        cond(
            &p,
            |c: &[Tensor]| Ok(vec![c[0].tanh()?, c[1].mul(&c[0])?]),
            |c: &[Tensor]| Ok(vec![c[0].mul_scalar(-1.5)?, c[1].clone()]),
            &[a[0].clone(), a[1].clone()],
        )
    };
    let w = data(&[3], 1.1);
    let v = vmap(f, vec![Some(0), None])(&[xs.clone(), w.clone()]).unwrap();
    let mut mixed = (false, false);
    for i in 0..b {
        let x = xs.index_axis0(i).unwrap();
        let want = f(&[x.clone(), w.clone()]).unwrap();
        if x.sum_all().unwrap().item().unwrap() > 0.0 {
            mixed.0 = true;
        } else {
            mixed.1 = true;
        }
        close(&v[0].index_axis0(i).unwrap(), &want[0], 1e-15, "vmap out 0");
        close(&v[1].index_axis0(i).unwrap(), &want[1], 1e-15, "vmap out 1");
    }
    assert!(mixed.0 && mixed.1, "the data should take both branches");
    // the predicate shared by the batch: a cond of vmapped branches
    let g = |a: &[Tensor]| {
        let p = a[1].sum_all()?.gt(&Tensor::scalar(0.0))?;
        cond(
            &p,
            |c: &[Tensor]| Ok(vec![c[0].tanh()?]),
            |c: &[Tensor]| Ok(vec![c[0].mul_scalar(-1.5)?]),
            &a[..1],
        )
    };
    let v = vmap(g, vec![Some(0), None])(&[xs.clone(), w.clone()]).unwrap();
    let graph = make_graph(
        |a: &[Tensor]| vmap(g, vec![Some(0), None])(a),
        &avals(&[xs.clone(), w.clone()]),
    )
    .unwrap();
    assert!(
        graph.primitive_names().contains(&"cond".to_string()),
        "{graph}"
    );
    for i in 0..b {
        let want = g(&[xs.index_axis0(i).unwrap(), w.clone()]).unwrap();
        close(
            &v[0].index_axis0(i).unwrap(),
            &want[0],
            1e-15,
            "shared predicate",
        );
    }
}

#[test]
fn switch_selects_by_index_clamped_and_under_vmap() {
    let branches: [Branch<'_>; 3] = [
        &|a: &[Tensor]| Ok(vec![a[0].add_scalar(10.0)?]),
        &|a: &[Tensor]| Ok(vec![a[0].mul_scalar(3.0)?]),
        &|a: &[Tensor]| Ok(vec![a[0].neg()?]),
    ];
    let x = data(&[2], 0.3);
    for (i, want) in [(-1i64, 0usize), (0, 0), (1, 1), (2, 2), (7, 2)] {
        let idx = Tensor::scalar_of(i as f64, DType::I64);
        let got = switch(&idx, &branches, std::slice::from_ref(&x)).unwrap();
        let expect = branches[want](std::slice::from_ref(&x)).unwrap();
        close(&got[0], &expect[0], 0.0, &format!("index {i}"));
    }
    let idx = Tensor::from_vec_typed(vec![2i64, 0, 1, 5], &[4]).unwrap();
    let xs = data(&[4, 2], 0.6);
    let v = vmap(
        |a: &[Tensor]| switch(&a[0], &branches, &a[1..]),
        vec![Some(0), Some(0)],
    )(&[idx, xs.clone()])
    .unwrap();
    for (i, k) in [2usize, 0, 1, 2].into_iter().enumerate() {
        let want = branches[k](&[xs.index_axis0(i).unwrap()]).unwrap();
        close(&v[0].index_axis0(i).unwrap(), &want[0], 0.0, "vmap switch");
    }
}

// ------------------------------------------------------------------ while

fn halve_until_small(a: &[Tensor]) -> Result<Vec<Tensor>> {
    // x ← x·k + sin x, until |x| sums below 1 (a data-dependent count)
    let k = a[1].clone();
    while_loop(
        |c: &[Tensor]| c[0].abs()?.sum_all()?.gt(&Tensor::scalar(1.0)),
        move |c: &[Tensor]| Ok(vec![c[0].mul(&k)?.add(&c[0].sin()?.mul_scalar(0.1)?)?]),
        &a[..1],
    )
}

fn halve_until_small_loop(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut x = a[0].clone();
    while x.abs()?.sum_all()?.item()? > 1.0 {
        x = x.mul(&a[1])?.add(&x.sin()?.mul_scalar(0.1)?)?;
    }
    Ok(vec![x])
}

#[test]
fn while_matches_an_explicit_loop_eagerly_and_jitted() {
    let a = vec![
        data(&[3], 0.5).mul_scalar(4.0).unwrap(),
        Tensor::scalar(0.5),
    ];
    let want = halve_until_small_loop(&a).unwrap();
    close(&halve_until_small(&a).unwrap()[0], &want[0], 1e-15, "eager");
    let j = jit(halve_until_small);
    close(&j(&a).unwrap()[0], &want[0], 1e-15, "jit");
    let g = make_graph(halve_until_small, &avals(&a)).unwrap();
    assert_eq!(g.primitive_names(), vec!["while"]);
    assert!(g.to_string().contains("cond={ lambda"), "{g}");
}

#[test]
fn while_jvp_matches_finite_differences_and_grad_is_refused() {
    let a = vec![
        data(&[3], 0.5).mul_scalar(4.0).unwrap(),
        Tensor::scalar(0.5),
    ];
    let t = vec![data(&[3], 1.9), Tensor::scalar(0.3)];
    let (_, to) = jvp(halve_until_small, &a, &t).unwrap();
    // the trip count is locally constant: finite differences of the loop
    let h = 1e-6;
    let shift = |s: f64| -> Vec<Tensor> {
        a.iter()
            .zip(&t)
            .map(|(x, d)| x.add(&d.mul_scalar(s).unwrap()).unwrap())
            .collect()
    };
    let up = halve_until_small_loop(&shift(h)).unwrap();
    let dn = halve_until_small_loop(&shift(-h)).unwrap();
    let fd = up[0]
        .sub(&dn[0])
        .unwrap()
        .mul_scalar(1.0 / (2.0 * h))
        .unwrap();
    close(&to[0], &fd, 1e-7, "jvp");
    let err = grad(|x: &[Tensor]| halve_until_small(x)?[0].sum_all())(&a).unwrap_err();
    match &err {
        Error::Invalid { op, reason } => {
            assert_eq!(op, "while");
            assert!(reason.contains("scan"), "{reason}");
        }
        e => panic!("expected Error::Invalid naming while, got {e:?}"),
    }
}

#[test]
fn while_vmap_with_per_example_trip_counts() {
    let b = 4;
    let xs = data(&[b, 3], 0.2).mul_scalar(5.0).unwrap();
    let ks = Tensor::from_vec(vec![0.5, 0.8, 0.3, 0.6], &[b]).unwrap();
    let v = vmap(halve_until_small, vec![Some(0), Some(0)])(&[xs.clone(), ks.clone()]).unwrap();
    let mut counts = Vec::new();
    for i in 0..b {
        let a = [xs.index_axis0(i).unwrap(), ks.index_axis0(i).unwrap()];
        let want = halve_until_small_loop(&a).unwrap();
        close(&v[0].index_axis0(i).unwrap(), &want[0], 1e-15, "vmap while");
        let mut x = a[0].clone();
        let mut n = 0;
        while x.abs().unwrap().sum_all().unwrap().item().unwrap() > 1.0 {
            x = x
                .mul(&a[1])
                .unwrap()
                .add(&x.sin().unwrap().mul_scalar(0.1).unwrap())
                .unwrap();
            n += 1;
        }
        counts.push(n);
    }
    counts.dedup();
    assert!(
        counts.len() > 1,
        "the examples should need different trip counts: {counts:?}"
    );
    // a shared trip count: only the constant batched
    let v = vmap(halve_until_small, vec![None, Some(0)])(&[xs.index_axis0(0).unwrap(), ks.clone()])
        .unwrap();
    for i in 0..b {
        let a = [xs.index_axis0(0).unwrap(), ks.index_axis0(i).unwrap()];
        close(
            &v[0].index_axis0(i).unwrap(),
            &halve_until_small_loop(&a).unwrap()[0],
            1e-15,
            "vmap k",
        );
    }
}

// ------------------------------------------------------------------ nesting

/// A cond choosing between a scan and a plain expression; a scan whose body
/// holds a cond on the carry.
fn nested(a: &[Tensor]) -> Result<Tensor> {
    let (w, xs) = (&a[0], &a[1]);
    let p = w.sum_all()?.gt(&Tensor::scalar(0.0))?;
    let y = cond(
        &p,
        |b: &[Tensor]| {
            let (c, _) = scan(
                |c: &[Tensor], x: &[Tensor]| {
                    Ok((vec![c[0].mul(&b[0])?.add(&x[0])?.tanh()?], vec![]))
                },
                &[Tensor::zeros(&[2], DType::F64)],
                &b[1..2],
                None,
            )?;
            Ok(vec![c[0].clone()])
        },
        |b: &[Tensor]| Ok(vec![b[1].sum(&[0])?]),
        &[w.clone(), xs.clone()],
    )?;
    let (c, ys) = scan(
        |c: &[Tensor], x: &[Tensor]| {
            let q = c[0].sum_all()?.gt(&Tensor::scalar(0.0))?;
            let n = cond(
                &q,
                |d: &[Tensor]| Ok(vec![d[0].mul(&d[1])?.sin()?]),
                |d: &[Tensor]| Ok(vec![d[0].add(&d[1])?.mul_scalar(0.5)?]),
                &[c[0].clone(), x[0].clone()],
            )?;
            Ok((n.clone(), n))
        },
        &[y[0].clone()],
        std::slice::from_ref(xs),
        None,
    )?;
    c[0].sum_all()?
        .add(&ys.last().unwrap().square()?.sum_all()?)
}

fn nested_explicit(a: &[Tensor]) -> Result<Tensor> {
    let (w, xs) = (&a[0], &a[1]);
    let t = xs.shape()[0];
    let mut y = if w.sum_all()?.item()? > 0.0 {
        let mut c = Tensor::zeros(&[2], DType::F64);
        for i in 0..t {
            c = c.mul(w)?.add(&xs.index_axis0(i)?)?.tanh()?;
        }
        c
    } else {
        xs.sum(&[0])?
    };
    let mut ys = Vec::new();
    for i in 0..t {
        let x = xs.index_axis0(i)?;
        y = if y.sum_all()?.item()? > 0.0 {
            y.mul(&x)?.sin()?
        } else {
            y.add(&x)?.mul_scalar(0.5)?
        };
        ys.push(y.clone());
    }
    y.sum_all()?.add(&stack(&ys, 0)?.square()?.sum_all()?)
}

#[test]
fn nested_scan_in_cond_and_cond_in_scan() {
    for (seed, sign) in [(0.3, 1.0), (0.3, -1.0), (1.7, 1.0)] {
        let a = vec![
            data(&[2], seed)
                .mul_scalar(sign)
                .unwrap()
                .add_scalar(0.2 * sign)
                .unwrap(),
            data(&[6, 2], seed + 1.0),
        ];
        let v = nested(&a).unwrap();
        close(&v, &nested_explicit(&a).unwrap(), 1e-14, "value");
        let g = grad(nested)(&a).unwrap();
        let fd = fd_grad(
            &|x: &[Tensor]| nested_explicit(x).unwrap().item().unwrap(),
            &a,
            1e-6,
        );
        for k in 0..2 {
            close(
                &g[k],
                &fd[k],
                1e-6,
                &format!("grad {k} (seed {seed}, sign {sign})"),
            );
        }
        let j = jit(|x: &[Tensor]| Ok(vec![nested(x)?]));
        close(&j(&a).unwrap()[0], &v, 1e-14, "jit");
    }
    // vmap over the weights: the outer predicate differs across the batch
    let ws = Tensor::from_vec(vec![0.4, 0.3, -0.5, -0.2, 0.9, -0.1], &[3, 2]).unwrap();
    let xs = data(&[6, 2], 2.0);
    let v =
        vmap(|a: &[Tensor]| Ok(vec![nested(a)?]), vec![Some(0), None])(&[ws.clone(), xs.clone()])
            .unwrap();
    for i in 0..3 {
        let want = nested_explicit(&[ws.index_axis0(i).unwrap(), xs.clone()]).unwrap();
        close(&v[0].index_axis0(i).unwrap(), &want, 1e-14, "vmap nested");
    }
}

// ------------------------------------------------------------------ more

#[test]
fn scan_second_order_matches_finite_differences_of_the_gradient() {
    // jvp of grad: the JVP of the reverse scan that the transpose built
    let a = rnn_args();
    let v = vec![data(&[3, 3], 4.0), data(&[3], 4.5), data(&[5, 3], 5.0)];
    let g = grad(rnn_loss(rnn_scan));
    let (_, hv) = jvp(|x: &[Tensor]| g(x), &a, &v).unwrap();
    let gl = grad(rnn_loss(rnn_loop));
    let h = 1e-5;
    let shift = |s: f64| -> Vec<Tensor> {
        a.iter()
            .zip(&v)
            .map(|(x, d)| x.add(&d.mul_scalar(s).unwrap()).unwrap())
            .collect()
    };
    let (up, dn) = (gl(&shift(h)).unwrap(), gl(&shift(-h)).unwrap());
    for k in 0..3 {
        let fd = up[k]
            .sub(&dn[k])
            .unwrap()
            .mul_scalar(1.0 / (2.0 * h))
            .unwrap();
        close(&hv[k], &fd, 1e-6, &format!("Hv {k}"));
    }
}

#[test]
fn scan_over_an_etp_primitive_jits_and_differentiates() {
    use braintrace::prims::{matmul, Transforms};
    let f = |a: &[Tensor], etp: bool| -> Result<Tensor> {
        let (w, xs) = (&a[0], &a[1]);
        let (c, _) = scan(
            |c: &[Tensor], x: &[Tensor]| {
                let y = if etp {
                    matmul(&x[0], w, None, &Transforms::default())?
                } else {
                    x[0].matmul(w)?
                };
                Ok((vec![c[0].mul_scalar(0.7)?.add(&y.tanh()?)?], vec![]))
            },
            &[Tensor::zeros(&[2, 3], DType::F64)],
            std::slice::from_ref(xs),
            None,
        )?;
        c[0].square()?.sum_all()
    };
    let a = vec![data(&[4, 3], 0.1), data(&[5, 2, 4], 0.6)];
    let g = make_graph(|x: &[Tensor]| Ok(vec![f(x, true)?]), &avals(&a)).unwrap();
    assert!(g.to_string().contains("etp_mm"), "{g}");
    let j = jit(|x: &[Tensor]| {
        let gr = grad(|y: &[Tensor]| f(y, true))(x)?;
        Ok(vec![f(x, true)?, gr[0].clone()])
    });
    let got = j(&a).unwrap();
    let want = grad(|y: &[Tensor]| f(y, false))(&a).unwrap();
    close(&got[0], &f(&a, false).unwrap(), 1e-14, "value");
    close(&got[1], &want[0], 1e-12, "dW");
}
