//! Fused, in-place D-RTRL trace loops: one pass over a trace per step
//! applies the hidden Jacobian, adds the instantaneous term and accumulates
//! the gradient (see `learn::fast` for the learner's side, which arranges
//! the operands and owns the buffers). Here: the row layout ([`Blocked`]),
//! the dispatch by float type ([`run`]) and the flushing of tiny values;
//! the dense loop in `dense` (with bf16 storage and AVX-512 BF16, one state
//! per neuron: `bf16x`), the sparse one in `sparse`.

mod bf16x;
mod dense;
mod sparse;
mod store;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::tensor::{ArrayData, ArrayElement, DType};
use num_traits::Float;

pub(crate) use dense::fused;
pub(crate) use sparse::{sparse_fused, SpDims, SparseIdx};
pub(crate) use store::{Storage, Store, TraceBuf};

/// When, relative to the trace update, the gradient is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Solve {
    /// No gradient (a plain `update`).
    None,
    /// From the updated trace (single-step).
    After,
    /// From the trace before the update (multi-step).
    Before,
}

/// Outputs per block of a fused dense row (8 `f32` lanes of AVX2).
pub(crate) const LANES: usize = 8;

/// How a fused dense row of `n` outputs with `k` values each lies in
/// memory (a trace row: `k = S` states; `D`'s rows: `k = S·S`; `Df`'s and
/// `g`'s: `k = S`): in blocks of [`LANES`] outputs, the last one possibly
/// narrower, one after the other; a block of width `w` holds its `k` runs
/// of `w` outputs, value by value. The outputs of one value within a block
/// are contiguous, so the kernel vectorises over outputs for any `S`, and
/// a row is read as one forward stream. (One `O`-long run per state, the
/// layout before, reads `S` places of memory at once: two runs streamed
/// 1.3–1.6× slower than one on this machine's memory-bound sizes.) With
/// `k = 1` it is the plain layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub(crate) n: usize,
    pub(crate) k: usize,
}

impl Blocked {
    /// Calls `f(at, public)` for every value: `at` its place in this
    /// layout, `public` in the public one (output-major, `k` values per
    /// output), in the order of `at`.
    #[inline]
    pub(crate) fn each(self, mut f: impl FnMut(usize, usize)) {
        let mut at = 0;
        for j in (0..self.n).step_by(LANES) {
            let w = LANES.min(self.n - j);
            for a in 0..self.k {
                for l in 0..w {
                    f(at, (j + l) * self.k + a);
                    at += 1;
                }
            }
        }
    }

    /// Rows in the public order (each `n·k` long) → rows in this layout.
    pub(crate) fn block_rows<T: Copy>(self, src: &[T], dst: &mut [T]) {
        let len = (self.n * self.k).max(1);
        for (s, d) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
            self.each(|at, public| d[at] = s[public]);
        }
    }

    /// Rows in this layout → rows in the public order.
    pub(crate) fn unblock_rows<T: Copy>(self, src: &[T], dst: &mut [T]) {
        let len = (self.n * self.k).max(1);
        for (s, d) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
            self.each(|at, public| d[public] = s[at]);
        }
    }

    /// A contiguous operand `a` whose rows are in the public order, in
    /// this layout: `a` itself when `k` is 1, else its rows moved into
    /// `buf`, which is written in place when it has `a`'s type and size
    /// (step after step: no allocation).
    pub(crate) fn put<'a>(self, a: &'a ArrayData, buf: &'a mut Option<ArrayData>) -> &'a ArrayData {
        if self.k <= 1 {
            return a;
        }
        fn rows<T: Copy>(
            lay: Blocked,
            src: &ndarray::ArrayD<T>,
            dst: Option<&mut ndarray::ArrayD<T>>,
        ) -> bool {
            let src = src.as_slice().expect("trace operands are contiguous");
            match dst
                .and_then(|d| d.as_slice_mut())
                .filter(|d| d.len() == src.len())
            {
                Some(d) => {
                    lay.block_rows(src, d);
                    true
                }
                None => false,
            }
        }
        let done = match (a, buf.as_mut()) {
            (ArrayData::F32(x), Some(ArrayData::F32(y))) => rows(self, x, Some(y)),
            (ArrayData::F64(x), Some(ArrayData::F64(y))) => rows(self, x, Some(y)),
            _ => false,
        };
        if !done {
            *buf = Some(self.moved(a, true, a.shape()));
        }
        buf.as_ref().expect("filled above")
    }

    /// A contiguous array's rows moved into this layout (`into`) or out of
    /// it into the public order, as a new array of `shape` (as many
    /// elements).
    pub(crate) fn moved(self, a: &ArrayData, into: bool, shape: &[usize]) -> ArrayData {
        fn rows<T: Copy>(
            lay: Blocked,
            a: &ndarray::ArrayD<T>,
            into: bool,
            shape: &[usize],
        ) -> ndarray::ArrayD<T> {
            let src = a
                .as_slice()
                .expect("trace rows and operands are contiguous");
            let mut out = src.to_vec();
            if into {
                lay.block_rows(src, &mut out);
            } else {
                lay.unblock_rows(src, &mut out);
            }
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), out)
                .expect("the shape holds the rows")
        }
        match a {
            ArrayData::F32(x) => ArrayData::F32(rows(self, x, into, shape)),
            ArrayData::F64(x) => ArrayData::F64(rows(self, x, into, shape)),
            other => other.clone(),
        }
    }
}

