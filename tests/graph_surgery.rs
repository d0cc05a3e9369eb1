//! Acceptance tests of graph analysis and surgery (producers, consumers,
//! reachability, slicing, insert-after, CSE, validation and the builder),
//! of VJPs staged as graphs (linearize, transpose, vjp_graph, cotangents at
//! intermediate variables) and of the closed-graph call. Expected values
//! come from finite differences in f64, explicit loops, hand-derived
//! structure, or the unstaged transforms (whose own tests check them
//! against finite differences).

mod common;

use braintrace::graph::{interpret, GraphBuilder};
use braintrace::ops::elementwise::{Binary, BinaryOp, Unary, UnaryOp};
use braintrace::prelude::*;
use braintrace::transform::{
    as_call, call, linearize, transpose, vjp_graph, vjp_graph_at, vjp_graph_of, Call,
};
use common::*;
use std::sync::Arc;

// ------------------------------------------------------------------ the GRU step (from tests/models.rs)

fn gru_loss(a: &[Tensor]) -> Result<Tensor> {
    let w = Tensor::from_vec(vec![1.0, -2.0, 0.5, 3.0], &[GRU_HID])?;
    let h = gru_step(a)?.remove(0);
    h.mul(&w)?.add(&h.square()?)?.sum_all()
}

fn avals_of(xs: &[Tensor]) -> Vec<Aval> {
    xs.iter().map(Tensor::aval).collect()
}

fn f64_aval(shape: &[usize]) -> Aval {
    Aval::new(shape, DType::F64)
}

// ------------------------------------------------------------------ acceptance: VJP graph of the GRU step

#[test]
fn gru_vjp_graph_prints_jits_and_matches_grad() {
    let args = gru_args(11);
    let loss = |a: &[Tensor]| Ok(vec![gru_loss(a)?]);
    let g = vjp_graph(loss, &avals_of(&args)).unwrap();
    let printed = g.to_string();
    println!("{printed}");
    assert_eq!(printed.lines().count(), g.eqns().len() + 2);
    // primals ++ one cotangent -> loss ++ one gradient per argument
    assert_eq!(g.invars().len(), args.len() + 1);
    assert_eq!(g.outvars().len(), 1 + args.len());

    let staged = Arc::new(g);
    let s2 = staged.clone();
    let run = jit(move |a: &[Tensor]| s2.eval(a));
    let want_grad = grad(gru_loss);
    for seed in [11u64, 23, 37] {
        // New inputs, same avals: no re-trace of the loss.
        let args = gru_args(seed);
        let mut inputs = args.clone();
        inputs.push(Tensor::scalar(1.0));
        let got = run(&inputs).unwrap();
        let want = want_grad(&args).unwrap();
        assert_allclose(
            "loss",
            &v(&got[0]),
            &v(&gru_loss(&args).unwrap()),
            1e-12,
            1e-12,
        );
        for (i, (a, b)) in got[1..].iter().zip(&want).enumerate() {
            assert_allclose(
                &format!("grad {i} (seed {seed})"),
                &v(a),
                &v(b),
                1e-10,
                1e-12,
            );
        }
    }
    // The staged graph runs eagerly too, and a scaled cotangent scales the gradient.
    let mut inputs = gru_args(5);
    inputs.push(Tensor::scalar(-2.0));
    let got = staged.eval(&inputs).unwrap();
    let want = want_grad(&gru_args(5)).unwrap();
    assert_allclose(
        "scaled",
        &v(&got[2]),
        &v(&want[1].mul_scalar(-2.0).unwrap()),
        1e-10,
        1e-12,
    );
}

#[test]
fn gru_vjp_graph_gradients_match_finite_differences() {
    let args = gru_args(3);
    let g = vjp_graph_of(&make_graph(gru_step, &avals_of(&args)).unwrap()).unwrap();
    let ct = det(&[GRU_HID], 99, 1.0);
    let mut inputs = args.clone();
    inputs.push(ct.clone());
    let out = g.eval(&inputs).unwrap();
    let f = |a: &[Tensor]| gru_step(a);
    let cols = fd_jacobian(&f, &args, 1e-6);
    // cols are ordered by argument then element: column k of the Jacobian.
    let got: Vec<f64> = out[1..].iter().flat_map(v).collect();
    let want: Vec<f64> = cols.iter().map(|c| dot(c, &v(&ct))).collect();
    assert_rel("vjp graph vs FD", &got, &want, 1e-7);
}

// ------------------------------------------------------------------ acceptance: slice h -> h'

