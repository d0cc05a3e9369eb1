//! The graph IR (the analogue of a jaxpr): typed SSA equations naming their
//! primitive and params, the tracer that records them, the interpreter that
//! walks them, analysis and surgery, and a readable printer.
//!
//! Tracing is *omnistaging*: while any trace is active, every `bind` is
//! recorded in the innermost one; operands that belong to an enclosing trace
//! (or are concrete) are captured as constants of the inner graph. Eager
//! evaluation happens only when no trace is active.

mod analysis;
pub(crate) mod block_op;
mod builder;
mod interpret;
mod primitive;
pub mod profile;

pub use analysis::{Reachable, Slice, FOLD_MAX_ELEMENTS};
pub use block_op::BlockOp;
pub use builder::GraphBuilder;
pub use interpret::interpret;
pub(crate) use interpret::NEVER_READ;
pub use primitive::{Elementwise, LinearArg, Planned, Primitive, PrimitiveClone};

use crate::error::{Error, Result};
use crate::tensor::{Aval, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Index of a variable in a [`Graph`].
pub type VarId = usize;

/// One equation: `outputs = prim(inputs)`. Read it with [`Eqn::prim`],
/// [`Eqn::inputs`] and [`Eqn::outputs`].
#[derive(Clone, Debug)]
pub struct Eqn {
    pub(crate) prim: Arc<dyn Primitive>,
    pub(crate) inputs: Vec<VarId>,
    pub(crate) outputs: Vec<VarId>,
}

/// A program: inputs, captured constants, equations in SSA order, outputs.
///
/// Graphs come from tracing ([`trace`], [`crate::make_graph`]), from the
/// transforms, from [`GraphBuilder`] / [`Graph::from_parts`] (validated) or
/// from the surgery methods (which keep them valid); the fields are private,
/// so every graph satisfies [`Graph::validate`] and evaluates without
/// panicking.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The abstract value of every variable, indexed by [`VarId`].
    pub(crate) avals: Vec<Aval>,
    /// Input variables, in argument order.
    pub(crate) invars: Vec<VarId>,
    /// Variables bound to captured constants.
    pub(crate) constvars: Vec<VarId>,
    /// The captured values (concrete, or symbolic of an enclosing trace).
    pub(crate) consts: Vec<Tensor>,
    /// Equations in execution order.
    pub(crate) eqns: Vec<Eqn>,
    /// Output variables.
    pub(crate) outvars: Vec<VarId>,
}

/// The graph being recorded by one active trace.
struct Builder {
    id: u64,
    avals: Vec<Aval>,
    invars: Vec<VarId>,
    constvars: Vec<VarId>,
    consts: Vec<Tensor>,
    const_index: HashMap<usize, VarId>,
    eqns: Vec<Eqn>,
}

impl Builder {
    fn new_var(&mut self, aval: Aval) -> VarId {
        self.avals.push(aval);
        self.avals.len() - 1
    }
}

thread_local! {
    static STACK: RefCell<Vec<Builder>> = const { RefCell::new(Vec::new()) };
}

static NEXT_TRACE: AtomicU64 = AtomicU64::new(1);

/// Whether a trace is being recorded on this thread.
pub fn is_tracing() -> bool {
    STACK.with(|s| !s.borrow().is_empty())
}

/// Resolve a tensor to a variable of the top builder, capturing it if needed.
fn resolve(stack: &mut [Builder], t: &Tensor, op: &str) -> Result<VarId> {
    let top_id = stack
        .last()
        .expect("resolve is called with a trace active")
        .id;
    if let Some(v) = t.sym() {
        if v.trace == top_id {
            return Ok(v.var);
        }
        if !stack.iter().any(|b| b.id == v.trace) {
            return Err(Error::EscapedTracer {
                op: op.to_string(),
                trace: v.trace,
            });
        }
    }
    let top = stack.last_mut().expect("trace active");
    if let Some(&var) = top.const_index.get(&t.ptr_id()) {
        return Ok(var);
    }
    let var = top.new_var(t.aval());
    top.constvars.push(var);
    top.consts.push(t.clone());
    top.const_index.insert(t.ptr_id(), var);
    Ok(var)
}

/// Apply a primitive: evaluate it eagerly, or record it in the active trace.
pub fn bind(prim: Arc<dyn Primitive>, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    if !is_tracing() {
        if let Some(t) = inputs.iter().find(|t| t.is_symbolic()) {
            let trace = t.sym().map(|v| v.trace).unwrap_or(0);
            return Err(Error::EscapedTracer {
                op: prim.name(),
                trace,
            });
        }
        return prim.eval(inputs);
    }
    let in_avals: Vec<Aval> = inputs.iter().map(Tensor::aval).collect();
    // Shape inference may itself trace (ETP impls), so it runs before the
    // stack is borrowed.
    let out_avals = prim.abstract_eval(&in_avals)?;
    STACK.with(|s| {
        let mut stack = s.borrow_mut();
        let name = prim.name();
        let in_vars = inputs
            .iter()
            .map(|t| resolve(&mut stack, t, &name))
            .collect::<Result<Vec<_>>>()?;
        let top = stack.last_mut().expect("trace active");
        let out_vars: Vec<VarId> = out_avals.iter().map(|a| top.new_var(a.clone())).collect();
        let id = top.id;
        top.eqns.push(Eqn {
            prim,
            inputs: in_vars,
            outputs: out_vars.clone(),
        });
        Ok(out_vars
            .iter()
            .zip(out_avals)
            .map(|(&v, a)| Tensor::symbolic(id, v, a))
            .collect())
    })
}

