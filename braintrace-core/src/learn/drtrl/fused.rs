//! D-RTRL's learner-owned traces: the pairs a fused kernel of
//! [`crate::learn::fast`] runs keep one trace buffer per trainable here,
//! updated in place after each staged step from the `x`, `D` and `Df` the
//! forward program hands over ([`FusedIn`]) and, when a gradient is
//! wanted, the learning signal per group the solve hands over.

use crate::error::{Error, Result};
use crate::learn::algorithm::TraceState;
use crate::learn::compiler::Relation;
use crate::etp::TraceKernel;
use crate::kernels::trace::Storage;
use crate::learn::fast::{FastTrace, Solve};
use crate::tensor::{Aval, Tensor};
use std::collections::BTreeMap;

/// What the forward program gives one fused pair.
pub(super) struct FusedIn {
    /// The relation's input, or a placeholder scalar without one.
    pub x: Tensor,
    /// The group's `D`, `(V.., S, S)`.
    pub d: Tensor,
    /// The pair's `Df`, `(V.., S)`.
    pub df: Tensor,
}

impl FusedIn {
    /// Append to a program's extra results (three tensors).
    pub(super) fn push_to(self, v: &mut Vec<Tensor>) {
        v.extend([self.x, self.d, self.df]);
    }
    /// Read [`push_to`](Self::push_to)'s tensors back, pair by pair.
    fn read(v: &[Tensor]) -> impl Iterator<Item = FusedArgs<'_>> {
        v.chunks_exact(3).map(|c| FusedArgs {
            x: &c[0],
            d: &c[1],
            df: &c[2],
        })
    }
}

/// A [`FusedIn`] as the learner reads it from the program's results.
struct FusedArgs<'a> {
    x: &'a Tensor,
    d: &'a Tensor,
    df: &'a Tensor,
}

/// The learner-owned traces of one (relation, group) pair that a fused
/// kernel runs: one buffer per trainable, with the parameter it feeds.
#[derive(Clone, Debug)]
pub(super) struct FastPair {
    group: usize,
    leaves: Vec<(usize, FastTrace)>,
}

/// D-RTRL's [`TraceState`]: the fused pairs' traces and gradients.
pub(super) struct DrtrlState {
    fast: Vec<FastPair>,
    /// When a step's gradient is read, relative to its trace update.
    solve: Solve,
}

impl DrtrlState {
    pub(super) fn new(fast: Vec<FastPair>, multi: bool) -> Self {
        let solve = if multi { Solve::Before } else { Solve::After };
        DrtrlState { fast, solve }
    }

    /// The zero traces of relation `rel`'s pair with group `group` run by
    /// `kind`; `keys` its trace keys and public avals (in the model's
    /// dtype), stored as `storage`.
    pub(super) fn pair(
        kind: TraceKernel,
        rel: &Relation,
        group: usize,
        keys: &[(String, Aval)],
        storage: Storage,
        params: &[Tensor],
    ) -> Result<FastPair> {
        let index: BTreeMap<String, usize> = rel
            .trainables
            .iter()
            .map(|t| (t.name.clone(), t.param))
            .collect();
        let mut leaves = Vec::new();
        for (key, aval) in keys {
            let t = rel
                .trainables
                .iter()
                .find(|t| &t.name == key)
                .ok_or_else(|| {
                    Error::etp(
                        rel.primitive.name(),
                        "compile",
                        format!("trace `{key}` has no trainable"),
                    )
                })?;
            let pshape = params[t.param].shape().to_vec();
            leaves.push((
                t.param,
                FastTrace::for_leaf(
                    &kind,
                    key,
                    rel.x_var.is_some(),
                    aval.shape(),
                    &pshape,
                    aval.dtype(),
                    storage,
                    &rel.params,
                    &index,
                )?,
            ));
        }
        Ok(FastPair { group, leaves })
    }

    /// Derive the kernels' per-call values (transform derivatives, LoRA
    /// maps) from the current parameters.
    fn prepare(&mut self, params: &[Tensor]) -> Result<()> {
        for f in &mut self.fast {
            for (_, t) in &mut f.leaves {
                t.prepare(params)?;
            }
        }
        Ok(())
    }

    /// Run the kernels of one step: `fwd` three tensors per pair
    /// ([`FusedIn`]), `signals` one per group when a gradient is wanted.
    fn run(&mut self, fwd: &[Tensor], signals: Option<&[Tensor]>, solve: Solve) -> Result<()> {
        for (f, a) in self.fast.iter_mut().zip(FusedIn::read(fwd)) {
            let g = signals.map(|s| &s[f.group]);
            for (_, t) in &mut f.leaves {
                t.step(Some(a.x), a.d, a.df, g, solve)?;
            }
        }
        Ok(())
    }
}

impl TraceState for DrtrlState {
    fn begin_update(&mut self, params: &[Tensor]) -> Result<()> {
        self.prepare(params)
    }

    fn begin_grad(&mut self, params: &[Tensor]) -> Result<()> {
        let prepared = self.prepare(params);
        self.drop_grads()?;
        prepared
    }

    fn step(&mut self, fwd: &[Tensor], grad: Option<&[Tensor]>) -> Result<()> {
        let solve = if grad.is_some() { self.solve } else { Solve::None };
        self.run(fwd, grad, solve)
    }

    fn take_grads(&mut self, _params: &[Tensor]) -> Result<Vec<(usize, Tensor)>> {
        let mut v = Vec::new();
        for f in &mut self.fast {
            for (p, t) in &mut f.leaves {
                v.push((*p, t.take_grad()?));
            }
        }
        Ok(v)
    }

    fn drop_grads(&mut self) -> Result<()> {
        for f in &mut self.fast {
            for (_, t) in &mut f.leaves {
                t.drop_grad()?;
            }
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        for f in &mut self.fast {
            for (_, t) in &mut f.leaves {
                t.reset()?;
            }
        }
        Ok(())
    }

    fn trace_bytes(&self) -> usize {
        self.fast
            .iter()
            .flat_map(|f| f.leaves.iter().map(|(_, t)| t.trace_bytes()))
            .sum()
    }

    fn tensors(&self) -> Vec<Tensor> {
        self.fast
            .iter()
            .flat_map(|f| f.leaves.iter().map(|(_, t)| t.tensor()))
            .collect()
    }

    fn raw(&self) -> Vec<Tensor> {
        self.fast
            .iter()
            .flat_map(|f| f.leaves.iter().map(|(_, t)| t.raw()))
            .collect()
    }

    fn load_raw(&mut self, raw: &[Tensor]) -> Result<()> {
        let n: usize = self.fast.iter().map(|f| f.leaves.len()).sum();
        if raw.len() != n {
            return Err(Error::invalid(
                "Learner::resume",
                format!(
                    "the saved D-RTRL state has {} fused trace(s); this learner has {n}",
                    raw.len()
                ),
            ));
        }
        let leaves = self.fast.iter().flat_map(|f| f.leaves.iter());
        for (i, ((_, t), r)) in leaves.zip(raw).enumerate() {
            t.check_raw(i, r)?;
        }
        let leaves = self.fast.iter_mut().flat_map(|f| f.leaves.iter_mut());
        for ((_, t), r) in leaves.zip(raw) {
            t.set_raw(r)?;
        }
        Ok(())
    }
}