#[test]
fn gru_slice_between_h_next_and_h_has_the_fd_jacobian() {
    let args = gru_args(7);
    let g = make_graph(gru_step, &avals_of(&args)).unwrap();
    let h = g.invars()[1];
    let h_next = g.outvars()[0];
    let mut cut = vec![g.invars()[0]];
    cut.extend_from_slice(&g.invars()[2..]);
    cut.push(h);
    let s = g.slice(&[h_next], &cut).unwrap();
    assert_eq!(s.inputs, cut, "every cut var is needed, in cut order");
    s.graph.validate().unwrap();

    // Arguments of the slice in boundary order: x, weights..., h.
    let mut sargs = vec![args[0].clone()];
    sargs.extend_from_slice(&args[2..]);
    sargs.push(args[1].clone());
    let hpos = sargs.len() - 1;

    // JVP of the slice along each basis direction of h = one Jacobian column.
    let mut jac = vec![vec![0.0; GRU_HID]; GRU_HID];
    for (k, col) in jac.iter_mut().enumerate() {
        let mut tans: Vec<Option<Tensor>> = vec![None; sargs.len()];
        let mut e = vec![0.0; GRU_HID];
        e[k] = 1.0;
        tans[hpos] = Some(t(e, &[GRU_HID]));
        let (_, touts) = braintrace::transform::jvp_graph(&s.graph, &sargs, &tans).unwrap();
        *col = v(touts[0].as_ref().unwrap());
    }
    // Finite differences of the full step with respect to h only.
    let eps = 1e-6;
    for (k, col) in jac.iter().enumerate() {
        let shifted = |d: f64| {
            let mut a = args.clone();
            let mut hv = v(&a[1]);
            hv[k] += d;
            a[1] = t(hv, &[GRU_HID]);
            v(&gru_step(&a).unwrap()[0])
        };
        let (p, m) = (shifted(eps), shifted(-eps));
        let fd: Vec<f64> = p
            .iter()
            .zip(&m)
            .map(|(p, m)| (p - m) / (2.0 * eps))
            .collect();
        assert_rel(&format!("dh'/dh column {k}"), col, &fd, 1e-7);
    }
}

#[test]
fn slice_that_is_not_closed_is_an_error() {
    let args = gru_args(1);
    let g = make_graph(gru_step, &avals_of(&args)).unwrap();
    // Cut at h only: x and the weights are graph inputs outside the cut.
    let err = g.slice(g.outvars(), &[g.invars()[1]]).unwrap_err();
    assert!(err.to_string().contains("not closed"), "{err}");
}

#[test]
fn slice_keeps_only_the_needed_equations_and_constants() {
    let a = f64_aval(&[2]);
    let c = t(vec![10.0, 20.0], &[2]);
    let g = make_graph(
        |x: &[Tensor]| {
            let u = x[0].exp()?; // eqn 0
            let w = x[1].add(&c)?; // eqn 1 (reads the constant)
            let y = u.mul(&w)?; // eqn 2
            let z = x[1].tanh()?; // eqn 3, not needed for y
            Ok(vec![y, z])
        },
        &[a.clone(), a],
    )
    .unwrap();
    assert_eq!(g.primitive_names(), vec!["exp", "add", "mul", "tanh"]);
    let u = g.eqns()[0].outputs()[0];
    let y = g.outvars()[0];
    let s = g.slice(&[y], &[u, g.invars()[1], g.invars()[0]]).unwrap();
    // x0 is not reached (u is cut), so it is not a boundary input.
    assert_eq!(s.inputs, vec![u, g.invars()[1]]);
    assert_eq!(s.graph.primitive_names(), vec!["add", "mul"]);
    assert_eq!(s.graph.consts().len(), 1);
    let out = s
        .graph
        .eval(&[t(vec![2.0, 3.0], &[2]), t(vec![1.0, -1.0], &[2])])
        .unwrap();
    assert_tensor("slice value", &out[0], &[2], &[2.0 * 11.0, 3.0 * 19.0]);
}

// ------------------------------------------------------------------ producers, consumers, reachability

fn diamond() -> Graph {
    // y = tanh(exp(x) * x) ; z = exp(x) + w
    make_graph(
        |a: &[Tensor]| {
            let e = a[0].exp()?;
            let m = e.mul(&a[0])?;
            Ok(vec![m.tanh()?, e.add(&a[1])?])
        },
        &[f64_aval(&[3]), f64_aval(&[3])],
    )
    .unwrap()
}

#[test]
fn producers_and_consumers_of_a_diamond() {
    let g = diamond();
    assert_eq!(g.primitive_names(), vec!["exp", "mul", "tanh", "add"]);
    let (x, w) = (g.invars()[0], g.invars()[1]);
    let e = g.eqns()[0].outputs()[0];
    let m = g.eqns()[1].outputs()[0];
    let p = g.producers();
    assert_eq!(p[x], None);
    assert_eq!(p[e], Some(0));
    assert_eq!(p[m], Some(1));
    let c = g.consumers();
    assert_eq!(c[x], vec![0, 1]);
    assert_eq!(c[e], vec![1, 3]);
    assert_eq!(c[w], vec![3]);
    assert!(c[g.outvars()[0]].is_empty());
}

