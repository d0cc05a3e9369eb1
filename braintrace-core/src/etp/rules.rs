//! The four ETP rules (and the two optional D-RTRL overrides) as values:
//! shared functions on tensors keyed by trainable name. Single-weight
//! primitives may write them against plain tensors; the `single`
//! constructors adapt such functions.

use super::params::Params;
use crate::error::{Error, Result};
use crate::tensor::{Aval, Tensor};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Tensors keyed by trainable name (`weight`, `bias`, `lora_b`, ...).
pub type TensorMap = BTreeMap<String, Tensor>;
/// Abstract values keyed by trainable name.
pub type AvalMap = BTreeMap<String, Aval>;

/// The only entry of a single-trainable map, or an error naming `rule`.
pub fn sole<'a, T>(m: &'a BTreeMap<String, T>, rule: &str) -> Result<(&'a String, &'a T)> {
    if m.len() != 1 {
        let keys: Vec<&String> = m.keys().collect();
        return Err(Error::invalid(rule, format!("a single-tensor rule was given {} trainables {keys:?}; write the rule against TensorMap", m.len())));
    }
    Ok(m.iter().next().expect("one entry"))
}

macro_rules! rule_type {
    ($(#[$m:meta])* $name:ident, $rule:literal, ($($arg:ident: $ty:ty),*) -> $out:ty) => {
        $(#[$m])*
        #[derive(Clone)]
        pub struct $name(Arc<dyn Fn($($ty),*) -> Result<$out> + Send + Sync>);
        impl $name {
            /// Wrap a function keyed by trainable name.
            pub fn new<F>(f: F) -> Self
            where
                F: Fn($($ty),*) -> Result<$out> + Send + Sync + 'static,
            {
                $name(Arc::new(f))
            }
            /// Call the rule.
            pub fn call(&self, $($arg: $ty),*) -> Result<$out> {
                (self.0)($($arg),*)
            }
            /// The rule's name (`yw_to_w`, ...).
            pub fn rule_name() -> &'static str {
                $rule
            }
            /// Whether two handles wrap the same function.
            pub fn ptr_eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(<fn>)"))
            }
        }
    };
}

rule_type!(
    /// `yw_to_w(hidden, trace, params) -> trace`: spread a y-shaped factor onto the trace slots.
    YwToW, "yw_to_w", (hidden: &Tensor, trace: &TensorMap, params: &Params) -> TensorMap
);
rule_type!(
    /// `xy_to_dw(x, hidden, weights, params) -> dW`: the VJP of `W -> op(x, W)` at cotangent `hidden`.
    XyToDw, "xy_to_dw", (x: Option<&Tensor>, hidden: &Tensor, weights: &TensorMap, params: &Params) -> TensorMap
);
rule_type!(
    /// `init_drtrl(x, y, weights, num_hidden_state, params) -> zeros` shaped for the parameter-dim trace.
    InitDrtrl, "init_drtrl", (x: Option<&Aval>, y: &Aval, weights: &AvalMap, num_hidden_state: usize, params: &Params) -> TensorMap
);
rule_type!(
    /// `init_pp(x, y, weights, num_hidden_state, params) -> zeros` of shape `(*y.shape, S)`.
    InitPp, "init_pp", (x: Option<&Aval>, y: &Aval, weights: &AvalMap, num_hidden_state: usize, params: &Params) -> Tensor
);
rule_type!(
    /// Optional D-RTRL instantaneous term (same call as `xy_to_dw`, trace-structured result).
    InstantDrtrl, "instant_drtrl", (x: Option<&Tensor>, hidden: &Tensor, weights: &TensorMap, params: &Params) -> TensorMap
);
rule_type!(
    /// Optional D-RTRL solve: `(g, trace, weights, params) -> dL/dW`.
    SolveDrtrl, "solve_drtrl", (g: &Tensor, trace: &TensorMap, weights: &TensorMap, params: &Params) -> TensorMap
);

