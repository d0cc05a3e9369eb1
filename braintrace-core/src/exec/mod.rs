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
mod buffer;
#[cfg(feature = "codegen")]
mod codegen;
#[cfg(not(feature = "codegen"))]
#[path = "codegen_off.rs"]
mod codegen;

use crate::error::{Error, Result};
use crate::graph::{profile, Elementwise, Graph, Primitive, VarId, NEVER_READ};
use crate::kernels::broadcast::concat_rows_into;
use crate::kernels::reduce::sum_all;
use crate::kernels::sgemm;
use crate::kernels::spare::recast;
use crate::ops::elementwise::{
    binary_block, mul_add_block, scalar_block, scale_add_block, unary_block, unary_block_f32,
    Binary, BinaryOp, Scalar, ScalarOp, Unary, UnaryOp,
};
use crate::ops::linalg::Matmul;
use crate::ops::shape::{Concat, ReduceSum, Reshape, Transpose};
use crate::ops::{surrogate_block, Spike, Surrogate, SurrogateGrad};
use crate::tensor::{
    copy_blocks, row_major as row_major_of, same_shape, standard_layout, ArrayData, ArrayElement,
    Aval, DType, Repr, Tensor,
};
#[cfg(feature = "codegen")]
use buffer::run_compiled;
use buffer::{contiguous, contiguous_mut};
#[cfg(not(feature = "codegen"))]
use codegen::run_compiled;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayD, ArrayViewD, Ix2, IxDyn, LinalgScalar};
use num_traits::Float;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Instant;

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
    /// A spike's surrogate derivative ([`SurrogateGrad`]), called directly
    /// as the core ops are. (A `spike` itself is [`UnaryOp::Step`]: its
    /// kernel is that op's.)
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
    ops: Vec<FusedOp>,
    /// Materialised results, in the order of [`Operand::Out`].
    outputs: Vec<VarId>,
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

/// Buffers a plan keeps across calls (see the module docs).
#[derive(Default)]
struct Pool {
    /// The environment's allocation.
    env: Vec<Option<Tensor>>,
    /// The operand list of an `eval`.
    ins: Vec<Tensor>,
    /// Per buffer class, dead values of its dtype and element count, whole:
    /// each handle unique, its buffer written again in place and handed
    /// back as the new value (no allocation, no array rebuilt) when the
    /// new value has the old one's shape and memory order.
    free: Vec<Vec<Tensor>>,
    /// Block buffers of the fused loops ([`BLOCK`] elements each).
    scratch_f32: Vec<Vec<f32>>,
    scratch_f64: Vec<Vec<f64>>,
    /// The allocations of a fused loop's operand lists, kept empty from
    /// call to call ([`recast`]): its inputs' arrays, two lists of element
    /// slices (the inputs, the rows) and one of result slices.
    spare_arrays: Vec<usize>,
    spare_elems: [Vec<[usize; 3]>; 2],
    spare_outs: Vec<[usize; 2]>,
    /// The results' buffers of a fused loop (kept empty, as above).
    spare_bufs_f32: Vec<Buf<f32>>,
    spare_bufs_f64: Vec<Buf<f64>>,
    /// Values returned to the caller: handle, class, calls seen since.
    returned: Vec<(Tensor, usize, u8)>,
    /// Per buffer class, the most dead buffers kept: how many values of
    /// the class one call writes.
    caps: Vec<usize>,
    /// Per product whose right operand is a program input or constant
    /// (its [`Kernel::Matmul`] slot): that operand as last seen (held, so
    /// that an in-place change copies it first and the identity check is
    /// sound) and its packed panels, reused while the caller passes the
    /// same tensor (a weight, step after step).
    panels: Vec<Option<(Tensor, sgemm::PackedB)>>,
    /// How many times a right operand was packed (tests).
    #[cfg(test)]
    packs: usize,
}

impl Pool {
    /// Keep `t` in class `c`'s free list if `t` has a class, is a float
    /// and the only handle to its value, and the list has room; otherwise
    /// just drop the handle. Whether its elements fit the class (as many,
    /// contiguous) is checked when it is taken ([`take`]).
    fn recycle(&mut self, t: Tensor, class: Option<usize>) {
        let Some(c) = class else { return };
        if !t.is_unique() || t.is_symbolic() || !matches!(t.dtype(), DType::F32 | DType::F64) {
            return;
        }
        let cap = self.caps.get(c).copied().unwrap_or(0);
        if self.free.len() <= c {
            self.free.resize_with(c + 1, Vec::new);
        }
        if self.free[c].len() < cap {
            self.free[c].push(t);
        }
    }

    /// At the start of a call: recycle the values returned earlier that
    /// the caller has dropped, forget those held too long.
    fn age_returned(&mut self) {
        let mut i = 0;
        while i < self.returned.len() {
            let (t, c, age) = &mut self.returned[i];
            if t.is_unique() {
                let (t, c, _) = self.returned.swap_remove(i);
                self.recycle(t, Some(c));
            } else if *age + 1 >= KEEP_CALLS {
                let _ = c;
                self.returned.swap_remove(i);
            } else {
                *age += 1;
                i += 1;
            }
        }
    }
}

/// A buffer for a result of `shape` the plan writes, row-major or
/// (`column_major`) column-major: a dead value of `class` of that very
/// shape and order when there is one (handed back as it is, see
/// [`Buf::into_tensor`]), else one whose elements lie contiguous in memory
/// (given the shape then), else a fresh one with [`ALIGN_SLACK`] elements
/// to spare, so that its elements can start on a 64-byte boundary (see
/// [`aligned`]).
fn take<T: PoolFloat>(
    p: &mut Pool,
    class: Option<usize>,
    shape: &[usize],
    column_major: bool,
) -> Buf<T> {
    let n = shape.iter().product();
    if let Some(list) = class.and_then(|c| p.free.get_mut(c)) {
        let same = list.iter_mut().rposition(|t| {
            unique_array_mut::<T>(t)
                .is_some_and(|a| same_shape(a.shape(), shape) && in_order(a, column_major))
        });
        if let Some(i) = same {
            return Buf::Kept(list.swap_remove(i), std::marker::PhantomData);
        }
        while let Some(mut t) = list.pop() {
            if contiguous_mut::<T>(&mut t).is_some_and(|s| s.len() == n) {
                return Buf::Kept(t, std::marker::PhantomData);
            }
        }
    }
    let v = vec![T::zero(); n + ALIGN_SLACK];
    let at = aligned_start(&v, n);
    Buf::Fresh { v, at, n }
}

/// The array of a unique concrete `t` of element type `T`.
fn unique_array_mut<T: PoolFloat>(t: &mut Tensor) -> Option<&mut ArrayD<T>> {
    match Arc::get_mut(&mut t.0)? {
        Repr::Concrete(d) => T::array_mut(d),
        Repr::Symbolic(_) => None,
    }
}

/// Replace `a` by `change(a)` in place: a tensor's array given a new shape
/// inside its handle (no new handle allocated, none freed).
fn change_in_place<T>(
    a: &mut ArrayD<T>,
    change: impl FnOnce(ArrayD<T>) -> Result<ArrayD<T>>,
) -> Result<()> {
    // An empty placeholder while `a` is moved out (no allocation).
    let empty = ndarray::Array1::from_vec(Vec::new()).into_dyn();
    *a = change(std::mem::replace(a, empty))?;
    Ok(())
}

/// The elements of contiguous `a` as an array of `shape` (as many
/// elements), row-major or (`column_major`) column-major, in the same
/// allocation (the elements' values are whatever the memory holds).
fn relaid<T>(a: ArrayD<T>, shape: IxDyn, column_major: bool) -> Result<ArrayD<T>> {
    let n = a.len();
    // The elements are the memory block that starts at the array's first
    // element (contiguous, positive strides).
    let (v, at) = a.into_raw_vec_and_offset();
    from_block(v, at.unwrap_or(0), n, shape, column_major)
}

/// Elements `at..at + n` of `v` as an array of `shape`, row-major or
/// (`column_major`) column-major, owning the whole allocation.
fn from_block<T>(
    v: Vec<T>,
    at: usize,
    n: usize,
    shape: IxDyn,
    column_major: bool,
) -> Result<ArrayD<T>> {
    let order = if column_major {
        ndarray::Order::ColumnMajor
    } else {
        ndarray::Order::RowMajor
    };
    ndarray::Array1::from_vec(v)
        .slice_move(ndarray::s![at..at + n])
        .into_shape_with_order((shape, order))
        .map_err(|e| Error::invalid("planned buffer", e.to_string()))
}

/// A result's buffer (contents unspecified): `n` elements of `v` from
/// `at`, or the memory of a dead value kept whole.
enum Buf<T> {
    Fresh { v: Vec<T>, at: usize, n: usize },
    Kept(Tensor, std::marker::PhantomData<T>),
}

impl<T: PoolFloat> Buf<T> {
    fn slice_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Fresh { v, at, n } => &mut v[*at..*at + *n],
            Buf::Kept(t, _) => contiguous_mut::<T>(t).expect("checked when taken"),
        }
    }
    /// The elements as an array of `shape` (`n` elements), row-major or
    /// (`column_major`) column-major, owning the whole allocation.
    fn into_array(self, shape: IxDyn, column_major: bool) -> Result<ArrayD<T>> {
        match self {
            Buf::Fresh { v, at, n } => from_block(v, at, n, shape, column_major),
            Buf::Kept(t, _) => {
                let a = t.into_array::<T>()?;
                if same_shape(a.shape(), ndarray::Dimension::slice(&shape))
                    && in_order(&a, column_major)
                {
                    return Ok(a);
                }
                relaid(a, shape, column_major)
            }
        }
    }
    /// The value of [`Buf::into_array`] as a tensor: a kept value is handed
    /// back in its own handle, given this shape and memory order in place
    /// when it has others.
    fn into_tensor(self, shape: &[usize], column_major: bool) -> Result<Tensor> {
        match self {
            Buf::Kept(mut t, _) => {
                let a = unique_array_mut::<T>(&mut t).expect("unique and of type T when taken");
                if !(same_shape(a.shape(), shape) && in_order(a, column_major)) {
                    change_in_place(a, |a| relaid(a, IxDyn(shape), column_major))?;
                }
                Ok(t)
            }
            fresh => Ok(T::tensor(fresh.into_array(IxDyn(shape), column_major)?)),
        }
    }
}

