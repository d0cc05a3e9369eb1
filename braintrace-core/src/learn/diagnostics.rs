//! Compilation diagnostics: every decision of the ETP compiler as data (a
//! kind, a level and the primitive, weight and hidden paths involved) and as
//! a readable sentence.

use std::fmt;

/// What a diagnostic is about: the 28 kinds of braintrace 0.2.6's
/// `DiagnosticKind`, in its order ([`DiagnosticKind::ALL`]). Each has its
/// braintrace name and the levels braintrace emits it at
/// ([`DiagnosticKind::levels`]); the ones this compiler meets are emitted
/// where braintrace emits them (see [`DiagnosticKind::emitted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DiagnosticKind {
    /// An ETP equation relates to hidden groups and gets traces.
    RelationIncluded,
    /// An ETP equation none of whose trainable operands is a model parameter.
    ExcludedNoParam,
    /// An ETP equation whose output reaches no hidden state: its weight is a
    /// non-temporal parameter (a readout, for example).
    ExcludedNonTemporal,
    /// A connection dropped because `y` and the hidden group's shape do not
    /// broadcast.
    ExcludedShapeMismatch,
    /// An ETP equation whose output reaches hidden states only through
    /// another (non-gradient-enabled) ETP equation, like the GRU's `Wr`.
    ExcludedWeightToWeight,
    /// A relation kept although part of its output's paths to the hidden
    /// states crosses another weight (informational in kind, a warning in level).
    PartialPath,
    /// A trainable operand that does not come from a model parameter.
    TrainableNotParam,
    /// A `cond` rewritten into a select of both branches.
    CondIfConverted,
    /// A `cond` that could not be rewritten.
    CondConversionSkipped,
    /// A fixed-count scan inlined (unrolled) into the step.
    ScanUnrolled,
    /// A scan left rolled (too long, or not unrollable).
    ScanUnrollSkipped,
    /// A weight used through a slice of it: excluded.
    ExcludedSlicedWeight,
    /// A long scan analysed by descending into its body.
    ScanDescentApplied,
    /// Descent into a scan was asked for but not possible.
    ScanDescentSkipped,
    /// A descended scan reads weights that give no relation: they do not
    /// learn online.
    ScanDescentNoRelations,
    /// A weight read inside a `while` loop: it cannot learn online.
    WeightInWhile,
    /// Weight-free control flow producing a hidden state, kept as an opaque
    /// forward node.
    ControlFlowOpaqueFwd,
    /// Opaque control flow applying a recurrent weight to the carried hidden
    /// state: excluded from the hidden-to-hidden transition.
    ControlFlowRecurrentMixing,
    /// An ETP primitive inside a nested `jit`.
    PrimitiveInsideNestedJit,
    /// An ETP primitive inside control flow.
    PrimitiveInsideControlFlow,
    /// A primitive with several outputs in the step.
    MultiOutputPrimitive,
    /// A weight whose leaf cannot be told from the others of its state.
    PytreeWeightLeafAmbiguous,
    /// SnAp-n's neighbourhood could not be derived and was widened to all
    /// positions.
    SnapPatternConservative,
    /// SnAp-n on a group without cross-position coupling (it equals the
    /// coupled rule).
    SnapPatternDegenerate,
    /// A hidden transition's tail cut at a boundary (declared by braintrace;
    /// no emission site in 0.2.6).
    TransitionTailBounded,
    /// Several hidden states merged into one group.
    HiddenGroupMerged,
    /// The states the step reads and writes do not match the declared ones.
    StateMismatch,
    /// A weight read inside control flow the compiler cannot trace through.
    WeightInControlFlow,
}

