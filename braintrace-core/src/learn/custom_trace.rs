//! The learner's side of a hand-written trace kernel
//! ([`TraceKernel::Custom`](crate::etp::TraceKernel::Custom)): one
//! trainable's trace and gradient, owned here and allocated once, handed
//! to the kernel to advance in place ([`CustomTraceKernel::update`]) and to
//! accumulate the gradient from ([`CustomTraceKernel::solve`]). A
//! [`super::fast::FastTrace`] of a custom kernel delegates to this.

use crate::error::{Error, Result};
use crate::etp::{CustomKernel, CustomTraceKernel, Params, TensorMap, TraceStep};
use crate::kernels::trace::{Solve, Storage};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;

/// One trainable's trace under a custom kernel.
#[derive(Clone)]
pub(crate) struct CustomLeaf {
    kernel: CustomKernel,
    /// The trainable's name (its layout name).
    key: String,
    /// The relation's trainables: name and parameter index.
    index: BTreeMap<String, usize>,
    /// The equation's params.
    params: Params,
    /// The trace, in `init_drtrl`'s layout and the model's dtype.
    trace: Tensor,
    /// The gradient accumulated since the last `take_grad`, the
    /// parameter's shape.
    grad: Tensor,
    /// The parameters of the current call, by trainable name.
    weights: TensorMap,
    /// The trace's and the gradient's shapes (a kernel may change values
    /// only).
    shapes: [Vec<usize>; 2],
}

impl std::fmt::Debug for CustomLeaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomLeaf({}, `{}`)", self.kernel.0.name(), self.key)
    }
}

const OP: &str = "D-RTRL custom trace kernel";

