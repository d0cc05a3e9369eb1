//! braintrace 0.2.6's recurrent cells (`braintrace.nn`), each built from
//! [`Linear`] layers (the ETP matmul) and element-wise ops, so the learning
//! compiler finds their hidden–parameter relations as it does in
//! braintrace. Parameter keys and hidden-state paths are braintrace's
//! (`<path>/Wf/weight/weight`, `<path>/h`, ...), so weights move between the
//! two by key.
//!
//! Every constructor checks its sizes (0 is refused) and returns an
//! [`Error::Invalid`] naming the cell and the value.

mod gated;
mod lru;
mod simple;

pub use gated::{LstmCell, MiniGru, MiniLstm, UrLstmCell};
pub use lru::LruCell;
pub use simple::{CfnCell, MguCell, MinimalRnnCell, VanillaRnnCell};

use super::init::Initializer;
use super::layers::Linear;
use crate::error::{Error, Result};
use crate::learn::{join_path, Model, StepCtx};
use crate::tensor::Tensor;

/// A cell's activation function (braintrace's `activation=` argument, by
/// the name `brainstate.nn` gives it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellActivation {
    /// `tanh`
    Tanh,
    /// `relu`
    Relu,
    /// `sigmoid`
    Sigmoid,
    /// `softplus`
    Softplus,
    /// The identity (no activation).
    Identity,
}

impl CellActivation {
    /// Apply it.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            CellActivation::Tanh => x.tanh(),
            CellActivation::Relu => x.relu(),
            CellActivation::Sigmoid => x.sigmoid(),
            CellActivation::Softplus => x.softplus(),
            CellActivation::Identity => Ok(x.clone()),
        }
    }
    /// By braintrace's name (`"tanh"`, `"relu"`, `"sigmoid"`, `"softplus"`,
    /// `"identity"`).
    pub fn by_name(name: &str) -> Result<Self> {
        Ok(match name {
            "tanh" => CellActivation::Tanh,
            "relu" => CellActivation::Relu,
            "sigmoid" => CellActivation::Sigmoid,
            "softplus" => CellActivation::Softplus,
            "identity" => CellActivation::Identity,
            other => {
                return Err(Error::invalid(
                    "CellActivation::by_name",
                    format!(
                        "unknown activation `{other}` (tanh, relu, sigmoid, softplus, identity)"
                    ),
                ))
            }
        })
    }
}

/// Refuse a zero size: `<cell>::new: <arg> = 0 ...`.
pub(crate) fn check_sizes(cell: &str, sizes: &[(&str, usize)]) -> Result<()> {
    for &(name, n) in sizes {
        if n == 0 {
            return Err(Error::invalid(
                format!("{cell}::new"),
                format!("`{name}` = 0: a layer size must be positive"),
            ));
        }
    }
    Ok(())
}

/// braintools' `XavierNormal()` for a `(fan_in, fan_out)` weight: normal with
/// variance `2 / (fan_in + fan_out)`. The fans are fixed by the layer, so the
/// initialiser is the plain normal of that deviation.
pub(crate) fn xavier_normal(fan_in: usize, fan_out: usize) -> Initializer {
    Initializer::Normal {
        std: (2.0 / (fan_in + fan_out) as f64).sqrt(),
    }
}

/// A `Linear` sub-layer `<cell>/<name>` of `n_in → n_out` with `init`.
pub(crate) fn sub_linear(
    cell: &str,
    name: &str,
    n_in: usize,
    n_out: usize,
    init: Initializer,
) -> Linear {
    Linear::new(&join_path(cell, name), n_in, n_out).with_init(init)
}

