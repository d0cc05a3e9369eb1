//! The ETP compiler's analysis: trace one step of a model into a [`Graph`],
//! then find the hidden groups, the relations (ETP equation → `y` → hidden
//! groups, with braintrace's tail-boundary rule and weight→weight
//! exclusion) and the diagnostics explaining each decision.
//!
//! The traced step graph has inputs `params ++ hidden ++ [x]` (declaration
//! order) and outputs `[out] ++ new_hidden`.

use super::control_flow::{canonicalize_control_flow, refusal, ControlFlowPolicy};
use super::diagnostics::{Diagnostic, DiagnosticKind, Level};
use super::state::{step_values, Model, ModelState};
use crate::error::{Error, Result};
use crate::etp::{as_etp_eqn, EtpPrimitive, Params};
use crate::graph::{Graph, VarId};
use crate::ops::broadcast_shapes;
use crate::tensor::{Aval, Tensor};
use std::collections::{BTreeSet, VecDeque};
use std::fmt;

/// A set of hidden states whose transition is analysed together: the states
/// reach one another within one step (outside weight operations).
#[derive(Clone, Debug, PartialEq)]
pub struct HiddenGroup {
    /// Position in [`EtraceGraph::groups`].
    pub index: usize,
    /// The states' paths, in state order (the trailing axis of traces).
    pub hidden_paths: Vec<String>,
    /// The states' indices in the model's hidden declarations.
    pub states: Vec<usize>,
    /// The shape of one state, batch axis included.
    pub varshape: Vec<usize>,
}

impl HiddenGroup {
    /// Number of states `S` (the trailing axis of every trace of the group).
    pub fn num_state(&self) -> usize {
        self.states.len()
    }
}

/// One trainable operand of a relation.
#[derive(Clone, Debug, PartialEq)]
pub struct RelationTrainable {
    /// The primitive's trainable name (`weight`, `bias`, `lora_b`, ...).
    pub name: String,
    /// The operand position in the equation.
    pub operand: usize,
    /// The parameter leaf it comes from (index into the model's parameters).
    pub param: usize,
    /// That leaf's key (`rnn/Wz/weight/bias`).
    pub param_key: String,
    /// That leaf's parameter-state path (`rnn/Wz/weight`).
    pub state_path: String,
}

/// An ETP equation whose output reaches hidden groups: it gets eligibility
/// traces, one set per group.
#[derive(Clone, Debug)]
pub struct Relation {
    /// Position in [`EtraceGraph::relations`].
    pub index: usize,
    /// The equation's index in the step graph.
    pub eqn: usize,
    /// The primitive.
    pub primitive: EtpPrimitive,
    /// The equation's params.
    pub params: Params,
    /// The `x` operand's variable (none for `etp_elemwise`).
    pub x_var: Option<VarId>,
    /// The output `y`'s variable.
    pub y_var: VarId,
    /// The trainable operands found to be model parameters.
    pub trainables: Vec<RelationTrainable>,
    /// The hidden groups `y` reaches (indices into [`EtraceGraph::groups`]).
    pub groups: Vec<usize>,
    /// The hidden states `y` reaches within the step.
    pub connected_hidden: Vec<String>,
}

impl Relation {
    /// The `(name, state path)` pairs, as braintrace reports `trainable`.
    pub fn trainable_paths(&self) -> Vec<(String, String)> {
        self.trainables
            .iter()
            .map(|t| (t.name.clone(), t.state_path.clone()))
            .collect()
    }
}

/// The result of analysing one step of a model.
#[derive(Clone, Debug)]
pub struct EtraceGraph {
    graph: Graph,
    num_params: usize,
    num_hidden: usize,
    batch: Option<usize>,
    hidden_paths: Vec<String>,
    param_keys: Vec<String>,
    groups: Vec<HiddenGroup>,
    relations: Vec<Relation>,
    diagnostics: Vec<Diagnostic>,
}

