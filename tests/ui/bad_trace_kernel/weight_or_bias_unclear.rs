// With three trainables, `dense` cannot tell the weight from the bias.
use braintrace::prelude::*;

#[etp_primitive(batched, weight = [a, b, c], trace_kernel = dense)]
fn my_op(x: &Tensor, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    x.matmul(a)?.add(b)?.add(c)
}

#[yw_to_w(my_op)]
fn my_op_yw_to_w(_hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    Ok(trace.clone())
}

#[xy_to_dw(my_op)]
fn my_op_xy_to_dw(_x: &Tensor, _hidden: &Tensor, w: &TensorMap) -> Result<TensorMap> {
    Ok(w.clone())
}

#[init_drtrl(my_op)]
fn my_op_init_drtrl(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    Ok(w.iter().map(|(k, a)| (k.clone(), Tensor::zeros(&[a.shape(), &[n]].concat(), y.dtype()))).collect())
}

#[init_pp(my_op)]
fn my_op_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

fn main() {}
