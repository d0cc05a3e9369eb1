//! The seed's custom op, `etp_my_op: y = scale * (x @ w)`, defined with the
//! macros: prints its spec and graph, checks its rules with the rule
//! checker, and shows `bind`, `grad`, `vmap`, `jvp` and `jit`.
//!
//! Run: `cargo run --release --example custom_primitive`

use braintrace::etp::{check_rules, get_primitive_spec, primitive_by_name, ETP_RULES_YW_TO_W};
use braintrace::prelude::*;

/// y = scale * (x @ w), x `(B, I)`, w `(I, O)`.
#[etp_primitive(name = "etp_my_op", batched, x = x, weight = w)]
fn my_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

/// D-RTRL trace propagation: `trace[..., i, o] *= hidden[..., o]`.
#[yw_to_w(my_op)]
fn my_op_yw_to_w(hidden: &Tensor, trace: &Tensor, _p: &my_op::Params) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}

/// dL/dw: the VJP of `w -> my_op(x, w)` at cotangent `hidden`: `scale · xᵀ h`.
#[xy_to_dw(my_op)]
fn my_op_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor, p: &my_op::Params) -> Result<Tensor> {
    let xt_h = if x.ndim() == 1 {
        x.expand_dims(1)?.mul(&hidden.expand_dims(0)?)?
    } else {
        x.t()?.matmul(hidden)?
    };
    xt_h.mul_scalar(p.scale)
}

/// Zeros `(B, I, O, S)` for the parameter-dimension trace.
#[init_drtrl(my_op)]
fn my_op_init_drtrl(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    let shape = [&[x.shape()[0]], w.shape(), &[num_hidden_state]].concat();
    Ok(Tensor::zeros(&shape, y.dtype()))
}

/// Zeros `(*y.shape, S)` for the output-dimension (pp_prop) trace.
#[init_pp(my_op)]
fn my_op_init_pp(_x: &Aval, y: &Aval, _w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(
        &[y.shape(), &[num_hidden_state]].concat(),
        y.dtype(),
    ))
}

fn main() -> Result<()> {
    let p = my_op::primitive();
    println!("== the primitive");
    println!(
        "name {}, batched {}, gradient_enabled {}, x index {:?}, trainables {:?}",
        p.name(),
        p.is_batched(),
        p.is_gradient_enabled(),
        p.x_index(),
        p.trainables()
    );
    let spec = get_primitive_spec(&p).expect("macro primitives have a spec");
    println!("spec: {spec:?}");
    assert!(std::sync::Arc::ptr_eq(&spec, &my_op::SPEC));
    assert_eq!(primitive_by_name("etp_my_op"), Some(p.clone()));
    assert!(ETP_RULES_YW_TO_W.contains(&p));

    let x = Tensor::ones(&[4, 3], DType::F64);
    let w = Tensor::ones(&[3, 5], DType::F64);

    println!("\n== bind: y = my_op(x, w, scale = 0.5)");
    let y = my_op(&x, &w, 0.5)?;
    println!("{y}");
    assert!(y.to_vec_f64()?.iter().all(|&v| v == 1.5));

    println!("\n== its graph: one equation, params visible");
    let f = |a: &[Tensor]| Ok(vec![my_op(&a[0], &a[1], 0.5)?]);
    println!("{}", make_graph(f, &[x.aval(), w.aval()])?);

    println!("\n== grad of sum(y) w.r.t. w (all 2.0)");
    let g = grad(|a: &[Tensor]| my_op(&a[0], &a[1], 0.5)?.sum_all())(&[x.clone(), w.clone()])?;
    println!("{}", g[1]);
    assert!(g[1].to_vec_f64()?.iter().all(|&v| v == 2.0));

    println!("\n== jvp along (x, w) = (ones, 0): 0.5 * ones @ w = 1.5");
    let (_, t) = jvp(f, &[x.clone(), w.clone()], &[x.ones_like(), w.zeros_like()])?;
    println!("{}", t[0]);

    println!("\n== vmap over a leading axis of x (3 batches of 4 rows) equals the loop");
    let xs = Tensor::from_vec((0..36).map(|i| i as f64 / 36.0).collect(), &[3, 4, 3])?;
    let ys = vmap(f, vec![Some(0), None])(&[xs.clone(), w.clone()])?.remove(0);
    for b in 0..3 {
        let yb = my_op(&xs.index_axis0(b)?, &w, 0.5)?;
        assert_eq!(ys.index_axis0(b)?.to_vec_f64()?, yb.to_vec_f64()?);
    }
    println!("shape {:?}, equal to the per-batch loop", ys.shape());

    println!("\n== jit: traced once, same values");
    let jf = braintrace::Jit::new(f);
    let y1 = jf.call(&[x.clone(), w.clone()])?;
    let y2 = jf.call(&[x.clone(), w.clone()])?;
    assert_eq!(y1[0].to_vec_f64()?, y.to_vec_f64()?);
    assert_eq!(y2[0].to_vec_f64()?, y.to_vec_f64()?);
    println!(
        "traces: {}, lowered graph:\n{}",
        jf.trace_count(),
        jf.cached_graph(&[x.aval(), w.aval()]).expect("cached")
    );

    println!("\n== the rule checker");
    let xr = Tensor::from_vec((0..12).map(|i| (i as f64 * 0.37).sin()).collect(), &[4, 3])?;
    let wr = Tensor::from_vec((0..15).map(|i| (i as f64 * 0.11).cos()).collect(), &[3, 5])?;
    let report = check_rules(&p, &[xr, wr], &my_op::Params { scale: 0.5 }.to_params())?;
    print!("{report}");
    assert!(report.is_ok());
    Ok(())
}
