//! The core op vocabulary. Each op is a small struct implementing
//! [`Primitive`] (eval kernel, shape rule, JVP, transpose for linear
//! operands, batching); user code calls them through `Tensor` methods,
//! which also do numpy-style broadcasting.

pub mod conv;
pub mod elementwise;
pub mod index;
mod inplace;
pub mod linalg;
pub mod shape;
mod spike;
mod surrogate;
mod xent;

pub use crate::tensor::avals;
pub use conv::{conv_general, ConvDimensionNumbers, ConvPadding, ConvParams};
pub use elementwise::{BinaryOp, CompareOp, ScalarOp, UnaryOp};
pub use spike::{spike, Spike, Surrogate, SurrogateGrad};
pub(crate) use surrogate::surrogate_block;
pub use xent::{softmax_xent, SoftmaxXent, SoftmaxXentLinear};

use crate::error::{Error, Result};
use crate::graph::{bind, bind1, Primitive};
use crate::tensor::{Aval, DType, Tensor};
use elementwise::{binary, compare, scalar_op, unary, Cast, StopGradient};
use shape::{broadcast_in_dim, Reshape, SliceOp, Transpose};
use std::sync::Arc;

pub(crate) fn check_arity<T>(op: &str, inputs: &[T], n: usize) -> Result<()> {
    if inputs.len() != n {
        return Err(Error::arity(op, n, inputs.len()));
    }
    Ok(())
}

/// The numpy broadcast of several shapes.
pub fn broadcast_shapes(op: &str, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; r];
    for s in shapes {
        let off = r - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(Error::shapes(
                    op,
                    shapes.iter().copied(),
                    "shapes cannot be broadcast together",
                ));
            }
        }
    }
    Ok(out)
}

/// Broadcast `x` to `shape` with numpy (right-aligned) rules.
pub(crate) fn lift(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if x.shape() == shape {
        return Ok(x.clone());
    }
    if x.ndim() > shape.len() {
        return Err(Error::shapes(
            "broadcast_to",
            [x.shape(), shape],
            "cannot broadcast to a lower rank",
        ));
    }
    let off = shape.len() - x.ndim();
    let dims: Vec<usize> = (off..shape.len()).collect();
    broadcast_in_dim(x, shape, &dims)
}

pub(crate) fn broadcast_pair(op: &str, a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    if a.dtype() != b.dtype() {
        return Err(Error::dtype_pair(
            op,
            (a.dtype(), a.shape()),
            (b.dtype(), b.shape()),
            false,
            "cast one first",
        ));
    }
    let shape = broadcast_shapes(op, &[a.shape(), b.shape()])?;
    Ok((lift(a, &shape)?, lift(b, &shape)?))
}

/// Give an unbatched operand a leading batch axis of `size`.
pub(crate) fn bcast_to_batch(x: &Tensor, batched: bool, size: usize) -> Result<Tensor> {
    if batched {
        return Ok(x.clone());
    }
    let mut shape = vec![size];
    shape.extend(x.shape());
    let dims: Vec<usize> = (1..=x.ndim()).collect();
    broadcast_in_dim(x, &shape, &dims)
}

pub(crate) fn zeros_for(x: &Tensor) -> Tensor {
    x.zeros_like()
}

