//! The "trace kernels" column of the book's layer table (`book/src/layers.md`)
//! checked on compiled models: for each layer, the relations the compiler
//! finds, the trace kernel each relation's primitive declares
//! (`EtpPrimitive::trace_kernel`), and the compilation report's lines
//! saying how many relation–group pairs run fused under D-RTRL and pp_prop
//! (`Learner::report().algorithm_lines`). With the fast paths off, none
//! does (the claim can fail).

use braintrace::learn::{compile, Algorithm, DRtrl, Learner, Model, ModelState, PpProp};
use braintrace::nn::{
    CfnCell, Chain, GruCell, LeakyRateReadout, LifCell, Linear, LruCell, LstmCell, MguCell,
    MiniGru, MiniLstm, MinimalRnnCell, UrLstmCell, VanillaRnnCell,
};
use braintrace::{DType, Tensor};

fn learner<M: Model>(m: M, algo: Algorithm) -> Learner<M> {
    let st = ModelState::new(&m, DType::F32, 0, Some(2)).unwrap();
    compile(m, st, algo, &Tensor::zeros(&[2, 3], DType::F32), Some(2)).unwrap()
}

/// `(primitive, declared kernel kind)` of each relation, and the report's
/// algorithm line.
fn kernels<M: Model + Clone>(m: &M, algo: Algorithm) -> (Vec<(String, String)>, String) {
    let l = learner(m.clone(), algo);
    let rels = l
        .graph()
        .relations()
        .iter()
        .map(|r| {
            let kind = r
                .primitive
                .trace_kernel(&r.params)
                .map_or("rules".to_string(), |k| k.kind().to_string());
            (r.primitive.name().to_string(), kind)
        })
        .collect();
    (rels, l.report().algorithm_lines.join("; "))
}

/// `m` has `mm` `etp_mm` and `ew` `etp_elemwise` relations, all with the
/// dense kernel, and every pair runs fused under both algorithms.
fn all_dense_fused<M: Model + Clone>(name: &str, m: M, mm: usize, ew: usize) {
    let n = mm + ew;
    for (algo, line) in [
        (
            Algorithm::from(DRtrl::default()),
            format!("fused trace kernels: {n} of {n} relation-group pairs"),
        ),
        (
            PpProp::new(0.9).unwrap().into(),
            format!("fused dense gradients (pp_prop): {n} of {n} relation-group pairs"),
        ),
    ] {
        let (rels, got) = kernels(&m, algo);
        assert_eq!(got, line, "{name}");
        let count = |p: &str| rels.iter().filter(|(q, _)| q == p).count();
        assert_eq!(
            (count("etp_mm"), count("etp_elemwise")),
            (mm, ew),
            "{name}: {rels:?}"
        );
        assert!(rels.iter().all(|(_, k)| k == "dense"), "{name}: {rels:?}");
    }
}

#[test]
fn every_layer_runs_the_dense_fused_kernel() {
    let out = |k| Linear::new("out", k, 2);
    // The readout `out` is not recurrent: no relation, no trace.
    all_dense_fused(
        "GruCell",
        Chain::new(GruCell::new("rnn", 3, 4), out(4)),
        2,
        0,
    );
    all_dense_fused(
        "VanillaRnnCell",
        VanillaRnnCell::new("rnn", 3, 4).unwrap(),
        1,
        0,
    );
    all_dense_fused("MguCell", MguCell::new("rnn", 3, 4).unwrap(), 2, 0);
    all_dense_fused(
        "MinimalRnnCell",
        MinimalRnnCell::new("rnn", 3, 4).unwrap(),
        2,
        0,
    );
    all_dense_fused("CfnCell", CfnCell::new("rnn", 3, 4).unwrap(), 3, 0);
    all_dense_fused("LstmCell", LstmCell::new("rnn", 3, 4).unwrap(), 4, 0);
    all_dense_fused("UrLstmCell", UrLstmCell::new("rnn", 3, 4).unwrap(), 4, 2);
    all_dense_fused("MiniGru", MiniGru::new("rnn", 3, 4).unwrap(), 2, 0);
    all_dense_fused("MiniLstm", MiniLstm::new("rnn", 3, 4).unwrap(), 3, 0);
    all_dense_fused("LruCell", LruCell::new("rnn", 3, 4).unwrap(), 2, 3);
    all_dense_fused(
        "LeakyRateReadout",
        LeakyRateReadout::new("ro", 3, 2, 5.0, 1.0),
        1,
        0,
    );
    all_dense_fused("LifCell", LifCell::new("lif", 3, 4, 0.8, 0.6, 1.0), 1, 0);
}

#[test]
fn without_fast_paths_the_rules_run() {
    let m = LstmCell::new("rnn", 3, 4).unwrap();
    let (_, d) = kernels(&m, DRtrl::default().fast_paths(false).into());
    assert_eq!(d, "fused trace kernels: 0 of 4 relation-group pairs");
    let (_, p) = kernels(&m, PpProp::new(0.9).unwrap().fast_paths(false).into());
    assert_eq!(
        p,
        "fused dense gradients (pp_prop): 0 of 4 relation-group pairs"
    );
}
