//! The weight-structured layers' golden models
//! (`scripts/golden_gen/generate_zoo_wlayers.py`): the layer under test is
//! the recurrent weight `rnn/W` of `h' = tanh(W([x, h]))`, read out by a
//! `Linear` `out` over the flattened `h'`, by the case's `model` name
//! `wl_<layer>`; the layer's fixed structure is the case's `layer` field.

use super::e2e::{array, check_model};
use braintrace::learn::{Algorithm, Init, Model, StepCtx};
use braintrace::nn::{
    Chain, Conv1d, Conv2d, Conv3d, Linear, Lora, ScaledWsLinear, SignedWLinear, SparseLinear,
};
use braintrace::prims::CsrStructure;
use braintrace::{Result, Tensor};
use serde_json::{Map, Value};

/// The layers of the cases (the `<layer>` of `wl_<layer>`).
pub const LAYERS: &[&str] = &[
    "linear_mask",
    "signed",
    "scaledws",
    "sparse",
    "lora",
    "conv1d",
    "conv2d",
    "conv3d",
];

/// Whether `model` names a weight-layer case.
pub fn is_wlayers(model: &str) -> bool {
    model
        .strip_prefix("wl_")
        .is_some_and(|c| LAYERS.contains(&c))
}

/// `h' = tanh(W([x, h]))` with the hidden state `rnn/h` of per-sample
/// shape `shape`.
#[derive(Clone, Debug)]
pub struct LayerRnn<L> {
    pub w: L,
    pub shape: Vec<usize>,
}

impl<L: Model> Model for LayerRnn<L> {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.w.init(init)?;
        init.hidden("rnn/h", &self.shape)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("rnn/h")?;
        let xh = braintrace::concat(&[x.clone(), h], x.ndim() - 1)?;
        let h_new = self.w.step(ctx, &xh)?.tanh()?;
        ctx.set_hidden("rnn/h", h_new.clone())?;
        Ok(h_new)
    }
}

/// A `Linear` over the flattened per-sample input.
#[derive(Clone, Debug)]
pub struct FlatLinear(pub Linear);

impl Model for FlatLinear {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.0.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let b = x.shape()[0];
        self.0.step(ctx, &x.reshape(&[b, x.size() / b.max(1)])?)
    }
}

fn usizes(v: &Value, what: &str) -> std::result::Result<Vec<usize>, String> {
    v.as_array()
        .ok_or_else(|| format!("layer.{what}: not a list"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|u| u as usize)
                .ok_or_else(|| format!("layer.{what}: not an unsigned integer"))
        })
        .collect()
}

/// Build the case's model and check it (`check_model` of the e2e checker).
pub fn check(
    model: &str,
    (n_in, n_rec, n_out): (usize, usize, usize),
    o: &Map<String, Value>,
    algo: Algorithm,
    b: usize,
    fails: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let e = |e: braintrace::Error| e.to_string();
    let st = o
        .get("layer")
        .and_then(Value::as_object)
        .ok_or("case: missing `layer`")?;
    let get = |k: &str| st.get(k).ok_or(format!("layer: missing `{k}`"));
    let k = n_in + n_rec;
    macro_rules! run {
        ($layer:expr, $spatial:expr) => {{
            let spatial: Vec<usize> = $spatial;
            let flat = spatial.iter().product::<usize>() * n_rec;
            let cell = LayerRnn {
                w: $layer,
                shape: [&spatial[..], &[n_rec]].concat(),
            };
            check_model(
                Chain::new(cell, FlatLinear(Linear::new("out", flat, n_out))),
                o,
                algo,
                b,
                fails,
            )
        }};
    }
    match model.strip_prefix("wl_").unwrap_or(model) {
        "linear_mask" => run!(
            Linear::new("rnn/W", k, n_rec)
                .with_mask(&array(get("w_mask")?, "w_mask")?)
                .map_err(e)?,
            vec![]
        ),
        "signed" => {
            let sign = array(get("w_sign")?, "w_sign")?;
            run!(
                SignedWLinear::new("rnn/W", k, n_rec)
                    .and_then(|l| l.with_sign(&sign))
                    .map_err(e)?,
                vec![]
            )
        }
        "scaledws" => {
            let eps = get("eps")?.as_f64().ok_or("layer.eps")?;
            let mask = array(get("w_mask")?, "w_mask")?;
            let mut l = ScaledWsLinear::new("rnn/W", k, n_rec)
                .and_then(|l| l.with_eps(eps))
                .and_then(|l| l.with_mask(&mask))
                .map_err(e)?;
            if get("bias")?.as_bool() == Some(false) {
                l = l.without_bias();
            }
            if get("gain")?.as_bool() == Some(false) {
                l = l.without_gain();
            }
            run!(l, vec![])
        }
        "sparse" => {
            let shape = usizes(get("shape")?, "shape")?;
            let s = CsrStructure::new(
                (shape[0], shape[1]),
                usizes(get("indptr")?, "indptr")?,
                usizes(get("indices")?, "indices")?,
            )
            .map_err(e)?;
            let data = Tensor::ones(&[s.nnz()], braintrace::DType::F64);
            run!(
                SparseLinear::new("rnn/W", s, &data)
                    .map_err(e)?
                    .with_bias(braintrace::nn::Initializer::Zeros),
                vec![]
            )
        }
        "lora" => {
            let r = get("rank")?.as_u64().ok_or("layer.rank")? as usize;
            run!(Lora::new("rnn/W", k, r, n_rec).map_err(e)?, vec![])
        }
        c @ ("conv1d" | "conv2d" | "conv3d") => {
            let spatial = usizes(get("spatial")?, "spatial")?;
            let ks = usizes(get("kernel_size")?, "kernel_size")?;
            let in_size = [&spatial[..], &[k]].concat();
            if get("bias")?.as_bool() != Some(false) {
                return Err("layer.bias: the conv cases have no bias".into());
            }
            match c {
                "conv1d" => run!(
                    Conv1d::new("rnn/W", &in_size, n_rec, &ks).map_err(e)?,
                    spatial
                ),
                "conv2d" => run!(
                    Conv2d::new("rnn/W", &in_size, n_rec, &ks).map_err(e)?,
                    spatial
                ),
                _ => run!(
                    Conv3d::new("rnn/W", &in_size, n_rec, &ks).map_err(e)?,
                    spatial
                ),
            }
        }
        other => Err(format!("unknown weight-layer model `{other}`")),
    }
}
