"""Export a braintrace 0.2.6 model's parameters for braintrace-rs.

``export(net, path)`` writes every ``brainstate.ParamState`` of ``net`` to a
safetensors file (and, with ``npz=True``, a numpy ``.npz`` of the same
keys). A key is the state's path in the model, as
``brainstate.graph.treefy_states(net, brainstate.ParamState).to_flat()``
gives it (attribute names, ``Sequential`` indices), joined by ``/``; a state
whose value is a dict (``braintrace.nn.Linear``'s ``{'weight', 'bias'}``)
adds the leaf's name: ``rnn/Wz/weight/weight``, ``rnn/Wz/weight/bias``,
``readout/W``, ``layers/0/weight/weight``. Values are the arrays as
braintrace holds them (a ``brainunit`` quantity is written as its
mantissa), in the model's float type. The header's metadata names the
format, the versions and the model.

Run as a script, it builds the models the Rust test
``tests/braintrace_weights.rs`` rebuilds from ``braintrace::nn`` -- every
recurrent cell of ``braintrace.nn`` with a ``Linear`` readout, spiking
networks of ``brainpy.state`` neurons and synapses with a
``LeakyRateReadout``, a bare ``Linear`` and a ``Sequential`` of two -- with
the parameters braintrace's own initialisers draw (``brainstate.random``
seeded per model), and writes for each model ``<name>.safetensors`` (the
parameters) and ``<name>.run.safetensors`` (``xs``: a fixed input sequence
``(T, B, n_in)``; ``outputs``: the model's outputs on it, one call a step
from ``brainstate.nn.init_all_states``; ``hidden0/<path>``: the hidden
states it starts from), and ``MANIFEST.json`` (what to rebuild). float64
throughout (``jax_enable_x64``). Nothing here reads the Rust code.

Run (from the repository root)::

    $(scripts/ref_python.sh) scripts/export_braintrace_weights.py --out tests/braintrace_weights
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zlib

from importlib.metadata import version as pkg_version

import brainstate
import brainunit as u
import jax
import numpy as np
from safetensors.numpy import save_file

# The test models (``main``) come from the golden generators, imported there:
# importing them switches on x64 (brainstate precision 64), dt = 1 and the
# CPU backend, which ``export`` alone leaves as the caller set them.
ge = gz = gs = None

FORMAT = 'braintrace-params'
KEY_FORM = ("the ParamState's path in the model (treefy_states(...).to_flat()), joined by '/', "
            "then the leaf's name for a dict-valued state")


def _part(p):
    """One element of a pytree path as a key component."""
    for attr in ('key', 'idx', 'name'):
        if hasattr(p, attr):
            return str(getattr(p, attr))
    return str(p)


def flat_params(net):
    """``{key: numpy array}`` of every ParamState of ``net`` (keys as in the module doc)."""
    out = {}
    flat = brainstate.graph.treefy_states(net, brainstate.ParamState).to_flat()
    for path, st in flat.items():
        base = [str(p) for p in path]
        leaves = jax.tree_util.tree_leaves_with_path(
            st.value, is_leaf=lambda x: isinstance(x, u.Quantity))
        for lpath, leaf in leaves:
            key = '/'.join(base + [_part(p) for p in lpath])
            if key in out:
                raise ValueError(f'two parameters under the key {key!r}')
            out[key] = np.ascontiguousarray(np.asarray(u.get_mantissa(leaf)))
    return dict(sorted(out.items()))


def metadata(model=''):
    return {'format': FORMAT, 'key_form': KEY_FORM, 'model': model,
            'braintrace': pkg_version('braintrace'), 'brainstate': pkg_version('brainstate'),
            'jax': pkg_version('jax')}


def export(net, path, model='', npz=False):
    """Write ``net``'s parameters to ``path`` (safetensors), and ``.npz`` beside it."""
    params = flat_params(net)
    save_file(params, path, metadata=metadata(model))
    if npz:
        np.savez(os.path.splitext(path)[0] + '.npz', **params)
    return params


# ----------------------------------------------------------------- the models


class Bare(brainstate.nn.Module):
    """The model is a layer itself (its keys start at the layer's states)."""


def _import_generators():
    global ge, gz, gs
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden_gen'))
    import generate_e2e
    import generate_zoo_rnn
    import generate_zoo_snn
    ge, gz, gs = generate_e2e, generate_zoo_rnn, generate_zoo_snn