/// A cell's gate: the layer `w` over `input` (mostly `[x, h]`), then the
/// activation `act`: `act(input W + b)`.
pub(crate) fn gate(
    ctx: &mut StepCtx,
    w: &Linear,
    input: &Tensor,
    act: CellActivation,
) -> Result<Tensor> {
    act.apply(&w.step(ctx, input)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::{bptt_grad, Model, ModelState, Reduction, TensorDict};
    use crate::tensor::DType;

    fn invalid_op(e: Error) -> String {
        match e {
            Error::Invalid { op, reason } => format!("{op}: {reason}"),
            other => panic!("expected Error::Invalid, got {other:?}"),
        }
    }

    #[test]
    fn zero_sizes_are_refused_naming_the_cell() {
        type Ctor = fn(&str, usize, usize) -> Result<()>;
        let ctors: [(&str, Ctor); 9] = [
            ("VanillaRnnCell", |p, a, b| {
                VanillaRnnCell::new(p, a, b).map(drop)
            }),
            ("MguCell", |p, a, b| MguCell::new(p, a, b).map(drop)),
            ("MinimalRnnCell", |p, a, b| {
                MinimalRnnCell::new(p, a, b).map(drop)
            }),
            ("CfnCell", |p, a, b| CfnCell::new(p, a, b).map(drop)),
            ("LstmCell", |p, a, b| LstmCell::new(p, a, b).map(drop)),
            ("UrLstmCell", |p, a, b| UrLstmCell::new(p, a, b).map(drop)),
            ("MiniGru", |p, a, b| MiniGru::new(p, a, b).map(drop)),
            ("MiniLstm", |p, a, b| MiniLstm::new(p, a, b).map(drop)),
            ("LruCell", |p, a, b| LruCell::new(p, a, b).map(drop)),
        ];
        for (name, ctor) in ctors {
            ctor("rnn", 3, 4).unwrap();
            let m = invalid_op(ctor("rnn", 0, 4).unwrap_err());
            assert!(
                m.starts_with(&format!("{name}::new")) && m.contains("= 0"),
                "{m}"
            );
            let m = invalid_op(ctor("rnn", 3, 0).unwrap_err());
            assert!(
                m.starts_with(&format!("{name}::new")) && m.contains("= 0"),
                "{m}"
            );
        }
    }

    #[test]
    fn lru_ring_and_phase_are_checked() {
        for (lo, hi, ph) in [
            (0.5, 0.4, 1.0),
            (-0.1, 0.9, 1.0),
            (0.0, 1.5, 1.0),
            (0.0, 1.0, 0.0),
        ] {
            let m = invalid_op(LruCell::with_ring("lru", 2, 3, lo, hi, ph).unwrap_err());
            assert!(m.starts_with("LruCell::new"), "{m}");
        }
        assert!(LruCell::with_ring("lru", 2, 3, 0.4, 0.9, 3.0).is_ok());
        assert!(invalid_op(CellActivation::by_name("gelu").unwrap_err()).contains("gelu"));
    }

    /// One step of `VanillaRnnCell` with each activation against the
    /// formula written out (`h = φ([x, 0] W + b)`), and its keys.
    #[test]
    fn vanilla_activation_is_selectable() {
        let w: Vec<f64> = (0..10).map(|i| 0.3 * i as f64 - 1.4).collect();
        let b = [0.1, -0.2];
        let x = [0.5, -1.5, 2.0];
        for act in ["tanh", "relu", "sigmoid", "softplus", "identity"] {
            let a = CellActivation::by_name(act).unwrap();
            let cell = VanillaRnnCell::new("rnn", 3, 2).unwrap().with_activation(a);
            let mut st = ModelState::new(&cell, DType::F64, 0, Some(1)).unwrap();
            let keys: Vec<String> = st.param_infos().iter().map(|p| p.key.clone()).collect();
            assert_eq!(keys, ["rnn/W/weight/weight", "rnn/W/weight/bias"]);
            let mut p = TensorDict::new();
            p.insert(
                keys[0].clone(),
                Tensor::from_vec(w.clone(), &[5, 2]).unwrap(),
            );
            p.insert(keys[1].clone(), Tensor::from_vec(b.to_vec(), &[2]).unwrap());
            st.set_params(&p).unwrap();
            let xs = Tensor::from_vec(x.to_vec(), &[1, 1, 3]).unwrap();
            let ys = Tensor::zeros(&[1, 1, 2], DType::F64);
            let sq = |o: &Tensor, y: &Tensor| o.sub(y)?.square()?.mean_all();
            let out = bptt_grad(&cell, &st, &xs, &ys, sq, Reduction::Mean).unwrap();
            let got = out.outputs.to_vec_f64().unwrap();
            for j in 0..2 {
                let z: f64 = (0..3).map(|i| x[i] * w[i * 2 + j]).sum::<f64>() + b[j];
                let want = match act {
                    "tanh" => z.tanh(),
                    "relu" => z.max(0.0),
                    "sigmoid" => 1.0 / (1.0 + (-z).exp()),
                    "softplus" => z.exp().ln_1p(),
                    _ => z,
                };
                assert!((got[j] - want).abs() < 1e-14, "{act}: {} vs {want}", got[j]);
            }
        }
    }

    trait InitCheck {
        fn init_check(&self) -> Result<()>;
    }
    impl<M: Model> InitCheck for M {
        /// Every cell's `init` declares its trainables and hidden states.
        fn init_check(&self) -> Result<()> {
            ModelState::new(self, DType::F32, 1, None).map(drop)
        }
    }

    #[test]
    fn every_cell_initialises() {
        LstmCell::new("c", 2, 3).unwrap().init_check().unwrap();
        UrLstmCell::new("c", 2, 3).unwrap().init_check().unwrap();
        LruCell::new("c", 2, 3).unwrap().init_check().unwrap();
        MinimalRnnCell::new("c", 2, 3)
            .unwrap()
            .init_check()
            .unwrap();
        CfnCell::new("c", 2, 3).unwrap().init_check().unwrap();
        MiniGru::new("c", 2, 3).unwrap().init_check().unwrap();
        MiniLstm::new("c", 2, 3).unwrap().init_check().unwrap();
        MguCell::new("c", 2, 3).unwrap().init_check().unwrap();
    }
}
