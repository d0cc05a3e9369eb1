//! `Sequential`: any number of layers in order, each boxed as a
//! `dyn Model` (beside the two-layer, statically typed
//! [`Chain`](super::Chain)).

use crate::error::{Error, Result};
use crate::learn::{Init, Model, StepCtx};
use crate::tensor::Tensor;

/// Layers applied in order: each reads what the previous one returns.
/// Parameters and hidden states are declared in the layers' order; the
/// layers' own paths name them (give each layer a distinct path).
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Model>>,
}

impl Sequential {
    /// An empty sequence (add layers with [`Sequential::push`]).
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }
    /// Append `layer`.
    pub fn push<M: Model + 'static>(mut self, layer: M) -> Self {
        self.layers.push(Box::new(layer));
        self
    }
    /// Append an already boxed layer.
    pub fn push_boxed(mut self, layer: Box<dyn Model>) -> Self {
        self.layers.push(layer);
        self
    }
    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    /// Whether there is no layer.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sequential({} layers)", self.layers.len())
    }
}

impl Model for Sequential {
    fn init(&self, init: &mut Init) -> Result<()> {
        if self.layers.is_empty() {
            return Err(Error::invalid("Sequential", "has no layers"));
        }
        self.layers.iter().try_for_each(|l| l.init(init))
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.step(ctx, &h)?;
        }
        Ok(h)
    }
}
