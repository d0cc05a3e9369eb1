//! Behaviour of macro-defined primitives: the seed's `scale * (x @ w)`
//! written with `#[etp_primitive]` and its companions, checked for values,
//! transforms, registries, spec identity, the rule checker, companions in
//! another module, several trainables, a gradient-enabled identity, a
//! batched counterpart, the optional rule overrides, and duplicate names.

#[path = "common/fixtures.rs"]
mod fixtures;

use braintrace::etp::{
    all_primitives, registration_errors, ETP_RULES_INSTANT_DRTRL, ETP_RULES_SOLVE_DRTRL,
};
use braintrace::prelude::*;
use braintrace_macros::solve_drtrl;
use fixtures::det as det_scaled;
use std::sync::Arc;

// ------------------------------------------------------------ the seed's op

/// y = scale * (x @ w)
#[etp_primitive(name = "etp_scaled_mm", batched, x = x, weight = w)]
fn scaled_mm(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

/// `xᵀ h` for a batch (`x (B, I)`, `h (B, O)`) or one sample (`x (I,)`, `h (O,)`).
fn outer(x: &Tensor, h: &Tensor) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?.matmul(&h.expand_dims(0)?)
    } else {
        x.transpose(&[1, 0])?.matmul(h)
    }
}

/// `trace[..., i, o] * h[..., o]`.
fn spread(trace: &Tensor, hidden: &Tensor) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}

#[yw_to_w(scaled_mm)]
fn scaled_mm_yw_to_w(hidden: &Tensor, trace: &Tensor, _p: &scaled_mm::Params) -> Result<Tensor> {
    spread(trace, hidden)
}

#[xy_to_dw(scaled_mm)]
fn scaled_mm_xy_to_dw(
    x: &Tensor,
    hidden: &Tensor,
    _w: &Tensor,
    p: &scaled_mm::Params,
) -> Result<Tensor> {
    outer(x, hidden)?.mul_scalar(p.scale)
}

#[init_drtrl(scaled_mm)]
fn scaled_mm_init_drtrl(_x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    let lead = &y.shape()[..y.shape().len() - 1];
    let shape: Vec<usize> = lead
        .iter()
        .chain(w.shape())
        .copied()
        .chain([num_hidden_state])
        .collect();
    Ok(Tensor::zeros(&shape, y.dtype()))
}

#[init_pp(scaled_mm)]
fn scaled_mm_init_pp(_x: &Aval, y: &Aval, _w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    let shape: Vec<usize> = y
        .shape()
        .iter()
        .copied()
        .chain([num_hidden_state])
        .collect();
    Ok(Tensor::zeros(&shape, y.dtype()))
}

// ------------------------------------ an unbatched op, rules in another module

/// y = scale * (x @ w) for one sample; under `vmap` over `x` it becomes
/// `etp_scaled_mm`.
#[etp_primitive(name = "etp_scaled_mv", counterpart = scaled_mm)]
pub fn scaled_mv(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

mod mv_rules {
    use super::{outer, spread};
    use braintrace::prelude::*;

    #[yw_to_w(super::scaled_mv)]
    fn yw(hidden: &Tensor, trace: &Tensor, _p: &super::scaled_mv::Params) -> Result<Tensor> {
        spread(trace, hidden)
    }

    #[xy_to_dw(crate::scaled_mv)]
    fn xy(
        x: &Tensor,
        hidden: &Tensor,
        _w: &Tensor,
        p: &crate::scaled_mv::Params,
    ) -> Result<Tensor> {
        outer(x, hidden)?.mul_scalar(p.scale)
    }

    #[init_drtrl(super::scaled_mv)]
    fn drtrl(_x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
    }

    #[init_pp(super::scaled_mv)]
    fn pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
    }
}

// ------------------------------------------------ several trainables

/// y = x @ weight + bias, x `(I,)`.
#[etp_primitive(name = "etp_test_linear", weight = [weight, bias])]
fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}

fn linear_spread(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    out.insert("weight".into(), spread(&trace["weight"], hidden)?);
    out.insert("bias".into(), trace["bias"].mul(hidden)?);
    Ok(out)
}

#[yw_to_w(linear)]
fn linear_yw_to_w(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    linear_spread(hidden, trace)
}

