//! `GroupedLinear`: braintrace's `nn.GroupedLinear`, `G` independent
//! `K → N` linear maps through the grouped-matmul primitive (`etp_gmm`).

use super::init::Initializer;
use super::layers::layer_op;
use crate::error::{Error, Result};
use crate::etp::ElemFn;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::prims::{grouped_matmul, Transforms};
use crate::tensor::Tensor;

/// A block-diagonal linear layer: `y[..., g, :] = x[..., g, :] @ W[g] + b[g]`
/// for an input `(..., G, K)` and an output `(..., G, N)`, through
/// `etp_gmm` / `etp_gmv` (braintrace's `grouped_matmul`). It equals a
/// dense layer with a block-diagonal weight, with a `G` times smaller
/// D-RTRL trace `(B, G, K, N, S)`.
///
/// Parameters as braintrace's `nn.GroupedLinear`: one state
/// `<path>/weight` with the leaves `weight` `(G, K, N)` (braintools'
/// `KaimingNormal`, which for a rank-3 shape takes `fan_in = K · N`) and
/// `bias` `(G, N)` (zeros). Inputs of rank above 3 are folded into one
/// batch axis and unfolded on the output.
///
/// ```
/// use braintrace_core::nn::GroupedLinear;
/// use braintrace_core::learn::ModelState;
/// use braintrace_core::{DType, Tensor};
/// let layer = GroupedLinear::new("gl", 4, 3, 2)?; // G = 4 blocks of 3 -> 2
/// let state = ModelState::new(&layer, DType::F64, 0, Some(5))?;
/// let (y, _) = state.step(&layer, &Tensor::ones(&[5, 4, 3], DType::F64))?;
/// assert_eq!(y.shape(), &[5, 4, 2]);
/// // 12 features cannot be split into 5 groups.
/// assert!(GroupedLinear::from_features("gl", 5, 12, 8).is_err());
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct GroupedLinear {
    /// The layer's path.
    pub path: String,
    /// Number of blocks `G`.
    pub num_groups: usize,
    /// Input features per block `K`.
    pub in_features: usize,
    /// Output features per block `N`.
    pub out_features: usize,
    /// Whether there is a bias leaf.
    pub bias: bool,
    /// Weight initialiser.
    pub w_init: Initializer,
    /// Bias initialiser (zeros).
    pub b_init: Initializer,
    /// Optional element-wise transform of the weight inside the primitive.
    pub weight_fn: Option<ElemFn>,
}

