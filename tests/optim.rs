//! The optimisers `Sgd` and `Adam` and `clip_grad_norm` over path-keyed
//! parameters, against the textbook updates written out element by element
//! in the test (plain `f64` loops, no library code).

#[path = "common/fixtures.rs"]
mod fixtures;

use braintrace::learn::{ModelState, TensorDict};
use braintrace::nn::optim::{clip_grad_norm, Adam, Optimizer, Sgd};
use braintrace::nn::Linear;
use braintrace::{DType, Tensor};
use fixtures::det_vec;

fn dict(entries: &[(&str, Vec<f64>, &[usize])]) -> TensorDict {
    entries
        .iter()
        .map(|(k, v, s)| (k.to_string(), Tensor::from_vec(v.clone(), s).unwrap()))
        .collect()
}

fn vals(d: &TensorDict, k: &str) -> Vec<f64> {
    d[k].to_vec_f64().unwrap()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}"
        );
    }
}

/// Parameters `a` (2×3) and `b` (3,) and three rounds of gradients for them.
fn problem() -> (TensorDict, Vec<TensorDict>) {
    let params = dict(&[
        ("layer/a", det_vec(6, 1, 1.0), &[2, 3]),
        ("layer/b", det_vec(3, 2, 1.0), &[3]),
    ]);
    let grads = (0..3)
        .map(|r| {
            dict(&[
                ("layer/a", det_vec(6, 10 + r, 0.5), &[2, 3]),
                ("layer/b", det_vec(3, 20 + r, 0.5), &[3]),
            ])
        })
        .collect();
    (params, grads)
}

#[test]
fn sgd_plain_is_p_minus_lr_g() {
    let (params, grads) = problem();
    let mut opt = Sgd::new(0.1).unwrap();
    let new = opt.update(&params, &grads[0]).unwrap();
    for k in ["layer/a", "layer/b"] {
        let want: Vec<f64> = vals(&params, k)
            .iter()
            .zip(vals(&grads[0], k))
            .map(|(p, g)| p - 0.1 * g)
            .collect();
        assert_close(&vals(&new, k), &want, 1e-15);
    }
}

#[test]
fn sgd_momentum_and_weight_decay_follow_the_textbook_over_three_steps() {
    let (mut params, grads) = problem();
    let (lr, mu, wd) = (0.05, 0.9, 0.01);
    let mut opt = Sgd::new(lr)
        .unwrap()
        .momentum(mu)
        .unwrap()
        .weight_decay(wd)
        .unwrap();
    let mut p_ref: Vec<Vec<f64>> = ["layer/a", "layer/b"]
        .iter()
        .map(|k| vals(&params, k))
        .collect();
    let mut v_ref: Vec<Vec<f64>> = p_ref.iter().map(|p| vec![0.0; p.len()]).collect();
    for (step, g) in grads.iter().enumerate() {
        params = opt.update(&params, g).unwrap();
        for (j, k) in ["layer/a", "layer/b"].iter().enumerate() {
            let gk = vals(g, k);
            for i in 0..gk.len() {
                let gi = gk[i] + wd * p_ref[j][i];
                // the first step starts the velocity at the gradient (torch's convention)
                v_ref[j][i] = if step == 0 { gi } else { mu * v_ref[j][i] + gi };
                p_ref[j][i] -= lr * v_ref[j][i];
            }
            assert_close(&vals(&params, k), &p_ref[j], 1e-14);
        }
    }
}

#[test]
fn adam_follows_the_textbook_over_three_steps() {
    let (mut params, grads) = problem();
    let (lr, b1, b2, eps) = (0.01, 0.8, 0.95, 1e-6);
    let mut opt = Adam::new(lr)
        .unwrap()
        .betas(b1, b2)
        .unwrap()
        .eps(eps)
        .unwrap();
    let keys = ["layer/a", "layer/b"];
    let mut p_ref: Vec<Vec<f64>> = keys.iter().map(|k| vals(&params, k)).collect();
    let mut m: Vec<Vec<f64>> = p_ref.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v = m.clone();
    for (t0, g) in grads.iter().enumerate() {
        let t = (t0 + 1) as i32;
        params = opt.update(&params, g).unwrap();
        for (j, k) in keys.iter().enumerate() {
            let gk = vals(g, k);
            for i in 0..gk.len() {
                m[j][i] = b1 * m[j][i] + (1.0 - b1) * gk[i];
                v[j][i] = b2 * v[j][i] + (1.0 - b2) * gk[i] * gk[i];
                let m_hat = m[j][i] / (1.0 - b1.powi(t));
                let v_hat = v[j][i] / (1.0 - b2.powi(t));
                p_ref[j][i] -= lr * m_hat / (v_hat.sqrt() + eps);
            }
            assert_close(&vals(&params, k), &p_ref[j], 1e-13);
            assert_eq!(opt.steps(k), t as u64);
        }
    }
}

#[test]
fn adam_leaves_parameters_without_gradient_alone_and_counts_steps_per_key() {
    let (params, grads) = problem();
    let mut opt = Adam::new(0.1).unwrap();
    let only_a: TensorDict = grads[0]
        .iter()
        .filter(|(k, _)| k.as_str() == "layer/a")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let new = opt.update(&params, &only_a).unwrap();
    assert_eq!(vals(&new, "layer/b"), vals(&params, "layer/b"));
    assert_eq!(opt.steps("layer/a"), 1);
    assert_eq!(opt.steps("layer/b"), 0);
    // `b`'s first step gets the first-step bias correction: |Δ| = lr·|g|/(|g| + ε) ≈ lr.
    let new2 = opt.update(&new, &grads[1]).unwrap();
    let d: Vec<f64> = vals(&new2, "layer/b")
        .iter()
        .zip(vals(&new, "layer/b"))
        .map(|(a, b)| (a - b).abs())
        .collect();
    assert_close(&d, &[0.1; 3], 1e-6);
    assert_eq!(opt.steps("layer/a"), 2);
}

