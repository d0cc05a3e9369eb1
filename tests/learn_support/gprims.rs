//! The grouped-matmul and embedding golden nets
//! (`scripts/golden_gen/generate_gprims.py`), by the case's `model` name:
//!
//! * `gp_grouped`: `h' = tanh(inp(x) + rec(h))` with `inp`, `rec`
//!   [`GroupedLinear`]s of [`GROUPS`] groups (`x (B, G, n_in)`,
//!   `h (B, G, n_rec)`) and a [`Linear`] readout `out` of `h` flattened;
//! * `gp_emb`: `h' = tanh(emb(tok) + rec(h))` with `emb` an [`Embedding`]
//!   of `n_in` rows, `rec` and `out` [`Linear`]s.

use super::e2e::check_model;
use braintrace::learn::{Algorithm, Init, Model, StepCtx};
use braintrace::nn::{Embedding, GroupedLinear, Linear};
use braintrace::{Result, Tensor};
use serde_json::{Map, Value};

/// The groups of `gp_grouped`.
pub const GROUPS: usize = 2;

/// Whether `model` names a case of these nets.
pub fn is_gprims(model: &str) -> bool {
    matches!(model, "gp_grouped" | "gp_emb")
}

/// `gp_grouped`.
pub struct GroupedNet {
    pub inp: GroupedLinear,
    pub rec: GroupedLinear,
    pub out: Linear,
    pub n_rec: usize,
}

impl GroupedNet {
    pub fn new(n_in: usize, n_rec: usize, n_out: usize) -> Result<Self> {
        Ok(GroupedNet {
            inp: GroupedLinear::new("inp", GROUPS, n_in, n_rec)?,
            rec: GroupedLinear::new("rec", GROUPS, n_rec, n_rec)?,
            out: Linear::new("out", GROUPS * n_rec, n_out),
            n_rec,
        })
    }
}

impl Model for GroupedNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.inp.init(init)?;
        self.rec.init(init)?;
        self.out.init(init)?;
        init.hidden("h", &[GROUPS, self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let a = self.inp.step(ctx, x)?;
        let r = self.rec.step(ctx, &h)?;
        let h = a.add(&r)?.tanh()?;
        ctx.set_hidden("h", h.clone())?;
        let lead = &h.shape()[..h.ndim() - 2];
        let flat = h.reshape(&[lead, &[GROUPS * self.n_rec][..]].concat())?;
        self.out.step(ctx, &flat)
    }
}

/// `gp_emb`.
pub struct EmbNet {
    pub emb: Embedding,
    pub rec: Linear,
    pub out: Linear,
    pub n_rec: usize,
}

impl EmbNet {
    pub fn new(vocab: usize, n_rec: usize, n_out: usize) -> Result<Self> {
        Ok(EmbNet {
            emb: Embedding::new("emb", vocab, n_rec)?,
            rec: Linear::new("rec", n_rec, n_rec),
            out: Linear::new("out", n_rec, n_out),
            n_rec,
        })
    }
}

impl Model for EmbNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.emb.init(init)?;
        self.rec.init(init)?;
        self.out.init(init)?;
        init.hidden("h", &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let e = self.emb.step(ctx, x)?;
        let r = self.rec.step(ctx, &h)?;
        let h = e.add(&r)?.tanh()?;
        ctx.set_hidden("h", h.clone())?;
        self.out.step(ctx, &h)
    }
}

/// Build the case's net and check it (`check_model` of the e2e checker).
pub fn check(
    model: &str,
    (n_in, n_rec, n_out): (usize, usize, usize),
    o: &Map<String, Value>,
    algo: Algorithm,
    b: usize,
    fails: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let e = |e: braintrace::Error| e.to_string();
    match model {
        "gp_grouped" => check_model(
            GroupedNet::new(n_in, n_rec, n_out).map_err(e)?,
            o,
            algo,
            b,
            fails,
        ),
        "gp_emb" => check_model(
            EmbNet::new(n_in, n_rec, n_out).map_err(e)?,
            o,
            algo,
            b,
            fails,
        ),
        other => Err(format!("unknown gprims model `{other}`")),
    }
}