/// Whether `a` is contiguous in row-major or (`column_major`) column-major
/// order.
fn in_order<T>(a: &ArrayD<T>, column_major: bool) -> bool {
    let n = a.ndim();
    if column_major {
        fits_order(a, &mut (0..n))
    } else {
        fits_order(a, &mut (0..n).rev())
    }
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
        let mut steps = Vec::new();
        let mut panel_slots = 0;
        let mut emitted = vec![false; groups.members.len()];
        for (i, e) in g.eqns.iter().enumerate() {
            if elided.contains(&i) {
                continue;
            }
            match groups.of_eqn[i] {
                Some(k) if groups.last_member(k) == i && !emitted[k] => {
                    emitted[k] = true;
                    steps.push(Step::Fused(Box::new(build_fused(&g, &groups.members[k]))));
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
                Step::Fused(f) => f.outputs.clone(),
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

    fn run_steps(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        args: Vec<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let g = &*self.graph;
        let prof = profile::enabled();
        for (&v, x) in g.invars.iter().zip(args) {
            self.put(pool, env, v, x);
        }
        for (&v, c) in g.constvars.iter().zip(&g.consts) {
            if self.last_step[v] != NEVER_READ {
                env[v] = Some(c.clone());
            }
        }
        for (s, step) in self.steps.iter().enumerate() {
            let t0 = prof.then(Instant::now);
            match step {
                Step::Eqn {
                    eqn,
                    inputs,
                    kernel,
                    ..
                } => {
                    let e = &g.eqns[*eqn];
                    let y = match kernel {
                        Kernel::Matmul { panels, transposed } => self
                            .matmul(
                                pool,
                                env,
                                e.prim.as_ref(),
                                inputs,
                                e.outputs[0],
                                (*panels, *transposed),
                            )
                            .map(Some)?,
                        Kernel::Transpose => {
                            let p = e.prim.as_ref();
                            let perm = &p
                                .as_any()
                                .downcast_ref::<Transpose>()
                                .ok_or_else(|| Error::invalid(p.name(), "planned as a transpose"))?
                                .perm;
                            self.layout(pool, env, p, inputs[0], e.outputs[0], PermuteBy(perm))
                                .map(Some)?
                        }
                        Kernel::Concat { axis } => self
                            .concat(pool, env, e.prim.as_ref(), inputs, e.outputs[0], *axis)
                            .map(Some)?,
                        Kernel::SumAll => self
                            .sum_all(pool, env, e.prim.as_ref(), inputs[0], e.outputs[0])
                            .map(Some)?,
                        Kernel::Reshape => {
                            let shape = self.graph.avals[e.outputs[0]].shape();
                            self.layout(
                                pool,
                                env,
                                e.prim.as_ref(),
                                inputs[0],
                                e.outputs[0],
                                ReshapeTo(shape),
                            )
                            .map(Some)?
                        }
                        Kernel::Eval => {
                            let mut ins = std::mem::take(&mut pool.ins);
                            ins.clear();
                            for &(v, last) in inputs {
                                let x = if last { env[v].take() } else { env[v].clone() };
                                ins.push(x.ok_or_else(|| undefined(e.prim.as_ref(), v))?);
                            }
                            let outs = e.prim.eval(&ins);
                            for (&(v, last), x) in inputs.iter().zip(ins.drain(..)) {
                                if last {
                                    pool.recycle(x, self.class_of[v]);
                                }
                            }
                            pool.ins = ins;
                            let outs = outs?;
                            if outs.len() != e.outputs.len() {
                                return Err(Error::invalid(
                                    e.prim.name(),
                                    format!(
                                        "eval returned {} value(s) for an equation with {} \
                                         output(s)",
                                        outs.len(),
                                        e.outputs.len()
                                    ),
                                ));
                            }
                            for (&v, x) in e.outputs.iter().zip(outs) {
                                self.put(pool, env, v, x);
                            }
                            None
                        }
                    };
                    // The planned kernels write the one output.
                    if let Some(y) = y {
                        self.put(pool, env, e.outputs[0], y);
                    }
                }
                Step::Fused(f) => {
                    match f.dtype {
                        DType::F32 => run_fused::<f32>(g, f, env, pool, &self.class_of)?,
                        DType::F64 => run_fused::<f64>(g, f, env, pool, &self.class_of)?,
                        d => unreachable!("only float groups are formed, got {d}"),
                    }
                    for &v in f
                        .inputs
                        .iter()
                        .chain(f.scalars.iter().chain(&f.rows).map(|(v, _)| v))
                    {
                        if self.last_step[v] == s {
                            if let Some(t) = env[v].take() {
                                pool.recycle(t, self.class_of[v]);
                            }
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
            .zip(&self.out_moves)
            .map(|(&v, &moved)| {
                let t = if moved { env[v].take() } else { env[v].clone() };
                t.ok_or_else(|| {
                    Error::invalid(
                        "graph evaluation",
                        format!(
                            "output variable {} is never defined",
                            crate::graph::var_name(v)
                        ),
                    )
                })
            })
            .collect()
    }

    /// A 2-D matrix product into a recycled buffer, in the memory order
    /// `ndarray`'s `dot` (the primitive's `eval`) gives it, by the same
    /// `matrixmultiply` call: bit for bit the interpreter's result.
    fn matmul(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        inputs: &[(VarId, bool)],
        out: VarId,
        (panels, transposed): (Option<usize>, bool),
    ) -> Result<Tensor> {
        let class = self.class_of[out];
        let arg = |i: usize| {
            let v = inputs[i].0;
            env[v]
                .as_ref()
                .ok_or_else(|| undefined(p, v))?
                .data_for("matmul")
        };
        let y = match (arg(0)?, arg(1)?) {
            (ArrayData::F32(a), ArrayData::F32(b)) => {
                match (
                    a.view().into_dimensionality::<Ix2>(),
                    right(b, transposed).into_dimensionality::<Ix2>(),
                ) {
                    (Ok(av), Ok(bv))
                        if av.ncols() == bv.nrows() && sgemm::applies(&av, bv.ncols()) =>
                    {
                        let keep = match panels {
                            Some(slot) => Some((
                                env[inputs[1].0]
                                    .as_ref()
                                    .ok_or_else(|| undefined(p, inputs[1].0))?,
                                slot,
                            )),
                            None => None,
                        };
                        Self::sgemm_into(pool, class, av, bv, keep)
                    }
                    _ => matmul_into(pool, class, a.view(), right(b, transposed))?,
                }
            }
            (ArrayData::F64(a), ArrayData::F64(b)) => {
                matmul_into(pool, class, a.view(), right(b, transposed))?
            }
            (a, b) => {
                return Err(Error::dtype_with(
                    "matmul",
                    "rhs",
                    [a.dtype()],
                    b.dtype(),
                    format!(
                        "planned for two floats of one dtype; lhs {}, rhs {}",
                        a.dtype(),
                        b.dtype()
                    ),
                ))
            }
        };
        self.release(pool, env, inputs);
        Ok(y)
    }

    /// Bind `v` to `x`, or give `x`'s buffer back when nothing reads `v`.
    fn put(&self, pool: &mut Pool, env: &mut [Option<Tensor>], v: VarId, x: Tensor) {
        if self.last_step[v] != NEVER_READ {
            env[v] = Some(x);
        } else {
            pool.recycle(x, self.class_of[v]);
        }
    }

    /// Give back the buffers of the operands read for the last time.
    fn release(&self, pool: &mut Pool, env: &mut [Option<Tensor>], inputs: &[(VarId, bool)]) {
        for &(v, last) in inputs {
            if last {
                if let Some(t) = env[v].take() {
                    pool.recycle(t, self.class_of[v]);
                }
            }
        }
    }

    /// A concatenation into a recycled buffer, by the loop `eval` runs
    /// (the same elements in the same row-major layout).
    fn concat(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        inputs: &[(VarId, bool)],
        out: VarId,
        axis: usize,
    ) -> Result<Tensor> {
        let shape = self.graph.avals[out].shape();
        let class = self.class_of[out];
        fn join<T: PoolFloat>(
            pool: &mut Pool,
            class: Option<usize>,
            env: &[Option<Tensor>],
            (p, inputs): (&dyn Primitive, &[(VarId, bool)]),
            axis: usize,
            shape: &[usize],
        ) -> Result<Tensor> {
            // The parts' row-major elements, in a list that keeps its
            // allocation from call to call.
            let mut parts: Vec<Cow<[T]>> = recast(std::mem::take(&mut pool.spare_elems[0]));
            for &(v, _) in inputs {
                let t = env[v].as_ref().ok_or_else(|| undefined(p, v))?;
                let a = T::array(t.data_for("concatenate")?).ok_or_else(|| {
                    Error::dtype_with(
                        "concatenate",
                        format!("operand of shape {:?}", t.shape()),
                        [T::dtype()],
                        t.dtype(),
                        "planned for operands of one float dtype",
                    )
                })?;
                parts.push(elements(a, Order::C));
            }
            let mut v = take::<T>(pool, class, shape, false);
            concat_rows_into(&parts, axis, shape, v.slice_mut());
            pool.spare_elems[0] = recast(parts);
            v.into_tensor(shape, false)
        }
        let y = match self.graph.avals[out].dtype() {
            DType::F32 => join::<f32>(pool, class, env, (p, inputs), axis, shape)?,
            DType::F64 => join::<f64>(pool, class, env, (p, inputs), axis, shape)?,
            d => unreachable!("only float joins are planned, got {d}"),
        };
        self.release(pool, env, inputs);
        Ok(y)
    }

    /// The sum of every element into a recycled one-element buffer, added
    /// in the order `eval` adds them ([`sum_all`]): the same bits.
    fn sum_all(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        (v, last): (VarId, bool),
        out: VarId,
    ) -> Result<Tensor> {
        let shape = self.graph.avals[out].shape();
        let class = self.class_of[out];
        fn total<T: PoolFloat>(
            pool: &mut Pool,
            class: Option<usize>,
            x: &Tensor,
            shape: &[usize],
        ) -> Result<Tensor> {
            let a = T::array(x.data_for("sum")?).ok_or_else(|| {
                Error::dtype_with(
                    "sum",
                    format!("operand of shape {:?}", x.shape()),
                    [T::dtype()],
                    x.dtype(),
                    "planned for a float",
                )
            })?;
            let s = sum_all(&elements(a, Order::C));
            let mut b = take::<T>(pool, class, shape, false);
            b.slice_mut()[0] = s;
            b.into_tensor(shape, false)
        }
        let x = env[v].as_ref().ok_or_else(|| undefined(p, v))?;
        let y = match x.dtype() {
            DType::F32 => total::<f32>(pool, class, x, shape)?,
            DType::F64 => total::<f64>(pool, class, x, shape)?,
            d => unreachable!("only float sums are planned, got {d}"),
        };
        self.release(pool, env, &[(v, last)]);
        Ok(y)
    }

    /// A few-row `f32` product by [`sgemm`] (as the interpreter's `eval`
    /// runs it: the same bits) into a recycled buffer. `keep`: the right
    /// operand's tensor and its [`Pool::panels`] slot, when the operand's
    /// panels are kept for the next call.
    fn sgemm_into(
        pool: &mut Pool,
        class: Option<usize>,
        a: ndarray::ArrayView2<'_, f32>,
        b: ndarray::ArrayView2<'_, f32>,
        keep: Option<(&Tensor, usize)>,
    ) -> Tensor {
        let (m, n) = (a.nrows(), b.ncols());
        let mut c = take::<f32>(pool, class, &[m, n], false);
        let pack = match keep {
            Some((b_t, slot)) => !matches!(&pool.panels[slot], Some((t, _)) if t.ptr_eq(b_t)),
            None => true,
        };
        #[cfg(test)]
        {
            pool.packs += usize::from(pack);
        }
        let fresh;
        let panels = match keep {
            Some((b_t, slot)) => {
                if pack {
                    pool.panels[slot] = Some((b_t.clone(), sgemm::PackedB::new(&b)));
                }
                &pool.panels[slot].as_ref().expect("packed above").1
            }
            None => {
                fresh = sgemm::PackedB::new(&b);
                &fresh
            }
        };
        sgemm::gemm(&a, panels, c.slice_mut());
        c.into_tensor(&[m, n], false).expect("m · n elements")
    }

    /// A float layout change the plan runs itself (reshape, transpose):
    /// the operand is moved in on its last read (so a unique buffer can be
    /// reused), `f32`/`f64` pick `change`'s loop, and the operand is
    /// recycled when its buffer was not taken.
    fn layout<L: LayoutChange>(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        (v, last): (VarId, bool),
        out: VarId,
        change: L,
    ) -> Result<Tensor> {
        let x = if last { env[v].take() } else { env[v].clone() };
        let x = x.ok_or_else(|| undefined(p, v))?;
        let class = self.class_of[out];
        let (y, back) = match x.dtype() {
            DType::F32 => change.apply::<f32>(pool, class, x),
            DType::F64 => change.apply::<f64>(pool, class, x),
            d => {
                return Err(Error::dtype_with(
                    L::NAME,
                    format!("operand of shape {:?}", x.shape()),
                    DType::FLOATS,
                    d,
                    "planned for a float operand",
                ))
            }
        }?;
        if let Some(x) = back {
            pool.recycle(x, self.class_of[v]);
        }
        Ok(y)
    }
}

/// A float layout change run by [`Plan::layout`].
trait LayoutChange {
    const NAME: &'static str;
    /// The result, and `x` back when its buffer was not taken (for the
    /// caller to recycle).
    fn apply<T: PoolFloat>(
        &self,
        pool: &mut Pool,
        class: Option<usize>,
        x: Tensor,
    ) -> Result<(Tensor, Option<Tensor>)>;
}

/// A reshape to this shape: the operand's buffer when it is unique and
/// row-major (no copy), else a row-major copy into a recycled buffer; in
/// both cases the interpreter's row-major result.
struct ReshapeTo<'a>(&'a [usize]);

impl LayoutChange for ReshapeTo<'_> {
    const NAME: &'static str = "reshape";
    fn apply<T: PoolFloat>(
        &self,
        pool: &mut Pool,
        class: Option<usize>,
        x: Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let bad = |e: ndarray::ShapeError| Error::invalid("reshape", e.to_string());
        let a = T::array(x.data_for("reshape")?)
            .ok_or_else(|| Error::invalid("reshape", "operand of another dtype"))?;
        if order_of(a) == Some(Order::C) && x.is_unique() {
            // Unique and row-major: the buffer itself, in its own handle,
            // no copy.
            let mut x = x;
            let a = unique_array_mut::<T>(&mut x).expect("unique, of type T");
            change_in_place(a, |a| a.into_shape_with_order(IxDyn(self.0)).map_err(bad))?;
            return Ok((x, None));
        }
        let mut v = take::<T>(pool, class, self.0, false);
        copy_blocks(v.slice_mut(), row_major_of(&standard_layout(a)));
        Ok((v.into_tensor(self.0, false)?, Some(x)))
    }
}

/// A transpose by this permutation, as `eval` does it (the operand's buffer
/// with its strides permuted): the operand's own buffer when it is unique,
/// else a copy into a recycled buffer.
struct PermuteBy<'a>(&'a [usize]);

impl LayoutChange for PermuteBy<'_> {
    const NAME: &'static str = "transpose";
    fn apply<T: PoolFloat>(
        &self,
        pool: &mut Pool,
        class: Option<usize>,
        x: Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if x.is_unique() {
            let a = x.into_array::<T>()?;
            return Ok((T::tensor(a.permuted_axes(IxDyn(self.0))), None));
        }
        let a = T::array(x.data_for("transpose")?)
            .ok_or_else(|| Error::invalid("transpose", "operand of another dtype"))?;
        let y = match a.as_slice() {
            Some(s) => {
                let mut v = take::<T>(pool, class, a.shape(), false);
                copy_blocks(v.slice_mut(), s);
                v.into_array(a.raw_dim(), false)?
            }
            // Same strides, through ndarray's clone.
            None => a.clone(),
        };
        Ok((T::tensor(y.permuted_axes(IxDyn(self.0))), Some(x)))
    }
}

/// How equation `i` is planned (it is not fused).
/// How the plan runs equation `i`; a product whose right operand is a
/// program input or constant takes the next of `panel_slots`.
fn kernel_of(g: &Graph, i: usize, panel_slots: &mut usize) -> Kernel {
    let e = &g.eqns[i];
    let float = |v: &VarId| matches!(g.avals[*v].dtype(), DType::F32 | DType::F64);
    if planned_matmul(g, i) {
        let right = e.inputs[1];
        let kept = g.invars.contains(&right) || g.constvars.contains(&right);
        let panels = kept.then(|| next_slot(panel_slots));
        return Kernel::Matmul {
            panels,
            transposed: false,
        };
    }
    if let Some(t) = e.prim.as_any().downcast_ref::<Transpose>() {
        let r = g.avals[e.inputs[0]].ndim();
        let mut seen = vec![false; r];
        let permutation = t.perm.len() == r
            && t.perm
                .iter()
                .all(|&k| k < r && !std::mem::replace(&mut seen[k], true));
        if e.inputs.len() == 1 && e.outputs.len() == 1 && float(&e.inputs[0]) && permutation {
            return Kernel::Transpose;
        }
    }
    if let Some(c) = e.prim.as_any().downcast_ref::<Concat>() {
        let dtype = g.avals[e.outputs[0]].dtype();
        if e.outputs.len() == 1
            && !e.inputs.is_empty()
            && float(&e.outputs[0])
            && e.inputs.iter().all(|&v| g.avals[v].dtype() == dtype)
            && c.axis < g.avals[e.outputs[0]].ndim()
        {
            return Kernel::Concat { axis: c.axis };
        }
    }
    if e.inputs.len() == 1
        && e.outputs.len() == 1
        && e.prim.as_any().is::<ReduceSum>()
        && float(&e.inputs[0])
        && g.avals[e.outputs[0]].dtype() == g.avals[e.inputs[0]].dtype()
        && g.avals[e.outputs[0]].size() == 1
    {
        return Kernel::SumAll;
    }
    if e.inputs.len() == 1
        && e.outputs.len() == 1
        && e.prim.as_any().is::<Reshape>()
        && float(&e.inputs[0])
        && g.avals[e.inputs[0]].size() == g.avals[e.outputs[0]].size()
    {
        return Kernel::Reshape;
    }
    Kernel::Eval
}

/// The next free slot of [`Pool::panels`] (`slots` counts those taken).
fn next_slot(slots: &mut usize) -> usize {
    *slots += 1;
    *slots - 1
}

/// Whether equation `i` is a product the plan runs itself
/// ([`Kernel::Matmul`]): two 2-D float operands of one dtype, at most
/// [`MAX_PLANNED_MATMUL`] results.
fn planned_matmul(g: &Graph, i: usize) -> bool {
    let e = &g.eqns[i];
    e.inputs.len() == 2
        && e.outputs.len() == 1
        && e.prim.as_any().is::<Matmul>()
        && e.inputs.iter().all(|&v| {
            g.avals[v].ndim() == 2 && matches!(g.avals[v].dtype(), DType::F32 | DType::F64)
        })
        && g.avals[e.inputs[0]].dtype() == g.avals[e.inputs[1]].dtype()
        && g.avals[e.outputs[0]].size() <= MAX_PLANNED_MATMUL
}

/// The transposes the plan does not run: `r = transpose(w)` (2-D) of a
/// program input or constant `w`, read only once, as the right operand of
/// a product planned as [`Kernel::Matmul`] (`x @ wᵀ`, a readout's backward
/// pass). That product reads `w` itself and multiplies by `wᵀ`: its
/// [`sgemm`] panels are packed from `w`'s transposed view and kept from
/// call to call like a weight's, instead of a copy of `wᵀ` and its packing
/// on every call. Returns the elided transposes and, per product, its `w`.
fn elided_transposes(g: &Graph) -> (HashSet<usize>, HashMap<usize, VarId>) {
    let mut reads = vec![0usize; g.avals.len()];
    let mut reader = vec![usize::MAX; g.avals.len()];
    for (i, e) in g.eqns.iter().enumerate() {
        for &v in &e.inputs {
            reads[v] += 1;
            reader[v] = i;
        }
    }
    for &v in &g.outvars {
        reads[v] += 1;
    }
    let mut elided = HashSet::new();
    let mut weight_t = HashMap::new();
    for (i, e) in g.eqns.iter().enumerate() {
        let Some(t) = e.prim.as_any().downcast_ref::<Transpose>() else {
            continue;
        };
        if e.inputs.len() != 1 || e.outputs.len() != 1 || t.perm != [1, 0] {
            continue;
        }
        let (w, r) = (e.inputs[0], e.outputs[0]);
        let kept = g.invars.contains(&w) || g.constvars.contains(&w);
        // Read once, and by an equation (not only as a result).
        let j = reader[r];
        if !kept || reads[r] != 1 || j == usize::MAX || g.avals[w].ndim() != 2 {
            continue;
        }
        let m = &g.eqns[j];
        if planned_matmul(g, j) && m.inputs[1] == r && m.inputs[0] != r {
            elided.insert(i);
            weight_t.insert(j, w);
        }
    }
    (elided, weight_t)
}

/// A product's right operand: `b`, or with `transposed` its transpose as
/// `transpose` leaves it (strides permuted, where `b` lies).
fn right<T>(b: &ArrayD<T>, transposed: bool) -> ArrayViewD<'_, T> {
    if transposed {
        b.view().reversed_axes()
    } else {
        b.view()
    }
}

fn matmul_into<T: PoolFloat + LinalgScalar>(
    pool: &mut Pool,
    class: Option<usize>,
    a: ArrayViewD<'_, T>,
    b: ArrayViewD<'_, T>,
) -> Result<Tensor> {
    let bad = |why: String| Error::invalid("matmul", why);
    let a = a
        .into_dimensionality::<Ix2>()
        .map_err(|e| bad(e.to_string()))?;
    let b = b
        .into_dimensionality::<Ix2>()
        .map_err(|e| bad(e.to_string()))?;
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    if k != k2 {
        return Err(bad(format!(
            "operands {:?} and {:?} do not chain (the plan expected they would)",
            a.shape(),
            b.shape()
        )));
    }
    // `dot`'s choice: column-major when both operands step by one down
    // their rows.
    let column_major = a.strides()[0] == 1 && b.strides()[0] == 1;
    let mut c = take::<T>(pool, class, &[m, n], column_major)
        .into_array(IxDyn(&[m, n]), column_major)?
        .into_dimensionality::<Ix2>()
        .map_err(|e| bad(e.to_string()))?;
    // β = 0: the buffer's old contents are overwritten, never read.
    general_mat_mul(T::one(), &a, &b, T::zero(), &mut c);
    Ok(T::tensor(c.into_dyn()))
}

fn undefined(p: &dyn Primitive, v: VarId) -> Error {
    Error::invalid(
        p.name(),
        format!(
            "operand {} is read before it is defined (the graph is not in SSA order)",
            crate::graph::var_name(v)
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
            .chain(f.scalars.iter().chain(&f.rows).map(|&(v, _)| v))
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
    let (r, sh) = (out.ndim(), out.shape());
    let ok = e.inputs.iter().all(|&v| {
        let a = &g.avals[v];
        // The output's shape, one element, or a trailing part of the
        // output's shape (broadcast along the leading axes).
        let row = a.ndim() < r && a.shape() == &sh[r - a.ndim()..];
        a.dtype() == out.dtype() && (a.shape() == sh || a.size() == 1 || row)
    });
    ok.then_some(k)
}

/// The op of a binary element-wise primitive.
fn binary_op(p: &dyn Primitive) -> Option<BinaryOp> {
    p.as_any().downcast_ref::<Binary>().map(|b| b.0)
}

/// How a fused loop runs a (not folded) equation of primitive `p`.
fn core_kind(p: &dyn Primitive) -> OpKind {
    let any = p.as_any();
    if let Some(u) = any.downcast_ref::<Unary>() {
        OpKind::Unary(u.0)
    } else if let Some(b) = any.downcast_ref::<Binary>() {
        OpKind::Binary(b.0)
    } else if let Some(s) = any.downcast_ref::<Scalar>() {
        OpKind::Scalar(s.op, s.value)
    } else if any.is::<Spike>() {
        OpKind::Unary(UnaryOp::Step)
    } else if let Some(g) = any.downcast_ref::<SurrogateGrad>() {
        OpKind::Surrogate(g.0)
    } else {
        OpKind::Eqn
    }
}

/// The factor of a `mul_scalar` primitive.
fn mul_scalar_of(p: &dyn Primitive) -> Option<f64> {
    p.as_any()
        .downcast_ref::<Scalar>()
        .filter(|s| s.op == ScalarOp::Mul)
        .map(|s| s.value)
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
/// is dead within the group) and the values to materialise (written
/// straight into their output buffers, and read back from there).
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
    // Pairs: a `mul` or `mul_scalar` whose result only an `add` of the
    // group reads runs inside the add's loop (one pass over the block
    // instead of two, and no buffer for the product).
    let mut reads_in_group: HashMap<VarId, usize> = HashMap::new();
    for &i in members {
        for &v in &g.eqns[i].inputs {
            *reads_in_group.entry(v).or_default() += 1;
        }
    }
    let mut folded = vec![false; members.len()];
    let mut pair: Vec<Option<(OpKind, Vec<VarId>)>> = vec![None; members.len()];
    for (j, &i) in members.iter().enumerate() {
        let e = &g.eqns[i];
        if binary_op(e.prim.as_ref()) != Some(BinaryOp::Add) {
            continue;
        }
        for (slot, &v) in e.inputs.iter().enumerate() {
            let Some(&p) = in_group.get(&v) else {
                continue;
            };
            if folded[p] || read_outside[v] || reads_in_group[&v] != 1 {
                continue;
            }
            let pe = &g.eqns[members[p]];
            let other = e.inputs[1 - slot];
            let kind = match (binary_op(pe.prim.as_ref()), mul_scalar_of(pe.prim.as_ref())) {
                (Some(BinaryOp::Mul), _) => {
                    (OpKind::MulAdd, vec![pe.inputs[0], pe.inputs[1], other])
                }
                (_, Some(s)) => (OpKind::ScaleAdd(s), vec![pe.inputs[0], other]),
                _ => continue,
            };
            folded[p] = true;
            pair[j] = Some(kind);
            break;
        }
    }
    // What each op reads: its equation's operands, or a pair's.
    let reads: Vec<Vec<VarId>> = members
        .iter()
        .zip(&pair)
        .map(|(&i, p)| match p {
            Some((_, r)) => r.clone(),
            None => g.eqns[i].inputs.clone(),
        })
        .collect();
    // Last use (position in the group) of each value read inside it.
    let mut last_in_group: HashMap<VarId, usize> = HashMap::new();
    for (j, r) in reads.iter().enumerate() {
        if !folded[j] {
            for &v in r {
                last_in_group.insert(v, j);
            }
        }
    }
    let mut inputs: Vec<VarId> = Vec::new();
    // Broadcast operands first: their buffers are filled before the
    // group's equations run on a block and live for the whole group, so no
    // result may ever be written into them.
    let mut scalars: Vec<(VarId, usize)> = Vec::new();
    let mut rows: Vec<VarId> = Vec::new();
    for &i in members {
        for &v in &g.eqns[i].inputs {
            let external = !in_group.contains_key(&v);
            if external && g.avals[v].shape() != out_aval.shape() {
                if g.avals[v].size() == 1 {
                    if !scalars.iter().any(|&(w, _)| w == v) {
                        scalars.push((v, scalars.len()));
                    }
                } else if !rows.contains(&v) {
                    rows.push(v);
                }
            }
        }
    }
    let rows: Vec<(VarId, usize)> = rows
        .into_iter()
        .enumerate()
        .map(|(k, v)| (v, scalars.len() + k))
        .collect();
    // Where each group value lives: a block buffer, or its output.
    let mut loc_of: HashMap<VarId, Operand> = HashMap::new();
    let mut free: Vec<usize> = Vec::new();
    let mut nbufs = scalars.len() + rows.len();
    let mut ops = Vec::new();
    let mut outputs = Vec::new();
    let mut names = Vec::new();
    for (j, &i) in members.iter().enumerate() {
        let e = &g.eqns[i];
        names.push(e.prim.name());
        if folded[j] {
            continue;
        }
        let mut operands = Vec::new();
        for &v in &reads[j] {
            let op = if in_group.contains_key(&v) {
                loc_of[&v]
            } else if g.avals[v].shape() == out_aval.shape() {
                let k = inputs.iter().position(|&w| w == v).unwrap_or_else(|| {
                    inputs.push(v);
                    inputs.len() - 1
                });
                Operand::Input(k)
            } else {
                let &(_, b) = scalars
                    .iter()
                    .chain(&rows)
                    .find(|&&(w, _)| w == v)
                    .expect("broadcast operands collected above");
                Operand::Buf(b)
            };
            operands.push(op);
        }
        let out = e.outputs[0];
        let dst = if read_outside[out] {
            outputs.push(out);
            Operand::Out(outputs.len() - 1)
        } else {
            // Taken before the operands' buffers are freed: a kernel
            // never writes into its operand.
            Operand::Buf(free.pop().unwrap_or_else(|| {
                nbufs += 1;
                nbufs - 1
            }))
        };
        loc_of.insert(out, dst);
        ops.push(FusedOp {
            eqn: i,
            kind: pair[j]
                .as_ref()
                .map_or_else(|| core_kind(g.eqns[i].prim.as_ref()), |p| p.0),
            operands,
            dst,
        });
        // Free the buffers of group values read for the last time here.
        let mut dead: Vec<VarId> = reads[j]
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
            if let Operand::Buf(b) = loc_of[&v] {
                free.push(b);
            }
        }
    }
    let label = (format!("fused[{}]", names.join(",")), out_aval.to_string());
    let mut f = Fused {
        members: members.len(),
        shape: out_aval.shape().to_vec(),
        dtype: out_aval.dtype(),
        size: out_aval.size(),
        inputs,
        scalars,
        rows,
        ops,
        outputs,
        nbufs,
        label,
        compiled: None,
        constants_f32: Vec::new(),
        constants_f64: Vec::new(),
    };
    f.compiled = codegen::compile(&f);
    if f.compiled.is_some() {
        match f.dtype {
            DType::F64 => f.constants_f64 = codegen::constants(&f),
            _ => f.constants_f32 = codegen::constants(&f),
        }
    }
    f
}

// ---------------------------------------------------------------- fused loop

/// The float types the plan writes buffers of itself.
trait PoolFloat: Float + ArrayElement + codegen::Lane + Send + Sync + 'static {
    /// A compiled group's constants in this type.
    fn constants(f: &Fused) -> &[Self];
    fn block(k: &dyn Elementwise, ins: &[&[Self]], out: &mut [Self]);
    /// The unary op's block kernel (`f32` has its own, for the fast
    /// transcendental functions).
    fn unary(op: UnaryOp, a: &[Self], out: &mut [Self]);
    fn tensor(a: ArrayD<Self>) -> Tensor;
    /// The pool's block buffers for this type.
    fn scratch(p: &mut Pool) -> &mut Vec<Vec<Self>>;
    /// The pool's (empty) list of a fused loop's result buffers.
    fn spare_bufs(p: &mut Pool) -> &mut Vec<Buf<Self>>;
}

macro_rules! pool_float {
    ($t:ty, $consts:ident, $variant:ident, $block:ident, $unary:ident, $scratch:ident, $bufs:ident) => {
        impl PoolFloat for $t {
            fn constants(f: &Fused) -> &[$t] {
                &f.$consts
            }
            fn block(k: &dyn Elementwise, ins: &[&[$t]], out: &mut [$t]) {
                k.$block(ins, out)
            }
            fn unary(op: UnaryOp, a: &[$t], out: &mut [$t]) {
                $unary(op, a, out)
            }
            fn tensor(a: ArrayD<$t>) -> Tensor {
                Tensor::from_data(ArrayData::$variant(a))
            }
            fn scratch(p: &mut Pool) -> &mut Vec<Vec<$t>> {
                &mut p.$scratch
            }
            fn spare_bufs(p: &mut Pool) -> &mut Vec<Buf<$t>> {
                &mut p.$bufs
            }
        }
    };
}
pool_float!(
    f32,
    constants_f32,
    F32,
    block_f32,
    unary_block_f32,
    scratch_f32,
    spare_bufs_f32
);
pool_float!(
    f64,
    constants_f64,
    F64,
    block_f64,
    unary_block,
    scratch_f64,
    spare_bufs_f64
);

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

/// The order `a` is contiguous in (row-major preferred), if any: its
/// strides are a fresh array's of its shape in that order (an axis of
/// length 1 may have any stride; an empty array counts as row-major).
/// Read from the shape and stride slices: `is_standard_layout` and
/// `as_slice_memory_order` on an `IxDyn` array build stride vectors, about
/// 350 instructions a call, and a group asked several per operand.
fn order_of<T>(a: &ArrayD<T>) -> Option<Order> {
    let n = a.ndim();
    if a.is_empty() || fits_order(a, &mut (0..n).rev()) {
        Some(Order::C)
    } else if fits_order(a, &mut (0..n)) {
        Some(Order::F)
    } else {
        None
    }
}

/// Whether `a`'s elements lie contiguous with `axes` from fastest to
/// slowest (axes of length 1 have any stride).
fn fits_order<T>(a: &ArrayD<T>, axes: &mut dyn Iterator<Item = usize>) -> bool {
    let (shape, strides) = (a.shape(), a.strides());
    let mut step = 1usize;
    for i in axes {
        if shape[i] != 1 && strides[i] != step as isize {
            return false;
        }
        step *= shape[i];
    }
    true
}

/// The array behind `v`, checked against what the plan expects (an error,
/// not a wrong result, if a primitive's eval disagrees with its shape rule).
fn operand<'a, T: PoolFloat>(
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
                crate::graph::var_name(v),
                g.avals[v]
            ),
        )
    };
    let t = env[v]
        .as_ref()
        .ok_or_else(|| mismatch("undefined".into()))?;
    let a = T::array(t.data_for("fused element-wise loop")?)
        .ok_or_else(|| mismatch(t.aval().to_string()))?;
    if !same_shape(a.shape(), want) {
        return Err(mismatch(t.aval().to_string()));
    }
    Ok(a)
}

