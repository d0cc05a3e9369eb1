//! Bad input returns `Err` (never panics), and the message names the op
//! and the offending shapes / dtypes / axes.

use braintrace::graph::{bind, Primitive};
use braintrace::ops::elementwise::{
    Binary, BinaryOp, Cast, Compare, CompareOp, Scalar, ScalarOp, Select, StopGradient, Unary,
    UnaryOp,
};
use braintrace::ops::index::{scatter_add, ScatterAdd, Take};
use braintrace::ops::linalg::Matmul;
use braintrace::ops::shape::{BroadcastInDim, Concat, Pad, ReduceSum, Reshape, SliceOp, Transpose};
use braintrace::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Run `f` expecting `Err`; a panic or `Ok` fails with `what`.
#[track_caller]
fn err_of<T: std::fmt::Debug>(what: &str, f: impl FnOnce() -> Result<T>) -> Error {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => panic!("{what}: expected an error, got Ok({v:?})"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{what}: panicked instead of returning an error"),
    }
}

/// Assert the message contains every needle.
#[track_caller]
fn assert_msg(what: &str, e: &Error, needles: &[&str]) {
    let m = e.to_string();
    for n in needles {
        assert!(
            m.contains(n),
            "{what}: message `{m}` does not mention `{n}`"
        );
    }
}

/// Run `f` eagerly and inside a trace (the error must come out of both).
#[track_caller]
fn err_eager_and_traced(
    what: &str,
    args: &[Tensor],
    f: fn(&[Tensor]) -> Result<Tensor>,
) -> (Error, Error) {
    let eager = err_of(&format!("{what} (eager)"), || f(args));
    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
    let traced = err_of(&format!("{what} (traced)"), || {
        make_graph(|a: &[Tensor]| Ok(vec![f(a)?]), &avals)
    });
    (eager, traced)
}

fn z(shape: &[usize]) -> Tensor {
    Tensor::zeros(shape, DType::F64)
}

// ------------------------------------------------------------------ shapes

#[test]
fn elementwise_shape_mismatch_names_op_and_shapes() {
    type Op = fn(&[Tensor]) -> Result<Tensor>;
    let ops: [(&str, Op); 7] = [
        ("add", |a| a[0].add(&a[1])),
        ("sub", |a| a[0].sub(&a[1])),
        ("mul", |a| a[0].mul(&a[1])),
        ("div", |a| a[0].div(&a[1])),
        ("maximum", |a| a[0].maximum(&a[1])),
        ("minimum", |a| a[0].minimum(&a[1])),
        ("pow", |a| a[0].pow(&a[1])),
    ];
    for (name, f) in ops {
        let (e, t) = err_eager_and_traced(name, &[z(&[2, 3]), z(&[4, 5])], f);
        for e in [e, t] {
            assert!(matches!(e, Error::Shape { .. }), "{name}: {e:?}");
            assert_msg(name, &e, &[name, "[2, 3]", "[4, 5]"]);
        }
    }
    let e = err_of("where", || {
        where_(&Tensor::ones(&[2], DType::Bool), &z(&[3]), &z(&[3]))
    });
    assert_msg("where", &e, &["select", "[2]", "[3]"]);
    let e = err_of("gt", || z(&[2, 3]).gt(&z(&[3, 2])));
    assert_msg("gt", &e, &["[2, 3]", "[3, 2]"]);
}

#[test]
fn matmul_shape_mismatch_names_op_and_shapes() {
    let (e, t) = err_eager_and_traced("matmul", &[z(&[2, 3]), z(&[4, 5])], |a| a[0].matmul(&a[1]));
    for e in [e, t] {
        assert!(matches!(e, Error::Shape { .. }), "{e:?}");
        assert_msg("matmul", &e, &["matmul", "[2, 3]", "[4, 5]"]);
    }
    // Leading (batch) dimensions that do not broadcast: still both full shapes.
    let e = err_of("matmul batch", || z(&[2, 3, 4]).matmul(&z(&[3, 4, 5])));
    assert_msg("matmul batch", &e, &["matmul", "[2, 3, 4]", "[3, 4, 5]"]);
    let e = err_of("matmul 1-D", || z(&[3]).matmul(&z(&[4])));
    assert_msg("matmul 1-D", &e, &["matmul", "[3]", "[4]"]);
    let e = err_of("matmul 0-D", || z(&[]).matmul(&z(&[4])));
    assert_msg("matmul 0-D", &e, &["matmul", "[]", "[4]"]);
}

