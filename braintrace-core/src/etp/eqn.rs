//! `EtpEqn`: an ETP primitive bound with its params, the graph equation.
//! Every rule the transforms need is derived from the one implementation
//! function: abstract eval, lowering, JVP, transpose and
//! identity-preserving batching.

use super::params::Params;
use super::primitive::EtpPrimitive;
use crate::error::Result;
use crate::graph::{self, LinearArg, Primitive};
use crate::tensor::{Aval, Tensor};
use crate::transform::{jvp_graph, make_graph, vjp, vmap_graph};
use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

impl EtpPrimitive {
    /// Apply the primitive: one equation while tracing, its impl when eager.
    pub fn bind(&self, args: &[Tensor], params: &Params) -> Result<Tensor> {
        self.check_args(args)?;
        graph::bind1(
            Arc::new(EtpEqn {
                prim: self.clone(),
                params: params.clone(),
            }),
            args,
        )
    }
}

/// An ETP primitive bound with params: the graph equation.
#[derive(Clone)]
pub struct EtpEqn {
    /// The primitive.
    pub prim: EtpPrimitive,
    /// Its params.
    pub params: Params,
}

impl fmt::Debug for EtpEqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.prim.name(), self.params)
    }
}

impl EtpEqn {
    fn impl_closure(&self) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + '_ {
        move |a: &[Tensor]| Ok(vec![(self.prim.impl_fn())(a, &self.params)?])
    }
    fn impl_graph(&self, avals: &[Aval]) -> Result<graph::Graph> {
        make_graph(self.impl_closure(), avals).map_err(|e| self.prim.wrap("tracing the impl", e))
    }
}

impl Primitive for EtpEqn {
    fn name(&self) -> String {
        self.prim.name().to_string()
    }
    fn params(&self) -> Vec<(String, String)> {
        self.params
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let key = (inputs.to_vec(), self.params.clone());
        if let Some(a) = self.prim.cached_shape(&key) {
            return Ok(vec![a]);
        }
        let g = self.impl_graph(inputs)?;
        let out = g.out_avals().remove(0);
        self.prim.cache_shape(key, out.clone());
        Ok(vec![out])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![
            (self.prim.impl_fn())(inputs, &self.params).map_err(|e| self.prim.wrap("bind", e))?
        ])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        // The primal stays one ETP equation; the tangent is the JVP of the impl.
        let y = graph::bind1(Arc::new(self.clone()), p)?;
        let g = self.impl_graph(&crate::ops::avals(p))?;
        let (_, touts) = jvp_graph(&g, p, t)?;
        Ok((vec![y], touts))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        // Transpose through linearisation of the impl, valid in the operands
        // it is linear in: evaluate the VJP at zeros of the linear operands.
        let Some(ct) = &cts[0] else {
            return Ok(vec![None; args.len()]);
        };
        let lin: Vec<usize> = (0..args.len()).filter(|&i| args[i].is_linear()).collect();
        let f = |l: &[Tensor]| {
            let mut full = Vec::with_capacity(args.len());
            let mut it = l.iter();
            for a in args {
                full.push(match a {
                    LinearArg::Known(t) => t.clone(),
                    LinearArg::Linear(_) => it.next().expect("one per linear operand").clone(),
                });
            }
            Ok(vec![(self.prim.impl_fn())(&full, &self.params)?])
        };
        let zeros: Vec<Tensor> = lin
            .iter()
            .map(|&i| Tensor::zeros_aval(&args[i].aval()))
            .collect();
        let (_, pb) = vjp(f, &zeros)?;
        let g = pb.apply(std::slice::from_ref(ct))?;
        let mut out = vec![None; args.len()];
        for (&i, gi) in lin.iter().zip(g) {
            out[i] = Some(gi);
        }
        Ok(out)
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let only_x = self
            .prim
            .x_index()
            .is_some_and(|xi| batched.iter().enumerate().all(|(i, &b)| b == (i == xi)));
        if only_x {
            if let Some(cp) = self.prim.batched_counterpart() {
                return Ok((vec![cp.bind(args, &self.params)?], vec![true]));
            }
        }
        if self.prim.first_decomposition() {
            log::warn!(
                "ETP primitive '{}' was decomposed into core ops under vmap (batched operands {:?}); its trainable parameters will not be recognised by the eligibility-trace compiler. Map over the data input only (weights unbatched), or call the batched op directly.",
                self.prim.name(),
                batched
            );
            record_decomposition(self.prim.name());
        }
        let ex: Vec<Aval> = args
            .iter()
            .zip(batched)
            .map(|(a, &b)| {
                if b {
                    a.aval().with_shape(&a.shape()[1..])
                } else {
                    a.aval()
                }
            })
            .collect();
        let g = self.impl_graph(&ex)?;
        vmap_graph(&g, args, batched, size)
    }
    fn lower(&self, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
        Some(
            (self.prim.impl_fn())(inputs, &self.params)
                .map(|y| vec![y])
                .map_err(|e| self.prim.wrap("lowering", e)),
        )
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

static DECOMPOSED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_decomposition(name: &str) {
    DECOMPOSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(name.to_string());
}

/// Names of the primitives that were decomposed under `vmap` (each warned
/// once, through the `log` facade, when it first happened).
pub fn decomposition_warnings() -> Vec<String> {
    DECOMPOSED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The ETP equation behind a graph equation, if it is one.
pub fn as_etp_eqn(prim: &dyn Primitive) -> Option<&EtpEqn> {
    prim.as_any().downcast_ref::<EtpEqn>()
}