/// The float types the fused kernels run in.
pub(crate) trait KernelFloat: Float + Send + Sync + ArrayElement {}
impl KernelFloat for f32 {}
impl KernelFloat for f64 {}

/// `a`'s elements as `T`, in memory order; errors name kernel `op`.
pub(crate) fn slice<'a, T: KernelFloat>(op: &str, a: &'a ArrayData) -> Result<&'a [T]> {
    T::array(a)
        .ok_or_else(|| {
            Error::dtype_with(
                op,
                format!("operand of shape {:?}", a.shape()),
                [T::dtype()],
                a.dtype(),
                "the trace's dtype",
            )
        })?
        .as_slice()
        .ok_or_else(|| Error::invalid(op, "operand not contiguous"))
}

/// A trace buffer's elements as `T`, in memory order; errors name kernel
/// `op`.
pub(crate) fn slice_mut<'a, T: KernelFloat>(op: &str, a: &'a mut ArrayData) -> Result<&'a mut [T]> {
    // The message's shape is read only on error: this runs for every
    // trace buffer every step, and must not allocate.
    if T::array(a).is_none() {
        return Err(Error::dtype_with(
            op,
            format!("trace buffer of shape {:?}", a.shape()),
            [T::dtype()],
            a.dtype(),
            "the kernel's dtype",
        ));
    }
    T::array_mut(a)
        .and_then(|x| x.as_slice_mut())
        .ok_or_else(|| Error::invalid(op, "trace buffer not contiguous"))
}

/// The fused loop a step runs.
#[derive(Clone, Copy)]
pub(crate) enum Loop<'a> {
    Dense(Dims),
    Sparse(SpDims, &'a SparseIdx),
}

impl Loop<'_> {
    /// The name the loop's errors carry.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Loop::Dense(_) => "D-RTRL fused dense kernel",
            Loop::Sparse(..) => "D-RTRL fused sparse kernel",
        }
    }
}

/// A step's [`Operands`] as stored, before the float type is picked.
#[derive(Clone, Copy)]
pub(crate) struct Stored<'a> {
    pub(crate) x: Option<&'a ArrayData>,
    pub(crate) d: &'a ArrayData,
    pub(crate) df: &'a ArrayData,
    pub(crate) g: Option<&'a ArrayData>,
    pub(crate) scale: Option<&'a ArrayData>,
}

/// Run `kernel` on the trace `e` and the gradient `grad`: in the
/// gradient's dtype (the model's), the trace loaded from and rounded to its
/// storage type ([`Store`]).
pub(crate) fn run(
    kernel: Loop<'_>,
    e: &mut TraceBuf,
    grad: &mut ArrayData,
    ops: Stored<'_>,
    solve: Solve,
    threads: usize,
) -> Result<()> {
    match (grad.dtype(), e.storage()) {
        (DType::F32, Storage::F32) => run_typed::<f32, f32>(kernel, e, grad, ops, solve, threads),
        (DType::F64, Storage::F64) => run_typed::<f64, f64>(kernel, e, grad, ops, solve, threads),
        (DType::F64, Storage::F32) => run_typed::<f64, f32>(kernel, e, grad, ops, solve, threads),
        (DType::F32, Storage::Bf16) => {
            run_typed::<f32, half::bf16>(kernel, e, grad, ops, solve, threads)
        }
        (dt, st) => Err(Error::dtype_with(
            kernel.name(),
            "the model (gradient)",
            DType::FLOATS,
            dt,
            format!(
                "{} traces cannot be computed with in {} (f64 models keep f64 or f32 traces, f32 models f32 or bf16)",
                st.name(),
                dt.name()
            ),
        )),
    }
}