#[test]
fn reachability_stops_where_asked() {
    let g = diamond();
    let (x, w) = (g.invars()[0], g.invars()[1]);
    let all = g.reachable(&[x], |_, _| false).unwrap();
    assert_eq!(all.eqns, vec![0, 1, 2, 3]);
    assert!(all.vars.contains(&g.outvars()[0]) && all.vars.contains(&g.outvars()[1]));
    // Stop at exp: only mul (which reads x directly) goes on.
    let r = g.reachable(&[x], |_, e| e.prim().name() == "exp").unwrap();
    assert_eq!(r.eqns, vec![0, 1, 2]);
    assert!(!r.vars.contains(&g.eqns()[0].outputs()[0]));
    let r = g.reachable(&[w], |_, _| false).unwrap();
    assert_eq!(r.eqns, vec![3]);
    assert_eq!(r.vars, vec![w, g.outvars()[1]]);
    assert!(g.reachable(&[g.num_vars()], |_, _| false).is_err());
}

// ------------------------------------------------------------------ insert-after, perturbations

#[test]
fn insert_after_renames_every_later_use_including_outputs() {
    let mut g = diamond();
    let e = g.eqns()[0].outputs()[0];
    let p = g.add_input(f64_aval(&[3]));
    let e2 = g
        .insert_after(e, Arc::new(Binary(BinaryOp::Add)), &[p])
        .unwrap();
    g.validate().unwrap();
    assert_eq!(
        g.primitive_names(),
        vec!["exp", "add", "mul", "tanh", "add"]
    );
    assert_eq!(g.consumers()[e], vec![1]);
    assert_eq!(g.consumers()[e2], vec![2, 4]);
    let x = t(vec![0.1, -0.2, 0.3], &[3]);
    let w = t(vec![1.0, 2.0, 3.0], &[3]);
    let d = t(vec![0.5, 0.25, -1.0], &[3]);
    let got = g.eval(&[x.clone(), w.clone(), d.clone()]).unwrap();
    // Explicit: e' = exp(x) + d.
    let ev: Vec<f64> = v(&x).iter().zip(v(&d)).map(|(x, d)| x.exp() + d).collect();
    let y: Vec<f64> = ev.iter().zip(v(&x)).map(|(e, x)| (e * x).tanh()).collect();
    let z: Vec<f64> = ev.iter().zip(v(&w)).map(|(e, w)| e + w).collect();
    assert_allclose("y", &v(&got[0]), &y, 1e-14, 1e-14);
    assert_allclose("z", &v(&got[1]), &z, 1e-14, 1e-14);
}

#[test]
fn insert_after_an_output_variable_renames_the_output() {
    let mut g = make_graph(|a: &[Tensor]| Ok(vec![a[0].exp()?]), &[f64_aval(&[])]).unwrap();
    let y = g.outvars()[0];
    let y2 = g
        .insert_after(y, Arc::new(Unary(UnaryOp::Exp)), &[])
        .unwrap();
    assert_eq!(g.outvars(), &[y2]);
    let out = g.eval(&[Tensor::scalar(0.0)]).unwrap();
    assert!((out[0].item().unwrap() - 1f64.exp()).abs() < 1e-15);
}

#[test]
fn insert_after_refuses_a_shape_changing_equation() {
    let mut g = diamond();
    let e = g.eqns()[0].outputs()[0];
    let p = g.add_input(f64_aval(&[]));
    // add(e, scalar) broadcasts to e's shape: allowed.
    assert!(g
        .insert_after(e, Arc::new(Binary(BinaryOp::Add)), &[p])
        .is_ok());
    let mut g = diamond();
    let q = g.add_input(f64_aval(&[2, 3]));
    let err = g
        .insert_after(g.invars()[0], Arc::new(Binary(BinaryOp::Add)), &[q])
        .unwrap_err();
    assert!(err.to_string().contains("insert_after"), "{err}");
    g.validate().unwrap();
}