#[test]
fn structural_shape_errors() {
    let x = z(&[2, 3]);
    let e = err_of("reshape", || x.reshape(&[4, 2]));
    assert_msg("reshape", &e, &["reshape", "[2, 3]", "[4, 2]"]);
    let e = err_of("broadcast_to", || x.broadcast_to(&[3, 3]));
    assert_msg("broadcast_to", &e, &["broadcast_to", "[2, 3]", "[3, 3]"]);
    let e = err_of("broadcast_to lower rank", || x.broadcast_to(&[3]));
    assert_msg(
        "broadcast_to lower rank",
        &e,
        &["broadcast_to", "[2, 3]", "[3]"],
    );
    let e = err_of("transpose", || x.transpose(&[0, 0]));
    assert_msg("transpose", &e, &["transpose", "[2, 3]"]);
    let e = err_of("transpose length", || x.transpose(&[1, 0, 2]));
    assert_msg("transpose length", &e, &["transpose"]);
    let e = err_of("squeeze non-1", || x.squeeze(&[1]));
    assert_msg("squeeze non-1", &e, &["squeeze", "[2, 3]"]);
    let e = err_of("slice", || x.slice(&[0, 1], &[2, 4]));
    assert_msg("slice", &e, &["slice", "[2, 3]"]);
    let e = err_of("slice start > limit", || x.slice(&[1, 2], &[0, 3]));
    assert_msg("slice start > limit", &e, &["slice"]);
    let e = err_of("slice rank", || x.slice(&[0], &[1]));
    assert_msg("slice rank", &e, &["slice"]);
    let e = err_of("slice_axis", || x.slice_axis(1, 2, 5));
    assert_msg("slice_axis", &e, &["slice", "[2, 3]"]);
    let e = err_of("index_axis", || x.index_axis(1, 3));
    assert_msg("index_axis", &e, &["index_axis", "[2, 3]"]);
    let e = err_of("pad", || x.pad(&[1], &[1]));
    assert_msg("pad", &e, &["pad", "[2, 3]"]);
    let e = err_of("concat", || concat(&[x.clone(), z(&[3, 3])], 1));
    assert_msg("concat", &e, &["concatenate", "[2, 3]", "[3, 3]"]);
    let e = err_of("stack", || stack(&[x.clone(), z(&[3, 2])], 0));
    assert_msg("stack", &e, &["concatenate"]);
    let e = err_of("scatter_add updates", || {
        scatter_add(&Tensor::zeros(&[2], DType::I64), &z(&[3]), 0, &[4])
    });
    assert_msg("scatter_add updates", &e, &["scatter_add", "[3]"]);
}

// ------------------------------------------------------------------ dtypes

#[test]
fn dtype_mismatch() {
    let a = z(&[2, 3]);
    let b = Tensor::zeros(&[2, 3], DType::F32);
    for (name, r) in [
        ("add", err_of("add", || a.add(&b))),
        ("mul", err_of("mul", || a.mul(&b))),
        ("matmul", err_of("matmul", || a.matmul(&b.t()?))),
        ("gt", err_of("gt", || a.gt(&b))),
    ] {
        assert!(matches!(r, Error::DType { .. }), "{name}: {r:?}");
        assert_msg(name, &r, &["f64", "f32"]);
    }
    let e = err_of("add", || a.add(&b));
    assert_msg("add dtype", &e, &["add", "[2, 3]"]);
    let e = err_of("matmul", || a.matmul(&b.t()?));
    assert_msg("matmul dtype", &e, &["matmul", "[2, 3]", "[3, 2]"]);
    // Non-float operands of float ops.
    let i = Tensor::zeros(&[3], DType::I64);
    let e = err_of("exp of i64", || i.exp());
    assert_msg("exp of i64", &e, &["exp", "i64"]);
    let e = err_of("sum of bool", || Tensor::ones(&[3], DType::Bool).sum_all());
    assert_msg("sum of bool", &e, &["sum", "bool"]);
    let e = err_of("mul_scalar of i64", || i.mul_scalar(2.0));
    assert_msg("mul_scalar of i64", &e, &["mul_scalar", "i64"]);
    // Index and mask dtypes.
    let e = err_of("take f64 indices", || a.take(&z(&[2]), 0));
    assert_msg("take f64 indices", &e, &["take", "i64"]);
    let e = err_of("where f64 cond", || where_(&a, &a, &a));
    assert_msg("where f64 cond", &e, &["select", "bool"]);
    let e = err_of("where value dtypes", || {
        where_(&Tensor::ones(&[2, 3], DType::Bool), &a, &b)
    });
    assert_msg("where value dtypes", &e, &["select", "f64", "f32"]);
    let e = err_of("concat dtypes", || concat(&[a.clone(), b.clone()], 0));
    assert_msg(
        "concat dtypes",
        &e,
        &["concatenate", "f64[2,3]", "f32[2,3]"],
    );
}

// ------------------------------------------------------------------ arity

/// Every core primitive, with its expected operand count.
fn core_primitives() -> Vec<(Arc<dyn Primitive>, usize)> {
    vec![
        (Arc::new(Unary(UnaryOp::Exp)), 1),
        (Arc::new(Binary(BinaryOp::Add)), 2),
        (
            Arc::new(Scalar {
                op: ScalarOp::Mul,
                value: 2.0,
            }),
            1,
        ),
        (Arc::new(Compare(CompareOp::Gt)), 2),
        (Arc::new(Select), 3),
        (Arc::new(Cast(DType::F32)), 1),
        (Arc::new(StopGradient), 1),
        (Arc::new(Reshape { shape: vec![6] }), 1),
        (Arc::new(Transpose { perm: vec![1, 0] }), 1),
        (
            Arc::new(BroadcastInDim {
                shape: vec![2, 3],
                dims: vec![0, 1],
            }),
            1,
        ),
        (Arc::new(ReduceSum { axes: vec![0] }), 1),
        (
            Arc::new(SliceOp {
                starts: vec![0, 0],
                limits: vec![1, 1],
            }),
            1,
        ),
        (
            Arc::new(Pad {
                lo: vec![0, 0],
                hi: vec![1, 1],
            }),
            1,
        ),
        (Arc::new(Matmul), 2),
        (Arc::new(Take { axis: 0 }), 2),
        (
            Arc::new(ScatterAdd {
                axis: 0,
                shape: vec![2, 3],
            }),
            2,
        ),
    ]
}

