//! A short tour of the tracing core: one tanh-RNN step
//! `h' = tanh(x @ Wx + h @ Wh + b)`, its graph, and the transforms
//! `jvp`, `grad`, `vmap` and `jit` applied to it.
//!
//! Run with `cargo run --release --example tour`.

use braintrace::prelude::*;

const INPUT: usize = 3;
const HIDDEN: usize = 4;

/// A deterministic pseudo-random tensor in `[-scale, scale)` (no `rand` needed).
fn det_tensor(shape: &[usize], seed: u64, scale: f64) -> Result<Tensor> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, shape)
}

/// One RNN step. Arguments: `[x, h, wx, wh, b]`; result: `[h']`.
fn rnn_step(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, h, wx, wh, b) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
    Ok(vec![x.matmul(wx)?.add(&h.matmul(wh)?)?.add(b)?.tanh()?])
}

/// Round to 4 decimals for compact printing.
fn show(t: &Tensor) -> Result<String> {
    let v: Vec<String> = t.to_vec_f64()?.iter().map(|x| format!("{x:+.4}")).collect();
    Ok(format!("{:?} [{}]", t.shape(), v.join(", ")))
}

fn main() -> Result<()> {
    let x = det_tensor(&[INPUT], 1, 1.0)?;
    let h = det_tensor(&[HIDDEN], 2, 0.5)?;
    let wx = det_tensor(&[INPUT, HIDDEN], 3, 0.6)?;
    let wh = det_tensor(&[HIDDEN, HIDDEN], 4, 0.6)?;
    let b = det_tensor(&[HIDDEN], 5, 0.1)?;
    let args = [x.clone(), h.clone(), wx.clone(), wh.clone(), b.clone()];

    println!("== 1. the graph ==");
    println!("make_graph traces rnn_step once on abstract values (shape + dtype);");
    println!("each line is one equation: outputs with their types, primitive, inputs.");
    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
    let g = make_graph(rnn_step, &avals)?;
    println!("{g}\n");

    println!("== 2. eager evaluation ==");
    println!("the same function on concrete tensors computes h' directly:");
    let h_next = rnn_step(&args)?.remove(0);
    println!("  h'          = {}\n", show(&h_next)?);

    println!("== 3. jvp: forward mode ==");
    println!("directional derivative of h' along a change of h (tangent v = 1):");
    let zeros: Vec<Tensor> = args.iter().map(Tensor::zeros_like).collect();
    let mut tangents = zeros.clone();
    tangents[1] = h.ones_like();
    let (_, dh) = jvp(rnn_step, &args, &tangents)?;
    println!("  dh'/dh . v  = {}\n", show(&dh[0])?);

    println!("== 4. grad: reverse mode ==");
    println!("gradient of the loss L = sum(h'^2) with respect to every argument:");
    let loss = |a: &[Tensor]| rnn_step(a)?.remove(0).square()?.sum_all();
    let (l, gs) = value_and_grad(loss)(&args)?;
    println!("  L           = {:+.6}", l.item()?);
    for (name, gi) in ["x", "h", "Wx", "Wh", "b"].iter().zip(&gs) {
        let n2 = gi.square()?.sum_all()?.item()?.sqrt();
        println!("  |dL/d{name:<2}|    = {n2:.6}  shape {:?}", gi.shape());
    }
    println!("  dL/db       = {}\n", show(&gs[4])?);

    println!("== 5. vmap: batching ==");
    println!("map over a batch of 3 inputs x (axis 0); h and the weights are shared:");
    let xs = det_tensor(&[3, INPUT], 6, 1.0)?;
    let batched = vmap(rnn_step, vec![Some(0), None, None, None, None]);
    let hb = batched(&[xs.clone(), h.clone(), wx.clone(), wh.clone(), b.clone()])?;
    println!("  h' batch    shape {:?}", hb[0].shape());
    for i in 0..3 {
        let xi = xs.index_axis0(i)?;
        let hi = rnn_step(&[xi, h.clone(), wx.clone(), wh.clone(), b.clone()])?.remove(0);
        let d = hb[0].index_axis0(i)?.sub(&hi)?.abs()?.sum_all()?.item()?;
        println!(
            "  row {i}: {}  (|vmap - loop| = {d:.1e})",
            show(&hb[0].index_axis0(i)?)?
        );
    }
    println!();

    println!("== 6. jit: trace once, run the cached graph ==");
    println!("jit traces on the first call per input shapes, then reuses the graph:");
    let step = braintrace::Jit::new(rnn_step);
    let h1 = step.call(&args)?.remove(0);
    let h2 = step.call(&[
        xs.index_axis0(0)?,
        h.clone(),
        wx.clone(),
        wh.clone(),
        b.clone(),
    ])?;
    let d = h1.sub(&h_next)?.abs()?.sum_all()?.item()?;
    println!("  jit h'      = {}  (|jit - eager| = {d:.1e})", show(&h1)?);
    println!("  2nd call    = {}", show(&h2[0])?);
    println!("  traces after two calls: {}", step.trace_count());
    println!("transforms nest: jit(vmap(grad(L))) = per-example dL/db, compiled:");
    let per_example = jit(vmap(grad(loss), vec![Some(0), None, None, None, None]));
    let pg = per_example(&[xs, h, wx, wh, b])?;
    for i in 0..3 {
        println!("    example {i}: {}", show(&pg[4].index_axis0(i)?)?);
    }
    Ok(())
}
