//! The planned executor: a [`Graph`] compiled once into a list of steps that
//! run on concrete tensors without the interpreter's per-call work. Operand
//! slots and last uses are resolved when the plan is built; no shape
//! inference, tracing check or [`crate::graph::bind`] happens at run time; and
//! chains of element-wise equations of one shape are fused into one loop
//! over blocks of the output, each equation applied to the block in a small
//! set of block buffers (the data stays in L1, one dispatch per block
//! instead of one pass over memory per equation, no intermediate tensors).
//!
//! A fused group is a set of element-wise equations (see
//! [`Primitive::elementwise`]) with one output shape and float dtype
//! whose operands have that shape or a single element (broadcast). It runs
//! where its last equation stood: an equation joins the open group of its
//! shape, and a group closes as soon as an equation outside it reads one of
//! its values, so every reader outside runs after it. Values read outside
//! the group (or returned by the graph) are materialised: the loop writes
//! them straight into their output buffers; the others live only in block
//! buffers. A `mul` or `mul_scalar` whose result only an `add` of the group
//! reads is folded into that add (`a·b + c` in one pass over the block,
mod blocks;
mod broadcast;
mod buffer;
#[cfg(feature = "codegen")]
mod codegen;
#[cfg(not(feature = "codegen"))]
#[path = "codegen_off.rs"]
mod codegen;
mod fusion;
mod pool;
mod run;
mod select;
mod sums;
mod unit_axes;

use crate::error::{Error, Result};
use crate::graph::{profile, Elementwise, Graph, Planned, Primitive, VarId, NEVER_READ};
use crate::kernels::broadcast::concat_rows_into;
use crate::kernels::reduce::sum_all;
use crate::kernels::sgemm;
use crate::kernels::spare::recast;
use crate::ops::elementwise::{
    binary_block, mul_add_block, scalar_block, scale_add_block, unary_block, unary_block_f32,
    BinaryOp, ScalarOp, UnaryOp,
};
use crate::ops::{surrogate_block, Surrogate};
use crate::tensor::{
    copy_blocks, row_major as row_major_of, same_shape, standard_layout, ArrayData, ArrayElement,
    Aval, DType, Repr, Tensor,
};
use blocks::*;
use broadcast::*;
#[cfg(feature = "codegen")]
use buffer::run_compiled;
use buffer::{contiguous, contiguous_mut};
#[cfg(not(feature = "codegen"))]
use codegen::run_compiled;
use fusion::*;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayD, ArrayViewD, Ix2, IxDyn, LinalgScalar};
use num_traits::Float;
use pool::*;
use select::*;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Instant;
use sums::*;
use unit_axes::*;

/// Elements per block of a fused loop: 1024 `f32`s are 4 KiB, so a
/// group's block buffers stay in L1 or L2, and each op's call covers 128
/// AVX2 vectors (with 256, a 29-op group called its ops 928 times per
/// `64 × 128` step, and its time per step was 25–35% higher; pp_prop steps
/// measured up to 1.5× faster with 1024, none slower beyond the noise).
const BLOCK: usize = 1024;
/// Most operands an element-wise equation may have to be fused.
const MAX_ARITY: usize = 4;
/// Largest 2-D matrix product (elements of the result) written into a
/// recycled buffer; larger ones go through `eval` (a fresh allocation). On
/// the GRU pp_prop benchmark (a loaded machine) the recycled output paid
/// for `[144, 128]` but cost 3-7 % for `[528, 512]` (1 MiB; cause unknown).
const MAX_PLANNED_MATMUL: usize = 1 << 16;
/// How many calls the pool keeps a handle to a value it returned, waiting
/// for the caller to drop theirs (a state passed back as an argument is
/// still held by the caller during the next call).
const KEEP_CALLS: u8 = 2;

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
    /// Per variable: its buffer class (dtype and element count of values
    /// the plan writes itself), if it has one; a dead value of a class is
    /// recycled.
    class_of: Vec<Option<usize>>,
    /// Per graph output: whether it is the last occurrence of its variable
    /// in the outputs (moved out of the environment, not cloned).
    out_moves: Vec<bool>,
    /// Per buffer class, how many values of it one call writes.
    caps: Vec<usize>,
    pool: Mutex<Pool>,
}

