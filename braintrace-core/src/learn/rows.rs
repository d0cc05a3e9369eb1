//! A sequence's rows for the learner's steps and the per-step losses
//! gathered back: row `t` of a time-major tensor copied straight out of
//! its array (in place into the previous step's buffer once the program
//! has let go of it), a scalar set in place, and scalars stacked to `(T,)`.

use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// The per-step losses (scalars) as one `(T,)` tensor: their elements
/// gathered straight into an array when they are floats of one dtype (the
/// op machinery's `stack` took 17 µs for 100 of them), else by `stack`;
/// `(0,)` of `dtype` without steps.
pub(crate) fn stack_scalars(losses: &[Tensor], dtype: DType) -> Result<Tensor> {
    use crate::tensor::ArrayElement;
    fn gather<T: ArrayElement + Copy>(losses: &[Tensor]) -> Option<Tensor> {
        let v: Option<Vec<T>> = losses
            .iter()
            .map(|l| {
                let d = l.data_for("etrace_grad").ok()?;
                let a = T::array(d).filter(|a| a.ndim() == 0)?;
                a.first().copied()
            })
            .collect();
        v.map(|v| Tensor::from_array(ndarray::Array1::from_vec(v).into_dyn()))
    }
    let Some(first) = losses.first() else {
        return Ok(Tensor::zeros(&[0], dtype));
    };
    let gathered = match first.dtype() {
        DType::F32 => gather::<f32>(losses),
        DType::F64 => gather::<f64>(losses),
        _ => None,
    };
    match gathered {
        Some(t) => Ok(t),
        None => crate::ops::stack(losses, 0),
    }
}

/// `dst` := row `t` of `xs`: in place when `dst` is the only handle to
/// its buffer and has that row's dtype and shape (no allocation), else a
/// new tensor. Only a unique buffer is written, so no other holder of
/// `dst`'s value sees it change.
pub(crate) fn fill(dst: &mut Tensor, xs: &Tensor, t: usize) -> Result<()> {
    use crate::tensor::ArrayData;
    fn copy<T: Clone>(d: &mut ndarray::ArrayD<T>, s: &ndarray::ArrayD<T>, t: usize) -> bool {
        let s = s.index_axis(ndarray::Axis(0), t);
        let fits = d.shape() == s.shape();
        if fits {
            d.assign(&s);
        }
        fits
    }
    let done = match (dst.try_data_mut(), xs.data_for("etrace_grad")?) {
        (Some(ArrayData::F32(d)), ArrayData::F32(s)) => copy(d, s, t),
        (Some(ArrayData::F64(d)), ArrayData::F64(s)) => copy(d, s, t),
        _ => false,
    };
    if !done {
        *dst = row(xs, t)?;
    }
    Ok(())
}

/// `dst` := the scalar `c` of `dtype` (in place as [`fill`]).
pub(crate) fn set_scalar(dst: &mut Tensor, c: f64, dtype: DType) {
    use crate::tensor::ArrayData;
    match (dst.try_data_mut(), dtype) {
        (Some(ArrayData::F32(d)), DType::F32) if d.ndim() == 0 => d.fill(c as f32),
        (Some(ArrayData::F64(d)), DType::F64) if d.ndim() == 0 => d.fill(c),
        _ => *dst = Tensor::scalar_of(c, dtype),
    }
}

/// Row `t` of a concrete time-major sequence (`t` in range), copied out of
/// the array without going through the op machinery.
fn row(xs: &Tensor, t: usize) -> Result<Tensor> {
    use crate::tensor::ArrayData;
    use ndarray::Axis;
    let d = match xs.data_for("etrace_grad")? {
        ArrayData::F32(a) => ArrayData::F32(a.index_axis(Axis(0), t).to_owned()),
        ArrayData::F64(a) => ArrayData::F64(a.index_axis(Axis(0), t).to_owned()),
        ArrayData::I64(a) => ArrayData::I64(a.index_axis(Axis(0), t).to_owned()),
        ArrayData::Bool(a) => ArrayData::Bool(a.index_axis(Axis(0), t).to_owned()),
    };
    Ok(Tensor::from_data(d))
}
