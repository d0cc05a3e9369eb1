"""Record golden cases of braintrace 0.2.6's DNI (issue 35, item 1).

Each case (``dni__<model>__<case>.json`` in ``--out``, default
``tests/golden_dni``) builds a model, compiles it with
``braintrace.compile(model, braintrace.DNI, zeros((B, n_in)), batch_size=B)``
(multi-step D-RTRL with a bootstrapped exit cotangent), attaches a
``braintrace.SyntheticGradient(learner.group_signal_shapes(), scale=0.3,
seed=...)`` and runs it:

* ``grad_k2`` / ``grad_k1``: ``learner.etrace_grad(xs, ys, step_fn=mse,
  chunk_size=k)`` (windows of 2 steps: the model called on
  ``MultiStepData``; 1: the plain path), mean reduction;
* ``train_k2``: ``braintrace.train_synthetic_gradient(learner, xs,
  chunk_size=2, loss_fn=lambda o: sum((o - c)**2), lr=0.05, epochs=2)``
  with a reset before each epoch, then the synthesiser's parameters, the
  hidden states after training, and a second ``etrace_grad(chunk_size=2)``
  from reset states with the trained synthesiser;
* ``train_k1_noreset`` (GRU only): the same with windows of one step, two
  epochs, ``reset=False``.

braintrace 0.2.6's ``reset=True`` does not reset the learner's hidden
states: it calls ``brainstate.nn.init_all_states`` on the model, whose
``init_state`` makes *new* ``HiddenState`` objects, while the compiled
learner keeps reading (and writing) the old ones, which keep the last
epoch's values (only the traces are re-initialised). The reset this script
records is what the keyword documents ("re-initialise the model states and
the trace before each epoch"): each epoch is its own
``train_synthetic_gradient(..., epochs=1, reset=True)`` call after the
learner's own hidden states are set to zero (their initial value in these
models) and ``init_etrace_state()`` is called; the first epoch starts from
the freshly compiled (zero) states, where the bug cannot show.

Models: the GRU and the LIF network of ``generate_e2e.py`` (reference set A
dims, hyperparameters and draws, seed ``--seed``) and the zoo's LSTM
(``generate_zoo_rnn.py``, batch 2, its draws; its 5 steps trimmed to 4 so
that windows of 2 divide them).

The synthesiser's weights are braintrace's own draws
(``brainstate.random.randn`` under ``seed_context(seed)``, stored float32 by
braintrace), exported exactly (float32 -> float64 is exact) and recorded in
the case; the states are then set to those values as float64 (braintrace
keeps them float32, which would round every update to 1e-8 relative and
make a 1e-9 comparison meaningless). The biases (zero in braintrace's
constructor) are set to ``0.1 * N(0, 1)`` numpy draws so that the bias path
is exercised; they are recorded too.

Recorded: the weights, inputs, hidden groups, the synthesiser's initial
parameters and every output named above. Nothing reads the Rust code.

Run (from the repository root)::

    $(scripts/ref_python.sh) scripts/golden_gen/generate_dni.py --out tests/golden_dni
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as E  # noqa: E402  (sets x64, the backends)
import generate_zoo_rnn as Z  # noqa: E402

import braintrace  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

SCALE = 0.3
LR = 0.05
EPOCHS = 2
CASES = [
    ('grad_k2', dict(grad=2)),
    ('grad_k1', dict(grad=1)),
    ('train_k2', dict(train=2, reset=True)),
    # GRU only: windows of one step, two epochs without reset.
    ('train_k1_noreset', dict(train=1, reset=False)),
]


def models(seed):
    """(name, spec, W, xs, ys, constructor) for the GRU, the LIF and the zoo LSTM."""
    specs = {m['model']: m for m in E.variants_a()[0]}
    out = []
    for name in ('gru', 'lif'):
        spec = specs[name]
        W, xs, ys = E.draw_model(spec, seed, 0)
        out.append((name, spec, W, xs, ys,
                    lambda s=spec: E.MODELS[s['model']](s['n_in'], s['n_rec'], s['n_out'], s['hp'])))
    spec = [s for s in Z.specs() if s['cell'] == 'lstm' and s['B'] == 2][0]
    rng = np.random.default_rng([seed, zlib.crc32(b'zoo__lstm__b2')])
    net = Z.ZooNet('lstm', spec['n_in'], spec['n_rec'], spec['n_out'])
    W = {k: spec['w_scale'] * rng.standard_normal(s) for k, s in E.flat_keys(net).items()}
    xs = spec['x_scale'] * rng.standard_normal((spec['T'], spec['B'], spec['n_in']))
    ys = 0.5 * rng.standard_normal((spec['T'], spec['B'], spec['n_out']))
    t = spec['T'] - spec['T'] % 2
    spec = dict(spec, T=t, hp={})
    out.append(('zoo_lstm', spec, W, xs[:t], ys[:t],
                lambda s=spec: Z.ZooNet('lstm', s['n_in'], s['n_rec'], s['n_out'])))
    return out


def build(make, spec, W, synth_seed, bias_rng):
    """The compiled DNI learner with its synthesiser, and the synthesiser's initial values."""
    net = make()
    E.set_weights(net, W)
    B = spec['B']
    learner = braintrace.compile(net, braintrace.DNI, jnp.zeros((B, spec['n_in'])), batch_size=B)
    shapes = learner.group_signal_shapes()
    sg = braintrace.SyntheticGradient(shapes, scale=SCALE, seed=synth_seed)
    w0, b0 = {}, {}
    for g in sorted(shapes):
        w = np.asarray(sg.weights[g].value).astype(np.float64)
        b = 0.1 * bias_rng.standard_normal(np.shape(sg.biases[g].value))
        sg.weights[g].value = jnp.asarray(w)
        sg.biases[g].value = jnp.asarray(b)
        w0[g], b0[g] = w, b
    learner.attach_synthesizer(sg)
    groups = [{'index': g.index, 'hidden_paths': [E.path_str(p) for p in g.hidden_paths],
               'shape': list(shapes[g.index])} for g in learner.graph.hidden_groups]
    return learner, sg, groups, w0, b0