def build(spec):
    import braintrace

    kind = spec['kind']
    if kind == 'rnn':
        if spec['cell'] == 'gru':
            return ge.GruNet(spec['n_in'], spec['n_rec'], spec['n_out'], {})
        return gz.ZooNet(spec['cell'], spec['n_in'], spec['n_rec'], spec['n_out'])
    if kind == 'snn':
        return gs.SnnNet(spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    if kind == 'linear':
        return braintrace.nn.Linear(spec['n_in'], spec['n_out'])
    if kind == 'sequential':
        return brainstate.nn.Sequential(braintrace.nn.Linear(spec['n_in'], spec['n_rec']),
                                        braintrace.nn.Linear(spec['n_rec'], spec['n_out']))
    raise ValueError(kind)


def specs():
    out = []
    dims = {'gru': (3, 4, 2), 'vanilla': (3, 4, 2), 'mgu': (3, 4, 2), 'minimal': (2, 4, 3),
            'cfn': (3, 4, 2), 'lstm': (2, 3, 2), 'urlstm': (2, 3, 2), 'minigru': (3, 4, 2),
            'minilstm': (3, 4, 2), 'lru': (3, 4, 2)}
    for cell, (n_in, n_rec, n_out) in dims.items():
        out.append(dict(name=f'rnn_{cell}', kind='rnn', cell=cell, n_in=n_in, n_rec=n_rec,
                        n_out=n_out, T=7, B=2, x_scale=1.0, hp={}))
    for v in gs.variants():
        hp = dict(v['hp'])
        hp['readout_decay'] = math.exp(-gs.DT / hp['tau_out'])
        out.append(dict(name=v['model'], kind='snn', n_in=v['n_in'], n_rec=v['n_rec'],
                        n_out=v['n_out'], T=8, B=2, x_scale=2.5 * v['x_scale'], hp=hp))
    out.append(dict(name='linear', kind='linear', n_in=3, n_rec=0, n_out=4, T=3, B=2,
                    x_scale=1.0, hp={}))
    out.append(dict(name='sequential', kind='sequential', n_in=3, n_rec=5, n_out=2, T=3, B=2,
                    x_scale=1.0, hp={}))
    return out


def run(net, xs):
    """Outputs over ``xs`` (T, B, n_in) from freshly initialised hidden states."""
    brainstate.nn.init_all_states(net, batch_size=xs.shape[1])
    hidden0 = {ge.path_str(p): np.asarray(st.value)
               for p, st in net.states(brainstate.HiddenState).items()}
    outs = [np.asarray(net(jax.numpy.asarray(xs[t]))) for t in range(xs.shape[0])]
    return np.stack(outs), hidden0


def spike_margin(spec, params, xs):
    """The smallest |scaled membrane potential| over the run (the equations
    of generate_zoo_snn): near 0 a rounding difference flips a spike."""
    ys = np.zeros((xs.shape[0], xs.shape[1], spec['n_out']))
    hp = {k: v for k, v in spec['hp'].items() if k != 'readout_decay'}
    _, _, outs, _, margin = gs.run_bptt(dict(spec, hp=hp), params, xs, ys, xs.shape[1])
    return margin, outs


def make(spec, seed, out_dir, npz, min_margin):
    for attempt in range(200):
        key = zlib.crc32(f"weights__{spec['name']}".encode()) + 1000 * attempt
        brainstate.random.seed(seed + key)
        net = build(spec)
        rng = np.random.default_rng([seed, key])
        xs = spec['x_scale'] * rng.standard_normal((spec['T'], spec['B'], spec['n_in']))
        params = flat_params(net)
        outputs, hidden0 = run(net, xs)
        extra = {}
        if spec['kind'] == 'snn':
            margin, eq_outs = spike_margin(spec, params, xs)
            # A draw without a spike would test the readout of zeros only.
            if margin < min_margin or not np.any(outputs):
                continue
            assert np.allclose(eq_outs, outputs, rtol=1e-12, atol=1e-13), spec['name']
            extra['spike_threshold_margin'] = margin
            extra['nonzero_outputs'] = int(np.count_nonzero(outputs))
        break
    else:
        raise RuntimeError(f"{spec['name']}: no draw with a safe threshold margin")
    assert all(v.dtype == np.float64 for v in params.values()), spec['name']
    export(net, os.path.join(out_dir, spec['name'] + '.safetensors'), spec['name'], npz)
    run_t = {'xs': xs, 'outputs': outputs}
    run_t.update({f'hidden0/{k}': v for k, v in hidden0.items()})
    save_file({k: np.ascontiguousarray(v, dtype=np.float64) for k, v in run_t.items()},
              os.path.join(out_dir, spec['name'] + '.run.safetensors'),
              metadata=metadata(spec['name']))
    entry = {k: spec[k] for k in ('name', 'kind', 'n_in', 'n_rec', 'n_out', 'T', 'B', 'hp')}
    if 'cell' in spec:
        entry['cell'] = spec['cell']
    entry['params'] = {k: list(v.shape) for k, v in params.items()}
    entry['hidden'] = sorted(hidden0)
    entry.update(extra)
    print(f"{spec['name']}: {len(params)} parameters, outputs {outputs.shape}"
          + (f", margin {extra['spike_threshold_margin']:.3g}, {extra['nonzero_outputs']} nonzero outputs"
             if extra else ''), file=sys.stderr)
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=34006)
    ap.add_argument('--npz', action='store_true', help='also write <name>.npz')
    ap.add_argument('--min-margin', type=float, default=5e-3)
    a = ap.parse_args(argv)
    _import_generators()
    assert jax.numpy.ones(1).dtype == np.float64, 'x64 is not enabled'
    os.makedirs(a.out, exist_ok=True)
    models = [make(s, a.seed, a.out, a.npz, a.min_margin) for s in specs()]
    manifest = dict(metadata(), seed=a.seed, versions=ge.versions(),
                    float='float64 (jax_enable_x64)', models=models)
    with open(os.path.join(a.out, 'MANIFEST.json'), 'w') as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
