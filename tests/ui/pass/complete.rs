// The seed's op with its four rules: compiles, registers, runs.
use braintrace::prelude::*;

/// y = scale * (x @ w)
#[etp_primitive(name = "etp_my_op", batched, x = x, weight = w)]
fn my_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

#[yw_to_w(my_op)]
fn my_op_yw_to_w(hidden: &Tensor, trace: &Tensor, _p: &my_op::Params) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}

#[xy_to_dw(my_op)]
fn my_op_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor, p: &my_op::Params) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?
            .matmul(&hidden.expand_dims(0)?)?
            .mul_scalar(p.scale)
    } else {
        x.transpose(&[1, 0])?.matmul(hidden)?.mul_scalar(p.scale)
    }
}

#[init_drtrl(my_op)]
fn my_op_init_drtrl(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(
        &[x.shape()[0], w.shape()[0], w.shape()[1], num_hidden_state],
        y.dtype(),
    ))
}

#[init_pp(my_op)]
fn my_op_init_pp(_x: &Aval, y: &Aval, _w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(
        &[y.shape(), &[num_hidden_state]].concat(),
        y.dtype(),
    ))
}

fn main() -> Result<()> {
    let y = my_op(
        &Tensor::ones(&[4, 3], DType::F64),
        &Tensor::ones(&[3, 5], DType::F64),
        0.5,
    )?;
    assert!(y.to_vec_f64()?.iter().all(|&v| v == 1.5));
    let p = primitive_by_name("etp_my_op").expect("registered");
    assert!(ETP_RULES_INIT_PP.contains(&p));
    assert!(check_rules(
        &p,
        &[
            Tensor::ones(&[4, 3], DType::F64),
            Tensor::ones(&[3, 5], DType::F64)
        ],
        &my_op::Params { scale: 0.5 }.to_params()
    )?
    .is_ok());
    Ok(())
}
