//! The planned executor: a [`Graph`] compiled once into a list of steps that
//! run on concrete tensors without the interpreter's per-call work. Operand
//! slots and last uses are resolved when the plan is built; no shape
//! inference, tracing check or [`super::bind`] happens at run time; and
//! chains of element-wise equations of one shape are fused into one loop
//! over blocks of the output, each equation applied to the block in a small
//! set of block buffers (the data stays in L1, one dispatch per block
//! instead of one pass over memory per equation, no intermediate tensors).
//!
//! A fused group is a set of element-wise equations (see
//! [`super::Primitive::elementwise`]) with one output shape and float dtype
//! whose operands have that shape or a single element (broadcast). It runs
//! where its last equation stood: an equation joins the open group of its
//! shape, and a group closes as soon as an equation outside it reads one of
//! its values, so every reader outside runs after it. Values read outside
//! the group (or returned by the graph) are materialised; the others live
//! only in block buffers.
//!
//! [`crate::Jit`] runs its cached graphs through a plan; everything else
//! (and anything the plan does not cover) goes through the interpreter.

use super::interpret::NEVER_READ;
use super::{profile, Elementwise, Graph, Primitive, VarId};
use crate::error::{Error, Result};
use crate::tensor::{ArrayData, Aval, DType, Tensor};
use ndarray::{ArrayD, IxDyn, ShapeBuilder};
use num_traits::Float;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Elements per block of a fused loop: 256 `f32`s are 1 KiB, so a group's
/// few block buffers stay in L1.
const BLOCK: usize = 256;
/// Most operands an element-wise equation may have to be fused.
const MAX_ARITY: usize = 4;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turn the planned executor behind [`crate::Jit`] on or off (process-wide;
/// on by default). Off, jitted graphs run through the interpreter
/// ([`Graph::eval`]), as a reference to compare with.
pub fn set_planned_execution(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the planned executor is on.
pub fn planned_execution() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A graph compiled for repeated concrete evaluation.
pub(crate) struct Plan {
    graph: Arc<Graph>,
    steps: Vec<Step>,
    /// Per variable: the index of the last step reading it (`usize::MAX`
    /// for graph outputs, [`NEVER_READ`] for values nothing reads).
    last_step: Vec<usize>,
}

enum Step {
    /// One equation, evaluated by its primitive.
    Eqn {
        eqn: usize,
        /// Operands, each with whether this is its last read (moved in).
        inputs: Vec<(VarId, bool)>,
        label: (String, String),
    },
    /// A fused group of element-wise equations.
    Fused(Box<Fused>),
}

/// Where a fused equation reads an operand.
#[derive(Clone, Copy, Debug)]
enum Operand {
    /// Block `b` of the group's (non-scalar) external input `i`.
    Input(usize),
    /// A block buffer (an earlier equation's result, or a broadcast scalar).
    Buf(usize),
}

struct FusedOp {
    eqn: usize,
    operands: Vec<Operand>,
    dst: usize,
    /// The group output this result is copied to, if it is materialised.
    output: Option<usize>,
}

struct Fused {
    shape: Vec<usize>,
    dtype: DType,
    size: usize,
    /// External non-scalar inputs, read block by block.
    inputs: Vec<VarId>,
    /// External one-element inputs, each broadcast into its block buffer.
    scalars: Vec<(VarId, usize)>,
    ops: Vec<FusedOp>,
    /// Materialised results, in the order of [`FusedOp::output`].
    outputs: Vec<VarId>,
    nbufs: usize,
    label: (String, String),
}

impl Plan {
    /// Plan `g`, or `None` when it cannot be run on its own (it captured
    /// tracers of an enclosing trace).
    pub(crate) fn new(g: Arc<Graph>) -> Option<Plan> {
        if g.captures_tracers() {
            return None;
        }
        let groups = form_groups(&g);
        let mut steps = Vec::new();
        let mut emitted = vec![false; groups.members.len()];
        for (i, e) in g.eqns.iter().enumerate() {
            match groups.of_eqn[i] {
                Some(k) if groups.last_member(k) == i && !emitted[k] => {
                    emitted[k] = true;
                    steps.push(Step::Fused(Box::new(build_fused(&g, &groups.members[k]))));
                }
                Some(_) => {}
                None => steps.push(Step::Eqn {
                    eqn: i,
                    inputs: e.inputs.iter().map(|&v| (v, false)).collect(),
                    label: (
                        e.prim.name(),
                        format!(
                            "{} -> {}",
                            profile::shapes_label(e.inputs.iter().map(|&v| &g.avals[v])),
                            profile::shapes_label(e.outputs.iter().map(|&v| &g.avals[v]))
                        ),
                    ),
                }),
            }
        }
        let mut last_step = vec![NEVER_READ; g.avals.len()];
        for (s, step) in steps.iter().enumerate() {
            for v in step_reads(step) {
                last_step[v] = s;
            }
        }
        for &v in &g.outvars {
            last_step[v] = usize::MAX;
        }
        // Move each operand on its last read (the last occurrence in the
        // equation's operand list of its last reading step).
        for (s, step) in steps.iter_mut().enumerate() {
            if let Step::Eqn { inputs, .. } = step {
                for j in 0..inputs.len() {
                    let v = inputs[j].0;
                    let later = inputs[j + 1..].iter().any(|&(w, _)| w == v);
                    inputs[j].1 = last_step[v] == s && !later;
                }
            }
        }
        Some(Plan {
            graph: g,
            steps,
            last_step,
        })
    }

    /// Whether `args` have exactly the graph's input avals (no allocation).
    pub(crate) fn accepts(&self, args: &[Tensor]) -> bool {
        let g = &self.graph;
        args.len() == g.invars.len()
            && args.iter().zip(&g.invars).all(|(t, &v)| {
                let a = &g.avals[v];
                t.dtype() == a.dtype() && t.shape() == a.shape()
            })
    }

    /// Evaluate on concrete `args` of the graph's input avals.
    pub(crate) fn run(&self, args: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let g = &*self.graph;
        if !self.accepts(&args) {
            return Err(Error::shape(
                "graph evaluation",
                format!(
                    "arguments {} vs traced {}",
                    profile::shapes_label(&crate::ops::avals(&args)),
                    profile::shapes_label(&g.in_avals())
                ),
                "arguments must have the abstract values the graph was traced with",
            ));
        }
        if let Some(t) = args.iter().find(|t| t.is_symbolic()) {
            return Err(Error::EscapedTracer {
                op: "jit".into(),
                trace: t.sym().map(|v| v.trace).unwrap_or(0),
            });
        }
        let prof = profile::enabled();
        let mut env: Vec<Option<Tensor>> = vec![None; g.avals.len()];
        for (&v, x) in g.invars.iter().zip(args) {
            if self.last_step[v] != NEVER_READ {
                env[v] = Some(x);
            }
        }
        for (&v, c) in g.constvars.iter().zip(&g.consts) {
            if self.last_step[v] != NEVER_READ {
                env[v] = Some(c.clone());
            }
        }
        let mut ins = Vec::new();
        for (s, step) in self.steps.iter().enumerate() {
            let t0 = prof.then(Instant::now);
            match step {
                Step::Eqn { eqn, inputs, .. } => {
                    let e = &g.eqns[*eqn];
                    ins.clear();
                    for &(v, last) in inputs {
                        let x = if last { env[v].take() } else { env[v].clone() };
                        ins.push(x.ok_or_else(|| undefined(e.prim.as_ref(), v))?);
                    }
                    let outs = e.prim.eval(&ins)?;
                    ins.clear();
                    if outs.len() != e.outputs.len() {
                        return Err(Error::invalid(
                            e.prim.name(),
                            format!(
                                "eval returned {} value(s) for an equation with {} output(s)",
                                outs.len(),
                                e.outputs.len()
                            ),
                        ));
                    }
                    for (&v, x) in e.outputs.iter().zip(outs) {
                        if self.last_step[v] != NEVER_READ {
                            env[v] = Some(x);
                        }
                    }
                }
                Step::Fused(f) => {
                    let outs = match f.dtype {
                        DType::F32 => run_fused::<f32>(g, f, &env)?,
                        DType::F64 => run_fused::<f64>(g, f, &env)?,
                        d => unreachable!("only float groups are formed, got {d}"),
                    };
                    for (&v, x) in f.outputs.iter().zip(outs) {
                        env[v] = Some(x);
                    }
                    for &v in f.inputs.iter().chain(f.scalars.iter().map(|(v, _)| v)) {
                        if self.last_step[v] == s {
                            env[v] = None;
                        }
                    }
                }
            }
            if let Some(t0) = t0 {
                let (op, shapes) = match step {
                    Step::Eqn { label, .. } => label,
                    Step::Fused(f) => &f.label,
                };
                profile::record(op, shapes, t0.elapsed());
            }
        }
        g.outvars
            .iter()
            .map(|&v| {
                env[v].clone().ok_or_else(|| {
                    Error::invalid(
                        "graph evaluation",
                        format!("output variable {} is never defined", super::var_name(v)),
                    )
                })
            })
            .collect()
    }
}

fn undefined(p: &dyn Primitive, v: VarId) -> Error {
    Error::invalid(
        p.name(),
        format!(
            "operand {} is read before it is defined (the graph is not in SSA order)",
            super::var_name(v)
        ),
    )
}

/// The variables a step reads from the environment.
fn step_reads(step: &Step) -> Vec<VarId> {
    match step {
        Step::Eqn { inputs, .. } => inputs.iter().map(|&(v, _)| v).collect(),
        Step::Fused(f) => f
            .inputs
            .iter()
            .copied()
            .chain(f.scalars.iter().map(|&(v, _)| v))
            .collect(),
    }
}

// ---------------------------------------------------------------- grouping

struct Groups {
    /// The equations of each group, in order.
    members: Vec<Vec<usize>>,
    /// The group of each equation (`None`: not fused).
    of_eqn: Vec<Option<usize>>,
}

impl Groups {
    fn last_member(&self, k: usize) -> usize {
        *self.members[k].last().expect("groups are never empty")
    }
}

/// The element-wise kernel of equation `i` if it can be fused: one float
/// output, at most [`MAX_ARITY`] operands of the output's dtype, each of
/// the output's shape or a single element.
fn fusable(g: &Graph, i: usize) -> Option<&dyn Elementwise> {
    let e = &g.eqns[i];
    let k = e.prim.elementwise()?;
    if e.outputs.len() != 1 || e.inputs.len() != k.arity() || e.inputs.len() > MAX_ARITY {
        return None;
    }
    let out = &g.avals[e.outputs[0]];
    if !matches!(out.dtype(), DType::F32 | DType::F64) {
        return None;
    }
    let ok = e.inputs.iter().all(|&v| {
        let a = &g.avals[v];
        a.dtype() == out.dtype() && (a.shape() == out.shape() || a.size() == 1)
    });
    ok.then_some(k)
}

fn form_groups(g: &Graph) -> Groups {
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut of_eqn = vec![None; g.eqns.len()];
    let mut of_var: Vec<Option<usize>> = vec![None; g.avals.len()];
    // The open group of each (shape, dtype): the one new equations join.
    let mut open: HashMap<Aval, usize> = HashMap::new();
    let mut closed = Vec::new();
    for (i, e) in g.eqns.iter().enumerate() {
        let mine = if fusable(g, i).is_some() {
            let key = g.avals[e.outputs[0]].clone();
            let k = match open.get(&key) {
                Some(&k) => k,
                None => {
                    members.push(Vec::new());
                    closed.push(false);
                    open.insert(key, members.len() - 1);
                    members.len() - 1
                }
            };
            Some(k)
        } else {
            None
        };
        // A group whose value is read from outside runs before the reader:
        // it can grow no further.
        for &v in &e.inputs {
            if let Some(k) = of_var[v] {
                if Some(k) != mine && !closed[k] {
                    closed[k] = true;
                    open.retain(|_, &mut o| o != k);
                }
            }
        }
        if let Some(k) = mine {
            members[k].push(i);
            of_eqn[i] = Some(k);
            of_var[e.outputs[0]] = Some(k);
        }
    }
    Groups { members, of_eqn }
}

/// Lay out one group: operand sources, block buffers (reused once a value
/// is dead within the group) and the values to materialise.
fn build_fused(g: &Graph, members: &[usize]) -> Fused {
    let out_aval = &g.avals[g.eqns[members[0]].outputs[0]];
    let in_group: HashMap<VarId, usize> = members
        .iter()
        .enumerate()
        .map(|(j, &i)| (g.eqns[i].outputs[0], j))
        .collect();
    // A result is materialised when anything outside the group reads it.
    let member_set: std::collections::HashSet<usize> = members.iter().copied().collect();
    let mut read_outside = vec![false; g.avals.len()];
    for (i, e) in g.eqns.iter().enumerate() {
        if !member_set.contains(&i) {
            for &v in &e.inputs {
                read_outside[v] = true;
            }
        }
    }
    for &v in &g.outvars {
        read_outside[v] = true;
    }
    // Last use (position in the group) of each value read inside it.
    let mut last_in_group: HashMap<VarId, usize> = HashMap::new();
    for (j, &i) in members.iter().enumerate() {
        for &v in &g.eqns[i].inputs {
            last_in_group.insert(v, j);
        }
    }
    let mut inputs: Vec<VarId> = Vec::new();
    // Broadcast scalars first: their buffers are filled once and live for
    // the whole group, so no result may ever be written into them.
    let mut scalars: Vec<(VarId, usize)> = Vec::new();
    for &i in members {
        for &v in &g.eqns[i].inputs {
            let external = !in_group.contains_key(&v);
            if external
                && g.avals[v].shape() != out_aval.shape()
                && !scalars.iter().any(|&(w, _)| w == v)
            {
                scalars.push((v, scalars.len()));
            }
        }
    }
    let mut buf_of: HashMap<VarId, usize> = HashMap::new();
    let mut free: Vec<usize> = Vec::new();
    let mut nbufs = scalars.len();
    let mut alloc = |free: &mut Vec<usize>| {
        free.pop().unwrap_or_else(|| {
            nbufs += 1;
            nbufs - 1
        })
    };
    let mut ops = Vec::new();
    let mut outputs = Vec::new();
    let mut names = Vec::new();
    for (j, &i) in members.iter().enumerate() {
        let e = &g.eqns[i];
        names.push(e.prim.name());
        let mut operands = Vec::new();
        for &v in &e.inputs {
            let op = if in_group.contains_key(&v) {
                Operand::Buf(buf_of[&v])
            } else if g.avals[v].shape() == out_aval.shape() {
                let k = inputs.iter().position(|&w| w == v).unwrap_or_else(|| {
                    inputs.push(v);
                    inputs.len() - 1
                });
                Operand::Input(k)
            } else {
                let &(_, b) = scalars
                    .iter()
                    .find(|&&(w, _)| w == v)
                    .expect("scalars collected above");
                Operand::Buf(b)
            };
            operands.push(op);
        }
        let out = e.outputs[0];
        let dst = alloc(&mut free);
        buf_of.insert(out, dst);
        let output = read_outside[out].then(|| {
            outputs.push(out);
            outputs.len() - 1
        });
        ops.push(FusedOp {
            eqn: i,
            operands,
            dst,
            output,
        });
        // Free the buffers of group values read for the last time here
        // (after `dst` is taken: a kernel never writes into its operand).
        let mut dead: Vec<VarId> = e
            .inputs
            .iter()
            .copied()
            .filter(|v| in_group.contains_key(v) && last_in_group.get(v) == Some(&j))
            .collect();
        if !last_in_group.contains_key(&out) {
            dead.push(out);
        }
        dead.sort_unstable();
        dead.dedup();
        for v in dead {
            free.push(buf_of[&v]);
        }
    }
    let label = (format!("fused[{}]", names.join(",")), out_aval.to_string());
    Fused {
        shape: out_aval.shape().to_vec(),
        dtype: out_aval.dtype(),
        size: out_aval.size(),
        inputs,
        scalars,
        ops,
        outputs,
        nbufs,
        label,
    }
}

// ---------------------------------------------------------------- fused loop

/// The float types a fused loop runs on.
trait FusedFloat: Float + 'static {
    fn array(d: &ArrayData) -> Option<&ArrayD<Self>>;
    fn block(k: &dyn Elementwise, ins: &[&[Self]], out: &mut [Self]);
    fn wrap(a: ArrayD<Self>) -> Tensor;
}

impl FusedFloat for f32 {
    fn array(d: &ArrayData) -> Option<&ArrayD<f32>> {
        match d {
            ArrayData::F32(a) => Some(a),
            _ => None,
        }
    }
    fn block(k: &dyn Elementwise, ins: &[&[f32]], out: &mut [f32]) {
        k.block_f32(ins, out)
    }
    fn wrap(a: ArrayD<f32>) -> Tensor {
        Tensor::from_data(ArrayData::F32(a))
    }
}

impl FusedFloat for f64 {
    fn array(d: &ArrayData) -> Option<&ArrayD<f64>> {
        match d {
            ArrayData::F64(a) => Some(a),
            _ => None,
        }
    }
    fn block(k: &dyn Elementwise, ins: &[&[f64]], out: &mut [f64]) {
        k.block_f64(ins, out)
    }
    fn wrap(a: ArrayD<f64>) -> Tensor {
        Tensor::from_data(ArrayData::F64(a))
    }
}

/// The memory order a fused loop walks its operands and writes its results
/// in. Element-wise results do not depend on it; what matters is that no
/// operand needs a strided walk (`concatenate` along the last axis, for
/// one, yields column-major arrays).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Row-major (standard layout).
    C,
    /// Column-major.
    F,
}

