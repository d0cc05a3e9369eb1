//! A `Sequential[Linear, LayerNorm, GELU, GruCell, Linear]` (plus dropout
//! off, a PReLU and an RMS norm in a second model) compiled with D-RTRL:
//! on one step (the traces start at zero), where D-RTRL is exact, its gradients
//! equal BPTT's to 1e-12 for every parameter (the norm's and PReLU's learn
//! by their in-step gradient); over several steps they are finite, and a
//! few SGD steps on them lower the loss.

use braintrace::learn::{bptt_grad, compile, DRtrl, ModelState, Reduction};
use braintrace::nn::{
    Activation, Dropout, GruCell, LayerNorm, Linear, Optimizer, PRelu, RmsNorm, Sequential, Sgd,
};
use braintrace::random::Rng;
use braintrace::{DType, Tensor};

const B: usize = 2;

fn draw(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    let mut r = Rng::seed(seed);
    let n = shape.iter().product();
    Tensor::from_vec((0..n).map(|_| scale * r.normal()).collect(), shape).unwrap()
}

fn mse(o: &Tensor, y: &Tensor) -> braintrace::Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

fn model(variant: usize) -> Sequential {
    // Variant 2: the same without the blocks (a baseline).
    if variant == 2 {
        return Sequential::new()
            .push(Linear::new("inp", 3, 6))
            .push(GruCell::new("rnn", 6, 5))
            .push(Linear::new("out", 5, 2));
    }
    let s = Sequential::new()
        .push(Linear::new("inp", 3, 6))
        .push(LayerNorm::new("ln", 6));
    let s = if variant == 0 {
        s.push(Activation::Gelu { approximate: false })
    } else {
        let d = Dropout::new(0.5, 1).unwrap();
        d.set_training(false);
        s.push(PRelu::new("act", 6))
            .push(d)
            .push(RmsNorm::new("rms", 6))
    };
    s.push(GruCell::new("rnn", 6, 5))
        .push(Linear::new("out", 5, 2))
}

fn state(m: &Sequential) -> ModelState {
    let mut st = ModelState::new(m, DType::F64, 3, Some(B)).unwrap();
    // Scale and bias away from 1 and 0 so that their gradients are generic.
    for (k, v) in st.params() {
        if k.ends_with("/scale") || k.ends_with("/bias") {
            let d = draw(v.shape(), k.len() as u64, 0.3);
            st.set_param(&k, &v.add(&d).unwrap()).unwrap();
        }
    }
    st
}

#[test]
fn sequential_with_blocks_matches_bptt_on_one_step() {
    for variant in [2, 0, 1] {
        let m = model(variant);
        let mut st = state(&m);
        // A non-zero initial hidden state (not a function of the
        // parameters: the traces still start at zero), so that the reset
        // gate's weights have a gradient.
        st.set_hidden("rnn/h", &draw(&[B, 5], 12, 0.5)).unwrap();
        let xs = draw(&[1, B, 3], 10, 1.0);
        let ys = draw(&[1, B, 2], 11, 0.5);
        let bptt = bptt_grad(&m, &st, &xs, &ys, mse, Reduction::Mean)
            .unwrap()
            .grads;
        let mut learner = compile(
            m,
            st,
            DRtrl::default(),
            &Tensor::zeros(&[B, 3], DType::F64),
            Some(B),
        )
        .unwrap();
        // `compile` resets the hidden states to the batch: set h again.
        learner
            .state_mut()
            .set_hidden("rnn/h", &draw(&[B, 5], 12, 0.5))
            .unwrap();
        let out = learner.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
        assert_eq!(
            out.grads.keys().collect::<Vec<_>>(),
            bptt.keys().collect::<Vec<_>>()
        );
        for (k, g) in &out.grads {
            let (a, b) = (g.to_vec_f64().unwrap(), bptt[k].to_vec_f64().unwrap());
            let norm: f64 = b.iter().map(|v| v * v).sum::<f64>().sqrt();
            assert!(norm > 0.0, "variant {variant}: {k}: BPTT gradient is zero");
            for (u, v) in a.iter().zip(&b) {
                assert!(
                    (u - v).abs() <= 1e-12 * (1.0 + v.abs()),
                    "variant {variant}: {k}: D-RTRL {u} vs BPTT {v}"
                );
            }
        }
    }
}

#[test]
fn sequential_with_blocks_learns_with_drtrl() {
    const T: usize = 6;
    let m = model(0);
    let st = state(&m);
    let xs = draw(&[T, B, 3], 20, 1.0);
    let ys = draw(&[T, B, 2], 21, 0.5);
    let mut learner = compile(
        m,
        st,
        DRtrl::default(),
        &Tensor::zeros(&[B, 3], DType::F64),
        Some(B),
    )
    .unwrap();
    let mut opt = Sgd::new(0.1).unwrap();
    let mut losses = Vec::new();
    for _ in 0..15 {
        learner.state_mut().reset_hidden(Some(B)).unwrap();
        let out = learner.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
        for (k, g) in &out.grads {
            assert!(
                g.to_vec_f64().unwrap().iter().all(|v| v.is_finite()),
                "{k}: non-finite gradient"
            );
        }
        losses.push(out.losses.mean_all().unwrap().item().unwrap());
        let params = learner.state().params();
        let new = opt.update(&params, &out.grads).unwrap();
        learner.state_mut().set_params(&new).unwrap();
    }
    println!("losses: {losses:?}");
    assert!(
        losses[losses.len() - 1] < 0.8 * losses[0],
        "the loss did not fall: {losses:?}"
    );
}
