//! The one error type of the library. Every fallible public function returns
//! [`Result<T>`]; messages name the op (or primitive) and the shapes involved.
//! Shapes are carried typed ([`Shape`]), and an error raised inside an ETP
//! primitive stays reachable, by variant, through [`std::error::Error::source`].

pub use crate::dtype::DType;
/// The safetensors crate's error, the source of an [`Error::Safetensors`]
/// (re-exported so that `source().downcast_ref` can name it).
pub use safetensors::SafeTensorError;
use std::fmt;
use std::sync::Arc;
use thiserror::Error;

/// A tensor shape as an error carries it: the dimensions, displayed as
/// `[2, 3]` (`[]` for a scalar).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}

impl From<&Vec<usize>> for Shape {
    fn from(d: &Vec<usize>) -> Self {
        Shape(d.clone())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Self {
        Shape(d.to_vec())
    }
}

impl PartialEq<[usize]> for Shape {
    fn eq(&self, other: &[usize]) -> bool {
        self.0 == other
    }
}

/// The error an [`Error::Etp`] wraps: a boxed [`Error`](enum@Error) that dereferences
/// to it. It is its own type rather than a plain `Box<Error>` so that
/// [`std::error::Error::source`] hands out the inner `Error` itself (which
/// `downcast_ref::<Error>()` finds) and not the box around it.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorBox(pub Box<Error>);

impl ErrorBox {
    /// Box `e`.
    pub fn new(e: Error) -> Self {
        ErrorBox(Box::new(e))
    }
}

impl std::ops::Deref for ErrorBox {
    type Target = Error;
    fn deref(&self) -> &Error {
        &self.0
    }
}

/// An error of another library (io, safetensors) kept as the
/// [`source`](std::error::Error::source) of an [`Error`](enum@Error): shared,
/// so that the error stays `Clone`, and dereferencing to `E`, so that
/// `source()` hands out the `E` itself (which `downcast_ref::<E>()` finds).
/// Two are equal when they are the same error or display the same.
#[derive(Debug)]
pub struct Shared<E>(pub Arc<E>);

impl<E> Shared<E> {
    /// Share `e`.
    pub fn new(e: E) -> Self {
        Shared(Arc::new(e))
    }
}

impl<E> Clone for Shared<E> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<E> std::ops::Deref for Shared<E> {
    type Target = E;
    fn deref(&self) -> &E {
        &self.0
    }
}

impl<E: fmt::Display> fmt::Display for Shared<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: fmt::Display> PartialEq for Shared<E> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

/// `f32 or f64`: the dtypes an [`Error::DType`] expected, for its message.
fn dtype_list(dtypes: &[DType]) -> String {
    match dtypes {
        [] => "another dtype".into(),
        [one] => one.to_string(),
        [init @ .., last] => format!(
            "{} or {last}",
            init.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The message of [`Error::DType`]: the argument, its dtype, what was
/// expected, then the detail (shapes, a hint) when there is one.
fn dtype_message(op: &str, arg: &str, expected: &[DType], got: &DType, detail: &str) -> String {
    let head = format!(
        "{op}: dtype mismatch: {arg} is {got}, expected {}",
        dtype_list(expected)
    );
    if detail.is_empty() {
        head
    } else {
        format!("{head} ({detail})")
    }
}

/// `[2, 3] and [4]`: the shapes of a [`Error::Shape`], for its message.
fn shape_list(shapes: &[Shape]) -> String {
    shapes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

/// The message of [`Error::Shape`]: the op, the shapes in operand order,
/// then what was expected.
fn shape_message(op: &str, shapes: &[Shape], reason: &str) -> String {
    if shapes.is_empty() {
        format!("{op}: incompatible shapes: {reason}")
    } else {
        format!("{op}: incompatible shapes {}: {reason}", shape_list(shapes))
    }
}

/// The message of [`Error::Etp`]: the inner error's message, without
/// repeating the primitive's name when the inner error already starts with it.
fn etp_message(primitive: &str, context: &str, source: &Error) -> String {
    let inner = source.to_string();
    let inner = inner
        .strip_prefix(primitive)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(&inner);
    format!("ETP primitive `{primitive}`, {context}: {inner}")
}

/// Errors returned by braintrace.
///
/// Match on the variant (`Error::Shape { .. }`) to react to a kind of
/// failure; more variants may be added, so a `match` needs a `_` arm.
#[derive(Debug, Clone, Error, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// Operand shapes that an op cannot combine.
    #[error("{}", shape_message(op, shapes, reason))]
    Shape {
        /// The op or primitive that refused the input.
        op: String,
        /// The offending shapes, in operand order.
        shapes: Vec<Shape>,
        /// What was expected, naming the arguments the shapes belong to.
        reason: String,
    },
    /// An operand of a dtype the op cannot take (or cannot combine with
    /// another operand's).
    #[error("{}", dtype_message(op, arg, expected, got, detail))]
    DType {
        /// The op or primitive.
        op: String,
        /// The argument (`rhs`, `indices`, ``gradient `lin/weight` ``).
        arg: String,
        /// The dtypes the op takes there ([`DType::FLOATS`] for a float op;
        /// one, the other operand's, when two must agree).
        expected: Vec<DType>,
        /// The argument's dtype.
        got: DType,
        /// More context: the shapes, the other operand, a hint (may be empty).
        detail: String,
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
    #[error("{op}: axis {axis} is out of range for an operand of shape {shape}")]
    Axis {
        /// The op.
        op: String,
        /// The offending axis.
        axis: isize,
        /// The operand's shape.
        shape: Shape,
    },
    /// A result whose memory cannot be allocated: its byte size overflows,
    /// or the system refused it. The shape itself is valid (so tracing, which
    /// allocates nothing, accepts it).
    #[error("{op}: cannot allocate {elements} elements ({bytes}) for a result of shape {shape}")]
    Allocation {
        /// The op.
        op: String,
        /// The result's shape.
        shape: Shape,
        /// Its number of elements.
        elements: usize,
        /// Its size in bytes, or why there is none (`"more than isize::MAX bytes"`).
        bytes: String,
    },
    /// An index value outside the axis it indexes (`take`, `scatter_add`).
    #[error("{op}: index {index} is out of bounds for axis {axis} with size {size} (valid range [0, {size}))")]
    Index {
        /// The op.
        op: String,
        /// The offending index.
        index: i64,
        /// The indexed axis.
        axis: usize,
        /// That axis's size.
        size: usize,
    },
    /// A value-dependent question asked of a symbolic tensor while tracing.
    #[error(
        "{op}: needs concrete data but got a symbolic tensor of shape {shape} (it is being traced)"
    )]
    Symbolic {
        /// What needed the data.
        op: String,
        /// The traced tensor's shape.
        shape: Shape,
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
    /// A failure inside an ETP primitive or one of its rules. The error
    /// raised inside is kept, typed, as the [`source`](std::error::Error::source).
    #[error("{}", etp_message(primitive, context, source))]
    Etp {
        /// The primitive's name.
        primitive: String,
        /// Where: `bind`, `rule yw_to_w`, `registration`, ...
        context: String,
        /// The error raised inside (an [`Error::Invalid`] naming the
        /// primitive when the ETP layer itself refused).
        #[source]
        source: ErrorBox,
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
    /// A NaN or an infinity where a finite value is required (a gradient
    /// under [`NonFinite::Error`](crate::learn::NonFinite), a parameter given
    /// to `set_param`, an optimiser setting).
    #[error("{op}: {what} `{key}` holds {value} at index {index:?}{}", at_step(.step))]
    NonFinite {
        /// The op, optimiser or entry point that refused it.
        op: String,
        /// What `key` names (`gradient`, `parameter`, `hidden state`, `setting`).
        what: String,
        /// The key (`rnn/Wz/weight/weight`) or setting name (`lr`).
        key: String,
        /// The row-major multi-index of the first non-finite element (empty
        /// for a scalar).
        index: Vec<usize>,
        /// Its value (NaN, inf or -inf).
        value: f64,
        /// The step it appeared at, for the learner's drivers: the row of
        /// the sequence (`etrace_grad`, `evolve`) or the learner's step
        /// counter (`update`); `None` elsewhere.
        step: Option<usize>,
    },
    /// A file that cannot be read or written; the io error is the
    /// [`source`](std::error::Error::source).
    #[error("{op}: cannot {action} {path}: {source}")]
    Io {
        /// The entry point (`load_safetensors`, `Checkpoint::save`).
        op: String,
        /// `read`, `write`, ...
        action: String,
        /// The file.
        path: String,
        /// The io error.
        #[source]
        source: Shared<std::io::Error>,
    },
    /// Bytes that are not a safetensors buffer, or tensors one cannot hold;
    /// the safetensors error is the [`source`](std::error::Error::source).
    #[error("{op}: {context}: {source}")]
    Safetensors {
        /// The entry point (`params_from_bytes`, `load_safetensors`).
        op: String,
        /// What was being read or written (the file, the tensor's key).
        context: String,
        /// The safetensors error.
        #[source]
        source: Shared<SafeTensorError>,
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

/// `Result` with the library's [`Error`](enum@Error)(enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// [`Error::Shape`] with typed shapes: `shapes` are the operands' shapes
    /// in order (`[&a[..], &b[..]]`, `vec![shape]`, ...).
    pub fn shapes<S: Into<Shape>>(
        op: impl Into<String>,
        shapes: impl IntoIterator<Item = S>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Shape {
            op: op.into(),
            shapes: shapes.into_iter().map(Into::into).collect(),
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
    /// [`Error::DType`]: argument `arg` of `op` is a `got` where one of
    /// `expected` was wanted.
    pub fn dtype(
        op: impl Into<String>,
        arg: impl Into<String>,
        expected: impl IntoIterator<Item = DType>,
        got: DType,
    ) -> Self {
        Error::dtype_with(op, arg, expected, got, "")
    }
    /// [`Error::dtype`] with a detail for the message (the shapes, the
    /// other operand, a hint).
    pub fn dtype_with(
        op: impl Into<String>,
        arg: impl Into<String>,
        expected: impl IntoIterator<Item = DType>,
        got: DType,
        detail: impl Into<String>,
    ) -> Self {
        Error::DType {
            op: op.into(),
            arg: arg.into(),
            expected: expected.into_iter().collect(),
            got,
            detail: detail.into(),
        }
    }
    /// [`Error::DType`] for two operands that must have one dtype (floats,
    /// when `floats`): names the lhs when it is no float, else the rhs,
    /// expected to have the lhs's dtype; both dtypes and shapes and the
    /// `hint` (may be empty) are the detail.
    pub fn dtype_pair(
        op: impl Into<String>,
        (a, a_shape): (DType, &[usize]),
        (b, b_shape): (DType, &[usize]),
        floats: bool,
        hint: &str,
    ) -> Self {
        let mut detail = format!("lhs {a} {a_shape:?}, rhs {b} {b_shape:?}");
        if !hint.is_empty() {
            detail = format!("{detail}; {hint}");
        }
        if floats && !a.is_float() {
            Error::dtype_with(op, "lhs", DType::FLOATS, a, detail)
        } else {
            Error::dtype_with(op, "rhs", [a], b, detail)
        }
    }
    /// [`Error::Io`]: `op` could not `action` (`read`, `write`) the file
    /// `path`.
    pub fn io(
        op: impl Into<String>,
        action: impl Into<String>,
        path: &std::path::Path,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            op: op.into(),
            action: action.into(),
            path: path.display().to_string(),
            source: Shared::new(source),
        }
    }
    /// [`Error::Safetensors`]: `op` failed on `context` (a key, a file).
    pub fn safetensors(
        op: impl Into<String>,
        context: impl Into<String>,
        source: SafeTensorError,
    ) -> Self {
        Error::Safetensors {
            op: op.into(),
            context: context.into(),
            source: Shared::new(source),
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
            shape: shape.into(),
        }
    }
    /// [`Error::Etp`] for a refusal by the ETP layer itself: the source is an
    /// [`Error::Invalid`] naming the primitive.
    pub fn etp(
        primitive: impl Into<String>,
        context: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        let primitive = primitive.into();
        Error::Etp {
            source: ErrorBox::new(Error::invalid(primitive.clone(), reason)),
            primitive,
            context: context.into(),
        }
    }
    /// [`Error::Etp`] wrapping `source`, an error raised inside the
    /// primitive `primitive` at `context`; the source stays typed.
    pub fn etp_wrap(
        primitive: impl Into<String>,
        context: impl Into<String>,
        source: Error,
    ) -> Self {
        Error::Etp {
            primitive: primitive.into(),
            context: context.into(),
            source: ErrorBox::new(source),
        }
    }
    /// [`Error::Allocation`] of `elements` elements of `elem_bytes` bytes each.
    pub fn allocation(
        op: impl Into<String>,
        shape: &[usize],
        elements: usize,
        elem_bytes: usize,
    ) -> Self {
        Error::Allocation {
            op: op.into(),
            shape: shape.into(),
            elements,
            bytes: match elements.checked_mul(elem_bytes) {
                Some(b) if b <= isize::MAX as usize => format!("{b} bytes"),
                _ => "more than isize::MAX bytes".into(),
            },
        }
    }
    /// The innermost error: follows [`Error::Etp`] wraps down to the error
    /// that was first raised (itself when it wraps nothing).
    pub fn root(&self) -> &Error {
        match self {
            Error::Etp { source, .. } => source.root(),
            other => other,
        }
    }
    /// The op, transform or primitive the error names (for an
    /// [`Error::Etp`], the primitive; for a registry error, the name).
    pub fn op(&self) -> &str {
        match self {
            Error::Shape { op, .. }
            | Error::DType { op, .. }
            | Error::Arity { op, .. }
            | Error::Axis { op, .. }
            | Error::Index { op, .. }
            | Error::Allocation { op, .. }
            | Error::Symbolic { op, .. }
            | Error::EscapedTracer { op, .. }
            | Error::Param { op, .. }
            | Error::NonFinite { op, .. }
            | Error::Io { op, .. }
            | Error::Safetensors { op, .. }
            | Error::Invalid { op, .. } => op,
            Error::Transform { transform, .. } => transform,
            Error::MissingRule { primitive, .. } | Error::Etp { primitive, .. } => primitive,
            Error::DuplicatePrimitive { name, .. } | Error::UnknownPrimitive(name) => name,
        }
    }
}

/// ` at step t` for [`Error::NonFinite`]'s message, or nothing.
fn at_step(step: &Option<usize>) -> String {
    step.map(|t| format!(" at step {t}")).unwrap_or_default()
}