/// The elements of `a` in `order`: borrowed when `a` is contiguous in that
/// order, copied otherwise.
fn elements<T: Copy>(a: &ArrayD<T>, order: Order) -> Cow<'_, [T]> {
    let own = order_of(a);
    if own == Some(order) || a.len() <= 1 {
        if let Some(s) = contiguous(a, own) {
            return Cow::Borrowed(s);
        }
    }
    // A 2-D array contiguous in the other order: a blocked transpose.
    if a.ndim() == 2 {
        if let Some(s) = contiguous(a, own) {
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

/// Least common multiple (`0` when either is `0`).
fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    if a == 0 || b == 0 {
        0
    } else {
        a / gcd(a, b) * b
    }
}

/// Block `[start, start + dst.len())` (in `order`) of `row` broadcast
/// along the leading axes of a loop of `size` elements, into `dst`.
fn fill_row<T: Copy>(dst: &mut [T], row: &[T], start: usize, size: usize, order: Order) {
    let n = row.len();
    if n == 0 {
        return;
    }
    match order {
        Order::C => {
            // One period from the row (from the block's phase in it), then
            // the filled part doubled: the first `filled` elements are a
            // whole number of periods, so copying them on keeps the
            // pattern. A copy per row cost a `memcpy` call per 4 elements
            // for a bias of 4 (a 64 × 4 readout: 0.3 µs a step).
            let len = dst.len();
            let k = start % n;
            let m = n.min(len);
            let first = (n - k).min(m);
            dst[..first].copy_from_slice(&row[k..k + first]);
            dst[first..m].copy_from_slice(&row[..m - first]);
            let mut filled = m;
            while filled < len {
                let c = filled.min(len - filled);
                dst.copy_within(0..c, filled);
                filled += c;
            }
        }
        Order::F => {
            let lead = size / n;
            let mut p = start;
            let mut out = dst;
            while !out.is_empty() {
                let k = p / lead;
                let take = (lead - p % lead).min(out.len());
                out[..take].fill(row[k]);
                out = &mut out[take..];
                p += take;
            }
        }
    }
}

/// Elements a block buffer has past [`BLOCK`], so that a block starting
/// on a 64-byte boundary fits (malloc aligns to 16 bytes).
const ALIGN_SLACK: usize = 16;

/// Where `n` elements of `v` start: on a 64-byte boundary (a cache line;
/// a 512-bit load or store of an unaligned block touches two lines, and
/// the kernels ran up to 1.5× slower so) when `v` has the room past `n`,
/// else as far toward it as there is room (0 for exactly `n` elements).
fn aligned_start<T>(v: &[T], n: usize) -> usize {
    v.as_ptr().align_offset(64).min(v.len().saturating_sub(n))
}

/// Where the block of block buffer `v` starts (see [`aligned_start`]).
fn aligned<T>(v: &[T]) -> usize {
    aligned_start(v, BLOCK)
}

/// Elements from which a fused loop splits across the pool's threads under
/// [`keep_awake`](crate::threads::keep_awake): GRU pp_prop at hidden 512,
/// batch 64, two threads, groups of 32 K elements.
const PAR_MIN_ELEMS_AWAKE: usize = 1 << 13;

/// The same on one of the pool's threads otherwise, where a split may
/// have to wake a sleeping thread (tens of microseconds on a virtual
/// machine); never from outside the pool.
const PAR_MIN_ELEMS: usize = 1 << 18;

/// How many fused loops ran split across threads (tests).
#[cfg(test)]
static SPLITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fused loop's operands, run over a range of its elements
/// ([`Blocks::range`]): what the threads of a split share.
struct Blocks<'a, T: Clone> {
    g: &'a Graph,
    f: &'a Fused,
    /// The inputs' elements in the loop's order.
    inputs: &'a [Cow<'a, [T]>],
    /// The row operands' elements in the loop's order.
    rows: &'a [Cow<'a, [T]>],
    order: Order,
    /// Elements per block.
    block: usize,
    /// Whether every block reads the same row elements (blocks start on a
    /// multiple of every row's length), so the rows are filled once.
    period: bool,
    compiled: Option<codegen::Kernel>,
}