#[test]
fn wrong_number_of_arguments_to_a_primitive() {
    let x = z(&[2, 3]);
    for (p, n) in core_primitives() {
        let name = p.name();
        for count in [0, n - 1, n + 1] {
            if count == n {
                continue;
            }
            let args = vec![x.clone(); count];
            let e = err_of(&format!("{name} with {count} args (eager)"), || {
                bind(p.clone(), &args)
            });
            // The message names the primitive (reduce_sum reports as `sum`).
            let shown = if name == "reduce_sum" { "sum" } else { &name };
            assert_msg(&name, &e, &[shown, &count.to_string()]);
            let avals = vec![x.aval(); count];
            let p2 = p.clone();
            let e = err_of(&format!("{name} with {count} args (traced)"), || {
                make_graph(move |a: &[Tensor]| bind(p2.clone(), a), &avals)
            });
            assert_msg(&name, &e, &[&count.to_string()]);
        }
    }
    let e = err_of("concatenate of nothing", || {
        bind(Arc::new(Concat { axis: 0 }), &[])
    });
    assert!(matches!(e, Error::Arity { .. }), "{e:?}");
    let e = err_of("concat of nothing", || concat(&[], 0));
    assert_msg("concat of nothing", &e, &["concatenate"]);
    let e = err_of("stack of nothing", || stack(&[], 0));
    assert_msg("stack of nothing", &e, &["stack"]);
}

#[test]
fn wrong_number_of_arguments_to_a_graph_or_transform() {
    let g = make_graph(
        |a: &[Tensor]| Ok(vec![a[0].add(&a[1])?]),
        &[Aval::new(&[2], DType::F64), Aval::new(&[2], DType::F64)],
    )
    .unwrap();
    let e = err_of("graph eval with 1 arg", || g.eval(&[z(&[2])]));
    assert!(matches!(e, Error::Arity { .. }), "{e:?}");
    assert_msg("graph eval", &e, &["2", "1"]);
    let e = err_of("graph eval with 3 args", || {
        g.eval(&[z(&[2]), z(&[2]), z(&[2])])
    });
    assert!(matches!(e, Error::Arity { .. }), "{e:?}");
    let e = err_of("graph eval with a wrong aval", || {
        g.eval(&[z(&[2]), z(&[3])])
    });
    assert_msg("graph eval aval", &e, &["f64[3]", "f64[2]"]);
    // Interpreters called with the wrong number of arguments.
    let e = err_of("jvp_graph", || {
        braintrace::transform::jvp_graph(&g, &[z(&[2])], &[None])
    });
    assert!(matches!(e, Error::Arity { .. }), "{e:?}");
    let e = err_of("vmap_graph", || {
        braintrace::transform::vmap_graph(&g, &[z(&[3, 2])], &[true], 3)
    });
    assert_msg("vmap_graph", &e, &["2", "1"]);
    let e = err_of("vmap_graph batched flags", || {
        braintrace::transform::vmap_graph(&g, &[z(&[3, 2]), z(&[3, 2])], &[true], 3)
    });
    assert_msg("vmap_graph batched flags", &e, &["vmap"]);
    // jvp with mismatched primals / tangents.
    let f = |a: &[Tensor]| Ok(vec![a[0].exp()?]);
    let e = err_of("jvp count", || jvp(f, &[z(&[2])], &[]));
    assert_msg("jvp count", &e, &["jvp", "1", "0"]);
    let e = err_of("jvp tangent aval", || jvp(f, &[z(&[2])], &[z(&[3])]));
    assert_msg("jvp tangent aval", &e, &["jvp", "f64[3]", "f64[2]"]);
    // Pullback with the wrong cotangents.
    let (_, pb) = vjp(f, &[z(&[2])]).unwrap();
    let e = err_of("pullback count", || pb.apply(&[]));
    assert_msg("pullback count", &e, &["vjp", "1", "0"]);
    let e = err_of("pullback aval", || pb.apply(&[z(&[3])]));
    assert_msg("pullback aval", &e, &["vjp", "f64[3]", "f64[2]"]);
    // grad_scalar of a function with two outputs.
    let e = err_of("grad_scalar", || {
        braintrace::grad_scalar(|a: &[Tensor]| Ok(vec![a[0].sum_all()?, a[0].sum_all()?]))(&[z(&[
            2,
        ])])
    });
    assert_msg("grad_scalar", &e, &["grad", "2"]);
}

// ------------------------------------------------------------------ axes

