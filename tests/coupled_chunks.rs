//! The coupled Jacobian blocks of OSTL recurrent and SnAp-1 come from
//! vmapped JVPs over chunks of tangents (`learn/snap/jacobian.rs`: about
//! 2^19 tangent elements per chunk). A GRU of hidden 64 at batch 160 needs
//! two chunks (51 + 13 colours); at batch 80 one. The gradient of a mean
//! loss over 160 samples is the mean of the gradients over its two halves
//! of 80, so the chunked path is checked against the single-chunk one
//! (f64, 1e-10), and the check against one half alone must fail.

use braintrace::learn::{
    compile, Algorithm, ModelState, OstlRecurrent, Reduction, SnAp, TensorDict,
};
use braintrace::nn::GruCell;
use braintrace::{DType, Tensor};

const N_IN: usize = 3;
const HIDDEN: usize = 64;
const T: usize = 3;

fn data(shape: &[usize], seed: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| ((i as f64 + 1.0) * 0.7548776662 + seed).sin() * 0.5)
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn grads(algo: &Algorithm, xs: &Tensor, ys: &Tensor) -> TensorDict {
    let b = xs.shape()[1];
    let model = GruCell::new("rnn", N_IN, HIDDEN);
    let state = ModelState::new(&model, DType::F64, 5, Some(b)).unwrap();
    let x0 = Tensor::zeros(&[b, N_IN], DType::F64);
    let mut l = compile(model, state, algo.clone(), &x0, Some(b)).unwrap();
    l.etrace_grad(
        xs,
        ys,
        |o, y| o.sub(y)?.square()?.mean_all(),
        Reduction::Mean,
    )
    .unwrap()
    .grads
}

fn max_rel_diff(a: &TensorDict, b: &TensorDict) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst: f64 = 0.0;
    for (k, x) in a {
        let (x, y) = (x.to_vec_f64().unwrap(), b[k].to_vec_f64().unwrap());
        for (u, v) in x.iter().zip(&y) {
            worst = worst.max((u - v).abs() / (1e-3 + v.abs()));
        }
    }
    worst
}

fn check(algo: Algorithm) {
    let xs = data(&[T, 160, N_IN], 0.3);
    let ys = data(&[T, 160, HIDDEN], 1.1);
    let full = grads(&algo, &xs, &ys);
    let half = |lo: usize| {
        grads(
            &algo,
            &xs.slice_axis(1, lo, lo + 80).unwrap(),
            &ys.slice_axis(1, lo, lo + 80).unwrap(),
        )
    };
    let (a, b) = (half(0), half(80));
    let mean: TensorDict = a
        .iter()
        .map(|(k, t)| (k.clone(), t.add(&b[k]).unwrap().mul_scalar(0.5).unwrap()))
        .collect();
    let d = max_rel_diff(&full, &mean);
    assert!(d < 1e-10, "{}: chunked vs one chunk: {d}", algo.name());
    // The comparison can fail: one half alone is not the whole batch.
    assert!(max_rel_diff(&full, &a) > 1e-3, "{}", algo.name());
}

#[test]
fn ostl_recurrent_chunked_equals_one_chunk() {
    check(OstlRecurrent::default().into());
}

#[test]
fn snap1_chunked_equals_one_chunk() {
    check(SnAp::new(1).unwrap().into());
}