/// Bind a single-output primitive.
pub fn bind1(prim: Arc<dyn Primitive>, inputs: &[Tensor]) -> Result<Tensor> {
    let name = prim.name();
    let mut outs = bind(prim, inputs)?;
    if outs.len() != 1 {
        return Err(Error::invalid(
            name,
            format!("expected one output, got {}", outs.len()),
        ));
    }
    Ok(outs.pop().expect("one output"))
}

/// Pops the builder when tracing ends, also on error or panic.
struct TraceGuard {
    id: u64,
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        STACK.with(|s| {
            let mut stack = s.borrow_mut();
            if stack.last().map(|b| b.id) == Some(self.id) {
                stack.pop();
            }
        });
    }
}

/// Trace `f` on symbolic inputs of the given avals into a [`Graph`].
///
/// Operands captured from outside (concrete tensors, or symbolic tensors of
/// an enclosing trace) become the graph's constants.
pub fn trace<F>(f: F, avals: &[Aval]) -> Result<Graph>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let id = NEXT_TRACE.fetch_add(1, Ordering::Relaxed);
    let mut b = Builder {
        id,
        avals: Vec::new(),
        invars: Vec::new(),
        constvars: Vec::new(),
        consts: Vec::new(),
        const_index: HashMap::new(),
        eqns: Vec::new(),
    };
    let inputs: Vec<Tensor> = avals
        .iter()
        .map(|a| {
            let v = b.new_var(a.clone());
            b.invars.push(v);
            Tensor::symbolic(id, v, a.clone())
        })
        .collect();
    STACK.with(|s| s.borrow_mut().push(b));
    let guard = TraceGuard { id };
    let outs = f(&inputs)?;
    let outvars = STACK.with(|s| {
        let mut stack = s.borrow_mut();
        outs.iter()
            .map(|t| resolve(&mut stack, t, "make_graph"))
            .collect::<Result<Vec<_>>>()
    })?;
    let b = STACK
        .with(|s| s.borrow_mut().pop())
        .expect("builder pushed above");
    std::mem::forget(guard);
    debug_assert_eq!(b.id, id);
    let mut g = Graph {
        avals: b.avals,
        invars: b.invars,
        constvars: b.constvars,
        consts: b.consts,
        eqns: b.eqns,
        outvars,
    };
    g.dce();
    Ok(g)
}

impl Eqn {
    /// The primitive with its static params.
    pub fn prim(&self) -> &Arc<dyn Primitive> {
        &self.prim
    }
    /// Operand variables.
    pub fn inputs(&self) -> &[VarId] {
        &self.inputs
    }
    /// Result variables.
    pub fn outputs(&self) -> &[VarId] {
        &self.outputs
    }
}

