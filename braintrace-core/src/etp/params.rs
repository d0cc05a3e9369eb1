//! Static parameters of an ETP equation: a hashable, comparable, printable
//! key -> value map (like JAX equation params), the `ParamType` conversion
//! the macros' typed params structs use, and `ElemFn`, a named element-wise
//! weight transform with its derivative.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// One parameter value.
#[derive(Clone, Debug)]
pub enum ParamValue {
    /// Absent / null.
    None,
    /// A flag.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (compared and hashed by bits).
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    List(Vec<ParamValue>),
    /// A nested map.
    Map(BTreeMap<String, ParamValue>),
    /// An element-wise function with its derivative.
    Func(ElemFn),
}

impl PartialEq for ParamValue {
    fn eq(&self, other: &Self) -> bool {
        use ParamValue::*;
        match (self, other) {
            (None, None) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (Str(a), Str(b)) => a == b,
            (List(a), List(b)) => a == b,
            (Map(a), Map(b)) => a == b,
            (Func(a), Func(b)) => a == b,
            _ => false,
        }
    }
}
impl Eq for ParamValue {}

impl Hash for ParamValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            ParamValue::None => {}
            ParamValue::Bool(b) => b.hash(state),
            ParamValue::Int(i) => i.hash(state),
            ParamValue::Float(f) => f.to_bits().hash(state),
            ParamValue::Str(s) => s.hash(state),
            ParamValue::List(l) => l.hash(state),
            ParamValue::Map(m) => m.hash(state),
            ParamValue::Func(f) => f.name().hash(state),
        }
    }
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::None => f.write_str("None"),
            ParamValue::Bool(b) => write!(f, "{b}"),
            ParamValue::Int(i) => write!(f, "{i}"),
            ParamValue::Float(x) => write!(f, "{x:?}"),
            ParamValue::Str(s) => write!(f, "{s}"),
            ParamValue::List(l) => {
                f.write_str("(")?;
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str(")")
            }
            ParamValue::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k}:{v}")?;
                }
                f.write_str("}")
            }
            ParamValue::Func(func) => f.write_str(func.name()),
        }
    }
}

/// The params of an ETP equation.
///
/// ```
/// use braintrace_core::etp::Params;
/// let p = Params::new().with("scale", 0.5).with("has_bias", false);
/// assert_eq!(p.get::<f64>("op", "scale")?, 0.5);
/// assert_eq!(p.to_string(), "has_bias=false scale=0.5");
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Params(BTreeMap<String, ParamValue>);

impl Params {
    /// No params.
    pub fn new() -> Self {
        Params(BTreeMap::new())
    }
    /// Add (or replace) a param.
    pub fn with(mut self, key: &str, value: impl ParamType) -> Self {
        self.0.insert(key.to_string(), value.to_param());
        self
    }
    /// Insert a raw value.
    pub fn insert(&mut self, key: &str, value: ParamValue) {
        self.0.insert(key.to_string(), value);
    }
    /// The raw value of a key.
    pub fn raw(&self, key: &str) -> Option<&ParamValue> {
        self.0.get(key)
    }
    /// A typed value; `op` names the primitive in the error.
    /// An absent key reads as the type's [`ParamType::absent`] value (`None`
    /// for `Option`s).
    pub fn get<T: ParamType>(&self, op: &str, key: &str) -> Result<T> {
        let Some(v) = self.0.get(key) else {
            return T::absent().ok_or_else(|| Error::Param {
                op: op.into(),
                param: key.into(),
                reason: "missing".into(),
            });
        };
        T::from_param(v).ok_or_else(|| Error::Param {
            op: op.into(),
            param: key.into(),
            reason: format!("cannot read {v} as {}", std::any::type_name::<T>()),
        })
    }
    /// A typed value, or `default` when absent.
    pub fn get_or<T: ParamType>(&self, op: &str, key: &str, default: T) -> Result<T> {
        if self.0.contains_key(key) {
            self.get(op, key)
        } else {
            Ok(default)
        }
    }
    /// Iterate over `(key, value)` in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &ParamValue)> {
        self.0.iter()
    }
    /// Number of params.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Types that can be ETP params: hashable and comparable values.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an ETP primitive param",
    label = "this type is not a param type",
    note = "params must be hashable and comparable: integers, bools, floats, strings, `ElemFn`, and `Vec`/`Option`/tuples of those; implement `braintrace::etp::ParamType` for your own enum"
)]
pub trait ParamType: Sized {
    /// Convert to the dynamic form.
    fn to_param(&self) -> ParamValue;
    /// Convert back (`None` if the value has another kind).
    fn from_param(v: &ParamValue) -> Option<Self>;
    /// The value of an absent key, if the type has one (`Option`: `None`).
    fn absent() -> Option<Self> {
        None
    }
}

macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl ParamType for $t {
            fn to_param(&self) -> ParamValue { ParamValue::Int(*self as i64) }
            fn from_param(v: &ParamValue) -> Option<Self> {
                match v { ParamValue::Int(i) => <$t>::try_from(*i).ok(), _ => None }
            }
        }
    )*};
}
int_param!(i8, i16, i32, i64, u8, u16, u32, u64, usize, isize);

impl ParamType for f64 {
    fn to_param(&self) -> ParamValue {
        ParamValue::Float(*self)
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::Float(x) => Some(*x),
            ParamValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}
impl ParamType for f32 {
    fn to_param(&self) -> ParamValue {
        ParamValue::Float(*self as f64)
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        f64::from_param(v).map(|x| x as f32)
    }
}
impl ParamType for bool {
    fn to_param(&self) -> ParamValue {
        ParamValue::Bool(*self)
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
}
impl ParamType for String {
    fn to_param(&self) -> ParamValue {
        ParamValue::Str(self.clone())
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::Str(s) => Some(s.clone()),
            _ => None,
        }
    }
}
impl ParamType for &'static str {
    fn to_param(&self) -> ParamValue {
        ParamValue::Str(self.to_string())
    }
    fn from_param(_v: &ParamValue) -> Option<Self> {
        None
    }
}
impl<T: ParamType> ParamType for Vec<T> {
    fn to_param(&self) -> ParamValue {
        ParamValue::List(self.iter().map(T::to_param).collect())
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::List(l) => l.iter().map(T::from_param).collect(),
            _ => None,
        }
    }
}
impl<T: ParamType> ParamType for Option<T> {
    fn to_param(&self) -> ParamValue {
        match self {
            Some(v) => v.to_param(),
            None => ParamValue::None,
        }
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::None => Some(None),
            other => T::from_param(other).map(Some),
        }
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
}
impl<A: ParamType, B: ParamType> ParamType for (A, B) {
    fn to_param(&self) -> ParamValue {
        ParamValue::List(vec![self.0.to_param(), self.1.to_param()])
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::List(l) if l.len() == 2 => {
                Some((A::from_param(&l[0])?, B::from_param(&l[1])?))
            }
            _ => None,
        }
    }
}
impl ParamType for ParamValue {
    fn to_param(&self) -> ParamValue {
        self.clone()
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        Some(v.clone())
    }
}
impl ParamType for ElemFn {
    fn to_param(&self) -> ParamValue {
        ParamValue::Func(self.clone())
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        match v {
            ParamValue::Func(f) => Some(f.clone()),
            ParamValue::Str(s) => ElemFn::builtin(s),
            _ => None,
        }
    }
}

type TensorFn = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;
type VjpFn = Arc<dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync>;

/// A named element-wise function with its derivative, used as an optional
/// weight transform (`weight_fn`, `bias_fn`, ...). Compared by name.
///
/// ```
/// use braintrace_core::{etp::ElemFn, Tensor};
/// let f = ElemFn::builtin("square").unwrap();
/// let w = Tensor::from_vec(vec![3.0], &[1])?;
/// assert_eq!(f.apply(&w)?.to_vec_f64()?, vec![9.0]);
/// assert_eq!(f.derivative(&w)?.to_vec_f64()?, vec![6.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone)]
pub struct ElemFn {
    name: Arc<str>,
    f: TensorFn,
    df: TensorFn,
    /// The pullback of a transform that is not element-wise
    /// ([`ElemFn::mapping`]); `None` for an element-wise one.
    vjp: Option<VjpFn>,
}