fn is_weight_op(name: &str) -> bool {
    matches!(name, "matmul" | "conv" | "dot_general")
}

impl EtraceGraph {
    /// Trace one step of `model` at its current state on `x` and analyse it
    /// (control flow handled by the default [`ControlFlowPolicy`]).
    pub fn analyse<M: Model + ?Sized>(model: &M, state: &ModelState, x: &Tensor) -> Result<Self> {
        Self::analyse_with(model, state, x, &ControlFlowPolicy::default())
    }

    /// [`EtraceGraph::analyse`] with a control-flow policy: ETP-relevant
    /// fixed-count scans are unrolled and conds if-converted before the
    /// analysis; what cannot be traced through is refused with an error
    /// naming the op (see [`canonicalize_control_flow`]).
    pub fn analyse_with<M: Model + ?Sized>(
        model: &M,
        state: &ModelState,
        x: &Tensor,
        policy: &ControlFlowPolicy,
    ) -> Result<Self> {
        let pinfo = state.param_infos().to_vec();
        let hinfo = state.hidden_infos().to_vec();
        let (np, nh) = (pinfo.len(), hinfo.len());
        let mut avals: Vec<Aval> = state.param_values().iter().map(Tensor::aval).collect();
        avals.extend(state.hidden_values().iter().map(Tensor::aval));
        avals.push(x.aval());
        let graph = crate::transform::make_graph(
            |a: &[Tensor]| {
                let (out, new_h) = step_values(
                    model,
                    &pinfo,
                    &a[..np],
                    &hinfo,
                    &a[np..np + nh],
                    &a[np + nh],
                )?;
                let mut outs = vec![out];
                outs.extend(new_h);
                Ok(outs)
            },
            &avals,
        )?;
        let param_keys: Vec<String> = pinfo.iter().map(|p| p.key.clone()).collect();
        let (graph, diagnostics) = canonicalize_control_flow(&graph, &param_keys, policy)?;
        if let Some(e) = refusal(&diagnostics) {
            return Err(e);
        }
        let mut g = EtraceGraph {
            graph,
            num_params: np,
            num_hidden: nh,
            batch: state.batch(),
            hidden_paths: hinfo.iter().map(|h| h.path.clone()).collect(),
            param_keys,
            groups: Vec::new(),
            relations: Vec::new(),
            diagnostics,
        };
        g.find_groups()?;
        g.find_relations(state)?;
        Ok(g)
    }

    /// The batch size the step was traced with (the leading axis of the
    /// hidden states), `None` unbatched.
    pub fn batch(&self) -> Option<usize> {
        self.batch
    }

    /// The traced step graph (ETP equations kept).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The hidden groups.
    pub fn groups(&self) -> &[HiddenGroup] {
        &self.groups
    }
    /// The relations.
    pub fn relations(&self) -> &[Relation] {
        &self.relations
    }
    /// Every decision the compiler made, in order.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }
    /// Number of parameter inputs of the step graph.
    pub fn num_params(&self) -> usize {
        self.num_params
    }
    /// Number of hidden inputs (and hidden outputs) of the step graph.
    pub fn num_hidden(&self) -> usize {
        self.num_hidden
    }
    /// The step graph's input variable of hidden state `i`.
    pub fn hidden_in_var(&self, i: usize) -> VarId {
        self.graph.invars()[self.num_params + i]
    }
    /// The step graph's output variable of hidden state `i`.
    pub fn hidden_out_var(&self, i: usize) -> VarId {
        self.graph.outvars()[1 + i]
    }
    /// Which parameters have no relation (they get no trace).
    pub fn params_without_relation(&self) -> Vec<usize> {
        let with: BTreeSet<usize> = self
            .relations
            .iter()
            .flat_map(|r| r.trainables.iter().map(|t| t.param))
            .collect();
        (0..self.num_params).filter(|p| !with.contains(p)).collect()
    }