#[test]
fn cotangents_at_intermediate_vars_are_perturbation_gradients() {
    let args = gru_args(9);
    let g = make_graph(|a: &[Tensor]| Ok(vec![gru_loss(a)?]), &avals_of(&args)).unwrap();
    // The update gate z: the output of the first sigmoid.
    let zi = g
        .eqns()
        .iter()
        .position(|e| e.prim().name() == "logistic")
        .unwrap();
    let z = g.eqns()[zi].outputs()[0];
    let h = g.invars()[1];
    let sg = vjp_graph_at(&g, &[z, h]).unwrap();
    let mut inputs = args.clone();
    inputs.push(Tensor::scalar(1.0));
    let out = sg.eval(&inputs).unwrap();
    assert_eq!(out.len(), 1 + args.len() + 2);
    // At h (an input), the perturbation gradient is the input gradient.
    assert_allclose(
        "ct at h",
        &v(&out[1 + args.len() + 1]),
        &v(&out[2]),
        1e-12,
        1e-12,
    );
    // At z: finite differences of the loss with z replaced by z + d.
    let eps = 1e-6;
    let ct_z = v(&out[1 + args.len()]);
    for k in 0..GRU_HID {
        let shifted = |d: f64| {
            let mut pg = g.clone();
            let mut e = vec![0.0; GRU_HID];
            e[k] = d;
            let c = pg.add_const(t(e, &[GRU_HID]));
            pg.insert_after(z, Arc::new(Binary(BinaryOp::Add)), &[c])
                .unwrap();
            pg.eval(&args).unwrap()[0].item().unwrap()
        };
        let fd = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
        assert!(
            (ct_z[k] - fd).abs() < 1e-7 * fd.abs().max(1.0),
            "ct at z[{k}]: {} vs FD {fd}",
            ct_z[k]
        );
    }
}

// ------------------------------------------------------------------ CSE and DCE

#[test]
fn cse_merges_repeated_equations_and_keeps_values() {
    let g0 = make_graph(
        |a: &[Tensor]| {
            let p = a[0].exp()?.mul(&a[1])?;
            let q = a[0].exp()?.mul(&a[1])?; // the same two equations again
            let r = a[1].exp()?; // different operand: kept
            Ok(vec![p.add(&q)?, r])
        },
        &[f64_aval(&[2]), f64_aval(&[2])],
    )
    .unwrap();
    assert_eq!(g0.eqns().len(), 6);
    let mut g = g0.clone();
    assert_eq!(g.cse(), 2);
    g.dce();
    g.validate().unwrap();
    assert_eq!(g.primitive_names(), vec!["exp", "mul", "exp", "add"]);
    let args = [t(vec![0.3, -0.4], &[2]), t(vec![2.0, 5.0], &[2])];
    let (a, b) = (g.eval(&args).unwrap(), g0.eval(&args).unwrap());
    for (x, y) in a.iter().zip(&b) {
        assert_allclose("cse value", &v(x), &v(y), 0.0, 0.0);
    }
}

#[test]
fn cse_does_not_merge_different_params() {
    let mut g = make_graph(
        |a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?.add(&a[0].mul_scalar(3.0)?)?]),
        &[f64_aval(&[2])],
    )
    .unwrap();
    assert_eq!(g.cse(), 0);
    let out = g.eval(&[t(vec![1.0, 2.0], &[2])]).unwrap();
    assert_tensor("no merge", &out[0], &[2], &[5.0, 10.0]);
}

#[test]
fn identities_with_constant_zeros_and_ones_are_dropped_and_let_cse_merge() {
    // A forward value and its copy through a zero perturbation (as a VJP
    // with respect to a perturbation of the hidden state stages it).
    let g0 = make_graph(
        |a: &[Tensor]| {
            let zeros = Tensor::zeros(&[3], DType::F64);
            let ones = Tensor::from_vec(vec![1.0; 3], &[3])?;
            let y = a[0].tanh()?;
            let copy = a[0].add(&zeros)?.mul(&ones)?.tanh()?;
            let also = zeros.add(&a[0])?.sub(&zeros)?.div(&ones)?;
            let more = ones.mul(&a[0])?;
            // Not identities: another constant, and a broadcast (the result
            // has the constant's shape, not x's).
            let twos = Tensor::from_vec(vec![2.0; 3], &[3])?;
            let kept = a[0].mul(&twos)?;
            let wide = a[1].add(&Tensor::zeros(&[2, 3], DType::F64))?;
            Ok(vec![y.add(&copy)?, also, more, kept, wide])
        },
        &[f64_aval(&[3]), f64_aval(&[3])],
    )
    .unwrap();
    let mut g = g0.clone();
    assert_eq!(g.simplify_identities(), 6, "{g}");
    assert_eq!(g.cse(), 1, "the two tanh merge:\n{g}");
    g.dce();
    g.validate().unwrap();
    assert_eq!(
        g.primitive_names(),
        vec!["tanh", "mul", "add", "add"],
        "{g}"
    );
    let args = [t(vec![0.3, -0.0, 2.0], &[3]), t(vec![1.0, 2.0, 3.0], &[3])];
    let (a, b) = (g.eval(&args).unwrap(), g0.eval(&args).unwrap());
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.shape(), y.shape(), "output {k}");
        assert_allclose("identity value", &v(x), &v(y), 0.0, 0.0);
    }
    // `-0.0 + 0.0` was `+0.0`; without the equation it stays `-0.0`.
    assert!(v(&a[1])[1].is_sign_negative() && !v(&b[1])[1].is_sign_negative());
}

