//! `GraphBuilder`: the way to write a [`Graph`] by hand, outside tracing.
//! Every equation's results are inferred by its primitive, and the finished
//! graph is validated, so a built graph always evaluates without panicking.

use super::{Eqn, Graph, Primitive, VarId};
use crate::error::{Error, Result};
use crate::tensor::{Aval, Tensor};
use std::sync::Arc;

/// Builds a [`Graph`] equation by equation.
///
/// ```
/// use braintrace_core::graph::GraphBuilder;
/// use braintrace_core::ops::elementwise::{Unary, UnaryOp};
/// use braintrace_core::{Aval, DType, Tensor};
/// use std::sync::Arc;
/// let mut b = GraphBuilder::new();
/// let x = b.input(Aval::new(&[2], DType::F64));
/// let y = b.eqn(Arc::new(Unary(UnaryOp::Exp)), &[x])?[0];
/// let g = b.build(&[y])?;
/// let out = g.eval(&[Tensor::from_vec(vec![0.0, 1.0], &[2])?])?;
/// assert_eq!(out[0].to_vec_f64()?, vec![1.0, 1f64.exp()]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct GraphBuilder {
    avals: Vec<Aval>,
    invars: Vec<VarId>,
    constvars: Vec<VarId>,
    consts: Vec<Tensor>,
    eqns: Vec<Eqn>,
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new graph input (inputs are taken in the order they are added).
    pub fn input(&mut self, aval: Aval) -> VarId {
        self.avals.push(aval);
        let v = self.avals.len() - 1;
        self.invars.push(v);
        v
    }

    /// A captured constant.
    pub fn constant(&mut self, value: Tensor) -> VarId {
        self.avals.push(value.aval());
        let v = self.avals.len() - 1;
        self.constvars.push(v);
        self.consts.push(value);
        v
    }

    /// Append `prim(inputs)`; its results' abstract values come from the
    /// primitive's shape rule (which validates the operands). Returns the
    /// result variables.
    pub fn eqn(&mut self, prim: Arc<dyn Primitive>, inputs: &[VarId]) -> Result<Vec<VarId>> {
        let mut in_avals = Vec::with_capacity(inputs.len());
        for &v in inputs {
            let a = self.avals.get(v).ok_or_else(|| {
                Error::invalid(
                    prim.name(),
                    format!(
                        "operand variable {v} does not exist in the graph being built ({} variables)",
                        self.avals.len()
                    ),
                )
            })?;
            in_avals.push(a.clone());
        }
        let outs = prim.abstract_eval(&in_avals)?;
        let outputs: Vec<VarId> = outs
            .into_iter()
            .map(|a| {
                self.avals.push(a);
                self.avals.len() - 1
            })
            .collect();
        self.eqns.push(Eqn {
            prim,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
        });
        Ok(outputs)
    }

    /// The abstract value of a variable created by this builder.
    pub fn aval(&self, v: VarId) -> Option<&Aval> {
        self.avals.get(v)
    }

    /// Finish with the given outputs; the graph is validated.
    pub fn build(self, outputs: &[VarId]) -> Result<Graph> {
        let g = Graph {
            avals: self.avals,
            invars: self.invars,
            constvars: self.constvars,
            consts: self.consts,
            eqns: self.eqns,
            outvars: outputs.to_vec(),
        };
        g.validate()?;
        Ok(g)
    }
}

impl Eqn {
    /// An equation `outputs = prim(inputs)`. It only becomes part of a graph
    /// through [`Graph::from_parts`], which validates it.
    pub fn new(prim: Arc<dyn Primitive>, inputs: Vec<VarId>, outputs: Vec<VarId>) -> Eqn {
        Eqn {
            prim,
            inputs,
            outputs,
        }
    }
}

impl Graph {
    /// A graph from its parts (the same ones the accessors return), checked
    /// with [`Graph::validate`].
    pub fn from_parts(
        avals: Vec<Aval>,
        invars: Vec<VarId>,
        constvars: Vec<VarId>,
        consts: Vec<Tensor>,
        eqns: Vec<Eqn>,
        outvars: Vec<VarId>,
    ) -> Result<Graph> {
        let g = Graph {
            avals,
            invars,
            constvars,
            consts,
            eqns,
            outvars,
        };
        g.validate()?;
        Ok(g)
    }
}
