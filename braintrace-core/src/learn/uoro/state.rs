//! UORO's learner-owned state: the rank-1 factors `s̃` (per hidden group,
//! `(V.., S)`) and `θ̃` (per group and parameter, parameter-shaped), the
//! projection draws (the seeded [`Rng`] or a given table) and the
//! gradients accumulated over an `etrace_grad` call. Each step reads the
//! program's Jacobians and instantaneous terms; a step's new factors are
//! computed aside and stored only once all of it succeeded.

use super::{Draws, Uoro};
use crate::error::{Error, Result};
use crate::etp::TensorMap;
use crate::learn::algorithm::{Pair, TraceState};
use crate::learn::compiler::EtraceGraph;
use crate::learn::drtrl::rule::{param_grads, solve_leaves};
use crate::learn::shared::{add_maps, last, weights};
use crate::random::Rng;
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// See the module docs.
pub(super) struct UoroState {
    eg: Arc<EtraceGraph>,
    pairs: Vec<Pair>,
    keys: Vec<Vec<String>>,
    /// The groups with relations, in index order.
    groups: Vec<usize>,
    /// Per such group, its parameters (first-use order).
    params_of: Vec<Vec<usize>>,
    s: Vec<Tensor>,
    theta: Vec<Vec<Tensor>>,
    rng: Rng,
    seed: u64,
    draws: Option<Draws>,
    step: usize,
    eps: f64,
    multi: bool,
    dtype: DType,
    params: Vec<Tensor>,
    grads: BTreeMap<usize, Tensor>,
}

/// A group's factor shape `(V.., S)`.
fn factor_shape(eg: &EtraceGraph, gi: usize) -> Vec<usize> {
    let grp = &eg.groups()[gi];
    let mut v = grp.varshape.clone();
    v.push(grp.num_state());
    v
}

fn norm(ts: &[&Tensor]) -> Result<f64> {
    let mut s = 0.0;
    for t in ts {
        s += t.to_vec_f64()?.iter().map(|v| v * v).sum::<f64>();
    }
    Ok(s.sqrt())
}

impl UoroState {
    pub(super) fn new(
        eg: Arc<EtraceGraph>,
        pairs: Vec<Pair>,
        keys: Vec<Vec<String>>,
        groups: Vec<usize>,
        algo: &Uoro,
        dtype: DType,
    ) -> Result<Self> {
        if let Some(d) = &algo.draws {
            for (t, row) in d.0.iter().enumerate() {
                if row.len() != eg.groups().len() {
                    return Err(Error::invalid(
                        "Uoro::draws",
                        format!(
                            "step {t} gives {} draws, the model has {} hidden groups",
                            row.len(),
                            eg.groups().len()
                        ),
                    ));
                }
                for (g, nu) in row.iter().enumerate() {
                    let want = factor_shape(&eg, g);
                    if nu.shape() != want.as_slice() {
                        return Err(Error::shapes(
                            "Uoro::draws",
                            [nu.shape(), want.as_slice()],
                            format!("the draw of step {t} for hidden group {g} must have the group's (V.., S) shape"),
                        ));
                    }
                }
            }
        }
        let mut params_of = Vec::with_capacity(groups.len());
        for &gi in &groups {
            let mut ps = Vec::new();
            for pair in pairs.iter().filter(|p| p.group == gi) {
                for t in &eg.relations()[pair.rel].trainables {
                    if !ps.contains(&t.param) {
                        ps.push(t.param);
                    }
                }
            }
            params_of.push(ps);
        }
        let mut st = UoroState {
            s: Vec::new(),
            theta: Vec::new(),
            rng: Rng::seed(algo.seed),
            seed: algo.seed,
            draws: algo.draws.clone(),
            step: 0,
            eps: algo.eps,
            multi: algo.vjp_method == crate::learn::algorithm::VjpMethod::MultiStep,
            dtype,
            params: Vec::new(),
            grads: BTreeMap::new(),
            eg,
            pairs,
            keys,
            groups,
            params_of,
        };
        st.zero_factors()?;
        Ok(st)
    }

    fn zero_factors(&mut self) -> Result<()> {
        self.s = self
            .groups
            .iter()
            .map(|&gi| Tensor::zeros(&factor_shape(&self.eg, gi), self.dtype))
            .collect();
        self.theta = Vec::with_capacity(self.groups.len());
        for ps in &self.params_of {
            let mut v = Vec::with_capacity(ps.len());
            for &p in ps {
                let shape = self
                    .params
                    .get(p)
                    .map(|t| t.shape().to_vec())
                    .unwrap_or_else(|| self.eg.graph().aval(self.eg.graph().invars()[p]).shape().to_vec());
                v.push(Tensor::zeros(&shape, self.dtype));
            }
            self.theta.push(v);
        }
        Ok(())
    }

    /// Step `self.step`'s draw for group `gi`.
    fn draw(&mut self, gi: usize) -> Result<Tensor> {
        let shape = factor_shape(&self.eg, gi);
        match &self.draws {
            Some(d) => d.0[self.step][gi].cast(self.dtype),
            None => {
                let n: usize = shape.iter().product();
                let v: Vec<f64> = (0..n)
                    .map(|_| if self.rng.uniform() < 0.5 { 1.0 } else { -1.0 })
                    .collect();
                Tensor::from_vec(v, &shape)?.cast(self.dtype)
            }
        }
    }

