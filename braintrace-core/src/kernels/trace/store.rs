//! Trace storage in a precision of its own (braintrace's `trace_dtype`):
//! the element type `E` a trace buffer keeps, loaded into the kernels'
//! compute type `T` (the model's) and rounded back when written.
//! [`TraceBuf`] is the learner's buffer in one of the supported storage
//! types; [`Store`] the conversion the loops use.
//!
//! Supported (compute, storage): `(f64, f64)`, `(f32, f32)`, `(f64, f32)`
//! and `(f32, bf16)`. The gradient is always accumulated in the compute
//! type (for bf16 traces: f32).

use super::dense::Ctx;
use super::{tiny, KernelFloat};
use crate::error::{Error, Result};
use crate::kernels::pages;
use crate::tensor::{ArrayData, DType};
use half::bf16;

/// A trace element stored as `Self`, computed with as `T`.
pub(crate) trait Store<T: KernelFloat>: Copy + Send + Sync + 'static {
    /// The stored value in the compute type (exact: every storage type here
    /// is a subset of its compute type).
    fn load(self) -> T;
    /// `v` rounded to the nearest stored value (ties to even).
    fn store(v: T) -> Self;
    /// `v`, or zero when it is tiny in the storage type (see
    /// [`flush`](super::flush)): below `√(smallest normal)` of the
    /// narrower of the two types, so that no stored value is subnormal and
    /// no product of two of them is either.
    fn flush(v: T) -> T;
    /// Run block `k` of a fused dense step with a loop written for this
    /// storage type, when it has one for this CPU and the step's shape;
    /// `false` (nothing done) otherwise. The result is bit for bit the
    /// generic loop's.
    #[inline(always)]
    fn dense_block(
        _ctx: &Ctx<'_, T>,
        _k: usize,
        _part: &mut [&mut [Self]],
        _grad: &mut [T],
    ) -> bool {
        false
    }
}

impl<T: KernelFloat> Store<T> for T {
    #[inline(always)]
    fn load(self) -> T {
        self
    }
    #[inline(always)]
    fn store(v: T) -> Self {
        v
    }
    #[inline(always)]
    fn flush(v: T) -> T {
        super::flush(v)
    }
}

impl Store<f64> for f32 {
    #[inline(always)]
    fn load(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn store(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn flush(v: f64) -> f64 {
        if v.abs() < tiny::<f32>() as f64 {
            0.0
        } else {
            v
        }
    }
}

impl Store<f32> for bf16 {
    #[inline(always)]
    fn load(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn store(v: f32) -> Self {
        bf16::from_bits(bf16_bits(v))
    }
    #[inline(always)]
    fn flush(v: f32) -> f32 {
        super::flush(v)
    }
    #[inline(always)]
    fn dense_block(
        ctx: &Ctx<'_, f32>,
        k: usize,
        part: &mut [&mut [Self]],
        grad: &mut [f32],
    ) -> bool {
        super::bf16x::dense_block(ctx, k, part, grad)
    }
}

/// `v` rounded to bf16 (nearest, ties to even; a NaN stays a quiet NaN of
/// the same sign), as bits: `half::bf16::from_f32`'s result, without its
/// branches, so that the trace loops keep vectorising (a test compares the
/// two bit for bit).
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let nan = (x & 0x7FFF_FFFF) > 0x7F80_0000;
    // Chosen in 32 bits, narrowed once (one narrowing per vector, not two).
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1));
    let quiet = x | 0x0040_0000;
    (if nan { quiet } else { rounded } >> 16) as u16
}

/// The storage precision of a trace buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Storage {
    F64,
    F32,
    Bf16,
}

impl Storage {
    /// Storage in a tensor dtype.
    pub(crate) fn of(dt: DType) -> Option<Self> {
        match dt {
            DType::F64 => Some(Storage::F64),
            DType::F32 => Some(Storage::F32),
            _ => None,
        }
    }
    /// The tensor dtype a buffer of this storage reads out as (bf16 widened
    /// to f32, exactly).
    pub(crate) fn tensor_dtype(self) -> DType {
        match self {
            Storage::F64 => DType::F64,
            Storage::F32 | Storage::Bf16 => DType::F32,
        }
    }
    /// Bytes per element.
    pub(crate) fn size_bytes(self) -> usize {
        match self {
            Storage::F64 => 8,
            Storage::F32 => 4,
            Storage::Bf16 => 2,
        }
    }
    /// The short name (`f64`, `f32`, `bf16`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Storage::F64 => "f64",
            Storage::F32 => "f32",
            Storage::Bf16 => "bf16",
        }
    }
    /// Whether traces stored this way can be computed with in `model`:
    /// the pairs [`Store`] implements.
    pub(crate) fn fits(self, model: DType) -> bool {
        matches!(
            (model, self),
            (DType::F64, Storage::F64 | Storage::F32) | (DType::F32, Storage::F32 | Storage::Bf16)
        )
    }
}

/// A learner-owned trace buffer in its storage precision.
#[derive(Clone, Debug)]
pub(crate) enum TraceBuf {
    F64(ndarray::ArrayD<f64>),
    F32(ndarray::ArrayD<f32>),
    Bf16(ndarray::ArrayD<bf16>),
}

