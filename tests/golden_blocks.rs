//! Golden test of the non-temporal blocks: every case of
//! `tests/golden_blocks/blocks.json` (recorded from brainstate 0.5.4 /
//! jax 0.10.2, the layers braintrace 0.2.6's `nn` forwards to, by
//! `scripts/golden_gen/generate_blocks.py`) — activations, PReLU,
//! LayerNorm/RmsNorm/GroupNorm, max and average pooling — is rebuilt from
//! `braintrace::nn` and its output and vector-Jacobian products (to the
//! input and to the parameters) are checked in f64 to 1e-12.

use braintrace::learn::{step_values, Model, ModelState};
use braintrace::nn::{Activation, GroupNorm, LayerNorm, PRelu, Pool1d, Pool2d, RmsNorm};
use braintrace::transform::grad;
use braintrace::{DType, Tensor};
use serde_json::Value;
use std::path::Path;

const TOL: f64 = 1e-12;

fn load() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_blocks/blocks.json");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap()
}

fn tensor(v: &Value) -> Tensor {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data: Vec<f64> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_f64().unwrap())
        .collect();
    Tensor::from_vec(data, &shape).unwrap()
}

fn f(spec: &Value, k: &str, default: f64) -> f64 {
    spec.get(k).and_then(Value::as_f64).unwrap_or(default)
}

/// The Rust activation of a case (brainstate's class and its non-default
/// hyperparameters).
fn activation(case: &Value) -> Activation {
    let class = case["class"].as_str().unwrap();
    let spec = &case["spec"];
    let name = class.trim_start_matches("jax.nn.");
    let base = Activation::by_name(name).unwrap_or_else(|| panic!("no activation `{name}`"));
    match base {
        Activation::Elu { .. } => Activation::Elu {
            alpha: f(spec, "alpha", 1.0),
        },
        Activation::Celu { .. } => Activation::Celu {
            alpha: f(spec, "alpha", 1.0),
        },
        Activation::Gelu { .. } => Activation::Gelu {
            approximate: spec
                .get("approximate")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        },
        Activation::LeakyRelu { .. } => Activation::LeakyRelu {
            negative_slope: f(spec, "negative_slope", 0.01),
        },
        Activation::Hardtanh { .. } => Activation::Hardtanh {
            min_val: f(spec, "min_val", -1.0),
            max_val: f(spec, "max_val", 1.0),
        },
        Activation::Hardshrink { .. } => Activation::Hardshrink {
            lambd: f(spec, "lambd", 0.5),
        },
        Activation::Softshrink { .. } => Activation::Softshrink {
            lambd: f(spec, "lambd", 0.5),
        },
        Activation::Squareplus { .. } => Activation::Squareplus {
            b: f(spec, "b", 4.0),
        },
        _ if class == "Threshold" => unreachable!(),
        other => other,
    }
}

/// A layer of a case, as a boxed model, and the Rust keys of its
/// parameters in the case's `params` order (leaf name → key).
fn layer(case: &Value) -> (Box<dyn Model>, Vec<(String, String)>) {
    let spec = &case["spec"];
    let u = |k: &str| spec[k].as_u64().unwrap() as usize;
    match case["kind"].as_str().unwrap() {
        "activation" if case["class"] == "Threshold" => (
            Box::new(Activation::Threshold {
                threshold: f(spec, "threshold", 0.0),
                value: f(spec, "value", 0.0),
            }),
            vec![],
        ),
        "activation" => (Box::new(activation(case)), vec![]),
        "prelu" => {
            let l = PRelu::new("act", u("num_parameters"));
            let key = l.weight_key();
            (Box::new(l), vec![("weight".into(), key)])
        }
        "norm" => {
            let leaves: Vec<String> = case["params"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            let (m, state): (Box<dyn Model>, String) = match case["class"].as_str().unwrap() {
                "LayerNorm" => {
                    let l = LayerNorm::new("norm", u("features")).with_eps(f(spec, "eps", 1e-6));
                    let s = l.state_path();
                    (Box::new(l), s)
                }
                "RMSNorm" => {
                    let l = RmsNorm::new("norm", u("features")).with_eps(f(spec, "eps", 1e-6));
                    let s = l.state_path();
                    (Box::new(l), s)
                }
                "GroupNorm" => {
                    let l = GroupNorm::new("norm", u("features"), u("num_groups"))
                        .with_eps(f(spec, "eps", 1e-6));
                    let s = l.state_path();
                    (Box::new(l), s)
                }
                c => panic!("norm class {c}"),
            };
            let keys = leaves
                .iter()
                .map(|l| (l.clone(), format!("{state}/{l}")))
                .collect();
            (m, keys)
        }
        "pool" => {
            let (k, s, p) = (u("kernel"), u("stride"), u("padding"));
            let class = case["class"].as_str().unwrap();
            let m: Box<dyn Model> = match class {
                "MaxPool1d" => Box::new(Pool1d::max([k]).with_stride([s]).with_padding(p)),
                "AvgPool1d" => Box::new(Pool1d::avg([k]).with_stride([s]).with_padding(p)),
                "MaxPool2d" => Box::new(Pool2d::max([k, k]).with_stride([s, s]).with_padding(p)),
                "AvgPool2d" => Box::new(Pool2d::avg([k, k]).with_stride([s, s]).with_padding(p)),
                c => panic!("pool class {c}"),
            };
            (m, vec![])
        }
        k => panic!("kind {k}"),
    }
}

/// Compare `got` with `want` element by element; a description of the first
/// mismatch.
fn compare(what: &str, got: &Tensor, want: &Tensor) -> Option<String> {
    if got.shape() != want.shape() {
        return Some(format!(
            "{what}: shape {:?} vs {:?}",
            got.shape(),
            want.shape()
        ));
    }
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if (a - b).abs().is_nan() || (a - b).abs() > TOL * (1.0 + b.abs()) {
            return Some(format!(
                "{what}[{i}]: {a} vs {b} (diff {:e})",
                (a - b).abs()
            ));
        }
    }
    None
}

