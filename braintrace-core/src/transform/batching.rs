//! `vmap`: trace the per-example function, then interpret the graph with
//! each primitive's batching rule. Batched values carry the batch axis at
//! position 0 inside the interpreter.

use super::make_graph;
use crate::error::{Error, Result};
use crate::graph::{self, Graph};
use crate::ops::bcast_to_batch;
use crate::tensor::Tensor;

fn move_axis(x: &Tensor, from: usize, to: usize) -> Result<Tensor> {
    if from == to {
        return Ok(x.clone());
    }
    let mut perm: Vec<usize> = (0..x.ndim()).filter(|&a| a != from).collect();
    perm.insert(to, from);
    x.transpose(&perm)
}

/// Interpret `g` on operands batched along axis 0 (`batched[i]`), all of
/// batch size `size`. Returns outputs and whether each is batched.
pub fn vmap_graph(
    g: &Graph,
    args: &[Tensor],
    batched: &[bool],
    size: usize,
) -> Result<(Vec<Tensor>, Vec<bool>)> {
    if args.len() != g.invars.len() || batched.len() != args.len() {
        return Err(Error::arity(
            "vmap",
            format!("{} (with one batched flag each)", g.invars.len()),
            args.len().min(batched.len()),
        ));
    }
    for (i, ((a, &b), &v)) in args.iter().zip(batched).zip(&g.invars).enumerate() {
        let ex = if b {
            (a.ndim() >= 1 && a.shape()[0] == size).then(|| a.aval().with_shape(&a.shape()[1..]))
        } else {
            Some(a.aval())
        };
        if ex.as_ref() != Some(&g.avals[v]) {
            return Err(Error::transform(
                "vmap",
                format!(
                    "argument {i} is {}{} but the graph expects {} per example (batch size {size})",
                    a.aval(),
                    if b { " (batched on axis 0)" } else { "" },
                    g.avals[v]
                ),
            ));
        }
    }
    let inputs: Vec<(Tensor, bool)> = args.iter().cloned().zip(batched.iter().copied()).collect();
    let outs = graph::interpret(
        g,
        inputs,
        |c| (c.clone(), false),
        |e, args: Vec<(Tensor, bool)>| {
            let (ins, bs): (Vec<Tensor>, Vec<bool>) = args.into_iter().unzip();
            let (outs, obs) = if bs.iter().any(|&b| b) {
                e.prim().batch(&ins, &bs, size)?
            } else {
                let o = graph::bind(e.prim().clone(), &ins)?;
                let n = o.len();
                (o, vec![false; n])
            };
            if obs.len() != outs.len() {
                return Err(Error::invalid(
                    e.prim().name(),
                    format!(
                        "the batching rule returned {} flag(s) for {} output(s)",
                        obs.len(),
                        outs.len()
                    ),
                ));
            }
            Ok(outs.into_iter().zip(obs).collect())
        },
    )?;
    Ok(outs.into_iter().unzip())
}

/// Vectorise `f` over the axes `in_axes` (`None` = not mapped); outputs are
/// stacked on axis 0.
///
/// ```
/// use braintrace_core::{vmap, Tensor};
/// let f = vmap(|a: &[Tensor]| Ok(vec![a[0].sum_all()?]), vec![Some(0)]);
/// let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(f(&[x])?[0].to_vec_f64()?, vec![3.0, 7.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn vmap<F>(f: F, in_axes: Vec<Option<usize>>) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    vmap_out(f, in_axes, None)
}

/// [`vmap`] with explicit output axes (`None` = all outputs on axis 0).
pub fn vmap_out<F>(
    f: F,
    in_axes: Vec<Option<usize>>,
    out_axes: Option<Vec<usize>>,
) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    move |args: &[Tensor]| {
        if in_axes.len() != args.len() {
            return Err(Error::transform(
                "vmap",
                format!(
                    "in_axes has {} entries but the function got {} arguments",
                    in_axes.len(),
                    args.len()
                ),
            ));
        }
        let mut size: Option<usize> = None;
        let mut moved = Vec::with_capacity(args.len());
        for (i, (a, ax)) in args.iter().zip(&in_axes).enumerate() {
            match ax {
                None => moved.push(a.clone()),
                Some(ax) => {
                    if *ax >= a.ndim() {
                        return Err(Error::transform("vmap", format!("in_axes[{i}] = {ax} is out of range for argument {i} of shape {:?}", a.shape())));
                    }
                    let n = a.shape()[*ax];
                    if let Some(s) = size {
                        if s != n {
                            let sizes: Vec<String> = args
                                .iter()
                                .zip(&in_axes)
                                .map(|(a, ax)| match ax {
                                    Some(ax) => format!("{:?} axis {ax}", a.shape()),
                                    None => format!("{:?} unmapped", a.shape()),
                                })
                                .collect();
                            return Err(Error::transform(
                                "vmap",
                                format!("mapped axes have different sizes: {}", sizes.join(", ")),
                            ));
                        }
                    }
                    size = Some(n);
                    moved.push(move_axis(a, *ax, 0)?);
                }
            }
        }
        let size = size.ok_or_else(|| {
            Error::transform(
                "vmap",
                "at least one argument must be mapped (all in_axes are None)",
            )
        })?;
        let batched: Vec<bool> = in_axes.iter().map(Option::is_some).collect();
        let ex_avals: Vec<_> = moved
            .iter()
            .zip(&batched)
            .map(|(a, &b)| {
                if b {
                    a.aval().with_shape(&a.shape()[1..])
                } else {
                    a.aval()
                }
            })
            .collect();
        let g = make_graph(&f, &ex_avals)?;
        let (outs, obs) = vmap_graph(&g, &moved, &batched, size)?;
        if let Some(oa) = &out_axes {
            if oa.len() != outs.len() {
                return Err(Error::transform(
                    "vmap",
                    format!(
                        "out_axes has {} entries but the function has {} outputs",
                        oa.len(),
                        outs.len()
                    ),
                ));
            }
        }
        outs.into_iter()
            .zip(obs)
            .enumerate()
            .map(|(i, (o, b))| {
                let o = bcast_to_batch(&o, b, size)?;
                match &out_axes {
                    Some(oa) if oa[i] >= o.ndim() => Err(Error::transform(
                        "vmap",
                        format!(
                            "out_axes[{i}] = {} is out of range for an output of rank {}",
                            oa[i],
                            o.ndim()
                        ),
                    )),
                    Some(oa) => move_axis(&o, 0, oa[i]),
                    None => Ok(o),
                }
            })
            .collect()
    }
}
