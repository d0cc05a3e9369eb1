//! Graph analysis and surgery: who produces and who reads each variable,
//! forward reachability with a stop rule, backward slicing into a closed
//! sub-graph, inserting an equation after a variable, common-subexpression
//! and dead-code elimination.
//!
//! These are what a learning compiler needs to take a traced step apart:
//! find the equations a hidden state flows into (stopping at the next ETP
//! equation), cut out the state-transition sub-graph `h -> h'`, and insert a
//! perturbation `h + p` after a state to read the learning signal off its
//! cotangent. Every surgery leaves a graph that passes [`Graph::validate`].

use super::{var_name, Eqn, Graph, Primitive, VarId};
use crate::error::{Error, Result};
use crate::tensor::{ArrayData, Aval, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// The most elements [`Graph::fold_constants`] captures for an equation
/// whose results are larger than its operands (a broadcast).
pub const FOLD_MAX_ELEMENTS: usize = 4096;

/// What [`Graph::reachable`] found: the variables a value flows into and the
/// equations that read one of them, both in ascending order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reachable {
    /// Reached variables (the start variables included).
    pub vars: Vec<VarId>,
    /// Indices (into [`Graph::eqns`]) of the equations reading a reached
    /// variable, including the ones the stop rule stopped at.
    pub eqns: Vec<usize>,
}

/// A closed sub-graph cut out by [`Graph::slice`].
#[derive(Clone, Debug)]
pub struct Slice {
    /// The sub-graph. It keeps the parent's variable numbering, so a
    /// [`VarId`] names the same value in both; its inputs are
    /// [`Slice::inputs`], its outputs the requested variables.
    pub graph: Graph,
    /// The boundary: the cut variables the outputs depend on, which became
    /// the sub-graph's inputs, in the order they were given in the cut.
    pub inputs: Vec<VarId>,
}

fn surgery_err(reason: impl Into<String>) -> Error {
    Error::invalid("graph surgery", reason)
}

impl Graph {
    fn check_var(&self, op: &str, v: VarId) -> Result<()> {
        if v >= self.avals.len() {
            return Err(Error::invalid(
                op,
                format!(
                    "variable {v} does not exist (the graph has {} variables)",
                    self.avals.len()
                ),
            ));
        }
        Ok(())
    }

