//! Kernels that write into a preallocated output tensor instead of
//! allocating one: element-wise binary and scalar ops, a copy, a scaled add
//! `out = a·out + b·x`, and `out = α·(a @ b) + β·out` through
//! `ndarray::linalg::general_mat_mul`.
//!
//! The output is written through [`Tensor::data_mut`]: when the handle is
//! unique its buffer is updated where it lies; when the value is shared it
//! is copied first (copy-on-write), so other handles never see a change.
//! These are eager operations on concrete data (a learner's trace buffers);
//! a symbolic operand is an error. Operands broadcast (numpy rules) to the
//! output's shape, which never changes.

use super::elementwise::{BinaryOp, ScalarOp};
use crate::error::{Error, Result};
use crate::tensor::{ArrayData, DType, Tensor};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, Axis, Ix1, Ix2, Ix3, Ix4, LinalgScalar, Zip};
use num_traits::Float;

/// `f(out, x)` into `out` for every element, `x` broadcast to `out`'s shape
/// (checked by the caller). Equal shapes take the contiguous path; a
/// broadcast iterates with a fixed rank where it can (several times faster
/// than `IxDyn`).
fn zip_assign<T: Copy>(out: &mut ArrayD<T>, x: &ArrayD<T>, f: impl Fn(T, T) -> T) -> Option<()> {
    if out.shape() == x.shape() {
        Zip::from(out).and(x).for_each(|o, &y| *o = f(*o, y));
        return Some(());
    }
    let xv = x.broadcast(out.raw_dim())?;
    macro_rules! fixed {
        ($d:ty) => {{
            let mut ov = out.view_mut().into_dimensionality::<$d>().ok()?;
            let xv = xv.into_dimensionality::<$d>().ok()?;
            Zip::from(&mut ov).and(&xv).for_each(|o, &y| *o = f(*o, y));
        }};
    }
    match out.ndim() {
        1 => fixed!(Ix1),
        2 => fixed!(Ix2),
        3 => fixed!(Ix3),
        4 => fixed!(Ix4),
        _ => Zip::from(out).and(&xv).for_each(|o, &y| *o = f(*o, y)),
    }
    Some(())
}

/// `f(a, b)` into `out`, both broadcast to `out`'s shape (checked by the caller).
fn zip_into<T: Copy>(
    out: &mut ArrayD<T>,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    f: impl Fn(T, T) -> T,
) -> Option<()> {
    let av = a.broadcast(out.raw_dim())?;
    let bv = b.broadcast(out.raw_dim())?;
    Zip::from(out)
        .and(&av)
        .and(&bv)
        .for_each(|o, &x, &y| *o = f(x, y));
    Some(())
}

/// Run `$body` with `$f` bound to the element function of a binary op; the
/// op is matched once, outside the loop, so each arm's loop is specialised.
macro_rules! with_binary {
    ($op:expr, |$f:ident| $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |x, y| BinaryOp::Add.apply(x, y);
                $body
            }
            BinaryOp::Sub => {
                let $f = |x, y| BinaryOp::Sub.apply(x, y);
                $body
            }
            BinaryOp::Mul => {
                let $f = |x, y| BinaryOp::Mul.apply(x, y);
                $body
            }
            BinaryOp::Div => {
                let $f = |x, y| BinaryOp::Div.apply(x, y);
                $body
            }
            BinaryOp::Max => {
                let $f = |x, y| BinaryOp::Max.apply(x, y);
                $body
            }
            BinaryOp::Min => {
                let $f = |x, y| BinaryOp::Min.apply(x, y);
                $body
            }
            BinaryOp::Pow => {
                let $f = |x, y| BinaryOp::Pow.apply(x, y);
                $body
            }
        }
    };
}

fn symbolic_error(op: &str, t: &Tensor) -> Error {
    Error::Symbolic {
        op: op.to_string(),
        shape: t.shape().into(),
    }
}

