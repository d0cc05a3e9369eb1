//! A learner on a pool of several threads under `threads::keep_awake` —
//! matrix products, fused element-wise loops and D-RTRL trace kernels split
//! across the threads — gives the same losses and gradients, bit for bit,
//! as on one thread, at sizes where every kind of split happens (hidden
//! 128, batch 64: products of 1.2 M multiply-adds, loops of 8 K elements;
//! hidden 512, batch 16: pp_prop's stores into its chunks).

mod learn_support;

use braintrace::learn::{compile, Algorithm, DRtrl, Model, ModelState, PpProp, Reduction};
use braintrace::prelude::*;
use learn_support::models::{GruNet, LifNet};
use learn_support::{draw, mse};

fn run<M: Model + Send>(
    model: impl Fn() -> M,
    algo: impl Fn() -> Algorithm,
    (t, b, n_in, n_out): (usize, usize, usize, usize),
    threads: usize,
) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    let xs = draw(&[t, b, n_in], 1).cast(DType::F32).unwrap();
    let ys = draw(&[t, b, n_out], 2).cast(DType::F32).unwrap();
    let state = ModelState::new(&model(), DType::F32, 3, Some(b)).unwrap();
    let x0 = Tensor::zeros(&[b, n_in], DType::F32);
    let mut learner = compile(model(), state, algo(), &x0, Some(b)).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    // Two calls: the second starts from the first's state.
    let mut losses = Vec::new();
    let mut grads = Vec::new();
    for _ in 0..2 {
        let out = pool.install(|| {
            braintrace::threads::keep_awake(|| learner.etrace_grad(&xs, &ys, mse, Reduction::Mean))
        });
        let out = out.unwrap();
        losses.extend(out.losses.to_vec_f64().unwrap());
        grads.extend(
            out.grads
                .iter()
                .map(|(k, v)| (k.clone(), v.to_vec_f64().unwrap())),
        );
    }
    (losses, grads)
}

fn same_bits<M: Model + Send>(
    what: &str,
    model: impl Fn() -> M,
    algo: impl Fn() -> Algorithm,
    dims: (usize, usize, usize, usize),
) {
    let (l1, g1) = run(&model, &algo, dims, 1);
    for threads in [2, 3] {
        let (l, g) = run(&model, &algo, dims, threads);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&l), bits(&l1), "{what}, {threads} threads: losses");
        assert_eq!(g.len(), g1.len());
        for ((k, v), (k1, v1)) in g.iter().zip(&g1) {
            assert_eq!(k, k1);
            assert_eq!(bits(v), bits(v1), "{what}, {threads} threads: {k}");
        }
    }
}

#[test]
fn gru_pp_prop_on_several_threads_gives_the_bits_of_one() {
    same_bits(
        "gru pp_prop",
        || GruNet::new(16, 128, 4),
        || PpProp::new(0.95).unwrap().into(),
        (5, 64, 16, 4),
    );
}

/// pp_prop gathering chunks (hidden 512, batch 16: 520-row chunks), where
/// each step's stores into the chunk are shared between two threads.
#[test]
fn gru_pp_prop_chunks_on_several_threads_give_the_bits_of_one() {
    same_bits(
        "gru pp_prop chunks",
        || GruNet::new(16, 512, 4),
        || PpProp::new(0.95).unwrap().into(),
        (4, 16, 16, 4),
    );
}

#[test]
fn gru_d_rtrl_on_several_threads_gives_the_bits_of_one() {
    same_bits(
        "gru d_rtrl",
        || GruNet::new(16, 128, 4),
        || DRtrl::default().into(),
        (3, 64, 16, 4),
    );
}

#[test]
fn lif_pp_prop_on_several_threads_gives_the_bits_of_one() {
    same_bits(
        "lif pp_prop",
        || LifNet::new(16, 128, 4, 0.9, 0.8, 1.0, 0.9),
        || PpProp::new(0.95).unwrap().into(),
        (5, 64, 16, 4),
    );
}

/// Two learners under `keep_awake` at once on one pool (each one's
/// spinner may run the other's work): both finish, with the bits of one
/// thread.
#[test]
fn two_learners_kept_awake_at_once_on_one_pool() {
    let dims = (3, 64, 16, 4);
    let (t, b, n_in, n_out) = dims;
    let want = run(
        || GruNet::new(n_in, 128, n_out),
        || PpProp::new(0.95).unwrap().into(),
        dims,
        1,
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let xs = draw(&[t, b, n_in], 1).cast(DType::F32).unwrap();
    let ys = draw(&[t, b, n_out], 2).cast(DType::F32).unwrap();
    let learner = || {
        let state =
            ModelState::new(&GruNet::new(n_in, 128, n_out), DType::F32, 3, Some(b)).unwrap();
        let x0 = Tensor::zeros(&[b, n_in], DType::F32);
        compile(
            GruNet::new(n_in, 128, n_out),
            state,
            PpProp::new(0.95).unwrap(),
            &x0,
            Some(b),
        )
        .unwrap()
    };
    let (mut l1, mut l2) = (learner(), learner());
    let call = |l: &mut braintrace::learn::Learner<GruNet>| {
        braintrace::threads::keep_awake(|| l.etrace_grad(&xs, &ys, mse, Reduction::Mean))
            .unwrap()
            .losses
            .to_vec_f64()
            .unwrap()
    };
    let (a, c) = pool.install(|| rayon::join(|| call(&mut l1), || call(&mut l2)));
    let first: Vec<f64> = want.0[..t].to_vec();
    assert_eq!(a, first);
    assert_eq!(c, first);
}