    /// Forward reachability from `start` over consumers; `stop(eqn)` says an
    /// equation does not propagate; `halt(var)` says a var is reached but not
    /// followed. Returns the reached vars and the stopped equations met.
    fn reach(
        &self,
        consumers: &[Vec<usize>],
        start: VarId,
        stop: &dyn Fn(usize) -> bool,
        halt: &dyn Fn(VarId) -> bool,
    ) -> (Vec<bool>, Vec<usize>) {
        let mut seen = vec![false; self.graph.num_vars()];
        let mut blocked = Vec::new();
        let mut q = VecDeque::from([start]);
        seen[start] = true;
        while let Some(v) = q.pop_front() {
            if v != start && halt(v) {
                continue;
            }
            for &ei in &consumers[v] {
                if stop(ei) {
                    if !blocked.contains(&ei) {
                        blocked.push(ei);
                    }
                    continue;
                }
                for &o in self.graph.eqns()[ei].outputs() {
                    if !seen[o] {
                        seen[o] = true;
                        q.push_back(o);
                    }
                }
            }
        }
        (seen, blocked)
    }

    /// Whether equation `i` is an ETP equation that is not gradient-enabled
    /// (a tail boundary).
    fn is_boundary(&self, i: usize) -> bool {
        as_etp_eqn(&**self.graph.eqns()[i].prim())
            .map(|e| !e.prim.is_gradient_enabled())
            .unwrap_or(false)
    }

    fn find_groups(&mut self) -> Result<()> {
        let nh = self.num_hidden;
        let consumers = self.graph.consumers();
        let eqns = self.graph.eqns();
        let stop = |i: usize| {
            let name = eqns[i].prim().name();
            name == "stop_gradient" || self.is_boundary(i) || is_weight_op(&name)
        };
        let mut parent: Vec<usize> = (0..nh).collect();
        fn find(p: &mut [usize], i: usize) -> usize {
            let mut r = i;
            while p[r] != r {
                r = p[r];
            }
            p[i] = r;
            r
        }
        // Whether a state has a hidden-to-hidden path within the step (from
        // or to it): one without (its only recurrence runs through a
        // weight) gets a zero-recurrence group of its own, after the others.
        let mut recurrent = vec![false; nh];
        for i in 0..nh {
            let (seen, _) = self.reach(&consumers, self.hidden_in_var(i), &stop, &|_| false);
            for j in 0..nh {
                let out = self.hidden_out_var(j);
                if seen[out]
                    && self.graph.aval(out).shape()
                        == self.graph.aval(self.hidden_in_var(i)).shape()
                {
                    recurrent[i] = true;
                    recurrent[j] = true;
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    if a != b {
                        parent[a.max(b)] = a.min(b);
                    }
                }
            }
        }
        let mut groups: Vec<HiddenGroup> = Vec::new();
        let mut root_group: Vec<Option<usize>> = vec![None; nh];
        for i in 0..nh {
            let r = find(&mut parent, i);
            match root_group[r] {
                Some(gi) => {
                    groups[gi].states.push(i);
                    groups[gi].hidden_paths.push(self.hidden_paths[i].clone());
                }
                None => {
                    root_group[r] = Some(groups.len());
                    groups.push(HiddenGroup {
                        index: groups.len(),
                        hidden_paths: vec![self.hidden_paths[i].clone()],
                        states: vec![i],
                        varshape: self.graph.aval(self.hidden_in_var(i)).shape().to_vec(),
                    });
                }
            }
        }
        // braintrace's order ("fourth-b step" of its hidden-group
        // compiler): the groups with a surviving recurrence first, by their
        // first state; then the zero-recurrence ones, in state order.
        let (mut groups, rest): (Vec<HiddenGroup>, Vec<HiddenGroup>) = groups
            .into_iter()
            .partition(|g| g.states.iter().any(|&s| recurrent[s]));
        groups.extend(rest);
        for (k, g) in groups.iter_mut().enumerate() {
            g.index = k;
        }
        for g in &groups {
            if g.states.len() > 1 {
                self.diagnostics.push(Diagnostic {
                    kind: DiagnosticKind::HiddenGroupMerged,
                    level: Level::Info,
                    message: format!(
                        "hidden states [{}] reach one another within a step and form one group of {} states",
                        g.hidden_paths.join(", "),
                        g.states.len()
                    ),
                    primitive: None,
                    weight_path: None,
                    hidden_paths: g.hidden_paths.clone(),
                });
            }
        }
        self.groups = groups;
        Ok(())
    }