#[test]
fn out_of_range_axes() {
    let x = z(&[2, 3]);
    let cases: Vec<(&str, Error)> = vec![
        ("sum", err_of("sum", || x.sum(&[2]))),
        ("mean", err_of("mean", || x.mean(&[0, 5]))),
        ("expand_dims", err_of("expand_dims", || x.expand_dims(3))),
        ("squeeze", err_of("squeeze", || x.squeeze(&[2]))),
        ("slice_axis", err_of("slice_axis", || x.slice_axis(2, 0, 1))),
        ("index_axis", err_of("index_axis", || x.index_axis(2, 0))),
        (
            "take",
            err_of("take", || x.take(&Tensor::zeros(&[1], DType::I64), 2)),
        ),
        (
            "concatenate",
            err_of("concat", || concat(&[x.clone(), x.clone()], 2)),
        ),
        (
            "concatenate",
            err_of("concat single", || concat(std::slice::from_ref(&x), 2)),
        ),
        (
            "expand_dims",
            err_of("stack", || stack(&[x.clone(), x.clone()], 3)),
        ),
        (
            "scatter_add",
            err_of("scatter_add", || {
                scatter_add(&Tensor::zeros(&[1], DType::I64), &z(&[1]), 1, &[4])
            }),
        ),
    ];
    for (op, e) in cases {
        assert!(matches!(e, Error::Axis { .. }), "{op}: {e:?}");
        assert_msg(op, &e, &[op, "out of range"]);
    }
    // Traced too.
    let e = err_of("sum traced", || {
        make_graph(|a: &[Tensor]| Ok(vec![a[0].sum(&[2])?]), &[x.aval()])
    });
    assert_msg("sum traced", &e, &["sum", "axis 2", "[2, 3]"]);
}

#[test]
fn vmap_in_axes_errors() {
    let f = |a: &[Tensor]| Ok(vec![a[0].add(&a[1])?]);
    let (x, y) = (z(&[2, 3]), z(&[2, 3]));
    // Out of range.
    let e = err_of("vmap axis", || {
        vmap(f, vec![Some(2), None])(&[x.clone(), y.clone()])
    });
    assert!(matches!(e, Error::Transform { .. }), "{e:?}");
    assert_msg("vmap axis", &e, &["vmap", "in_axes[0] = 2", "[2, 3]"]);
    // Wrong length.
    let e = err_of("vmap in_axes length", || {
        vmap(f, vec![Some(0)])(&[x.clone(), y.clone()])
    });
    assert_msg("vmap in_axes length", &e, &["vmap", "in_axes", "1", "2"]);
    let e = err_of("vmap in_axes too long", || {
        vmap(f, vec![Some(0); 3])(&[x.clone(), y.clone()])
    });
    assert_msg("vmap in_axes too long", &e, &["vmap", "in_axes", "3", "2"]);
    // Mapped sizes differ.
    let e = err_of("vmap sizes", || {
        vmap(f, vec![Some(0), Some(1)])(&[x.clone(), y.clone()])
    });
    assert_msg("vmap sizes", &e, &["vmap", "[2, 3]"]);
    // Nothing mapped.
    let e = err_of("vmap none", || {
        vmap(f, vec![None, None])(&[x.clone(), y.clone()])
    });
    assert_msg("vmap none", &e, &["vmap"]);
    // Out axes.
    let e = err_of("vmap out_axes", || {
        braintrace::vmap_out(f, vec![Some(0), Some(0)], Some(vec![3]))(&[x.clone(), y.clone()])
    });
    assert_msg("vmap out_axes", &e, &["vmap", "out_axes"]);
    let e = err_of("vmap out_axes length", || {
        braintrace::vmap_out(f, vec![Some(0), Some(0)], Some(vec![0, 0]))(&[x.clone(), y.clone()])
    });
    assert_msg("vmap out_axes length", &e, &["vmap", "out_axes"]);
    // Errors of the mapped function come through, naming the op.
    let e = err_of("vmap inner", || {
        vmap(f, vec![Some(0), Some(0)])(&[x.clone(), z(&[2, 4])])
    });
    assert_msg("vmap inner", &e, &["add", "[3]", "[4]"]);
}

// ------------------------------------------------------------------ grad

#[test]
fn grad_of_non_scalar_output() {
    let x = z(&[3]);
    let e = err_of("grad non-scalar", || {
        grad(|a: &[Tensor]| a[0].exp())(std::slice::from_ref(&x))
    });
    assert!(matches!(e, Error::Transform { .. }), "{e:?}");
    assert_msg("grad non-scalar", &e, &["grad", "scalar", "[3]"]);
    let e = err_of("grad shape [1]", || {
        grad(|a: &[Tensor]| a[0].sum(&[1]))(&[z(&[1, 1])])
    });
    assert_msg("grad shape [1]", &e, &["grad", "[1]"]);
    let e = err_of("value_and_grad non-scalar", || {
        value_and_grad(|a: &[Tensor]| a[0].exp())(std::slice::from_ref(&x))
    });
    assert_msg("value_and_grad non-scalar", &e, &["grad", "[3]"]);
    let e = err_of("grad of a bool output", || {
        grad(|a: &[Tensor]| a[0].sum_all()?.gt(&Tensor::scalar(0.0)))(std::slice::from_ref(&x))
    });
    assert_msg("grad bool", &e, &["grad", "bool"]);
    // Inside vmap and jit, the error still surfaces.
    let e = err_of("vmap(grad non-scalar)", || {
        vmap(grad(|a: &[Tensor]| a[0].exp()), vec![Some(0)])(&[z(&[2, 3])])
    });
    assert_msg("vmap(grad)", &e, &["grad", "[3]"]);
    let e = err_of("jit(grad non-scalar)", || {
        jit(grad(|a: &[Tensor]| a[0].exp()))(std::slice::from_ref(&x))
    });
    assert_msg("jit(grad)", &e, &["grad", "[3]"]);
}

