//! `scan`: a body graph run a fixed number of times over a carry and
//! per-iteration slices of `xs`, stacking the per-iteration outputs `ys`
//! (JAX's `lax.scan`). Its transpose is a scan in the opposite direction
//! over the transposed body, so reverse mode through a fixed-count loop
//! works; known carries are recomputed by a forward scan first.

use super::{batched_aval, closed, dependent_outputs, graph_param, swap01, vmapped};
use crate::error::{Error, Result};
use crate::graph::{self, Graph, LinearArg, Primitive};
use crate::ops::{bcast_to_batch, stack};
use crate::tensor::{Aval, Tensor};
use crate::transform::{jvp_graph, transpose as transpose_graph};
use std::any::Any;
use std::sync::Arc;

const OP: &str = "scan";

/// The scan primitive: operands `consts ++ init ++ xs`, results
/// `final carry ++ ys`. The body takes `consts ++ carry ++ one slice of each
/// x` and returns `new carry ++ one slice of each y`; `ys[i]` is the slice
/// produced by iteration `i` (also when `reverse` runs the iterations from
/// the last index to the first).
#[derive(Clone, Debug)]
pub struct Scan {
    body: Arc<Graph>,
    num_consts: usize,
    num_carry: usize,
    length: usize,
    reverse: bool,
}

/// The [`Scan`] behind a graph equation, if it is one.
pub fn as_scan(prim: &dyn Primitive) -> Option<&Scan> {
    prim.as_any().downcast_ref::<Scan>()
}

