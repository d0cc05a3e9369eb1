//! The benchmark models: the golden `gru` and `lif` nets, `gru_tanh`, the
//! `#[etp_primitive]` GRU (`gru_macro`, `gru_macro_rules`) and the leaky
//! rate RNN over a sparse, LoRA or conv product (`sparse`, `lora`, `conv`).

use braintrace::etp::{AvalMap, ElemFn, TensorMap};
use braintrace::learn::{Init, Model, StepCtx};
use braintrace::nn::{Chain, GruCell, Initializer, LeakyRateReadout, LifCell, Linear};
use braintrace::ops::{ConvPadding, ConvParams};
use braintrace::prims::{conv, lora_matmul, sparse_matmul, CsrStructure, Transforms};
use braintrace::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w, Aval, Result, Tensor};

/// `gru`: GRUCell `rnn` then Linear `out`.
pub(crate) fn gru_net(n_in: usize, n_rec: usize, n_out: usize) -> Chain<GruCell, Linear> {
    Chain::new(
        GruCell::new("rnn", n_in, n_rec),
        Linear::new("out", n_rec, n_out),
    )
}

/// `lif`: a LIF cell (states `i`, `v`) then a leaky readout of its spikes,
/// with the golden hyperparameters: β, γ, v_th, readout τ = 5 with dt = 1.
pub(crate) fn lif_net(n_in: usize, n_rec: usize, n_out: usize) -> Chain<LifCell, LeakyRateReadout> {
    Chain::new(
        LifCell::new("", n_in, n_rec, 0.8, 0.6, 1.0),
        LeakyRateReadout::new("readout", n_rec, n_out, 5.0, 1.0),
    )
}

/// `gru_tanh`: the `gru` net with `weight_fn = tanh` on the cell's three
/// products (dense relations with a weight transform).
pub(crate) fn gru_tanh_net(n_in: usize, n_rec: usize, n_out: usize) -> Chain<GruCell, Linear> {
    let mut net = gru_net(n_in, n_rec, n_out);
    for l in [&mut net.first.wz, &mut net.first.wr, &mut net.first.wh] {
        l.weight_fn = ElemFn::builtin("tanh");
    }
    net
}

// ---------------------------------------------------------------------------
// `gru_macro` / `gru_macro_rules`: the GRU with its three products an
// `#[etp_primitive]` (`y = x @ W + b`), with a declared dense trace kernel
// or with its rules only.
// ---------------------------------------------------------------------------

/// `xᵀ h` for one sample (`x (I,)`, `h (O,)`: the learner calls a batched
/// primitive's rules per sample) or a batch.
pub(crate) fn outer_xh(x: &Tensor, h: &Tensor) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?.matmul(&h.expand_dims(0)?)
    } else {
        x.transpose(&[1, 0])?.matmul(h)
    }
}

/// The rules both bench primitives share: weight `(.., I, O)`, bias `(.., O)`.
mod dense_rules {
    use super::*;

    pub fn yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
        trace
            .iter()
            .map(|(k, t)| {
                let f = if k == "bias" {
                    t.mul(h)?
                } else {
                    t.mul(&h.expand_dims(h.ndim() - 1)?)?
                };
                Ok((k.clone(), f))
            })
            .collect()
    }
    pub fn dw(x: &Tensor, h: &Tensor) -> Result<TensorMap> {
        let db = if h.ndim() == 2 {
            h.sum(&[0])?
        } else {
            h.clone()
        };
        Ok([
            ("weight".to_string(), outer_xh(x, h)?),
            ("bias".to_string(), db),
        ]
        .into())
    }
    pub fn init(y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
        let lead = &y.shape()[..y.ndim() - 1];
        Ok([
            (
                "weight".to_string(),
                Tensor::zeros(&[lead, w["weight"].shape(), &[n]].concat(), y.dtype()),
            ),
            (
                "bias".to_string(),
                Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()),
            ),
        ]
        .into())
    }
    pub fn init_pp(y: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
    }
}