impl Graph {
    /// The equations, in execution order.
    pub fn eqns(&self) -> &[Eqn] {
        &self.eqns
    }
    /// Input variables, in argument order.
    pub fn invars(&self) -> &[VarId] {
        &self.invars
    }
    /// Output variables.
    pub fn outvars(&self) -> &[VarId] {
        &self.outvars
    }
    /// Variables bound to captured constants (parallel to [`Graph::consts`]).
    pub fn constvars(&self) -> &[VarId] {
        &self.constvars
    }
    /// The captured constant values (parallel to [`Graph::constvars`]).
    pub fn consts(&self) -> &[Tensor] {
        &self.consts
    }
    /// The abstract value of a variable.
    pub fn aval(&self, v: VarId) -> &Aval {
        &self.avals[v]
    }
    /// Number of variables (every [`VarId`] is below it).
    pub fn num_vars(&self) -> usize {
        self.avals.len()
    }
    /// Abstract values of the inputs.
    pub fn in_avals(&self) -> Vec<Aval> {
        self.invars.iter().map(|&v| self.avals[v].clone()).collect()
    }
    /// Abstract values of the outputs.
    pub fn out_avals(&self) -> Vec<Aval> {
        self.outvars
            .iter()
            .map(|&v| self.avals[v].clone())
            .collect()
    }
    /// Whether any captured constant is symbolic (the graph depends on an
    /// enclosing trace and may not be cached beyond it).
    pub fn captures_tracers(&self) -> bool {
        self.consts.iter().any(Tensor::is_symbolic)
    }
    /// Evaluate the graph on `inputs` through [`bind`] (eagerly, or recorded
    /// into the active trace).
    pub fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if profile::enabled() && !is_tracing() {
            return self.eval_with(inputs, |eqn, ins| {
                let t0 = std::time::Instant::now();
                let outs = bind(eqn.prim.clone(), ins)?;
                let d = t0.elapsed();
                let shapes = format!(
                    "{} -> {}",
                    profile::shapes_label(&crate::tensor::avals(ins)),
                    profile::shapes_label(&crate::tensor::avals(&outs))
                );
                profile::record(&eqn.prim.name(), &shapes, d);
                Ok(outs)
            });
        }
        self.eval_with(inputs, |eqn, ins| bind(eqn.prim.clone(), ins))
    }
    /// Evaluate with a custom rule per equation, on tensors (the arguments
    /// must have the graph's input avals). Built on [`interpret`].
    pub fn eval_with<F>(&self, inputs: &[Tensor], mut apply: F) -> Result<Vec<Tensor>>
    where
        F: FnMut(&Eqn, &[Tensor]) -> Result<Vec<Tensor>>,
    {
        if inputs.len() != self.invars.len() {
            return Err(Error::arity(
                "graph evaluation",
                self.invars.len(),
                inputs.len(),
            ));
        }
        for (i, (t, &v)) in inputs.iter().zip(&self.invars).enumerate() {
            if t.aval() != self.avals[v] {
                return Err(Error::shapes(
                    "graph evaluation",
                    [t.shape(), self.avals[v].shape()],
                    format!(
                        "argument {i} ({}) must have the abstract value the graph was traced with ({})",
                        t.aval(),
                        self.avals[v]
                    ),
                ));
            }
        }
        interpret(self, inputs.to_vec(), Tensor::clone, |e, args| {
            apply(e, &args)
        })
    }
    /// The same computation with every equation that has a lowering (ETP
    /// primitives, closed-graph calls) replaced by its implementation's core
    /// ops, recursively: an implementation that binds another lowerable
    /// primitive is lowered in turn. Analysis sees ETP equations; execution
    /// runs the lowered graph.
    pub fn lower(&self) -> Result<Graph> {
        let mut g = trace(|args: &[Tensor]| lower_into(self, args), &self.in_avals())?;
        g.dce();
        Ok(g)
    }
    /// The primitive names of the equations, in order.
    pub fn primitive_names(&self) -> Vec<String> {
        self.eqns.iter().map(|e| e.prim.name()).collect()
    }
}

/// Evaluate `g` on `args` with every lowerable equation lowered, recursively.
fn lower_into(g: &Graph, args: &[Tensor]) -> Result<Vec<Tensor>> {
    g.eval_with(args, |e, ins| {
        // Trace the equation's lowering on its own, so that what it binds
        // can itself be lowered; a primitive without one is bound as is.
        let mut lowered = true;
        let sub = trace(
            |a: &[Tensor]| match e.prim.lower(a) {
                Some(r) => r,
                None => {
                    lowered = false;
                    Ok(Vec::new())
                }
            },
            &crate::tensor::avals(ins),
        )?;
        if lowered {
            lower_into(&sub, ins)
        } else {
            bind(e.prim.clone(), ins)
        }
    })
}

/// The printed name of a variable.
pub(crate) fn var_name(v: VarId) -> String {
    // a, b, ..., z, ba, bb, ... like jaxprs.
    let mut n = v;
    let mut s = Vec::new();
    loop {
        s.push(b'a' + (n % 26) as u8);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).expect("ascii")
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let decl = |v: &VarId| format!("{}:{}", var_name(*v), self.avals[*v]);
        let consts: Vec<String> = self.constvars.iter().map(decl).collect();
        let ins: Vec<String> = self.invars.iter().map(decl).collect();
        if consts.is_empty() {
            writeln!(f, "{{ lambda ; {}. let", ins.join(" "))?;
        } else {
            writeln!(f, "{{ lambda {} ; {}. let", consts.join(" "), ins.join(" "))?;
        }
        for e in &self.eqns {
            let outs: Vec<String> = e.outputs.iter().map(decl).collect();
            let ins: Vec<String> = e.inputs.iter().map(|v| var_name(*v)).collect();
            let params = e.prim.params();
            let p = if params.is_empty() {
                String::new()
            } else {
                // A held graph (control flow) prints on its own lines,
                // indented under its equation.
                let kv: Vec<String> = params
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.replace('\n', "\n        ")))
                    .collect();
                format!("[{}]", kv.join(" "))
            };
            writeln!(
                f,
                "    {} = {}{} {}",
                outs.join(" "),
                e.prim.name(),
                p,
                ins.join(" ")
            )?;
        }
        let outs: Vec<String> = self.outvars.iter().map(|v| var_name(*v)).collect();
        write!(f, "  in ({}) }}", outs.join(", "))
    }
}
