//! `while_loop`: run a body graph on a carry while a condition graph on the
//! carry holds (JAX's `lax.while_loop`). Forward mode works (a loop over the
//! JVP of the body); reverse mode does not, since the trip count is known
//! only at run time: transposing a `while` is an error naming it.

use super::{batched_aval, closed, graph_param, mask_for, vmapped};
use crate::error::{Error, Result};
use crate::graph::{self, Graph, LinearArg, Primitive};
use crate::ops::{bcast_to_batch, where_};
use crate::tensor::{Aval, DType, Tensor};
use crate::transform::{jvp_graph, vmap_graph};
use std::any::Any;
use std::sync::Arc;

const OP: &str = "while";

/// The while primitive: operands `cond consts ++ body consts ++ init`,
/// results the final carry. The condition graph takes `cond consts ++
/// carry` and returns a boolean scalar; the body takes `body consts ++
/// carry` and returns the new carry.
#[derive(Clone, Debug)]
pub struct While {
    cond: Arc<Graph>,
    body: Arc<Graph>,
    cond_consts: usize,
    body_consts: usize,
}

/// The [`While`] behind a graph equation, if it is one.
pub fn as_while(prim: &dyn Primitive) -> Option<&While> {
    prim.as_any().downcast_ref::<While>()
}

/// `let mut c = init; while cond_fn(c) { c = body_fn(c) }; c` as one
/// `while` equation (JAX's `lax.while_loop`). `cond_fn` must return a
/// boolean scalar and `body_fn` a carry of the same shapes and dtypes as
/// `init`. Differentiable in forward mode (`jvp`) only.
///
/// ```
/// use braintrace_core::transform::while_loop;
/// use braintrace_core::Tensor;
/// // double x until it exceeds 10
/// let out = while_loop(
///     |c: &[Tensor]| c[0].le(&Tensor::scalar(10.0)),
///     |c: &[Tensor]| Ok(vec![c[0].mul_scalar(2.0)?]),
///     &[Tensor::scalar(3.0)],
/// )?;
/// assert_eq!(out[0].item()?, 12.0);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn while_loop<C, B>(cond_fn: C, body_fn: B, init: &[Tensor]) -> Result<Vec<Tensor>>
where
    C: Fn(&[Tensor]) -> Result<Tensor>,
    B: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let avals = crate::ops::avals(init);
    let (cg, ccaps) = closed(|a: &[Tensor]| Ok(vec![cond_fn(a)?]), &avals)?;
    let p = &cg.out_avals()[0];
    if p.ndim() != 0 || p.dtype() != DType::Bool {
        return Err(Error::shapes(
            "while_loop",
            [p.shape()],
            format!("argument cond_fn must return a boolean scalar, got {p}"),
        ));
    }
    let (bg, bcaps) = closed(|a: &[Tensor]| body_fn(a), &avals)?;
    let outs = bg.out_avals();
    if outs.len() != avals.len() {
        return Err(Error::invalid(
            "while_loop",
            format!(
                "argument body_fn returns {} value(s) but init has {}",
                outs.len(),
                avals.len()
            ),
        ));
    }
    for (k, (i, o)) in avals.iter().zip(&outs).enumerate() {
        if i != o {
            return Err(Error::shapes(
                "while_loop",
                [i.shape(), o.shape()],
                format!("argument body_fn changes carry {k} from {i} (init) to {o}; a carry must keep its shape and dtype"),
            ));
        }
    }
    let w = While {
        cond: Arc::new(cg),
        body: Arc::new(bg),
        cond_consts: ccaps.len(),
        body_consts: bcaps.len(),
    };
    let ops: Vec<Tensor> = ccaps
        .into_iter()
        .chain(bcaps)
        .chain(init.iter().cloned())
        .collect();
    w.bind(&ops)
}

impl While {
    /// The condition graph.
    pub fn cond(&self) -> &Graph {
        &self.cond
    }
    /// The body graph.
    pub fn body(&self) -> &Graph {
        &self.body
    }
    /// Bind on `cond consts ++ body consts ++ init`.
    pub fn bind(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        graph::bind(Arc::new(self.clone()), args)
    }
    fn num_carry(&self) -> usize {
        self.body.outvars().len()
    }
    fn holds(&self, consts: &[Tensor], carry: &[Tensor]) -> Result<bool> {
        let args: Vec<Tensor> = consts.iter().chain(carry).cloned().collect();
        Ok(self.cond.eval(&args)?[0].item()? != 0.0)
    }
}

/// Trace `f` on `avals`.
fn traced<F>(f: F, avals: &[Aval]) -> Result<Graph>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    graph::trace(f, avals)
}