/// The JVP of a bilinear op `f(a, b)`: `f(ta, b) + f(a, tb)` (matmul and
/// the convolutions).
pub(crate) fn bilinear_jvp(
    p: &[Tensor],
    t: &[Option<Tensor>],
    f: impl Fn(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
    let y = f(&p[0], &p[1])?;
    let a = t[0].as_ref().map(|t| f(t, &p[1])).transpose()?;
    let b = t[1].as_ref().map(|t| f(&p[0], t)).transpose()?;
    Ok((vec![y], vec![elementwise::add_opt(a, b)?]))
}

/// A batching rule for any primitive: apply it to each slice of the batch
/// and stack the results. Correct for every op; ops with a vectorised rule
/// use this only for the rare operand combinations they do not cover.
pub fn batch_by_loop(
    prim: &dyn Primitive,
    args: &[Tensor],
    batched: &[bool],
    size: usize,
) -> Result<(Vec<Tensor>, Vec<bool>)> {
    let p = prim.clone_arc();
    if size == 0 {
        // No example to run: the outputs are empty along the batch axis.
        let ex: Vec<Aval> = args
            .iter()
            .zip(batched)
            .map(|(a, &b)| {
                if b {
                    a.aval().with_shape(&a.shape()[1..])
                } else {
                    a.aval()
                }
            })
            .collect();
        let outs: Vec<Tensor> = p
            .abstract_eval(&ex)?
            .iter()
            .map(|o| {
                let mut s = vec![0];
                s.extend(o.shape());
                Tensor::zeros(&s, o.dtype())
            })
            .collect();
        let n = outs.len();
        return Ok((outs, vec![true; n]));
    }
    let mut per_out: Vec<Vec<Tensor>> = Vec::new();
    for i in 0..size {
        let sl: Vec<Tensor> = args
            .iter()
            .zip(batched)
            .map(|(a, &b)| if b { a.index_axis0(i) } else { Ok(a.clone()) })
            .collect::<Result<_>>()?;
        let outs = bind(p.clone(), &sl)?;
        if per_out.is_empty() {
            per_out = vec![Vec::new(); outs.len()];
        }
        for (k, o) in outs.into_iter().enumerate() {
            per_out[k].push(o);
        }
    }
    let outs = per_out
        .iter()
        .map(|v| stack(v, 0))
        .collect::<Result<Vec<_>>>()?;
    let n = outs.len();
    Ok((outs, vec![true; n]))
}

/// Concatenate along an existing axis.
pub fn concat(xs: &[Tensor], axis: usize) -> Result<Tensor> {
    shape::concat(xs, axis)
}

/// Stack along a new axis.
pub fn stack(xs: &[Tensor], axis: usize) -> Result<Tensor> {
    if xs.is_empty() {
        return Err(Error::arity("stack", "at least 1", 0));
    }
    let ex = xs
        .iter()
        .map(|x| x.expand_dims(axis))
        .collect::<Result<Vec<_>>>()?;
    shape::concat(&ex, axis)
}

/// `where(cond, a, b)` with broadcasting.
pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    elementwise::select(cond, a, b)
}

fn check_axis(op: &str, axis: usize, rank: usize, shape: &[usize]) -> Result<()> {
    if axis >= rank {
        return Err(Error::axis(op, axis as isize, shape));
    }
    Ok(())
}

