"""Record e2e golden cases with a cross-entropy loss from braintrace 0.2.6.

The model is ``generate_e2e.py``'s ``gru`` (``braintrace.nn.GRUCell`` ``rnn``
and a ``braintrace.nn.Linear`` readout ``out`` of ``n_out`` class logits);
the per-step loss is braintools' softmax cross-entropy against integer
labels, averaged over the batch::

    step_fn = lambda x, y: braintools.metric.softmax_cross_entropy_with_integer_labels(
        learner(x), y).mean()

The schema is the e2e one (``generate_e2e.py``) with one more field,
``"loss": "softmax_cross_entropy_with_integer_labels"``; ``ys`` holds the
labels ``(T, B)`` (whole numbers stored as float64; braintrace receives
them as int64). ``etrace`` is ``braintrace.compile`` + ``etrace_grad``,
``bptt`` is ``jax.grad`` of a plain JAX unroll of the GRU's equations with
``-mean_b log_softmax(o)[label]`` per step (no ETP primitive, no braintools
call). Draws: ``numpy.random.default_rng([seed, crc32('ce__gru__b<B>')])``,
trainable leaves in sorted key order (standard normal times ``w_scale``),
then ``xs``, then the labels. Nothing here reads the Rust code.

Run (from the repository root)::

    $(scripts/ref_python.sh) scripts/golden_gen/generate_ce.py --out tests/golden_ce
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as ge  # noqa: E402  (x64, dt = 1, the CPU backend)

import braintools  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

LOSS = 'softmax_cross_entropy_with_integer_labels'
ETRACE_GRAD_CALL = ('learner.etrace_grad(xs, labels, step_fn=lambda x, y: braintools.metric.'
                    'softmax_cross_entropy_with_integer_labels(learner(x), y).mean(), '
                    'return_value=True)  # reduction=\'mean\', labels int64')
BPTT_OBJECTIVE = 'mean over t of the per-step mean over the batch of -log_softmax(o_t)[label_t]'


def ce_step(learner):
    return lambda x, y: braintools.metric.softmax_cross_entropy_with_integer_labels(
        learner(x), y).mean()


def bptt_rollout(W, xs, labels, B, n_rec):
    sig = jax.nn.sigmoid
    h = jnp.zeros((B, n_rec))
    losses, outs, hid = [], [], []
    for t in range(xs.shape[0]):
        x = xs[t]
        xh = jnp.concatenate([x, h], -1)
        z = sig(xh @ W['rnn/Wz/weight/weight'] + W['rnn/Wz/weight/bias'])
        r = sig(xh @ W['rnn/Wr/weight/weight'] + W['rnn/Wr/weight/bias'])
        hc = jnp.tanh(jnp.concatenate([x, r * h], -1) @ W['rnn/Wh/weight/weight']
                      + W['rnn/Wh/weight/bias'])
        h = (1 - z) * h + z * hc
        o = h @ W['out/weight/weight'] + W['out/weight/bias']
        logp = jax.nn.log_softmax(o, axis=-1)
        losses.append(-jnp.mean(jnp.take_along_axis(logp, labels[t][:, None], axis=-1)))
        outs.append(o)
        hid.append(h)
    losses = jnp.stack(losses)
    return jnp.mean(losses), (losses, jnp.stack(outs), {'rnn/h': jnp.stack(hid)})


ALGOS = [
    # (suffix, algorithm, options, T, B)
    ('d_rtrl', 'D_RTRL', {}, 6, 3),
    ('pp_prop', 'pp_prop', {'decay_or_rank': 0.9}, 6, 3),
    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}, 6, 3),
    ('pp_prop_multistep', 'pp_prop', {'decay_or_rank': 0.8, 'vjp_method': 'multi-step'}, 6, 3),
    ('d_rtrl_b1', 'D_RTRL', {}, 5, 1),
    ('pp_prop_b1', 'pp_prop', {'decay_or_rank': 2}, 5, 1),
]


def make_cases(seed, gen, n_in=3, n_rec=5, n_out=4, w_scale=0.8):
    cases = []
    for suffix, algo_name, options, T, B in ALGOS:
        rng = np.random.default_rng([seed, zlib.crc32(f'ce__gru__{suffix}'.encode())])
        net = ge.GruNet(n_in, n_rec, n_out, {})
        W = {k: w_scale * rng.standard_normal(s) for k, s in ge.flat_keys(net).items()}
        xs = rng.standard_normal((T, B, n_in))
        labels = rng.integers(0, n_out, size=(T, B))
        spec = dict(model='gru', n_in=n_in, n_rec=n_rec, n_out=n_out, T=T, B=B, hp={})

        Wj = {k: jnp.asarray(v) for k, v in W.items()}
        f = lambda w: bptt_rollout(w, jnp.asarray(xs), jnp.asarray(labels), B, n_rec)  # noqa
        (_, (bl, bo, bh)), bg = jax.value_and_grad(f, has_aux=True)(Wj)
        bg = {k: np.asarray(v) for k, v in bg.items()}
        bl, bo, bh = np.asarray(bl), np.asarray(bo), {k: np.asarray(v) for k, v in bh.items()}

        r = ge.run_etrace(spec, algo_name, options, W, xs, labels, step_fn=ce_step)
        assert set(r['grads']) == set(W)
        assert np.allclose(r['losses'], bl, rtol=1e-12, atol=1e-14), (r['losses'], bl)
        opt_str = ''.join(f', {k}={v!r}' for k, v in options.items())
        case_id = f'e2e__gru_ce__{suffix}'
        case = {
            'schema_version': ge.SCHEMA_VERSION, 'kind': 'e2e', 'case_id': case_id,
            'model': 'gru', 'loss': LOSS,
            'dims': {'n_in': n_in, 'n_rec': n_rec, 'n_out': n_out, 'T': T, 'B': B},
            'hyperparams': {}, 'algorithm': algo_name, 'algorithm_options': dict(options),
            'vjp_method': options.get('vjp_method', 'single-step'),
            'compile_call': (f'braintrace.compile(model, braintrace.{algo_name}, '
                             f'jnp.zeros((B, n_in)), batch_size=B{opt_str})'),
            'etrace_grad_call': ETRACE_GRAD_CALL,
            'weights': ge.enc_tree(W), 'initial_hidden': ge.enc_tree(r['initial']),
            'xs': ge.enc(xs), 'ys': ge.enc(labels.astype(np.float64)),
            'etrace': {'grads': ge.enc_tree(r['grads']),
                       'grad_dtypes': {k: str(r['grads'][k].dtype) for k in sorted(r['grads'])},
                       'losses': ge.enc(r['losses'])},
            'bptt': {'objective': BPTT_OBJECTIVE, 'grads': ge.enc_tree(bg), 'losses': ge.enc(bl),
                     'outputs': ge.enc(bo), 'hidden': ge.enc_tree(bh)},
            'max_abs_diff_etrace_vs_bptt': {
                k: float(np.max(np.abs(r['grads'][k] - bg[k]))) for k in sorted(bg)},
            'graph': r['graph'], 'compile_warnings': r['compile_warnings'],
            'run_warnings': r['run_warnings'], 'spike_threshold_margin': None,
            'generator': gen,
        }
        cases.append((case_id, case))
        print(f"{case_id}: max|etrace-bptt| = "
              f"{max(case['max_abs_diff_etrace_vs_bptt'].values()):.3g}", file=sys.stderr)
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=34008)
    a = ap.parse_args(argv)
    gen = {'schema_version': ge.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'ce',
           'versions': ge.versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    files = []
    for case_id, case in make_cases(a.seed, gen):
        with open(os.path.join(a.out, case_id + '.json'), 'w') as fh:
            fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
        files.append(case_id + '.json')
    manifest = dict(gen, files=sorted(files))
    manifest['total_bytes'] = sum(os.path.getsize(os.path.join(a.out, f)) for f in files)
    with open(os.path.join(a.out, 'MANIFEST.json'), 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    return 0


if __name__ == '__main__':
    sys.exit(main())