/// Run `f(carry, x) -> (carry, y)` over the leading axis of `xs`, `length`
/// times, from `init`: returns the final carry and the stacked `ys`
/// (JAX's `lax.scan`). While tracing it is one `scan` equation; `jvp`,
/// `grad`, `vmap` and `jit` all go through it.
///
/// `length` may be `None` when `xs` is not empty (it is their leading
/// length). The body must return a carry of the same shapes and dtypes as
/// `init`.
///
/// ```
/// use braintrace_core::transform::scan;
/// use braintrace_core::Tensor;
/// // cumulative sum: carry s, y = s after adding x
/// let xs = Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3])?;
/// let (c, ys) = scan(
///     |c: &[Tensor], x: &[Tensor]| {
///         let s = c[0].add(&x[0])?;
///         Ok((vec![s.clone()], vec![s]))
///     },
///     &[Tensor::scalar(0.0)],
///     &[xs],
///     None,
/// )?;
/// assert_eq!(c[0].item()?, 6.0);
/// assert_eq!(ys[0].to_vec_f64()?, vec![1.0, 3.0, 6.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn scan<F>(
    f: F,
    init: &[Tensor],
    xs: &[Tensor],
    length: Option<usize>,
) -> Result<(Vec<Tensor>, Vec<Tensor>)>
where
    F: Fn(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
{
    let length = scan_length(xs, length)?;
    let nk = init.len();
    let mut avals = crate::ops::avals(init);
    for x in xs {
        avals.push(x.aval().with_shape(&x.shape()[1..]));
    }
    let mut num_carry_out = 0;
    let (body, captured) = closed(
        |a: &[Tensor]| {
            let (c, y) = f(&a[..nk], &a[nk..])?;
            num_carry_out = c.len();
            Ok(c.into_iter().chain(y).collect())
        },
        &avals,
    )?;
    if num_carry_out != nk {
        return Err(Error::invalid(
            OP,
            format!("the body returns {num_carry_out} carry value(s) but init has {nk}"),
        ));
    }
    let outs = body.out_avals();
    for (k, (i, o)) in init.iter().zip(&outs).enumerate() {
        if i.aval() != *o {
            return Err(Error::shapes(
                OP,
                [i.shape(), o.shape()],
                format!(
                    "the body changes carry {k} from {} (init) to {o}; a carry must keep its shape and dtype",
                    i.aval()
                ),
            ));
        }
    }
    let s = Scan {
        body: Arc::new(body),
        num_consts: captured.len(),
        num_carry: nk,
        length,
        reverse: false,
    };
    let args: Vec<Tensor> = captured
        .into_iter()
        .chain(init.iter().cloned())
        .chain(xs.iter().cloned())
        .collect();
    let mut res = s.bind(&args)?;
    let ys = res.split_off(nk);
    Ok((res, ys))
}

/// The number of iterations: `length`, checked against the leading axis of
/// every `xs`.
fn scan_length(xs: &[Tensor], length: Option<usize>) -> Result<usize> {
    let mut found: Option<(usize, usize)> = length.map(|l| (l, usize::MAX));
    for (i, x) in xs.iter().enumerate() {
        if x.ndim() == 0 {
            return Err(Error::shapes(
                OP,
                [x.shape()],
                format!("argument xs[{i}] is a scalar; each x needs a leading axis to scan over"),
            ));
        }
        let l = x.shape()[0];
        match found {
            None => found = Some((l, i)),
            Some((want, from)) if want != l => {
                let by = if from == usize::MAX {
                    format!("length is {want}")
                } else {
                    format!("xs[{from}] has leading length {want}")
                };
                let mut shapes = vec![x.shape().to_vec()];
                if from != usize::MAX {
                    shapes.insert(0, xs[from].shape().to_vec());
                }
                return Err(Error::shapes(
                    OP,
                    shapes,
                    format!("argument xs[{i}] has leading length {l} but {by}"),
                ));
            }
            Some(_) => {}
        }
    }
    found.map(|(l, _)| l).ok_or_else(|| {
        Error::invalid(
            OP,
            "argument length is required when there are no xs to scan over",
        )
    })
}

impl Scan {
    /// A scan of `body` (`consts ++ carry ++ x slices -> carry ++ y
    /// slices`) with the first `num_consts` inputs constant and the next
    /// `num_carry` carried, run `length` times (last index first when
    /// `reverse`). Checks that the body keeps the carry's avals.
    pub fn new(
        body: Graph,
        num_consts: usize,
        num_carry: usize,
        length: usize,
        reverse: bool,
    ) -> Result<Scan> {
        let ins = body.in_avals();
        let outs = body.out_avals();
        if num_consts + num_carry > ins.len() || num_carry > outs.len() {
            return Err(Error::invalid(
                OP,
                format!(
                    "a body with {} inputs and {} outputs cannot have {num_consts} consts and {num_carry} carries",
                    ins.len(),
                    outs.len()
                ),
            ));
        }
        for k in 0..num_carry {
            let (i, o) = (&ins[num_consts + k], &outs[k]);
            if i != o {
                return Err(Error::shapes(
                    OP,
                    [i.shape(), o.shape()],
                    format!("the body changes carry {k} from {i} to {o}"),
                ));
            }
        }
        Ok(Scan {
            body: Arc::new(body),
            num_consts,
            num_carry,
            length,
            reverse,
        })
    }
    /// The body graph.
    pub fn body(&self) -> &Graph {
        &self.body
    }
    /// The number of iterations.
    pub fn length(&self) -> usize {
        self.length
    }
    /// Whether the iterations run from the last index to the first.
    pub fn reverse(&self) -> bool {
        self.reverse
    }
    /// How many leading operands are constants of every iteration.
    pub fn num_consts(&self) -> usize {
        self.num_consts
    }
    /// How many operands after the constants are carried.
    pub fn num_carry(&self) -> usize {
        self.num_carry
    }
    /// Bind on `args` (`consts ++ init ++ xs`).
    pub fn bind(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        graph::bind(Arc::new(self.clone()), args)
    }
    /// Run the iterations one after the other by evaluating the body
    /// (eagerly, or recorded into the active trace: the loop unrolled, as
    /// the learning compiler inlines a fixed-count scan). `args` are
    /// `consts ++ init ++ xs`; returns `final carry ++ ys`.
    pub fn unroll(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&crate::ops::avals(inputs))?;
        let (nc, nk) = (self.num_consts, self.num_carry);
        let (consts, rest) = inputs.split_at(nc);
        let (init, xs) = rest.split_at(nk);
        let mut carry = init.to_vec();
        let mut ys: Vec<Vec<Tensor>> = vec![Vec::with_capacity(self.length); self.num_ys()];
        for i in self.order() {
            let mut args = consts.to_vec();
            args.append(&mut carry);
            for x in xs {
                args.push(x.index_axis0(i)?);
            }
            let mut outs = self.body.eval(&args)?;
            for (list, y) in ys.iter_mut().zip(outs.split_off(nk)) {
                list.push(y);
            }
            carry = outs;
        }
        let y_avals = self.body.out_avals().split_off(nk);
        let mut res = carry;
        for (mut list, a) in ys.into_iter().zip(y_avals) {
            if self.reverse {
                list.reverse();
            }
            res.push(if list.is_empty() {
                Tensor::zeros_aval(&self.stacked(&a))
            } else {
                stack(&list, 0)?
            });
        }
        Ok(res)
    }
    fn num_ys(&self) -> usize {
        self.body.outvars().len() - self.num_carry
    }
    fn order(&self) -> Box<dyn Iterator<Item = usize>> {
        if self.reverse {
            Box::new((0..self.length).rev())
        } else {
            Box::new(0..self.length)
        }
    }
    /// The stacked aval of a per-iteration aval.
    fn stacked(&self, a: &Aval) -> Aval {
        batched_aval(a, self.length)
    }
}