#[test]
fn equations_of_constants_alone_are_folded_into_constants() {
    let g0 = make_graph(
        |a: &[Tensor]| {
            let seed = Tensor::from_vec(vec![3.0], &[])?;
            // Constants alone: folded (a scalar, then broadcast to 6).
            let c = seed
                .div_scalar(8.0)?
                .broadcast_to(&[2, 3])?
                .mul_scalar(2.0)?;
            // A broadcast past FOLD_MAX_ELEMENTS from a scalar: kept.
            let big = seed.broadcast_to(&[100, 100])?;
            Ok(vec![a[0].mul(&c)?, big.sum_all()?])
        },
        &[f64_aval(&[2, 3])],
    )
    .unwrap();
    const { assert!(100 * 100 > braintrace::graph::FOLD_MAX_ELEMENTS) };
    let mut g = g0.clone();
    assert_eq!(g.fold_constants(), 3, "{g}");
    g.dce();
    g.validate().unwrap();
    assert_eq!(
        g.primitive_names(),
        vec!["broadcast_in_dim", "mul", "reduce_sum"],
        "{g}"
    );
    let args = [t(vec![1.0, -2.0, 0.5, 4.0, 0.0, 3.0], &[2, 3])];
    let (a, b) = (g.eval(&args).unwrap(), g0.eval(&args).unwrap());
    for (x, y) in a.iter().zip(&b) {
        assert_allclose("folded value", &v(x), &v(y), 0.0, 0.0);
    }
    assert_allclose(
        "by hand",
        &v(&a[0]),
        &[0.75, -1.5, 0.375, 3.0, 0.0, 2.25],
        0.0,
        0.0,
    );
}

// ------------------------------------------------------------------ validation and the builder

#[test]
fn builder_builds_a_valid_graph() {
    let mut b = GraphBuilder::new();
    let x = b.input(f64_aval(&[2]));
    let c = b.constant(t(vec![1.0, 2.0], &[2]));
    let y = b.eqn(Arc::new(Binary(BinaryOp::Mul)), &[x, c]).unwrap()[0];
    let z = b.eqn(Arc::new(Unary(UnaryOp::Tanh)), &[y]).unwrap()[0];
    let g = b.build(&[z, y]).unwrap();
    let out = g.eval(&[t(vec![0.5, -0.25], &[2])]).unwrap();
    assert_tensor("y", &out[1], &[2], &[0.5, -0.5]);
    assert_tensor("z", &out[0], &[2], &[0.5f64.tanh(), (-0.5f64).tanh()]);
}

#[test]
fn builder_refuses_bad_operands() {
    let mut b = GraphBuilder::new();
    let x = b.input(f64_aval(&[2]));
    let y = b.input(f64_aval(&[3]));
    assert!(b.eqn(Arc::new(Binary(BinaryOp::Mul)), &[x, y]).is_err());
    assert!(b.eqn(Arc::new(Unary(UnaryOp::Exp)), &[17]).is_err());
    assert!(b.build(&[42]).is_err());
}

#[test]
fn invalid_parts_are_refused_not_panicked_on() {
    let g = diamond();
    let parts = |eqns: Vec<braintrace::graph::Eqn>, outvars: Vec<usize>| {
        Graph::from_parts(
            (0..g.num_vars()).map(|v| g.aval(v).clone()).collect(),
            g.invars().to_vec(),
            g.constvars().to_vec(),
            g.consts().to_vec(),
            eqns,
            outvars,
        )
    };
    // The graph's own parts are valid.
    assert!(parts(g.eqns().to_vec(), g.outvars().to_vec()).is_ok());
    // Equations out of order: mul reads exp's result before it is defined.
    let mut swapped = g.eqns().to_vec();
    swapped.swap(0, 1);
    let err = parts(swapped, g.outvars().to_vec()).unwrap_err();
    assert!(err.to_string().contains("before it is defined"), "{err}");
    // A result defined twice.
    let mut twice = g.eqns().to_vec();
    twice.push(g.eqns()[0].clone());
    let err = parts(twice, g.outvars().to_vec()).unwrap_err();
    assert!(err.to_string().contains("defined twice"), "{err}");
    // A declared result aval that the primitive does not produce.
    let e0 = &g.eqns()[0];
    let wrong =
        braintrace::graph::Eqn::new(e0.prim().clone(), vec![g.invars()[0]], vec![g.invars()[1]]);
    assert!(parts(vec![wrong], vec![]).is_err());
    // Operand or output variables that do not exist.
    let ghost = braintrace::graph::Eqn::new(e0.prim().clone(), vec![999], vec![g.num_vars() - 1]);
    assert!(parts(vec![ghost], vec![]).is_err());
    assert!(parts(g.eqns().to_vec(), vec![999]).is_err());
}

