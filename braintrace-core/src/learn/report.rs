//! The compilation report (braintrace 0.2.6's `CompilationReport`): the
//! hidden groups, the weights with eligibility traces and their groups, the
//! weights without (with the reason when a diagnostic gives one), the
//! diagnostics and their counts, as data and as text
//! ([`CompilationReport::to_text`]).

use super::compiler::EtraceGraph;
use super::diagnostics::{Diagnostic, DiagnosticKind, Level};
use std::fmt;

/// The diagnostic kinds that say why a weight got no trace.
const EXCLUSIONS: [DiagnosticKind; 4] = [
    DiagnosticKind::ExcludedNoParam,
    DiagnosticKind::ExcludedNonTemporal,
    DiagnosticKind::ExcludedShapeMismatch,
    DiagnosticKind::ExcludedWeightToWeight,
];

/// A compiled learner's report ([`Learner::report`](super::Learner::report)).
///
/// ```
/// use braintrace_core::learn::{compile, DRtrl, ModelState};
/// use braintrace_core::nn::GruCell;
/// use braintrace_core::{DType, Tensor};
///
/// let model = GruCell::new("rnn", 3, 4);
/// let state = ModelState::new(&model, DType::F64, 0, Some(2))?;
/// let l = compile(model, state, DRtrl::default(), &Tensor::zeros(&[2, 3], DType::F64), Some(2))?;
/// let r = l.report();
/// assert_eq!(r.counts().hidden_groups, 1);
/// // The GRU's reset gate reaches the hidden state only through another weight.
/// assert!(r.excluded_weights.iter().any(|(w, why)| w == "rnn/Wr/weight"
///     && why.as_deref() == Some("relation_excluded_weight_to_weight")));
/// assert!(r.to_text(2).contains("Compiler diagnostics"));
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CompilationReport {
    /// The algorithm with its options.
    pub algorithm: String,
    /// The algorithm's own lines (fused kernels, ...).
    pub algorithm_lines: Vec<String>,
    /// `(group index, hidden paths)` of every hidden group, in order.
    pub hidden_groups: Vec<(usize, Vec<String>)>,
    /// `(parameter state path, group indices)` of every trainable of every
    /// relation, relation by relation.
    pub etrace_weights: Vec<(String, Vec<usize>)>,
    /// The parameter states with no trace, and braintrace's value of the
    /// first diagnostic that says why (`relation_excluded_non_temporal`).
    pub excluded_weights: Vec<(String, Option<String>)>,
    /// Every diagnostic, in the order the compiler made its decisions.
    pub diagnostics: Vec<Diagnostic>,
}

/// The report's counts (braintrace's `counts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportCounts {
    /// Hidden groups.
    pub hidden_groups: usize,
    /// Entries of [`CompilationReport::etrace_weights`].
    pub etrace_weights: usize,
    /// Entries of [`CompilationReport::excluded_weights`].
    pub excluded_weights: usize,
    /// Diagnostics at [`Level::Warning`].
    pub warnings: usize,
    /// Diagnostics at [`Level::Error`].
    pub errors: usize,
}

impl CompilationReport {
    /// The report of `eg`, the model's parameter states being
    /// `state_paths` (in declaration order, repeated per leaf or not).
    pub(crate) fn new(
        eg: &EtraceGraph,
        state_paths: &[String],
        algorithm: String,
        algorithm_lines: Vec<String>,
    ) -> Self {
        let hidden_groups = eg
            .groups()
            .iter()
            .map(|g| (g.index, g.hidden_paths.clone()))
            .collect();
        let mut etrace_weights: Vec<(String, Vec<usize>)> = Vec::new();
        for r in eg.relations() {
            let mut seen: Vec<&str> = Vec::new();
            for t in &r.trainables {
                if !seen.contains(&t.state_path.as_str()) {
                    seen.push(&t.state_path);
                    etrace_weights.push((t.state_path.clone(), r.groups.clone()));
                }
            }
        }
        let mut excluded: Vec<(String, Option<String>)> = Vec::new();
        for p in state_paths {
            if etrace_weights.iter().any(|(w, _)| w == p) || excluded.iter().any(|(w, _)| w == p) {
                continue;
            }
            let why = eg
                .diagnostics()
                .iter()
                .find(|d| EXCLUSIONS.contains(&d.kind) && d.weight_path.as_deref() == Some(p))
                .map(|d| d.kind.value());
            excluded.push((p.clone(), why));
        }
        CompilationReport {
            algorithm,
            algorithm_lines,
            hidden_groups,
            etrace_weights,
            excluded_weights: excluded,
            diagnostics: eg.diagnostics().to_vec(),
        }
    }

    /// The counts of groups, weights and diagnostics by level.
    pub fn counts(&self) -> ReportCounts {
        let at = |l: Level| self.diagnostics.iter().filter(|d| d.level == l).count();
        ReportCounts {
            hidden_groups: self.hidden_groups.len(),
            etrace_weights: self.etrace_weights.len(),
            excluded_weights: self.excluded_weights.len(),
            warnings: at(Level::Warning),
            errors: at(Level::Error),
        }
    }

    /// The report as text: `level` 1 the structure (algorithm, groups,
    /// weights with and without traces), 2 also the warnings and errors
    /// (braintrace's `to_str(level)`).
    pub fn to_text(&self, level: u8) -> String {
        let mut s = format!("algorithm: {}\n", self.algorithm);
        for l in &self.algorithm_lines {
            s += &format!("  {l}\n");
        }
        s += "hidden groups:\n";
        for (i, paths) in &self.hidden_groups {
            s += &format!("  group {i}: [{}]\n", paths.join(", "));
        }
        if !self.etrace_weights.is_empty() {
            s += "weights with eligibility traces:\n";
            for (w, groups) in &self.etrace_weights {
                s += &format!("  {w} -> hidden group(s) {groups:?}\n");
            }
        }
        if !self.excluded_weights.is_empty() {
            s += "weights without traces:\n";
            for (w, why) in &self.excluded_weights {
                match why {
                    Some(r) => s += &format!("  {w} (excluded: {r})\n"),
                    None => s += &format!("  {w}\n"),
                }
            }
        }
        if level >= 2 {
            let serious: Vec<&Diagnostic> = self
                .diagnostics
                .iter()
                .filter(|d| d.level >= Level::Warning)
                .collect();
            if !serious.is_empty() {
                s += "Compiler diagnostics (warnings / errors):\n";
                for d in serious {
                    s += &format!("  [{}] {}: {}\n", d.level.name(), d.kind.value(), d.message);
                }
            }
        }
        s
    }
}

impl fmt::Display for CompilationReport {
    /// [`to_text`](CompilationReport::to_text) at level 2.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text(2))
    }
}