/// The order `a` is contiguous in (row-major preferred), if any.
fn order_of<T>(a: &ArrayD<T>) -> Option<Order> {
    if a.is_standard_layout() {
        Some(Order::C)
    } else if a.view().reversed_axes().is_standard_layout() {
        Some(Order::F)
    } else {
        None
    }
}

/// The array behind `v`, checked against what the plan expects (an error,
/// not a wrong result, if a primitive's eval disagrees with its shape rule).
fn operand<'a, T: FusedFloat>(
    g: &Graph,
    env: &'a [Option<Tensor>],
    v: VarId,
    want: &[usize],
) -> Result<&'a ArrayD<T>> {
    let mismatch = |got: String| {
        Error::invalid(
            "fused element-wise loop",
            format!(
                "operand {} is {got}, but the graph says {}",
                super::var_name(v),
                g.avals[v]
            ),
        )
    };
    let t = env[v]
        .as_ref()
        .ok_or_else(|| mismatch("undefined".into()))?;
    let a = T::array(t.data_for("fused element-wise loop")?)
        .ok_or_else(|| mismatch(t.aval().to_string()))?;
    if a.shape() != want {
        return Err(mismatch(t.aval().to_string()));
    }
    Ok(a)
}

/// The elements of `a` in `order`: borrowed when `a` is contiguous in that
/// order, copied otherwise.
fn elements<T: Copy>(a: &ArrayD<T>, order: Order) -> Cow<'_, [T]> {
    if order_of(a) == Some(order) || a.len() <= 1 {
        if let Some(s) = a.as_slice_memory_order() {
            return Cow::Borrowed(s);
        }
    }
    // A 2-D array contiguous in the other order: a blocked transpose.
    if a.ndim() == 2 {
        if let Some(s) = a.as_slice_memory_order() {
            let (r, c) = (a.shape()[0], a.shape()[1]);
            // Column-major r x c is row-major c x r, and vice versa.
            return Cow::Owned(match order {
                Order::C => transpose2(s, c, r),
                Order::F => transpose2(s, r, c),
            });
        }
    }
    Cow::Owned(match order {
        Order::C => row_major(&a.view()),
        Order::F => row_major(&a.view().reversed_axes()),
    })
}