#[xy_to_dw(linear)]
fn linear_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    out.insert("weight".into(), outer(x, hidden)?);
    out.insert("bias".into(), hidden.clone());
    Ok(out)
}

#[init_drtrl(linear)]
fn linear_init_drtrl(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    Ok(w.iter()
        .map(|(k, a)| {
            (
                k.clone(),
                Tensor::zeros(&[a.shape(), &[n]].concat(), y.dtype()),
            )
        })
        .collect())
}

#[init_pp(linear)]
fn linear_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

/// The optional solve override, written out (equal to the default).
#[solve_drtrl(linear)]
fn linear_solve(g: &Tensor, trace: &TensorMap, _w: &TensorMap) -> Result<TensorMap> {
    linear_spread(g, trace)
}

// ------------------------------------------------ gradient-enabled identity

/// y = w (an identity marker the compiler's y -> h walk may pass through).
#[etp_primitive(name = "etp_test_identity", gradient_enabled, x = none, weight = w)]
fn identity(w: &Tensor) -> Result<Tensor> {
    w.mul_scalar(1.0)
}

#[yw_to_w(identity)]
fn identity_yw_to_w(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    trace.mul(hidden)
}

#[xy_to_dw(identity)]
fn identity_xy_to_dw(_x: Option<&Tensor>, hidden: &Tensor, _w: &Tensor) -> Result<Tensor> {
    Ok(hidden.clone())
}

#[init_drtrl(identity)]
fn identity_init_drtrl(_x: Option<&Aval>, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
}

#[init_pp(identity)]
fn identity_init_pp(_x: Option<&Aval>, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

// ------------------------------------------------ never called by any test

/// Only ever looked up by name: proves the registries collect macro-defined
/// primitives before user code touches them.
#[etp_primitive(name = "etp_test_untouched")]
fn untouched(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(w)
}
zero_rules!(untouched);

/// Four zero rules for a single-weight primitive (the tests below only need
/// the primitive to compile).
macro_rules! zero_rules {
    ($prim:ident) => {
        const _: () = {
            use braintrace::prelude::*;
            #[yw_to_w($prim)]
            fn yw(_h: &Tensor, t: &Tensor) -> Result<Tensor> {
                Ok(t.zeros_like())
            }
            #[xy_to_dw($prim)]
            fn xy(_x: &Tensor, _h: &Tensor, w: &Tensor) -> Result<Tensor> {
                Ok(w.zeros_like())
            }
            #[init_drtrl($prim)]
            fn drtrl(_x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
                Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
            }
            #[init_pp($prim)]
            fn pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
                Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
            }
        };
    };
}
use zero_rules;

// ------------------------------------------------ explicitly named trainables

/// y = x @ (b @ a): two trainables named explicitly, in layout order.
#[etp_primitive(name = "etp_test_lowrank", x = x, trainables(lora_b = b, lora_a = a))]
fn lowrank(a: &Tensor, x: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.matmul(&b.matmul(a)?)
}

#[yw_to_w(lowrank)]
fn lowrank_yw(_h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    Ok(trace.clone())
}

#[xy_to_dw(lowrank)]
fn lowrank_xy(_x: &Tensor, _h: &Tensor, w: &TensorMap) -> Result<TensorMap> {
    Ok(w.clone())
}

#[init_drtrl(lowrank)]
fn lowrank_drtrl(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    Ok(w.iter()
        .map(|(k, a)| {
            (
                k.clone(),
                Tensor::zeros(&[a.shape(), &[n]].concat(), y.dtype()),
            )
        })
        .collect())
}

#[init_pp(lowrank)]
fn lowrank_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

// ------------------------------------------------ a duplicate name

mod dup_a {
    use braintrace::prelude::*;
    #[etp_primitive(name = "etp_test_dup")]
    pub fn dup(x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.matmul(w)
    }
    super::zero_rules!(dup);
}

mod dup_b {
    use braintrace::prelude::*;
    #[etp_primitive(name = "etp_test_dup")]
    pub fn dup(x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.matmul(w)?.mul_scalar(2.0)
    }
    super::zero_rules!(dup);
}

// ------------------------------------------------ param defaults

