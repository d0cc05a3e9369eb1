//! Running a fused group: the loop over blocks of the output, its operands
//! walked in one memory order, split over threads when it is large.

use super::*;

/// The memory order a fused loop walks its operands and writes its results
/// in. Element-wise results do not depend on it; what matters is that no
/// operand needs a strided walk (`concatenate` along the last axis, for
/// one, yields column-major arrays).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Order {
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
pub(super) fn order_of<T>(a: &ArrayD<T>) -> Option<Order> {
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
pub(super) fn fits_order<T>(a: &ArrayD<T>, axes: &mut dyn Iterator<Item = usize>) -> bool {
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
pub(super) fn operand<'a, T: PoolFloat>(
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
pub(super) fn elements<T: Copy>(a: &ArrayD<T>, order: Order) -> Cow<'_, [T]> {
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
pub(super) fn transpose2<T: Copy>(src: &[T], rows: usize, cols: usize) -> Vec<T> {
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
pub(super) fn row_major<T: Copy>(a: &ndarray::ArrayViewD<T>) -> Vec<T> {
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
pub(super) fn lcm(a: usize, b: usize) -> usize {
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
pub(super) fn fill_row<T: Copy>(dst: &mut [T], row: &[T], start: usize, size: usize, order: Order) {
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
pub(super) const ALIGN_SLACK: usize = 16;

/// Where `n` elements of `v` start: on a 64-byte boundary (a cache line;
/// a 512-bit load or store of an unaligned block touches two lines, and
/// the kernels ran up to 1.5× slower so) when `v` has the room past `n`,
/// else as far toward it as there is room (0 for exactly `n` elements).
pub(super) fn aligned_start<T>(v: &[T], n: usize) -> usize {
    v.as_ptr().align_offset(64).min(v.len().saturating_sub(n))
}

/// Where the block of block buffer `v` starts (see [`aligned_start`]).
pub(super) fn aligned<T>(v: &[T]) -> usize {
    aligned_start(v, BLOCK)
}

/// Elements from which a fused loop splits across the pool's threads under
/// [`keep_awake`](crate::threads::keep_awake): GRU pp_prop at hidden 512,
/// batch 64, two threads, groups of 32 K elements.
pub(super) const PAR_MIN_ELEMS_AWAKE: usize = 1 << 13;

/// The same on one of the pool's threads otherwise, where a split may
/// have to wake a sleeping thread (tens of microseconds on a virtual
/// machine); never from outside the pool.
pub(super) const PAR_MIN_ELEMS: usize = 1 << 18;

/// How many fused loops ran split across threads (tests).
#[cfg(test)]
pub(super) static SPLITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fused loop's operands, run over a range of its elements
/// ([`Blocks::range`]): what the threads of a split share.
pub(super) struct Blocks<'a, T: Clone> {
    pub(super) g: &'a Graph,
    pub(super) f: &'a Fused,
    /// The inputs' elements in the loop's order.
    pub(super) inputs: &'a [Cow<'a, [T]>],
    /// The row operands' elements in the loop's order.
    pub(super) rows: &'a [Cow<'a, [T]>],
    pub(super) order: Order,
    /// Elements per block.
    pub(super) block: usize,
    /// Whether every block reads the same row elements (blocks start on a
    /// multiple of every row's length), so the rows are filled once.
    pub(super) period: bool,
    pub(super) compiled: Option<codegen::Kernel>,
}

impl<T: PoolFloat> Blocks<'_, T> {
    /// Elements `lo..hi` of the results into `outs` (which hold those
    /// elements alone), with `bufs` as block buffers (the scalars' filled);
    /// `lo` is a multiple of the block.
    pub(super) fn range(&self, bufs: &mut [Vec<T>], outs: &mut [&mut [T]], lo: usize, hi: usize) {
        let f = self.f;
        if lo >= hi {
            return;
        }
        // What the first broadcast operands' buffers hold (see [`Runs`]).
        let mut held = [Runs::default(); 8];
        let mut fill_rows = |bufs: &mut [Vec<T>], start: usize, len: usize| {
            let rows = self.rows.iter().zip(&f.rows).zip(&f.spreads);
            for (k, ((row, &(_, b)), spread)) in rows.enumerate() {
                let at = aligned(&bufs[b]);
                let dst = &mut bufs[b][at..at + len];
                match spread {
                    Some(s) => {
                        let mut none = Runs::default();
                        let last = held.get_mut(k).unwrap_or(&mut none);
                        s.fill(dst, row, (start, self.order), last);
                    }
                    None => fill_row(dst, row, start, f.size, self.order),
                }
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
                // A sum of the result (one part: all of it): the block
                // added in while it is in its buffer.
                if let (Some(s), Operand::Buf(b)) = (op.sum, op.dst) {
                    let at = aligned(&bufs[b]);
                    add_rows(outs[f.outputs.len() + s], &bufs[b][at..at + len], start);
                }
            }
            start += len;
        }
    }
}

pub(super) fn run_fused<T: PoolFloat>(
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
    // (An input read for a reshape the plan skipped has the loop's
    // shape up to axes of one: its own, checked.)
    for &v in &f.inputs {
        arrays.push(operand(g, env, v, g.avals[v].shape())?);
    }
    let n_f = arrays
        .iter()
        .filter(|a| order_of(a) == Some(Order::F))
        .count();
    // (A loop that takes sums walks row-major: the rows are added in order.)
    let order = if n_f > 0 && 2 * n_f >= arrays.len() && f.sums.is_empty() {
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
    // element `p / (size / n)` (the row's own elements in that order); an
    // operand broadcast along inner axes too, as its [`Spread`] says.
    let mut rows: Vec<Cow<[T]>> = recast(spare_rows);
    for &(v, _) in &f.rows {
        rows.push(elements(operand(g, env, v, g.avals[v].shape())?, order));
    }
    let mut bufs_out = std::mem::take(T::spare_bufs(pool));
    for &v in &f.outputs {
        bufs_out.push(take(pool, class_of[v], &f.shape, order == Order::F));
    }
    for s in &f.sums {
        bufs_out.push(take(pool, class_of[s.var], g.avals[s.var].shape(), false));
    }
    let mut outs: Vec<&mut [T]> = recast(std::mem::take(&mut pool.spare_outs));
    outs.extend(bufs_out.iter_mut().map(|b| b.slice_mut()));
    // In row-major order, blocks that start on a multiple of every row's
    // length read the same broadcast elements: the rows' buffers are then
    // filled once (a bias of 128 and blocks of 1024: each block used to
    // copy the bias eight times).
    let period = match order {
        Order::C if !rows.is_empty() && f.spreads.iter().all(Option::is_none) => {
            rows.iter().try_fold(1usize, |l, r| {
                Some(lcm(l, r.len())).filter(|&l| l > 0 && l <= BLOCK)
            })
        }
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
    let parts = if f.size >= min && f.sums.is_empty() {
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
    let mut results = bufs_out.drain(..);
    for (&v, b) in f.outputs.iter().zip(&mut results) {
        env[v] = Some(b.into_tensor(&f.shape, column_major)?);
    }
    for (s, b) in f.sums.iter().zip(results) {
        env[s.var] = Some(b.into_tensor(g.avals[s.var].shape(), false)?);
    }
    *T::spare_bufs(pool) = bufs_out;
    Ok(())
}
