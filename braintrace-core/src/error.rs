//! The one error type of the library. Every fallible public function returns
//! [`Result<T>`]; messages name the op (or primitive) and the shapes involved.

use thiserror::Error;

/// Errors returned by braintrace.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum Error {
    /// Operand shapes that an op cannot combine.
    #[error("{op}: incompatible shapes {shapes}: {reason}")]
    Shape {
        /// The op or primitive that refused the input.
        op: String,
        /// The offending shapes, formatted.
        shapes: String,
        /// What was expected.
        reason: String,
    },
    /// Operand dtypes that an op cannot combine.
    #[error("{op}: dtype mismatch: {reason}")]
    DType {
        /// The op or primitive.
        op: String,
        /// What went wrong.
        reason: String,
    },
    /// Wrong number of operands.
    #[error("{op}: expected {expected} argument(s), got {got}")]
    Arity {
        /// The op, transform or primitive.
        op: String,
        /// How many were expected (may be a description such as "at least 1").
        expected: String,
        /// How many were given.
        got: usize,
    },
    /// An axis outside the rank of its operand.
    #[error("{op}: axis {axis} is out of range for an operand of shape {shape:?}")]
    Axis {
        /// The op.
        op: String,
        /// The offending axis.
        axis: isize,
        /// The operand's shape.
        shape: Vec<usize>,
    },
    /// A value-dependent question asked of a symbolic tensor while tracing.
    #[error("{op}: needs concrete data but got a symbolic tensor of shape {shape:?} (it is being traced)")]
    Symbolic {
        /// What needed the data.
        op: String,
        /// The traced tensor's shape.
        shape: Vec<usize>,
    },
    /// A misuse of a transform (non-scalar grad output, bad in_axes, ...).
    #[error("{transform}: {reason}")]
    Transform {
        /// The transform (`grad`, `vmap`, ...).
        transform: String,
        /// What went wrong.
        reason: String,
    },
    /// A symbolic tensor used after the trace that created it ended.
    #[error("{op}: a symbolic tensor escaped the trace that created it (trace {trace}); capture values, not tracers, across trace boundaries")]
    EscapedTracer {
        /// The op that met it.
        op: String,
        /// The finished trace's id.
        trace: u64,
    },
    /// A primitive without a rule that was asked for it.
    #[error("primitive `{primitive}` has no {rule} rule{detail}")]
    MissingRule {
        /// The primitive.
        primitive: String,
        /// The rule (`transpose`, `yw_to_w`, ...).
        rule: String,
        /// Extra context.
        detail: String,
    },
    /// A failure inside an ETP primitive or one of its rules.
    #[error("ETP primitive `{primitive}`, {context}: {reason}")]
    Etp {
        /// The primitive's name.
        primitive: String,
        /// Where: `bind`, `rule yw_to_w`, `registration`, ...
        context: String,
        /// What went wrong.
        reason: String,
    },
    /// A registry conflict: the same name registered twice.
    #[error("ETP primitive name `{name}` is already registered ({first}); the second definition is {second}")]
    DuplicatePrimitive {
        /// The contested name.
        name: String,
        /// Where the first definition came from.
        first: String,
        /// Where the second came from.
        second: String,
    },
    /// A lookup by name found nothing.
    #[error("no ETP primitive named `{0}` is registered")]
    UnknownPrimitive(String),
    /// A parameter missing from, or of the wrong kind in, a params map.
    #[error("{op}: parameter `{param}`: {reason}")]
    Param {
        /// The op or primitive.
        op: String,
        /// The parameter name.
        param: String,
        /// What went wrong.
        reason: String,
    },
    /// Any other invalid argument.
    #[error("{op}: {reason}")]
    Invalid {
        /// The op.
        op: String,
        /// What went wrong.
        reason: String,
    },
}

/// `Result` with the library's [`Error`](enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::Shape`].
    pub fn shape(
        op: impl Into<String>,
        shapes: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Shape {
            op: op.into(),
            shapes: shapes.into(),
            reason: reason.into(),
        }
    }
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(op: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            op: op.into(),
            reason: reason.into(),
        }
    }
    /// Shorthand for [`Error::Transform`].
    pub fn transform(transform: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Transform {
            transform: transform.into(),
            reason: reason.into(),
        }
    }
    /// Shorthand for [`Error::DType`].
    pub fn dtype(op: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::DType {
            op: op.into(),
            reason: reason.into(),
        }
    }
    /// Shorthand for [`Error::Arity`].
    pub fn arity(op: impl Into<String>, expected: impl ToString, got: usize) -> Self {
        Error::Arity {
            op: op.into(),
            expected: expected.to_string(),
            got,
        }
    }
    /// Shorthand for [`Error::Axis`].
    pub fn axis(op: impl Into<String>, axis: isize, shape: &[usize]) -> Self {
        Error::Axis {
            op: op.into(),
            axis,
            shape: shape.to_vec(),
        }
    }
    /// Shorthand for [`Error::Etp`].
    pub fn etp(
        primitive: impl Into<String>,
        context: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Etp {
            primitive: primitive.into(),
            context: context.into(),
            reason: reason.into(),
        }
    }
}