impl CustomLeaf {
    /// The zero trace `trace_shape` and gradient `param_shape` of trainable
    /// `key`, in `dtype` (the model's): a custom kernel keeps its traces in
    /// the model's precision, so any other `storage` is refused.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kernel: &CustomKernel,
        key: &str,
        trace_shape: &[usize],
        param_shape: &[usize],
        dtype: DType,
        storage: Storage,
        params: &Params,
        index: &BTreeMap<String, usize>,
    ) -> Result<Self> {
        if Storage::of(dtype) != Some(storage) {
            return Err(Error::invalid(
                OP,
                format!(
                    "the hand-written kernel `{}` keeps its traces in the model's dtype ({}), not {}: \
                     use the model's trace_dtype, or fast_paths(false) to run the rules",
                    kernel.0.name(),
                    dtype.name(),
                    storage.name()
                ),
            ));
        }
        if !index.contains_key(key) {
            return Err(Error::invalid(OP, format!("no trainable `{key}`")));
        }
        Ok(CustomLeaf {
            kernel: kernel.clone(),
            key: key.to_string(),
            index: index.clone(),
            params: params.clone(),
            trace: Tensor::try_zeros(OP, trace_shape, dtype)?,
            grad: Tensor::try_zeros(OP, param_shape, dtype)?,
            weights: TensorMap::new(),
            shapes: [trace_shape.to_vec(), param_shape.to_vec()],
        })
    }

    /// Take the current parameters (handles, no copy).
    pub(crate) fn prepare(&mut self, params: &[Tensor]) -> Result<()> {
        for (name, &i) in &self.index {
            let p = params.get(i).ok_or_else(|| {
                Error::invalid(OP, format!("no parameter {i} for trainable `{name}`"))
            })?;
            match self.weights.get_mut(name) {
                Some(w) if w.ptr_eq(p) => {}
                Some(w) => *w = p.clone(),
                None => {
                    self.weights.insert(name.clone(), p.clone());
                }
            }
        }
        Ok(())
    }

    fn update(&mut self, x: Option<&Tensor>, d: &Tensor, df: &Tensor) -> Result<()> {
        let step = TraceStep {
            x,
            d,
            df,
            weights: &self.weights,
            params: &self.params,
        };
        let kernel: &dyn CustomTraceKernel = &*self.kernel.0;
        kernel
            .update(&self.key, &step, &mut self.trace)
            .map_err(|e| self.wrapped("update", e))?;
        self.check_kept("update", 0)
    }

    fn solve(&mut self, g: &Tensor) -> Result<()> {
        let kernel: &dyn CustomTraceKernel = &*self.kernel.0;
        kernel
            .solve(
                &self.key,
                g,
                &self.weights,
                &self.params,
                &self.trace,
                &mut self.grad,
            )
            .map_err(|e| self.wrapped("solve", e))?;
        self.check_kept("solve", 1)
    }

    fn wrapped(&self, what: &str, e: Error) -> Error {
        Error::invalid(
            OP,
            format!(
                "kernel `{}`, {what} of trace `{}`: {e}",
                self.kernel.0.name(),
                self.key
            ),
        )
    }

    /// A kernel must leave the buffer it was given (`which`: 0 the trace,
    /// 1 the gradient) as it found it but for its values: shape, dtype, a
    /// concrete tensor.
    fn check_kept(&self, what: &str, which: usize) -> Result<()> {
        let t = if which == 0 { &self.trace } else { &self.grad };
        let want = &self.shapes[which];
        let dtype = self.grad.dtype();
        if t.shape() != want.as_slice() || t.dtype() != dtype || t.is_symbolic() {
            return Err(Error::invalid(
                OP,
                format!(
                    "kernel `{}`, {what} of trace `{}`: the {} was {} {:?} and is now {} {:?}; a kernel writes values in place",
                    self.kernel.0.name(),
                    self.key,
                    if which == 0 { "trace" } else { "gradient" },
                    dtype.name(),
                    want,
                    t.dtype().name(),
                    t.shape()
                ),
            ));
        }
        Ok(())
    }

    /// One step: the update, and the solve before or after it when a
    /// signal `g` is given (as the fused kernels order them).
    pub(crate) fn step(
        &mut self,
        x: Option<&Tensor>,
        d: &Tensor,
        df: &Tensor,
        g: Option<&Tensor>,
        solve: Solve,
    ) -> Result<()> {
        let signal =
            || g.ok_or_else(|| Error::invalid(OP, "a gradient step without a learning signal"));
        match solve {
            Solve::None => self.update(x, d, df),
            Solve::Before => {
                self.solve(signal()?)?;
                self.update(x, d, df)
            }
            Solve::After => {
                self.update(x, d, df)?;
                self.solve(signal()?)
            }
        }
    }

    pub(crate) fn trace_bytes(&self) -> usize {
        self.trace.size() * self.trace.dtype().size_bytes()
    }

    pub(crate) fn reset(&mut self) -> Result<()> {
        self.trace = Tensor::try_zeros(OP, self.trace.shape(), self.trace.dtype())?;
        Ok(())
    }

    /// The trace (a copy).
    pub(crate) fn tensor(&self) -> Tensor {
        deep_copy(&self.trace)
    }

    pub(crate) fn check_raw(&self, i: usize, r: &Tensor) -> Result<()> {
        check_saved(i, r, self.trace.dtype(), self.trace.shape())
    }

    pub(crate) fn set_raw(&mut self, r: &Tensor) -> Result<()> {
        self.trace = deep_copy(r);
        Ok(())
    }

    pub(crate) fn drop_grad(&mut self) -> Result<()> {
        self.grad = Tensor::try_zeros(OP, self.grad.shape(), self.grad.dtype())?;
        Ok(())
    }

    pub(crate) fn take_grad(&mut self) -> Result<Tensor> {
        let fresh = Tensor::try_zeros(OP, self.grad.shape(), self.grad.dtype())?;
        Ok(std::mem::replace(&mut self.grad, fresh))
    }
}

/// A tensor with its own buffer (so that neither the learner's in-place
/// writes nor the caller's copy-on-write see the other).
fn deep_copy(t: &Tensor) -> Tensor {
    match t.data_for(OP) {
        Ok(d) => Tensor::from_data(d.clone()),
        Err(_) => t.clone(),
    }
}

/// Whether saved fused trace `i` (`r`) has the learner's dtype and shape,
/// for `Learner::resume`.
pub(crate) fn check_saved(i: usize, r: &Tensor, dtype: DType, shape: &[usize]) -> Result<()> {
    if r.dtype() != dtype {
        return Err(Error::dtype_with(
            "Learner::resume",
            format!("saved fused trace {i}"),
            [dtype],
            r.dtype(),
            "the saved trace's dtype is not the learner's",
        ));
    }
    if r.shape() != shape {
        return Err(Error::shapes(
            "Learner::resume",
            [r.shape().to_vec(), shape.to_vec()],
            format!("saved fused trace {i} (first) does not have the learner's shape (second)"),
        ));
    }
    Ok(())
}