impl DiagnosticKind {
    /// Every kind, in braintrace's order.
    pub const ALL: [DiagnosticKind; 28] = [
        DiagnosticKind::RelationIncluded,
        DiagnosticKind::ExcludedNoParam,
        DiagnosticKind::ExcludedNonTemporal,
        DiagnosticKind::ExcludedShapeMismatch,
        DiagnosticKind::ExcludedWeightToWeight,
        DiagnosticKind::PartialPath,
        DiagnosticKind::TrainableNotParam,
        DiagnosticKind::CondIfConverted,
        DiagnosticKind::CondConversionSkipped,
        DiagnosticKind::ScanUnrolled,
        DiagnosticKind::ScanUnrollSkipped,
        DiagnosticKind::ExcludedSlicedWeight,
        DiagnosticKind::ScanDescentApplied,
        DiagnosticKind::ScanDescentSkipped,
        DiagnosticKind::ScanDescentNoRelations,
        DiagnosticKind::WeightInWhile,
        DiagnosticKind::ControlFlowOpaqueFwd,
        DiagnosticKind::ControlFlowRecurrentMixing,
        DiagnosticKind::PrimitiveInsideNestedJit,
        DiagnosticKind::PrimitiveInsideControlFlow,
        DiagnosticKind::MultiOutputPrimitive,
        DiagnosticKind::PytreeWeightLeafAmbiguous,
        DiagnosticKind::SnapPatternConservative,
        DiagnosticKind::SnapPatternDegenerate,
        DiagnosticKind::TransitionTailBounded,
        DiagnosticKind::HiddenGroupMerged,
        DiagnosticKind::StateMismatch,
        DiagnosticKind::WeightInControlFlow,
    ];

