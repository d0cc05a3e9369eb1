"""Record end-to-end golden cases of braintrace 0.2.6's recurrent cells.

For each cell of ``braintrace.nn`` (ValinaRNNCell, MGUCell, MinimalRNNCell,
CFNCell, LSTMCell, URLSTMCell, MiniGRU, MiniLSTM, LRUCell) the model is the
cell ``rnn`` followed by a ``braintrace.nn.Linear`` readout ``out`` and a
per-step MSE loss. Every trainable leaf is overwritten with fixed float64
draws; the script records, in the e2e schema of ``generate_e2e.py``
(``shared/golden/README.md`` section 6):

* ``etrace``: ``braintrace.compile(...)`` + ``learner.etrace_grad(...)``,
* ``bptt``: ``jax.grad`` of the mean per-step loss through a plain pure-JAX
  unroll of the cell's equations written out below (no ETP primitive),
* ``graph``: the compiled hidden groups and relations, and every warning.

Cases per cell: batch 2 with D-RTRL and pp_prop, single- and multi-step,
and batch 1 with D-RTRL single-step and pp_prop multi-step (a separate draw
with its own generator). Draws: ``numpy.random.default_rng([seed,
crc32('zoo__<cell>__b<B>')])``, trainable leaves in sorted key order
(standard normal times ``w_scale``), then ``xs`` and ``ys`` (times 0.5).
Nothing reads the Rust code.

Run (from the repository root, braintrace 0.2.6's venv)::

    $PY scripts/golden_gen/generate_zoo_rnn.py --out tests/golden_zoo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The encoders, weight-key helpers and the etrace runner are generate_e2e's
# (importing it also switches on x64 and the CPU backend).
import generate_e2e as e2e  # noqa: E402
from generate_e2e import enc, enc_tree, flat_keys, set_weights  # noqa: E402

import brainstate  # noqa: E402
import braintrace  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

CELLS = {
    'vanilla': 'ValinaRNNCell', 'mgu': 'MGUCell', 'minimal': 'MinimalRNNCell',
    'cfn': 'CFNCell', 'lstm': 'LSTMCell', 'urlstm': 'URLSTMCell', 'minigru': 'MiniGRU',
    'minilstm': 'MiniLSTM', 'lru': 'LRUCell',
}
HIDDEN = {'lstm': ['rnn/c', 'rnn/h'], 'urlstm': ['rnn/c', 'rnn/h'],
          'lru': ['rnn/h_im', 'rnn/h_re']}


class ZooNet(brainstate.nn.Module):
    """A braintrace cell ``rnn`` and a Linear readout ``out``."""

    def __init__(self, cell, n_in, n_rec, n_out):
        super().__init__()
        if cell == 'lru':
            self.rnn = braintrace.nn.LRUCell(n_in, n_rec)
            self.out = braintrace.nn.Linear(n_in, n_out)
        else:
            self.rnn = getattr(braintrace.nn, CELLS[cell])(n_in, n_rec)
            self.out = braintrace.nn.Linear(n_rec, n_out)

    def update(self, x):
        return self.out(self.rnn(x))


# ----------------------------------------------------------------- pure-JAX equations

def cell_step(cell, W, h, x):
    """One step of the cell from its published equations; returns (hidden, cell output)."""
    sig, cat = jax.nn.sigmoid, lambda a, b: jnp.concatenate([a, b], -1)

    def lin(name, v, bias=True):
        y = v @ W[f'rnn/{name}/weight/weight']
        return y + W[f'rnn/{name}/weight/bias'] if bias else y

    if cell == 'lru':
        a = jnp.exp(-jnp.exp(W['rnn/nu_log']))
        th = jnp.exp(W['rnn/theta_log'])
        c = jnp.exp(W['rnn/gamma_log'])
        re = a * jnp.cos(th) * h['rnn/h_re'] - a * jnp.sin(th) * h['rnn/h_im'] \
            + c * lin('B_re', x, False)
        im = a * jnp.sin(th) * h['rnn/h_re'] + a * jnp.cos(th) * h['rnn/h_im'] \
            + c * lin('B_im', x, False)
        y = lin('C_re', re, False) - lin('C_im', im, False) + x * W['rnn/D']
        return {'rnn/h_re': re, 'rnn/h_im': im}, y
    if cell in ('lstm', 'urlstm'):
        hp, cp = h['rnn/h'], h['rnn/c']
        xh = cat(x, hp)
        if cell == 'lstm':
            cn = sig(lin('Wf', xh) + 1.0) * cp + sig(lin('Wi', xh)) * jnp.tanh(lin('Wg', xh))
            hn = sig(lin('Wo', xh)) * jnp.tanh(cn)
        else:
            b = W['rnn/bias']
            fg = sig(b + lin('Wf', xh, False))
            rg = sig(lin('Wr', xh, False) - b)
            g = 2 * rg * fg + (1 - 2 * rg) * fg ** 2
            cn = g * cp + (1 - g) * jnp.tanh(lin('Wu', xh, False))
            hn = sig(lin('Wo', xh, False)) * jnp.tanh(cn)
        return {'rnn/c': cn, 'rnn/h': hn}, hn
    hp = h['rnn/h']
    xh = cat(x, hp)
    if cell == 'vanilla':
        hn = jax.nn.relu(lin('W', xh))
    elif cell == 'mgu':
        f = sig(lin('Wf', xh))
        hn = (1 - f) * hp + f * jnp.tanh(lin('Wh', cat(x, f * hp)))
    elif cell == 'minimal':
        z = lin('phi', x)
        u = sig(lin('W_u', cat(z, hp)))
        hn = u * hp + (1 - u) * z
    elif cell == 'cfn':
        hn = sig(lin('Wf', xh)) * jnp.tanh(hp) + sig(lin('Wi', xh)) * jnp.tanh(lin('Wh', x))
    elif cell == 'minigru':
        z = sig(lin('W_z', xh))
        hn = (1 - z) * hp + z * lin('W_x', x)
    elif cell == 'minilstm':
        hn = sig(lin('W_f', xh)) * hp + sig(lin('W_i', xh)) * lin('W_x', x)
    else:
        raise ValueError(cell)
    return {'rnn/h': hn}, hn


def bptt_rollout(cell, W, xs, ys, B, n_rec):
    h = {k: jnp.zeros((B, n_rec)) for k in HIDDEN.get(cell, ['rnn/h'])}
    losses, outs, hid = [], [], {k: [] for k in h}
    for t in range(xs.shape[0]):
        h, y = cell_step(cell, W, h, xs[t])
        o = y @ W['out/weight/weight'] + W['out/weight/bias']
        losses.append(jnp.mean((o - ys[t]) ** 2))
        outs.append(o)
        for k in hid:
            hid[k].append(h[k])
    losses = jnp.stack(losses)
    return jnp.mean(losses), (losses, jnp.stack(outs), {k: jnp.stack(v) for k, v in hid.items()})


# ----------------------------------------------------------------- the cases

ALGOS_B2 = [
    ('d_rtrl', 'D_RTRL', {}),
    ('pp_prop', 'pp_prop', {'decay_or_rank': 0.9}),
    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
    ('pp_prop_multistep', 'pp_prop', {'decay_or_rank': 0.8, 'vjp_method': 'multi-step'}),
]
ALGOS_B1 = [
    ('d_rtrl_b1', 'D_RTRL', {}),
    ('pp_prop_multistep_b1', 'pp_prop', {'decay_or_rank': 4, 'vjp_method': 'multi-step'}),
]


def specs():
    dims = {
        'vanilla': (3, 4, 2), 'mgu': (3, 4, 2), 'minimal': (2, 4, 3), 'cfn': (3, 4, 2),
        'lstm': (2, 3, 2), 'urlstm': (2, 3, 2), 'minigru': (3, 4, 2), 'minilstm': (3, 4, 2),
        'lru': (3, 4, 2),
    }
    out = []
    for cell, (n_in, n_rec, n_out) in dims.items():
        base = dict(cell=cell, model=cell, n_in=n_in, n_rec=n_rec, n_out=n_out, w_scale=0.6,
                    x_scale=1.0)
        out.append(dict(base, T=5, B=2, algos=ALGOS_B2))
        out.append(dict(base, T=6, B=1, algos=ALGOS_B1))
    return out


def make_cases(spec, seed, gen):
    cell, B, T = spec['cell'], spec['B'], spec['T']
    rng = np.random.default_rng([seed, zlib.crc32(f'zoo__{cell}__b{B}'.encode())])
    net = ZooNet(cell, spec['n_in'], spec['n_rec'], spec['n_out'])
    W = {k: spec['w_scale'] * rng.standard_normal(s) for k, s in flat_keys(net).items()}
    xs = spec['x_scale'] * rng.standard_normal((T, B, spec['n_in']))
    ys = 0.5 * rng.standard_normal((T, B, spec['n_out']))

    Wj = {k: jnp.asarray(v) for k, v in W.items()}
    f = lambda w: bptt_rollout(cell, w, jnp.asarray(xs), jnp.asarray(ys), B,  # noqa: E731
                               spec['n_rec'])
    (_, (bl, bo, bh)), bg = jax.value_and_grad(f, has_aux=True)(Wj)
    bg = {k: np.asarray(v) for k, v in bg.items()}
    bl, bo, bh = np.asarray(bl), np.asarray(bo), {k: np.asarray(v) for k, v in bh.items()}

    # generate_e2e's runner builds its model from MODELS[spec['model']].
    e2e.MODELS[cell] = lambda n_in, n_rec, n_out, hp: ZooNet(cell, n_in, n_rec, n_out)
    cases = []
    for suffix, algo_name, options in spec['algos']:
        r = e2e.run_etrace(dict(spec, hp={}), algo_name, options, W, xs, ys)
        assert set(r['grads']) == set(W), (sorted(r['grads']), sorted(W))
        assert np.allclose(r['losses'], bl, rtol=1e-12, atol=1e-14), \
            f'{cell}: braintrace losses differ from the equations'
        opt_str = ''.join(f', {k}={v!r}' for k, v in options.items())
        case_id = f'e2e__zoo_{cell}__{suffix}'
        case = {
            'schema_version': e2e.SCHEMA_VERSION,
            'kind': 'e2e',
            'case_id': case_id,
            'model': f'zoo_{cell}',
            'dims': {k: spec[k] for k in ('n_in', 'n_rec', 'n_out', 'T', 'B')},
            'hyperparams': {},
            'algorithm': algo_name,
            'algorithm_options': dict(options),
            'vjp_method': options.get('vjp_method', 'single-step'),
            'compile_call': (f'braintrace.compile(model, braintrace.{algo_name}, '
                             f'jnp.zeros((B, n_in)), batch_size=B{opt_str})'),
            'etrace_grad_call': e2e.ETRACE_GRAD_CALL,
            'weights': enc_tree(W),
            'initial_hidden': enc_tree(r['initial']),
            'xs': enc(xs),
            'ys': enc(ys),
            'etrace': {'grads': enc_tree(r['grads']),
                       'grad_dtypes': {k: str(r['grads'][k].dtype) for k in sorted(r['grads'])},
                       'losses': enc(r['losses'])},
            'bptt': {'objective': e2e.BPTT_OBJECTIVE, 'grads': enc_tree(bg), 'losses': enc(bl),
                     'outputs': enc(bo), 'hidden': enc_tree(bh)},
            'max_abs_diff_etrace_vs_bptt': {
                k: float(np.max(np.abs(r['grads'][k] - bg[k]))) for k in sorted(bg)},
            'graph': r['graph'],
            'compile_warnings': r['compile_warnings'],
            'run_warnings': r['run_warnings'],
            'spike_threshold_margin': None,
            'generator': gen,
        }
        cases.append((case_id, case))
        print(f"{case_id}: max|etrace-bptt| = {max(case['max_abs_diff_etrace_vs_bptt'].values()):.3g}"
              f", {len(r['graph']['relations'])} relations, {len(r['compile_warnings'])} warnings",
              file=sys.stderr)
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=34001)
    ap.add_argument('--only', nargs='*', help='cells to generate (' + ' '.join(CELLS) + ')')
    a = ap.parse_args(argv)
    gen = {'schema_version': e2e.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'zoo_rnn',
           'versions': e2e.versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    written = []
    for spec in specs():
        if a.only and spec['cell'] not in a.only:
            continue
        for case_id, case in make_cases(spec, a.seed, gen):
            with open(os.path.join(a.out, case_id + '.json'), 'w') as fh:
                fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
            written.append(case_id + '.json')
    mpath = os.path.join(a.out, 'MANIFEST.json')
    files = set(written)
    if os.path.exists(mpath):
        with open(mpath) as fh:
            files |= set(json.load(fh).get('files', []))
    manifest = dict(gen, files=sorted(files))
    manifest['total_bytes'] = sum(os.path.getsize(os.path.join(a.out, f)) for f in files
                                  if os.path.exists(os.path.join(a.out, f)))
    with open(mpath, 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(written)} files written', file=sys.stderr)
    return 0


if __name__ == '__main__':
    with warnings.catch_warnings():
        sys.exit(main())
