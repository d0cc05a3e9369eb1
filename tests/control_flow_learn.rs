//! The learning compiler's control-flow policy: a fixed-count scan in a
//! model's step is unrolled and learns with D-RTRL exactly as the same model
//! written with the loop unrolled by hand; a cond is if-converted (or
//! refused when the policy keeps it opaque); a while with a weight inside,
//! and a scan longer than the unroll limit, are refused with an error
//! diagnostic naming the op.

mod learn_support;

use braintrace::learn::{
    canonicalize_control_flow, compile, CondPolicy, ControlFlowPolicy, DRtrl, DiagnosticKind,
    EtraceGraph, Init, Level, Model, ModelState, Reduction, StepCtx, TensorDict,
};
use braintrace::nn::Initializer;
use braintrace::prelude::*;
use braintrace::prims::{matmul, Transforms};
use braintrace::transform::{cond, scan, while_loop};
use learn_support::{draw, mse};

#[derive(Clone, Copy, PartialEq)]
enum Form {
    Scan,
    Unrolled,
    Cond,
    Select,
    While,
}

/// `h` moves through two sub-steps per step, `h ← 0.6 h + tanh(s_k (x W +
/// b) + 0.3 h)` with `s = [0.5, 1.0]`, written with a scan, by hand, with a
/// cond / a select on the sign of the input, or (refused) with a while.
struct SubSteps(Form);

fn sub_step(h: &Tensor, x: &Tensor, w: &Tensor, b: &Tensor, s: &Tensor) -> Result<Tensor> {
    let y = matmul(x, w, Some(b), &Transforms::default())?;
    h.mul_scalar(0.6)?
        .add(&y.mul(s)?.add(&h.mul_scalar(0.3)?)?.tanh()?)
}

impl Model for SubSteps {
    fn init(&self, init: &mut Init) -> Result<()> {
        let w = Initializer::Normal { std: 0.6 }.draw(&[3, 4], init.dtype(), init.rng())?;
        init.param("W", None, w)?;
        let b = Initializer::Normal { std: 0.3 }.draw(&[4], init.dtype(), init.rng())?;
        init.param("b", None, b)?;
        init.hidden("h", &[4])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let (w, b, h) = (ctx.param("W")?, ctx.param("b")?, ctx.hidden("h")?);
        let scales = Tensor::from_vec(vec![0.5, 1.0], &[2])?;
        let h_new = match self.0 {
            Form::Scan => {
                let (c, _) = scan(
                    |c: &[Tensor], s: &[Tensor]| {
                        Ok((vec![sub_step(&c[0], x, &w, &b, &s[0])?], vec![]))
                    },
                    &[h],
                    &[scales],
                    None,
                )?;
                c[0].clone()
            }
            Form::Unrolled => {
                let h1 = sub_step(&h, x, &w, &b, &scales.index_axis0(0)?)?;
                sub_step(&h1, x, &w, &b, &scales.index_axis0(1)?)?
            }
            Form::Cond => {
                let pred = x.sum_all()?.gt(&Tensor::scalar(0.0))?;
                cond(
                    &pred,
                    |a: &[Tensor]| Ok(vec![sub_step(&a[0], x, &w, &b, &Tensor::scalar(1.0))?]),
                    |a: &[Tensor]| Ok(vec![a[0].mul_scalar(0.9)?.add(&b.tanh()?)?]),
                    &[h],
                )?[0]
                    .clone()
            }
            Form::Select => {
                let pred = x.sum_all()?.gt(&Tensor::scalar(0.0))?;
                let yes = sub_step(&h, x, &w, &b, &Tensor::scalar(1.0))?;
                let no = h.mul_scalar(0.9)?.add(&b.tanh()?)?;
                where_(&pred, &yes, &no)?
            }
            Form::While => {
                let out = while_loop(
                    |c: &[Tensor]| c[0].abs()?.sum_all()?.gt(&Tensor::scalar(100.0)),
                    |c: &[Tensor]| Ok(vec![sub_step(&c[0], x, &w, &b, &Tensor::scalar(1.0))?]),
                    &[h],
                )?;
                out[0].clone()
            }
        };
        ctx.set_hidden("h", h_new.clone())?;
        Ok(h_new)
    }
}

fn grads(form: Form, xs: &Tensor, ys: &Tensor) -> (TensorDict, EtraceGraph) {
    let model = SubSteps(form);
    let state = ModelState::new(&model, DType::F64, 5, Some(2)).unwrap();
    let mut l = compile(
        model,
        state,
        DRtrl::default(),
        &xs.index_axis0(0).unwrap(),
        Some(2),
    )
    .unwrap();
    let g = l.etrace_grad(xs, ys, mse, Reduction::Mean).unwrap().grads;
    (g, l.graph().clone())
}

fn assert_same(a: &TensorDict, b: &TensorDict, tol: f64, what: &str) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (k, w) in b {
        let (g, w) = (a[k].to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        assert!(g.iter().any(|v| v.abs() > 1e-6), "{what}: {k} is zero");
        for (i, (p, q)) in g.iter().zip(&w).enumerate() {
            assert!(
                (p - q).abs() <= tol * (1.0 + q.abs()),
                "{what}: {k}[{i}] {p} vs {q}"
            );
        }
    }
}

#[test]
fn a_fixed_count_scan_in_the_step_learns_as_the_loop_unrolled_by_hand() {
    let xs = draw(&[6, 2, 3], 1);
    let ys = draw(&[6, 2, 4], 2);
    let (gs, eg) = grads(Form::Scan, &xs, &ys);
    let (gu, eu) = grads(Form::Unrolled, &xs, &ys);
    assert_same(&gs, &gu, 1e-12, "scan vs unrolled");
    assert!(!eg.graph().primitive_names().contains(&"scan".to_string()));
    assert!(eg
        .diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::ScanUnrolled && d.level == Level::Info));
    assert_eq!(eg.relations().len(), eu.relations().len());
    assert_eq!(eg.relations().len(), 2, "one relation per sub-step");
}

