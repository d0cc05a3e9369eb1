//! EProp, OSTLRecurrent, OSTLFeedforward and ThreeFactor against braintrace
//! 0.2.6: every `eprop__*`, `ostl_recurrent__*`, `ostl_feedforward__*` and
//! `three_factor__*` case of `tests/golden_algos` (recorded by
//! `scripts/golden_gen/generate_algos_a.py` on the GRU and LIF nets and the
//! MGU and LSTM cells) is checked field by field to 1e-9 by the e2e checker
//! (`tests/learn_support/e2e.rs`); EProp's random feedback runs on the
//! matrices braintrace drew, exported in the case. Then the algorithms'
//! identities (EProp with κ = 0 and symmetric feedback is D-RTRL, OSTL
//! feedforward is pp_prop at its decay), fused against unfused traces, and
//! bad input.

mod learn_support;

use braintrace::learn::{
    compile, Algorithm, DRtrl, EProp, Feedback, Model, ModelState, NonTemporal, OstlFeedforward,
    OstlRecurrent, PpProp, Reduction, TensorDict, ThreeFactor, VjpMethod,
};
use braintrace::{DType, Error, Tensor};
use learn_support::e2e::{array, check_files, Algorithms};
use learn_support::models::{GruNet, LifNet};
use learn_support::{draw, mse};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

const PREFIXES: [&str; 4] = [
    "eprop",
    "ostl_recurrent",
    "ostl_feedforward",
    "three_factor",
];

type R<T> = std::result::Result<T, String>;

fn num(o: &Map<String, Value>, k: &str) -> R<Option<f64>> {
    o.get(k)
        .map(|v| v.as_f64().ok_or_else(|| format!("{k}: not a number")))
        .transpose()
}

/// The case's algorithm, with braintrace's zero gradients for parameters
/// without a relation.
fn resolve(
    class: &str,
    opts: &Map<String, Value>,
    vjp: VjpMethod,
    case: &Map<String, Value>,
) -> Option<R<Algorithm>> {
    let e = |e: Error| e.to_string();
    let zero = NonTemporal::Zero;
    Some((|| -> R<Algorithm> {
        Ok(match class {
            "EProp" => {
                let mut a = EProp::new()
                    .kappa(num(opts, "kappa_filter_decay")?.unwrap_or(0.0))
                    .map_err(e)?;
                match opts.get("feedback").and_then(Value::as_str) {
                    None | Some("symmetric") => {}
                    Some("random") => {
                        let ms = case
                            .get("feedback_matrices")
                            .and_then(Value::as_object)
                            .ok_or("random feedback without feedback_matrices")?;
                        let ms = ms
                            .iter()
                            .map(|(g, b)| {
                                let g: usize = g.parse().map_err(|_| format!("group {g}"))?;
                                Ok((g, array(b, "feedback_matrices")?))
                            })
                            .collect::<R<Vec<_>>>()?;
                        a = a.feedback(Feedback::Matrices(ms));
                    }
                    Some(f) => return Err(format!("feedback {f}")),
                }
                a.vjp_method(vjp).non_temporal(zero).into()
            }
            "OSTLRecurrent" => OstlRecurrent::default()
                .vjp_method(vjp)
                .non_temporal(zero)
                .into(),
            "OSTLFeedforward" => match num(opts, "decay_or_rank")? {
                Some(d) => OstlFeedforward::decay(d).map_err(e)?,
                None => OstlFeedforward::default(),
            }
            .vjp_method(vjp)
            .non_temporal(zero)
            .into(),
            "ThreeFactor" => {
                let m = num(opts, "modulator")?.ok_or("ThreeFactor without modulator")?;
                ThreeFactor::new(m).map_err(e)?.non_temporal(zero).into()
            }
            other => return Err(format!("not an algos-a class: {other}")),
        })
    })())
}