    fn group_of_state(&self, s: usize) -> usize {
        self.groups
            .iter()
            .position(|g| g.states.contains(&s))
            .expect("every state is in a group")
    }

    /// The model parameter an operand var comes from: the first parameter
    /// input found walking producers backwards.
    fn param_source(&self, producers: &[Option<usize>], var: VarId) -> Option<usize> {
        let invars = self.graph.invars();
        let mut seen = BTreeSet::new();
        let mut q = VecDeque::from([var]);
        while let Some(v) = q.pop_front() {
            if !seen.insert(v) {
                continue;
            }
            if let Some(p) = invars[..self.num_params].iter().position(|&iv| iv == v) {
                return Some(p);
            }
            if let Some(e) = producers[v] {
                q.extend(self.graph.eqns()[e].inputs().iter().copied());
            }
        }
        None
    }

    fn find_relations(&mut self, state: &ModelState) -> Result<()> {
        let consumers = self.graph.consumers();
        let producers = self.graph.producers();
        let hidden_outs: Vec<VarId> = (0..self.num_hidden)
            .map(|j| self.hidden_out_var(j))
            .collect();
        let mut diags = Vec::new();
        let mut relations = Vec::new();
        for (ei, e) in self.graph.eqns().iter().enumerate() {
            let Some(etp) = as_etp_eqn(&**e.prim()) else {
                continue;
            };
            let p = etp.prim.clone();
            let pname = p.name().to_string();
            let x_var = p.x_index().and_then(|i| e.inputs().get(i).copied());
            let y_var = e.outputs()[p.y_index().min(e.outputs().len() - 1)];
            let mut trainables = Vec::new();
            for (name, idx) in p.present_trainables(e.inputs().len()) {
                match e.inputs().get(idx).and_then(|&v| self.param_source(&producers, v)) {
                    Some(pi) => {
                        let info = &state.param_infos()[pi];
                        trainables.push(RelationTrainable {
                            name,
                            operand: idx,
                            param: pi,
                            param_key: info.key.clone(),
                            state_path: info.state_path.clone(),
                        })
                    }
                    None => diags.push(Diagnostic {
                        kind: DiagnosticKind::TrainableNotParam,
                        level: Level::Info,
                        message: format!("ETP primitive {pname}: trainable operand `{name}` does not come from a model parameter"),
                        primitive: Some(pname.clone()),
                        weight_path: None,
                        hidden_paths: vec![],
                    }),
                }
            }
            let weight_path = trainables.first().map(|t| t.state_path.clone());
            if trainables.is_empty() {
                diags.push(Diagnostic {
                    kind: DiagnosticKind::ExcludedNoParam,
                    level: Level::Warning,
                    message: format!("ETP primitive {pname} has no trainable operand that is a model parameter; excluded"),
                    primitive: Some(pname),
                    weight_path: None,
                    hidden_paths: vec![],
                });
                continue;
            }
            let stop = |i: usize| self.is_boundary(i);
            let is_hidden_out = |v: VarId| hidden_outs.contains(&v);
            let (direct_seen, blocked) = self.reach(&consumers, y_var, &stop, &is_hidden_out);
            let (all_seen, _) = self.reach(&consumers, y_var, &stop, &|_| false);
            let mut direct_groups: Vec<usize> = Vec::new();
            for (j, &hv) in hidden_outs.iter().enumerate() {
                if direct_seen[hv] {
                    let gi = self.group_of_state(j);
                    if !direct_groups.contains(&gi) {
                        direct_groups.push(gi);
                    }
                }
            }
            direct_groups.sort_unstable();
            let y_shape = self.graph.aval(y_var).shape().to_vec();
            let mut groups = Vec::new();
            for gi in direct_groups {
                let vs = &self.groups[gi].varshape;
                if broadcast_shapes("relation", &[&y_shape, vs]).is_err() {
                    diags.push(Diagnostic {
                        kind: DiagnosticKind::ExcludedShapeMismatch,
                        level: Level::Warning,
                        message: format!(
                            "ETP primitive {pname} (weight={}) output {y_shape:?} does not broadcast with hidden group [{}] of shape {vs:?}; connection dropped",
                            weight_path.clone().unwrap_or_default(),
                            self.groups[gi].hidden_paths.join(", ")
                        ),
                        primitive: Some(pname.clone()),
                        weight_path: weight_path.clone(),
                        hidden_paths: self.groups[gi].hidden_paths.clone(),
                    });
                    continue;
                }
                groups.push(gi);
            }
            let connected_hidden: Vec<String> = hidden_outs
                .iter()
                .enumerate()
                .filter(|(j, &hv)| all_seen[hv] && groups.contains(&self.group_of_state(*j)))
                .map(|(j, _)| self.hidden_paths[j].clone())
                .collect();
            if groups.is_empty() {
                let (kind, why) = if blocked.is_empty() {
                    (
                        DiagnosticKind::ExcludedNonTemporal,
                        "has no connected hidden states; it is treated as a non-temporal parameter"
                            .to_string(),
                    )
                } else {
                    let via: Vec<String> = blocked
                        .iter()
                        .map(|&b| self.graph.eqns()[b].prim().name())
                        .collect();
                    (
                        DiagnosticKind::ExcludedWeightToWeight,
                        format!(
                            "reaches a hidden state only through another trainable ETP primitive ({}); excluded",
                            via.join(", ")
                        ),
                    )
                };
                diags.push(Diagnostic {
                    kind,
                    level: Level::Warning,
                    message: format!(
                        "ETP primitive {pname} (weight={}) {why}",
                        weight_path.clone().unwrap_or_default()
                    ),
                    primitive: Some(pname),
                    weight_path,
                    hidden_paths: vec![],
                });
                continue;
            }
            for j in self.partial_paths(&consumers, &producers, ei, y_var, &connected_hidden) {
                let hp = self.hidden_paths[j].clone();
                diags.push(Diagnostic {
                    kind: DiagnosticKind::PartialPath,
                    level: Level::Warning,
                    message: format!(
                        "ETP primitive {pname} (weight={}) reaches hidden state {hp} both directly and through another trainable ETP primitive; the relation is kept, but the gradient along the indirect path is not captured by its traces",
                        weight_path.clone().unwrap_or_default()
                    ),
                    primitive: Some(pname.clone()),
                    weight_path: weight_path.clone(),
                    hidden_paths: vec![hp],
                });
            }
            diags.push(Diagnostic {
                kind: DiagnosticKind::RelationIncluded,
                level: Level::Info,
                message: format!(
                    "ETP primitive {pname} (weight={}) relates to hidden group(s) {:?}: [{}]",
                    weight_path.clone().unwrap_or_default(),
                    groups,
                    connected_hidden.join(", ")
                ),
                primitive: Some(pname.clone()),
                weight_path: weight_path.clone(),
                hidden_paths: connected_hidden.clone(),
            });
            relations.push(Relation {
                index: relations.len(),
                eqn: ei,
                primitive: p,
                params: etp.params.clone(),
                x_var,
                y_var,
                trainables,
                groups,
                connected_hidden,
            });
        }
        self.diagnostics.extend(diags);
        self.relations = relations;
        Ok(())
    }

