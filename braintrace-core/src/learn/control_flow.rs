//! The compiler's policy for control flow inside a model's step (after
//! braintrace's `ControlFlowPolicy`): before the step graph is analysed, a
//! fixed-count `scan` whose body holds ETP primitives or weights is
//! unrolled and such a `cond` is if-converted (every branch inlined, the
//! results selected), so the compiler sees each ETP equation; nested
//! control flow is rewritten until nothing changes. What cannot be traced
//! through — a `while` (no fixed trip count), a scan longer than the unroll
//! limit, a cond the policy keeps opaque — is refused with an error
//! diagnostic naming the op when weights or ETP primitives are inside.
//! Control flow without either is left as one equation.

use super::diagnostics::{Diagnostic, DiagnosticKind, Level};
use crate::error::{Error, Result};
use crate::etp::as_etp_eqn;
use crate::graph::{self, Graph, Primitive, VarId};
use crate::tensor::Tensor;
use crate::transform::as_call;
use crate::transform::control::{as_cond, as_scan, as_while};

/// How an ETP-relevant `cond` (one with ETP primitives or weights inside)
/// is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CondPolicy {
    /// If-convert it: run every branch and select the results (braintrace's
    /// default `'convert'`). Both branches run every step.
    #[default]
    Convert,
    /// Keep it as one equation; a weight or ETP primitive inside is then
    /// refused (braintrace's `'opaque'`).
    Opaque,
}

/// The compiler's control-flow policy (braintrace's `ControlFlowPolicy`,
/// with its `cond` and `scan_unroll_limit` knobs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlFlowPolicy {
    /// How an ETP-relevant `cond` is handled.
    pub cond: CondPolicy,
    /// The longest ETP-relevant `scan` that is unrolled (braintrace's
    /// default, 16); a longer one is refused. `0` unrolls none.
    pub scan_unroll_limit: usize,
}

impl Default for ControlFlowPolicy {
    fn default() -> Self {
        ControlFlowPolicy {
            cond: CondPolicy::Convert,
            scan_unroll_limit: 16,
        }
    }
}

/// Rewrite sweeps before giving up (each sweep rewrites one level of
/// nesting; braintrace's `fixpoint_iteration_limit`).
const MAX_SWEEPS: usize = 64;

/// The graphs a control-flow (or call) equation holds.
fn held_graphs(p: &dyn Primitive) -> Vec<&Graph> {
    if let Some(s) = as_scan(p) {
        vec![s.body()]
    } else if let Some(c) = as_cond(p) {
        c.branches()
    } else if let Some(w) = as_while(p) {
        vec![w.cond(), w.body()]
    } else if let Some(c) = as_call(p) {
        vec![c.graph()]
    } else {
        Vec::new()
    }
}

fn is_control_flow(p: &dyn Primitive) -> bool {
    as_scan(p).is_some() || as_cond(p).is_some() || as_while(p).is_some()
}

/// Whether `g` (or a graph held by one of its equations) has an ETP equation.
fn contains_etp(g: &Graph) -> bool {
    g.eqns().iter().any(|e| {
        as_etp_eqn(&**e.prim()).is_some() || held_graphs(&**e.prim()).into_iter().any(contains_etp)
    })
}

fn diag(kind: DiagnosticKind, level: Level, message: String) -> Diagnostic {
    Diagnostic {
        kind,
        level,
        message,
        primitive: None,
        weight_path: None,
        hidden_paths: Vec::new(),
    }
}