/// The row-major `cols x rows` transpose of the row-major `rows x cols`
/// matrix `src`, in tiles that stay in cache.
fn transpose2<T: Copy>(src: &[T], rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 16;
    let mut out = src.to_vec();
    for i0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            for i in i0..(i0 + TILE).min(rows) {
                for j in j0..(j0 + TILE).min(cols) {
                    out[j * rows + i] = src[i * cols + j];
                }
            }
        }
    }
    out
}

/// The elements of any view in row-major order; iterated with a fixed rank
/// where it can (`IxDyn` iteration is several times slower).
fn row_major<T: Copy>(a: &ndarray::ArrayViewD<T>) -> Vec<T> {
    macro_rules! fixed {
        ($d:ty) => {
            match a.view().into_dimensionality::<$d>() {
                Ok(v) => v.iter().copied().collect(),
                Err(_) => a.iter().copied().collect(),
            }
        };
    }
    match a.ndim() {
        1 => fixed!(ndarray::Ix1),
        2 => fixed!(ndarray::Ix2),
        3 => fixed!(ndarray::Ix3),
        4 => fixed!(ndarray::Ix4),
        _ => a.iter().copied().collect(),
    }
}

fn run_fused<T: FusedFloat>(g: &Graph, f: &Fused, env: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let arrays: Vec<&ArrayD<T>> = f
        .inputs
        .iter()
        .map(|&v| operand(g, env, v, &f.shape))
        .collect::<Result<_>>()?;
    // Walk memory in the order most operands are stored in. Ties go to
    // column-major: a recurrent update `h' = a h + x` with a column-major
    // `x` then makes `h'` column-major, and the next step copies nothing.
    let n_f = arrays
        .iter()
        .filter(|a| order_of(a) == Some(Order::F))
        .count();
    let order = if n_f > 0 && 2 * n_f >= arrays.len() {
        Order::F
    } else {
        Order::C
    };
    let inputs: Vec<Cow<[T]>> = arrays.iter().map(|a| elements(a, order)).collect();
    let kernels: Vec<&dyn Elementwise> = f
        .ops
        .iter()
        .map(|op| {
            g.eqns[op.eqn]
                .prim
                .elementwise()
                .expect("only element-wise equations are fused")
        })
        .collect();
    let block = BLOCK.min(f.size.max(1));
    let mut bufs: Vec<Vec<T>> = vec![vec![T::zero(); block]; f.nbufs];
    for &(v, b) in &f.scalars {
        let s = operand::<T>(g, env, v, g.avals[v].shape())?;
        bufs[b].fill(*s.iter().next().expect("a scalar operand has one element"));
    }
    let mut outs: Vec<Vec<T>> = f
        .outputs
        .iter()
        .map(|_| Vec::with_capacity(f.size))
        .collect();
    let mut start = 0;
    while start < f.size {
        let len = block.min(f.size - start);
        for (op, k) in f.ops.iter().zip(&kernels) {
            let mut dst = std::mem::take(&mut bufs[op.dst]);
            {
                let mut ins: [&[T]; MAX_ARITY] = [&[]; MAX_ARITY];
                for (slot, o) in ins.iter_mut().zip(&op.operands) {
                    *slot = match *o {
                        Operand::Input(i) => &inputs[i][start..start + len],
                        Operand::Buf(b) => &bufs[b][..len],
                    };
                }
                T::block(*k, &ins[..op.operands.len()], &mut dst[..len]);
            }
            if let Some(o) = op.output {
                outs[o].extend_from_slice(&dst[..len]);
            }
            bufs[op.dst] = dst;
        }
        start += len;
    }
    outs.into_iter()
        .map(|v| {
            ArrayD::from_shape_vec(IxDyn(&f.shape).set_f(order == Order::F), v)
                .map(T::wrap)
                .map_err(|e| Error::invalid("fused element-wise loop", e.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{trace, LinearArg};
    use crate::ops::elementwise::binary;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::tensor::Tensor;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::any::Any;

    fn rand_tensor(rng: &mut StdRng, shape: &[usize], dtype: DType) -> Tensor {
        let n = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.random_range(-1.5..1.5)).collect();
        Tensor::from_vec(v, shape).unwrap().cast(dtype).unwrap()
    }

    /// Exactly equal values and shapes (NaN equal to NaN).
    fn assert_same(a: &[Tensor], b: &[Tensor], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: output count");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.aval(), y.aval(), "{what}: output {i}");
            let (xv, yv) = (x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
            for (p, q) in xv.iter().zip(&yv) {
                assert!(
                    p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                    "{what}: output {i}: planned {p} vs interpreted {q}"
                );
            }
        }
    }

    /// Plan `g` and check it against the interpreter on `args`.
    fn check(g: Graph, args: &[Tensor], what: &str) -> Plan {
        let g = Arc::new(g);
        let want = g.eval(args).unwrap();
        let plan = Plan::new(g.clone()).expect("a graph without tracers is planned");
        let got = plan.run(args.to_vec()).unwrap();
        assert_same(&got, &want, what);
        // Twice: nothing of the first run leaks into the second.
        let got = plan.run(args.to_vec()).unwrap();
        assert_same(&got, &want, what);
        plan
    }

    fn fused_groups(p: &Plan) -> Vec<usize> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Fused(f) => Some(f.ops.len()),
                Step::Eqn { .. } => None,
            })
            .collect()
    }

    /// One random program over a pool of values: element-wise ops (some
    /// with a 0-d operand), matmuls, transposes (non-contiguous values),
    /// sums, a captured constant; random outputs, inputs among them.
    fn random_program(seed: u64, dtype: DType) -> (Graph, Vec<Tensor>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let shape = [3usize, 5];
        let n_in = rng.random_range(1..4);
        let mut avals: Vec<Aval> = (0..n_in).map(|_| Aval::new(&shape, dtype)).collect();
        avals.push(Aval::new(&[], dtype));
        avals.push(Aval::new(&[5, 5], dtype));
        let args: Vec<Tensor> = avals
            .iter()
            .map(|a| rand_tensor(&mut rng, a.shape(), dtype))
            .collect();
        let konst = rand_tensor(&mut rng, &shape, dtype);
        let n_ops = rng.random_range(1..30);
        let choices: Vec<(usize, usize, usize, f64)> = (0..n_ops)
            .map(|_| {
                (
                    rng.random_range(0..14),
                    rng.random_range(0..1000),
                    rng.random_range(0..1000),
                    rng.random_range(-2.0..2.0),
                )
            })
            .collect();
        let n_out = rng.random_range(1..5);
        let outs: Vec<usize> = (0..n_out).map(|_| rng.random_range(0..1000)).collect();
        let g = trace(
            |a: &[Tensor]| {
                let mut pool: Vec<Tensor> = a[..n_in].to_vec();
                let (s, w) = (&a[n_in], &a[n_in + 1]);
                for &(op, i, j, c) in &choices {
                    let x = pool[i % pool.len()].clone();
                    let y = pool[j % pool.len()].clone();
                    let z = match op {
                        0 => x.add(&y)?,
                        1 => x.mul(&y)?,
                        2 => x.sub(&y)?,
                        3 => x.div(&y.square()?.add_scalar(1.0)?)?,
                        4 => x.tanh()?,
                        5 => x.sigmoid()?.mul_scalar(c)?,
                        6 => x.exp()?.rsub_scalar(c)?,
                        7 => binary(BinaryOp::Mul, &x, s)?,
                        8 => binary(BinaryOp::Sub, s, &x)?,
                        9 => x.matmul(w)?,
                        // A transposed (non-contiguous) value, back to shape.
                        10 => x.matmul(w)?.t()?.t()?.add(&y)?,
                        11 => x
                            .sum(&[1])?
                            .reshape(&[3, 1])?
                            .broadcast_to(&shape)?
                            .mul(&y)?,
                        12 => x.mul(&konst)?,
                        _ => crate::ops::elementwise::unary(UnaryOp::Sin, &x)?.mul(&x)?,
                    };
                    pool.push(z);
                }
                Ok(outs.iter().map(|&k| pool[k % pool.len()].clone()).collect())
            },
            &avals,
        )
        .unwrap();
        (g, args)
    }

    #[test]
    fn plan_matches_interpreter_on_random_graphs() {
        let mut fused = 0;
        for seed in 0..300 {
            for dtype in [DType::F64, DType::F32] {
                let (g, args) = random_program(seed, dtype);
                let p = check(g, &args, &format!("seed {seed} {dtype}"));
                fused += fused_groups(&p).iter().filter(|&&n| n > 1).count();
            }
        }
        assert!(
            fused > 100,
            "only {fused} groups of several equations fused"
        );
    }

    #[test]
    fn plan_fuses_a_chain_into_one_loop() {
        let a = Aval::new(&[2, 300], DType::F64);
        let g = trace(
            |x: &[Tensor]| {
                let h = x[0].mul(&x[1])?.tanh()?.add_scalar(1.0)?;
                Ok(vec![h.sigmoid()?.mul(&x[0])?])
            },
            &[a.clone(), a],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let args = vec![
            rand_tensor(&mut rng, &[2, 300], DType::F64),
            rand_tensor(&mut rng, &[2, 300], DType::F64),
        ];
        let p = check(g, &args, "chain");
        assert_eq!(fused_groups(&p), vec![5]);
        // Only the result is materialised; the chain runs in block buffers,
        // reused once dead (two are enough for a chain).
        let Step::Fused(f) = &p.steps[0] else {
            panic!("fused step expected")
        };
        assert_eq!(f.outputs.len(), 1);
        assert!(f.nbufs <= 3, "{} block buffers", f.nbufs);
    }

    #[test]
    fn plan_materialises_values_read_outside_the_group() {
        let a = Aval::new(&[4, 4], DType::F64);
        let g = trace(
            |x: &[Tensor]| {
                let h = x[0].tanh()?;
                let m = h.matmul(&x[0])?; // reads h: the group closes
                let k = h.mul(&m)?.exp()?;
                Ok(vec![k, h])
            },
            &[a],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(2);
        let p = check(g, &[rand_tensor(&mut rng, &[4, 4], DType::F64)], "closed");
        assert_eq!(fused_groups(&p), vec![1, 2]);
    }

    #[test]
    fn plan_repeated_operands_and_inputs_as_outputs() {
        let a = Aval::new(&[3], DType::F64);
        let g = trace(
            |x: &[Tensor]| {
                let y = x[0].mul(&x[0])?.add(&x[0])?;
                Ok(vec![x[0].clone(), y.clone(), y, x[1].clone()])
            },
            &[a.clone(), a],
        )
        .unwrap();
        let args = vec![
            Tensor::from_vec(vec![1.0, -2.0, 3.0], &[3]).unwrap(),
            Tensor::from_vec(vec![4.0, 5.0, 6.0], &[3]).unwrap(),
        ];
        let p = check(g, &args, "repeated");
        let out = p.run(args.clone()).unwrap();
        assert_eq!(out[1].to_vec_f64().unwrap(), vec![2.0, 2.0, 12.0]);
        assert!(out[0].ptr_eq(&args[0]) && out[3].ptr_eq(&args[1]));
    }

    #[test]
    fn plan_scalar_operands_broadcast() {
        let g = trace(
            |x: &[Tensor]| {
                let y = binary(BinaryOp::Mul, &x[0], &x[1])?;
                Ok(vec![binary(BinaryOp::Sub, &x[1], &y)?.exp()?])
            },
            &[Aval::new(&[600], DType::F64), Aval::new(&[], DType::F64)],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let x = rand_tensor(&mut rng, &[600], DType::F64);
        let p = check(g, &[x.clone(), Tensor::scalar(0.5)], "scalar");
        assert_eq!(fused_groups(&p), vec![3]);
        // Against an explicit loop.
        let got = p.run(vec![x.clone(), Tensor::scalar(0.5)]).unwrap();
        let want: Vec<f64> = x
            .to_vec_f64()
            .unwrap()
            .iter()
            .map(|v| (0.5 - v * 0.5).exp())
            .collect();
        assert_eq!(got[0].to_vec_f64().unwrap(), want);
    }

    #[test]
    fn plan_non_contiguous_and_column_major_operands() {
        use ndarray::{s, Array};
        let mut rng = StdRng::seed_from_u64(5);
        let mut arr = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            Array::from_shape_vec(IxDyn(shape), v).unwrap()
        };
        // Column-major 2-D and 3-D, strided (neither order), row-major.
        let f2 = Tensor::from_array(arr(&[40, 30]).reversed_axes());
        let f3 = Tensor::from_array(arr(&[5, 4, 3]).reversed_axes());
        let strided = Tensor::from_array(arr(&[30, 80]).slice_move(s![.., ..;2]).into_dyn());
        let c2 = Tensor::from_array(arr(&[30, 40]));
        let c3 = Tensor::from_array(arr(&[3, 4, 5]));
        let column_major = |t: &Tensor| match t.data().unwrap() {
            ArrayData::F64(a) => !a.is_standard_layout(),
            _ => false,
        };
        assert!(column_major(&f2) && column_major(&f3) && column_major(&strided));
        let args = vec![f2, strided, c2, f3, c3];
        let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let g = trace(
            |x: &[Tensor]| {
                let a = x[0].mul(&x[1])?.add(&x[2])?.tanh()?; // F, strided, C
                let b = x[0].mul_scalar(0.5)?.add(&x[0])?; // all F: stays F
                let c = x[3].sigmoid()?.mul(&x[4])?; // 3-D F with C
                let d = x[3].exp()?; // 3-D all F
                Ok(vec![a, b.clone(), c, d, b.matmul(&x[2].t()?)?])
            },
            &avals,
        )
        .unwrap();
        check(g, &args, "layouts");
    }

    /// A two-output primitive: `(x + 1, 2 x)`.
    #[derive(Clone, Debug)]
    struct Split;

    impl Primitive for Split {
        fn name(&self) -> String {
            "split_test".into()
        }
        fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
            Ok(vec![inputs[0].clone(), inputs[0].clone()])
        }
        fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
            Ok(vec![inputs[0].add_scalar(1.0)?, inputs[0].mul_scalar(2.0)?])
        }
        fn jvp(
            &self,
            _p: &[Tensor],
            _t: &[Option<Tensor>],
        ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
            unimplemented!("not needed by the test")
        }
        fn transpose(
            &self,
            _cts: &[Option<Tensor>],
            _args: &[LinearArg],
        ) -> Result<Vec<Option<Tensor>>> {
            unimplemented!("not needed by the test")
        }
        fn batch(
            &self,
            _args: &[Tensor],
            _batched: &[bool],
            _size: usize,
        ) -> Result<(Vec<Tensor>, Vec<bool>)> {
            unimplemented!("not needed by the test")
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn plan_multi_output_equations() {
        let g = trace(
            |x: &[Tensor]| {
                let h = x[0].tanh()?;
                let o = crate::graph::bind(Arc::new(Split), std::slice::from_ref(&h))?;
                Ok(vec![o[1].mul(&h)?.add(&o[0])?, o[0].clone()])
            },
            &[Aval::new(&[2, 3], DType::F64)],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(4);
        check(g, &[rand_tensor(&mut rng, &[2, 3], DType::F64)], "split");
    }

    #[test]
    fn plan_rejects_other_avals_and_symbolic_arguments() {
        let g = trace(
            |x: &[Tensor]| Ok(vec![x[0].exp()?]),
            &[Aval::new(&[2], DType::F64)],
        )
        .unwrap();
        let p = Plan::new(Arc::new(g)).unwrap();
        let e = p.run(vec![Tensor::zeros(&[3], DType::F64)]).unwrap_err();
        assert!(e.to_string().contains("traced"), "{e}");
        let e = p.run(vec![Tensor::zeros(&[2], DType::F32)]).unwrap_err();
        assert!(e.to_string().contains("traced"), "{e}");
        let sym = Tensor::symbolic(7, 0, Aval::new(&[2], DType::F64));
        assert!(matches!(
            p.run(vec![sym]).unwrap_err(),
            Error::EscapedTracer { .. }
        ));
    }

    #[test]
    fn plan_is_used_by_jit_and_can_be_turned_off() {
        let f = crate::transform::Jit::new(|a: &[Tensor]| {
            Ok(vec![a[0].sin()?.mul(&a[0])?.add_scalar(0.25)?])
        });
        let x = Tensor::from_vec(vec![0.5, -1.0, 2.0], &[3]).unwrap();
        let planned = f.call(std::slice::from_ref(&x)).unwrap();
        set_planned_execution(false);
        let interpreted = f.call(std::slice::from_ref(&x));
        set_planned_execution(true);
        assert_same(&planned, &interpreted.unwrap(), "jit");
        let want: Vec<f64> = [0.5f64, -1.0, 2.0]
            .iter()
            .map(|v| v.sin() * v + 0.25)
            .collect();
        assert_eq!(planned[0].to_vec_f64().unwrap(), want);
        assert_eq!(f.trace_count(), 1);
    }
}