    /// The hidden states (indices, of the `connected` paths) that the
    /// output `y` of equation `eqn` reaches both directly and through
    /// another non-gradient-enabled ETP equation (braintrace's `MIXED`
    /// path classification): an equation of the latter kind lies on a path
    /// from `y` to the state's new value. The direct path is known to
    /// exist (the state is connected).
    fn partial_paths(
        &self,
        consumers: &[Vec<usize>],
        producers: &[Option<usize>],
        eqn: usize,
        y: VarId,
        connected: &[String],
    ) -> Vec<usize> {
        let (forward, _) = self.reach(consumers, y, &|_| false, &|_| false);
        let mut mixed = Vec::new();
        for (j, path) in self.hidden_paths.iter().enumerate() {
            if !connected.contains(path) {
                continue;
            }
            // Backwards from the state's new value over producers.
            let mut backward = vec![false; self.graph.num_vars()];
            let mut q = VecDeque::from([self.hidden_out_var(j)]);
            let mut crosses = false;
            while let Some(v) = q.pop_front() {
                if std::mem::replace(&mut backward[v], true) {
                    continue;
                }
                let Some(e) = producers[v] else { continue };
                if forward[v] && e != eqn && self.is_boundary(e) {
                    crosses = true;
                    break;
                }
                q.extend(self.graph.eqns()[e].inputs().iter().copied());
            }
            if crosses {
                mixed.push(j);
            }
        }
        mixed
    }