/// The seed's `_impl(x, w, *, scale=1.0)`: `scale` defaults to 1.0.
#[etp_primitive(name = "etp_test_default_scale", batched)]
fn default_scale(x: &Tensor, w: &Tensor, #[param(default = 1.0)] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

#[yw_to_w(default_scale)]
fn default_scale_yw(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    spread(trace, hidden)
}

#[xy_to_dw(default_scale)]
fn default_scale_xy(
    x: &Tensor,
    hidden: &Tensor,
    _w: &Tensor,
    p: &default_scale::Params,
) -> Result<Tensor> {
    outer(x, hidden)?.mul_scalar(p.scale)
}

#[init_drtrl(default_scale)]
fn default_scale_drtrl(x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(
        &[&x.shape()[..1], w.shape(), &[n]].concat(),
        y.dtype(),
    ))
}

#[init_pp(default_scale)]
fn default_scale_pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

/// Mixed: `shift` is required, `times` and `label` have defaults (one an
/// expression that is not a literal).
#[etp_primitive(name = "etp_test_default_mixed")]
fn default_mixed(
    x: &Tensor,
    w: &Tensor,
    #[param] shift: f64,
    #[param(default = 2)] times: usize,
    #[param(default = String::from("plain"))] label: String,
) -> Result<Tensor> {
    let _ = label;
    x.matmul(w)?.add_scalar(shift)?.mul_scalar(times as f64)
}
zero_rules!(default_mixed);

// ------------------------------------------------ helpers

/// Deterministic values in [-1, 1).
fn det(shape: &[usize], seed: u64) -> Tensor {
    det_scaled(shape, seed, 1.0)
}

fn ones(shape: &[usize]) -> Tensor {
    Tensor::ones(shape, DType::F64)
}

fn assert_close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    for (x, y) in a.to_vec_f64().unwrap().iter().zip(b.to_vec_f64().unwrap()) {
        assert!((x - y).abs() < 1e-12, "{x} vs {y}");
    }
}

fn all_eq(t: &Tensor, v: f64) -> bool {
    t.to_vec_f64().unwrap().iter().all(|&x| x == v)
}

// ------------------------------------------------ tests: the seed's op

#[test]
fn scaled_mm_values() {
    let y = scaled_mm(&ones(&[4, 3]), &ones(&[3, 5]), 0.5).unwrap();
    assert_eq!(y.shape(), &[4, 5]);
    assert!(all_eq(&y, 1.5), "{:?}", y.to_vec_f64());
}

#[test]
fn scaled_mm_grad() {
    let g = grad(|a: &[Tensor]| scaled_mm(&a[0], &a[1], 0.5)?.sum_all())(&[
        ones(&[4, 3]),
        ones(&[3, 5]),
    ])
    .unwrap();
    assert_eq!(g[1].shape(), &[3, 5]);
    assert!(all_eq(&g[1], 2.0), "{:?}", g[1].to_vec_f64());
    assert!(all_eq(&g[0], 2.5), "{:?}", g[0].to_vec_f64());
}

#[test]
fn scaled_mm_jit() {
    let (x, w) = (ones(&[4, 3]), ones(&[3, 5]));
    let f = jit(|a: &[Tensor]| Ok(vec![scaled_mm(&a[0], &a[1], 0.5)?]));
    let y = f(&[x.clone(), w.clone()]).unwrap();
    assert!(all_eq(&y[0], 1.5));
    let gj =
        jit(grad(|a: &[Tensor]| scaled_mm(&a[0], &a[1], 0.5)?.sum_all()))(&[x.clone(), w.clone()])
            .unwrap();
    assert!(all_eq(&gj[1], 2.0));
    // Random inputs: jit equals eager.
    let (x, w) = (det(&[4, 3], 1), det(&[3, 5], 2));
    assert_close(
        &f(&[x.clone(), w.clone()]).unwrap()[0],
        &scaled_mm(&x, &w, 0.5).unwrap(),
    );
}