    /// For each variable, the index of the equation producing it (`None`
    /// for inputs, constants and unused numbers).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.avals.len()];
        for (i, e) in self.eqns.iter().enumerate() {
            for &v in &e.outputs {
                p[v] = Some(i);
            }
        }
        p
    }

    /// For each variable, the indices of the equations reading it, ascending,
    /// each once (graph outputs are not listed; see [`Graph::outvars`]).
    pub fn consumers(&self) -> Vec<Vec<usize>> {
        let mut c: Vec<Vec<usize>> = vec![Vec::new(); self.avals.len()];
        for (i, e) in self.eqns.iter().enumerate() {
            for &v in &e.inputs {
                if c[v].last() != Some(&i) {
                    c[v].push(i);
                }
            }
        }
        c
    }

    /// Forward reachability: the variables that depend on any of `from`,
    /// and the equations that read them. An equation for which
    /// `stop(index, eqn)` is true is reported but not crossed (its outputs
    /// are not reached through it).
    ///
    /// ```
    /// use braintrace_core::{make_graph, Aval, DType, Tensor};
    /// let g = make_graph(
    ///     |a: &[Tensor]| Ok(vec![a[0].exp()?.tanh()?.mul(&a[1])?]),
    ///     &[Aval::new(&[2], DType::F32), Aval::new(&[2], DType::F32)],
    /// )?;
    /// // From x, stop at tanh: exp and tanh are read, mul is not reached.
    /// let r = g.reachable(&[g.invars()[0]], |_, e| e.prim().name() == "tanh")?;
    /// assert_eq!(r.eqns, vec![0, 1]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn reachable<F>(&self, from: &[VarId], mut stop: F) -> Result<Reachable>
    where
        F: FnMut(usize, &Eqn) -> bool,
    {
        let mut reached = vec![false; self.avals.len()];
        for &v in from {
            self.check_var("reachable", v)?;
            reached[v] = true;
        }
        let mut eqns = Vec::new();
        for (i, e) in self.eqns.iter().enumerate() {
            if e.inputs.iter().any(|&v| reached[v]) {
                eqns.push(i);
                if !stop(i, e) {
                    for &v in &e.outputs {
                        reached[v] = true;
                    }
                }
            }
        }
        let vars = (0..reached.len()).filter(|&v| reached[v]).collect();
        Ok(Reachable { vars, eqns })
    }

    /// Backward slice: the closed sub-graph computing `outputs` from the
    /// `cut` variables (and the graph's constants). The walk goes back from
    /// each output and stops at cut variables; the cut variables it meets
    /// become the sub-graph's inputs ([`Slice::inputs`], in cut order).
    ///
    /// Errors when the walk reaches a graph input that is not in the cut
    /// (the slice would not be closed), or when a cut variable is produced
    /// by an equation the slice also needs for another value.
    ///
    /// ```
    /// use braintrace_core::{make_graph, Aval, DType, Tensor};
    /// let a = Aval::new(&[2], DType::F64);
    /// // y = tanh(x * w) + w; slice y from (x, w) cut at u = x * w and w.
    /// let g = make_graph(|a: &[Tensor]| {
    ///     let u = a[0].mul(&a[1])?;
    ///     Ok(vec![u.tanh()?.add(&a[1])?])
    /// }, &[a.clone(), a])?;
    /// let u = g.eqns()[0].outputs()[0];
    /// let w = g.invars()[1];
    /// let s = g.slice(g.outvars(), &[w, u])?;
    /// assert_eq!(s.inputs, vec![w, u]);
    /// assert_eq!(s.graph.primitive_names(), vec!["tanh", "add"]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn slice(&self, outputs: &[VarId], cut: &[VarId]) -> Result<Slice> {
        for &v in outputs.iter().chain(cut) {
            self.check_var("slice", v)?;
        }
        let producer = self.producers();
        let mut is_cut = vec![false; self.avals.len()];
        for &v in cut {
            is_cut[v] = true;
        }
        let mut is_const = vec![false; self.avals.len()];
        for &v in &self.constvars {
            is_const[v] = true;
        }
        let mut seen = vec![false; self.avals.len()];
        let mut keep = vec![false; self.eqns.len()];
        let mut stack: Vec<VarId> = outputs.to_vec();
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut seen[v], true) || is_cut[v] || is_const[v] {
                continue;
            }
            match producer[v] {
                Some(i) => {
                    if !keep[i] {
                        keep[i] = true;
                        stack.extend(&self.eqns[i].inputs);
                    }
                }
                None => {
                    return Err(surgery_err(format!(
                        "slice is not closed: variable {} ({}) is a graph input the outputs depend on, but it is not in the cut",
                        var_name(v),
                        self.avals[v]
                    )))
                }
            }
        }
        let mut inputs = Vec::new();
        for &v in cut {
            if seen[v] && !inputs.contains(&v) {
                inputs.push(v);
            }
        }
        let eqns: Vec<Eqn> = self
            .eqns
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|(e, _)| e.clone())
            .collect();
        for e in &eqns {
            if let Some(&v) = e.outputs.iter().find(|&&v| is_cut[v] && seen[v]) {
                return Err(surgery_err(format!(
                    "slice: cut variable {} is produced by `{}`, which the slice also needs for another of its outputs",
                    var_name(v),
                    e.prim.name()
                )));
            }
        }
        let (mut constvars, mut consts) = (Vec::new(), Vec::new());
        for (&v, c) in self.constvars.iter().zip(&self.consts) {
            if seen[v] {
                constvars.push(v);
                consts.push(c.clone());
            }
        }
        let graph = Graph {
            avals: self.avals.clone(),
            invars: inputs.clone(),
            constvars,
            consts,
            eqns,
            outvars: outputs.to_vec(),
        };
        graph.validate()?;
        Ok(Slice { graph, inputs })
    }

    /// Append a new graph input of the given abstract value; returns its
    /// variable. The graph then takes one more argument (last).
    pub fn add_input(&mut self, aval: Aval) -> VarId {
        self.avals.push(aval);
        let v = self.avals.len() - 1;
        self.invars.push(v);
        v
    }

    /// Capture a tensor as a new constant of the graph; returns its variable.
    pub fn add_const(&mut self, t: Tensor) -> VarId {
        self.avals.push(t.aval());
        let v = self.avals.len() - 1;
        self.constvars.push(v);
        self.consts.push(t);
        v
    }

    /// Replace the graph's outputs (each must be a variable of the graph).
    pub fn set_outputs(&mut self, outputs: &[VarId]) -> Result<()> {
        for &v in outputs {
            self.check_var("set_outputs", v)?;
        }
        self.outvars = outputs.to_vec();
        Ok(())
    }

    /// Insert `w = prim(v, extra…)` right after `v` (and the `extra`
    /// operands) are defined, and make every later use of `v` — equations
    /// after the new one and the graph outputs — read `w` instead. `prim`
    /// must give one result of `v`'s abstract value. Returns `w`.
    ///
    /// This is how a perturbation `h' = h + p` is put after a hidden state:
    /// `p` is a new input ([`Graph::add_input`]) and `prim` is `add`.
    pub fn insert_after(
        &mut self,
        v: VarId,
        prim: Arc<dyn Primitive>,
        extra: &[VarId],
    ) -> Result<VarId> {
        self.check_var("insert_after", v)?;
        for &x in extra {
            self.check_var("insert_after", x)?;
        }
        let producer = self.producers();
        let defined_at = |x: VarId| producer[x].map_or(0, |i| i + 1);
        let pos = std::iter::once(v)
            .chain(extra.iter().copied())
            .map(defined_at)
            .max()
            .unwrap_or(0);
        let mut inputs = vec![v];
        inputs.extend_from_slice(extra);
        let in_avals: Vec<Aval> = inputs.iter().map(|&x| self.avals[x].clone()).collect();
        let out = prim.abstract_eval(&in_avals)?;
        if out.len() != 1 || out[0] != self.avals[v] {
            let got: Vec<String> = out.iter().map(|a| a.to_string()).collect();
            return Err(surgery_err(format!(
                "insert_after {}: `{}` must return one value of {}, it returns ({})",
                var_name(v),
                prim.name(),
                self.avals[v],
                got.join(", ")
            )));
        }
        self.avals.push(self.avals[v].clone());
        let w = self.avals.len() - 1;
        for e in &mut self.eqns[pos..] {
            for x in &mut e.inputs {
                if *x == v {
                    *x = w;
                }
            }
        }
        for x in &mut self.outvars {
            if *x == v {
                *x = w;
            }
        }
        self.eqns.insert(
            pos,
            Eqn {
                prim,
                inputs,
                outputs: vec![w],
            },
        );
        Ok(w)
    }

    /// Evaluate once the equations whose operands are all captured
    /// (concrete) constants, and capture their results as constants: a
    /// staged step's loss seed `1 / n`, broadcast and scaled, is then not
    /// recomputed on every call. Only equations CSE could identify
    /// ([`Primitive::cse_key`]: no effects, no randomness) are folded, and
    /// only while their results hold no more elements than their operands,
    /// or at most [`FOLD_MAX_ELEMENTS`] (a constant is read from memory on
    /// every call). Returns how many equations were folded.
    pub fn fold_constants(&mut self) -> usize {
        let mut value: HashMap<VarId, Tensor> = self
            .constvars
            .iter()
            .zip(&self.consts)
            .filter(|(_, c)| !c.is_symbolic())
            .map(|(&v, c)| (v, c.clone()))
            .collect();
        let before = self.eqns.len();
        let mut kept = Vec::with_capacity(before);
        for e in std::mem::take(&mut self.eqns) {
            let size = |vs: &[VarId]| vs.iter().map(|&v| self.avals[v].size()).sum::<usize>();
            let foldable = !e.inputs.is_empty()
                && e.inputs.iter().all(|v| value.contains_key(v))
                && e.prim.cse_key().is_some()
                && size(&e.outputs) <= size(&e.inputs).max(FOLD_MAX_ELEMENTS);
            let outs = foldable
                .then(|| {
                    let ins: Vec<Tensor> = e.inputs.iter().map(|v| value[v].clone()).collect();
                    e.prim.eval(&ins).ok()
                })
                .flatten()
                .filter(|outs| {
                    outs.len() == e.outputs.len()
                        && outs
                            .iter()
                            .zip(&e.outputs)
                            .all(|(t, &o)| !t.is_symbolic() && t.aval() == self.avals[o])
                });
            match outs {
                Some(outs) => {
                    for (t, &o) in outs.into_iter().zip(&e.outputs) {
                        value.insert(o, t.clone());
                        self.constvars.push(o);
                        self.consts.push(t);
                    }
                }
                None => kept.push(e),
            }
        }
        self.eqns = kept;
        before - self.eqns.len()
    }

    /// Drop the equations that add a captured constant of zeros to a value
    /// of the result's shape (`x + 0`, `0 + x`, `x - 0`) or multiply one
    /// by ones (`x * 1`, `1 * x`, `x / 1`): their results are replaced by
    /// `x`. Staged learning steps get them from tangent seeds and from the
    /// zero perturbations of a hidden state, and they keep [`Graph::cse`]
    /// from seeing that such a perturbed copy of the forward pass is the
    /// forward pass. Exact, except that `-0.0 + 0.0` was `+0.0` and is now
    /// `-0.0` (as XLA's algebraic simplifier also does). Returns how many
    /// equations were removed.
    pub fn simplify_identities(&mut self) -> usize {
        // Captured float constants with one value throughout.
        let mut uniform: HashMap<VarId, f64> = HashMap::new();
        for (&v, c) in self.constvars.iter().zip(&self.consts) {
            if c.is_symbolic() || !c.dtype().is_float() {
                continue;
            }
            if let Ok(vals) = c.to_vec_f64() {
                if let Some(&first) = vals.first() {
                    if vals.iter().all(|&x| x == first) {
                        uniform.insert(v, first);
                    }
                }
            }
        }
        if uniform.is_empty() {
            return 0;
        }
        let mut rename: Vec<VarId> = (0..self.avals.len()).collect();
        let before = self.eqns.len();
        let mut kept = Vec::with_capacity(before);
        for mut e in std::mem::take(&mut self.eqns) {
            for x in &mut e.inputs {
                *x = rename[*x];
            }
            let [left, right] = e.prim.neutral_operands();
            let is = |v: VarId, val: Option<f64>| val.is_some() && uniform.get(&v) == val.as_ref();
            let same = match (e.inputs.as_slice(), e.outputs.as_slice()) {
                (&[a, b], &[out]) => {
                    let x = if is(b, right) {
                        Some(a)
                    } else if is(a, left) {
                        Some(b)
                    } else {
                        None
                    };
                    x.filter(|&x| self.avals[x] == self.avals[out])
                        .map(|x| (out, x))
                }
                _ => None,
            };
            match same {
                Some((out, x)) => rename[out] = x,
                None => kept.push(e),
            }
        }
        self.eqns = kept;
        for x in &mut self.outvars {
            *x = rename[*x];
        }
        before - self.eqns.len()
    }

    /// Common-subexpression elimination: an equation whose primitive has
    /// the same [`Primitive::cse_key`] and the same operands as an earlier
    /// one is dropped and its results replaced by the earlier one's.
    /// Returns how many equations were removed.
    pub fn cse(&mut self) -> usize {
        let mut rename: Vec<VarId> = (0..self.avals.len()).collect();
        let mut seen: HashMap<(String, Vec<VarId>), Vec<VarId>> = HashMap::new();
        let before = self.eqns.len();
        let mut kept = Vec::with_capacity(before);
        for mut e in std::mem::take(&mut self.eqns) {
            for x in &mut e.inputs {
                *x = rename[*x];
            }
            let Some(key) = e.prim.cse_key() else {
                kept.push(e);
                continue;
            };
            let key = (key, e.inputs.clone());
            match seen.get(&key) {
                Some(prev) if prev.len() == e.outputs.len() => {
                    for (&o, &p) in e.outputs.iter().zip(prev) {
                        rename[o] = p;
                    }
                }
                _ => {
                    seen.insert(key, e.outputs.clone());
                    kept.push(e);
                }
            }
        }
        self.eqns = kept;
        for x in &mut self.outvars {
            *x = rename[*x];
        }
        before - self.eqns.len()
    }

    /// Whether `self` and `other` compute the same thing: the same variables
    /// with the same avals, the same captured constants bit for bit (all
    /// concrete), and equation for equation the same [`Primitive::cse_key`]
    /// on the same operands into the same results. `false` whenever that
    /// cannot be told: an equation without a key (effects, randomness, a
    /// closure) or a constant of an enclosing trace. Two traces of one
    /// function with the same argument avals are the same computation
    /// unless the function changed what it captured.
    pub fn same_computation(&self, other: &Graph) -> bool {
        let same_const = |a: &Tensor, b: &Tensor| match (a.data(), b.data()) {
            (Ok(x), Ok(y)) => same_bits(x, y),
            _ => false,
        };
        self.avals == other.avals
            && self.invars == other.invars
            && self.constvars == other.constvars
            && self.outvars == other.outvars
            && self.consts.len() == other.consts.len()
            && self
                .consts
                .iter()
                .zip(&other.consts)
                .all(|(a, b)| same_const(a, b))
            && self.eqns.len() == other.eqns.len()
            && self.eqns.iter().zip(&other.eqns).all(|(a, b)| {
                a.inputs == b.inputs
                    && a.outputs == b.outputs
                    && matches!(
                        (a.prim.cse_key(), b.prim.cse_key()),
                        (Some(x), Some(y)) if x == y
                    )
            })
    }

    /// Remove equations whose results are never used (and constants no
    /// equation or output reads).
    pub fn dce(&mut self) {
        let mut live = vec![false; self.avals.len()];
        for &v in &self.outvars {
            live[v] = true;
        }
        let mut keep = vec![false; self.eqns.len()];
        for (i, e) in self.eqns.iter().enumerate().rev() {
            if e.outputs.iter().any(|&v| live[v]) {
                keep[i] = true;
                for &v in &e.inputs {
                    live[v] = true;
                }
            }
        }
        let mut k = keep.iter();
        self.eqns.retain(|_| k.next().copied().unwrap_or(true));
        let (mut cv, mut cs) = (Vec::new(), Vec::new());
        for (&v, c) in self.constvars.iter().zip(&self.consts) {
            if live[v] {
                cv.push(v);
                cs.push(c.clone());
            }
        }
        self.constvars = cv;
        self.consts = cs;
    }

    /// Check the graph's invariants: every variable exists and is defined
    /// once (as an input, a constant or an equation result) before it is
    /// read; constants match their variables; every equation's result
    /// avals are what its primitive infers from its operands.
    pub fn validate(&self) -> Result<()> {
        let op = "graph validation";
        let n = self.avals.len();
        let bad = |v: VarId| v >= n;
        if self.constvars.len() != self.consts.len() {
            return Err(Error::invalid(
                op,
                format!(
                    "{} constant variables but {} constant values",
                    self.constvars.len(),
                    self.consts.len()
                ),
            ));
        }
        let mut defined = vec![false; n];
        let define = |defined: &mut Vec<bool>, v: VarId, what: &str| -> Result<()> {
            if bad(v) {
                return Err(Error::invalid(
                    op,
                    format!("{what} names variable {v}, but the graph has {n} variables"),
                ));
            }
            if std::mem::replace(&mut defined[v], true) {
                return Err(Error::invalid(
                    op,
                    format!("variable {} is defined twice ({what})", var_name(v)),
                ));
            }
            Ok(())
        };
        for &v in &self.invars {
            define(&mut defined, v, "an input")?;
        }
        for (&v, c) in self.constvars.iter().zip(&self.consts) {
            define(&mut defined, v, "a constant")?;
            if c.aval() != self.avals[v] {
                return Err(Error::invalid(
                    op,
                    format!(
                        "constant {} holds a {} but its variable is {}",
                        var_name(v),
                        c.aval(),
                        self.avals[v]
                    ),
                ));
            }
        }
        for (i, e) in self.eqns.iter().enumerate() {
            let name = e.prim.name();
            for &v in &e.inputs {
                if bad(v) || !defined[v] {
                    return Err(Error::invalid(
                        op,
                        format!(
                            "equation {i} (`{name}`) reads {} before it is defined",
                            if bad(v) {
                                format!("variable {v}")
                            } else {
                                var_name(v)
                            }
                        ),
                    ));
                }
            }
            let in_avals: Vec<Aval> = e.inputs.iter().map(|&v| self.avals[v].clone()).collect();
            let out = e.prim.abstract_eval(&in_avals)?;
            for &v in &e.outputs {
                define(
                    &mut defined,
                    v,
                    &format!("a result of equation {i} (`{name}`)"),
                )?;
            }
            let declared: Vec<&Aval> = e.outputs.iter().map(|&v| &self.avals[v]).collect();
            if out.len() != declared.len() || out.iter().zip(&declared).any(|(a, b)| a != *b) {
                let fmt = |v: Vec<String>| v.join(", ");
                return Err(Error::invalid(
                    op,
                    format!(
                        "equation {i} (`{name}`) declares results ({}) but its primitive gives ({})",
                        fmt(declared.iter().map(|a| a.to_string()).collect()),
                        fmt(out.iter().map(|a| a.to_string()).collect())
                    ),
                ));
            }
        }
        for &v in &self.outvars {
            if bad(v) || !defined[v] {
                return Err(Error::invalid(
                    op,
                    format!("output variable {v} is never defined"),
                ));
            }
        }
        Ok(())
    }
}

/// Same shape, dtype and bits (`-0.0` is not `0.0`; a NaN equals itself).
fn same_bits(a: &ArrayData, b: &ArrayData) -> bool {
    fn eq<T: Copy, K: PartialEq>(
        a: &ndarray::ArrayD<T>,
        b: &ndarray::ArrayD<T>,
        key: impl Fn(T) -> K,
    ) -> bool {
        a.shape() == b.shape() && a.iter().zip(b.iter()).all(|(&x, &y)| key(x) == key(y))
    }
    match (a, b) {
        (ArrayData::F32(x), ArrayData::F32(y)) => eq(x, y, f32::to_bits),
        (ArrayData::F64(x), ArrayData::F64(y)) => eq(x, y, f64::to_bits),
        (ArrayData::I64(x), ArrayData::I64(y)) => eq(x, y, |v| v),
        (ArrayData::Bool(x), ArrayData::Bool(y)) => eq(x, y, |v| v),
        _ => false,
    }
}
