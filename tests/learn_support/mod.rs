//! Support for the online-learning tests: the golden models and the
//! end-to-end golden case checker.

#![allow(dead_code)]

pub mod driver_golden;
pub mod e2e;
pub mod gprims;
pub mod models;
pub mod snn_models;
pub mod wlayers;
pub mod zoo;

use braintrace::learn::{compile, Algorithm, Learner, Model, ModelState, Reduction, TensorDict};
use braintrace::nn::{Initializer, Rng};
use braintrace::{DType, Result, Tensor};
use serde_json::{Map, Value};

/// Standard-normal f64 values of `shape`, from `seed`.
pub fn draw(shape: &[usize], seed: u64) -> Tensor {
    Initializer::Normal { std: 1.0 }
        .draw(shape, DType::F64, &mut Rng::seed(seed))
        .unwrap()
}

/// Mean squared error.
pub fn mse(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

/// Field `k` of a golden case's object, or a "missing" failure.
pub fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Checked<&'a Value> {
    o.get(k).ok_or_else(|| format!("missing `{k}`"))
}

/// A golden case's `dims`: `n_in`, `n_rec`, `n_out`, `B`.
pub type Dims = (usize, usize, usize, usize);

/// A result whose error is a golden checker's failure text.
pub type Checked<T> = std::result::Result<T, String>;

/// A case's [`Dims`], and a reader of its `hyperparams` by name.
pub fn dims_and_hyperparams(
    o: &Map<String, Value>,
) -> Checked<(Dims, impl Fn(&str) -> Checked<f64> + '_)> {
    let dims = get(o, "dims")?.as_object().ok_or("dims")?;
    let d = |k: &str| -> Checked<usize> {
        get(dims, k)?
            .as_u64()
            .map(|u| u as usize)
            .ok_or(format!("dims.{k}"))
    };
    let dims = (d("n_in")?, d("n_rec")?, d("n_out")?, d("B")?);
    let hp = get(o, "hyperparams")?.as_object().ok_or("hyperparams")?;
    let h =
        move |k: &str| -> Checked<f64> { get(hp, k)?.as_f64().ok_or(format!("hyperparams.{k}")) };
    Ok((dims, h))
}

/// A failure for each field of `o` not among `keys`.
pub fn known(o: &Map<String, Value>, what: &str, keys: &[&str], fails: &mut Vec<String>) {
    for k in o.keys() {
        if !keys.contains(&k.as_str()) {
            fails.push(format!("{what}: unknown field `{k}`"));
        }
    }
}

/// Compile `make()` with `algo()` in f32 and in f64 (state seed 4, example
/// input of `x_shape`), run one `etrace_grad` over `steps` drawn steps
/// (inputs seed 1, targets seed 2, MSE), and check the f32 gradients
/// against the f64 ones ([`assert_f32_matches_f64`]). `check` sees each
/// compiled learner first.
pub fn assert_learner_f32_matches_f64<M: Model>(
    make: impl Fn() -> M,
    algo: impl Fn() -> Algorithm,
    batch: Option<usize>,
    steps: usize,
    (x_shape, y_shape): (&[usize], &[usize]),
    check: impl Fn(&Learner<M>),
) {
    let run = |dt: DType| {
        let model = make();
        let state = ModelState::new(&model, dt, 4, batch).unwrap();
        let mut l = compile(model, state, algo(), &Tensor::zeros(x_shape, dt), batch).unwrap();
        check(&l);
        l.etrace_grad(
            &draw(&[&[steps], x_shape].concat(), 1),
            &draw(&[&[steps], y_shape].concat(), 2),
            mse,
            Reduction::Mean,
        )
        .unwrap()
        .grads
    };
    let (a, b) = (run(DType::F32), run(DType::F64));
    assert_f32_matches_f64(&a, &b);
}

/// `f32` gradients (`a`) agree with `f64` ones (`b`) of the same run: the
/// same keys' values, f32, within 1e-5 of the largest `f64` entry (f32
/// rounding over a few steps of a small model).
pub fn assert_f32_matches_f64(a: &TensorDict, b: &TensorDict) {
    for (k, g) in b {
        assert_eq!(a[k].dtype(), DType::F32);
        let (x, y) = (a[k].to_vec_f64().unwrap(), g.to_vec_f64().unwrap());
        let scale = y.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (u, v) in x.iter().zip(&y) {
            assert!((u - v).abs() <= 1e-5 * scale, "{k}: f32 {u} vs f64 {v}");
        }
    }
}