#[test]
fn scaled_mm_vmap_equals_loop() {
    let (xs, w) = (det(&[2, 4, 3], 3), det(&[3, 5], 4));
    let f = vmap(
        |a: &[Tensor]| Ok(vec![scaled_mm(&a[0], &a[1], 0.5)?]),
        vec![Some(0), None],
    );
    let y = f(&[xs.clone(), w.clone()]).unwrap().remove(0);
    assert_eq!(y.shape(), &[2, 4, 5]);
    for i in 0..2 {
        assert_close(
            &y.index_axis0(i).unwrap(),
            &scaled_mm(&xs.index_axis0(i).unwrap(), &w, 0.5).unwrap(),
        );
    }
}

#[test]
fn scaled_mm_jvp() {
    let (x, w, tx, tw) = (
        det(&[4, 3], 5),
        det(&[3, 5], 6),
        det(&[4, 3], 7),
        det(&[3, 5], 8),
    );
    let (_, t) = jvp(
        |a: &[Tensor]| Ok(vec![scaled_mm(&a[0], &a[1], 0.5)?]),
        &[x.clone(), w.clone()],
        &[tx.clone(), tw.clone()],
    )
    .unwrap();
    let want = tx
        .matmul(&w)
        .unwrap()
        .add(&x.matmul(&tw).unwrap())
        .unwrap()
        .mul_scalar(0.5)
        .unwrap();
    assert_close(&t[0], &want);
}

#[test]
fn scaled_mm_one_equation() {
    let avals = [
        Aval::new(&[4, 3], DType::F64),
        Aval::new(&[3, 5], DType::F64),
    ];
    let g = make_graph(
        |a: &[Tensor]| Ok(vec![scaled_mm(&a[0], &a[1], 0.5)?]),
        &avals,
    )
    .unwrap();
    assert_eq!(g.primitive_names(), vec!["etp_scaled_mm"]);
    assert!(g.to_string().contains("etp_scaled_mm[scale=0.5]"), "{g}");
}

#[test]
fn scaled_mm_registries_and_spec() {
    let p = scaled_mm::primitive();
    assert_eq!(p.name(), "etp_scaled_mm");
    assert_eq!(scaled_mm::NAME, "etp_scaled_mm");
    assert!(p.is_batched() && !p.is_gradient_enabled());
    assert_eq!(p.x_index(), Some(0));
    assert_eq!(p.trainables(), &[("weight".to_string(), 1)]);
    assert!(ETP_RULES_YW_TO_W.contains(&p));
    assert!(ETP_RULES_XY_TO_DW.contains(&p));
    assert!(ETP_RULES_INIT_DRTRL.contains(&p));
    assert!(ETP_RULES_INIT_PP.contains(&p));
    assert!(!ETP_RULES_SOLVE_DRTRL.contains(&p) && !ETP_RULES_INSTANT_DRTRL.contains(&p));
    let spec = get_primitive_spec(&p).expect("macro primitives have a spec");
    assert!(Arc::ptr_eq(&spec, &*scaled_mm::SPEC));
    assert_eq!(primitive_by_name("etp_scaled_mm"), Some(p.clone()));
    assert_eq!(scaled_mm::try_primitive().unwrap(), p);
}

#[test]
fn scaled_mm_check_rules() {
    let p = scaled_mm::primitive();
    let report = check_rules(
        &p,
        &[det(&[4, 3], 9), det(&[3, 5], 10)],
        &Params::new().with("scale", 0.5),
    )
    .unwrap();
    assert!(report.is_ok(), "{report}");
}

#[test]
fn scaled_mm_typed_params() {
    let p = scaled_mm::Params { scale: 0.5 };
    assert_eq!(p.to_params(), Params::new().with("scale", 0.5));
    assert_eq!(scaled_mm::Params::from_params(&p.to_params()).unwrap(), p);
    assert_eq!(p.clone(), p);
    assert_eq!(format!("{p:?}"), "Params { scale: 0.5 }");
    let err = scaled_mm::Params::from_params(&Params::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("etp_scaled_mm") && err.contains("scale"),
        "{err}"
    );
}

// ------------------------------------------------ tests: param defaults