/// Check one case with the input perturbed by a pattern of amplitude
/// `dx_shift` (0 for the real check): the mismatches found.
fn check_case(case: &Value, dx_shift: f64) -> Vec<String> {
    let name = case["name"].as_str().unwrap();
    let (model, keys) = layer(case);
    let x0 = tensor(&case["x"]);
    // A perturbation that is neither a shift nor a scale (softmax and the
    // norms are invariant to those).
    let bump: Vec<f64> = (0..x0.size())
        .map(|i| dx_shift * ((i * 7 % 5) as f64 - 2.0))
        .collect();
    let x = x0
        .add(&Tensor::from_vec(bump, x0.shape()).unwrap())
        .unwrap();
    let cot = tensor(&case["cot"]);
    let mut state = ModelState::new(model.as_ref(), DType::F64, 0, None).unwrap();
    for (leaf, key) in &keys {
        state
            .set_param(key, &tensor(&case["params"][leaf]))
            .unwrap();
    }
    let infos = state.param_infos().to_vec();
    let hinfos = state.hidden_infos().to_vec();
    let hvals = state.hidden_values().to_vec();
    let run = |a: &[Tensor]| -> braintrace::error::Result<Tensor> {
        // Parameters in declaration order; a[1..] holds those of `keys`.
        let mut vals = state.param_values().to_vec();
        for (j, (_, key)) in keys.iter().enumerate() {
            let i = infos.iter().position(|p| &p.key == key).unwrap();
            vals[i] = a[1 + j].clone();
        }
        Ok(step_values(model.as_ref(), &infos, &vals, &hinfos, &hvals, &a[0])?.0)
    };
    let mut args = vec![x.clone()];
    for (_, key) in &keys {
        args.push(state.param(key).unwrap().clone());
    }
    let mut bad = Vec::new();
    let y = run(&args).unwrap_or_else(|e| panic!("{name}: {e}"));
    bad.extend(compare(&format!("{name}: y"), &y, &tensor(&case["y"])));
    let g = grad(|a: &[Tensor]| run(a)?.mul(&cot)?.sum_all())(&args)
        .unwrap_or_else(|e| panic!("{name}: grad: {e}"));
    bad.extend(compare(&format!("{name}: dx"), &g[0], &tensor(&case["dx"])));
    for (j, (leaf, _)) in keys.iter().enumerate() {
        let want = tensor(&case["dparams"][leaf]);
        let got = g[1 + j].reshape(want.shape()).unwrap();
        bad.extend(compare(&format!("{name}: d{leaf}"), &got, &want));
    }
    bad
}

fn cases() -> Vec<Value> {
    load()["cases"].as_array().unwrap().clone()
}

#[test]
fn golden_blocks_cases() {
    let cases = cases();
    let mut per_kind = std::collections::BTreeMap::<String, usize>::new();
    let mut failures = Vec::new();
    for c in &cases {
        *per_kind
            .entry(c["kind"].as_str().unwrap().to_string())
            .or_default() += 1;
        failures.extend(check_case(c, 0.0));
    }
    println!("golden blocks: {} cases {per_kind:?}", cases.len());
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    assert!(
        failures.is_empty(),
        "golden blocks:\n{}",
        failures.join("\n")
    );
}

/// The check can fail: an input moved by ~1e-6 makes every case mismatch.
#[test]
fn golden_blocks_can_fail() {
    for c in &cases() {
        let bad = check_case(c, 1e-6);
        assert!(
            !bad.is_empty(),
            "{}: a shifted input still matched",
            c["name"]
        );
    }
}