// ------------------------------------------------------------------ construction and indices

#[test]
fn from_vec_length_mismatch() {
    let e = err_of("from_vec", || {
        Tensor::from_vec(vec![1.0, 2.0, 3.0], &[2, 2])
    });
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    assert_msg("from_vec", &e, &["from_vec", "[2, 2]", "3", "4"]);
    let e = err_of("from_vec scalar", || Tensor::from_vec(vec![], &[]));
    assert_msg("from_vec scalar", &e, &["from_vec", "0", "1"]);
    let e = err_of("from_vec_typed", || {
        Tensor::from_vec_typed(vec![1i64; 5], &[2])
    });
    assert_msg("from_vec_typed", &e, &["from_vec", "[2]", "5"]);
    let e = err_of("item", || Tensor::from_vec(vec![1.0, 2.0], &[2])?.item());
    assert_msg("item", &e, &["item", "[2]"]);
}

#[test]
fn take_out_of_range_index() {
    let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    for (bad, axis) in [
        (3i64, 0usize),
        (-1, 0),
        (2, 1),
        (i64::MAX, 0),
        (i64::MIN, 1),
    ] {
        let idx = Tensor::from_vec_typed(vec![0, bad], &[2]).unwrap();
        let e = err_of(&format!("take {bad} axis {axis}"), || x.take(&idx, axis));
        assert_msg("take", &e, &["take", &bad.to_string()]);
        // Under jit and grad the error comes out at execution time.
        let i2 = idx.clone();
        let e = err_of("jit take", || {
            jit(move |a: &[Tensor]| Ok(vec![a[0].take(&i2, axis)?]))(std::slice::from_ref(&x))
        });
        assert_msg("jit take", &e, &["take"]);
        let i3 = idx.clone();
        let e = err_of("grad take", || {
            grad(move |a: &[Tensor]| a[0].take(&i3, axis)?.sum_all())(std::slice::from_ref(&x))
        });
        assert_msg("grad take", &e, &["take"]);
        // Mapped over the other axis, each example is a row/column of x.
        let e = err_of("vmap take", || {
            vmap(
                |a: &[Tensor]| Ok(vec![a[0].take(&a[1], 0)?]),
                vec![Some(1 - axis), None],
            )(&[x.clone(), idx.clone()])
        });
        assert_msg("vmap take", &e, &["take"]);
    }
    let idx = Tensor::from_vec_typed(vec![4i64], &[1]).unwrap();
    let e = err_of("scatter_add", || scatter_add(&idx, &z(&[1, 2]), 0, &[3, 2]));
    assert_msg("scatter_add", &e, &["scatter_add", "4"]);
}

#[test]
fn symbolic_data_access_is_an_error() {
    let e = err_of("to_vec_f64 while tracing", || {
        make_graph(
            |a: &[Tensor]| {
                let _ = a[0].to_vec_f64()?;
                Ok(vec![a[0].clone()])
            },
            &[Aval::new(&[2], DType::F64)],
        )
    });
    assert!(matches!(e, Error::Symbolic { .. }), "{e:?}");
    assert_msg("symbolic", &e, &["to_vec_f64", "[2]"]);
}

// ------------------------------------------------------------------ errors inside ETP primitives

/// A shape error raised by a core op inside an ETP primitive's impl comes out
/// as `Error::Etp` naming the primitive, and the inner `Error::Shape` (with
/// its typed shapes) is reachable through `source()`, eagerly and traced.
#[test]
fn shape_error_inside_an_etp_primitive_is_matchable_through_source() {
    use braintrace::error::Shape;
    use braintrace::prims::{self, Transforms};
    use std::error::Error as _;

    let x = z(&[2, 5]);
    let w = z(&[3, 4]);
    let call = |a: &[Tensor]| prims::matmul(&a[0], &a[1], None, &Transforms::default());
    let (eager, traced) = err_eager_and_traced("etp_mm [2,5] @ [3,4]", &[x, w], call);
    for e in [eager, traced] {
        let Error::Etp { primitive, .. } = &e else {
            panic!("expected Error::Etp, got {e:?}");
        };
        assert_eq!(primitive, "etp_mm");
        let inner = e
            .source()
            .expect("an Etp error has a source")
            .downcast_ref::<Error>()
            .expect("the source is a braintrace Error");
        let Error::Shape { op, shapes, .. } = inner else {
            panic!("expected the inner error to be Error::Shape, got {inner:?}");
        };
        assert_eq!(op, "matmul");
        assert_eq!(shapes, &[Shape(vec![2, 5]), Shape(vec![3, 4])]);
        assert!(matches!(e.root(), Error::Shape { .. }), "{e:?}");
        assert_eq!(e.op(), "etp_mm");
        assert_msg("etp_mm", &e, &["etp_mm", "matmul", "[2, 5]", "[3, 4]"]);
    }
}

