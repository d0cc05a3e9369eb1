//! The plan's buffers: the pool it keeps across calls, the block and
//! output buffers a fused loop writes, and the float types it writes them in.

use super::*;

/// Buffers a plan keeps across calls (see the module docs).
#[derive(Default)]
pub(super) struct Pool {
    /// The environment's allocation.
    pub(super) env: Vec<Option<Tensor>>,
    /// The operand list of an `eval`.
    pub(super) ins: Vec<Tensor>,
    /// Per buffer class, dead values of its dtype and element count, whole:
    /// each handle unique, its buffer written again in place and handed
    /// back as the new value (no allocation, no array rebuilt) when the
    /// new value has the old one's shape and memory order.
    pub(super) free: Vec<Vec<Tensor>>,
    /// Block buffers of the fused loops ([`BLOCK`] elements each).
    pub(super) scratch_f32: Vec<Vec<f32>>,
    pub(super) scratch_f64: Vec<Vec<f64>>,
    /// The allocations of a fused loop's operand lists, kept empty from
    /// call to call ([`recast`]): its inputs' arrays, two lists of element
    /// slices (the inputs, the rows) and one of result slices.
    pub(super) spare_arrays: Vec<usize>,
    pub(super) spare_elems: [Vec<[usize; 3]>; 2],
    pub(super) spare_outs: Vec<[usize; 2]>,
    /// The results' buffers of a fused loop (kept empty, as above).
    pub(super) spare_bufs_f32: Vec<Buf<f32>>,
    pub(super) spare_bufs_f64: Vec<Buf<f64>>,
    /// Values returned to the caller: handle, class, calls seen since.
    pub(super) returned: Vec<(Tensor, usize, u8)>,
    /// Per buffer class, the most dead buffers kept: how many values of
    /// the class one call writes.
    pub(super) caps: Vec<usize>,
    /// Per product whose right operand is a program input or constant
    /// (its [`Kernel::Matmul`] slot): that operand as last seen (held, so
    /// that an in-place change copies it first and the identity check is
    /// sound) and its packed panels, reused while the caller passes the
    /// same tensor (a weight, step after step).
    pub(super) panels: Vec<Option<(Tensor, sgemm::PackedB)>>,
    /// How many times a right operand was packed (tests).
    #[cfg(test)]
    pub(super) packs: usize,
}

impl Pool {
    /// Keep `t` in class `c`'s free list if `t` has a class, is a float
    /// and the only handle to its value, and the list has room; otherwise
    /// just drop the handle. Whether its elements fit the class (as many,
    /// contiguous) is checked when it is taken ([`take`]).
    pub(super) fn recycle(&mut self, t: Tensor, class: Option<usize>) {
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
    pub(super) fn age_returned(&mut self) {
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
pub(super) fn take<T: PoolFloat>(
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
pub(super) fn unique_array_mut<T: PoolFloat>(t: &mut Tensor) -> Option<&mut ArrayD<T>> {
    match Arc::get_mut(&mut t.0)? {
        Repr::Concrete(d) => T::array_mut(d),
        Repr::Symbolic(_) => None,
    }
}

/// Replace `a` by `change(a)` in place: a tensor's array given a new shape
/// inside its handle (no new handle allocated, none freed).
pub(super) fn change_in_place<T>(
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
pub(super) fn relaid<T>(a: ArrayD<T>, shape: IxDyn, column_major: bool) -> Result<ArrayD<T>> {
    let n = a.len();
    // The elements are the memory block that starts at the array's first
    // element (contiguous, positive strides).
    let (v, at) = a.into_raw_vec_and_offset();
    from_block(v, at.unwrap_or(0), n, shape, column_major)
}

/// Elements `at..at + n` of `v` as an array of `shape`, row-major or
/// (`column_major`) column-major, owning the whole allocation.
pub(super) fn from_block<T>(
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
pub(super) enum Buf<T> {
    Fresh { v: Vec<T>, at: usize, n: usize },
    Kept(Tensor, std::marker::PhantomData<T>),
}

impl<T: PoolFloat> Buf<T> {
    pub(super) fn slice_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Fresh { v, at, n } => &mut v[*at..*at + *n],
            Buf::Kept(t, _) => contiguous_mut::<T>(t).expect("checked when taken"),
        }
    }
    /// The elements as an array of `shape` (`n` elements), row-major or
    /// (`column_major`) column-major, owning the whole allocation.
    pub(super) fn into_array(self, shape: IxDyn, column_major: bool) -> Result<ArrayD<T>> {
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
    pub(super) fn into_tensor(self, shape: &[usize], column_major: bool) -> Result<Tensor> {
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
pub(super) fn in_order<T>(a: &ArrayD<T>, column_major: bool) -> bool {
    let n = a.ndim();
    if column_major {
        fits_order(a, &mut (0..n))
    } else {
        fits_order(a, &mut (0..n).rev())
    }
}

/// The float types the plan writes buffers of itself.
pub(super) trait PoolFloat:
    Float + ArrayElement + codegen::Lane + Send + Sync + 'static
{
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
