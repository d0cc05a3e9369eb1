//! Layers for recurrent and spiking networks, written with `Tensor` ops and
//! ETP ops so that the learning compiler sees their trainable operations:
//! [`Linear`], [`GruCell`], [`LifCell`], [`LeakyRateReadout`],
//! [`ExpSynapse`] and [`ElementWiseParam`]; braintrace's spiking neurons,
//! synapses and short-term plasticity in [`snn`] ([`If`], [`Lif`],
//! [`Alif`], [`Expon`], [`Alpha`], [`DualExpon`], [`Std`], [`Stp`],
//! [`SpikeBitwise`]); seeded [`init`]ialisers; the
//! [`optim`]isers [`Sgd`] and [`Adam`]; safetensors [`io`] (and [`io_braintrace`]: weights from braintrace); [`checkpoint`]s
//! for an exact resume.
//!
//! Every layer implements [`Model`](crate::learn::Model): `init` declares its
//! parameters and hidden states under its path, `step` computes one time
//! step. Composite models call their layers' `step` in turn.

pub mod checkpoint;
mod embedding;
mod grouped;
pub mod init;
pub mod io;
pub mod io_braintrace;
mod layers;
pub mod loss;
pub mod optim;
pub mod rnn;
pub mod snn;
mod spiking;

pub use checkpoint::Checkpoint;
pub use embedding::Embedding;
pub use grouped::GroupedLinear;
pub use init::{Initializer, Rng};
pub use layers::{Chain, ElementWiseParam, GruCell, LeakyRateReadout, Linear};
pub use optim::{clip_grad_norm, Adam, OptimState, Optimizer, Sgd};
pub use rnn::{
    CellActivation, CfnCell, LruCell, LstmCell, MguCell, MiniGru, MiniLstm, MinimalRnnCell,
    UrLstmCell, VanillaRnnCell,
};
pub use snn::{
    Alif, Alpha, BitwiseOp, DualExpon, Expon, If, Lif, SpikeBitwise, SpikeReset, Std, Stp,
};
pub use spiking::{ExpSynapse, LifCell};

// Non-temporal blocks: activations, norms, dropout, pooling, reshaping,
// `Sequential` (issue 34, items 4 and 5).
pub mod activation;
mod dropout;
mod mask;
mod norm;
mod pool;
mod sequential;
pub use activation::{Activation, PRelu};
pub use dropout::Dropout;
pub use init::{Distribution, FanMode};
pub use norm::{GroupNorm, LayerNorm, RmsNorm};
pub use pool::{Flatten, Pool, Pool1d, Pool2d, PoolKind, Unflatten};
pub use sequential::Sequential;
#[cfg(test)]
mod blocks_tests;
pub mod wlayers;
pub use wlayers::{Conv1d, Conv2d, Conv3d, Lora, ScaledWsLinear, SignedWLinear, SparseLinear};