    /// `Σ_g (g · s̃_g) θ̃_g` into the accumulated gradients.
    fn accumulate(&mut self, signals: &[Tensor]) -> Result<()> {
        for (k, sig) in signals.iter().enumerate() {
            let dot: f64 = sig
                .to_vec_f64()?
                .iter()
                .zip(self.s[k].to_vec_f64()?)
                .map(|(a, b)| a * b)
                .sum();
            for (&p, th) in self.params_of[k].iter().zip(&self.theta[k]) {
                let g = th.mul_scalar(dot)?;
                let new = match self.grads.remove(&p) {
                    Some(a) => a.add(&g)?,
                    None => g,
                };
                self.grads.insert(p, new);
            }
        }
        Ok(())
    }

    /// The factors after one step (not stored).
    #[allow(clippy::type_complexity)]
    fn advance(&mut self, fwd: &[Tensor]) -> Result<(Vec<Tensor>, Vec<Vec<Tensor>>)> {
        let (jacs, mut inst) = fwd.split_at(self.groups.len());
        let mut new_s = Vec::with_capacity(self.groups.len());
        let mut new_theta = Vec::with_capacity(self.groups.len());
        // The instantaneous terms, per pair, per state, per key.
        let mut inst_of: Vec<Vec<TensorMap>> = Vec::with_capacity(self.pairs.len());
        for (pair, keys) in self.pairs.iter().zip(&self.keys) {
            let s = self.eg.groups()[pair.group].num_state();
            let mut per_a = Vec::with_capacity(s);
            for _ in 0..s {
                let (now, rest) = inst.split_at(keys.len());
                per_a.push(keys.iter().cloned().zip(now.iter().cloned()).collect());
                inst = rest;
            }
            inst_of.push(per_a);
        }
        for (k, &gi) in self.groups.clone().iter().enumerate() {
            let nu = self.draw(gi)?;
            let s_old = &self.s[k];
            let shape = s_old.shape().to_vec();
            let m = shape.iter().product::<usize>();
            let col = if shape.len() > 2 {
                s_old.reshape(&[shape[0], m / shape[0], 1])?
            } else {
                s_old.reshape(&[m, 1])?
            };
            let d_s = jacs[k].matmul(&col)?.reshape(&shape)?;
            // νᵀ J_f per parameter.
            let mut proj: BTreeMap<usize, Tensor> = BTreeMap::new();
            for (pi, pair) in self.pairs.iter().enumerate().filter(|(_, p)| p.group == gi) {
                let r = &self.eg.relations()[pair.rel];
                let w = weights(&self.eg, pair.rel, &self.params);
                let mut acc: Option<TensorMap> = None;
                for (a, ia) in inst_of[pi].iter().enumerate() {
                    acc = Some(add_maps(acc, solve_leaves(r, last(&nu, a)?, ia.clone(), &w)?)?);
                }
                for (p, g) in param_grads(r, &acc.unwrap_or_default(), &self.params)? {
                    let new = match proj.remove(&p) {
                        Some(o) => o.add(&g)?,
                        None => g,
                    };
                    proj.insert(p, new);
                }
            }
            let proj: Vec<Tensor> = self.params_of[k]
                .iter()
                .map(|p| proj.remove(p).ok_or_else(|| Error::invalid("UORO", "a parameter without projection")))
                .collect::<Result<_>>()?;
            let eps = self.eps;
            let rho0 = ((norm(&self.theta[k].iter().collect::<Vec<_>>())? + eps) / (norm(&[&d_s])? + eps)).sqrt();
            let rho1 = ((norm(&proj.iter().collect::<Vec<_>>())? + eps) / (norm(&[&nu])? + eps)).sqrt();
            new_s.push(d_s.mul_scalar(rho0)?.add(&nu.mul_scalar(rho1)?)?);
            new_theta.push(
                self.theta[k]
                    .iter()
                    .zip(&proj)
                    .map(|(th, p)| th.mul_scalar(1.0 / rho0)?.add(&p.mul_scalar(1.0 / rho1)?))
                    .collect::<Result<_>>()?,
            );
        }
        Ok((new_s, new_theta))
    }
}

impl TraceState for UoroState {
    fn begin_update(&mut self, params: &[Tensor]) -> Result<()> {
        self.params = params.to_vec();
        Ok(())
    }

    fn begin_grad(&mut self, params: &[Tensor]) -> Result<()> {
        self.params = params.to_vec();
        self.grads.clear();
        Ok(())
    }

    fn step(&mut self, fwd: &[Tensor], grad: Option<&[Tensor]>) -> Result<()> {
        if let Some(d) = &self.draws {
            if self.step >= d.0.len() {
                return Err(Error::invalid(
                    "Uoro::draws",
                    format!(
                        "the given draws cover {} steps; step {} needs another",
                        d.0.len(),
                        self.step + 1
                    ),
                ));
            }
        }
        let rng = self.rng.clone();
        let (new_s, new_theta) = match self.advance(fwd) {
            Ok(v) => v,
            Err(e) => {
                self.rng = rng;
                return Err(e);
            }
        };
        if let (true, Some(g)) = (self.multi, grad) {
            self.accumulate(g)?;
        }
        self.s = new_s;
        self.theta = new_theta;
        self.step += 1;
        if let (false, Some(g)) = (self.multi, grad) {
            self.accumulate(g)?;
        }
        Ok(())
    }

    fn take_grads(&mut self, _params: &[Tensor]) -> Result<Vec<(usize, Tensor)>> {
        Ok(std::mem::take(&mut self.grads).into_iter().collect())
    }

    fn drop_grads(&mut self) -> Result<()> {
        self.grads.clear();
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        self.rng = Rng::seed(self.seed);
        self.step = 0;
        self.zero_factors()
    }

    fn tensors(&self) -> Vec<Tensor> {
        self.s
            .iter()
            .cloned()
            .chain(self.theta.iter().flatten().cloned())
            .collect()
    }
}