fn role(i: usize, nc: usize, nk: usize) -> String {
    if i < nc {
        format!("const {i}")
    } else if i < nc + nk {
        format!("carry {}", i - nc)
    } else {
        format!("xs[{}]", i - nc - nk)
    }
}

impl Primitive for Scan {
    fn name(&self) -> String {
        OP.into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("length".into(), self.length.to_string()),
            ("reverse".into(), self.reverse.to_string()),
            ("num_consts".into(), self.num_consts.to_string()),
            ("num_carry".into(), self.num_carry.to_string()),
            ("body".into(), graph_param(&self.body)),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let want = self.body.in_avals();
        if inputs.len() != want.len() {
            return Err(Error::arity(OP, want.len(), inputs.len()));
        }
        let (nc, nk) = (self.num_consts, self.num_carry);
        for (i, (a, w)) in inputs.iter().zip(&want).enumerate() {
            let per_iter = if i < nc + nk {
                Some(a.clone())
            } else {
                (a.ndim() >= 1 && a.shape()[0] == self.length)
                    .then(|| a.with_shape(&a.shape()[1..]))
            };
            if per_iter.as_ref() != Some(w) {
                let expected = if i < nc + nk {
                    w.clone()
                } else {
                    self.stacked(w)
                };
                return Err(Error::shapes(
                    OP,
                    [a.shape(), expected.shape()],
                    format!(
                        "operand {} is {a} but the body needs {expected} (length {})",
                        role(i, nc, nk),
                        self.length
                    ),
                ));
            }
        }
        let outs = self.body.out_avals();
        Ok(outs[..nk]
            .iter()
            .cloned()
            .chain(outs[nk..].iter().map(|a| self.stacked(a)))
            .collect())
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.unroll(inputs)
    }
    fn jvp(
        &self,
        primals: &[Tensor],
        tangents: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let (nc, nk) = (self.num_consts, self.num_carry);
        let n = primals.len();
        let in_avals = self.body.in_avals();
        let out_avals = self.body.out_avals();
        // Every float carry carries a tangent (a zero one may become
        // non-zero through the other tangents); consts and xs only those
        // given one.
        let has: Vec<bool> = (0..n)
            .map(|i| {
                in_avals[i].dtype().is_float()
                    && ((nc..nc + nk).contains(&i) || tangents[i].is_some())
            })
            .collect();
        let groups = [0..nc, nc..nc + nk, nc + nk..n];
        let mut avals = Vec::new();
        let mut operands = Vec::new();
        for r in groups.iter().cloned() {
            for i in r.clone() {
                avals.push(in_avals[i].clone());
                operands.push(primals[i].clone());
            }
            for i in r.filter(|&i| has[i]) {
                avals.push(in_avals[i].clone());
                operands.push(
                    tangents[i]
                        .clone()
                        .unwrap_or_else(|| primals[i].zeros_like()),
                );
            }
        }
        let count = |r: &std::ops::Range<usize>| r.clone().filter(|&i| has[i]).count();
        let (dc, dk) = (count(&groups[0]), count(&groups[1]));
        let y_float: Vec<bool> = out_avals[nk..]
            .iter()
            .map(|a| a.dtype().is_float())
            .collect();
        let body = &self.body;
        let tbody = graph::trace(
            |a: &[Tensor]| {
                // Unpack `group primals ++ group tangents` for each group.
                let mut p = Vec::with_capacity(n);
                let mut t: Vec<Option<Tensor>> = Vec::with_capacity(n);
                let mut pos = 0;
                for r in groups.iter().cloned() {
                    let len = r.len();
                    p.extend(a[pos..pos + len].iter().cloned());
                    let mut tp = pos + len;
                    for i in r {
                        if has[i] {
                            t.push(Some(a[tp].clone()));
                            tp += 1;
                        } else {
                            t.push(None);
                        }
                    }
                    pos = tp;
                }
                let (outs, touts) = jvp_graph(body, &p, &t)?;
                let mut res: Vec<Tensor> = outs[..nk].to_vec();
                for k in 0..nk {
                    if has[nc + k] {
                        res.push(touts[k].clone().unwrap_or_else(|| outs[k].zeros_like()));
                    }
                }
                for (j, &f) in y_float.iter().enumerate() {
                    if f {
                        let o = &outs[nk + j];
                        res.push(touts[nk + j].clone().unwrap_or_else(|| o.zeros_like()));
                    }
                }
                Ok(res)
            },
            &avals,
        )?;
        let ts = Scan {
            body: Arc::new(tbody),
            num_consts: nc + dc,
            num_carry: nk + dk,
            length: self.length,
            reverse: self.reverse,
        };
        let outs = self.bind(primals)?;
        let mut res = ts.bind(&operands)?.into_iter().skip(nk);
        let mut touts = Vec::with_capacity(outs.len());
        for k in 0..nk {
            touts.push(if has[nc + k] { res.next() } else { None });
        }
        for &f in &y_float {
            touts.push(if f { res.next() } else { None });
        }
        Ok((outs, touts))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let (nc, nk) = (self.num_consts, self.num_carry);
        let n = args.len();
        if cts.iter().all(Option::is_none) {
            return Ok(vec![None; n]);
        }
        let body = &*self.body;
        let in_avals = body.in_avals();
        let out_avals = body.out_avals();
        // A carry whose update reads a linear value is linear too (a zero
        // tangent carry given as a known value, in a JVP's scan).
        let mut lin: Vec<bool> = args.iter().map(LinearArg::is_linear).collect();
        loop {
            let dep = dependent_outputs(body, &lin);
            let mut changed = false;
            for k in 0..nk {
                if dep[k] && !lin[nc + k] {
                    lin[nc + k] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let known = |i: usize| args[i].known(OP).cloned();
        let pick = |r: std::ops::Range<usize>, want: bool| -> Vec<usize> {
            r.filter(|&i| lin[i] == want).collect()
        };
        let (kc, kk, kx) = (
            pick(0..nc, false),
            pick(nc..nc + nk, false),
            pick(nc + nk..n, false),
        );
        let (lc, lk, lx) = (
            pick(0..nc, true),
            pick(nc..nc + nk, true),
            pick(nc + nk..n, true),
        );
        let kc_vals = kc.iter().map(|&i| known(i)).collect::<Result<Vec<_>>>()?;
        let kk_vals = kk.iter().map(|&i| known(i)).collect::<Result<Vec<_>>>()?;
        let kx_vals = kx.iter().map(|&i| known(i)).collect::<Result<Vec<_>>>()?;

        // Forward: the known carries entering each iteration.
        let stacked_kk: Vec<Tensor> = if kk.is_empty() {
            Vec::new()
        } else {
            let avals: Vec<Aval> = kc
                .iter()
                .chain(&kk)
                .chain(&kx)
                .map(|&i| in_avals[i].clone())
                .collect();
            let fwd = graph::trace(
                |a: &[Tensor]| {
                    let mut full: Vec<Tensor> = in_avals.iter().map(Tensor::zeros_aval).collect();
                    for (&i, t) in kc.iter().chain(&kk).chain(&kx).zip(a) {
                        full[i] = t.clone();
                    }
                    let outs = body.eval(&full)?;
                    let mut res: Vec<Tensor> = kk.iter().map(|&i| outs[i - nc].clone()).collect();
                    res.extend(a[kc.len()..kc.len() + kk.len()].iter().cloned());
                    Ok(res)
                },
                &avals,
            )?;
            let f = Scan {
                body: Arc::new(fwd),
                num_consts: kc.len(),
                num_carry: kk.len(),
                length: self.length,
                reverse: self.reverse,
            };
            let ops: Vec<Tensor> = kc_vals
                .iter()
                .chain(&kk_vals)
                .chain(&kx_vals)
                .cloned()
                .collect();
            f.bind(&ops)?.split_off(kk.len())
        };

        // Backward: the transposed body, iterated in the other direction.
        let tg = transpose_graph(body, &lin)?;
        let ny = out_avals.len() - nk;
        let avals: Vec<Aval> = kc
            .iter()
            .chain(&lk)
            .chain(&lc)
            .chain(&kk)
            .chain(&kx)
            .map(|&i| in_avals[i].clone())
            .chain(out_avals[nk..].iter().cloned())
            .collect();
        let bwd = graph::trace(
            |a: &[Tensor]| {
                let (kcv, rest) = a.split_at(kc.len());
                let (ctk, rest) = rest.split_at(lk.len());
                let (acc, rest) = rest.split_at(lc.len());
                let (kkv, rest) = rest.split_at(kk.len());
                let (kxv, cty) = rest.split_at(kx.len());
                let mut tin: Vec<Tensor> = kcv.iter().chain(kkv).chain(kxv).cloned().collect();
                let mut ctk_it = ctk.iter();
                for k in 0..nk {
                    tin.push(if lin[nc + k] {
                        ctk_it
                            .next()
                            .cloned()
                            .unwrap_or_else(|| Tensor::zeros_aval(&out_avals[k]))
                    } else {
                        Tensor::zeros_aval(&out_avals[k])
                    });
                }
                tin.extend(cty.iter().cloned());
                let r = tg.eval(&tin)?;
                let (rc, rest) = r.split_at(lc.len());
                let (rk, rx) = rest.split_at(lk.len());
                let mut res: Vec<Tensor> = rk.to_vec();
                for (s, c) in acc.iter().zip(rc) {
                    res.push(s.add(c)?);
                }
                res.extend(rx.iter().cloned());
                Ok(res)
            },
            &avals,
        )?;
        let b = Scan {
            body: Arc::new(bwd),
            num_consts: kc.len(),
            num_carry: lk.len() + lc.len(),
            length: self.length,
            reverse: !self.reverse,
        };
        let mut ops: Vec<Tensor> = kc_vals;
        for &i in &lk {
            let k = i - nc;
            ops.push(
                cts[k]
                    .clone()
                    .unwrap_or_else(|| Tensor::zeros_aval(&out_avals[k])),
            );
        }
        for &i in &lc {
            ops.push(Tensor::zeros_aval(&in_avals[i]));
        }
        ops.extend(stacked_kk);
        ops.extend(kx_vals);
        for j in 0..ny {
            ops.push(
                cts[nk + j]
                    .clone()
                    .unwrap_or_else(|| Tensor::zeros_aval(&self.stacked(&out_avals[nk + j]))),
            );
        }
        let res = b.bind(&ops)?;
        let (rk, rest) = res.split_at(lk.len());
        let (rc, rx) = rest.split_at(lc.len());
        let mut out: Vec<Option<Tensor>> = vec![None; n];
        for (&i, t) in lc
            .iter()
            .zip(rc)
            .chain(lk.iter().zip(rk))
            .chain(lx.iter().zip(rx))
        {
            if args[i].is_linear() {
                out[i] = Some(t.clone());
            }
        }
        Ok(out)
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let (nc, nk) = (self.num_consts, self.num_carry);
        let ny = self.num_ys();
        // A carry updated from batched values is batched from the start.
        let mut flags = batched.to_vec();
        loop {
            let (_, ob) = vmapped(&self.body, &flags, size, &[])?;
            let mut changed = false;
            for k in 0..nk {
                if ob[k] && !flags[nc + k] {
                    flags[nc + k] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let force: Vec<bool> = (0..nk + ny).map(|j| j < nk && flags[nc + j]).collect();
        let (vb, ob) = vmapped(&self.body, &flags, size, &force)?;
        let mut ops = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            ops.push(if (nc..nc + nk).contains(&i) {
                bcast_to_batch(a, batched[i] || !flags[i], size)?
            } else if i >= nc + nk && batched[i] {
                swap01(a)?
            } else {
                a.clone()
            });
        }
        let s = Scan {
            body: Arc::new(vb),
            ..self.clone()
        };
        let res = s.bind(&ops)?;
        let mut outs = Vec::with_capacity(res.len());
        let mut out_b = Vec::with_capacity(res.len());
        for (j, r) in res.into_iter().enumerate() {
            if j < nk {
                outs.push(r);
                out_b.push(flags[nc + j]);
            } else if ob[j] {
                outs.push(swap01(&r)?);
                out_b.push(true);
            } else {
                outs.push(r);
                out_b.push(false);
            }
        }
        Ok((outs, out_b))
    }
    fn cse_key(&self) -> Option<String> {
        Some(format!(
            "scan@{:p}[{} {} {} {}]",
            Arc::as_ptr(&self.body),
            self.length,
            self.reverse,
            self.num_consts,
            self.num_carry
        ))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
