//! Matrix multiplication with shared leading batch dimensions.

use super::{bcast_to_batch, check_arity};
use crate::error::{Error, Result};
use crate::graph::{bind1, LinearArg, Planned, Primitive};
use crate::tensor::{ArrayData, Aval, Tensor};
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayD, ArrayView2, Axis, Ix2, IxDyn, LinalgScalar};
use std::any::Any;
use std::sync::Arc;

/// `a @ b` for `a: (..., m, k)`, `b: (..., k, n)` with equal leading dims.
/// (`Tensor::matmul` broadcasts leading dims and handles 1-D operands.)
#[derive(Clone, Debug)]
pub struct Matmul;

fn mm_kernel<T: LinalgScalar>(a: &ArrayD<T>, b: &ArrayD<T>, out_shape: &[usize]) -> ArrayD<T> {
    let r = a.ndim();
    let (m, n) = (a.shape()[r - 2], b.shape()[r - 1]);
    let lead = &a.shape()[..r - 2];
    let batch: usize = lead.iter().product();
    let mut out = ndarray::Array3::<T>::zeros((batch, m, n));
    if let (Some(a3), Some(b3)) = (as_batch3(a, batch), as_batch3(b, batch)) {
        for i in 0..batch {
            let mut ov = out.index_axis_mut(Axis(0), i);
            general_mat_mul(
                T::one(),
                &a3.index_axis(Axis(0), i),
                &b3.index_axis(Axis(0), i),
                T::zero(),
                &mut ov,
            );
        }
        return out
            .into_shape_with_order(IxDyn(out_shape))
            .expect("same size");
    }
    for i in 0..batch {
        // Operands are read where they lie: matrixmultiply takes any
        // strides, so a transposed or sliced operand is not copied.
        let (av, bv) = (matrix_at(a, lead, i), matrix_at(b, lead, i));
        let mut ov = out.index_axis_mut(Axis(0), i);
        general_mat_mul(T::one(), &av, &bv, T::zero(), &mut ov);
    }
    out.into_shape_with_order(IxDyn(out_shape))
        .expect("same size")
}

/// `x` as a fixed-rank `(batch, rows, cols)` view, when it is in standard
/// layout (ndarray reshapes views of that layout only).
fn as_batch3<T>(x: &ArrayD<T>, batch: usize) -> Option<ndarray::ArrayView3<'_, T>> {
    let r = x.ndim();
    x.view()
        .into_shape_with_order((batch, x.shape()[r - 2], x.shape()[r - 1]))
        .ok()
}

/// The matrix at row-major batch index `i` of `x` (leading dims `lead`),
/// as a strided view.
fn matrix_at<'a, T>(x: &'a ArrayD<T>, lead: &[usize], mut i: usize) -> ArrayView2<'a, T> {
    let mut ix = vec![0; lead.len()];
    for d in (0..lead.len()).rev() {
        ix[d] = i % lead[d];
        i /= lead[d];
    }
    let mut v = x.view();
    for k in ix {
        v.index_axis_inplace(Axis(0), k);
    }
    v.into_dimensionality::<Ix2>()
        .expect("rank 2 after the batch axes")
}