impl<T: PoolFloat> Blocks<'_, T> {
    /// Elements `lo..hi` of the results into `outs` (which hold those
    /// elements alone), with `bufs` as block buffers (the scalars' filled);
    /// `lo` is a multiple of the block.
    fn range(&self, bufs: &mut [Vec<T>], outs: &mut [&mut [T]], lo: usize, hi: usize) {
        let f = self.f;
        if lo >= hi {
            return;
        }
        let fill_rows = |bufs: &mut [Vec<T>], start: usize, len: usize| {
            for (row, &(_, b)) in self.rows.iter().zip(&f.rows) {
                let at = aligned(&bufs[b]);
                fill_row(&mut bufs[b][at..at + len], row, start, f.size, self.order);
            }
        };
        if self.period {
            fill_rows(bufs, lo, self.block.min(hi - lo));
        }
        let mut start = lo;
        while start < hi {
            let len = self.block.min(hi - start);
            let at_out = start - lo;
            if !self.period {
                fill_rows(bufs, start, len);
            }
            if let Some(k) = &self.compiled {
                // On the stack: no allocation per block ([`codegen`]
                // compiles groups of at most this many operands).
                let mut ins: [&[T]; codegen::MAX_INS] = [&[]; codegen::MAX_INS];
                let mut os: [&mut [T]; codegen::MAX_OUTS] = Default::default();
                let n_bcast = f.scalars.len() + f.rows.len();
                let n_in = f.inputs.len() + n_bcast;
                let bcast = bufs[..n_bcast].iter().map(|v| {
                    let at = aligned(v);
                    &v[at..at + len]
                });
                let srcs = self
                    .inputs
                    .iter()
                    .map(|v| &v[start..start + len])
                    .chain(bcast);
                for (slot, v) in ins.iter_mut().zip(srcs) {
                    *slot = v;
                }
                for (slot, o) in os.iter_mut().zip(outs.iter_mut()) {
                    *slot = &mut o[at_out..at_out + len];
                }
                let n_out = f.outputs.len();
                run_compiled(k, &ins[..n_in], T::constants(f), &mut os[..n_out]);
                start += len;
                continue;
            }
            for op in &f.ops {
                // The destination is moved out of its list for the call (it
                // is never one of the operands), and back.
                let (mut buf_dst, out_dst): (Vec<T>, &mut [T]) = match op.dst {
                    Operand::Buf(b) => (std::mem::take(&mut bufs[b]), &mut []),
                    Operand::Out(o) => (Vec::new(), std::mem::take(&mut outs[o])),
                    Operand::Input(_) => unreachable!("results go to buffers or outputs"),
                };
                {
                    let mut ins: [&[T]; MAX_ARITY] = [&[]; MAX_ARITY];
                    for (slot, o) in ins.iter_mut().zip(&op.operands) {
                        *slot = match *o {
                            Operand::Input(i) => &self.inputs[i][start..start + len],
                            Operand::Buf(b) => {
                                let at = aligned(&bufs[b]);
                                &bufs[b][at..at + len]
                            }
                            Operand::Out(o) => &outs[o][at_out..at_out + len],
                        };
                    }
                    let out = match op.dst {
                        Operand::Buf(_) => {
                            let at = aligned(&buf_dst);
                            &mut buf_dst[at..at + len]
                        }
                        _ => &mut out_dst[at_out..at_out + len],
                    };
                    match op.kind {
                        OpKind::Eqn => {
                            let k = self.g.eqns[op.eqn]
                                .prim
                                .elementwise()
                                .expect("only element-wise equations are fused");
                            T::block(k, &ins[..op.operands.len()], out)
                        }
                        OpKind::Unary(u) => T::unary(u, ins[0], out),
                        OpKind::Binary(b) => binary_block(b, ins[0], ins[1], out),
                        OpKind::Scalar(o, v) => scalar_block(o, v, ins[0], out),
                        OpKind::MulAdd => mul_add_block(ins[0], ins[1], ins[2], out),
                        OpKind::ScaleAdd(s) => scale_add_block(s, ins[0], ins[1], out),
                        OpKind::Surrogate(s) => surrogate_block(s, ins[0], out),
                    }
                }
                match op.dst {
                    Operand::Buf(b) => bufs[b] = buf_dst,
                    Operand::Out(o) => outs[o] = out_dst,
                    Operand::Input(_) => {}
                }
            }
            start += len;
        }
    }
}