#[test]
fn param_default_applies_when_the_param_is_absent() {
    let p = default_scale::primitive();
    let (x, w) = (det(&[4, 3], 31), det(&[3, 5], 32));
    let xw = x.matmul(&w).unwrap();
    // Bound through the handle without `scale`: the seed's scale = 1.0.
    let y = p.bind(&[x.clone(), w.clone()], &Params::new()).unwrap();
    assert_close(&y, &xw);
    // Given, it is used.
    let y = p
        .bind(&[x.clone(), w.clone()], &Params::new().with("scale", 0.5))
        .unwrap();
    assert_close(&y, &xw.mul_scalar(0.5).unwrap());
    assert_close(
        &default_scale(&x, &w, 3.0).unwrap(),
        &xw.mul_scalar(3.0).unwrap(),
    );
    // Under grad and jit too: d/dw sum(x @ w) = xᵀ 1.
    let pc = p.clone();
    let f = move |a: &[Tensor]| pc.bind(a, &Params::new())?.sum_all();
    let g = grad(f)(&[x.clone(), w.clone()]).unwrap();
    assert_close(&g[1], &outer(&x, &ones(&[4, 5])).unwrap());
    let pc = p.clone();
    let jf = jit(move |a: &[Tensor]| Ok(vec![pc.bind(a, &Params::new())?]));
    assert_close(&jf(&[x.clone(), w.clone()]).unwrap()[0], &xw);
}