enum Step {
    /// One equation.
    Eqn {
        eqn: usize,
        /// Operands, each with whether this is its last read (moved in).
        inputs: Vec<(VarId, bool)>,
        kernel: Kernel,
        label: (String, String),
    },
    /// A fused group of element-wise equations.
    Fused(Box<Fused>),
}

/// How a planned equation is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// By its primitive's `eval` (a fresh result).
    Eval,
    /// A 2-D `f32`/`f64` matrix product into a recycled buffer; `panels`,
    /// when its right operand is a program input or constant, is the slot
    /// of [`Pool::panels`] where the [`sgemm`] panels of that operand (a
    /// weight) are kept from call to call. `transposed`: the step reads the
    /// weight `w` of an elided `transpose(w)` (see [`elided_transposes`])
    /// and multiplies by `wᵀ`.
    Matmul {
        panels: Option<usize>,
        transposed: bool,
    },
    /// An `f32`/`f64` reshape: the operand's own buffer when it is moved
    /// in, unique and row-major; else a copy into a recycled buffer.
    Reshape,
    /// An `f32`/`f64` transpose (strides permuted): the operand's own
    /// buffer when it is moved in and unique; else a copy of a row-major
    /// operand into a recycled buffer; else `eval`.
    Transpose,
    /// An `f32`/`f64` concatenation along `axis` into a recycled buffer
    /// (row-major, as `eval` lays it out).
    Concat { axis: usize },
    /// An `f32`/`f64` sum over every axis longer than 1 (one value, a
    /// loss's sum) into a recycled buffer, in `eval`'s order.
    SumAll,
}

/// Where a fused equation reads an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// Block `b` of the group's (non-scalar) external input `i`.
    Input(usize),
    /// A block buffer (an earlier equation's result, or a broadcast scalar).
    Buf(usize),
    /// Block `b` of a materialised result (output `o` of the group).
    Out(usize),
}

struct FusedOp {
    eqn: usize,
    kind: OpKind,
    operands: Vec<Operand>,
    /// Where the result goes: a block buffer, or a materialised output
    /// ([`Operand::Buf`] or [`Operand::Out`]).
    dst: Operand,
    /// The sum of [`Fused::sums`] the result (in a block buffer) is added
    /// into, block by block.
    sum: Option<usize>,
}

/// What a fused op runs on a block.
#[derive(Clone, Copy, Debug, PartialEq)]
enum OpKind {
    /// The equation's own element-wise kernel, through its
    /// [`Elementwise`] (a primitive other than the core ones below).
    Eqn,
    /// The core unary, binary and scalar ops' block kernels, called
    /// directly: the same kernels their [`Elementwise`] calls, without the
    /// two dynamic calls per block.
    Unary(UnaryOp),
    Binary(BinaryOp),
    Scalar(ScalarOp, f64),
    /// Operands `[a, b, c]`: `a·b + c`, a `mul` whose only reader is the
    /// `add` (the equation) folded into it.
    MulAdd,
    /// Operands `[a, c]`: `a·s + c`, a `mul_scalar` by `s` whose only
    /// reader is the `add` folded into it.
    ScaleAdd(f64),
    /// A spike's surrogate derivative
    /// ([`SurrogateGrad`](crate::ops::SurrogateGrad)), called directly as
    /// the core ops are. (A `spike` itself is [`UnaryOp::Step`]: its kernel
    /// is that op's.)
    Surrogate(Surrogate),
}