fn run_fused<T: PoolFloat>(
    g: &Graph,
    f: &Fused,
    env: &mut [Option<Tensor>],
    pool: &mut Pool,
    class_of: &[Option<usize>],
) -> Result<()> {
    // Walk memory in the order most operands are stored in. Ties go to
    // column-major: a recurrent update `h' = a h + x` with a column-major
    // `x` then makes `h'` column-major, and the next step copies nothing.
    let mut arrays: Vec<&ArrayD<T>> = recast(std::mem::take(&mut pool.spare_arrays));
    for &v in &f.inputs {
        arrays.push(operand(g, env, v, &f.shape)?);
    }
    let n_f = arrays
        .iter()
        .filter(|a| order_of(a) == Some(Order::F))
        .count();
    let order = if n_f > 0 && 2 * n_f >= arrays.len() {
        Order::F
    } else {
        Order::C
    };
    let [spare_inputs, spare_rows] = std::mem::take(&mut pool.spare_elems);
    let mut inputs: Vec<Cow<[T]>> = recast(spare_inputs);
    inputs.extend(arrays.iter().map(|a| elements(a, order)));
    pool.spare_arrays = recast(arrays);
    let compiled = f.compiled.filter(|_| compiled_on());
    // Row operands, in the loop's order: in row-major order element `p`
    // of the loop reads element `p % n` of the row, in column-major order
    // element `p / (size / n)` (the row's own elements in that order).
    let mut rows: Vec<Cow<[T]>> = recast(spare_rows);
    for &(v, _) in &f.rows {
        rows.push(elements(operand(g, env, v, g.avals[v].shape())?, order));
    }
    let mut bufs_out = std::mem::take(T::spare_bufs(pool));
    for &v in &f.outputs {
        bufs_out.push(take(pool, class_of[v], &f.shape, order == Order::F));
    }
    let mut outs: Vec<&mut [T]> = recast(std::mem::take(&mut pool.spare_outs));
    outs.extend(bufs_out.iter_mut().map(|b| b.slice_mut()));
    // In row-major order, blocks that start on a multiple of every row's
    // length read the same broadcast elements: the rows' buffers are then
    // filled once (a bias of 128 and blocks of 1024: each block used to
    // copy the bias eight times).
    let period = match order {
        Order::C if !rows.is_empty() => rows.iter().try_fold(1usize, |l, r| {
            Some(lcm(l, r.len())).filter(|&l| l > 0 && l <= BLOCK)
        }),
        _ => None,
    };
    let block = BLOCK.min(f.size.max(1));
    let block = period.map_or(block, |p| block.min(BLOCK / p * p));
    let run = Blocks {
        g,
        f,
        inputs: &inputs,
        rows: &rows,
        order,
        block,
        period: period.is_some(),
        compiled,
    };
    // Parts of whole blocks, one per thread where the loop is long enough
    // (each part its own block buffers; each element is computed as on
    // one thread).
    let min = crate::threads::split_threshold(PAR_MIN_ELEMS_AWAKE, PAR_MIN_ELEMS, usize::MAX);
    let parts = if f.size >= min {
        rayon::current_num_threads().min(f.size / (min / 2)).max(1)
    } else {
        1
    };
    let mut bufs = std::mem::take(T::scratch(pool));
    let nbufs = f.nbufs.max(1);
    if bufs.len() < parts * nbufs {
        bufs.resize_with(parts * nbufs, || vec![T::zero(); BLOCK + ALIGN_SLACK]);
    }
    // A scalar fills the block's elements only (a 16-element group used
    // to fill all 1040 of its buffer, for each scalar, every step), in
    // each part's buffers.
    for &(v, b) in &f.scalars {
        let s = operand::<T>(g, env, v, g.avals[v].shape())?;
        let s = *s.iter().next().expect("a scalar operand has one element");
        for part in bufs.chunks_mut(nbufs).take(parts) {
            let at = aligned(&part[b]);
            part[b][at..at + block].fill(s);
        }
    }
    if parts == 1 {
        run.range(&mut bufs[..nbufs], &mut outs, 0, f.size);
    } else {
        #[cfg(test)]
        SPLITS.fetch_add(1, Ordering::Relaxed);
        let per = f.size.div_ceil(block).div_ceil(parts) * block;
        let mut pieces: Vec<Vec<&mut [T]>> = (0..parts).map(|_| Vec::new()).collect();
        for o in outs.drain(..) {
            for (piece, chunk) in pieces.iter_mut().zip(o.chunks_mut(per)) {
                piece.push(chunk);
            }
        }
        use rayon::prelude::*;
        pieces
            .into_par_iter()
            .zip(bufs.par_chunks_mut(nbufs))
            .enumerate()
            .for_each(|(i, (mut outs, bufs))| {
                let lo = i * per;
                run.range(bufs, &mut outs, lo, (lo + per).min(f.size));
            });
    }
    *T::scratch(pool) = bufs;
    // The lists go back empty (an input copied for its order is dropped
    // here); then the results, into the environment.
    pool.spare_outs = recast(outs);
    pool.spare_elems = [recast(inputs), recast(rows)];
    let column_major = order == Order::F;
    for (&v, b) in f.outputs.iter().zip(bufs_out.drain(..)) {
        env[v] = Some(b.into_tensor(&f.shape, column_major)?);
    }
    *T::spare_bufs(pool) = bufs_out;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{trace, LinearArg};
    use crate::ops::elementwise::binary;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::tensor::Tensor;
    use ndarray::ShapeBuilder;
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
                Step::Fused(f) => Some(f.members),
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
        avals.push(Aval::new(&[5], dtype));
        let args: Vec<Tensor> = avals
            .iter()
            .map(|a| rand_tensor(&mut rng, a.shape(), dtype))
            .collect();
        let konst = rand_tensor(&mut rng, &shape, dtype);
        let n_ops = rng.random_range(1..30);
        let choices: Vec<(usize, usize, usize, f64)> = (0..n_ops)
            .map(|_| {
                (
                    rng.random_range(0..19),
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
                let (s, w, row) = (&a[n_in], &a[n_in + 1], &a[n_in + 2]);
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
                        // Reshapes: the inner ones get a moved, unique operand.
                        14 => x
                            .add_scalar(c)?
                            .reshape(&[5, 3])?
                            .reshape(&[15])?
                            .reshape(&[3, 5])?,
                        // A product of a transposed value (and its reshape).
                        15 => y.matmul(&x.t()?.matmul(&y)?)?.reshape(&[3, 5])?,
                        13 => crate::ops::elementwise::unary(UnaryOp::Sin, &x)?.mul(&x)?,
                        // Rows broadcast along the leading axis.
                        16 => x.add(row)?,
                        17 => binary(BinaryOp::Sub, row, &x)?.mul(&y)?,
                        18 => x.mul(&y.sum(&[0])?)?.add_scalar(c)?,
                        _ => unreachable!("ops are drawn from 0..19"),
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
        let (mut fused, mut with_rows) = (0, 0);
        for seed in 0..300 {
            for dtype in [DType::F64, DType::F32] {
                let (g, args) = random_program(seed, dtype);
                let p = check(g, &args, &format!("seed {seed} {dtype}"));
                fused += fused_groups(&p).iter().filter(|&&n| n > 1).count();
                with_rows += p
                    .steps
                    .iter()
                    .filter(|s| matches!(s, Step::Fused(f) if !f.rows.is_empty()))
                    .count();
            }
        }
        assert!(
            fused > 100,
            "only {fused} groups of several equations fused"
        );
        assert!(
            with_rows > 100,
            "only {with_rows} groups with a row operand"
        );
    }

    /// A copy of `t`'s values that nobody else holds, row- or column-major.
    fn fresh_copy(t: &Tensor, column_major: bool) -> Tensor {
        fn lay<T: Copy + num_traits::Zero>(a: &ArrayD<T>, f: bool) -> ArrayD<T> {
            let mut b = ArrayD::zeros(IxDyn(a.shape()).set_f(f));
            b.assign(a);
            b
        }
        match t.data().unwrap() {
            ArrayData::F32(a) => Tensor::from_array(lay(a, column_major)),
            ArrayData::F64(a) => Tensor::from_array(lay(a, column_major)),
            d => Tensor::from_data(d.clone()),
        }
    }

    fn bits(t: &Tensor) -> Vec<u64> {
        t.to_vec_f64()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    /// One plan called repeatedly: new arguments each call (fresh random
    /// values, copies nobody else holds, column-major copies, and outputs
    /// of the previous call fed back as arguments, as a recurrent state
    /// is); outputs held by the caller across calls must keep their values
    /// (a recycled buffer is never one the caller still holds), and every
    /// call matches the interpreter bit for bit.
    #[test]
    fn plan_repeated_calls_recycle_buffers_without_aliasing() {
        for seed in 0..200 {
            for dtype in [DType::F64, DType::F32] {
                let what = |call: usize| format!("seed {seed} {dtype} call {call}");
                let (g, mut args) = random_program(seed, dtype);
                let g = Arc::new(g);
                let plan = Plan::new(g.clone()).unwrap();
                let mut rng = StdRng::seed_from_u64(seed + 1000);
                let mut held: Vec<(Tensor, Vec<u64>)> = Vec::new();
                for call in 0..6 {
                    let want = g.eval(&args).unwrap();
                    let given: Vec<Tensor> = match call % 3 {
                        0 => args.clone(),
                        1 => args.iter().map(|t| fresh_copy(t, false)).collect(),
                        _ => args.iter().map(|t| fresh_copy(t, t.ndim() == 2)).collect(),
                    };
                    let got = plan.run(given).unwrap();
                    assert_same(&got, &want, &what(call));
                    if call == 3 {
                        // Dropped by the caller: recyclable from now on.
                        held.clear();
                    }
                    held.extend(got.iter().map(|t| (t.clone(), bits(t))));
                    for (t, b) in &held {
                        assert_eq!(&bits(t), b, "{}: a held output changed", what(call));
                    }
                    let in_avals = g.in_avals();
                    args = in_avals
                        .iter()
                        .map(|a| {
                            let back = got.iter().find(|t| t.aval() == *a);
                            match back {
                                Some(t) if rng.random_bool(0.6) => t.clone(),
                                _ => rand_tensor(&mut rng, a.shape(), dtype),
                            }
                        })
                        .collect();
                }
            }
        }
    }

    /// The data pointer of a float tensor.
    fn data_ptr(t: &Tensor) -> usize {
        match t.data().unwrap() {
            ArrayData::F32(a) => a.as_ptr() as usize,
            ArrayData::F64(a) => a.as_ptr() as usize,
            _ => panic!("float expected"),
        }
    }

    #[test]
    fn plan_reuses_a_buffer_once_the_caller_drops_it() {
        let a = Aval::new(&[4, 70], DType::F32);
        let g = trace(
            |x: &[Tensor]| Ok(vec![x[0].tanh()?.mul(&x[1])?.matmul(&x[1].t()?)?]),
            &[a.clone(), a],
        )
        .unwrap();
        let g = Arc::new(g);
        let plan = Plan::new(g.clone()).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut args = || -> Vec<Tensor> {
            (0..2)
                .map(|_| rand_tensor(&mut rng, &[4, 70], DType::F32))
                .collect()
        };
        let (a1, a2, a3) = (args(), args(), args());
        let y1 = plan.run(a1.clone()).unwrap();
        let p1 = data_ptr(&y1[0]);
        let handle1 = Arc::as_ptr(&y1[0].0) as usize;
        // Held: the next call writes elsewhere, and y1 keeps its values.
        let v1 = bits(&y1[0]);
        let y2 = plan.run(a2.clone()).unwrap();
        assert_ne!(data_ptr(&y2[0]), p1);
        assert_eq!(bits(&y1[0]), v1);
        assert_same(&y2, &g.eval(&a2).unwrap(), "second call");
        // Dropped: its buffer comes back (the matrix product writes into it).
        drop(y1);
        let y3 = plan.run(a3.clone()).unwrap();
        assert_eq!(data_ptr(&y3[0]), p1);
        // Kept whole: the value's handle itself comes back (no allocation,
        // no array rebuilt), as it has the new value's shape and order.
        assert_eq!(Arc::as_ptr(&y3[0].0) as usize, handle1);
        assert_same(&y3, &g.eval(&a3).unwrap(), "third call");
        // Against explicit loops in f64 (f32 rounding allowed).
        let (x0, x1) = (a3[0].to_vec_f64().unwrap(), a3[1].to_vec_f64().unwrap());
        let h: Vec<f64> = x0
            .iter()
            .zip(&x1)
            .map(|(p, q)| (*p as f32).tanh() as f64 * q)
            .collect();
        let got = y3[0].to_vec_f64().unwrap();
        for i in 0..4 {
            for j in 0..4 {
                let want: f64 = (0..70).map(|k| h[i * 70 + k] * x1[j * 70 + k]).sum();
                assert!(
                    (got[i * 4 + j] - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{i},{j}"
                );
            }
        }
    }

    #[test]
    fn plan_keeps_a_weights_panels_while_the_same_tensor_comes_back() {
        // `x @ w` and `tanh(..) @ v` read inputs on the right (panels kept);
        // `x @ (2 w)` an intermediate (packed on every call).
        let av = |s: &[usize]| Aval::new(s, DType::F32);
        let g = Arc::new(
            trace(
                |x: &[Tensor]| {
                    Ok(vec![
                        x[0].matmul(&x[1])?.tanh()?.matmul(&x[2])?,
                        x[0].matmul(&x[1].mul_scalar(2.0)?)?,
                    ])
                },
                &[av(&[16, 30]), av(&[30, 20]), av(&[20, 5])],
            )
            .unwrap(),
        );
        let plan = Plan::new(g.clone()).unwrap();
        let packs = || plan.pool.lock().unwrap().packs;
        let mut rng = StdRng::seed_from_u64(11);
        let mut w = rand_tensor(&mut rng, &[30, 20], DType::F32);
        let v = rand_tensor(&mut rng, &[20, 5], DType::F32);
        let mut run = |w: &Tensor, what: &str| {
            let x = rand_tensor(&mut rng, &[16, 30], DType::F32);
            let args = vec![x, w.clone(), v.clone()];
            let want = g.eval(&args).unwrap();
            assert_same(&plan.run(args).unwrap(), &want, what);
        };
        let per_call = usize::from(sgemm::available());
        for step in 0..3 {
            run(&w, &format!("call {step}"));
        }
        // w and v once, the intermediate every call.
        assert_eq!(packs(), per_call * (2 + 3));
        // A weight changed in place is another tensor (the plan's handle
        // made it copy): packed again, and the results follow it.
        w.add_scalar_in_place(0.5).unwrap();
        run(&w, "after an in-place change");
        assert_eq!(packs(), per_call * (2 + 3 + 2));
        // The same values in a new tensor: packed again too.
        let w2 = Tensor::from_data(w.data().unwrap().clone());
        run(&w2, "a fresh copy");
        assert_eq!(packs(), per_call * (2 + 3 + 2 + 2));
    }

    /// The kernels of a plan's equation steps, in order.
    fn kernels(p: &Plan) -> Vec<Kernel> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Eqn { kernel, .. } => Some(*kernel),
                Step::Fused(_) => None,
            })
            .collect()
    }

    #[test]
    fn plan_multiplies_by_a_weights_transpose_without_running_the_transpose() {
        // `d @ wᵀ` with `w` an input (a readout's backward pass): no
        // transpose step; the product packs `wᵀ` from `w` once while the
        // same tensor comes back, and gives the interpreter's bits.
        for dtype in [DType::F32, DType::F64] {
            let av = |s: &[usize]| Aval::new(s, dtype);
            let g = Arc::new(
                trace(
                    |x: &[Tensor]| Ok(vec![x[0].matmul(&x[1].t()?)?.tanh()?]),
                    &[av(&[16, 4]), av(&[37, 4])],
                )
                .unwrap(),
            );
            let plan = Plan::new(g.clone()).unwrap();
            assert_eq!(
                kernels(&plan),
                vec![Kernel::Matmul {
                    panels: Some(0),
                    transposed: true
                }],
                "{dtype}"
            );
            let packs = || plan.pool.lock().unwrap().packs;
            let mut rng = StdRng::seed_from_u64(12);
            let mut w = rand_tensor(&mut rng, &[37, 4], dtype);
            let mut run = |w: &Tensor, what: &str| {
                let d = rand_tensor(&mut rng, &[16, 4], dtype);
                let args = vec![d.clone(), w.clone()];
                let want = g.eval(&args).unwrap();
                let got = plan.run(args).unwrap();
                assert_same(&got, &want, what);
                // And against the definition, `Σ_k d[i][k] w[j][k]`.
                let (dv, wv) = (d.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
                let got = got[0].to_vec_f64().unwrap();
                for i in 0..16 {
                    for j in 0..37 {
                        let s: f64 = (0..4).map(|k| dv[i * 4 + k] * wv[j * 4 + k]).sum();
                        assert!((got[i * 37 + j] - s.tanh()).abs() < 1e-5, "{what} {i},{j}");
                    }
                }
            };
            let per_call = usize::from(dtype == DType::F32 && sgemm::available());
            for step in 0..3 {
                run(&w, &format!("{dtype} call {step}"));
            }
            assert_eq!(packs(), per_call, "{dtype}: packed once");
            w.add_scalar_in_place(0.5).unwrap();
            run(&w, &format!("{dtype} after an in-place change"));
            assert_eq!(
                packs(),
                2 * per_call,
                "{dtype}: a changed weight is packed again"
            );
        }
        // A transpose read twice, or of an intermediate, stays a step.
        let av = |s: &[usize]| Aval::new(s, DType::F32);
        let mut rng = StdRng::seed_from_u64(13);
        let d = rand_tensor(&mut rng, &[16, 4], DType::F32);
        let w = rand_tensor(&mut rng, &[37, 4], DType::F32);
        let twice = trace(
            |x: &[Tensor]| {
                let wt = x[1].t()?;
                Ok(vec![x[0].matmul(&wt)?, wt])
            },
            &[av(&[16, 4]), av(&[37, 4])],
        )
        .unwrap();
        let p = check(
            twice,
            &[d.clone(), w.clone()],
            "a transpose that is also a result",
        );
        assert!(kernels(&p).contains(&Kernel::Transpose));
        let inner = trace(
            |x: &[Tensor]| Ok(vec![x[0].matmul(&x[1].exp()?.t()?)?]),
            &[av(&[16, 4]), av(&[37, 4])],
        )
        .unwrap();
        let p = check(inner, &[d, w], "a transpose of an intermediate");
        assert!(kernels(&p).contains(&Kernel::Transpose));
    }

    #[test]
    fn plan_reshape_and_transpose_of_a_moved_unique_value_copy_nothing() {
        let g = trace(
            |x: &[Tensor]| Ok(vec![x[0].exp()?.reshape(&[6, 2])?.reshape(&[3, 4])?]),
            &[Aval::new(&[2, 6], DType::F64)],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(8);
        let x = rand_tensor(&mut rng, &[2, 6], DType::F64);
        let p = check(g, std::slice::from_ref(&x), "reshape");
        assert_eq!(kernels(&p), vec![Kernel::Reshape, Kernel::Reshape]);
        let y = p.run(vec![x.clone()]).unwrap();
        let want: Vec<f64> = x.to_vec_f64().unwrap().iter().map(|v| v.exp()).collect();
        assert_eq!(y[0].shape(), &[3, 4]);
        assert_eq!(y[0].to_vec_f64().unwrap(), want);
        // An argument nobody else holds is reshaped where it lies; a held
        // one is copied (and keeps its shape).
        let g = trace(
            |x: &[Tensor]| Ok(vec![x[0].reshape(&[12])?.reshape(&[4, 3])?]),
            &[Aval::new(&[2, 6], DType::F64)],
        )
        .unwrap();
        let p = Plan::new(Arc::new(g)).unwrap();
        let moved = fresh_copy(&x, false);
        let ptr = data_ptr(&moved);
        let y = p.run(vec![moved]).unwrap();
        assert_eq!(data_ptr(&y[0]), ptr);
        assert_eq!(y[0].to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
        let y = p.run(vec![x.clone()]).unwrap();
        assert_ne!(data_ptr(&y[0]), data_ptr(&x));
        assert_eq!((x.shape(), y[0].shape()), (&[2, 6][..], &[4, 3][..]));
        assert_eq!(y[0].to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
        // Likewise a transpose (strides permuted, as `eval` does).
        let g = trace(
            |x: &[Tensor]| Ok(vec![x[0].t()?]),
            &[Aval::new(&[2, 6], DType::F64)],
        )
        .unwrap();
        let p = Plan::new(Arc::new(g)).unwrap();
        let moved = fresh_copy(&x, false);
        let ptr = data_ptr(&moved);
        let y = p.run(vec![moved]).unwrap();
        assert_eq!(data_ptr(&y[0]), ptr);
        let y2 = p.run(vec![x.clone()]).unwrap();
        assert_ne!(data_ptr(&y2[0]), data_ptr(&x));
        let xv = x.to_vec_f64().unwrap();
        let want: Vec<f64> = (0..12).map(|k| xv[(k % 2) * 6 + k / 2]).collect();
        assert_eq!(y[0].to_vec_f64().unwrap(), want);
        assert_eq!(y2[0].to_vec_f64().unwrap(), want);
    }

    #[test]
    fn plan_fuses_a_chain_into_one_loop() {
        // Over two blocks, the last one partial.
        const { assert!(2 * 1300 > 2 * BLOCK && !(2 * 1300usize).is_multiple_of(BLOCK)) };
        let a = Aval::new(&[2, 1300], DType::F64);
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
            rand_tensor(&mut rng, &[2, 1300], DType::F64),
            rand_tensor(&mut rng, &[2, 1300], DType::F64),
        ];
        let p = check(g, &args, "chain");
        assert_eq!(fused_groups(&p), vec![5]);
        // Core ops run their block kernels directly.
        assert_eq!(
            fused_kinds(&p),
            vec![vec![
                OpKind::Binary(BinaryOp::Mul),
                OpKind::Unary(UnaryOp::Tanh),
                OpKind::Scalar(ScalarOp::Add, 1.0),
                OpKind::Unary(UnaryOp::Sigmoid),
                OpKind::Binary(BinaryOp::Mul),
            ]]
        );
        // Only the result is materialised; the chain runs in block buffers,
        // reused once dead (two are enough for a chain).
        let Step::Fused(f) = &p.steps[0] else {
            panic!("fused step expected")
        };
        assert_eq!(f.outputs.len(), 1);
        assert!(f.nbufs <= 3, "{} block buffers", f.nbufs);
    }

    /// The kinds of a plan's fused ops, group by group.
    fn fused_kinds(p: &Plan) -> Vec<Vec<OpKind>> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Fused(f) => Some(f.ops.iter().map(|o| o.kind).collect()),
                Step::Eqn { .. } => None,
            })
            .collect()
    }

    #[test]
    fn plan_folds_a_product_into_the_add_that_alone_reads_it() {
        // Over two blocks, the last one partial, f32 and f64: the bits of
        // the interpreter (the product is rounded before the sum).
        for dtype in [DType::F32, DType::F64] {
            let a = Aval::new(&[2, 1300], dtype);
            let g = trace(
                |x: &[Tensor]| {
                    let e = x[0].exp()?;
                    // Folded: `a·x1 + x2`, computed at the add: `a` is read
                    // after the product, and buffers are freed and taken
                    // before the add, but `a`'s must stay its own until then.
                    let a = x[0].tanh()?;
                    let t = a.mul(&x[1])?;
                    let between = a.neg()?.sigmoid()?.tanh()?;
                    let u = x[2].add(&t)?;
                    // Folded: `u·0.3 + between` (the scalar product on the
                    // right of the add).
                    let v = between.add(&u.mul_scalar(0.3)?)?;
                    // Not folded: the product is read twice.
                    let w = v.mul(&e)?;
                    let y = w.add(&x[0])?.add(&w)?;
                    // Not folded: the product is also a result.
                    let z = y.mul(&x[2])?;
                    Ok(vec![z.add(&e)?, z])
                },
                &[a.clone(), a.clone(), a],
            )
            .unwrap();
            let mut rng = StdRng::seed_from_u64(7);
            let args: Vec<Tensor> = (0..3)
                .map(|_| rand_tensor(&mut rng, &[2, 1300], dtype))
                .collect();
            let p = check(g, &args, "folded pairs");
            assert_eq!(fused_groups(&p), vec![14]);
            let kinds = &fused_kinds(&p)[0];
            assert_eq!(kinds.len(), 12, "{kinds:?}");
            assert_eq!(kinds.iter().filter(|k| **k == OpKind::MulAdd).count(), 1);
            assert!(kinds.contains(&OpKind::ScaleAdd(0.3)), "{kinds:?}");
        }
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
    fn plan_writes_results_on_cache_line_boundaries() {
        // Every buffer the plan writes a result into starts on a 64-byte
        // boundary, fresh or recycled: a concatenation, products (the
        // f32 kernel and matrixmultiply in f64), a fused loop's two
        // results (row- and column-major). malloc aligns to 16 bytes, so
        // without the slack most of these start elsewhere.
        for dtype in [DType::F32, DType::F64] {
            let (x, w) = (Aval::new(&[6, 40], dtype), Aval::new(&[80, 48], dtype));
            let g = trace(
                |a: &[Tensor]| {
                    let xx = crate::ops::shape::concat(&[a[0].clone(), a[0].clone()], 1)?;
                    let y = xx.matmul(&a[1])?;
                    let h = y.tanh()?.mul(&y)?;
                    let c = crate::ops::shape::concat(&[a[0].t()?, a[0].t()?], 0)?;
                    Ok(vec![h.add_scalar(1.0)?, h, c.mul_scalar(2.0)?, xx])
                },
                &[x.clone(), w.clone()],
            )
            .unwrap();
            let mut rng = StdRng::seed_from_u64(5);
            let args = vec![
                rand_tensor(&mut rng, &[6, 40], dtype),
                rand_tensor(&mut rng, &[80, 48], dtype),
            ];
            let g = Arc::new(g);
            let plan = Plan::new(g.clone()).unwrap();
            for call in 0..3 {
                let outs = plan.run(args.clone()).unwrap();
                assert_same(&outs, &g.eval(&args).unwrap(), "aligned");
                for (k, t) in outs.iter().enumerate() {
                    assert_eq!(data_ptr(t) % 64, 0, "{dtype:?} call {call} output {k}");
                }
            }
        }
        // Block buffers: the block starts on a boundary and fits.
        for n in [BLOCK + ALIGN_SLACK, BLOCK + 3] {
            for _ in 0..8 {
                let v = vec![0f32; n];
                let at = aligned(&v);
                assert!(at + BLOCK <= v.len());
                if n == BLOCK + ALIGN_SLACK {
                    assert_eq!(v[at..].as_ptr() as usize % 64, 0);
                }
                let w = vec![0f64; n];
                assert!(aligned(&w) + BLOCK <= w.len());
            }
        }
    }

    #[test]
    fn plan_sums_to_one_value_in_evals_order() {
        // Values of very different sizes: another order of the additions
        // gives other bits. Shapes around the short runs (2, 3..=7) and the
        // eight partial sums, with unit axes, one element, none; operands
        // row-major and column-major (a transpose's result).
        let mut rng = StdRng::seed_from_u64(17);
        let shapes: [&[usize]; 10] = [
            &[1],
            &[2],
            &[5],
            &[7],
            &[8],
            &[37, 3],
            &[4, 1, 5],
            &[1, 1],
            &[0, 3],
            &[9, 13],
        ];
        for dtype in [DType::F64, DType::F32] {
            for shape in shapes {
                let n: usize = shape.iter().product();
                let v: Vec<f64> = (0..n)
                    .map(|i| rng.random_range(-1.0..1.0) * 10f64.powi((i % 9) as i32 - 4))
                    .collect();
                let x = Tensor::from_vec(v, shape).unwrap().cast(dtype).unwrap();
                let aval = x.aval();
                let g = trace(
                    |a: &[Tensor]| {
                        let t = a[0].transpose(&(0..a[0].ndim()).rev().collect::<Vec<_>>())?;
                        // Every axis; and every axis but the unit ones of a
                        // column-major operand.
                        let keep: Vec<usize> =
                            (0..t.ndim()).filter(|&k| t.shape()[k] != 1).collect();
                        Ok(vec![a[0].sum_all()?, t.exp()?.sum(&keep)?.mul_scalar(2.0)?])
                    },
                    std::slice::from_ref(&aval),
                )
                .unwrap();
                let what = format!("{dtype} {shape:?}");
                let p = check(g, std::slice::from_ref(&x), &what);
                // (A sum over no axes is no equation.)
                let want = 1 + usize::from(shape.iter().any(|&d| d != 1));
                let sums = kernels(&p).iter().filter(|k| **k == Kernel::SumAll).count();
                assert_eq!(sums, want, "{what}: the sums planned");
            }
        }
        // A single -0.0 stays -0.0 (as `eval` copies it), not 0 + -0.
        let x = Tensor::from_vec(vec![-0.0], &[1]).unwrap();
        let g = trace(|a: &[Tensor]| Ok(vec![a[0].sum_all()?]), &[x.aval()]).unwrap();
        let p = check(g, std::slice::from_ref(&x), "-0");
        assert!(p.run(vec![x]).unwrap()[0].to_vec_f64().unwrap()[0].is_sign_negative());
    }

    #[test]
    fn plan_concatenates_into_recycled_buffers() {
        // Joins along the last, a middle and the first axis, a stack of one
        // element per row, and a transposed (column-major) operand; every
        // join is read by an add, so its buffer goes back to the pool and
        // the next call writes over the last call's values.
        for dtype in [DType::F64, DType::F32] {
            let (a, b) = (Aval::new(&[2, 3, 4], dtype), Aval::new(&[2, 3, 1], dtype));
            let m = Aval::new(&[4, 3], dtype);
            let g = trace(
                |x: &[Tensor]| {
                    let last =
                        crate::ops::shape::concat(&[x[0].clone(), x[1].clone(), x[0].clone()], 2)?;
                    let mid = crate::ops::shape::concat(&[x[0].clone(), x[0].clone()], 1)?;
                    let first = crate::ops::shape::concat(&[x[0].clone(), x[0].clone()], 0)?;
                    let stack = crate::ops::shape::concat(&[x[1].clone(), x[1].clone()], 2)?;
                    let t = crate::ops::shape::concat(&[x[2].t()?, x[2].t()?], 0)?;
                    Ok(vec![
                        last.add_scalar(1.0)?,
                        mid.add_scalar(1.0)?,
                        first.add_scalar(1.0)?,
                        stack.add_scalar(1.0)?,
                        t.add_scalar(1.0)?,
                    ])
                },
                &[a.clone(), b.clone(), m.clone()],
            )
            .unwrap();
            let arg = |shape: &[usize], k: f64| {
                let n: usize = shape.iter().product();
                Tensor::from_vec((0..n).map(|i| k * i as f64).collect(), shape)
                    .unwrap()
                    .cast(dtype)
                    .unwrap()
            };
            let g = Arc::new(g);
            let plan = Plan::new(g.clone()).unwrap();
            let planned = plan
                .steps
                .iter()
                .filter(|s| {
                    matches!(
                        s,
                        Step::Eqn {
                            kernel: Kernel::Concat { .. },
                            ..
                        }
                    )
                })
                .count();
            assert_eq!(planned, 5, "every join runs in the plan");
            for k in [1.0, -3.0, 0.5] {
                let args = vec![
                    arg(&[2, 3, 4], k),
                    arg(&[2, 3, 1], 100.0 * k),
                    arg(&[4, 3], k),
                ];
                let got = plan.run(args.clone()).unwrap();
                assert_same(&got, &g.eval(&args).unwrap(), "concat");
                // By hand: row (i, j) of the last-axis join is x0[i, j, :],
                // x1[i, j, 0], x0[i, j, :], plus one.
                let v = got[0].to_vec_f64().unwrap();
                let (i, j) = (1, 2);
                let row = &v[(i * 3 + j) * 9..(i * 3 + j + 1) * 9];
                let x0 = |c: usize| k * ((i * 3 + j) * 4 + c) as f64 + 1.0;
                let want = [
                    x0(0),
                    x0(1),
                    x0(2),
                    x0(3),
                    100.0 * k * (i * 3 + j) as f64 + 1.0,
                ];
                assert_eq!(&row[..5], &want);
                // The transposed operand: element (1, 1) of x2ᵀ is x2[1, 1],
                // the fourth element of x2 (row-major, 3 columns).
                let t = got[4].to_vec_f64().unwrap();
                assert_eq!(t[4 + 1], k * 4.0 + 1.0);
            }
        }
    }

    #[test]
    fn plan_scalar_operands_broadcast() {
        let g = trace(
            |x: &[Tensor]| {
                let y = binary(BinaryOp::Mul, &x[0], &x[1])?;
                Ok(vec![binary(BinaryOp::Sub, &x[1], &y)?.exp()?])
            },
            &[Aval::new(&[2600], DType::F64), Aval::new(&[], DType::F64)],
        )
        .unwrap();
        const { assert!(2600 > 2 * BLOCK) };
        let mut rng = StdRng::seed_from_u64(3);
        let x = rand_tensor(&mut rng, &[2600], DType::F64);
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

    /// The stride-slice `order_of` agrees with ndarray's own layout checks
    /// (row-major: `is_standard_layout`; column-major: the reversed view's),
    /// and `elements` returns every element in the asked order, on row- and
    /// column-major, sliced (keeping their strides, length-1 axes
    /// included), permuted and empty arrays.
    #[test]
    fn order_of_agrees_with_ndarray_and_elements_walk_in_order() {
        use ndarray::{s, ShapeBuilder, SliceInfoElem};
        let base = ArrayD::from_shape_fn(IxDyn(&[3, 4, 5]), |ix| {
            (ix[0] * 100 + ix[1] * 10 + ix[2]) as f64
        });
        let f = ArrayD::from_shape_vec(IxDyn(&[3, 4, 5]).f(), base.t().iter().copied().collect())
            .unwrap();
        let cut = |a: &ArrayD<f64>, info: &[SliceInfoElem]| {
            let mut a = a.clone();
            a.slice_collapse(info);
            a
        };
        let cases = [
            base.clone(),
            f.clone(),
            cut(&base, s![.., 1..3, ..].as_ref()),
            cut(&base, s![.., 1..2, ..].as_ref()),
            cut(&base, s![..;2, .., 3..4].as_ref()),
            cut(&base, s![1..2, .., ..].as_ref()),
            cut(&base, s![1..2, 2..3, 3..4].as_ref()),
            cut(&f, s![.., .., 2..3].as_ref()),
            cut(&f, s![.., 1..3, ..].as_ref()),
            base.clone().permuted_axes(vec![1, 0, 2]),
            base.clone().permuted_axes(vec![2, 1, 0]),
            ArrayD::zeros(IxDyn(&[0, 3])),
            ArrayD::zeros(IxDyn(&[1, 1])),
        ];
        let mut seen = [0; 3];
        for a in &cases {
            let want = if a.is_standard_layout() {
                Some(Order::C)
            } else if a.view().reversed_axes().is_standard_layout() {
                Some(Order::F)
            } else {
                None
            };
            seen[want.map_or(2, |o| o as usize)] += 1;
            let got = order_of(a);
            assert_eq!(got, want, "{:?} strides {:?}", a.shape(), a.strides());
            let row: Vec<f64> = a.iter().copied().collect();
            let col: Vec<f64> = a.t().iter().copied().collect();
            assert_eq!(
                elements(a, Order::C).as_ref(),
                &row[..],
                "{:?}",
                a.strides()
            );
            assert_eq!(
                elements(a, Order::F).as_ref(),
                &col[..],
                "{:?}",
                a.strides()
            );
        }
        // Every kind of answer was checked.
        assert!(seen.iter().all(|&n| n >= 2), "{seen:?}");
    }

    /// An array of `shape` with values drawn uniformly from `[-1, 1)`.
    fn random_array(rng: &mut StdRng, shape: &[usize]) -> ArrayD<f64> {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    #[test]
    fn plan_non_contiguous_and_column_major_operands() {
        use ndarray::s;
        let mut rng = StdRng::seed_from_u64(5);
        let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
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

    #[test]
    fn plan_row_operands_broadcast_in_either_order() {
        let mut rng = StdRng::seed_from_u64(9);
        let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
        // Row-major and column-major loops (2-D over 300 elements: blocks
        // that end inside a row), and a 3-D loop with a 2-D trailing row.
        for column_major in [false, true] {
            let lay = |a: ArrayD<f64>| {
                if column_major {
                    Tensor::from_array(
                        a.reversed_axes()
                            .as_standard_layout()
                            .reversed_axes()
                            .to_owned(),
                    )
                } else {
                    Tensor::from_array(a)
                }
            };
            // Both loops over more than one block, a block ending mid-row.
            const { assert!(100 * 15 > BLOCK && 17 * 3 * 40 > BLOCK && !BLOCK.is_multiple_of(15)) };
            let (x, y) = (lay(arr(&[100, 15])), lay(arr(&[100, 15])));
            let row = Tensor::from_array(arr(&[15]));
            let (z, row2) = (lay(arr(&[17, 3, 40])), Tensor::from_array(arr(&[3, 40])));
            let args = vec![x.clone(), y.clone(), row.clone(), z.clone(), row2.clone()];
            let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
            let g = trace(
                |a: &[Tensor]| {
                    let h = a[0].add(&a[2])?.tanh()?.mul(&a[1])?;
                    let k = binary(BinaryOp::Sub, &a[4], &a[3])?.exp()?;
                    Ok(vec![h, k])
                },
                &avals,
            )
            .unwrap();
            let p = check(g, &args, "rows");
            assert_eq!(fused_groups(&p), vec![3, 2]);
            let got = p.run(args).unwrap();
            for t in &got {
                let ArrayData::F64(a) = t.data().unwrap() else {
                    panic!("f64 expected")
                };
                assert_eq!(!a.is_standard_layout(), column_major, "the loop's order");
            }
            let (xa, ya, ra) = (
                x.to_array_f64().unwrap(),
                y.to_array_f64().unwrap(),
                row.to_array_f64().unwrap(),
            );
            let (za, r2) = (z.to_array_f64().unwrap(), row2.to_array_f64().unwrap());
            let h = got[0].to_array_f64().unwrap();
            for i in 0..100 {
                for j in 0..15 {
                    let want = (xa[[i, j]] + ra[[j]]).tanh() * ya[[i, j]];
                    assert_eq!(h[[i, j]], want, "{column_major} h[{i},{j}]");
                }
            }
            let k = got[1].to_array_f64().unwrap();
            for i in 0..17 {
                for j in 0..3 {
                    for l in 0..40 {
                        let want = (r2[[j, l]] - za[[i, j, l]]).exp();
                        assert_eq!(k[[i, j, l]], want, "{column_major} k[{i},{j},{l}]");
                    }
                }
            }
        }
    }

    /// Under `keep_awake` on a pool of several threads a long fused loop
    /// runs in parts of whole blocks, one per thread, each with its own
    /// block buffers: the same bits as on one thread, for row-major and
    /// column-major loops, with row and scalar operands, and lengths that
    /// end inside a block.
    #[test]
    fn plan_splits_long_loops_across_threads_with_the_same_bits() {
        let mut rng = StdRng::seed_from_u64(21);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for (rows, cols) in [(97, 131), (64, 128), (200, 41)] {
            const { assert!(64 * 128 >= PAR_MIN_ELEMS_AWAKE) };
            for column_major in [false, true] {
                for dtype in [DType::F64, DType::F32] {
                    let what = format!("{rows}x{cols} {dtype} column-major {column_major}");
                    let mut arr = |shape: &[usize]| {
                        let t = Tensor::from_array(random_array(&mut rng, shape))
                            .cast(dtype)
                            .unwrap();
                        if column_major && shape.len() == 2 {
                            fresh_copy(&t, true)
                        } else {
                            t
                        }
                    };
                    let args = vec![
                        arr(&[rows, cols]),
                        arr(&[rows, cols]),
                        arr(&[cols]),
                        arr(&[]),
                    ];
                    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
                    let g = trace(
                        |a: &[Tensor]| {
                            let h = a[0].add(&a[2])?.tanh()?.mul(&a[1])?;
                            let k = h.mul(&a[3])?.sub(&a[0])?.exp()?;
                            Ok(vec![h, k])
                        },
                        &avals,
                    )
                    .unwrap();
                    let p = check(g, &args, &what);
                    assert_eq!(fused_groups(&p), vec![6], "{what}");
                    let before = SPLITS.load(Ordering::Relaxed);
                    let split = pool
                        .install(|| crate::threads::keep_awake(|| p.run(args.clone()).unwrap()));
                    assert!(SPLITS.load(Ordering::Relaxed) > before, "{what}: not split");
                    let one = p.run(args.clone()).unwrap();
                    assert_same(&split, &one, &what);
                }
            }
        }
    }

    /// `fill_row` gives each element of the block its row element by the
    /// definition (row-major: `p % n`; column-major: `p / (size / n)`),
    /// for rows shorter and longer than the block and blocks starting at
    /// every phase.
    #[test]
    fn fill_row_is_the_broadcast_by_index() {
        for n in [1usize, 3, 4, 7, 16, 40] {
            let row: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
            let size = n * 13;
            for start in [0, 1, 2, n.saturating_sub(1), n, n + 5, 3 * n + 1] {
                for len in [1, 2, n, n + 1, 2 * n + 3, 5 * n, size - start.min(size)] {
                    let len = len.min(size - start);
                    let mut got = vec![f64::NAN; len];
                    fill_row(&mut got, &row, start, size, Order::C);
                    let want: Vec<f64> = (start..start + len).map(|p| row[p % n]).collect();
                    assert_eq!(got, want, "C: n {n}, start {start}, len {len}");
                    let mut got = vec![f64::NAN; len];
                    fill_row(&mut got, &row, start, size, Order::F);
                    let want: Vec<f64> = (start..start + len).map(|p| row[p / 13]).collect();
                    assert_eq!(got, want, "F: n {n}, start {start}, len {len}");
                }
            }
        }
    }

    #[test]
    fn plan_row_operands_of_several_lengths() {
        // Rows longer than a block (filled block by block), and rows of 8
        // and 24 elements (filled once, for blocks of 1008 elements), in
        // row-major loops of several blocks.
        let mut rng = StdRng::seed_from_u64(11);
        let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
        for (l, m, n) in [(3, 1, 1100), (50, 3, 8)] {
            assert!(l * m * n > BLOCK);
            let x = Tensor::from_array(arr(&[l, m, n]));
            let r1 = Tensor::from_array(arr(&[n]));
            let r2 = Tensor::from_array(arr(&[m, n]));
            let args = vec![x.clone(), r1.clone(), r2.clone()];
            let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
            let g = trace(
                |a: &[Tensor]| Ok(vec![a[0].add(&a[1])?.mul(&a[2])?.tanh()?]),
                &avals,
            )
            .unwrap();
            let p = check(g, &args, "rows of several lengths");
            let got = p.run(args).unwrap()[0].to_array_f64().unwrap();
            let (xa, ra, rb) = (
                x.to_array_f64().unwrap(),
                r1.to_array_f64().unwrap(),
                r2.to_array_f64().unwrap(),
            );
            for i in 0..l {
                for j in 0..m {
                    for k in 0..n {
                        let want = ((xa[[i, j, k]] + ra[[k]]) * rb[[j, k]]).tanh();
                        assert_eq!(got[[i, j, k]], want, "({l}, {m}, {n}) [{i},{j},{k}]");
                    }
                }
            }
        }
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