impl TraceBuf {
    /// Zeros of `shape`, allocated lazily by the OS (`calloc`): a large
    /// trace costs nothing until the first step writes it, and is then
    /// backed by huge pages where the OS grants them
    /// ([`pages::advise_huge`]).
    pub(crate) fn zeros(storage: Storage, shape: &[usize]) -> Self {
        fn advised<T: Clone + num_traits::Zero>(dim: ndarray::IxDyn) -> ndarray::ArrayD<T> {
            let mut a = ndarray::ArrayD::zeros(dim);
            if let Some(s) = a.as_slice_memory_order_mut() {
                pages::advise_huge(s);
            }
            a
        }
        let dim = ndarray::IxDyn(shape);
        match storage {
            Storage::F64 => TraceBuf::F64(advised(dim)),
            Storage::F32 => TraceBuf::F32(advised(dim)),
            Storage::Bf16 => TraceBuf::Bf16(advised(dim)),
        }
    }
    pub(crate) fn storage(&self) -> Storage {
        match self {
            TraceBuf::F64(_) => Storage::F64,
            TraceBuf::F32(_) => Storage::F32,
            TraceBuf::Bf16(_) => Storage::Bf16,
        }
    }
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            TraceBuf::F64(a) => a.shape(),
            TraceBuf::F32(a) => a.shape(),
            TraceBuf::Bf16(a) => a.shape(),
        }
    }
    /// Zero every element.
    pub(crate) fn fill_zero(&mut self) {
        match self {
            TraceBuf::F64(a) => a.fill(0.0),
            TraceBuf::F32(a) => a.fill(0.0),
            TraceBuf::Bf16(a) => a.fill(bf16::ZERO),
        }
    }
    /// The values as tensor data (a copy; bf16 widened to f32, exactly).
    pub(crate) fn widened(&self) -> ArrayData {
        match self {
            TraceBuf::F64(a) => ArrayData::F64(a.clone()),
            TraceBuf::F32(a) => ArrayData::F32(a.clone()),
            TraceBuf::Bf16(a) => ArrayData::F32(a.mapv(|v| v.load())),
        }
    }
    /// The dtype of [`widened`](Self::widened)'s data.
    pub(crate) fn widened_dtype(&self) -> crate::tensor::DType {
        match self {
            TraceBuf::F64(_) => crate::tensor::DType::F64,
            TraceBuf::F32(_) | TraceBuf::Bf16(_) => crate::tensor::DType::F32,
        }
    }
    /// The buffer of `storage` holding `data` as [`widened`](Self::widened)
    /// gave it (bf16 narrowed back: exact for values that were bf16).
    pub(crate) fn from_widened(storage: Storage, data: &ArrayData, op: &str) -> Result<Self> {
        Ok(match (storage, data) {
            (Storage::F64, ArrayData::F64(a)) => TraceBuf::F64(a.clone()),
            (Storage::F32, ArrayData::F32(a)) => TraceBuf::F32(a.clone()),
            (Storage::Bf16, ArrayData::F32(a)) => TraceBuf::Bf16(a.mapv(bf16::from_f32)),
            (st, d) => {
                return Err(Error::invalid(
                    op,
                    format!(
                        "a {:?} trace cannot be restored into {} storage",
                        d.dtype(),
                        st.name()
                    ),
                ))
            }
        })
    }
    /// The elements as `E`, in memory order; errors name kernel `op`.
    pub(crate) fn slice_mut<E: 'static>(&mut self, op: &str) -> Result<&mut [E]> {
        use std::any::Any;
        let any: &mut dyn Any = match self {
            TraceBuf::F64(a) => a,
            TraceBuf::F32(a) => a,
            TraceBuf::Bf16(a) => a,
        };
        any.downcast_mut::<ndarray::ArrayD<E>>()
            .ok_or_else(|| Error::invalid(op, "trace buffer of another storage type"))?
            .as_slice_mut()
            .ok_or_else(|| Error::invalid(op, "trace buffer not contiguous"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_gives_half_s_bits() {
        let mut specials = vec![
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFF80_0001),
            f32::from_bits(0x7FFF_FFFF),
            f32::from_bits(0xFFFF_FFFF),
            f32::from_bits(0x3F80_8000), // a tie, even below
            f32::from_bits(0x3F81_8000), // a tie, odd below
            f32::from_bits(0x3F80_8001),
            f32::from_bits(0x7F7F_FFFF), // rounds to infinity
            f32::from_bits(0x0000_0001), // subnormal
        ];
        // Every 16-bit top with a spread of low halves.
        for hi in 0..=0xFFFFu32 {
            for lo in [
                0u32,
                0x7FFF,
                0x8000,
                0x8001,
                0xFFFF,
                hi.wrapping_mul(2_654_435_761) & 0xFFFF,
            ] {
                specials.push(f32::from_bits((hi << 16) | lo));
            }
        }
        for v in specials {
            assert_eq!(
                bf16_bits(v),
                bf16::from_f32(v).to_bits(),
                "{v:e} ({:#010x})",
                v.to_bits()
            );
        }
    }

    #[test]
    fn stores_round_and_load_exactly() {
        let v = 1.0f32 + 3.0 * f32::EPSILON;
        let b = <bf16 as Store<f32>>::store(v);
        assert_eq!(<bf16 as Store<f32>>::load(b), 1.0);
        let w = 1.0f64 + f64::EPSILON;
        assert_eq!(
            <f32 as Store<f64>>::load(<f32 as Store<f64>>::store(w)),
            1.0
        );
        assert_eq!(<f32 as Store<f64>>::flush(1e-30), 0.0);
        assert_eq!(<f64 as Store<f64>>::flush(1e-30), 1e-30);
        assert!(Storage::Bf16.fits(DType::F32) && !Storage::Bf16.fits(DType::F64));
        assert!(Storage::F32.fits(DType::F64) && !Storage::F64.fits(DType::F32));
    }
}