impl GroupedLinear {
    /// `num_groups` blocks of `in_features → out_features` (per block), with
    /// a bias; an error naming the layer and the size when one is 0.
    pub fn new(
        path: &str,
        num_groups: usize,
        in_features: usize,
        out_features: usize,
    ) -> Result<Self> {
        let op = layer_op("GroupedLinear", path);
        for (name, v) in [
            ("num_groups", num_groups),
            ("in_features", in_features),
            ("out_features", out_features),
        ] {
            if v == 0 {
                return Err(Error::invalid(
                    &op,
                    format!("`{name}` = 0: a layer size must be positive"),
                ));
            }
        }
        // braintools' fans of a rank-3 shape (G, K, N): fan_in = K * N.
        let fan_in = (in_features as f64) * (out_features as f64);
        Ok(GroupedLinear {
            path: path.to_string(),
            num_groups,
            in_features,
            out_features,
            bias: true,
            w_init: Initializer::Normal {
                std: (2.0 / fan_in).sqrt(),
            },
            b_init: Initializer::Zeros,
            weight_fn: None,
        })
    }
    /// The layer of `total_in → total_out` features split into `num_groups`
    /// equal blocks; an error naming the layer and the sizes when
    /// `num_groups` does not divide both.
    pub fn from_features(
        path: &str,
        num_groups: usize,
        total_in: usize,
        total_out: usize,
    ) -> Result<Self> {
        let op = layer_op("GroupedLinear", path);
        if num_groups == 0 {
            return Err(Error::invalid(
                &op,
                "`num_groups` = 0: a layer size must be positive",
            ));
        }
        for (name, v) in [("total_in", total_in), ("total_out", total_out)] {
            if v % num_groups != 0 {
                return Err(Error::invalid(
                    &op,
                    format!("num_groups = {num_groups} does not divide {name} = {v}"),
                ));
            }
        }
        Self::new(
            path,
            num_groups,
            total_in / num_groups,
            total_out / num_groups,
        )
    }
    /// Without a bias.
    pub fn without_bias(mut self) -> Self {
        self.bias = false;
        self
    }
    /// With another weight initialiser.
    pub fn with_init(mut self, w_init: Initializer) -> Self {
        self.w_init = w_init;
        self
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The key of the weight leaf (`<path>/weight/weight`).
    pub fn weight_key(&self) -> String {
        join_path(&self.state_path(), "weight")
    }
    /// The key of the bias leaf (`<path>/weight/bias`).
    pub fn bias_key(&self) -> String {
        join_path(&self.state_path(), "bias")
    }
    /// The output `(..., G, N)` of an input `(..., G, K)` with explicit
    /// parameter values (what `step` computes).
    pub fn apply(&self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let op = layer_op("GroupedLinear", &self.path);
        let (g, k) = (self.num_groups, self.in_features);
        let r = x.ndim();
        if r < 2 || x.shape()[r - 2..] != [g, k] {
            return Err(Error::shapes(
                &op,
                [x.shape()],
                format!("the input must end with (num_groups, in_features) = ({g}, {k})"),
            ));
        }
        let t = Transforms {
            weight_fn: self.weight_fn.clone(),
            ..Transforms::default()
        };
        if r <= 3 {
            return grouped_matmul(x, weight, bias, &t);
        }
        let lead = &x.shape()[..r - 2];
        let n: usize = lead.iter().product();
        let y = grouped_matmul(&x.reshape(&[n, g, k])?, weight, bias, &t)?;
        y.reshape(&[lead, &[g, self.out_features][..]].concat())
    }
}

impl Model for GroupedLinear {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("GroupedLinear", &self.path);
        let (g, k, n) = (self.num_groups, self.in_features, self.out_features);
        let dt = init.dtype();
        let w = self
            .w_init
            .try_draw(&format!("{op}: weight"), &[g, k, n], dt, init.rng())?;
        init.param(&self.state_path(), Some("weight"), w)?;
        if self.bias {
            let b = self
                .b_init
                .try_draw(&format!("{op}: bias"), &[g, n], dt, init.rng())?;
            init.param(&self.state_path(), Some("bias"), b)?;
        }
        Ok(())
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let w = ctx.param(&self.weight_key())?;
        let b = if self.bias {
            Some(ctx.param(&self.bias_key())?)
        } else {
            None
        };
        self.apply(x, &w, b.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::ModelState;
    use crate::tensor::DType;

    #[test]
    fn sizes_are_checked() {
        let e = GroupedLinear::new("gl", 0, 2, 2).unwrap_err().to_string();
        assert!(
            e.contains("GroupedLinear `gl`") && e.contains("num_groups"),
            "{e}"
        );
        let e = GroupedLinear::new("gl", 2, 2, 0).unwrap_err().to_string();
        assert!(e.contains("out_features"), "{e}");
        let e = GroupedLinear::from_features("gl", 3, 6, 7)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GroupedLinear `gl`") && e.contains("total_out = 7") && e.contains("3"),
            "{e}"
        );
        let l = GroupedLinear::from_features("gl", 3, 6, 9).unwrap();
        assert_eq!((l.in_features, l.out_features), (2, 3));
    }

    #[test]
    fn keys_shapes_and_folding() {
        let l = GroupedLinear::new("gl", 2, 3, 4).unwrap();
        let s = ModelState::new(&l, DType::F64, 1, None).unwrap();
        let keys: Vec<&str> = s.param_infos().iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["gl/weight/weight", "gl/weight/bias"]);
        assert_eq!(s.param("gl/weight/weight").unwrap().shape(), &[2, 3, 4]);
        let v: Vec<f64> = (0..60).map(|i| ((i * 7 % 11) as f64) / 5.0 - 1.0).collect();
        let x = Tensor::from_vec(v, &[2, 5, 2, 3]).unwrap();
        let (y, _) = s.step(&l, &x).unwrap();
        assert_eq!(y.shape(), &[2, 5, 2, 4]);
        let (y0, _) = s.step(&l, &x.index_axis0(0).unwrap()).unwrap();
        assert_eq!(
            y0.to_vec_f64().unwrap(),
            y.index_axis0(0).unwrap().to_vec_f64().unwrap()
        );
        let e = s
            .step(&l, &Tensor::ones(&[5, 3, 3], DType::F64))
            .unwrap_err()
            .to_string();
        assert!(e.contains("GroupedLinear `gl`"), "{e}");
    }
}
