"""Record golden cases of several inputs per step from the real braintrace 0.2.6.

The model (``TwoIn``) takes two inputs of different widths per step, an
input ``x`` (``n_x``) and a modulator ``m`` (``n_m``), in its
``update(x, m)``::

    h' = 0.5 h + tanh(wx(x) + wh(h)) * sigmoid(wm(m)),   out = ro(h')

(``braintrace.nn.Linear`` layers ``wx``, ``wh`` and ``wm`` without bias for
``wh``, and a readout ``ro``). It is compiled with two example inputs
(``braintrace.compile(net, algo, x0, m0, batch_size=B)``) and run with
``etrace_grad(xs, ms, ys, step_fn=...)``, the step function calling
``learner(x, m)``, for D_RTRL and pp_prop (single-step). Recorded: the
weights, the sequences, the gradients and per-step losses.

A second record (``partial_path.json``) is the compiler's diagnostics for a
model whose weight ``W1`` reaches the hidden state both directly and
through another weight ``W2`` (``a = W1 x; h' = 0.5 h + tanh(a + W2 a)``):
braintrace emits ``RELATION_PARTIAL_PATH`` for ``W1`` there.

Draws: ``numpy.random.default_rng([seed, 35, 1])``, trainable leaves in
sorted key order (standard normal times 0.5), then xs, ms, ys. Nothing
reads the Rust code.

Run (from the repository root)::

    $(scripts/ref_python.sh) scripts/golden_gen/generate_several_inputs.py --out tests/golden_several
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as E  # noqa: E402  (sets x64, the backends)

import brainstate  # noqa: E402
import braintrace  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

N_X, N_M, N_REC, N_OUT, T, B = 3, 2, 4, 2, 6, 2


class TwoIn(brainstate.nn.Module):
    """Two inputs per step: an input ``x`` and a modulator ``m``."""

    def __init__(self):
        super().__init__()
        self.wx = braintrace.nn.Linear(N_X, N_REC)
        self.wh = braintrace.nn.Linear(N_REC, N_REC, b_init=None)
        self.wm = braintrace.nn.Linear(N_M, N_REC)
        self.ro = braintrace.nn.Linear(N_REC, N_OUT)

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N_REC)))

    def update(self, x, m):
        h = self.h.value
        h = 0.5 * h + jnp.tanh(self.wx(x) + self.wh(h)) * jax.nn.sigmoid(self.wm(m))
        self.h.value = h
        return self.ro(h)


class Partial(brainstate.nn.Module):
    """``W1``'s output reaches ``h`` directly and through ``W2``."""

    def __init__(self):
        super().__init__()
        self.W1 = braintrace.nn.Linear(N_X, N_REC)
        self.W2 = braintrace.nn.Linear(N_REC, N_REC, b_init=None)

    def init_state(self, batch_size=None, **kw):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N_REC)))

    def update(self, x):
        a = self.W1(x)
        self.h.value = 0.5 * self.h.value + jnp.tanh(a + self.W2(a))
        return self.h.value


def run(algo, options, W, xs, ms, ys):
    net = TwoIn()
    learner = braintrace.compile(net, getattr(braintrace, algo), jnp.zeros((B, N_X)),
                                 jnp.zeros((B, N_M)), batch_size=B, **options)
    E.set_weights(net, W)

    def step(x, m, y):
        return jnp.mean((learner(x, m) - y) ** 2)

    grads, losses = learner.etrace_grad(jnp.asarray(xs), jnp.asarray(ms), jnp.asarray(ys),
                                        step_fn=step, return_value=True)
    return {k: np.asarray(v) for k, v in E.flat_grads(grads).items()}, np.asarray(losses)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=20260)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng([args.seed, 35, 1])
    net = TwoIn()
    brainstate.nn.init_all_states(net, batch_size=B)
    W = {k: 0.5 * rng.standard_normal(s) for k, s in E.flat_keys(net).items()}
    xs = rng.standard_normal((T, B, N_X))
    ms = rng.standard_normal((T, B, N_M))
    ys = 0.5 * rng.standard_normal((T, B, N_OUT))
    gen = {'seed': args.seed, 'braintrace': E.pkg_version('braintrace'),
           'jax': E.pkg_version('jax')}
    files = []
    for algo, options in (('D_RTRL', {}), ('pp_prop', {'decay_or_rank': 0.9})):
        grads, losses = run(algo, options, W, xs, ms, ys)
        case = {
            'case_id': f'several__{algo.lower()}',
            'dims': {'n_x': N_X, 'n_m': N_M, 'n_rec': N_REC, 'n_out': N_OUT, 'T': T, 'B': B},
            'algorithm': algo,
            'algorithm_options': options,
            'weights': E.enc_tree(W),
            'xs': E.enc(xs),
            'ms': E.enc(ms),
            'ys': E.enc(ys),
            'expect': {'grads': E.enc_tree(grads), 'losses': E.enc(losses)},
            'generator': gen,
        }
        fn = case['case_id'] + '.json'
        with open(os.path.join(args.out, fn), 'w') as f:
            json.dump(case, f, indent=None, sort_keys=True)
        files.append(fn)
        print('wrote', fn)
    # The partial-path diagnostic.
    learner = braintrace.compile(Partial(), braintrace.D_RTRL, jnp.zeros((B, N_X)), batch_size=B)
    diags = [{'kind': r.kind.name, 'level': r.level.name.lower(),
              'weight_path': None if r.weight_path is None else E.path_str(r.weight_path),
              'hidden_paths': [E.path_str(p) for p in r.hidden_paths]}
             for r in learner.graph.diagnostics]
    with open(os.path.join(args.out, 'partial_path.json'), 'w') as f:
        json.dump({'diagnostics': diags, 'generator': gen}, f, indent=1, sort_keys=True)
    files.append('partial_path.json')
    print('wrote partial_path.json')
    with open(os.path.join(args.out, 'MANIFEST.json'), 'w') as f:
        json.dump({'files': files, 'generator': gen}, f, indent=1, sort_keys=True)


if __name__ == '__main__':
    main()