/// `y = x @ W + b`, declaring the dense trace kernel.
#[etp_primitive(name = "etp_bench_dense", batched, x = x, weight = [weight, bias], trace_kernel = dense)]
pub(crate) fn bench_dense(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}
#[yw_to_w(bench_dense)]
pub(crate) fn bench_dense_yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    dense_rules::yw(h, trace)
}
#[xy_to_dw(bench_dense)]
pub(crate) fn bench_dense_dw(x: &Tensor, h: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    dense_rules::dw(x, h)
}
#[init_drtrl(bench_dense)]
pub(crate) fn bench_dense_init(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    dense_rules::init(y, w, n)
}
#[init_pp(bench_dense)]
pub(crate) fn bench_dense_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    dense_rules::init_pp(y, n)
}

/// The same op with its rules only (no trace kernel).
#[etp_primitive(name = "etp_bench_dense_rules", batched, x = x, weight = [weight, bias])]
pub(crate) fn bench_dense_rules(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}
#[yw_to_w(bench_dense_rules)]
pub(crate) fn bench_dense_rules_yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    dense_rules::yw(h, trace)
}
#[xy_to_dw(bench_dense_rules)]
pub(crate) fn bench_dense_rules_dw(x: &Tensor, h: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    dense_rules::dw(x, h)
}
#[init_drtrl(bench_dense_rules)]
pub(crate) fn bench_dense_rules_init(
    _x: &Aval,
    y: &Aval,
    w: &AvalMap,
    n: usize,
) -> Result<TensorMap> {
    dense_rules::init(y, w, n)
}
#[init_pp(bench_dense_rules)]
pub(crate) fn bench_dense_rules_init_pp(
    _x: &Aval,
    y: &Aval,
    _w: &AvalMap,
    n: usize,
) -> Result<Tensor> {
    dense_rules::init_pp(y, n)
}

/// The `gru` net with its cell's products through `bench_dense`
/// (`declared`) or `bench_dense_rules`; the same parameters and step.
pub(crate) struct GruMacro {
    pub(crate) net: Chain<GruCell, Linear>,
    pub(crate) declared: bool,
}

impl Model for GruMacro {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.net.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let cell = &self.net.first;
        let lin = |ctx: &StepCtx, l: &Linear, x: &Tensor| -> Result<Tensor> {
            let (w, b) = (ctx.param(&l.weight_key())?, ctx.param(&l.bias_key())?);
            if self.declared {
                bench_dense(x, &w, &b)
            } else {
                bench_dense_rules(x, &w, &b)
            }
        };
        let cat = |a: &Tensor, b: &Tensor| braintrace::concat(&[a.clone(), b.clone()], 1);
        let h = ctx.hidden(&cell.hidden_path())?;
        let xh = cat(x, &h)?;
        let z = lin(ctx, &cell.wz, &xh)?.sigmoid()?;
        let r = lin(ctx, &cell.wr, &xh)?.sigmoid()?;
        let hc = lin(ctx, &cell.wh, &cat(x, &r.mul(&h)?)?)?.tanh()?;
        let h_new = z.rsub_scalar(1.0)?.mul(&h)?.add(&z.mul(&hc)?)?;
        ctx.set_hidden(&cell.hidden_path(), h_new.clone())?;
        self.net.second.step(ctx, &h_new)
    }
}

/// The recurrent product of a [`LeakyNet`].
#[derive(Clone, Debug)]
pub(crate) enum Product {
    /// `etp_sp_mm` over a fixed pattern holding about 10 % of the entries.
    Sparse(CsrStructure),
    /// `etp_lora_mm` of rank `r`, α = 1 / r.
    Lora(usize),
    /// `etp_conv` (1-D, kernel 3, SAME) over `[x, h]` as channels: `x`
    /// `(B, 16)` is one channel of length 16, `h` is `(B, O, 16)` with
    /// `O = n_rec / 16` channels.
    Conv,
}

