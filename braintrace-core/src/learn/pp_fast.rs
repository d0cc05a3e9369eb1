//! pp_prop's weight gradients for dense relations, accumulated by the
//! learner over chunks of steps.
//!
//! For a relation whose primitive declares a dense trace kernel
//! ([`TraceKernel::Dense`](crate::etp::TraceKernel::Dense))
//! (`y = x @ W + b`, or an element-wise weight), `xy_to_dw` of one step is
//! `∇W = x̄ᵀ g` and `∇b = Σ_rows g`, where `x̄` is the input trace `(rows, I)`
//! and `g` the step's summed learning signal `(rows, O)` (rows: the batch).
//! Summed over the steps of an `etrace_grad` call, these are one matrix
//! product with the steps' rows stacked: `∇W = [x̄_1; …; x̄_T]ᵀ [g_1; …; g_T]`.
//! The learner keeps the rows of a chunk of steps ([`pp_chunk_rows`]) and
//! runs one product per chunk, into the gradient: at a hidden size of 128
//! and batch 16 that replaces a `144×16 · 16×128` product, a fresh
//! `144×128` gradient and its addition per step with a `144×128 · 128×128`
//! product every 8 steps. Where a chunk would hold at most two steps
//! (hidden 128, batch 64), each step's product runs on the step's own rows
//! instead, with nothing copied.
//!
//! With an element-wise weight or bias transform `f`, each step's term is
//! multiplied by `f'(W)`; `W` is constant within a call, so the learner
//! multiplies the call's sum once.
//!
//! The same sums as the rules, added in another order; a test checks the
//! two paths against each other in f64.
//!

use super::Relation;
use crate::error::{Error, Result};
use crate::etp::{ElemFn, Role};
use crate::kernels::sgemm;
use crate::tensor::{assign, copy_blocks, ArrayData, Aval, DType, Tensor};
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewMutD, Axis, IxDyn, LinalgScalar};
use std::collections::BTreeMap;

/// How many rows (steps × batch) pp_prop gathers for a dense relation with
/// `inputs` inputs and `outputs` outputs before it runs the chunk's weight
/// gradient product `x̄ᵀ g`, when each step adds `batch_rows` rows.
///
/// Each product reads and writes the `I×O` gradient once, and the chunk
/// holds `K·(I + O)` elements; `K = 2·I·O / (I + O)` makes the two equal.
/// A shorter chunk pays the gradient's traffic more often; a longer one
/// pushes the weights out of the cache between steps. Measured with
/// `bench_learn` (GRU, pp_prop, one thread, runs interleaved), against the
/// 256 rows used before: hidden 128, batch 16 and 64, 128 rows 6–10%
/// faster; hidden 512, batch 16, 512 rows 10% faster. `K` is kept within
/// 64..=512 rows (memory: `K·(I + O)` elements per relation), rounded down
/// to whole steps, and is at least one step.
pub fn pp_chunk_rows(inputs: usize, outputs: usize, batch_rows: usize) -> usize {
    let (i, o) = (inputs.max(1), outputs.max(1));
    let k = (2 * i * o / (i + o)).clamp(64, 512);
    let b = batch_rows.max(1);
    b * (k / b).max(1)
}

/// The element-wise transform of trainable `name` as the relation's
/// declared dense [`TraceKernel`] names it: `Some(None)` without one,
/// `None` when the kernel does not name the trainable or its param is
/// unreadable (the rules then run).
pub(crate) fn transform_of(r: &Relation, name: &str) -> Option<Option<ElemFn>> {
    let k = r.primitive.trace_kernel(&r.params)?;
    super::fast::scale_fn(&k, &k.role(name)?, &r.params).ok()
}

/// Whether trainable `name`'s gradient is `x̄ᵀ g` (the dense kernel's
/// weight, with an input) rather than `Σ_rows g`.
pub(crate) fn has_input(r: &Relation, name: &str) -> bool {
    r.x_var.is_some()
        && r.primitive
            .trace_kernel(&r.params)
            .is_some_and(|k| k.role(name) == Some(Role::Weight))
}

/// Whether every trainable's transform is readable.
pub(crate) fn transforms_readable(r: &Relation, names: &[&str]) -> bool {
    names.iter().all(|n| transform_of(r, n).is_some())
}

