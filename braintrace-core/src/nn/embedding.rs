//! `Embedding`: braintrace's `nn.Embedding`, a trainable lookup table
//! through the embedding primitive (`etp_emb`).

use super::layers::layer_op;
use crate::error::{Error, Result};
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::prims::embedding::lookup_named;
use crate::tensor::Tensor;

/// Token indices in, table rows out: `y = T[idx]`, `(*indices.shape, D)`
/// for indices `()` or `(B,)`, through `etp_emb` / `etp_emb_v`
/// (braintrace's `embedding`), so the table is a trainable of the
/// compiler's relations.
///
/// **Indices as inputs.** A learner casts each step's input to the model's
/// float dtype, so the layer takes the indices as floats holding integers
/// (an integer tensor works too when the layer is called directly); it
/// one-hot encodes them for the primitive (see
/// [`prims::embedding`](fn@crate::prims::embedding)). An index that is not an
/// integer in `[0, num_embeddings)` is an error naming the layer and the
/// value: at once when the input is concrete, when the step runs inside a
/// compiled learner (which then changes nothing).
///
/// Parameters as braintrace's `nn.Embedding`: the bare array
/// `<path>/weight` `(num_embeddings, features)`, drawn by braintools'
/// `LecunUniform` (uniform in `±sqrt(3 / num_embeddings)`).
///
/// ```
/// use braintrace_core::nn::Embedding;
/// use braintrace_core::learn::ModelState;
/// use braintrace_core::{DType, Tensor};
/// let emb = Embedding::new("emb", 10, 4)?;
/// let state = ModelState::new(&emb, DType::F64, 0, Some(3))?;
/// let tokens = Tensor::from_vec(vec![0.0, 3.0, 3.0], &[3])?;
/// let (y, _) = state.step(&emb, &tokens)?;
/// assert_eq!(y.shape(), &[3, 4]);
/// let bad = Tensor::from_vec(vec![0.0, 10.0, 3.0], &[3])?;
/// assert!(state.step(&emb, &bad).unwrap_err().to_string().contains("Embedding `emb`"));
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Embedding {
    /// The layer's path.
    pub path: String,
    /// Vocabulary size `V`.
    pub num_embeddings: usize,
    /// Features per row `D`.
    pub features: usize,
}

impl Embedding {
    /// A table of `num_embeddings` rows of `features`; an error naming the
    /// layer and the size when one is 0.
    pub fn new(path: &str, num_embeddings: usize, features: usize) -> Result<Self> {
        let op = layer_op("Embedding", path);
        for (name, v) in [("num_embeddings", num_embeddings), ("features", features)] {
            if v == 0 {
                return Err(Error::invalid(
                    &op,
                    format!("`{name}` = 0: a layer size must be positive"),
                ));
            }
        }
        Ok(Embedding {
            path: path.to_string(),
            num_embeddings,
            features,
        })
    }
    /// The table's key (`<path>/weight`).
    pub fn weight_key(&self) -> String {
        join_path(&self.path, "weight")
    }
}

impl Model for Embedding {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("Embedding", &self.path);
        let (v, d) = (self.num_embeddings, self.features);
        let limit = (3.0 / v as f64).sqrt();
        let n = v
            .checked_mul(d)
            .ok_or_else(|| Error::invalid(&op, format!("a table of {v} x {d} is too large")))?;
        crate::tensor::byte_size(&format!("{op}: weight"), &[v, d], crate::tensor::DType::F64)?;
        let data: Vec<f64> = (0..n)
            .map(|_| limit * (2.0 * init.rng().uniform() - 1.0))
            .collect();
        let w = Tensor::from_vec(data, &[v, d])?.cast(init.dtype())?;
        init.param(&self.weight_key(), None, w)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let op = layer_op("Embedding", &self.path);
        let table = ctx.param(&self.weight_key())?;
        lookup_named(&op, x, &table, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::ModelState;
    use crate::tensor::DType;

    #[test]
    fn sizes_keys_and_lookup() {
        let e = Embedding::new("emb", 0, 3).unwrap_err().to_string();
        assert!(
            e.contains("Embedding `emb`") && e.contains("num_embeddings"),
            "{e}"
        );
        assert!(Embedding::new("emb", 3, 0).is_err());
        let l = Embedding::new("emb", 5, 3).unwrap();
        let s = ModelState::new(&l, DType::F64, 7, None).unwrap();
        let t = s.param("emb/weight").unwrap().clone();
        assert_eq!(t.shape(), &[5, 3]);
        let lim = (3.0f64 / 5.0).sqrt();
        assert!(t.to_vec_f64().unwrap().iter().all(|v| v.abs() <= lim));
        let (y, _) = s.step(&l, &Tensor::scalar(4.0)).unwrap();
        assert_eq!(y.to_vec_f64().unwrap(), t.to_vec_f64().unwrap()[12..15]);
        let e = s.step(&l, &Tensor::scalar(5.0)).unwrap_err().to_string();
        assert!(
            e.contains("Embedding `emb`") && e.contains("index 5"),
            "{e}"
        );
        let e = s.step(&l, &Tensor::scalar(1.5)).unwrap_err().to_string();
        assert!(e.contains("index 1.5"), "{e}");
    }
}
