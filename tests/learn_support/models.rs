//! The four models of the end-to-end golden cases (equations in the golden
//! README §6.1), built from the `nn` layers.

use braintrace::etp::ElemFn;
use braintrace::learn::{Init, Model, StepCtx};
use braintrace::nn::{ElementWiseParam, GruCell, LeakyRateReadout, LifCell, Linear};
use braintrace::{Result, Tensor};

fn cat(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    braintrace::concat(&[a.clone(), b.clone()], a.ndim() - 1)
}

/// `gru`: GRUCell `rnn` then Linear `out`.
pub struct GruNet {
    pub rnn: GruCell,
    pub out: Linear,
}

impl GruNet {
    pub fn new(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        GruNet {
            rnn: GruCell::new("rnn", n_in, n_rec),
            out: Linear::new("out", n_rec, n_out),
        }
    }
}

impl Model for GruNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.rnn.init(init)?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = self.rnn.step(ctx, x)?;
        self.out.step(ctx, &h)
    }
}

/// `leaky`: `v' = α v + (1−α)([x, tanh v] @ rec)`, then a leaky readout of `tanh v'`.
pub struct LeakyNet {
    pub rec: Linear,
    pub readout: LeakyRateReadout,
    pub alpha: f64,
    pub n_rec: usize,
}

impl LeakyNet {
    pub fn new(n_in: usize, n_rec: usize, n_out: usize, alpha: f64, readout_decay: f64) -> Self {
        let mut readout = LeakyRateReadout::new("readout", n_rec, n_out, 1.0, 1.0);
        readout.decay = readout_decay;
        LeakyNet {
            rec: Linear::new("rec", n_in + n_rec, n_rec),
            readout,
            alpha,
            n_rec,
        }
    }
}

impl Model for LeakyNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.rec.init(init)?;
        init.hidden("v", &[self.n_rec])?;
        self.readout.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let v = ctx.hidden("v")?;
        let y = self.rec.step(ctx, &cat(x, &v.tanh()?)?)?;
        let v_new = v
            .mul_scalar(self.alpha)?
            .add(&y.mul_scalar(1.0 - self.alpha)?)?;
        ctx.set_hidden("v", v_new.clone())?;
        self.readout.step(ctx, &v_new.tanh()?)
    }
}

/// `lif`: a LIF cell (states `i`, `v`) then a leaky readout of its spikes.
pub struct LifNet {
    pub cell: LifCell,
    pub readout: LeakyRateReadout,
}

impl LifNet {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n_in: usize,
        n_rec: usize,
        n_out: usize,
        beta: f64,
        gamma: f64,
        v_th: f64,
        readout_decay: f64,
    ) -> Self {
        let mut readout = LeakyRateReadout::new("readout", n_rec, n_out, 1.0, 1.0);
        readout.decay = readout_decay;
        LifNet {
            cell: LifCell::new("", n_in, n_rec, beta, gamma, v_th),
            readout,
        }
    }
}

impl Model for LifNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.cell.init(init)?;
        self.readout.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let s = self.cell.step(ctx, x)?;
        self.readout.step(ctx, &s)
    }
}

/// `diag`: `v' = σ(d) ⊙ v + (1 − σ(d)) ⊙ (x @ inp)`, output `v'`; the decay
/// goes through `etp_elemwise` with `weight_fn = sigmoid`.
pub struct DiagNet {
    pub inp: Linear,
    pub decay: ElementWiseParam,
}

impl DiagNet {
    pub fn new(n_in: usize, n_rec: usize) -> Self {
        DiagNet {
            inp: Linear::new("inp", n_in, n_rec),
            decay: ElementWiseParam::new("decay_raw", &[n_rec], ElemFn::builtin("sigmoid")),
        }
    }
    /// The decay as a raw parameter (`etp_elemwise` without `weight_fn`).
    pub fn identity(n_in: usize, n_rec: usize) -> Self {
        DiagNet {
            inp: Linear::new("inp", n_in, n_rec),
            decay: ElementWiseParam::new("decay_raw", &[n_rec], None),
        }
    }
}

impl Model for DiagNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.decay.init(init)?;
        self.inp.init(init)?;
        init.hidden("v", &[self.decay.shape[0]])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let v = ctx.hidden("v")?;
        let d = self.decay.value(ctx)?;
        let u = self.inp.step(ctx, x)?;
        let v_new = d.mul(&v)?.add(&d.rsub_scalar(1.0)?.mul(&u)?)?;
        ctx.set_hidden("v", v_new.clone())?;
        Ok(v_new)
    }
}