#[test]
fn interpreter_moves_the_last_use_and_drops_dead_values() {
    // A value type that counts live handles: the walk over a chain of n
    // equations never holds more than a few at once.
    use std::cell::Cell;
    use std::rc::Rc;
    #[derive(Debug)]
    struct Live(Rc<Cell<usize>>);
    impl Clone for Live {
        fn clone(&self) -> Self {
            self.0.set(self.0.get() + 1);
            Live(self.0.clone())
        }
    }
    impl Drop for Live {
        fn drop(&mut self) {
            self.0.set(self.0.get() - 1);
        }
    }
    let g = make_graph(
        |a: &[Tensor]| {
            let mut x = a[0].clone();
            for _ in 0..20 {
                x = x.exp()?.tanh()?;
            }
            Ok(vec![x])
        },
        &[f64_aval(&[])],
    )
    .unwrap();
    let count = Rc::new(Cell::new(1));
    let mut peak = 0;
    let c2 = count.clone();
    let out = interpret(
        &g,
        vec![Live(count.clone())],
        |_| {
            c2.set(c2.get() + 1);
            Live(c2.clone())
        },
        |_, args: Vec<Live>| {
            peak = peak.max(count.get());
            count.set(count.get() + 1);
            let r = Live(args[0].0.clone());
            Ok(vec![r])
        },
    )
    .unwrap();
    assert_eq!(out.len(), 1);
    assert!(peak <= 2, "peak live values {peak}");
}

// ------------------------------------------------------------------ linearize and transpose

#[test]
fn linear_graph_and_its_transpose_are_adjoint_and_match_fd() {
    let args = gru_args(4);
    let g = make_graph(gru_step, &avals_of(&args)).unwrap();
    let lin = linearize(&g).unwrap();
    let pr = lin.primal.eval(&args).unwrap();
    assert_allclose(
        "primal",
        &v(&pr[0]),
        &v(&gru_step(&args).unwrap()[0]),
        1e-14,
        1e-14,
    );
    assert_eq!(pr.len(), 1 + lin.num_residuals);
    let res = &pr[1..];
    let mut rng = Lcg::new(5);
    let tans: Vec<Tensor> = args.iter().map(|a| rng.normal(a.shape())).collect();
    let lin_in: Vec<Tensor> = res.iter().chain(&tans).cloned().collect();
    let jt = lin.linear.eval(&lin_in).unwrap();
    // J t against finite differences.
    let cols = fd_jacobian(&gru_step, &args, 1e-6);
    let flat_t: Vec<f64> = tans.iter().flat_map(v).collect();
    let mut want = vec![0.0; GRU_HID];
    for (c, ti) in cols.iter().zip(&flat_t) {
        for (w, ci) in want.iter_mut().zip(c) {
            *w += ci * ti;
        }
    }
    assert_rel("J t vs FD", &v(&jt[0]), &want, 1e-7);
    // <J t, u> = <t, J^T u>.
    let mut mask = vec![false; lin.num_residuals];
    mask.extend(std::iter::repeat_n(true, args.len()));
    let lt = transpose(&lin.linear, &mask).unwrap();
    let u = rng.normal(&[GRU_HID]);
    let mut lt_in = res.to_vec();
    lt_in.push(u.clone());
    let jtu = lt.eval(&lt_in).unwrap();
    assert_eq!(jtu.len(), args.len());
    let lhs = dot(&v(&jt[0]), &v(&u));
    let rhs: f64 = jtu.iter().zip(&tans).map(|(a, b)| dot(&v(a), &v(b))).sum();
    assert!(
        (lhs - rhs).abs() < 1e-12 * lhs.abs().max(1.0),
        "{lhs} vs {rhs}"
    );
}

#[test]
fn vjp_pullback_is_available_as_a_graph() {
    let x = t(vec![0.3, 0.7], &[2]);
    let (_, pb) = vjp(
        |a: &[Tensor]| Ok(vec![a[0].sin()?.mul(&a[0])?]),
        std::slice::from_ref(&x),
    )
    .unwrap();
    let g = pb.graph().unwrap();
    let mut ins = pb.residuals().to_vec();
    ins.push(t(vec![1.0, 1.0], &[2]));
    let got = g.eval(&ins).unwrap();
    let want: Vec<f64> = v(&x).iter().map(|x| x.sin() + x * x.cos()).collect();
    assert_allclose("pullback graph", &v(&got[0]), &want, 1e-14, 1e-14);
    assert_allclose(
        "apply",
        &v(&pb.apply(&[t(vec![1.0, 1.0], &[2])]).unwrap()[0]),
        &want,
        1e-14,
        1e-14,
    );
}