/// Whether the shapes of a relation fit: `weight (I, O)` with an input
/// `x (*lead, I)` over the hidden group `(*lead, O)`, every other trainable
/// (a bias, or the weight of a primitive without input) `(O,)`.
pub(crate) fn shapes_fit(
    r: &Relation,
    x: Option<&Aval>,
    vs: &[usize],
    weights: &BTreeMap<String, Aval>,
) -> bool {
    let Some((&o, lead)) = vs.split_last() else {
        return false;
    };
    !weights.is_empty()
        && weights
            .iter()
            .all(|(k, w)| match x.filter(|_| has_input(r, k)) {
                Some(x) => match x.shape().split_last() {
                    Some((&i, xlead)) => xlead == lead && w.shape() == [i, o],
                    None => false,
                },
                None => w.shape() == [o],
            })
}

/// One trainable of a relation: the model parameter it feeds, whether
/// its gradient is `x̄ᵀ g` (`weight` with an input) or `Σ_rows g`, and its
/// element-wise transform `f` (the gradient is then multiplied by `f'(W)`,
/// once per call: `W` does not change within an `etrace_grad` call).
#[derive(Clone, Debug)]
pub(crate) struct Leaf {
    pub param: usize,
    pub has_input: bool,
    pub transform: Option<ElemFn>,
}