/// Operands of an in-place op: concrete, of the output's dtype (a float
/// when `float`), and broadcastable to the output's shape.
fn check_operands(op: &str, out: &Tensor, xs: &[&Tensor], float: bool) -> Result<()> {
    for t in std::iter::once(out).chain(xs.iter().copied()) {
        if t.is_symbolic() {
            return Err(symbolic_error(op, t));
        }
    }
    if float && !out.dtype().is_float() {
        return Err(Error::dtype_with(
            op,
            "the output",
            DType::FLOATS,
            out.dtype(),
            format!("shape {:?}", out.shape()),
        ));
    }
    for x in xs {
        if x.dtype() != out.dtype() {
            return Err(Error::dtype_with(
                op,
                "the operand",
                [out.dtype()],
                x.dtype(),
                format!(
                    "operand {} and output {} must have one dtype; cast the operand first",
                    x.aval(),
                    out.aval()
                ),
            ));
        }
        // (Equal shapes broadcast to themselves: no shape is built, so a
        // learner's per-step accumulation allocates nothing here.)
        if x.shape() == out.shape() {
            continue;
        }
        let b = super::broadcast_shapes(op, &[out.shape(), x.shape()]);
        if b.as_deref().ok() != Some(out.shape()) {
            return Err(Error::shapes(
                op,
                [x.shape(), out.shape()],
                "the operand must broadcast to the output's shape (the output is not resized)",
            ));
        }
    }
    Ok(())
}

fn internal(op: &str) -> Error {
    Error::invalid(
        op,
        "operand does not broadcast to the output (checked before)",
    )
}