#[test]
fn vjp_nests_in_jit_and_vmap_as_before() {
    let f = |a: &[Tensor]| a[0].tanh()?.mul(&a[1])?.sum_all();
    let vg = jit(value_and_grad_vec(f));
    let x = t(vec![0.1, 0.2, 0.3], &[3]);
    let w = t(vec![1.0, -1.0, 2.0], &[3]);
    let out = vg(&[x.clone(), w.clone()]).unwrap();
    let dx: Vec<f64> = v(&x)
        .iter()
        .zip(v(&w))
        .map(|(x, w)| w * (1.0 - x.tanh().powi(2)))
        .collect();
    assert_allclose("jit dx", &v(&out[1]), &dx, 1e-14, 1e-14);
    // vmap of grad over a batch of x, against a loop.
    let xs = t(vec![0.1, 0.2, 0.3, -0.5, 0.0, 0.9], &[2, 3]);
    let gb = vmap(
        grad_scalar(move |a: &[Tensor]| Ok(vec![f(a)?])),
        vec![Some(0), None],
    );
    let got = gb(&[xs.clone(), w.clone()]).unwrap();
    for b in 0..2 {
        let xb = t(v(&xs)[b * 3..b * 3 + 3].to_vec(), &[3]);
        let want = grad(f)(&[xb, w.clone()]).unwrap();
        assert_allclose(
            "vmap grad",
            &v(&got[0])[b * 3..b * 3 + 3],
            &v(&want[0]),
            1e-14,
            1e-14,
        );
    }
}

// ------------------------------------------------------------------ closed-graph call

fn softplus_call(a: &[Tensor]) -> Result<Vec<Tensor>> {
    call(
        "softplus_mul",
        |b: &[Tensor]| Ok(vec![b[0].exp()?.add_scalar(1.0)?.log()?.mul(&b[1])?]),
        a,
    )
}

#[test]
fn call_is_one_equation_and_lowers_recursively() {
    let outer = |a: &[Tensor]| {
        call(
            "outer",
            |b: &[Tensor]| Ok(vec![softplus_call(b)?.remove(0).tanh()?]),
            a,
        )
    };
    let av = [f64_aval(&[3]), f64_aval(&[3])];
    let g = make_graph(outer, &av).unwrap();
    assert_eq!(g.primitive_names(), vec!["call"]);
    let inner = as_call(&**g.eqns()[0].prim()).unwrap();
    assert_eq!(inner.call_name(), "outer");
    assert_eq!(inner.graph().primitive_names(), vec!["call", "tanh"]);
    let low = g.lower().unwrap();
    assert_eq!(
        low.primitive_names(),
        vec!["exp", "add_scalar", "log", "mul", "tanh"]
    );
    let args = [t(vec![0.1, -2.0, 3.0], &[3]), t(vec![1.0, 2.0, -1.0], &[3])];
    let want: Vec<f64> = v(&args[0])
        .iter()
        .zip(v(&args[1]))
        .map(|(x, y)| ((x.exp() + 1.0).ln() * y).tanh())
        .collect();
    assert_allclose("eager", &v(&outer(&args).unwrap()[0]), &want, 1e-14, 1e-14);
    assert_allclose("graph", &v(&g.eval(&args).unwrap()[0]), &want, 1e-14, 1e-14);
    assert_allclose(
        "lowered",
        &v(&low.eval(&args).unwrap()[0]),
        &want,
        1e-14,
        1e-14,
    );
    assert_allclose(
        "jit",
        &v(&jit(outer)(&args).unwrap()[0]),
        &want,
        1e-14,
        1e-14,
    );
}

#[test]
fn call_gradients_match_finite_differences() {
    let mut rng = Lcg::new(8);
    let args = [t(vec![0.1, -2.0, 3.0], &[3]), t(vec![1.0, 2.0, -1.0], &[3])];
    check_grads("call", &softplus_call, &args, &mut rng);
    let nested = |a: &[Tensor]| call("nested", softplus_call, a);
    check_grads("nested call", &nested, &args, &mut rng);
    // The JVP of a call is the call plus one call of its JVP graph.
    let g = make_graph(
        |a: &[Tensor]| {
            let (o, t) = jvp(softplus_call, &a[..2], &a[2..])?;
            Ok(o.into_iter().chain(t).collect())
        },
        &[
            f64_aval(&[3]),
            f64_aval(&[3]),
            f64_aval(&[3]),
            f64_aval(&[3]),
        ],
    )
    .unwrap();
    assert_eq!(g.primitive_names(), vec!["call", "call"]);
    assert_eq!(
        as_call(&**g.eqns()[1].prim()).unwrap().call_name(),
        "jvp(softplus_mul)"
    );
}