#[test]
fn a_cond_in_the_step_is_if_converted_or_refused_when_kept_opaque() {
    // inputs of both signs, so both branches are taken across the steps
    let xs = draw(&[8, 2, 3], 3);
    let signs: Vec<bool> = (0..8)
        .map(|t| {
            xs.index_axis0(t)
                .unwrap()
                .sum_all()
                .unwrap()
                .item()
                .unwrap()
                > 0.0
        })
        .collect();
    assert!(signs.contains(&true) && signs.contains(&false), "{signs:?}");
    let ys = draw(&[8, 2, 4], 4);
    let (gc, eg) = grads(Form::Cond, &xs, &ys);
    let (gw, _) = grads(Form::Select, &xs, &ys);
    assert_same(&gc, &gw, 1e-12, "cond vs select");
    assert!(!eg.graph().primitive_names().contains(&"cond".to_string()));
    assert!(eg
        .diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::CondIfConverted));

    let model = SubSteps(Form::Cond);
    let state = ModelState::new(&model, DType::F64, 5, Some(2)).unwrap();
    let policy = ControlFlowPolicy {
        cond: CondPolicy::Opaque,
        ..ControlFlowPolicy::default()
    };
    let e = EtraceGraph::analyse_with(&model, &state, &xs.index_axis0(0).unwrap(), &policy)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("WEIGHT_IN_CONTROL_FLOW") && e.contains("inside a cond"),
        "{e}"
    );
}

#[test]
fn a_while_with_a_weight_inside_is_refused_naming_it() {
    let model = SubSteps(Form::While);
    let x = draw(&[2, 3], 1);
    let state = ModelState::new(&model, DType::F64, 5, Some(2)).unwrap();
    let e = match compile(model, state, DRtrl::default(), &x, Some(2)) {
        Ok(_) => panic!("a while with a weight inside must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("[error] WEIGHT_IN_WHILE") && e.contains("while loop"),
        "{e}"
    );
    assert!(e.contains("`W"), "names the weight: {e}");

    // the same decision as data
    let g = make_graph(
        |a: &[Tensor]| {
            while_loop(
                |c: &[Tensor]| c[0].sum_all()?.gt(&Tensor::scalar(1.0)),
                |c: &[Tensor]| Ok(vec![c[0].mul(&a[0])?]),
                &a[1..],
            )
        },
        &[Aval::new(&[2], DType::F64), Aval::new(&[2], DType::F64)],
    )
    .unwrap();
    let (_, diags) =
        canonicalize_control_flow(&g, &["w".to_string()], &ControlFlowPolicy::default()).unwrap();
    assert_eq!(diags.len(), 1);
    assert_eq!(diags[0].kind, DiagnosticKind::WeightInWhile);
    assert_eq!(diags[0].level, Level::Error);
    assert_eq!(diags[0].weight_path.as_deref(), Some("w"));
    // without a weight or ETP primitive inside, the while is left alone
    let (kept, diags) = canonicalize_control_flow(&g, &[], &ControlFlowPolicy::default()).unwrap();
    assert!(diags.is_empty());
    assert_eq!(kept.primitive_names(), vec!["while"]);
}

#[test]
fn a_scan_longer_than_the_unroll_limit_is_refused_naming_it() {
    let model = SubSteps(Form::Scan);
    let x = draw(&[2, 3], 1);
    let state = ModelState::new(&model, DType::F64, 5, Some(2)).unwrap();
    let policy = ControlFlowPolicy {
        scan_unroll_limit: 1,
        ..ControlFlowPolicy::default()
    };
    let e = EtraceGraph::analyse_with(&model, &state, &x, &policy)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("WEIGHT_IN_CONTROL_FLOW") && e.contains("inside a scan"),
        "{e}"
    );
}

#[test]
fn nested_control_flow_is_rewritten_to_a_fixpoint() {
    // a scan whose body holds a cond using the weight: both rewritten
    let g = make_graph(
        |a: &[Tensor]| {
            let (c, _) = scan(
                |c: &[Tensor], _x: &[Tensor]| {
                    let p = c[0].sum_all()?.gt(&Tensor::scalar(0.0))?;
                    let n = cond(
                        &p,
                        |d: &[Tensor]| Ok(vec![d[0].mul(&a[0])?]),
                        |d: &[Tensor]| Ok(vec![d[0].neg()?]),
                        &c[..1],
                    )?;
                    Ok((n, vec![]))
                },
                &a[1..],
                &[],
                Some(3),
            )?;
            Ok(c)
        },
        &[Aval::new(&[2], DType::F64), Aval::new(&[2], DType::F64)],
    )
    .unwrap();
    let (flat, diags) =
        canonicalize_control_flow(&g, &["w".to_string()], &ControlFlowPolicy::default()).unwrap();
    let names = flat.primitive_names();
    assert!(!names.iter().any(|n| n == "scan" || n == "cond"), "{flat}");
    let kinds: Vec<DiagnosticKind> = diags.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == DiagnosticKind::ScanUnrolled)
            .count(),
        1
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == DiagnosticKind::CondIfConverted)
            .count(),
        3
    );
    let args = [
        Tensor::from_vec(vec![0.5, -2.0], &[2]).unwrap(),
        Tensor::from_vec(vec![1.0, 0.2], &[2]).unwrap(),
    ];
    let want = g.eval(&args).unwrap();
    let got = flat.eval(&args).unwrap();
    assert_eq!(want[0].to_vec_f64().unwrap(), got[0].to_vec_f64().unwrap());
}