#[test]
fn optimisers_keep_f32_parameters_f32() {
    let p: TensorDict = [(
        "w".to_string(),
        Tensor::from_vec(vec![1.0, 2.0], &[2])
            .unwrap()
            .cast(DType::F32)
            .unwrap(),
    )]
    .into();
    let g = dict(&[("w", vec![0.5, -0.5], &[2])]); // f64 gradient is cast
    let a = Adam::new(0.1).unwrap().update(&p, &g).unwrap();
    let s = Sgd::new(0.1).unwrap().update(&p, &g).unwrap();
    assert_eq!(a["w"].dtype(), DType::F32);
    assert_eq!(s["w"].dtype(), DType::F32);
    assert_close(&vals(&s, "w"), &[0.95, 2.05], 1e-7);
}

#[test]
fn unknown_gradient_key_is_an_error_naming_it_and_changes_nothing() {
    let (params, grads) = problem();
    let mut opt = Adam::new(0.1).unwrap();
    let mut bad = grads[0].clone();
    bad.insert("layer/c".into(), Tensor::zeros(&[3], DType::F64));
    let e = opt.update(&params, &bad).unwrap_err().to_string();
    assert!(e.contains("Adam") && e.contains("layer/c"), "{e}");
    assert_eq!(opt.steps("layer/a"), 0, "a failed update must not count");
}

#[test]
fn gradient_of_wrong_shape_is_an_error_naming_both_shapes() {
    let (params, _) = problem();
    let bad = dict(&[("layer/b", vec![1.0, 2.0], &[2])]);
    let e = Sgd::new(0.1)
        .unwrap()
        .update(&params, &bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Sgd") && e.contains("[3]") && e.contains("[2]"),
        "{e}"
    );
}

#[test]
fn invalid_hyperparameters_are_errors_when_given() {
    fn bad<T: std::fmt::Debug>(r: braintrace::Result<T>, who: &str, what: &str) {
        let e = r.unwrap_err().to_string();
        assert!(e.starts_with(who) && e.contains(what), "{e}");
    }
    for lr in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        bad(Sgd::new(lr), "Sgd", "learning rate");
        bad(Adam::new(lr), "Adam", "learning rate");
    }
    for mu in [1.0, -0.1, f64::NAN] {
        bad(Sgd::new(0.1).unwrap().momentum(mu), "Sgd", "momentum");
    }
    for wd in [-0.1, f64::NAN, f64::INFINITY] {
        bad(
            Sgd::new(0.1).unwrap().weight_decay(wd),
            "Sgd",
            "weight_decay",
        );
    }
    bad(Adam::new(0.1).unwrap().betas(0.9, 1.0), "Adam", "beta2");
    bad(
        Adam::new(0.1).unwrap().betas(f64::NAN, 0.9),
        "Adam",
        "beta1",
    );
    bad(Adam::new(0.1).unwrap().eps(0.0), "Adam", "eps");
    bad(Adam::new(0.1).unwrap().eps(f64::INFINITY), "Adam", "eps");
    // The fields are public: a value set there is refused at the update,
    // before anything changes.
    let (params, grads) = problem();
    let mut opt = Adam::new(0.1).unwrap();
    opt.lr = f64::NAN;
    bad(opt.update(&params, &grads[0]), "Adam", "learning rate");
    assert_eq!(opt.steps("layer/a"), 0);
}

#[test]
fn clip_grad_norm_scales_to_the_global_norm() {
    let g = dict(&[("a", vec![3.0, 0.0], &[2]), ("b", vec![4.0], &[1])]);
    let (same, n) = clip_grad_norm(&g, 10.0).unwrap();
    assert!((n - 5.0).abs() < 1e-12);
    assert_eq!(vals(&same, "a"), vec![3.0, 0.0]);
    let (c, n) = clip_grad_norm(&g, 1.0).unwrap();
    assert!((n - 5.0).abs() < 1e-12);
    assert_close(&vals(&c, "a"), &[0.6, 0.0], 1e-15);
    assert_close(&vals(&c, "b"), &[0.8], 1e-15);
    assert!(clip_grad_norm(&g, 0.0).is_err());
}

#[test]
fn clip_grad_norm_refuses_a_nan_gradient() {
    let g = dict(&[("a", vec![1.0, f64::NAN], &[2]), ("b", vec![4.0], &[1])]);
    let e = clip_grad_norm(&g, 1.0).unwrap_err().to_string();
    assert!(e.contains("clip_grad_norm") && e.contains("NaN"), "{e}");
}

#[test]
fn step_updates_a_model_state_in_place() {
    let model = Linear::new("lin", 3, 2);
    let mut state = ModelState::new(&model, DType::F64, 3, None).unwrap();
    let before = state.params();
    let grads: TensorDict = before
        .iter()
        .map(|(k, v)| (k.clone(), v.ones_like()))
        .collect();
    Sgd::new(0.5).unwrap().step(&mut state, &grads).unwrap();
    for (k, v) in &before {
        let want: Vec<f64> = v.to_vec_f64().unwrap().iter().map(|x| x - 0.5).collect();
        assert_close(&state.param(k).unwrap().to_vec_f64().unwrap(), &want, 1e-15);
    }
}