/// A refusal by the ETP layer itself (not a wrapped error) still has a
/// source: an `Error::Invalid` naming the primitive.
#[test]
fn etp_refusal_has_an_invalid_source_naming_the_primitive() {
    use std::error::Error as _;
    let e = Error::etp("etp_x", "bind", "no good");
    assert_eq!(e.to_string(), "ETP primitive `etp_x`, bind: no good");
    let inner = e.source().and_then(|s| s.downcast_ref::<Error>());
    assert!(
        matches!(inner, Some(Error::Invalid { op, reason }) if op == "etp_x" && reason == "no good"),
        "{inner:?}"
    );
    // A wrap keeps the inner error typed and its message readable.
    let w = Error::etp_wrap(
        "etp_x",
        "rule yw_to_w",
        Error::shapes("add", [[2], [3]], "bad"),
    );
    assert_eq!(
        w.to_string(),
        "ETP primitive `etp_x`, rule yw_to_w: add: incompatible shapes [2] and [3]: bad"
    );
    assert!(matches!(w.root(), Error::Shape { .. }));
}

// ------------------------------------------------------------------ regressions (hostile input)

/// 2^63 + 3: a dimension whose products with small numbers wrap around.
const HUGE: usize = (1 << 63) + 3;

/// Regression: `reshape` to `[2^63+3, 2]` passed the size check (the product
/// wrapped to 6) and panicked in the kernel; under tracing it returned Ok
/// with the impossible shape.
#[test]
fn reshape_to_an_overflowing_shape_is_an_error() {
    let (e, t) = err_eager_and_traced("reshape overflow", &[z(&[6])], |a| a[0].reshape(&[HUGE, 2]));
    for e in [e, t] {
        assert!(
            matches!(e, Error::Shape { ref op, .. } if op == "reshape"),
            "{e:?}"
        );
    }
}

/// Regression: `broadcast_to` / `broadcast_in_dim` to a `2^63+1` dimension
/// panicked ("checked broadcastable").
#[test]
fn broadcast_to_an_overflowing_dim_is_an_error() {
    use braintrace::ops::shape::broadcast_in_dim;
    let (e, t) = err_eager_and_traced("broadcast_to overflow", &[z(&[1, 2])], |a| {
        a[0].broadcast_to(&[(1 << 63) + 1, 2])
    });
    for e in [e, t] {
        assert!(
            matches!(e, Error::Shape { ref op, .. } if op == "broadcast_to"),
            "{e:?}"
        );
    }
    let e = err_of("broadcast_in_dim overflow", || {
        broadcast_in_dim(&z(&[2]), &[(1 << 63) + 1, 4, 2], &[2])
    });
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
}

/// Regression: `broadcast_in_dim` returned its input unchanged when the
/// shapes matched, without checking that `dims` has one entry per axis.
#[test]
fn broadcast_in_dim_checks_dims_even_when_shapes_match() {
    use braintrace::ops::shape::broadcast_in_dim;
    let e = err_of("dims = [] on rank 1", || {
        broadcast_in_dim(&z(&[3]), &[3], &[])
    });
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    assert_msg("broadcast_in_dim dims", &e, &["broadcast", "[3]"]);
    let e = err_of("dims too long", || {
        broadcast_in_dim(&z(&[3]), &[3], &[0, 1])
    });
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    // The genuine no-op still is one.
    let x = z(&[3]);
    assert!(broadcast_in_dim(&x, &[3], &[0]).unwrap().ptr_eq(&x));
}

/// Regression: `pad` of a bool tensor was an error eagerly but Ok under
/// tracing. Now every dtype pads with its zero (`false`), eagerly and traced.
#[test]
fn pad_of_bool_agrees_eagerly_and_traced() {
    let m = Tensor::from_vec_typed(vec![true, false, true], &[3]).unwrap();
    let p = m.pad(&[1], &[2]).unwrap();
    assert_eq!(p.dtype(), DType::Bool);
    let got: Vec<bool> = p.to_vec_f64().unwrap().iter().map(|&v| v != 0.0).collect();
    assert_eq!(got, vec![false, true, false, true, false, false]);
    let out = eval_shape(
        |a: &[Tensor]| Ok(vec![a[0].pad(&[1], &[2])?]),
        &[Aval::new(&[3], DType::Bool)],
    )
    .unwrap();
    assert_eq!(out, vec![Aval::new(&[6], DType::Bool)]);
    let i = Tensor::from_vec_typed(vec![4i64, 5], &[2]).unwrap();
    assert_eq!(
        i.pad(&[0], &[1]).unwrap().to_vec_f64().unwrap(),
        vec![4.0, 5.0, 0.0]
    );
    // A padded size that overflows is an error, not a panic.
    let e = err_of("pad overflow", || z(&[2]).pad(&[usize::MAX], &[1]));
    assert!(
        matches!(e, Error::Shape { ref op, .. } if op == "pad"),
        "{e:?}"
    );
}

/// Regression: `mean` over a zero-size axis gave 0; numpy and JAX give NaN.
#[test]
fn mean_over_a_zero_size_axis_is_nan() {
    let x = z(&[0, 3]);
    let m = x.mean(&[0]).unwrap();
    assert_eq!(m.shape(), &[3]);
    assert!(m.to_vec_f64().unwrap().iter().all(|v| v.is_nan()));
    assert!(x.mean_all().unwrap().item().unwrap().is_nan());
    // Over the non-empty axis the result is empty, not NaN.
    assert_eq!(x.mean(&[1]).unwrap().shape(), &[0]);
    let y = Tensor::from_vec(vec![1.0, 2.0, 6.0], &[3]).unwrap();
    assert_eq!(y.mean_all().unwrap().item().unwrap(), 3.0);
}

