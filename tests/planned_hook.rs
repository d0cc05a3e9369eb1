//! A primitive defined outside the crate opts into the planned executor's
//! own kernels (matrix product, transpose, concatenation, sum, reshape)
//! through `Primitive::planned`, as the core ops do: under `jit` its
//! equations then run on the executor's kernels (its `eval` is never
//! called) and give the bits the core op gives under `jit`. Without the
//! declaration the same primitive runs its `eval` on every call.

use braintrace::graph::{bind, Planned, Primitive};
use braintrace::ops::linalg::Matmul;
use braintrace::ops::shape::{Concat, ReduceSum, Reshape, Transpose};
use braintrace::{jit, Aval, DType, Result, Tensor};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A primitive of this test: it computes what the core op `inner` does
/// (its `eval` calls `inner`'s), counts its `eval` calls, and declares the
/// computation to the planner only when `opt_in`.
#[derive(Debug, Clone)]
struct Outside {
    inner: Arc<dyn Primitive>,
    opt_in: bool,
    evals: Arc<AtomicUsize>,
}

impl Primitive for Outside {
    fn name(&self) -> String {
        format!("outside_{}", self.inner.name())
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        self.inner.abstract_eval(inputs)
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.evals.fetch_add(1, Ordering::Relaxed);
        self.inner.eval(inputs)
    }
    fn jvp(
        &self,
        primals: &[Tensor],
        tangents: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        self.inner.jvp(primals, tangents)
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        self.inner.batch(args, batched, size)
    }
    fn planned(&self) -> Option<Planned<'_>> {
        if !self.opt_in {
            return None;
        }
        // Declared by this primitive itself (not read from `inner`).
        Some(match self.inner.name().as_str() {
            "matmul" => Planned::Matmul,
            "transpose" => Planned::Transpose { perm: &[1, 0] },
            "concatenate" => Planned::Concat { axis: 1 },
            "reduce_sum" => Planned::Sum { axes: &[0, 1] },
            "reshape" => Planned::Reshape,
            other => panic!("no declaration for {other}"),
        })
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| {
            t.to_vec_f64()
                .unwrap()
                .iter()
                .map(|&v| (v as f32).to_bits())
                .collect()
        })
        .collect()
}

fn data(seed: u64, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f64 / 137.0 - 3.5)
        .collect();
    Tensor::from_vec(v, shape)
        .unwrap()
        .cast(DType::F32)
        .unwrap()
}

/// Run `inner` under `jit` three times as the core op, as an `Outside`
/// that opts in, and as one that does not: the opted-in primitive's
/// `eval` never runs and its results have the core op's bits; the other's
/// `eval` runs on every call (with the same values).
fn check(inner: Arc<dyn Primitive>, args: Vec<Tensor>) {
    let name = inner.name();
    // The element-wise `mul` around the op keeps it inside a program with
    // other steps (as in a model), not a graph of one equation.
    let program = |p: Arc<dyn Primitive>| {
        jit(move |a: &[Tensor]| {
            let doubled: Vec<Tensor> =
                a.iter().map(|t| t.mul_scalar(2.0)).collect::<Result<_>>()?;
            let y = bind(p.clone(), &doubled)?;
            Ok(vec![y[0].mul_scalar(0.5)?])
        })
    };
    let core = program(inner.clone());
    let want: Vec<_> = (0..3).map(|_| bits(&core(&args).unwrap())).collect();

    for opt_in in [true, false] {
        let evals = Arc::new(AtomicUsize::new(0));
        let p = Arc::new(Outside {
            inner: inner.clone(),
            opt_in,
            evals: evals.clone(),
        });
        let f = program(p);
        for (call, w) in want.iter().enumerate() {
            let got = bits(&f(&args).unwrap());
            assert_eq!(&got, w, "{name} (opt_in {opt_in}), call {call}");
        }
        let n = evals.load(Ordering::Relaxed);
        if opt_in {
            assert_eq!(n, 0, "{name}: planned, its eval must not run");
        } else {
            assert_eq!(n, 3, "{name}: not planned, its eval runs on each call");
        }
    }
}

#[test]
fn an_outside_matmul_is_planned_as_the_core_one() {
    check(Arc::new(Matmul), vec![data(1, &[6, 5]), data(2, &[5, 7])]);
}

#[test]
fn an_outside_transpose_is_planned_as_the_core_one() {
    check(
        Arc::new(Transpose { perm: vec![1, 0] }),
        vec![data(3, &[4, 9])],
    );
}

#[test]
fn an_outside_concat_is_planned_as_the_core_one() {
    check(
        Arc::new(Concat { axis: 1 }),
        vec![data(4, &[3, 2]), data(5, &[3, 4])],
    );
}

#[test]
fn an_outside_sum_is_planned_as_the_core_one() {
    check(
        Arc::new(ReduceSum { axes: vec![0, 1] }),
        vec![data(6, &[8, 33])],
    );
}

#[test]
fn an_outside_reshape_is_planned_as_the_core_one() {
    check(
        Arc::new(Reshape { shape: vec![6, 4] }),
        vec![data(7, &[4, 6])],
    );
}