impl Primitive for While {
    fn name(&self) -> String {
        OP.into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("cond_consts".into(), self.cond_consts.to_string()),
            ("body_consts".into(), self.body_consts.to_string()),
            ("cond".into(), graph_param(&self.cond)),
            ("body".into(), graph_param(&self.body)),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let (nc, nb, nk) = (self.cond_consts, self.body_consts, self.num_carry());
        if inputs.len() != nc + nb + nk {
            return Err(Error::arity(OP, nc + nb + nk, inputs.len()));
        }
        let want_c = self.cond.in_avals();
        let want_b = self.body.in_avals();
        let got_c = inputs[..nc].iter().chain(&inputs[nc + nb..]);
        let got_b = inputs[nc..].iter();
        for (i, (a, w)) in got_c.zip(&want_c).chain(got_b.zip(&want_b)).enumerate() {
            if a != w {
                return Err(Error::shapes(
                    OP,
                    [a.shape(), w.shape()],
                    format!("operand {i} is {a} but the loop's graphs take {w}"),
                ));
            }
        }
        Ok(self.body.out_avals())
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&crate::ops::avals(inputs))?;
        let (nc, nb) = (self.cond_consts, self.body_consts);
        let cconsts = &inputs[..nc];
        let bconsts = &inputs[nc..nc + nb];
        let mut carry = inputs[nc + nb..].to_vec();
        while self.holds(cconsts, &carry)? {
            let args: Vec<Tensor> = bconsts.iter().chain(&carry).cloned().collect();
            carry = self.body.eval(&args)?;
        }
        Ok(carry)
    }
    fn jvp(
        &self,
        primals: &[Tensor],
        tangents: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let (nc, nb, nk) = (self.cond_consts, self.body_consts, self.num_carry());
        let carry = &primals[nc + nb..];
        let float: Vec<bool> = carry.iter().map(|c| c.dtype().is_float()).collect();
        let dk: Vec<Tensor> = carry
            .iter()
            .zip(&tangents[nc + nb..])
            .zip(&float)
            .filter(|(_, &f)| f)
            .map(|((c, t), _)| t.clone().unwrap_or_else(|| c.zeros_like()))
            .collect();
        let hasb: Vec<bool> = tangents[nc..nc + nb]
            .iter()
            .zip(&primals[nc..nc + nb])
            .map(|(t, p)| t.is_some() && p.dtype().is_float())
            .collect();
        let db: Vec<Tensor> = tangents[nc..nc + nb]
            .iter()
            .zip(&hasb)
            .filter(|(_, &h)| h)
            .filter_map(|(t, _)| t.clone())
            .collect();
        let carry_avals = crate::ops::avals(carry);
        let dk_avals = crate::ops::avals(&dk);
        // The condition reads the primal carry only.
        let c_avals: Vec<Aval> = self
            .cond
            .in_avals()
            .into_iter()
            .chain(dk_avals.iter().cloned())
            .collect();
        let cond = &self.cond;
        let jc = traced(|a: &[Tensor]| cond.eval(&a[..nc + nk]), &c_avals)?;
        let b_avals: Vec<Aval> = primals[nc..nc + nb]
            .iter()
            .map(Tensor::aval)
            .chain(db.iter().map(Tensor::aval))
            .chain(carry_avals.iter().cloned())
            .chain(dk_avals.iter().cloned())
            .collect();
        let nd = db.len();
        let body = &self.body;
        let jb = traced(
            |a: &[Tensor]| {
                let mut p: Vec<Tensor> = a[..nb].to_vec();
                p.extend(a[nb + nd..nb + nd + nk].iter().cloned());
                let mut dbi = a[nb..nb + nd].iter();
                let mut dki = a[nb + nd + nk..].iter();
                let mut t: Vec<Option<Tensor>> = hasb
                    .iter()
                    .map(|&h| if h { dbi.next().cloned() } else { None })
                    .collect();
                t.extend(
                    float
                        .iter()
                        .map(|&f| if f { dki.next().cloned() } else { None }),
                );
                let (outs, touts) = jvp_graph(body, &p, &t)?;
                let mut res = outs.clone();
                for ((o, t), &f) in outs.iter().zip(touts).zip(&float) {
                    if f {
                        res.push(t.unwrap_or_else(|| o.zeros_like()));
                    }
                }
                Ok(res)
            },
            &b_avals,
        )?;
        let jw = While {
            cond: Arc::new(jc),
            body: Arc::new(jb),
            cond_consts: nc,
            body_consts: nb + nd,
        };
        let outs = self.bind(primals)?;
        let ops: Vec<Tensor> = primals[..nc + nb]
            .iter()
            .cloned()
            .chain(db)
            .chain(carry.iter().cloned())
            .chain(dk)
            .collect();
        let mut res = jw.bind(&ops)?.into_iter().skip(nk);
        let touts = float
            .iter()
            .map(|&f| if f { res.next() } else { None })
            .collect();
        Ok((outs, touts))
    }
    fn transpose(
        &self,
        _cts: &[Option<Tensor>],
        _args: &[LinearArg],
    ) -> Result<Vec<Option<Tensor>>> {
        Err(Error::invalid(
            OP,
            "reverse-mode differentiation (grad, vjp) through a while loop is not supported: \
             its trip count is known only at run time; use scan with a fixed length, or \
             forward mode (jvp)",
        ))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let (nc, nb, nk) = (self.cond_consts, self.body_consts, self.num_carry());
        let mut flags = batched.to_vec();
        let cflags =
            |f: &[bool]| -> Vec<bool> { f[..nc].iter().chain(&f[nc + nb..]).copied().collect() };
        loop {
            let (_, ob) = vmapped(&self.body, &flags[nc..], size, &[])?;
            let mut changed = false;
            for k in 0..nk {
                if ob[k] && !flags[nc + nb + k] {
                    flags[nc + nb + k] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let (_, pb) = vmapped(&self.cond, &cflags(&flags), size, &[])?;
        if !pb[0] {
            // One trip count for the whole batch.
            let force: Vec<bool> = flags[nc + nb..].to_vec();
            let (vc, _) = vmapped(&self.cond, &cflags(&flags), size, &[])?;
            let (vb, _) = vmapped(&self.body, &flags[nc..], size, &force)?;
            let ops = args
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    if i >= nc + nb {
                        bcast_to_batch(a, batched[i] || !flags[i], size)
                    } else {
                        Ok(a.clone())
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let w = While {
                cond: Arc::new(vc),
                body: Arc::new(vb),
                ..self.clone()
            };
            return Ok((w.bind(&ops)?, force));
        }
        // A trip count per example: loop while any example's condition
        // holds, and leave the carries of finished examples unchanged.
        for f in &mut flags[nc + nb..] {
            *f = true;
        }
        let cf = cflags(&flags);
        let avals_of = |fl: &[bool], xs: &[Aval]| -> Vec<Aval> {
            xs.iter()
                .zip(fl)
                .map(|(a, &b)| if b { batched_aval(a, size) } else { a.clone() })
                .collect()
        };
        let c_avals = avals_of(&cf, &self.cond.in_avals());
        let cond = &self.cond;
        let any = traced(
            |a: &[Tensor]| {
                let (o, ob) = vmap_graph(cond, a, &cf, size)?;
                let p = bcast_to_batch(&o[0], ob[0], size)?;
                Ok(vec![p
                    .cast(DType::F64)?
                    .sum_all()?
                    .gt(&Tensor::scalar(0.0))?])
            },
            &c_avals,
        )?;
        // The masked body takes the condition's consts first.
        let bf: Vec<bool> = flags[..nc].iter().chain(&flags[nc..]).copied().collect();
        let b_in: Vec<Aval> = self.cond.in_avals()[..nc]
            .iter()
            .chain(&self.body.in_avals())
            .cloned()
            .collect();
        let b_avals = avals_of(&bf, &b_in);
        let body = &self.body;
        let bflags = flags[nc..].to_vec();
        let masked = traced(
            |a: &[Tensor]| {
                let carry = &a[nc + nb..];
                let cargs: Vec<Tensor> = a[..nc].iter().chain(carry).cloned().collect();
                let (o, ob) = vmap_graph(cond, &cargs, &cf, size)?;
                let p = bcast_to_batch(&o[0], ob[0], size)?;
                let (new, nbf) = vmap_graph(body, &a[nc..], &bflags, size)?;
                new.iter()
                    .zip(nbf)
                    .zip(carry)
                    .map(|((n, b), c)| {
                        let n = bcast_to_batch(n, b, size)?;
                        where_(&mask_for(&p, n.ndim())?, &n, c)
                    })
                    .collect()
            },
            &b_avals,
        )?;
        let w = While {
            cond: Arc::new(any),
            body: Arc::new(masked),
            cond_consts: nc,
            body_consts: nc + nb,
        };
        let mut ops: Vec<Tensor> = args[..nc].to_vec();
        ops.extend(args[..nc].iter().cloned());
        ops.extend(args[nc..nc + nb].iter().cloned());
        for (i, a) in args.iter().enumerate().skip(nc + nb) {
            ops.push(bcast_to_batch(a, batched[i], size)?);
        }
        Ok((w.bind(&ops)?, vec![true; nk]))
    }
    fn cse_key(&self) -> Option<String> {
        Some(format!(
            "while@{:p}/{:p}",
            Arc::as_ptr(&self.cond),
            Arc::as_ptr(&self.body)
        ))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