impl Tensor {
    /// `self = self op x` in place (`x` broadcast to `self`'s shape).
    ///
    /// ```
    /// use braintrace_core::{ops::BinaryOp, Tensor};
    /// let mut acc = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
    /// acc.binary_assign(BinaryOp::Mul, &Tensor::scalar(3.0))?;
    /// assert_eq!(acc.to_vec_f64()?, vec![3.0, 6.0]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn binary_assign(&mut self, op: BinaryOp, x: &Tensor) -> Result<()> {
        const OP: &str = "binary_assign";
        check_operands(OP, self, &[x], true)?;
        let xd = x.data_for(OP)?;
        let ok = match (self.data_mut_for(OP)?, xd) {
            (ArrayData::F32(o), ArrayData::F32(x)) => with_binary!(op, |f| zip_assign(o, x, f)),
            (ArrayData::F64(o), ArrayData::F64(x)) => with_binary!(op, |f| zip_assign(o, x, f)),
            _ => None,
        };
        ok.ok_or_else(|| internal(OP))
    }
    /// `self += x` in place (broadcasting `x`).
    pub fn add_in_place(&mut self, x: &Tensor) -> Result<()> {
        self.binary_assign(BinaryOp::Add, x)
    }
    /// `self -= x` in place (broadcasting `x`).
    pub fn sub_in_place(&mut self, x: &Tensor) -> Result<()> {
        self.binary_assign(BinaryOp::Sub, x)
    }
    /// `self *= x` in place (broadcasting `x`).
    pub fn mul_in_place(&mut self, x: &Tensor) -> Result<()> {
        self.binary_assign(BinaryOp::Mul, x)
    }
    /// `self /= x` in place (broadcasting `x`).
    pub fn div_in_place(&mut self, x: &Tensor) -> Result<()> {
        self.binary_assign(BinaryOp::Div, x)
    }

    /// `self = a op b` into this tensor's buffer (`a`, `b` broadcast to
    /// `self`'s shape, which must be their broadcast shape or larger).
    pub fn binary_into(&mut self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<()> {
        const OP: &str = "binary_into";
        check_operands(OP, self, &[a, b], true)?;
        let (ad, bd) = (a.data_for(OP)?, b.data_for(OP)?);
        let ok = match (self.data_mut_for(OP)?, ad, bd) {
            (ArrayData::F32(o), ArrayData::F32(a), ArrayData::F32(b)) => {
                with_binary!(op, |f| zip_into(o, a, b, f))
            }
            (ArrayData::F64(o), ArrayData::F64(a), ArrayData::F64(b)) => {
                with_binary!(op, |f| zip_into(o, a, b, f))
            }
            _ => None,
        };
        ok.ok_or_else(|| internal(OP))
    }

    /// `self = self op s` in place for a scalar `s` (for `RSub`/`RDiv`,
    /// `s - self` and `s / self`).
    pub fn scalar_assign(&mut self, op: ScalarOp, s: f64) -> Result<()> {
        const OP: &str = "scalar_assign";
        check_operands(OP, self, &[], true)?;
        fn run<T: Float>(o: &mut ArrayD<T>, op: ScalarOp, s: f64) {
            let s = T::from(s).unwrap_or_else(T::nan);
            macro_rules! arms {
                ($($v:ident),*) => {
                    match op {
                        $(ScalarOp::$v => o.mapv_inplace(|x| ScalarOp::$v.apply(x, s)),)*
                    }
                };
            }
            arms!(Add, Mul, Div, RSub, RDiv, Pow, Max, Min)
        }
        match self.data_mut_for(OP)? {
            ArrayData::F32(o) => run(o, op, s),
            ArrayData::F64(o) => run(o, op, s),
            _ => return Err(internal(OP)),
        }
        Ok(())
    }
    /// `self *= s` in place.
    pub fn mul_scalar_in_place(&mut self, s: f64) -> Result<()> {
        self.scalar_assign(ScalarOp::Mul, s)
    }
    /// `self += s` in place.
    pub fn add_scalar_in_place(&mut self, s: f64) -> Result<()> {
        self.scalar_assign(ScalarOp::Add, s)
    }

    /// Copy `src`'s values into this tensor's buffer (`src` broadcast to
    /// `self`'s shape; any dtype, but the same as `self`'s).
    pub fn assign(&mut self, src: &Tensor) -> Result<()> {
        const OP: &str = "assign";
        check_operands(OP, self, &[src], false)?;
        fn copy<T: Clone>(o: &mut ArrayD<T>, x: &ArrayD<T>) -> Option<()> {
            let xv = x.broadcast(o.raw_dim())?;
            o.assign(&xv);
            Some(())
        }
        let sd = src.data_for(OP)?;
        let ok = match (self.data_mut_for(OP)?, sd) {
            (ArrayData::F32(o), ArrayData::F32(x)) => copy(o, x),
            (ArrayData::F64(o), ArrayData::F64(x)) => copy(o, x),
            (ArrayData::I64(o), ArrayData::I64(x)) => copy(o, x),
            (ArrayData::Bool(o), ArrayData::Bool(x)) => copy(o, x),
            _ => None,
        };
        ok.ok_or_else(|| internal(OP))
    }

    /// The scaled add `self = a·self + b·x` in place (`x` broadcast to
    /// `self`'s shape): the decay-and-accumulate of an eligibility trace.
    ///
    /// ```
    /// use braintrace_core::Tensor;
    /// let mut trace = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
    /// trace.scaled_add_in_place(0.5, 2.0, &Tensor::from_vec(vec![1.0, 1.0], &[2])?)?;
    /// assert_eq!(trace.to_vec_f64()?, vec![2.5, 3.0]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn scaled_add_in_place(&mut self, a: f64, b: f64, x: &Tensor) -> Result<()> {
        const OP: &str = "scaled_add_in_place";
        check_operands(OP, self, &[x], true)?;
        fn run<T: Float>(o: &mut ArrayD<T>, x: &ArrayD<T>, a: f64, b: f64) -> Option<()> {
            let (a, b) = (T::from(a)?, T::from(b)?);
            if a == T::one() {
                zip_assign(o, x, |o, y| o + b * y)
            } else {
                zip_assign(o, x, |o, y| a * o + b * y)
            }
        }
        let xd = x.data_for(OP)?;
        let ok = match (self.data_mut_for(OP)?, xd) {
            (ArrayData::F32(o), ArrayData::F32(x)) => run(o, x, a, b),
            (ArrayData::F64(o), ArrayData::F64(x)) => run(o, x, a, b),
            _ => None,
        };
        ok.ok_or_else(|| internal(OP))
    }

    /// `self = alpha·(a @ b) + beta·self` in place, for `a: (..., m, k)`,
    /// `b: (..., k, n)` and `self: (..., m, n)` with equal leading (batch)
    /// dimensions, through `ndarray::linalg::general_mat_mul` (no temporary
    /// for the product). With `beta = 0` the old contents are ignored.
    ///
    /// ```
    /// use braintrace_core::{DType, Tensor};
    /// let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let mut out = Tensor::ones(&[2, 2], DType::F64);
    /// out.matmul_into(&a, &a, 1.0, 1.0)?;
    /// assert_eq!(out.to_vec_f64()?, vec![8.0, 11.0, 16.0, 23.0]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn matmul_into(&mut self, a: &Tensor, b: &Tensor, alpha: f64, beta: f64) -> Result<()> {
        const OP: &str = "matmul_into";
        for t in [&*self, a, b] {
            if t.is_symbolic() {
                return Err(symbolic_error(OP, t));
            }
        }
        let dt = self.dtype();
        if !dt.is_float() || a.dtype() != dt || b.dtype() != dt {
            let (arg, got) = if !dt.is_float() {
                ("the output", dt)
            } else if a.dtype() != dt {
                ("a", a.dtype())
            } else {
                ("b", b.dtype())
            };
            let expected = if dt.is_float() {
                vec![dt]
            } else {
                DType::FLOATS.to_vec()
            };
            return Err(Error::dtype_with(
                OP,
                arg,
                expected,
                got,
                format!(
                    "output and operands must be floats of one dtype, got {} = {} @ {}",
                    self.aval(),
                    a.aval(),
                    b.aval()
                ),
            ));
        }
        let (so, sa, sb) = (self.shape(), a.shape(), b.shape());
        let shapes = || [so, sa, sb];
        let r = so.len();
        if r < 2 || sa.len() != r || sb.len() != r {
            return Err(Error::shapes(
                OP,
                shapes(),
                "output and operands must have one rank >= 2",
            ));
        }
        if sa[..r - 2] != so[..r - 2] || sb[..r - 2] != so[..r - 2] {
            return Err(Error::shapes(
                OP,
                shapes(),
                "leading (batch) dimensions must be equal",
            ));
        }
        if sa[r - 1] != sb[r - 2] {
            return Err(Error::shapes(
                OP,
                shapes(),
                format!(
                    "contracting dimensions differ ({} vs {})",
                    sa[r - 1],
                    sb[r - 2]
                ),
            ));
        }
        if so[r - 2] != sa[r - 2] || so[r - 1] != sb[r - 1] {
            return Err(Error::shapes(
                OP,
                shapes(),
                format!("the output must be {:?}", [sa[r - 2], sb[r - 1]]),
            ));
        }
        let (ad, bd) = (a.data_for(OP)?, b.data_for(OP)?);
        let ok = match (self.data_mut_for(OP)?, ad, bd) {
            (ArrayData::F32(o), ArrayData::F32(a), ArrayData::F32(b)) => {
                gemm(o.view_mut(), a.view(), b.view(), alpha, beta)
            }
            (ArrayData::F64(o), ArrayData::F64(a), ArrayData::F64(b)) => {
                gemm(o.view_mut(), a.view(), b.view(), alpha, beta)
            }
            _ => None,
        };
        ok.ok_or_else(|| Error::invalid(OP, "operands do not match (checked before)"))
    }
}

/// `out = alpha a b + beta out` matrix by matrix over the leading axes.
fn gemm<T: LinalgScalar + Float>(
    mut out: ArrayViewMutD<T>,
    a: ArrayViewD<T>,
    b: ArrayViewD<T>,
    alpha: f64,
    beta: f64,
) -> Option<()> {
    if out.ndim() == 2 {
        let mut o = out.into_dimensionality::<Ix2>().ok()?;
        let a = a.into_dimensionality::<Ix2>().ok()?;
        let b = b.into_dimensionality::<Ix2>().ok()?;
        let (alpha, beta) = (T::from(alpha)?, T::from(beta)?);
        if beta == T::zero() {
            // BLAS convention: beta = 0 overwrites (NaN in old contents does not leak).
            o.fill(T::zero());
        }
        general_mat_mul(alpha, &a, &b, beta, &mut o);
        return Some(());
    }
    for i in 0..out.shape()[0] {
        gemm(
            out.index_axis_mut(Axis(0), i),
            a.index_axis(Axis(0), i),
            b.index_axis(Axis(0), i),
            alpha,
            beta,
        )?;
    }
    Some(())
}