#[test]
fn call_under_vmap_matches_a_loop() {
    let xs = t(vec![0.1, -2.0, 3.0, 0.5, 0.6, -0.7], &[2, 3]);
    let y = t(vec![1.0, 2.0, -1.0], &[3]);
    let f = vmap(softplus_call, vec![Some(0), None]);
    let got = f(&[xs.clone(), y.clone()]).unwrap();
    for b in 0..2 {
        let xb = t(v(&xs)[b * 3..b * 3 + 3].to_vec(), &[3]);
        let want = softplus_call(&[xb, y.clone()]).unwrap();
        assert_allclose(
            "vmap call",
            &v(&got[0])[b * 3..b * 3 + 3],
            &v(&want[0]),
            1e-14,
            1e-14,
        );
    }
    let g = make_graph(&f, &[f64_aval(&[2, 3]), f64_aval(&[3])]).unwrap();
    assert_eq!(g.primitive_names(), vec!["call"]);
}

#[test]
fn call_refuses_arguments_of_other_avals() {
    let g = make_graph(|a: &[Tensor]| Ok(vec![a[0].exp()?]), &[f64_aval(&[2])]).unwrap();
    let c = Call::new("exp2", g);
    assert!(c.bind(&[t(vec![1.0, 2.0, 3.0], &[3])]).is_err());
    assert!(c.bind(&[]).is_err());
    let ok = c.bind(&[t(vec![0.0, 1.0], &[2])]).unwrap();
    assert_tensor("call eval", &ok[0], &[2], &[1.0, 1f64.exp()]);
}

#[test]
fn cse_does_not_merge_custom_jvp_calls_with_the_same_name() {
    use braintrace::transform::CustomJvp;
    // Same name, same operand, same equation count: different functions.
    let rule = |p: &[Tensor], t: &[Tensor]| Ok((vec![p[0].clone()], vec![t[0].clone()]));
    let f = CustomJvp::new("f", |a: &[Tensor]| Ok(vec![a[0].exp()?]), rule);
    let h = CustomJvp::new("f", |a: &[Tensor]| Ok(vec![a[0].tanh()?]), rule);
    let mut g = make_graph(
        |a: &[Tensor]| Ok(vec![f.call(a)?.remove(0).add(&h.call(a)?.remove(0))?]),
        &[f64_aval(&[1])],
    )
    .unwrap();
    assert_eq!(g.cse(), 0);
    let out = g.eval(&[t(vec![0.5], &[1])]).unwrap();
    assert_tensor("f + h", &out[0], &[1], &[0.5f64.exp() + 0.5f64.tanh()]);
}

#[test]
fn same_computation_compares_ops_params_and_constants_bit_for_bit() {
    let a = Aval::new(&[3], DType::F64);
    let with = |c: f64| {
        move |x: &[Tensor]| -> Result<Vec<Tensor>> {
            let k = Tensor::from_vec(vec![c, 1.0, 2.0], &[3])?;
            Ok(vec![x[0].mul(&k)?.mul_scalar(0.5)?])
        }
    };
    let g = |c: f64| make_graph(with(c), std::slice::from_ref(&a)).unwrap();
    assert!(g(1.5).same_computation(&g(1.5)));
    assert!(!g(1.5).same_computation(&g(2.5)));
    // 0.0 == -0.0, but a product by them differs in sign.
    assert!(!g(0.0).same_computation(&g(-0.0)));
    assert!(g(f64::NAN).same_computation(&g(f64::NAN)));
    // Another param, another op, other avals.
    let other = make_graph(
        |x: &[Tensor]| Ok(vec![x[0].mul_scalar(0.25)?]),
        std::slice::from_ref(&a),
    )
    .unwrap();
    let same_op = make_graph(
        |x: &[Tensor]| Ok(vec![x[0].mul_scalar(0.5)?]),
        std::slice::from_ref(&a),
    )
    .unwrap();
    assert!(!other.same_computation(&same_op));
    let neg = make_graph(
        |x: &[Tensor]| Ok(vec![x[0].neg()?]),
        std::slice::from_ref(&a),
    )
    .unwrap();
    assert!(!neg.same_computation(&same_op));
    let wide = make_graph(
        |x: &[Tensor]| Ok(vec![x[0].mul_scalar(0.5)?]),
        &[Aval::new(&[4], DType::F64)],
    )
    .unwrap();
    assert!(!wide.same_computation(&same_op));
}