struct Fused {
    /// Equations of the group (a folded pair counts two; the tests read it).
    #[cfg_attr(not(test), allow(dead_code))]
    members: usize,
    shape: Vec<usize>,
    dtype: DType,
    size: usize,
    /// External non-scalar inputs, read block by block.
    inputs: Vec<VarId>,
    /// External one-element inputs, each broadcast into its block buffer.
    scalars: Vec<(VarId, usize)>,
    /// External inputs of a trailing part of the loop's shape (a bias
    /// row), each broadcast into its block buffer block by block.
    rows: Vec<(VarId, usize)>,
    /// Per row operand, how it spreads over the loop when it is broadcast
    /// along inner axes too ([`broadcast`]); `None` for a trailing part
    /// of the loop's shape.
    spreads: Vec<Option<Spread>>,
    ops: Vec<FusedOp>,
    /// Materialised results, in the order of [`Operand::Out`].
    outputs: Vec<VarId>,
    /// Sums over leading axes the loop takes of its results ([`sums`]).
    sums: Vec<SumOut>,
    nbufs: usize,
    label: (String, String),
    /// The group's loop compiled when it was planned, if the generator
    /// compiled it (see [`codegen`]): it runs in place of the ops, block
    /// by block.
    compiled: Option<codegen::Kernel>,
    /// Its constants in the group's dtype ([`codegen::constants`]).
    constants_f32: Vec<f32>,
    constants_f64: Vec<f64>,
}

