//! Compilation diagnostics: every decision of the ETP compiler as data (a
//! kind, a level and the primitive, weight and hidden paths involved) and as
//! a readable sentence.

use std::fmt;

/// What a diagnostic is about (braintrace's `CompilationRecord` kinds).
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
    /// An ETP equation whose output reaches hidden states only through
    /// another (non-gradient-enabled) ETP equation, like the GRU's `Wr`.
    ExcludedWeightToWeight,
    /// A connection dropped because `y` and the hidden group's shape do not
    /// broadcast.
    ExcludedShapeMismatch,
    /// A trainable operand that does not come from a model parameter.
    TrainableNotParam,
    /// Several hidden states merged into one group.
    HiddenGroupMerged,
    /// A fixed-count `scan` with ETP primitives or weights inside, unrolled
    /// into the step so the compiler sees each iteration (info).
    ScanUnrolled,
    /// A `scan` with ETP primitives or weights inside left as one equation
    /// (longer than the policy's unroll limit); refused after (warning).
    ScanUnrollSkipped,
    /// A `cond` with ETP primitives or weights inside, if-converted: every
    /// branch inlined and the results selected (info).
    CondIfConverted,
    /// A `cond` with ETP primitives or weights inside left as one equation
    /// (the policy says opaque); refused after (warning).
    CondConversionSkipped,
    /// A weight used inside a `while` loop: refused (error).
    WeightInWhile,
    /// A weight used inside a control-flow equation the compiler cannot
    /// trace through: refused (error).
    WeightInControlFlow,
    /// An ETP primitive inside a control-flow equation the compiler cannot
    /// trace through: refused (error), since its weight would silently
    /// drop out of online learning.
    PrimitiveInsideControlFlow,
}

impl DiagnosticKind {
    /// braintrace's name for the kind (`RELATION_EXCLUDED_WEIGHT_TO_WEIGHT`, ...).
    pub fn braintrace_name(self) -> &'static str {
        match self {
            DiagnosticKind::RelationIncluded => "RELATION_INCLUDED",
            DiagnosticKind::ExcludedNoParam => "RELATION_EXCLUDED_NO_PARAMSTATE",
            DiagnosticKind::ExcludedNonTemporal => "RELATION_EXCLUDED_NON_TEMPORAL",
            DiagnosticKind::ExcludedWeightToWeight => "RELATION_EXCLUDED_WEIGHT_TO_WEIGHT",
            DiagnosticKind::ExcludedShapeMismatch => "RELATION_EXCLUDED_SHAPE_MISMATCH",
            DiagnosticKind::TrainableNotParam => "TRAINABLE_INVAR_NOT_PARAMSTATE",
            DiagnosticKind::HiddenGroupMerged => "HIDDEN_GROUP_MERGED",
            DiagnosticKind::ScanUnrolled => "SCAN_UNROLLED",
            DiagnosticKind::ScanUnrollSkipped => "SCAN_UNROLL_SKIPPED",
            DiagnosticKind::CondIfConverted => "COND_IF_CONVERTED",
            DiagnosticKind::CondConversionSkipped => "COND_CONVERSION_SKIPPED",
            DiagnosticKind::WeightInWhile => "WEIGHT_IN_WHILE",
            DiagnosticKind::WeightInControlFlow => "WEIGHT_IN_CONTROL_FLOW",
            DiagnosticKind::PrimitiveInsideControlFlow => "PRIMITIVE_INSIDE_CONTROL_FLOW",
        }
    }
}

/// How much a diagnostic matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// For understanding; nothing is lost.
    Info,
    /// Something will not be learned online (braintrace emits a warning).
    Warning,
    /// The model cannot be compiled as written (compilation fails).
    Error,
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
        let level = match self.level {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        };
        write!(
            f,
            "[{level}] {}: {}",
            self.kind.braintrace_name(),
            self.message
        )
    }
}