/// [`run`] in `T` with traces stored as `E`: the operands borrowed as `T`
/// slices, then the loop.
pub(crate) fn run_typed<'o, T: KernelFloat, E: Store<T>>(
    kernel: Loop<'_>,
    e: &mut TraceBuf,
    grad: &mut ArrayData,
    ops: Stored<'o>,
    solve: Solve,
    threads: usize,
) -> Result<()> {
    let name = kernel.name();
    let (e, grad) = (e.slice_mut::<E>(name)?, slice_mut::<T>(name, grad)?);
    let borrow = |a: &'o ArrayData| slice::<T>(name, a);
    // Tiny operands flushed as the traces are (see `flush`): copies, only
    // when an operand has a tiny element.
    let mut kept = [Vec::new(), Vec::new(), Vec::new()];
    let [kd, kdf, kg] = &mut kept;
    let ops = Operands {
        x: ops.x.map(borrow).transpose()?,
        d: flushed(borrow(ops.d)?, kd),
        df: flushed(borrow(ops.df)?, kdf),
        g: ops.g.map(borrow).transpose()?.map(|g| flushed(g, kg)),
        scale: ops.scale.map(borrow).transpose()?,
    };
    match kernel {
        Loop::Dense(dims) => fused(dims, e, grad, ops, solve, threads),
        Loop::Sparse(dims, sp) => sparse_fused(dims, sp, e, grad, ops, solve, threads),
    }
    Ok(())
}

/// The read-only operands of one step.
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a, T> {
    /// Dense `(batch, i)`; sparse `(batch, n_in)`.
    pub(crate) x: Option<&'a [T]>,
    /// Dense `(batch, o·s·s)`, rows laid out as [`Blocked`] says; sparse
    /// `(batch, o, s, s)`.
    pub(crate) d: &'a [T],
    /// Dense `(batch, o·s)`, rows as [`Blocked`]; sparse `(batch, o, s)`.
    pub(crate) df: &'a [T],
    /// As `df`.
    pub(crate) g: Option<&'a [T]>,
    /// `f'(W)`: dense `(i, o)`; sparse `(nnz,)`.
    pub(crate) scale: Option<&'a [T]>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) batch: usize,
    pub(crate) i: usize,
    pub(crate) o: usize,
    pub(crate) s: usize,
}

/// `v`, or zero when it is tiny: below `√(smallest normal)`, about
/// 1.1e-19 in f32 and 1.5e-154 in f64 (NaN is kept).
///
/// A trace that no input refreshes decays geometrically (a LIF neuron
/// whose presynaptic partner stays silent), and so do `D`'s surrogate
/// derivatives far below threshold. Once products of such values are
/// subnormal, every one takes a microcode assist on x86: LIF D-RTRL,
/// hidden 128, batch 64, five 100-step calls in a row ran at 5.3 ms/step
/// against 0.86 ms with the CPU flushing subnormals (1.0 ms for the first
/// call alone). Flushing only the subnormal results still left it at
/// 1.45× the flushing CPU: the products `D·ε` and `g·ε` of small normal
/// values are subnormal themselves. Below `√(smallest normal)` no
/// product of two operands that both passed this flush is subnormal.
/// The fused trace kernels (dense and sparse) flush the traces they
/// write and their operands `D`, `Df` and `g` ([`flushed`]). XLA on the
/// CPU runs with subnormals flushed to zero; values this small are far
/// below the resolution of any sum they enter (f32: 1e-19 against gradients of
/// order 1e-3 and a relative precision of 1e-7). A compare and a select
/// per element, in a loop bound by memory.
#[inline(always)]
pub(crate) fn flush<T: Float>(v: T) -> T {
    if v.abs() < tiny() {
        T::zero()
    } else {
        v
    }
}

/// The threshold of [`flush`] (a constant once inlined).
#[inline(always)]
pub(crate) fn tiny<T: Float>() -> T {
    T::min_positive_value().sqrt()
}

/// `v`, or its elements [`flush`]ed into `keep` when one is tiny and not
/// zero (one pass without branches to find out; the copy only then).
pub(crate) fn flushed<'a, T: Float>(v: &'a [T], keep: &'a mut Vec<T>) -> &'a [T] {
    let tiny = tiny::<T>();
    let any = v
        .iter()
        .fold(false, |any, &x| any | ((x.abs() < tiny) & (x != T::zero())));
    if !any {
        return v;
    }
    keep.clear();
    keep.extend(v.iter().map(|&x| flush(x)));
    keep
}
