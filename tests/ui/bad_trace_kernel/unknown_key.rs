// A misspelt trace-kernel key is named, with the keys the kind knows.
use braintrace::prelude::*;

#[etp_primitive(batched, trace_kernel = dense(weigth = w))]
fn my_op(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(w)
}

#[yw_to_w(my_op)]
fn my_op_yw_to_w(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(0)?)
}

#[xy_to_dw(my_op)]
fn my_op_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor) -> Result<Tensor> {
    x.transpose(&[1, 0])?.matmul(hidden)
}

#[init_drtrl(my_op)]
fn my_op_init_drtrl(x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[x.shape()[0], w.shape()[0], w.shape()[1], n], y.dtype()))
}

#[init_pp(my_op)]
fn my_op_init_pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

fn main() {}