/// `sparse` / `lora`: a leaky rate RNN `h' = 0.9 h + tanh(P([x, h]) + b)`
/// over a sparse or a LoRA product `P`, then a `Linear` readout `out`.
pub(crate) struct LeakyNet {
    pub(crate) product: Product,
    pub(crate) n_in: usize,
    pub(crate) n_rec: usize,
    pub(crate) out: Linear,
}

impl LeakyNet {
    pub(crate) fn sparse(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        let structure = CsrStructure::from_dense_pattern(n_in + n_rec, n_rec, |r, c| {
            (r * 7 + c * 13) % 10 == 0
        });
        LeakyNet {
            product: Product::Sparse(structure),
            n_in,
            n_rec,
            out: Linear::new("out", n_rec, n_out),
        }
    }
    pub(crate) fn conv(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        LeakyNet {
            product: Product::Conv,
            n_in,
            n_rec,
            out: Linear::new("out", n_rec, n_out),
        }
    }
    pub(crate) fn lora(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        LeakyNet {
            product: Product::Lora(8),
            n_in,
            n_rec,
            out: Linear::new("out", n_rec, n_out),
        }
    }
}

impl Model for LeakyNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        let fan_in = (self.n_in + self.n_rec) as f64;
        let draw = |init: &mut Init, k: &str, shape: &[usize], std: f64| -> Result<()> {
            let v = Initializer::Normal { std }.draw(shape, init.dtype(), init.rng())?;
            init.param(k, None, v)
        };
        match &self.product {
            Product::Sparse(st) => draw(init, "rnn/w", &[st.nnz()], (10.0 / fan_in).sqrt())?,
            Product::Conv => {}
            Product::Lora(r) => {
                draw(
                    init,
                    "rnn/B",
                    &[self.n_in + self.n_rec, *r],
                    fan_in.sqrt().recip(),
                )?;
                draw(init, "rnn/A", &[*r, self.n_rec], 1.0)?;
            }
        }
        if let Product::Conv = self.product {
            let o = self.n_rec / self.n_in;
            draw(
                init,
                "rnn/K",
                &[o, o + 1, 3],
                (3.0 * (o + 1) as f64).sqrt().recip(),
            )?;
            draw(init, "rnn/b", &[o], 0.1)?;
            init.hidden("rnn/h", &[o, self.n_in])?;
            return self.out.init(init);
        }
        draw(init, "rnn/b", &[self.n_rec], 0.1)?;
        init.hidden("rnn/h", &[self.n_rec])?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("rnn/h")?;
        if let Product::Conv = self.product {
            let xc = x.expand_dims(1)?; // (B, 1, 16)
            let xh = braintrace::ops::concat(&[xc, h.clone()], 1)?;
            let cp = ConvParams::default_for(1).with_padding(ConvPadding::Same);
            let (k, b) = (ctx.param("rnn/K")?, ctx.param("rnn/b")?);
            let y = conv(&xh, &k, Some(&b), &cp, &Transforms::default())?;
            let h_new = h.mul_scalar(0.9)?.add(&y.tanh()?)?;
            ctx.set_hidden("rnn/h", h_new.clone())?;
            let flat = h_new.reshape(&[h_new.shape()[0], self.n_rec])?;
            return self.out.step(ctx, &flat);
        }
        let xh = braintrace::ops::concat(&[x.clone(), h.clone()], x.ndim() - 1)?;
        let b = ctx.param("rnn/b")?;
        let t = Transforms::default();
        let y = match &self.product {
            Product::Sparse(st) => sparse_matmul(&xh, &ctx.param("rnn/w")?, st, Some(&b), &t)?,
            Product::Conv => unreachable!("handled above"),
            Product::Lora(r) => {
                let (lb, la) = (ctx.param("rnn/B")?, ctx.param("rnn/A")?);
                lora_matmul(&xh, &lb, &la, 1.0 / *r as f64, Some(&b), &t)?
            }
        };
        let h_new = h.mul_scalar(0.9)?.add(&y.tanh()?)?;
        ctx.set_hidden("rnn/h", h_new.clone())?;
        self.out.step(ctx, &h_new)
    }
}