/// Regression: `div_scalar(s)` computed `mul_scalar(1/s)`: for `s = 1e-310`
/// (subnormal, `1/s` = inf), `[0, 1e-5, 1]` gave `[NaN, inf, inf]`.
#[test]
fn div_scalar_by_a_subnormal_divides() {
    let s = 1e-310;
    let x = Tensor::from_vec(vec![0.0, 1e-5, 1.0], &[3]).unwrap();
    let got = x.div_scalar(s).unwrap().to_vec_f64().unwrap();
    assert_eq!(got, vec![0.0 / s, 1e-5 / s, 1.0 / s]);
    assert_eq!(got[0], 0.0);
    // s is subnormal (few significant bits), so 1e-5/s is 1e305 only roughly.
    assert!((got[1] / 1e305 - 1.0).abs() < 1e-3, "{}", got[1]);
    assert!(got[2].is_infinite());
    // Its derivative and transpose divide too.
    let g = grad(|a: &[Tensor]| a[0].div_scalar(s)?.sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_eq!(g[0].to_vec_f64().unwrap(), vec![1.0 / s; 3]);
}

/// Regression: `from_vec(vec![], &[2^63+1, 0])` failed with the
/// self-contradicting message "0 elements given, the shape holds 0".
#[test]
fn from_vec_with_an_impossible_shape_says_so() {
    let e = err_of("from_vec impossible", || {
        Tensor::from_vec(vec![], &[(1 << 63) + 1, 0])
    });
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    assert_msg("from_vec impossible", &e, &["from_vec", "too large"]);
    assert!(!e.to_string().contains("the shape holds 0"), "{e}");
    // A possible empty shape is fine.
    assert_eq!(Tensor::from_vec(vec![], &[4, 0]).unwrap().shape(), &[4, 0]);
}

/// Regression: `Tensor::zeros` panicked on an oversized shape reached from
/// user input; the fallible `try_zeros` is an error naming the op.
#[test]
fn try_zeros_of_an_oversized_shape_is_an_error() {
    for shape in [&[HUGE, 2][..], &[1 << 62, 4], &[usize::MAX, usize::MAX, 0]] {
        let e = err_of("try_zeros", || {
            Tensor::try_zeros("my_init", shape, DType::F32)
        });
        assert!(
            matches!(e, Error::Shape { ref op, .. } if op == "my_init"),
            "{e:?}"
        );
    }
    // 2^61 f64 elements: a valid shape, but 2^64 bytes.
    let e = err_of("try_zeros bytes", || {
        Tensor::try_zeros("my_init", &[1 << 61], DType::F64)
    });
    assert!(
        matches!(e, Error::Allocation { ref op, .. } if op == "my_init"),
        "{e:?}"
    );
    assert_eq!(
        Tensor::try_zeros("my_init", &[2, 0], DType::Bool)
            .unwrap()
            .shape(),
        &[2, 0]
    );
}

/// Regression: `scatter_add` did not check its result shape and panicked
/// allocating an oversized one (eagerly; traced it returned Ok).
#[test]
fn scatter_add_to_an_oversized_shape_is_an_error() {
    let idx = Tensor::from_vec_typed(Vec::<i64>::new(), &[0]).unwrap();
    let (e, t) = err_eager_and_traced("scatter_add oversized", &[idx, z(&[0, 1 << 62])], |a| {
        scatter_add(&a[0], &a[1], 0, &[4, 1 << 62])
    });
    for e in [e, t] {
        assert!(
            matches!(e, Error::Shape { ref op, .. } if op == "scatter_add"),
            "{e:?}"
        );
    }
}

/// Regression: the initialisers allocated their traces with the infallible
/// `Tensor::zeros`, so a huge `num_hidden_state` panicked (dense, LoRA, ...).
#[test]
fn init_rules_with_a_huge_num_hidden_state_are_errors() {
    use braintrace::prims;
    let f = |s: &[usize]| Aval::new(s, DType::F64);
    let ws: AvalMap = [
        ("weight".to_string(), f(&[3, 4])),
        ("bias".to_string(), f(&[4])),
    ]
    .into_iter()
    .collect();
    let p = prims::etp_mm::primitive();
    let params = Params::new().with("has_bias", true);
    for s in [HUGE, 1 << 62] {
        let e = err_of("init_drtrl huge", || {
            p.init_drtrl(Some(&f(&[2, 3])), &f(&[2, 4]), &ws, s, &params)
        });
        assert!(matches!(e.root(), Error::Shape { .. }), "{e:?}");
        assert_msg("init_drtrl huge", &e, &["etp_mm", "init_drtrl"]);
        let e = err_of("init_pp huge", || {
            p.init_pp(Some(&f(&[2, 3])), &f(&[2, 4]), &ws, s, &params)
        });
        assert!(matches!(e.root(), Error::Shape { .. }), "{e:?}");
        assert_msg("init_pp huge", &e, &["etp_mm", "init_pp"]);
    }
}

/// Regression: LoRA's `init_drtrl` indexed `w.shape()[0]` of a rank-0
/// `lora_b` (index out of bounds).
#[test]
fn lora_init_drtrl_with_a_rank_0_lora_b_is_an_error() {
    use braintrace::prims;
    let f = |s: &[usize]| Aval::new(s, DType::F64);
    let ws: AvalMap = [
        ("lora_b".to_string(), f(&[])),
        ("lora_a".to_string(), f(&[2, 4])),
    ]
    .into_iter()
    .collect();
    let params = Params::new()
        .with("alpha", 1.0)
        .with("has_bias", false)
        .with("rank", 2usize);
    let p = prims::etp_lora_mm::primitive();
    let e = err_of("lora rank-0 lora_b", || {
        p.init_drtrl(Some(&f(&[1, 3])), &f(&[1, 4]), &ws, 1, &params)
    });
    assert!(matches!(e.root(), Error::Shape { .. }), "{e:?}");
    assert_msg("lora rank-0", &e, &["etp_lora_mm", "lora_b"]);
}

/// Regression (found by `tests/proptest_ops.rs`): SAME padding with a huge
/// kernel dilation overflowed `i64` in `same_padding` and panicked.
#[test]
fn conv_same_padding_with_a_huge_dilation_is_an_error() {
    use braintrace::ops::{conv_general, ConvPadding, ConvParams};
    for dil in [usize::MAX, 1 << 62, (1 << 63) + 1] {
        let p = ConvParams::default_for(1)
            .with_padding(ConvPadding::Same)
            .with_rhs_dilation(&[dil]);
        let args = [z(&[1, 1, 4]), z(&[1, 1, 3])];
        let e = err_of("conv SAME huge dilation", || {
            conv_general(&args[0], &args[1], &p)
        });
        assert!(e.to_string().contains("conv"), "{e}");
        let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let e = err_of("conv SAME huge dilation (traced)", || {
            make_graph(
                |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]),
                &avals,
            )
        });
        assert!(e.to_string().contains("conv"), "{e}");
        let e = err_of("grad conv huge dilation", || {
            grad(|a: &[Tensor]| conv_general(&a[0], &a[1], &p)?.sum_all())(&[
                z(&[1, 1, 4]),
                z(&[1, 1, 3]),
            ])
        });
        assert!(e.to_string().contains("conv"), "{e}");
    }
}

