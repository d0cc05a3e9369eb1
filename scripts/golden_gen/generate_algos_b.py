"""Record end-to-end golden cases of braintrace 0.2.6's SnAp (issue 35, algos-b).

Writes ``snap__<model>__<variant>.json`` into ``--out`` (default
``tests/golden_algos``) in the e2e schema of ``generate_e2e.py``
(``algorithm: "SnAp"``, ``algorithm_options: {"n": 1 | 2, ...}``): the
model's weights, inputs and targets, braintrace's online gradients and
losses from ``braintrace.compile(model, braintrace.SnAp, ..., n=n)`` +
``learner.etrace_grad``, a pure-JAX BPTT reference, the compiled graph and
the compile warnings. Nothing here reads the Rust code.

Models: the GRU and the LIF network of ``generate_e2e.py`` (its variant
set A dims and hyperparameters, seed ``--seed``) and two cells of the
zoo (``generate_zoo_rnn.py``: the LSTM, two states per group, and the
vanilla RNN). Draws follow those scripts (one generator per model).

Run (from the repository root)::

    $(scripts/ref_python.sh) scripts/golden_gen/generate_algos_b.py --out tests/golden_algos
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as e2e  # noqa: E402  (switches on x64 and the CPU backend)
import generate_zoo_rnn as zoo  # noqa: E402
import zlib  # noqa: E402

import brainstate  # noqa: E402
import braintrace  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from generate_e2e import enc  # noqa: E402

SNAP = [
    ('n1', 'SnAp', {'n': 1}),
    ('n2', 'SnAp', {'n': 2}),
    ('n1_multistep', 'SnAp', {'n': 1, 'vjp_method': 'multi-step'}),
    ('n2_multistep', 'SnAp', {'n': 2, 'vjp_method': 'multi-step'}),
]


class TableUORO(braintrace.UORO):
    """braintrace's UORO with its projection draws read from a table (its
    documented test seam ``_draw_projection``): ``TABLES[g][step]``."""

    TABLES = None

    def _draw_projection(self, key, step, group_index, shape, dtype):
        return jnp.asarray(TableUORO.TABLES[group_index])[step].astype(dtype)


braintrace.UORO_TABLE = TableUORO


class TableRandomProjection(braintrace.RandomProjectionVjpAlgorithm):
    """``RandomProjectionVjpAlgorithm`` with the same table-driven draws."""

    def _draw_projection(self, key, step, group_index, shape, dtype):
        return jnp.asarray(TableUORO.TABLES[group_index])[step].astype(dtype)


braintrace.RANDOM_PROJECTION_TABLE = TableRandomProjection


def uoro_cases(spec, suffix, options, seed, gen, cases_of, name='UORO'):
    """UORO on ``spec`` with Rademacher draws from a table exported in the case."""
    net = e2e.MODELS[spec['model']](spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    brainstate.nn.init_all_states(net, batch_size=spec['B'])
    learner = braintrace.compile(net, braintrace.UORO, jnp.zeros((spec['B'], spec['n_in'])),
                                 batch_size=spec['B'])
    shapes = [(*g.varshape, g.num_state) for g in learner.graph.hidden_groups]
    rng = np.random.default_rng([seed, zlib.crc32(f"uoro__{spec['model']}__{suffix}".encode())])
    tables = [np.where(rng.random((spec['T'], *sh)) < 0.5, 1.0, -1.0) for sh in shapes]
    TableUORO.TABLES = tables
    out = []
    table = 'RANDOM_PROJECTION_TABLE' if name != 'UORO' else 'UORO_TABLE'
    for case_id, case in cases_of([(suffix, table, options)]):
        case['algorithm'] = name
        case['compile_call'] = case['compile_call'].replace(table, name) + \
            '  # with _draw_projection reading projection_draws[step][group]'
        case['projection_draws'] = [[enc(t[i]) for t in tables] for i in range(spec['T'])]
        out.append((case_id, case))
    return out


UORO = [
    ('multistep', {'vjp_method': 'multi-step'}),
    ('singlestep', {'vjp_method': 'single-step'}),
]


def rename(cases, prefix):
    """``e2e__<model>__<suffix>`` -> ``<prefix>__<model>__<suffix>``."""
    out = []
    for case_id, case in cases:
        new = prefix + case_id[len('e2e'):]
        case['case_id'] = new
        out.append((new, case))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', default='tests/golden_algos')
    ap.add_argument('--seed', type=int, default=35002)
    ap.add_argument('--only', nargs='*', default=['snap', 'uoro', 'random_projection'],
                    help='snap uoro random_projection')
    a = ap.parse_args(argv)
    gen = {'schema_version': e2e.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'algos_b',
           'versions': e2e.versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    models, _ = e2e.variants_a()
    written = []
    for spec in models:
        if spec['model'] not in ('gru', 'lif'):
            continue
        if 'snap' in a.only:
            cases = e2e.make_model_cases(spec, SNAP, a.seed, gen, 5e-3)
            written += rename(cases, 'snap')
        if 'uoro' in a.only:
            for suffix, options in UORO:
                cases = uoro_cases(spec, suffix, options, a.seed, gen,
                                   lambda al: e2e.make_model_cases(spec, al, a.seed, gen, 5e-3))
                written += rename(cases, 'uoro')
        if 'random_projection' in a.only and spec['model'] == 'gru':
            cases = uoro_cases(spec, 'multistep', {'vjp_method': 'multi-step'}, a.seed, gen,
                               lambda al: e2e.make_model_cases(spec, al, a.seed, gen, 5e-3),
                               name='RandomProjectionVjpAlgorithm')
            written += rename(cases, 'random_projection')
    for cell in ('lstm', 'vanilla') if 'snap' in a.only else ():
        spec = [s for s in zoo.specs() if s['cell'] == cell and s['B'] == 2][0]
        spec = dict(spec, algos=SNAP[:2] + SNAP[3:])
        written += rename(zoo.make_cases(spec, a.seed, gen), 'snap')
    names = []
    for case_id, case in written:
        with open(os.path.join(a.out, case_id + '.json'), 'w') as fh:
            fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
        names.append(case_id + '.json')
    mpath = os.path.join(a.out, 'MANIFEST.json')
    files = set(names)
    if os.path.exists(mpath):
        with open(mpath) as fh:
            files |= set(json.load(fh).get('files', []))
    manifest = dict(gen, files=sorted(files))
    with open(mpath, 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(names)} files written', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