fn single_map(key: &str, t: Tensor) -> TensorMap {
    let mut m = TensorMap::new();
    m.insert(key.to_string(), t);
    m
}

impl YwToW {
    /// Adapt a single-trainable rule `(hidden, trace, params) -> trace`.
    pub fn single<F>(f: F) -> Self
    where
        F: Fn(&Tensor, &Tensor, &Params) -> Result<Tensor> + Send + Sync + 'static,
    {
        YwToW::new(move |h, tr, p| {
            let (k, t) = sole(tr, "yw_to_w")?;
            Ok(single_map(k, f(h, t, p)?))
        })
    }
}

impl XyToDw {
    /// Adapt a single-trainable rule `(x, hidden, w, params) -> dW`.
    pub fn single<F>(f: F) -> Self
    where
        F: Fn(Option<&Tensor>, &Tensor, &Tensor, &Params) -> Result<Tensor> + Send + Sync + 'static,
    {
        XyToDw::new(move |x, h, ws, p| {
            let (k, w) = sole(ws, "xy_to_dw")?;
            Ok(single_map(k, f(x, h, w, p)?))
        })
    }
}

impl InstantDrtrl {
    /// Adapt a single-trainable rule.
    pub fn single<F>(f: F) -> Self
    where
        F: Fn(Option<&Tensor>, &Tensor, &Tensor, &Params) -> Result<Tensor> + Send + Sync + 'static,
    {
        InstantDrtrl::new(move |x, h, ws, p| {
            let (k, w) = sole(ws, "instant_drtrl")?;
            Ok(single_map(k, f(x, h, w, p)?))
        })
    }
}

impl InitDrtrl {
    /// Adapt a single-trainable initialiser `(x, y, w, S, params) -> zeros`.
    pub fn single<F>(f: F) -> Self
    where
        F: Fn(Option<&Aval>, &Aval, &Aval, usize, &Params) -> Result<Tensor>
            + Send
            + Sync
            + 'static,
    {
        InitDrtrl::new(move |x, y, ws, s, p| {
            let (k, w) = sole(ws, "init_drtrl")?;
            Ok(single_map(k, f(x, y, w, s, p)?))
        })
    }
}

impl InitPp {
    /// Adapt a single-trainable initialiser `(x, y, w, S, params) -> zeros`.
    pub fn single<F>(f: F) -> Self
    where
        F: Fn(Option<&Aval>, &Aval, &Aval, usize, &Params) -> Result<Tensor>
            + Send
            + Sync
            + 'static,
    {
        InitPp::new(move |x, y, ws, s, p| {
            let (_, w) = sole(ws, "init_pp")?;
            f(x, y, w, s, p)
        })
    }
}

impl SolveDrtrl {
    /// Adapt a single-trainable solve `(g, trace, w, params) -> dW`.
    pub fn single<F>(f: F) -> Self
    where
        F: Fn(&Tensor, &Tensor, &Tensor, &Params) -> Result<Tensor> + Send + Sync + 'static,
    {
        SolveDrtrl::new(move |g, tr, ws, p| {
            let (k, t) = sole(tr, "solve_drtrl")?;
            let (_, w) = sole(ws, "solve_drtrl")?;
            Ok(single_map(k, f(g, t, w, p)?))
        })
    }
}

/// Any subset of the rules, for `register_etp_rules`.
#[derive(Clone, Debug, Default)]
pub struct EtpRules {
    /// `yw_to_w`.
    pub yw_to_w: Option<YwToW>,
    /// `xy_to_dw`.
    pub xy_to_dw: Option<XyToDw>,
    /// `init_drtrl`.
    pub init_drtrl: Option<InitDrtrl>,
    /// `init_pp`.
    pub init_pp: Option<InitPp>,
    /// Optional `instant_drtrl`.
    pub instant_drtrl: Option<InstantDrtrl>,
    /// Optional `solve_drtrl`.
    pub solve_drtrl: Option<SolveDrtrl>,
}