impl Primitive for Matmul {
    fn name(&self) -> String {
        "matmul".into()
    }
    fn planned(&self) -> Option<Planned<'_>> {
        Some(Planned::Matmul)
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        check_arity("matmul", inputs, 2)?;
        let (a, b) = (&inputs[0], &inputs[1]);
        let bad = |why: &str| Error::shapes("matmul", [a.shape(), b.shape()], why);
        if a.dtype() != b.dtype() || !a.dtype().is_float() {
            return Err(Error::dtype_pair(
                "matmul",
                (a.dtype(), a.shape()),
                (b.dtype(), b.shape()),
                true,
                "operands must be floats of one dtype",
            ));
        }
        if a.ndim() < 2 || a.ndim() != b.ndim() {
            return Err(bad("operands must have equal rank >= 2"));
        }
        let r = a.ndim();
        if a.shape()[..r - 2] != b.shape()[..r - 2] {
            return Err(bad("leading batch dimensions must match"));
        }
        if a.shape()[r - 1] != b.shape()[r - 2] {
            return Err(bad(&format!(
                "contracting dimensions differ ({} vs {})",
                a.shape()[r - 1],
                b.shape()[r - 2]
            )));
        }
        let mut out = a.shape().to_vec();
        out[r - 1] = b.shape()[r - 1];
        Ok(vec![a.with_shape(&out)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_arity("matmul", inputs, 2)?;
        let out = self
            .abstract_eval(&[inputs[0].aval(), inputs[1].aval()])?
            .remove(0);
        let d = match (inputs[0].data_for("matmul")?, inputs[1].data_for("matmul")?) {
            (ArrayData::F32(a), ArrayData::F32(b)) if a.ndim() == 2 => {
                ArrayData::F32(mm2_f32(a, b).into_dyn())
            }
            (ArrayData::F64(a), ArrayData::F64(b)) if a.ndim() == 2 => {
                ArrayData::F64(mm2(a, b).into_dyn())
            }
            (ArrayData::F32(a), ArrayData::F32(b)) => ArrayData::F32(mm_kernel(a, b, out.shape())),
            (ArrayData::F64(a), ArrayData::F64(b)) => ArrayData::F64(mm_kernel(a, b, out.shape())),
            _ => unreachable!("dtypes checked"),
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        super::bilinear_jvp(p, t, matmul_raw)
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None]);
        };
        if args[0].is_linear() && args[1].is_linear() {
            return Err(Error::invalid(
                "matmul",
                "transpose with both operands linear",
            ));
        }
        if args[0].is_linear() {
            let b = args[1].known("matmul")?;
            Ok(vec![Some(matmul_raw(ct, &swap_last(b)?)?), None])
        } else {
            let a = args[0].known("matmul")?;
            Ok(vec![None, Some(matmul_raw(&swap_last(a)?, ct)?)])
        }
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let (a, b) = (&args[0], &args[1]);
        // Common case: a batched 2-D lhs times an unbatched matrix folds the
        // batch into the rows.
        if batched[0] && !batched[1] && a.ndim() == 3 {
            let (m, k) = (a.shape()[1], a.shape()[2]);
            let y = matmul_raw(&a.reshape(&[size * m, k])?, b)?;
            return Ok((vec![y.reshape(&[size, m, b.shape()[1]])?], vec![true]));
        }
        let a = bcast_to_batch(a, batched[0], size)?;
        let b = bcast_to_batch(b, batched[1], size)?;
        Ok((vec![matmul_raw(&a, &b)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn mm2<T: LinalgScalar>(a: &ArrayD<T>, b: &ArrayD<T>) -> Array2<T> {
    let a = a.view().into_dimensionality::<Ix2>().expect("rank 2");
    let b = b.view().into_dimensionality::<Ix2>().expect("rank 2");
    a.dot(&b)
}

/// A 2-D `f32` product: few rows run [`sgemm`](crate::kernels::sgemm)
/// (the planned executor makes the same choice, so both give the same
/// bits), others `matrixmultiply`.
fn mm2_f32(a: &ArrayD<f32>, b: &ArrayD<f32>) -> Array2<f32> {
    use crate::kernels::sgemm;
    let av = a.view().into_dimensionality::<Ix2>().expect("rank 2");
    let bv = b.view().into_dimensionality::<Ix2>().expect("rank 2");
    let (m, n) = (av.nrows(), bv.ncols());
    if !sgemm::applies(&av, n) {
        return mm2(a, b);
    }
    let mut c = vec![0f32; m * n];
    sgemm::gemm(&av, &sgemm::PackedB::new(&bv), &mut c);
    Array2::from_shape_vec((m, n), c).expect("m · n elements")
}

/// Swap the last two axes.
pub(crate) fn swap_last(x: &Tensor) -> Result<Tensor> {
    let r = x.ndim();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    x.transpose(&perm)
}

/// Bind [`Matmul`] directly (no broadcasting).
pub fn matmul_raw(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    bind1(Arc::new(Matmul), &[a.clone(), b.clone()])
}