#[cfg(test)]
thread_local! {
    /// Whether this thread's fused loops run the compiled groups (on; the
    /// tests compare with off).
    static COMPILED_ON: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Whether fused loops run their compiled groups (always, but in the test
/// that compares them with the op-by-op loops).
fn compiled_on() -> bool {
    #[cfg(test)]
    return COMPILED_ON.with(|c| c.get());
    #[cfg(not(test))]
    true
}

impl Plan {
    /// Plan `g`, or `None` when it cannot be run on its own (it captured
    /// tracers of an enclosing trace).
    pub(crate) fn new(g: Arc<Graph>) -> Option<Plan> {
        if g.captures_tracers() {
            return None;
        }
        let groups = form_groups(&g);
        let (elided, weight_t) = elided_transposes(&g);
        let (reshaped, alias) = aliased_reshapes(&g, &groups);
        let (sum_of, summed) = leading_sums(&g, &groups);
        let mut steps = Vec::new();
        let mut panel_slots = 0;
        let mut emitted = vec![false; groups.members.len()];
        for (i, e) in g.eqns.iter().enumerate() {
            if elided.contains(&i) || reshaped.contains(&i) || summed.contains(&i) {
                continue;
            }
            match groups.of_eqn[i] {
                Some(k) if groups.last_member(k) == i && !emitted[k] => {
                    emitted[k] = true;
                    let f = build_fused(&g, &groups.members[k], &alias, &sum_of);
                    steps.push(Step::Fused(Box::new(f)));
                }
                Some(_) => {}
                None => {
                    let (inputs, kernel) = match weight_t.get(&i) {
                        Some(&w) => {
                            let kernel = Kernel::Matmul {
                                panels: Some(next_slot(&mut panel_slots)),
                                transposed: true,
                            };
                            (vec![(e.inputs[0], false), (w, false)], kernel)
                        }
                        None => (
                            e.inputs.iter().map(|&v| (v, false)).collect(),
                            kernel_of(&g, i, &mut panel_slots),
                        ),
                    };
                    steps.push(Step::Eqn {
                        eqn: i,
                        inputs,
                        kernel,
                        label: (
                            e.prim.name(),
                            format!(
                                "{} -> {}",
                                profile::shapes_label(e.inputs.iter().map(|&v| &g.avals[v])),
                                profile::shapes_label(e.outputs.iter().map(|&v| &g.avals[v]))
                            ),
                        ),
                    });
                }
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
        // Buffer classes: the (dtype, size) of every value a step writes
        // into a recycled buffer; any float value of a class is recycled.
        let mut classes: HashMap<(DType, usize), usize> = HashMap::new();
        let mut caps: Vec<usize> = Vec::new();
        for step in &steps {
            let written: Vec<VarId> = match step {
                Step::Fused(f) => f
                    .outputs
                    .iter()
                    .copied()
                    .chain(f.sums.iter().map(|s| s.var))
                    .collect(),
                Step::Eqn { kernel, eqn, .. } if *kernel != Kernel::Eval => {
                    g.eqns[*eqn].outputs.clone()
                }
                Step::Eqn { .. } => Vec::new(),
            };
            for v in written {
                let a = &g.avals[v];
                let n = classes.len();
                let c = *classes.entry((a.dtype(), a.size())).or_insert(n);
                if c == caps.len() {
                    caps.push(0);
                }
                caps[c] += 1;
            }
        }
        let class_of = g
            .avals
            .iter()
            .map(|a| classes.get(&(a.dtype(), a.size())).copied())
            .collect();
        let out_moves = (0..g.outvars.len())
            .map(|i| !g.outvars[i + 1..].contains(&g.outvars[i]))
            .collect();
        Some(Plan {
            graph: g,
            steps,
            last_step,
            class_of,
            out_moves,
            pool: Mutex::new(Pool {
                caps: caps.clone(),
                panels: (0..panel_slots).map(|_| None).collect(),
                ..Pool::default()
            }),
            caps,
        })
    }

    /// Whether `args` have exactly the graph's input avals (no allocation).
    pub(crate) fn accepts(&self, args: &[Tensor]) -> bool {
        let g = &self.graph;
        args.len() == g.invars.len()
            && args.iter().zip(&g.invars).all(|(t, &v)| {
                let a = &g.avals[v];
                t.dtype() == a.dtype() && same_shape(t.shape(), a.shape())
            })
    }

    /// Evaluate on concrete `args` of the graph's input avals.
    pub(crate) fn run(&self, args: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let g = &*self.graph;
        if !self.accepts(&args) {
            let (given, traced) = (crate::ops::avals(&args), g.in_avals());
            return Err(Error::shapes(
                "graph evaluation",
                given.iter().chain(&traced).map(|a| a.shape()),
                format!(
                    "the arguments {} must have the abstract values the graph was traced with, {}",
                    profile::shapes_label(&given),
                    profile::shapes_label(&traced)
                ),
            ));
        }
        if let Some(t) = args.iter().find(|t| t.is_symbolic()) {
            return Err(Error::EscapedTracer {
                op: "jit".into(),
                trace: t.sym().map(|v| v.trace).unwrap_or(0),
            });
        }
        // The pool, or a fresh one while another thread runs this plan (a
        // poisoned pool is still consistent: it only holds dead buffers).
        let mut guard;
        let mut local;
        let pool: &mut Pool = match self.pool.try_lock() {
            Ok(p) => {
                guard = p;
                &mut guard
            }
            Err(TryLockError::Poisoned(p)) => {
                guard = p.into_inner();
                &mut guard
            }
            Err(TryLockError::WouldBlock) => {
                local = Pool {
                    caps: self.caps.clone(),
                    ..Pool::default()
                };
                &mut local
            }
        };
        pool.age_returned();
        let mut env = std::mem::take(&mut pool.env);
        env.clear();
        env.resize(g.avals.len(), None);
        let outs = self.run_steps(pool, &mut env, args);
        // Whatever is left (after an error, everything) is dead.
        for (v, t) in env.iter_mut().enumerate() {
            if let Some(t) = t.take() {
                pool.recycle(t, self.class_of[v]);
            }
        }
        pool.env = env;
        let outs = outs?;
        for (&v, t) in g.outvars.iter().zip(&outs) {
            if let Some(c) = self.class_of[v] {
                pool.returned.push((t.clone(), c, 0));
            }
        }
        Ok(outs)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_broadcast;
