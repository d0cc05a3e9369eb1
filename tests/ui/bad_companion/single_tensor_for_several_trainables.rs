// With two trainables the trace is keyed by name: `&TensorMap`, not `&Tensor`.
use braintrace::prelude::*;

#[etp_primitive(weight = [weight, bias])]
fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}

#[yw_to_w(linear)]
fn linear_yw_to_w(_hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    Ok(trace.clone())
}

#[xy_to_dw(linear)]
fn linear_xy_to_dw(_x: &Tensor, _hidden: &Tensor, w: &TensorMap) -> Result<TensorMap> {
    Ok(w.clone())
}

#[init_drtrl(linear)]
fn linear_init_drtrl(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    Ok(w.iter()
        .map(|(k, a)| {
            (
                k.clone(),
                Tensor::zeros(&[a.shape(), &[n]].concat(), y.dtype()),
            )
        })
        .collect())
}

#[init_pp(linear)]
fn linear_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

fn main() {}
