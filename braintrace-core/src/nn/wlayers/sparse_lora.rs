//! `SparseLinear` on `etp_sp_mm` and `Lora` on `etp_lora_mm`.

use super::check_size;
use crate::error::{Error, Result};
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::nn::init::Initializer;
use crate::nn::layers::{check_features, draw, layer_op};
use crate::prims::{lora_matmul, sparse_matmul, CsrStructure, Transforms};
use crate::tensor::Tensor;

/// braintrace's `nn.SparseLinear`: `y = x @ M(w) (+ b)` where `M` places
/// the `nnz` stored values `w` into a fixed CSR structure, through
/// `etp_sp_mm`. One parameter state `<path>/weight` with the leaves
/// `weight` `(nnz,)` (the sparse matrix's data, as braintrace takes it) and,
/// with [`SparseLinear::with_bias`], `bias` `(n_out,)` (braintrace's default
/// is no bias).
#[derive(Clone, Debug)]
pub struct SparseLinear {
    /// The layer's path.
    pub path: String,
    /// The fixed structure, `(n_in, n_out)`.
    pub structure: CsrStructure,
    /// The initial stored values `(nnz,)`.
    pub data: Tensor,
    /// The bias initialiser (`None`: no bias).
    pub b_init: Option<Initializer>,
}

impl SparseLinear {
    /// A layer of the structure `structure` starting from the values `data`
    /// (`(nnz,)`, finite); no bias. The structure needs at least one row,
    /// one column and one stored entry.
    pub fn new(path: &str, structure: CsrStructure, data: &Tensor) -> Result<Self> {
        check_size("SparseLinear", "n_in", structure.shape.0)?;
        check_size("SparseLinear", "n_out", structure.shape.1)?;
        check_size("SparseLinear", "nnz", structure.nnz())?;
        let op = layer_op("SparseLinear", path);
        if data.shape() != [structure.nnz()] {
            return Err(Error::shapes(
                op,
                [data.shape(), &[structure.nnz()][..]],
                "the data (first) must hold one value per stored entry of the structure",
            ));
        }
        super::check_mask(&op, "data", data, &[structure.nnz()])?;
        Ok(SparseLinear {
            path: path.to_string(),
            structure,
            data: data.clone(),
            b_init: None,
        })
    }
    /// A layer holding the non-zero entries of the dense `(n_in, n_out)`
    /// matrix `dense`.
    pub fn from_dense(path: &str, dense: &Tensor) -> Result<Self> {
        let op = layer_op("SparseLinear", path);
        let &[n_in, n_out] = dense.shape() else {
            return Err(Error::shapes(
                op,
                [dense.shape()],
                "the dense matrix must have two axes (n_in, n_out)",
            ));
        };
        let v = dense.to_vec_f64()?;
        let s = CsrStructure::from_dense_pattern(n_in, n_out, |r, c| v[r * n_out + c] != 0.0);
        let data: Vec<f64> = v.iter().copied().filter(|x| *x != 0.0).collect();
        let n = data.len();
        let data = Tensor::from_vec(data, &[n])?.cast(dense.dtype())?;
        SparseLinear::new(path, s, &data)
    }
    /// With a bias leaf drawn by `b_init` (braintrace's `b_init`).
    pub fn with_bias(mut self, b_init: Initializer) -> Self {
        self.b_init = Some(b_init);
        self
    }
    /// Input features.
    pub fn n_in(&self) -> usize {
        self.structure.shape.0
    }
    /// Output features.
    pub fn n_out(&self) -> usize {
        self.structure.shape.1
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The key of leaf `leaf` (`weight`, `bias`).
    pub fn key(&self, leaf: &str) -> String {
        join_path(&self.state_path(), leaf)
    }
}

impl Model for SparseLinear {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("SparseLinear", &self.path);
        init.param(&self.state_path(), Some("weight"), self.data.clone())?;
        if let Some(b) = &self.b_init {
            let b = draw(init, &op, "bias", b, &[self.n_out()])?;
            init.param(&self.state_path(), Some("bias"), b)?;
        }
        Ok(())
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        check_features(&layer_op("SparseLinear", &self.path), x, self.n_in())?;
        let w = ctx.param(&self.key("weight"))?;
        let b = match self.b_init {
            Some(_) => Some(ctx.param(&self.key("bias"))?),
            None => None,
        };
        sparse_matmul(x, &w, &self.structure, b.as_ref(), &Transforms::default())
    }
}

/// braintrace's `nn.LoRA` (standalone, no base module):
/// `y = (1/r) · x @ A @ B` with the input-facing factor `lora_a` `(n_in,
/// r)` and the output-facing `lora_b` `(r, n_out)`, both LeCun normal,
/// through `etp_lora_mm` (whose input-facing operand is `lora_a` here, as
/// braintrace passes it). One parameter state `<path>/weight` with the
/// leaves `lora_a` and `lora_b`. braintrace's `base_module` is not part of
/// the layer: add a [`Linear`](crate::nn::Linear)'s output to it.
#[derive(Clone, Debug)]
pub struct Lora {
    /// The layer's path.
    pub path: String,
    /// Input features.
    pub n_in: usize,
    /// The rank `r`.
    pub rank: usize,
    /// Output features.
    pub n_out: usize,
    /// Initialiser of both factors (LeCun normal: `N(0, 1/fan_in)`).
    pub kernel_init: Initializer,
}

impl Lora {
    /// A LoRA layer `n_in → n_out` of rank `rank` (braintrace's argument
    /// order: `in_features, lora_rank, out_features`).
    pub fn new(path: &str, n_in: usize, rank: usize, n_out: usize) -> Result<Self> {
        check_size("Lora", "n_in", n_in)?;
        check_size("Lora", "lora_rank", rank)?;
        check_size("Lora", "n_out", n_out)?;
        Ok(Lora {
            path: path.to_string(),
            n_in,
            rank,
            n_out,
            kernel_init: Initializer::KaimingNormal { scale: 1.0 },
        })
    }
    /// With another initialiser of both factors.
    pub fn with_init(mut self, kernel_init: Initializer) -> Self {
        self.kernel_init = kernel_init;
        self
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The key of leaf `leaf` (`lora_a`, `lora_b`).
    pub fn key(&self, leaf: &str) -> String {
        join_path(&self.state_path(), leaf)
    }
}

impl Model for Lora {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("Lora", &self.path);
        let a = draw(
            init,
            &op,
            "lora_a",
            &self.kernel_init,
            &[self.n_in, self.rank],
        )?;
        let b = draw(
            init,
            &op,
            "lora_b",
            &self.kernel_init,
            &[self.rank, self.n_out],
        )?;
        init.param(&self.state_path(), Some("lora_a"), a)?;
        init.param(&self.state_path(), Some("lora_b"), b)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        check_features(&layer_op("Lora", &self.path), x, self.n_in)?;
        let a = ctx.param(&self.key("lora_a"))?;
        let b = ctx.param(&self.key("lora_b"))?;
        let alpha = 1.0 / self.rank as f64;
        lora_matmul(x, &a, &b, alpha, None, &Transforms::default())
    }
}
