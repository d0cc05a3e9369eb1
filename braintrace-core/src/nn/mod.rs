//! Layers for recurrent and spiking networks, written with `Tensor` ops and
//! ETP ops so that the learning compiler sees their trainable operations:
//! [`Linear`], [`GruCell`], [`LifCell`], [`LeakyRateReadout`],
//! [`ExpSynapse`] and [`ElementWiseParam`]; braintrace's spiking neurons,
//! synapses and short-term plasticity in [`snn`] ([`If`], [`Lif`],
//! [`Alif`], [`Expon`], [`Alpha`], [`DualExpon`], [`Std`], [`Stp`],
//! [`SpikeBitwise`]); seeded [`init`]ialisers; the
//! [`optim`]isers [`Sgd`] and [`Adam`]; safetensors [`io`]; [`checkpoint`]s
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