impl ElemFn {
    /// A user-supplied function and derivative.
    pub fn new<F, D>(name: &str, f: F, df: D) -> Self
    where
        F: Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
        D: Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
    {
        ElemFn {
            name: name.into(),
            f: Arc::new(f),
            df: Arc::new(df),
            vjp: None,
        }
    }
    /// A transform of the whole weight that is not element-wise (braintrace
    /// accepts any `weight_fn`, e.g. `ScaledWSLinear`'s weight
    /// standardisation), given by `f` and its pullback `vjp(w, g)` (the
    /// cotangent `g` of `f(w)` pulled back to `w`). The built-in rules use
    /// `vjp` where an element-wise transform multiplies by `f'(w)`
    /// ([`times_derivative`]); the fused trace kernels need `f'` and decline
    /// such a transform, so its equations run their rules. A dense weight's
    /// trace stays per `(input, output)` entry, which is exact when column
    /// `o` of `f(W)` depends on column `o` of `W` only (a per-output
    /// normalisation); [`ElemFn::derivative`] is an error.
    pub fn mapping<F, V>(name: &str, f: F, vjp: V) -> Self
    where
        F: Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
        V: Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
    {
        let n: Arc<str> = name.into();
        let n2 = n.clone();
        ElemFn {
            name: n,
            f: Arc::new(f),
            df: Arc::new(move |_| {
                Err(crate::Error::invalid(
                    format!("weight transform `{n2}`"),
                    "is not element-wise: it has a pullback, not a derivative",
                ))
            }),
            vjp: Some(Arc::new(vjp)),
        }
    }
    /// Whether the transform is element-wise (has a derivative `f'(w)`).
    pub fn is_elementwise(&self) -> bool {
        self.vjp.is_none()
    }
    /// `g` (a cotangent of `f(w)`) pulled back to `w`: `g ⊙ f'(w)` for an
    /// element-wise transform, its `vjp` otherwise.
    pub fn pullback(&self, w: &Tensor, g: &Tensor) -> Result<Tensor> {
        match &self.vjp {
            Some(v) => v(w, g),
            None => g.mul(&self.derivative(w)?),
        }
    }
    /// One of the built-in transforms: `identity`, `tanh`, `softplus`,
    /// `square`, `exp`, `sigmoid`, `relu`.
    pub fn builtin(name: &str) -> Option<ElemFn> {
        Some(match name {
            "identity" => ElemFn::new("identity", |w| Ok(w.clone()), |w| Ok(w.ones_like())),
            "tanh" => ElemFn::new("tanh", Tensor::tanh, |w| {
                w.tanh()?.square()?.rsub_scalar(1.0)
            }),
            "softplus" => ElemFn::new("softplus", Tensor::softplus, Tensor::sigmoid),
            "square" => ElemFn::new("square", Tensor::square, |w| w.mul_scalar(2.0)),
            "exp" => ElemFn::new("exp", Tensor::exp, Tensor::exp),
            "sigmoid" => ElemFn::new("sigmoid", Tensor::sigmoid, |w| {
                let s = w.sigmoid()?;
                s.mul(&s.rsub_scalar(1.0)?)
            }),
            "relu" => ElemFn::new("relu", Tensor::relu, Tensor::step),
            _ => return None,
        })
    }
    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// `f(w)`.
    pub fn apply(&self, w: &Tensor) -> Result<Tensor> {
        (self.f)(w)
    }
    /// `f'(w)`.
    pub fn derivative(&self, w: &Tensor) -> Result<Tensor> {
        (self.df)(w)
    }
}

impl PartialEq for ElemFn {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for ElemFn {}

impl fmt::Debug for ElemFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ElemFn({})", self.name)
    }
}

/// Apply an optional transform (`None` = identity).
pub fn apply_fn(f: &Option<ElemFn>, w: &Tensor) -> Result<Tensor> {
    match f {
        Some(f) => f.apply(w),
        None => Ok(w.clone()),
    }
}

/// Multiply `g` by the optional transform's derivative at `w` (pull `g`
/// back through it: [`ElemFn::pullback`]).
pub fn times_derivative(f: &Option<ElemFn>, w: &Tensor, g: &Tensor) -> Result<Tensor> {
    match f {
        Some(f) => f.pullback(w, g),
        None => Ok(g.clone()),
    }
}