#[test]
fn param_default_reaches_the_typed_params_and_the_rules() {
    assert_eq!(default_scale::Params::default().scale, 1.0);
    let read = default_scale::Params::from_params(&Params::new()).unwrap();
    assert_eq!(read, default_scale::Params { scale: 1.0 });
    let read = default_scale::Params::from_params(&Params::new().with("scale", 0.25)).unwrap();
    assert_eq!(read.scale, 0.25);
    // A present value of the wrong kind is still an error, not the default.
    let e = default_scale::Params::from_params(&Params::new().with("scale", String::from("big")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etp_test_default_scale") && e.contains("scale"),
        "{e}"
    );

    // The rules read the default too: xy_to_dw = scale * xᵀ h.
    let p = default_scale::primitive();
    let (x, h, w) = (det(&[4, 3], 33), det(&[4, 5], 34), det(&[3, 5], 35));
    let mut weights = TensorMap::new();
    weights.insert("weight".into(), w.clone());
    let dw = p.xy_to_dw(Some(&x), &h, &weights, &Params::new()).unwrap();
    assert_close(&dw["weight"], &outer(&x, &h).unwrap());
    let dw = p
        .xy_to_dw(Some(&x), &h, &weights, &Params::new().with("scale", 2.0))
        .unwrap();
    assert_close(
        &dw["weight"],
        &outer(&x, &h).unwrap().mul_scalar(2.0).unwrap(),
    );
    let report = check_rules(&p, &[x, w], &Params::new()).unwrap();
    assert!(report.is_ok(), "{report}");
}

#[test]
fn param_default_mixed_with_a_required_param() {
    // A param without a default is still required.
    let e = default_mixed::Params::from_params(&Params::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etp_test_default_mixed") && e.contains("shift") && e.contains("missing"),
        "{e}"
    );
    let read = default_mixed::Params::from_params(&Params::new().with("shift", 0.5)).unwrap();
    assert_eq!(
        (read.shift, read.times, read.label.as_str()),
        (0.5, 2, "plain")
    );
    let (x, w) = (det(&[2, 3], 36), det(&[3, 4], 37));
    let y = default_mixed::primitive()
        .bind(&[x.clone(), w.clone()], &Params::new().with("shift", 0.5))
        .unwrap();
    let want = x
        .matmul(&w)
        .unwrap()
        .add_scalar(0.5)
        .unwrap()
        .mul_scalar(2.0)
        .unwrap();
    assert_close(&y, &want);
    // The wrapper function takes every param, defaults included.
    let y = default_mixed(&x, &w, 0.5, 3, "x".into()).unwrap();
    assert_close(
        &y,
        &x.matmul(&w)
            .unwrap()
            .add_scalar(0.5)
            .unwrap()
            .mul_scalar(3.0)
            .unwrap(),
    );
}

// ------------------------------------------------ tests: the other primitives

#[test]
fn companions_in_another_module() {
    let p = scaled_mv::primitive();
    assert!(ETP_RULES_YW_TO_W.contains(&p) && ETP_RULES_INIT_PP.contains(&p));
    let report = check_rules(
        &p,
        &[det(&[3], 11), det(&[3, 5], 12)],
        &Params::new().with("scale", 2.0),
    )
    .unwrap();
    assert!(report.is_ok(), "{report}");
}

#[test]
fn counterpart_is_bound_under_vmap() {
    assert_eq!(
        scaled_mv::primitive().batched_counterpart(),
        Some(scaled_mm::primitive())
    );
    let f = vmap(
        |a: &[Tensor]| Ok(vec![scaled_mv(&a[0], &a[1], 0.5)?]),
        vec![Some(0), None],
    );
    let avals = [
        Aval::new(&[4, 3], DType::F64),
        Aval::new(&[3, 5], DType::F64),
    ];
    let g = make_graph(|a: &[Tensor]| f(a), &avals).unwrap();
    assert_eq!(g.primitive_names(), vec!["etp_scaled_mm"], "{g}");
    let y = f(&[ones(&[4, 3]), ones(&[3, 5])]).unwrap();
    assert!(all_eq(&y[0], 1.5));
}

#[test]
fn multi_trainable_primitive() {
    let p = linear::primitive();
    assert_eq!(
        p.trainables(),
        &[("weight".to_string(), 1), ("bias".to_string(), 2)]
    );
    let (x, w, b) = (det(&[3], 13), det(&[3, 4], 14), det(&[4], 15));
    assert_close(
        &linear(&x, &w, &b).unwrap(),
        &x.matmul(&w).unwrap().add(&b).unwrap(),
    );
    let report = check_rules(&p, &[x, w, b], &Params::new()).unwrap();
    assert!(report.is_ok(), "{report}");
    // The optional override arrived through the spec and the registry.
    assert!(linear::SPEC.solve_drtrl.is_some() && linear::SPEC.instant_drtrl.is_none());
    assert!(ETP_RULES_SOLVE_DRTRL.contains(&p));
}

#[test]
fn explicitly_named_trainables() {
    let p = lowrank::primitive();
    assert_eq!(p.x_index(), Some(1));
    assert_eq!(
        p.trainables(),
        &[("lora_b".to_string(), 2), ("lora_a".to_string(), 0)]
    );
    let (a, x, b) = (det(&[2, 4], 17), det(&[3], 18), det(&[3, 2], 19));
    assert_close(
        &lowrank(&a, &x, &b).unwrap(),
        &x.matmul(&b.matmul(&a).unwrap()).unwrap(),
    );
}

#[test]
fn gradient_enabled_identity() {
    let p = identity::primitive();
    assert!(p.is_gradient_enabled() && !p.is_batched());
    assert_eq!(p.x_index(), None);
    assert_eq!(p.trainables(), &[("weight".to_string(), 0)]);
    let w = det(&[2, 3], 16);
    assert_close(&identity(&w).unwrap(), &w);
    let report = check_rules(&p, &[w], &Params::new()).unwrap();
    assert!(report.is_ok(), "{report}");
}

#[test]
fn registries_collect_before_first_use() {
    // Nothing calls `untouched` or its module: the registry found it itself.
    let p = primitive_by_name("etp_test_untouched").expect("collected through inventory");
    assert!(ETP_RULES_XY_TO_DW.contains(&p));
    assert!(all_primitives().iter().any(|q| q.name() == "etp_scaled_mm"));
}

#[test]
fn duplicate_names_are_reported_with_both_definitions() {
    let errors: Vec<String> = registration_errors()
        .iter()
        .map(ToString::to_string)
        .filter(|e| e.contains("etp_test_dup"))
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let msg = &errors[0];
    assert!(
        msg.contains("dup_a::dup") && msg.contains("dup_b::dup"),
        "{msg}"
    );
    assert!(msg.contains("tests/macros.rs"), "{msg}");
    // Exactly one of the two functions works; the other returns that error
    // (and does not panic).
    let (x, w) = (ones(&[2, 3]), ones(&[3, 2]));
    let (a, b) = (dup_a::dup(&x, &w), dup_b::dup(&x, &w));
    assert!(a.is_ok() != b.is_ok());
    let err = a.err().or(b.err()).unwrap().to_string();
    assert_eq!(&err, msg);
    assert!(dup_a::dup::try_primitive().is_ok() != dup_b::dup::try_primitive().is_ok());
}