def synth_json(sg_w, sg_b):
    return {'w': [E.enc(sg_w[g]) for g in sorted(sg_w)],
            'b': [E.enc(sg_b[g]) for g in sorted(sg_b)]}


def etrace(learner, xs, ys, k):
    if k == 1:
        def step(x, y):
            return jnp.mean((learner(x) - y) ** 2)
    else:
        def step(x, y):
            o = learner(braintrace.MultiStepData(x))
            return jnp.mean((o - y) ** 2, axis=tuple(range(1, o.ndim)))
    grads, losses = learner.etrace_grad(jnp.asarray(xs), jnp.asarray(ys), step_fn=step,
                                        chunk_size=k, return_value=True)
    return ({k_: E.enc(np.asarray(v)) for k_, v in sorted(E.flat_grads(grads).items())},
            E.enc(np.asarray(losses)))


def hidden_values(learner):
    return {E.path_str(p): E.enc(np.asarray(st.value)) for p, st in learner.hidden_states.items()}


def proper_reset(learner):
    """Zero the hidden states the learner reads, and its traces (see the module docs)."""
    for st in learner.hidden_states.values():
        st.value = jnp.zeros_like(st.value)
    learner.init_etrace_state()


def run_case(make, spec, W, xs, ys, cfg, synth_seed, bias_rng, loss_c):
    learner, sg, groups, w0, b0 = build(make, spec, W, synth_seed, bias_rng)
    out = {'groups': groups, 'synth': synth_json(w0, b0)}
    expect = {}
    if 'grad' in cfg:
        expect['grads'], expect['losses'] = etrace(learner, xs, ys, cfg['grad'])
    else:
        k = cfg['train']
        c = jnp.asarray(loss_c)
        kw = dict(chunk_size=k, loss_fn=lambda o: jnp.sum((o - c) ** 2), lr=LR)
        if cfg['reset']:
            hist = []
            for epoch in range(EPOCHS):
                if epoch:
                    proper_reset(learner)
                hist += braintrace.train_synthetic_gradient(
                    learner, jnp.asarray(xs), epochs=1, reset=True, **kw)
        else:
            hist = braintrace.train_synthetic_gradient(
                learner, jnp.asarray(xs), epochs=EPOCHS, reset=False, **kw)
        expect['history'] = [float(h) for h in hist]
        expect['synth_after'] = synth_json(
            {g: np.asarray(st.value) for g, st in sg.weights.items()},
            {g: np.asarray(st.value) for g, st in sg.biases.items()})
        expect['hidden_after'] = hidden_values(learner)
        proper_reset(learner)
        expect['grads'], expect['losses'] = etrace(learner, xs, ys, k)
    out['expect'] = expect
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='tests/golden_dni')
    ap.add_argument('--seed', type=int, default=20260)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    files = []
    for name, spec, W, xs, ys, make in models(args.seed):
        for case, cfg in CASES:
            if case == 'train_k1_noreset' and name != 'gru':
                continue
            case_id = f'dni__{name}__{case}'
            synth_seed = zlib.crc32(case_id.encode()) % 100000
            bias_rng = np.random.default_rng([args.seed, zlib.crc32(case_id.encode())])
            loss_c = 0.5 * bias_rng.standard_normal(spec['n_out'])
            res = run_case(make, spec, W, xs, ys, cfg, synth_seed, bias_rng, loss_c)
            doc = {
                'kind': 'dni',
                'case_id': case_id,
                'model': name,
                'dims': {k: spec[k] for k in ('n_in', 'n_rec', 'n_out', 'T', 'B')},
                'hyperparams': E.hyperparams_json(spec),
                'algorithm': 'DNI',
                'driver': dict(cfg),
                'synth_scale': SCALE,
                'synth_seed': synth_seed,
                'groups': res['groups'],
                'synth': res['synth'],
                'weights': E.enc_tree(W),
                'xs': E.enc(xs),
                'ys': E.enc(ys),
                'expect': res['expect'],
                'generator': {'seed': args.seed, 'braintrace': E.pkg_version('braintrace'),
                              'jax': E.pkg_version('jax'),
                              'script': 'scripts/golden_gen/generate_dni.py'},
            }
            if 'train' in cfg:
                doc['train'] = {'lr': LR, 'epochs': EPOCHS, 'reset': cfg['reset'],
                                'loss': 'sum((o - loss_c)**2) over the window',
                                'loss_c': E.enc(loss_c)}
            fn = case_id + '.json'
            with open(os.path.join(args.out, fn), 'w') as f:
                json.dump(doc, f, indent=None, sort_keys=True)
            files.append(fn)
            print('wrote', fn, file=sys.stderr)
    with open(os.path.join(args.out, 'MANIFEST.json'), 'w') as f:
        json.dump({'files': sorted(files), 'generator': 'scripts/golden_gen/generate_dni.py',
                   'seed': args.seed}, f, sort_keys=True)


if __name__ == '__main__':
    main()
