// Two trainables (weight and bias): rules keyed by trainable name.
use braintrace::prelude::*;

/// y = x @ weight + bias, x `(I,)`.
#[etp_primitive(name = "etp_my_linear", weight = [weight, bias])]
fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}

#[yw_to_w(linear)]
fn linear_yw_to_w(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    out.insert(
        "weight".into(),
        trace["weight"].mul(&hidden.expand_dims(0)?)?,
    );
    out.insert("bias".into(), trace["bias"].mul(hidden)?);
    Ok(out)
}

#[xy_to_dw(linear)]
fn linear_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    out.insert(
        "weight".into(),
        x.expand_dims(1)?.matmul(&hidden.expand_dims(0)?)?,
    );
    out.insert("bias".into(), hidden.clone());
    Ok(out)
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

fn main() -> Result<()> {
    let p = linear::primitive();
    assert_eq!(
        p.trainables(),
        &[("weight".to_string(), 1), ("bias".to_string(), 2)]
    );
    let x = Tensor::from_vec(vec![1.0, -2.0, 0.5], &[3])?;
    let args = [
        x,
        Tensor::ones(&[3, 2], DType::F64),
        Tensor::ones(&[2], DType::F64),
    ];
    assert!(check_rules(&p, &args, &Params::new())?.is_ok());
    Ok(())
}