/// A product's signal rows `g`: row-major, or in column panels of 16 at a
/// stride (see [`Acc::put_rows`]).
#[derive(Clone, Copy)]
enum Signal<'a, T> {
    Rows(&'a [T]),
    Panels(&'a [T], usize),
}

/// The rows of one relation's chunk and its gradients so far.
struct Acc<T> {
    i: usize,
    o: usize,
    cap: usize,
    n: usize,
    /// Whether each step's product runs on the step's own rows (see
    /// [`Acc::push`]) instead of gathering a chunk.
    direct: bool,
    x: Vec<T>,
    /// The chunk's signal rows: row-major `(cap, O)`, or, where
    /// [`ChunkProduct::panels`] says so, column panels of 16 of `cap`
    /// rows each (the product kernel's layout; see [`Acc::put_rows`]).
    g: Vec<T>,
    packed: bool,
    /// Per leaf: `(I, O)` or `(1, O)`.
    grads: Vec<Array2<T>>,
}

/// The chunk product `∇W += x̄ᵀ g`, in place: in f32
/// [`sgemm::add_product`] (the crate's kernel for small chunks, nothing
/// packed or allocated), in f64 `matrixmultiply`.
trait ChunkProduct: LinalgScalar + Send + Sync {
    fn add_product(a: &ArrayView2<'_, Self>, b: &ArrayView2<'_, Self>, c: &mut Array2<Self>) {
        general_mat_mul(Self::one(), a, b, Self::one(), c);
    }

    /// Whether a chunk of signal rows `O` wide is kept as column panels
    /// of 16 for [`ChunkProduct::add_panels`].
    fn panels(_o: usize) -> bool {
        false
    }

    /// `c += a @ B`, `B` `(k, O)` in column panels of 16 at a stride of
    /// `stride` elements (only where [`ChunkProduct::panels`]).
    fn add_panels(_a: &ArrayView2<'_, Self>, _b: &[Self], _stride: usize, _c: &mut Array2<Self>) {
        unreachable!("only chunks that ChunkProduct::panels accepts are kept in panels")
    }

    /// `sum += Σ_rows g` (`sum` `(1, O)`), one addition per row in row
    /// order.
    fn add_rows(g: &ArrayView2<'_, Self>, sum: &mut Array2<Self>) {
        add_rows_in_turn(g, sum)
    }
}

/// [`ChunkProduct::add_rows`] by a loop over `g`'s rows.
fn add_rows_in_turn<T: LinalgScalar>(g: &ArrayView2<'_, T>, sum: &mut Array2<T>) {
    let mut row = sum.row_mut(0);
    for r in g.axis_iter(Axis(0)) {
        row.zip_mut_with(&r, |a, &b| *a = *a + b);
    }
}

impl ChunkProduct for f64 {}

impl ChunkProduct for f32 {
    fn add_product(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>, c: &mut Array2<f32>) {
        sgemm::add_product(a, b, c)
    }

    /// Where the crate's kernel runs `O` columns ([`sgemm::gemm_acc_panels`]:
    /// a multiple of 16): each panel's rows are then read one after
    /// another, not 4·O bytes apart (GRU pp_prop at hidden 512: 9–15%
    /// faster gradient products). The same bits as the rows in place.
    fn panels(o: usize) -> bool {
        o.is_multiple_of(16) && o > 0 && sgemm::available()
    }

    fn add_panels(a: &ArrayView2<'_, f32>, b: &[f32], stride: usize, c: &mut Array2<f32>) {
        let n = c.ncols();
        let c = c
            .as_slice_mut()
            .expect("the learner's gradients are row-major");
        sgemm::gemm_acc_panels(a, b, n, stride, c)
    }

    /// As the product `1ᵀ g` on the crate's kernel where it applies: a
    /// multiply-add by one per row, in row order, is the addition's
    /// rounding (the same bits), without a loop over `ndarray` rows per
    /// step (GRU pp_prop 128×64: 64 rows of 128, about 1 µs a step).
    fn add_rows(g: &ArrayView2<'_, f32>, sum: &mut Array2<f32>) {
        let one = [1f32];
        let one = ArrayView2::from_shape((1, 1), &one[..]).expect("one element");
        let ones = one.broadcast((1, g.nrows())).expect("a row of ones");
        if sgemm::acc_applies(&ones, g) {
            if let Some(c) = sum.as_slice_mut() {
                return sgemm::gemm_acc(&ones, g, c);
            }
        }
        add_rows_in_turn(g, sum)
    }
}

impl<T: ChunkProduct> Acc<T> {
    fn new(leaves: &[Leaf], i: usize, o: usize, rows: usize) -> Self {
        let cap = pp_chunk_rows(i, o, rows);
        let needs_x = leaves.iter().any(|l| l.has_input);
        // A chunk of at most two steps saves little over a product per
        // step, and the copies into it cost more (GRU pp_prop, hidden 128,
        // batch 64: 207 KB a step).
        let direct = cap < 3 * rows;
        Acc {
            i,
            o,
            cap,
            n: 0,
            direct,
            packed: T::panels(o),
            x: if needs_x {
                vec![T::zero(); cap * i]
            } else {
                Vec::new()
            },
            g: vec![T::zero(); cap * o],
            grads: leaves
                .iter()
                .map(|l| Array2::zeros((if l.has_input { i } else { 1 }, o)))
                .collect(),
        }
    }

    /// Add a step's rows: into the chunk (its product runs when the
    /// chunk is full), or, for a [`direct`](Acc::direct) accumulator whose
    /// operands lie in row-major order, straight into the gradients. The
    /// same products either way: each element of `∇W` gets one more term
    /// per row, in row order (with the crate's kernel, one fused
    /// multiply-add each, so the same bits).
    fn push(&mut self, leaves: &[Leaf], x: Option<&ArrayD<T>>, g: &ArrayD<T>) {
        let rows = g.len() / self.o.max(1);
        if self.direct && self.n == 0 {
            let x = match x.filter(|_| !self.x.is_empty()) {
                Some(x) => x.as_slice().map(Some),
                None => Some(None),
            };
            if let (Some(x), Some(g)) = (x, g.as_slice()) {
                self.product(leaves, x, Signal::Rows(g), rows);
                return;
            }
        }
        if self.n + rows > self.cap {
            self.flush(leaves);
        }
        let (n, i) = (self.n, self.i);
        let chunk = Chunk {
            n,
            o: self.o,
            cap: self.cap,
            packed: self.packed,
        };
        let (gs, xs) = (&mut self.g, &mut self.x);
        let put_x = |xs: &mut Vec<T>| {
            if let Some(x) = x.filter(|_| !xs.is_empty()) {
                copy_rows(x, &mut xs[n * i..(n + rows) * i]);
            }
        };
        // The two stores are memory-bound (a chunk is larger than the
        // second-level cache): under `keep_awake` the pool's other thread
        // takes the inputs' rows.
        let min =
            crate::threads::split_threshold(PAR_MIN_STORE_ELEMS_AWAKE, usize::MAX, usize::MAX);
        if rows * chunk.o >= min && !xs.is_empty() && rayon::current_num_threads() > 1 {
            rayon::join(|| chunk.put_rows(gs, g, rows), || put_x(xs));
        } else {
            chunk.put_rows(gs, g, rows);
            put_x(xs);
        }
        self.n += rows;
    }

    fn flush(&mut self, leaves: &[Leaf]) {
        let n = self.n;
        if n == 0 {
            return;
        }
        let (x, g) = (std::mem::take(&mut self.x), std::mem::take(&mut self.g));
        let xs = (!x.is_empty()).then(|| &x[..n * self.i]);
        let signal = if self.packed {
            Signal::Panels(&g, 16 * self.cap)
        } else {
            Signal::Rows(&g[..n * self.o])
        };
        self.product(leaves, xs, signal, n);
        (self.x, self.g) = (x, g);
        self.n = 0;
    }

    /// `∇W += x̄ᵀ g` (and `∇b += Σ_rows g`) over `n` rows of `x` `(n, I)`
    /// (`None` without an input, row-major) and `g` `(n, O)`: row-major,
    /// or the chunk's panels.
    fn product(&mut self, leaves: &[Leaf], x: Option<&[T]>, g: Signal<'_, T>, n: usize) {
        let one = [T::one()];
        let one = ArrayView2::from_shape((1, 1), &one[..]).expect("one element");
        let ones = one.broadcast((1, n)).expect("a row of ones");
        for (leaf, grad) in leaves.iter().zip(&mut self.grads) {
            let x = leaf.has_input.then(|| {
                let x = x.expect("a relation with an input keeps x̄");
                ArrayView2::from_shape((n, self.i), x).expect("rows")
            });
            match (x, g) {
                (Some(x), Signal::Rows(g)) => {
                    let g = ArrayView2::from_shape((n, self.o), g).expect("rows");
                    T::add_product(&x.t(), &g, grad)
                }
                (None, Signal::Rows(g)) => {
                    let g = ArrayView2::from_shape((n, self.o), g).expect("rows");
                    T::add_rows(&g, grad)
                }
                (Some(x), Signal::Panels(g, stride)) => T::add_panels(&x.t(), g, stride, grad),
                // A multiply-add by one per row, in row order: the
                // addition's rounding.
                (None, Signal::Panels(g, stride)) => T::add_panels(&ones, g, stride, grad),
            }
        }
    }

    fn take(&mut self, leaves: &[Leaf]) -> Vec<ArrayD<T>> {
        self.flush(leaves);
        leaves
            .iter()
            .zip(&mut self.grads)
            .map(|(leaf, grad)| {
                let fresh = Array2::zeros(grad.dim());
                let g = std::mem::replace(grad, fresh);
                if leaf.has_input {
                    g.into_dyn()
                } else {
                    g.into_shape_with_order(IxDyn(&[self.o])).expect("one row")
                }
            })
            .collect()
    }
}

/// Where a step's signal rows go in a chunk of `cap` rows that holds `n`
/// (see [`Chunk::put_rows`]).
#[derive(Clone, Copy)]
struct Chunk {
    n: usize,
    o: usize,
    cap: usize,
    packed: bool,
}

/// Elements of a step's signal rows from which its stores into the chunk
/// are shared with the pool's other thread under `keep_awake`.
const PAR_MIN_STORE_ELEMS_AWAKE: usize = 1 << 13;

impl Chunk {
    /// `g`'s `rows` rows (in row-major order) into `buf` after its `n`
    /// rows: row-major, or as the rows `n..n + rows` of each 16-column
    /// panel (panel `p` starts at `p·16·cap`).
    fn put_rows<T: Copy + num_traits::Zero>(self, buf: &mut [T], g: &ArrayD<T>, rows: usize) {
        let (n, o) = (self.n, self.o);
        if !self.packed {
            return copy_rows(g, &mut buf[n * o..(n + rows) * o]);
        }
        let stride = 16 * self.cap;
        let g2 = g
            .view()
            .into_shape_with_order(((rows, o), ndarray::Order::RowMajor));
        match g2 {
            Ok(g2) => match g2.as_slice() {
                // Panel by panel, its new rows written one after another
                // (rows outer wrote 64 bytes in each panel in turn, twice
                // as slow as a plain copy of the rows).
                Some(src) => {
                    for (p, panel) in buf.chunks_exact_mut(stride).enumerate() {
                        let dst = &mut panel[16 * n..16 * (n + rows)];
                        for (r, d) in dst.chunks_exact_mut(16).enumerate() {
                            let at = r * o + 16 * p;
                            // Sixteen moves, inlined (not a `memcpy` call).
                            let d: &mut [T; 16] = d.try_into().expect("16 elements");
                            *d = src[at..at + 16].try_into().expect("16 elements");
                        }
                    }
                }
                None => {
                    for (r, row) in g2.outer_iter().enumerate() {
                        for (j, &v) in row.iter().enumerate() {
                            buf[j / 16 * stride + (n + r) * 16 + j % 16] = v;
                        }
                    }
                }
            },
            Err(_) => {
                // A layout that does not reshape as a view: the rows in
                // row-major order first.
                let mut flat = vec![T::zero(); rows * o];
                copy_rows(g, &mut flat);
                let g2 = ArrayD::from_shape_vec(IxDyn(&[rows, o]), flat).expect("rows × O");
                self.put_rows(buf, &g2, rows);
            }
        }
    }
}

/// `src`'s elements in row-major order into `dst` (same length).
fn copy_rows<T: Copy>(src: &ArrayD<T>, dst: &mut [T]) {
    match src.as_slice() {
        Some(s) => copy_blocks(dst, s),
        None => {
            let dst = ArrayViewMutD::from_shape(src.raw_dim(), dst)
                .expect("the caller sizes dst to src's element count");
            assign(dst, src.view());
        }
    }
}

enum AccData {
    Empty,
    F32(Acc<f32>),
    F64(Acc<f64>),
}

/// The gradient accumulator of one pp_prop relation whose `xy_to_dw` the
/// learner runs (see the module docs). Built per `etrace_grad` call.
pub(crate) struct PpDense {
    leaves: Vec<Leaf>,
    dtype: DType,
    acc: AccData,
}

const OP: &str = "pp_prop dense gradient";

impl PpDense {
    pub(crate) fn new(leaves: Vec<Leaf>, dtype: DType) -> Self {
        PpDense {
            leaves,
            dtype,
            acc: AccData::Empty,
        }
    }

    /// Add one step: `x` the input trace `(*lead, I)` (ignored without an
    /// input), `g` the summed signal `(*lead, O)`.
    pub(crate) fn push(&mut self, x: &Tensor, g: &Tensor) -> Result<()> {
        let Some(&o) = g.shape().last() else {
            return Err(Error::shapes(
                OP,
                [g.shape()],
                "the summed signal must have an output axis",
            ));
        };
        let rows = g.size() / o.max(1);
        let needs_x = self.leaves.iter().any(|l| l.has_input);
        let i = if needs_x {
            let i = x.shape().last().copied().unwrap_or(0);
            if x.size() != rows * i {
                return Err(Error::shapes(
                    OP,
                    [x.shape(), g.shape()],
                    "the input trace x̄ and the signal must have the same rows",
                ));
            }
            i
        } else {
            0
        };
        let (g, x) = (g.cast(self.dtype)?, x.cast(self.dtype)?);
        let fits = |a_i: usize, a_o: usize| a_i == i && a_o == o;
        match (&mut self.acc, g.data()?, x.data()?) {
            (AccData::Empty, ArrayData::F32(ga), ArrayData::F32(xa)) => {
                let mut acc = Acc::new(&self.leaves, i, o, rows);
                acc.push(&self.leaves, needs_x.then_some(xa), ga);
                self.acc = AccData::F32(acc);
            }
            (AccData::Empty, ArrayData::F64(ga), ArrayData::F64(xa)) => {
                let mut acc = Acc::new(&self.leaves, i, o, rows);
                acc.push(&self.leaves, needs_x.then_some(xa), ga);
                self.acc = AccData::F64(acc);
            }
            (AccData::F32(acc), ArrayData::F32(ga), ArrayData::F32(xa)) if fits(acc.i, acc.o) => {
                acc.push(&self.leaves, needs_x.then_some(xa), ga)
            }
            (AccData::F64(acc), ArrayData::F64(ga), ArrayData::F64(xa)) if fits(acc.i, acc.o) => {
                acc.push(&self.leaves, needs_x.then_some(xa), ga)
            }
            _ => {
                return Err(Error::shapes(
                    OP,
                    [x.shape(), g.shape()],
                    format!(
                        "every step's input trace x̄ and signal must have the first step's shapes, in f32 or f64 (the accumulator is {:?})",
                        self.dtype
                    ),
                ))
            }
        }
        Ok(())
    }

    /// The gradients accumulated so far, by model parameter (nothing when
    /// no step was pushed); `params` are the model's parameter values of
    /// this call (for the transforms' derivatives).
    pub(crate) fn take(&mut self, params: &[Tensor]) -> Result<Vec<(usize, Tensor)>> {
        let grads: Vec<ArrayData> = match &mut self.acc {
            AccData::Empty => return Ok(Vec::new()),
            AccData::F32(a) => a
                .take(&self.leaves)
                .into_iter()
                .map(ArrayData::F32)
                .collect(),
            AccData::F64(a) => a
                .take(&self.leaves)
                .into_iter()
                .map(ArrayData::F64)
                .collect(),
        };
        self.leaves
            .iter()
            .zip(grads)
            .map(|(l, g)| {
                let g = Tensor::from_data(g);
                let g = match &l.transform {
                    Some(f) => g.mul(&f.derivative(&params[l.param])?)?,
                    None => g,
                };
                Ok((l.param, g))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_rows, Acc, Leaf};
    use crate::kernels::sgemm;
    use ndarray::{ArrayD, IxDyn, ShapeBuilder};

    /// A direct accumulator (a product per step) gives the chunked one's
    /// gradients: the same bits where the chunk product runs on the
    /// crate's kernel, one multiply-add per row in row order either way.
    /// A step whose signal is column-major goes through the chunk.
    #[test]
    fn direct_steps_give_the_chunks_gradients() {
        let leaves = [
            Leaf {
                param: 0,
                has_input: true,
                transform: None,
            },
            Leaf {
                param: 1,
                has_input: false,
                transform: None,
            },
        ];
        // Signal rows 32 wide (the chunk kept in panels where the kernel
        // runs) and 20 wide (row-major).
        for (i, o, rows) in [(20, 32, 24), (20, 20, 24)] {
            let mut direct = Acc::<f32>::new(&leaves, i, o, rows);
            assert!(direct.direct, "a chunk of {} rows", direct.cap);
            let mut chunked = Acc::<f32>::new(&leaves, i, o, rows);
            chunked.direct = false;
            assert_eq!(chunked.packed, o == 32 && sgemm::available());
            let mut seed = 5u32;
            let mut draw = move |shape: &[usize], f: bool| {
                ArrayD::from_shape_fn(IxDyn(shape).set_f(f), |_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
            };
            // Seven steps: the chunk fills and is flushed in the middle.
            assert!(7 * rows > chunked.cap);
            for step in 0..7 {
                let x = draw(&[rows, i], false);
                let g = draw(&[rows, o], step == 3);
                direct.push(&leaves, Some(&x), &g);
                chunked.push(&leaves, Some(&x), &g);
            }
            let (got, want) = (direct.take(&leaves), chunked.take(&leaves));
            for (got, want) in got.iter().zip(&want) {
                // Bit for bit where the products run on the crate's
                // kernel (`matrixmultiply` adds in its own order).
                if sgemm::available() && o % 16 == 0 {
                    assert_eq!(got, want, "signal rows {o} wide");
                } else {
                    for (a, b) in got.iter().zip(want) {
                        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
                    }
                }
            }
        }
    }

    /// The f32 bias sums (on the product kernel where it applies) are the
    /// additions of the rows in row order onto the old sums, bit for bit,
    /// for widths the kernel takes (multiples of 16) and ones it leaves.
    #[test]
    fn f32_row_sums_are_the_additions_in_row_order() {
        use super::ChunkProduct;
        let mut seed = 9u32;
        let mut draw = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (rows, o) in [(1, 16), (64, 128), (37, 48), (5, 7), (300, 32)] {
            let g = ndarray::Array2::from_shape_fn((rows, o), |_| draw());
            let start = ndarray::Array2::from_shape_fn((1, o), |_| 100.0 * draw());
            let mut want = start.clone();
            for r in 0..rows {
                for j in 0..o {
                    want[[0, j]] += g[[r, j]];
                }
            }
            let mut got = start.clone();
            f32::add_rows(&g.view(), &mut got);
            assert_eq!(got, want, "{rows} rows of {o}");
        }
    }

    /// Row-major, column-major and permuted 3-D sources all land in `dst`
    /// in row-major order (checked against an index loop).
    #[test]
    fn copy_rows_writes_row_major_order_from_any_layout() {
        let base = ArrayD::from_shape_fn(IxDyn(&[3, 4, 5]), |ix| {
            (ix[0] * 100 + ix[1] * 10 + ix[2]) as f64
        });
        let sources = [
            base.clone(),
            base.t().as_standard_layout().t().to_owned(),
            base.clone().permuted_axes(vec![2, 0, 1]),
        ];
        for src in sources {
            let mut dst = vec![-1.0; src.len()];
            copy_rows(&src, &mut dst);
            let sh = src.shape().to_vec();
            let mut k = 0;
            for a in 0..sh[0] {
                for b in 0..sh[1] {
                    for c in 0..sh[2] {
                        assert_eq!(dst[k], src[[a, b, c]], "{sh:?} at {k}");
                        k += 1;
                    }
                }
            }
        }
    }
}