    /// A readable account of the groups, relations and every diagnostic.
    pub fn explain(&self) -> String {
        self.to_string()
    }

    /// Error out when nothing can be learned online.
    pub(crate) fn require_relations(&self) -> Result<()> {
        if self.num_hidden == 0 {
            return Err(Error::invalid(
                "compile",
                "the model declares no hidden state: there is nothing to learn online (use an ordinary gradient)",
            ));
        }
        if self.relations.is_empty() {
            // A declared state the step passes through unchanged: the
            // usual cause is a step that forgets `ctx.set_hidden`.
            let unwritten: Vec<String> = (0..self.num_hidden)
                .filter(|&i| self.hidden_out_var(i) == self.hidden_in_var(i))
                .map(|i| format!("`{}`", self.hidden_paths[i]))
                .collect();
            if !unwritten.is_empty() {
                return Err(Error::invalid(
                    "compile",
                    format!(
                        "the step never writes the hidden state(s) {} declared in `init` (set each with `ctx.set_hidden`), so no weight relates to a hidden state",
                        unwritten.join(", ")
                    ),
                ));
            }
            let etp = self
                .graph
                .eqns()
                .iter()
                .filter(|e| as_etp_eqn(&**e.prim()).is_some())
                .count();
            return Err(Error::invalid(
                "compile",
                if etp == 0 {
                    "the model's step uses no ETP operation (matmul, conv, element_wise, ...): no relation between a weight and a hidden state".to_string()
                } else {
                    format!(
                        "none of the step's {etp} ETP equation(s) relates a weight to a hidden state:\n{}",
                        self.explain()
                    )
                },
            ));
        }
        Ok(())
    }

    /// Keys of the model's parameters, in declaration order.
    pub fn param_keys(&self) -> &[String] {
        &self.param_keys
    }
}

impl fmt::Display for EtraceGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "hidden groups:")?;
        for g in &self.groups {
            writeln!(
                f,
                "  #{}: [{}] varshape {:?}, {} state(s)",
                g.index,
                g.hidden_paths.join(", "),
                g.varshape,
                g.num_state()
            )?;
        }
        writeln!(f, "relations:")?;
        for r in &self.relations {
            let t: Vec<String> = r
                .trainables
                .iter()
                .map(|t| format!("{}={}", t.name, t.param_key))
                .collect();
            writeln!(
                f,
                "  #{}: {} ({}) -> group(s) {:?}",
                r.index,
                r.primitive.name(),
                t.join(", "),
                r.groups
            )?;
        }
        writeln!(f, "diagnostics:")?;
        for d in &self.diagnostics {
            writeln!(f, "  {d}")?;
        }
        Ok(())
    }
}