/// Regression (found by `tests/proptest_ops.rs`): `scatter_add` of integer
/// updates was an error eagerly but Ok under tracing (the shape rule did not
/// check the dtype the kernel rejects).
#[test]
fn scatter_add_of_integer_updates_is_an_error_eagerly_and_traced() {
    let idx = Tensor::from_vec_typed(vec![0i64, 1], &[2]).unwrap();
    let upd = Tensor::from_vec_typed(vec![1i64, 2], &[2]).unwrap();
    let (e, t) = err_eager_and_traced("scatter_add i64", &[idx, upd], |a| {
        scatter_add(&a[0], &a[1], 0, &[3])
    });
    for e in [e, t] {
        assert!(
            matches!(e, Error::DType { ref op, .. } if op == "scatter_add"),
            "{e:?}"
        );
    }
}

/// Regression (found by `tests/proptest_ops.rs`'s hostile shapes):
/// `broadcast_to` a valid shape too large for memory (`[2^62 + 1]` of bool)
/// aborted the process in the allocator; it is an `Error::Allocation`.
/// (Tracing allocates nothing, so it accepts the shape.)
#[test]
fn broadcast_to_an_unallocatable_shape_is_an_allocation_error() {
    let m = Tensor::ones(&[1], DType::Bool);
    let e = err_of("broadcast_to 2^62+1 bools", || {
        m.broadcast_to(&[(1 << 62) + 1])
    });
    assert!(
        matches!(e, Error::Allocation { ref op, .. } if op == "broadcast_to"),
        "{e:?}"
    );
    assert_msg("allocation", &e, &["broadcast_to", "4611686018427387905"]);
    let e = err_of("broadcast_to 2^62+1 f64", || {
        z(&[1]).broadcast_to(&[(1 << 62) + 1])
    });
    assert!(matches!(e, Error::Allocation { .. }), "{e:?}");
    assert_msg("allocation bytes", &e, &["more than isize::MAX bytes"]);
}

/// Regression: a layer or batch too large to allocate (a Python user's
/// `GRUCell(3, 1 << 20)`, or `reset_hidden` with a huge batch) aborted the
/// process in the allocator; both are `Error::Allocation` now, and a
/// refused reset leaves the state as it was.
#[test]
fn huge_parameters_and_hidden_states_are_allocation_errors() {
    use braintrace::learn::ModelState;
    use braintrace::nn::GruCell;
    let e = ModelState::new(&GruCell::new("rnn", 3, 1 << 20), DType::F32, 0, None).unwrap_err();
    assert!(
        matches!(e, Error::Allocation { ref op, .. } if op.contains("rnn/Wz")),
        "{e:?}"
    );
    let mut s = ModelState::new(&GruCell::new("rnn", 3, 4), DType::F32, 0, Some(2)).unwrap();
    let e = s.reset_hidden(Some(1 << 40)).unwrap_err();
    assert!(
        matches!(e, Error::Allocation { ref op, .. } if op.contains("reset_hidden")),
        "{e:?}"
    );
    assert_eq!(s.batch(), Some(2));
    assert_eq!(s.hidden_value("rnn/h").unwrap().shape(), &[2, 4]);
}