#[test]
fn golden_algos_a_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_algos");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("golden algos: {}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.ends_with(".json") && PREFIXES.iter().any(|p| n.starts_with(&format!("{p}__")))
        })
        .collect();
    names.sort();
    let algos = Algorithms {
        resolve: Some(&resolve),
        option_keys: &[
            "kappa_filter_decay",
            "feedback",
            "random_feedback_seed",
            "modulator",
        ],
        case_keys: &["feedback_matrices"],
    };
    let mut per: BTreeMap<(String, String), usize> = BTreeMap::new();
    for name in &names {
        let mut parts = name.split("__");
        let (algo, model) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        *per.entry((algo.into(), model.into())).or_default() += 1;
    }
    let failures = check_files(&dir, &names, &algos);
    // Every algorithm on the GRU, the LIF net and two zoo cells.
    for p in PREFIXES {
        for m in ["gru", "lif", "zoo_mgu", "zoo_lstm"] {
            assert!(
                per.get(&(p.to_string(), m.to_string()))
                    .copied()
                    .unwrap_or(0)
                    >= 1,
                "golden algos: no `{p}` case on `{m}`"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "golden algos:\n{}",
        failures.join("\n")
    );
}

/// One `etrace_grad` of `algo` on `model` (batch 2, 6 steps, drawn data).
fn grads<M: Model>(model: M, algo: impl Into<Algorithm>, n_in: usize, n_out: usize) -> TensorDict {
    let state = ModelState::new(&model, DType::F64, 3, Some(2)).unwrap();
    let x0 = Tensor::zeros(&[2, n_in], DType::F64);
    let mut l = compile(model, state, algo, &x0, Some(2)).unwrap();
    l.etrace_grad(
        &draw(&[6, 2, n_in], 11),
        &draw(&[6, 2, n_out], 12),
        mse,
        Reduction::Mean,
    )
    .unwrap()
    .grads
}

fn assert_close(a: &TensorDict, b: &TensorDict, tol: f64) {
    assert_eq!(a.len(), b.len());
    for (k, x) in a {
        let (x, y) = (x.to_vec_f64().unwrap(), b[k].to_vec_f64().unwrap());
        for (u, v) in x.iter().zip(&y) {
            assert!((u - v).abs() <= tol * (1.0 + v.abs()), "{k}: {u} vs {v}");
        }
    }
}

fn gru() -> GruNet {
    GruNet::new(3, 5, 2)
}

#[test]
fn eprop_without_filter_and_feedback_is_d_rtrl() {
    let a = grads(gru(), EProp::new(), 3, 2);
    let b = grads(gru(), DRtrl::default(), 3, 2);
    assert_close(&a, &b, 0.0);
    // The filter changes the recurrent weights' gradients.
    let c = grads(gru(), EProp::new().kappa(0.5).unwrap(), 3, 2);
    let (x, y) = (&c["rnn/Wz/weight/weight"], &b["rnn/Wz/weight/weight"]);
    assert_ne!(x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
}

#[test]
fn ostl_feedforward_is_pp_prop_at_its_decay() {
    let a = grads(gru(), OstlFeedforward::decay(0.4).unwrap(), 3, 2);
    let b = grads(gru(), PpProp::new(0.4).unwrap(), 3, 2);
    assert_close(&a, &b, 0.0);
}

#[test]
fn fused_and_unfused_traces_agree() {
    let fb = || Feedback::Random { seed: 9 };
    let a = grads(gru(), EProp::new().feedback(fb()), 3, 2);
    let b = grads(gru(), EProp::new().feedback(fb()).fast_paths(false), 3, 2);
    assert_close(&a, &b, 1e-12);
    let a = grads(gru(), OstlRecurrent::default(), 3, 2);
    let b = grads(gru(), OstlRecurrent::default().fast_paths(false), 3, 2);
    assert_close(&a, &b, 1e-12);
    let lif = || LifNet::new(3, 4, 2, 0.8, 0.6, 1.0, 0.8);
    let a = grads(lif(), ThreeFactor::new(0.3).unwrap(), 3, 2);
    let b = grads(
        lif(),
        ThreeFactor::new(0.3).unwrap().fast_paths(false),
        3,
        2,
    );
    assert_close(&a, &b, 1e-12);
}

#[test]
fn the_modulator_is_read_at_every_call() {
    let tf = ThreeFactor::new(1.0)
        .unwrap()
        .non_temporal(NonTemporal::Zero);
    let model = gru();
    let state = ModelState::new(&model, DType::F64, 3, Some(2)).unwrap();
    let mut l = compile(
        model,
        state,
        tf.clone(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap();
    let (xs, ys) = (draw(&[4, 2, 3], 1), draw(&[4, 2, 2], 2));
    let g1 = l.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap().grads;
    l.reset_state(Some(2)).unwrap();
    tf.set_modulator(-2.5).unwrap();
    let g2 = l.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap().grads;
    // The signal is the modulator, so the gradients scale with it, and the
    // second call reused the first call's staged program.
    assert_eq!(l.step_traces(), 1);
    for (k, a) in &g1 {
        let (a, b) = (a.to_vec_f64().unwrap(), g2[k].to_vec_f64().unwrap());
        for (u, v) in a.iter().zip(&b) {
            assert!(
                (-2.5 * u - v).abs() <= 1e-12 * (1.0 + v.abs()),
                "{k}: {u} {v}"
            );
        }
    }
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    // A feedback matrix of the wrong shape (the GRU's group is 5 wide).
    let model = gru();
    let state = ModelState::new(&model, DType::F64, 3, Some(2)).unwrap();
    let wrong = EProp::new().feedback(Feedback::Matrices(vec![(
        0,
        Tensor::zeros(&[4, 5], DType::F64),
    )]));
    let x0 = Tensor::zeros(&[2, 3], DType::F64);
    let e = compile(model, state, wrong, &x0, Some(2))
        .err()
        .expect("an error");
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let s = e.to_string();
    assert!(
        s.contains("feedback_matrix") && s.contains("[4, 5]") && s.contains("(5, 5)"),
        "{s}"
    );
    // A group without relation, and a missing matrix.
    for ms in [vec![(3, Tensor::zeros(&[5, 5], DType::F64))], vec![]] {
        let model = gru();
        let state = ModelState::new(&model, DType::F64, 3, Some(2)).unwrap();
        let e = compile(
            model,
            state,
            EProp::new().feedback(Feedback::Matrices(ms)),
            &x0,
            Some(2),
        )
        .err()
        .expect("an error");
        assert!(
            matches!(e, Error::Invalid { .. }) && e.to_string().contains("feedback_matrix"),
            "{e}"
        );
    }
    // κ outside [0, 1); the configuration is unchanged.
    let ok = EProp::new().kappa(0.5).unwrap();
    for k in [1.0, -0.1, f64::NAN, 2.0] {
        let e = ok.clone().kappa(k).unwrap_err();
        assert!(e.to_string().contains("kappa_filter_decay"), "{e}");
    }
    assert_eq!(ok.kappa, 0.5);
    // An unknown name lists the known ones.
    let e = Algorithm::by_name("ostl").unwrap_err().to_string();
    assert!(
        e.contains("ostl_recurrent")
            && e.contains("ostl_feedforward")
            && e.contains("three_factor"),
        "{e}"
    );
    // A modulator that is not finite leaves the standing one.
    let tf = ThreeFactor::new(0.5).unwrap();
    assert!(tf.set_modulator(f64::INFINITY).is_err());
    assert_eq!(tf.modulator(), 0.5);
    assert!(ThreeFactor::new(f64::NAN).is_err());
    assert!(OstlFeedforward::decay(1.0).is_err());
}
