//! Compiler parity with braintrace 0.2.6: hidden groups in its order (a
//! group whose only recurrence runs through a weight comes after the
//! others), its 28 diagnostic kinds as data, and the compilation report.

mod learn_support;

use braintrace::learn::{
    compile, DRtrl, DiagnosticKind, Init, Learner, Level, Model, ModelState, StepCtx,
};
use braintrace::nn::Linear;
use braintrace::prelude::*;
use learn_support::models::GruNet;

/// `a' = tanh(W [x, a])` (its only recurrence through `W`), then
/// `b' = 0.9 b + U x + a'` (a leak: a recurrence of its own). braintrace
/// 0.2.6 orders the groups `[b], [a]` and relates `W` to `a`'s group, `U`
/// to `b`'s (printed by the real library:
/// `scripts/golden_gen/check_group_order.py`).
struct WeightOnlyFirst {
    w: Linear,
    u: Linear,
}

impl Model for WeightOnlyFirst {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.w.init(init)?;
        self.u.init(init)?;
        init.hidden("a", &[4])?;
        init.hidden("b", &[4])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let a = ctx.hidden("a")?;
        let b = ctx.hidden("b")?;
        let xa = braintrace::concat(&[x.clone(), a], 1)?;
        let a2 = self.w.step(ctx, &xa)?.tanh()?;
        ctx.set_hidden("a", a2.clone())?;
        let b2 = b.mul_scalar(0.9)?.add(&self.u.step(ctx, x)?)?.add(&a2)?;
        ctx.set_hidden("b", b2.clone())?;
        Ok(b2)
    }
}

fn order_learner() -> Learner<WeightOnlyFirst> {
    let model = WeightOnlyFirst {
        w: Linear::new("W", 7, 4),
        u: Linear::new("U", 3, 4),
    };
    let state = ModelState::new(&model, DType::F64, 0, Some(2)).unwrap();
    compile(
        model,
        state,
        DRtrl::default(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap()
}

#[test]
fn a_group_recurrent_only_through_a_weight_comes_last() {
    let l = order_learner();
    let groups: Vec<Vec<String>> = l
        .graph()
        .groups()
        .iter()
        .map(|g| g.hidden_paths.clone())
        .collect();
    assert_eq!(groups, vec![vec!["b".to_string()], vec!["a".to_string()]]);
    for (i, g) in l.graph().groups().iter().enumerate() {
        assert_eq!(g.index, i);
    }
    let report = l.report();
    assert_eq!(
        report.hidden_groups,
        vec![(0, vec!["b".to_string()]), (1, vec!["a".to_string()])]
    );
    // As braintrace relates them: U to b's group.
    let u = report
        .etrace_weights
        .iter()
        .find(|(w, _)| w == "U/weight")
        .unwrap();
    assert_eq!(u.1, vec![0]);
    let w = report
        .etrace_weights
        .iter()
        .find(|(w, _)| w == "W/weight")
        .unwrap();
    assert_eq!(w.1, vec![1], "{report}");
}

#[test]
fn the_28_diagnostic_kinds_with_braintrace_names_and_levels() {
    assert_eq!(DiagnosticKind::ALL.len(), 28);
    let names: std::collections::HashSet<&str> = DiagnosticKind::ALL
        .iter()
        .map(|k| k.braintrace_name())
        .collect();
    assert_eq!(names.len(), 28);
    for k in DiagnosticKind::ALL {
        assert!(!k.levels().is_empty());
        assert_eq!(k.value(), k.braintrace_name().to_lowercase());
    }
    assert_eq!(DiagnosticKind::WeightInWhile.levels(), &[Level::Error]);
    assert_eq!(DiagnosticKind::RelationIncluded.levels(), &[Level::Info]);
    assert_eq!(
        DiagnosticKind::ExcludedWeightToWeight.braintrace_name(),
        "RELATION_EXCLUDED_WEIGHT_TO_WEIGHT"
    );
    // The kinds this compiler emits are emitted at a level braintrace uses.
    let model = GruNet::new(3, 5, 2);
    let state = ModelState::new(&model, DType::F64, 0, Some(2)).unwrap();
    let l = compile(
        model,
        state,
        DRtrl::default(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap();
    let d = l.graph().diagnostics();
    for x in d {
        assert!(x.kind.emitted(), "{x}");
        assert!(x.kind.levels().contains(&x.level), "{x}");
    }
    // The GRU's: three relations included (Wz, Wh... and the readout
    // excluded as non-temporal, Wr as weight to weight).
    let has = |k: DiagnosticKind, w: &str| {
        d.iter()
            .any(|x| x.kind == k && x.weight_path.as_deref() == Some(w))
    };
    assert!(has(DiagnosticKind::ExcludedWeightToWeight, "rnn/Wr/weight"));
    assert!(has(DiagnosticKind::ExcludedNonTemporal, "out/weight"));
    assert!(has(DiagnosticKind::RelationIncluded, "rnn/Wz/weight"));
}

#[test]
fn the_report_lists_groups_weights_exclusions_and_counts() {
    let model = GruNet::new(3, 5, 2);
    let state = ModelState::new(&model, DType::F64, 0, Some(2)).unwrap();
    let l = compile(
        model,
        state,
        DRtrl::default(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap();
    let r = l.report();
    assert_eq!(r.hidden_groups, vec![(0, vec!["rnn/h".to_string()])]);
    let traced: Vec<&str> = r.etrace_weights.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(traced, ["rnn/Wz/weight", "rnn/Wh/weight"]);
    assert_eq!(
        r.excluded_weights,
        vec![
            (
                "rnn/Wr/weight".to_string(),
                Some("relation_excluded_weight_to_weight".to_string())
            ),
            (
                "out/weight".to_string(),
                Some("relation_excluded_non_temporal".to_string())
            ),
        ]
    );
    let c = r.counts();
    assert_eq!(
        (
            c.hidden_groups,
            c.etrace_weights,
            c.excluded_weights,
            c.warnings,
            c.errors
        ),
        (1, 2, 2, 2, 0)
    );
    let t1 = r.to_text(1);
    assert!(t1.contains("group 0: [rnn/h]") && !t1.contains("Compiler diagnostics"));
    let t2 = r.to_text(2);
    assert!(
        t2.contains("[warning] relation_excluded_weight_to_weight"),
        "{t2}"
    );
    assert!(t2.contains("fused trace kernels"), "{t2}");
}
