//! Layers for recurrent and spiking networks, written with `Tensor` ops and
//! ETP ops so that the learning compiler sees their trainable operations:
//! [`Linear`], [`GruCell`], [`LifCell`], [`LeakyRateReadout`],
//! [`ExpSynapse`] and [`ElementWiseParam`]; seeded [`init`]ialisers; the
//! [`optim`]isers [`Sgd`] and [`Adam`]; safetensors [`io`]; [`checkpoint`]s
//! for an exact resume.
//!
//! Every layer implements [`Model`](crate::learn::Model): `init` declares its
//! parameters and hidden states under its path, `step` computes one time
//! step. Composite models call their layers' `step` in turn.

pub mod checkpoint;
pub mod init;
pub mod io;
mod layers;
pub mod optim;
mod spiking;

pub use checkpoint::Checkpoint;
pub use init::{Initializer, Rng};
pub use layers::{Chain, ElementWiseParam, GruCell, LeakyRateReadout, Linear};
pub use optim::{clip_grad_norm, Adam, OptimState, Optimizer, Sgd};
pub use spiking::{ExpSynapse, LifCell};
