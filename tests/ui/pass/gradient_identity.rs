// A gradient-enabled identity marker without `x`: its rules take `Option<&..>` for x.
use braintrace::prelude::*;

/// y = w
#[etp_primitive(name = "etp_my_identity", gradient_enabled, x = none, weight = w)]
fn identity(w: &Tensor) -> Result<Tensor> {
    w.mul_scalar(1.0)
}

#[yw_to_w(identity)]
fn identity_yw_to_w(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    trace.mul(hidden)
}

#[xy_to_dw(identity)]
fn identity_xy_to_dw(_x: Option<&Tensor>, hidden: &Tensor, _w: &Tensor) -> Result<Tensor> {
    Ok(hidden.clone())
}

#[init_drtrl(identity)]
fn identity_init_drtrl(_x: Option<&Aval>, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
}

#[init_pp(identity)]
fn identity_init_pp(_x: Option<&Aval>, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

fn main() -> Result<()> {
    let p = identity::primitive();
    assert!(p.is_gradient_enabled() && p.x_index().is_none());
    assert!(check_rules(&p, &[Tensor::ones(&[2, 3], DType::F64)], &Params::new())?.is_ok());
    Ok(())
}