fn sorted_axes(op: &str, axes: &[usize], shape: &[usize]) -> Result<Vec<usize>> {
    let mut a = axes.to_vec();
    a.sort_unstable();
    a.dedup();
    for &ax in &a {
        check_axis(op, ax, shape.len(), shape)?;
    }
    Ok(a)
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $op:expr;)*) => {
        $($(#[$m])* pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
            binary($op, self, other)
        })*
    };
}
macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:expr;)*) => {
        $($(#[$m])* pub fn $name(&self) -> Result<Tensor> { unary($op, self) })*
    };
}
macro_rules! scalar_methods {
    ($($(#[$m:meta])* $name:ident => $op:expr;)*) => {
        $($(#[$m])* pub fn $name(&self, s: f64) -> Result<Tensor> { scalar_op($op, self, s) })*
    };
}
macro_rules! compare_methods {
    ($($(#[$m:meta])* $name:ident => $op:expr;)*) => {
        $($(#[$m])* pub fn $name(&self, other: &Tensor) -> Result<Tensor> { compare($op, self, other) })*
    };
}

impl Tensor {
    binary_methods! {
        /// `self + other` (broadcasting).
        add => BinaryOp::Add;
        /// `self - other` (broadcasting).
        sub => BinaryOp::Sub;
        /// `self * other` (broadcasting).
        mul => BinaryOp::Mul;
        /// `self / other` (broadcasting).
        div => BinaryOp::Div;
        /// Element-wise maximum (broadcasting).
        maximum => BinaryOp::Max;
        /// Element-wise minimum (broadcasting).
        minimum => BinaryOp::Min;
        /// `self ^ other` (broadcasting).
        pow => BinaryOp::Pow;
    }
    unary_methods! {
        /// `-self`
        neg => UnaryOp::Neg;
        /// `e^self`
        exp => UnaryOp::Exp;
        /// natural logarithm
        log => UnaryOp::Log;
        /// hyperbolic tangent
        tanh => UnaryOp::Tanh;
        /// logistic sigmoid `1/(1+e^-x)`
        sigmoid => UnaryOp::Sigmoid;
        /// `max(x, 0)`
        relu => UnaryOp::Relu;
        /// Heaviside step `1[x > 0]` (zero derivative; relu's derivative)
        step => UnaryOp::Step;
        /// sign (zero derivative)
        sign => UnaryOp::Sign;
        /// square root
        sqrt => UnaryOp::Sqrt;
        /// absolute value
        abs => UnaryOp::Abs;
        /// sine
        sin => UnaryOp::Sin;
        /// cosine
        cos => UnaryOp::Cos;
        /// `x * x`
        square => UnaryOp::Square;
        /// `1 / x`
        reciprocal => UnaryOp::Reciprocal;
        /// `log(1 + e^x)`
        softplus => UnaryOp::Softplus;
        /// arctangent (derivative `1 / (1 + x²)`)
        atan => UnaryOp::Atan;
        /// the error function (derivative `2/√π e^{−x²}`)
        erf => UnaryOp::Erf;
    }
    scalar_methods! {
        /// `self * s`
        mul_scalar => ScalarOp::Mul;
        /// `self / s` (divides; does not multiply by `1/s`, which overflows
        /// for a subnormal `s`)
        div_scalar => ScalarOp::Div;
        /// `self + s`
        add_scalar => ScalarOp::Add;
        /// `s - self`
        rsub_scalar => ScalarOp::RSub;
        /// `s / self`
        rdiv_scalar => ScalarOp::RDiv;
        /// `self ^ s`
        pow_scalar => ScalarOp::Pow;
        /// `max(self, s)`
        max_scalar => ScalarOp::Max;
        /// `min(self, s)`
        min_scalar => ScalarOp::Min;
    }
    compare_methods! {
        /// `self > other` (bool, broadcasting).
        gt => CompareOp::Gt;
        /// `self >= other`
        ge => CompareOp::Ge;
        /// `self < other`
        lt => CompareOp::Lt;
        /// `self <= other`
        le => CompareOp::Le;
        /// `self == other`
        eq_elem => CompareOp::Eq;
        /// `self != other`
        ne_elem => CompareOp::Ne;
    }

    /// `self - s`
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        self.add_scalar(-s)
    }

    /// Matrix product with numpy semantics: 1-D operands are promoted
    /// (and the added axis removed), leading dimensions broadcast.
    ///
    /// ```
    /// use braintrace_core::Tensor;
    /// let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let v = Tensor::from_vec(vec![1.0, 1.0], &[2])?;
    /// assert_eq!(a.matmul(&v)?.to_vec_f64()?, vec![3.0, 7.0]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = (self, other);
        if a.ndim() == 0 || b.ndim() == 0 {
            return Err(Error::shapes(
                "matmul",
                [a.shape(), b.shape()],
                "operands must have rank >= 1",
            ));
        }
        if a.dtype() != b.dtype() {
            return Err(Error::dtype_pair(
                "matmul",
                (a.dtype(), a.shape()),
                (b.dtype(), b.shape()),
                false,
                "cast one first",
            ));
        }
        let a2 = if a.ndim() == 1 {
            a.reshape(&[1, a.shape()[0]])?
        } else {
            a.clone()
        };
        let b2 = if b.ndim() == 1 {
            b.reshape(&[b.shape()[0], 1])?
        } else {
            b.clone()
        };
        let (ra, rb) = (a2.ndim(), b2.ndim());
        if a2.shape()[ra - 1] != b2.shape()[rb - 2] {
            return Err(Error::shapes(
                "matmul",
                [a.shape(), b.shape()],
                format!(
                    "contracting dimensions differ ({} vs {})",
                    a2.shape()[ra - 1],
                    b2.shape()[rb - 2]
                ),
            ));
        }
        let lead = broadcast_shapes("matmul", &[&a2.shape()[..ra - 2], &b2.shape()[..rb - 2]])
            .map_err(|_| {
                Error::shapes(
                    "matmul",
                    [a.shape(), b.shape()],
                    "leading (batch) dimensions cannot be broadcast together",
                )
            })?;
        let mut sa = lead.clone();
        sa.extend(&a2.shape()[ra - 2..]);
        let mut sb = lead.clone();
        sb.extend(&b2.shape()[rb - 2..]);
        let y = linalg::matmul_raw(&lift(&a2, &sa)?, &lift(&b2, &sb)?)?;
        let mut out = lead;
        if a.ndim() > 1 {
            out.push(a2.shape()[ra - 2]);
        }
        if b.ndim() > 1 {
            out.push(b2.shape()[rb - 1]);
        }
        if out.as_slice() == y.shape() {
            Ok(y)
        } else {
            y.reshape(&out)
        }
    }

    /// Permute axes (`perm[i]` is the input axis of output axis `i`).
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor> {
        shape::check_perm("transpose", perm, self.shape())?;
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(self.clone());
        }
        bind1(
            Arc::new(Transpose {
                perm: perm.to_vec(),
            }),
            std::slice::from_ref(self),
        )
    }
    /// Swap the last two axes.
    pub fn t(&self) -> Result<Tensor> {
        if self.ndim() < 2 {
            return Err(Error::shapes("t", [self.shape()], "needs rank >= 2"));
        }
        linalg::swap_last(self)
    }
    /// Reshape (row-major) to `shape`.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        bind1(
            Arc::new(Reshape {
                shape: shape.to_vec(),
            }),
            std::slice::from_ref(self),
        )
    }
    /// Insert an axis of size 1 at `axis` (0..=ndim).
    pub fn expand_dims(&self, axis: usize) -> Result<Tensor> {
        if axis > self.ndim() {
            return Err(Error::axis("expand_dims", axis as isize, self.shape()));
        }
        let mut s = self.shape().to_vec();
        s.insert(axis, 1);
        self.reshape(&s)
    }
    /// Remove the given axes, which must have size 1.
    pub fn squeeze(&self, axes: &[usize]) -> Result<Tensor> {
        let axes = sorted_axes("squeeze", axes, self.shape())?;
        for &a in &axes {
            if self.shape()[a] != 1 {
                return Err(Error::shapes(
                    "squeeze",
                    [self.shape()],
                    format!("axis {a} has size {}, not 1", self.shape()[a]),
                ));
            }
        }
        let s: Vec<usize> = self
            .shape()
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        self.reshape(&s)
    }
    /// Broadcast to `shape` (numpy rules).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        broadcast_shapes("broadcast_to", &[self.shape(), shape]).and_then(|s| {
            if s != shape {
                Err(Error::shapes(
                    "broadcast_to",
                    [self.shape(), shape],
                    "cannot broadcast",
                ))
            } else {
                lift(self, shape)
            }
        })
    }
    /// Sum over `axes` (removed).
    pub fn sum(&self, axes: &[usize]) -> Result<Tensor> {
        let axes = sorted_axes("sum", axes, self.shape())?;
        if axes.is_empty() {
            return Ok(self.clone());
        }
        bind1(
            Arc::new(shape::ReduceSum { axes }),
            std::slice::from_ref(self),
        )
    }
    /// Sum of all elements (a 0-d tensor).
    pub fn sum_all(&self) -> Result<Tensor> {
        let axes: Vec<usize> = (0..self.ndim()).collect();
        if axes.is_empty() {
            return Ok(self.clone());
        }
        self.sum(&axes)
    }
    /// Mean over `axes` (removed). Over a zero-size axis it is NaN (0/0),
    /// as in numpy and JAX.
    pub fn mean(&self, axes: &[usize]) -> Result<Tensor> {
        let axes = sorted_axes("mean", axes, self.shape())?;
        // Counted in f64: a traced shape may hold more than usize::MAX elements.
        let n: f64 = axes.iter().map(|&a| self.shape()[a] as f64).product();
        self.sum(&axes)?.div_scalar(n)
    }
    /// Mean of all elements (NaN for a tensor with no elements).
    pub fn mean_all(&self) -> Result<Tensor> {
        let axes: Vec<usize> = (0..self.ndim()).collect();
        self.mean(&axes)
    }
    /// Slice `[starts, limits)` on every axis.
    pub fn slice(&self, starts: &[usize], limits: &[usize]) -> Result<Tensor> {
        // The whole tensor (a state axis of one, say): the value itself,
        // no copy and no equation, as `cast` to its own dtype.
        if starts.len() == self.ndim() && starts.iter().all(|&s| s == 0) && limits == self.shape() {
            return Ok(self.clone());
        }
        bind1(
            Arc::new(SliceOp {
                starts: starts.to_vec(),
                limits: limits.to_vec(),
            }),
            std::slice::from_ref(self),
        )
    }
    /// Slice `[start, end)` along one axis.
    pub fn slice_axis(&self, axis: usize, start: usize, end: usize) -> Result<Tensor> {
        check_axis("slice_axis", axis, self.ndim(), self.shape())?;
        let mut s = vec![0; self.ndim()];
        let mut l = self.shape().to_vec();
        s[axis] = start;
        l[axis] = end;
        self.slice(&s, &l)
    }
    /// Element `i` along axis 0 (the axis removed).
    pub fn index_axis0(&self, i: usize) -> Result<Tensor> {
        self.index_axis(0, i)
    }
    /// Element `i` along `axis` (the axis removed).
    pub fn index_axis(&self, axis: usize, i: usize) -> Result<Tensor> {
        check_axis("index_axis", axis, self.ndim(), self.shape())?;
        if i >= self.shape()[axis] {
            return Err(Error::invalid(
                "index_axis",
                format!(
                    "index {i} out of range for axis {axis} of shape {:?}",
                    self.shape()
                ),
            ));
        }
        self.slice_axis(axis, i, i + 1)?.squeeze(&[axis])
    }
    /// numpy `take` with i64 indices along `axis`.
    pub fn take(&self, indices: &Tensor, axis: usize) -> Result<Tensor> {
        index::take(self, indices, axis)
    }
    /// Convert to another dtype.
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        bind1(Arc::new(Cast(dtype)), std::slice::from_ref(self))
    }
    /// Identity with a zero derivative.
    pub fn stop_gradient(&self) -> Result<Tensor> {
        bind1(Arc::new(StopGradient), std::slice::from_ref(self))
    }
    /// Zero-pad by `lo`/`hi` elements per axis.
    pub fn pad(&self, lo: &[usize], hi: &[usize]) -> Result<Tensor> {
        shape::pad(self, lo, hi)
    }
    /// A scalar of this tensor's dtype broadcast later by arithmetic.
    pub fn scalar_like(&self, v: f64) -> Tensor {
        Tensor::scalar_of(v, self.dtype())
    }
}