    /// braintrace's name for the kind (`RELATION_EXCLUDED_WEIGHT_TO_WEIGHT`, ...).
    pub fn braintrace_name(self) -> &'static str {
        match self {
            DiagnosticKind::RelationIncluded => "RELATION_INCLUDED",
            DiagnosticKind::ExcludedNoParam => "RELATION_EXCLUDED_NO_PARAMSTATE",
            DiagnosticKind::ExcludedNonTemporal => "RELATION_EXCLUDED_NON_TEMPORAL",
            DiagnosticKind::ExcludedShapeMismatch => "RELATION_EXCLUDED_SHAPE_MISMATCH",
            DiagnosticKind::ExcludedWeightToWeight => "RELATION_EXCLUDED_WEIGHT_TO_WEIGHT",
            DiagnosticKind::PartialPath => "RELATION_PARTIAL_PATH",
            DiagnosticKind::TrainableNotParam => "TRAINABLE_INVAR_NOT_PARAMSTATE",
            DiagnosticKind::CondIfConverted => "COND_IF_CONVERTED",
            DiagnosticKind::CondConversionSkipped => "COND_CONVERSION_SKIPPED",
            DiagnosticKind::ScanUnrolled => "SCAN_UNROLLED",
            DiagnosticKind::ScanUnrollSkipped => "SCAN_UNROLL_SKIPPED",
            DiagnosticKind::ExcludedSlicedWeight => "RELATION_EXCLUDED_SLICED_WEIGHT",
            DiagnosticKind::ScanDescentApplied => "SCAN_DESCENT_APPLIED",
            DiagnosticKind::ScanDescentSkipped => "SCAN_DESCENT_SKIPPED",
            DiagnosticKind::ScanDescentNoRelations => "SCAN_DESCENT_NO_RELATIONS",
            DiagnosticKind::WeightInWhile => "WEIGHT_IN_WHILE",
            DiagnosticKind::ControlFlowOpaqueFwd => "CONTROL_FLOW_OPAQUE_FWD",
            DiagnosticKind::ControlFlowRecurrentMixing => "CONTROL_FLOW_RECURRENT_MIXING",
            DiagnosticKind::PrimitiveInsideNestedJit => "PRIMITIVE_INSIDE_NESTED_JIT",
            DiagnosticKind::PrimitiveInsideControlFlow => "PRIMITIVE_INSIDE_CONTROL_FLOW",
            DiagnosticKind::MultiOutputPrimitive => "MULTI_OUTPUT_PRIMITIVE_DETECTED",
            DiagnosticKind::PytreeWeightLeafAmbiguous => "PYTREE_WEIGHT_LEAF_AMBIGUOUS",
            DiagnosticKind::SnapPatternConservative => "SNAP_PATTERN_CONSERVATIVE",
            DiagnosticKind::SnapPatternDegenerate => "SNAP_PATTERN_DEGENERATE",
            DiagnosticKind::TransitionTailBounded => "TRANSITION_TAIL_BOUNDED",
            DiagnosticKind::HiddenGroupMerged => "HIDDEN_GROUP_MERGED",
            DiagnosticKind::StateMismatch => "STATE_MISMATCH",
            DiagnosticKind::WeightInControlFlow => "WEIGHT_IN_CONTROL_FLOW",
        }
    }

    /// braintrace's value of the kind (`relation_excluded_weight_to_weight`).
    pub fn value(self) -> String {
        self.braintrace_name().to_ascii_lowercase()
    }

    /// The levels braintrace 0.2.6 emits the kind at (several when its
    /// emission sites differ; the first is the usual one).
    pub fn levels(self) -> &'static [Level] {
        match self {
            DiagnosticKind::RelationIncluded => &[Level::Info],
            DiagnosticKind::ExcludedNoParam => &[Level::Warning],
            DiagnosticKind::ExcludedNonTemporal => &[Level::Warning],
            DiagnosticKind::ExcludedShapeMismatch => &[Level::Warning],
            DiagnosticKind::ExcludedWeightToWeight => &[Level::Warning],
            DiagnosticKind::PartialPath => &[Level::Warning],
            DiagnosticKind::TrainableNotParam => &[Level::Info],
            DiagnosticKind::CondIfConverted => &[Level::Info],
            DiagnosticKind::CondConversionSkipped => &[Level::Warning],
            DiagnosticKind::ScanUnrolled => &[Level::Info],
            DiagnosticKind::ScanUnrollSkipped => &[Level::Info, Level::Warning],
            DiagnosticKind::ExcludedSlicedWeight => &[Level::Warning],
            DiagnosticKind::ScanDescentApplied => &[Level::Info],
            DiagnosticKind::ScanDescentSkipped => &[Level::Warning],
            DiagnosticKind::ScanDescentNoRelations => &[Level::Warning],
            DiagnosticKind::WeightInWhile => &[Level::Error],
            DiagnosticKind::ControlFlowOpaqueFwd => &[Level::Info, Level::Warning],
            DiagnosticKind::ControlFlowRecurrentMixing => &[Level::Warning],
            DiagnosticKind::PrimitiveInsideNestedJit => &[Level::Warning],
            DiagnosticKind::PrimitiveInsideControlFlow => &[Level::Warning, Level::Error],
            DiagnosticKind::MultiOutputPrimitive => &[Level::Info],
            DiagnosticKind::PytreeWeightLeafAmbiguous => &[Level::Warning],
            DiagnosticKind::SnapPatternConservative => &[Level::Warning],
            DiagnosticKind::SnapPatternDegenerate => &[Level::Info],
            DiagnosticKind::TransitionTailBounded => &[Level::Info],
            DiagnosticKind::HiddenGroupMerged => &[Level::Info],
            DiagnosticKind::StateMismatch => &[Level::Warning],
            DiagnosticKind::WeightInControlFlow => &[Level::Error],
        }
    }

    /// Whether this compiler emits the kind (the others concern control
    /// flow, nested `jit`, SnAp or pytree weights, which its step graphs do
    /// not have yet).
    pub fn emitted(self) -> bool {
        matches!(
            self,
            DiagnosticKind::RelationIncluded
                | DiagnosticKind::ExcludedNoParam
                | DiagnosticKind::ExcludedNonTemporal
                | DiagnosticKind::ExcludedShapeMismatch
                | DiagnosticKind::ExcludedWeightToWeight
                | DiagnosticKind::TrainableNotParam
                | DiagnosticKind::HiddenGroupMerged
                | DiagnosticKind::PartialPath
                // The control-flow policy (`learn/control_flow.rs`).
                | DiagnosticKind::ScanUnrolled
                | DiagnosticKind::ScanUnrollSkipped
                | DiagnosticKind::CondIfConverted
                | DiagnosticKind::CondConversionSkipped
                | DiagnosticKind::WeightInWhile
                | DiagnosticKind::WeightInControlFlow
                | DiagnosticKind::PrimitiveInsideControlFlow
        )
    }
}

/// How much a diagnostic matters (braintrace's `DiagnosticLevel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// For understanding; nothing is lost.
    Info,
    /// Something will not be learned online (braintrace emits a warning).
    Warning,
    /// A serious problem (braintrace also emits a warning).
    Error,
}

impl Level {
    /// braintrace's value (`info`, `warning`, `error`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

/// One compiler decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// What kind of decision.
    pub kind: DiagnosticKind,
    /// Its level.
    pub level: Level,
    /// A readable sentence.
    pub message: String,
    /// The ETP primitive involved.
    pub primitive: Option<String>,
    /// The parameter state involved (`rnn/Wr/weight`).
    pub weight_path: Option<String>,
    /// The hidden states involved.
    pub hidden_paths: Vec<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = self.level.name();
        write!(
            f,
            "[{level}] {}: {}",
            self.kind.braintrace_name(),
            self.message
        )
    }
}