/// Apply `policy` to a step graph whose first `num_params` inputs are the
/// model's weights (`param_keys` names them, for the messages): returns the
/// rewritten graph (the same graph when it has no control flow) and one
/// diagnostic per decision. Diagnostics of level [`Level::Error`] mean the
/// step cannot be compiled; [`super::EtraceGraph::analyse`] refuses it.
pub fn canonicalize_control_flow(
    g: &Graph,
    param_keys: &[String],
    policy: &ControlFlowPolicy,
) -> Result<(Graph, Vec<Diagnostic>)> {
    let np = param_keys.len();
    let mut g = g.clone();
    let mut diags = Vec::new();
    let weight_of = |g: &Graph, inputs: &[VarId]| -> Option<String> {
        inputs.iter().find_map(|v| {
            g.invars()[..np]
                .iter()
                .position(|p| p == v)
                .map(|i| param_keys[i].clone())
        })
    };
    for _ in 0..MAX_SWEEPS {
        if !g.eqns().iter().any(|e| is_control_flow(&**e.prim())) {
            return Ok((g, diags));
        }
        let mut changed = false;
        let cur = &g;
        let next = graph::trace(
            |args: &[Tensor]| {
                cur.eval_with(args, |e, ins| {
                    let p = &**e.prim();
                    let relevant = || {
                        weight_of(cur, e.inputs()).is_some()
                            || held_graphs(p).into_iter().any(contains_etp)
                    };
                    if let Some(s) = as_scan(p) {
                        if s.length() <= policy.scan_unroll_limit && relevant() {
                            changed = true;
                            diags.push(diag(
                                DiagnosticKind::ScanUnrolled,
                                Level::Info,
                                format!(
                                    "a scan of length {} with weights or ETP primitives inside is unrolled into the step",
                                    s.length()
                                ),
                            ));
                            return s.unroll(ins);
                        }
                    }
                    if let Some(c) = as_cond(p) {
                        if policy.cond == CondPolicy::Convert && relevant() {
                            changed = true;
                            diags.push(diag(
                                DiagnosticKind::CondIfConverted,
                                Level::Info,
                                format!(
                                    "a cond of {} branches with weights or ETP primitives inside is if-converted: every branch runs and the results are selected",
                                    c.branches().len()
                                ),
                            ));
                            return c.if_converted(ins);
                        }
                    }
                    graph::bind(e.prim().clone(), ins)
                })
            },
            &g.in_avals(),
        )?;
        g = next;
        if !changed {
            break;
        }
    }
    // What is left cannot be traced through.
    let mut refused = Vec::new();
    for e in g.eqns() {
        let p = &**e.prim();
        if !is_control_flow(p) {
            continue;
        }
        let op = p.name();
        let weight = weight_of(&g, e.inputs());
        let etp = held_graphs(p).into_iter().any(contains_etp);
        if weight.is_none() && !etp {
            continue;
        }
        if let Some(s) = as_scan(p) {
            refused.push(diag(
                DiagnosticKind::ScanUnrollSkipped,
                Level::Warning,
                format!(
                    "a scan of length {} exceeds the unroll limit {}; it stays one equation",
                    s.length(),
                    policy.scan_unroll_limit
                ),
            ));
        } else if as_cond(p).is_some() {
            refused.push(diag(
                DiagnosticKind::CondConversionSkipped,
                Level::Warning,
                "the control-flow policy keeps cond opaque; it stays one equation".into(),
            ));
        }
        let d = match (&weight, as_while(p).is_some()) {
            (Some(w), true) => Diagnostic {
                weight_path: Some(w.clone()),
                ..diag(
                    DiagnosticKind::WeightInWhile,
                    Level::Error,
                    format!(
                        "weight `{w}` is used inside a while loop; a while has no fixed trip count, so its iterations cannot take part in online learning: apply the weight outside the loop, or use a scan of fixed length (which the compiler unrolls)"
                    ),
                )
            },
            (Some(w), false) => Diagnostic {
                weight_path: Some(w.clone()),
                ..diag(
                    DiagnosticKind::WeightInControlFlow,
                    Level::Error,
                    format!(
                        "weight `{w}` is used inside a {op} the compiler cannot trace through (see the control-flow policy); compilation fails"
                    ),
                )
            },
            (None, _) => diag(
                DiagnosticKind::PrimitiveInsideControlFlow,
                Level::Error,
                format!(
                    "an ETP primitive is used inside a {op} the compiler cannot trace through; its weight would drop out of online learning, so compilation fails"
                ),
            ),
        };
        refused.push(d);
    }
    diags.extend(refused);
    Ok((g, diags))
}

/// The error for a step whose diagnostics hold an error (every error
/// diagnostic, one per line).
pub(crate) fn refusal(diags: &[Diagnostic]) -> Option<Error> {
    let errors: Vec<String> = diags
        .iter()
        .filter(|d| d.level == Level::Error)
        .map(ToString::to_string)
        .collect();
    (!errors.is_empty()).then(|| Error::invalid("compile", errors.join("\n")))
}
