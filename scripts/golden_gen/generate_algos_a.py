"""Record end-to-end golden cases of braintrace 0.2.6's EProp, OSTLRecurrent,
OSTLFeedforward and ThreeFactor.

Models: the GRU and the LIF net of ``generate_e2e.py`` (its reference set A
dims, hyperparameters and draws) and the MGU and LSTM cells of
``generate_zoo_rnn.py`` (batch 2, its draws), each with a Linear readout
and a per-step MSE loss. Cases per model (``<algorithm>__<model>__<variant>``):

* ``eprop``: ``kappa_filter_decay=0.6``; random feedback (braintrace draws
  its matrices from ``random_feedback_key=jax.random.PRNGKey(5)``; they are
  exported in the case's ``feedback_matrices``, by hidden-group index, so
  the Rust side can be given the same draws); random feedback with
  ``kappa_filter_decay=0.3``; ``kappa_filter_decay=0.5`` multi-step;
* ``ostl_recurrent``: single- and multi-step;
* ``ostl_feedforward``: its default decay (1e-6) and ``decay_or_rank=0.5``
  multi-step;
* ``three_factor``: a standing ``modulator=0.5``.

Every case is in the e2e schema (``shared/golden/README.md`` section 6) and
is produced by ``braintrace.compile`` + ``learner.etrace_grad`` through
``generate_e2e.run_etrace``; nothing reads the Rust code.

Run (from the repository root, braintrace 0.2.6's venv)::

    $PY scripts/golden_gen/generate_algos_a.py --out tests/golden_algos
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as e2e  # noqa: E402  (switches on x64 and the CPU backend)
import generate_zoo_rnn as zoo  # noqa: E402
from generate_e2e import enc  # noqa: E402

import braintrace  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

FEEDBACK_SEED = 5

# (file prefix, case suffix, braintrace class, options)
ALGOS = [
    ('eprop', 'kappa', 'EProp', {'kappa_filter_decay': 0.6}),
    ('eprop', 'random', 'EProp', {'feedback': 'random'}),
    ('eprop', 'random_kappa', 'EProp', {'feedback': 'random', 'kappa_filter_decay': 0.3}),
    ('eprop', 'kappa_multistep', 'EProp', {'kappa_filter_decay': 0.5,
                                           'vjp_method': 'multi-step'}),
    ('ostl_recurrent', 'single', 'OSTLRecurrent', {}),
    ('ostl_recurrent', 'multistep', 'OSTLRecurrent', {'vjp_method': 'multi-step'}),
    ('ostl_feedforward', 'default', 'OSTLFeedforward', {}),
    ('ostl_feedforward', 'decay_multistep', 'OSTLFeedforward',
     {'decay_or_rank': 0.5, 'vjp_method': 'multi-step'}),
    ('three_factor', 'modulator', 'ThreeFactor', {'modulator': 0.5}),
]

# Every learner braintrace.compile returns, in call order (one per case).
LEARNERS = []
_compile = braintrace.compile


def _recording_compile(*args, **kwargs):
    learner = _compile(*args, **kwargs)
    LEARNERS.append(learner)
    return learner


braintrace.compile = _recording_compile


def with_keys(options):
    """The options braintrace is called with (random feedback needs its key)."""
    o = dict(options)
    if o.get('feedback') == 'random':
        o['random_feedback_key'] = jax.random.PRNGKey(FEEDBACK_SEED)
    return o


def finish(case, prefix, suffix, options, learner):
    """Rename the case after its algorithm; export braintrace's feedback draws."""
    model = case['model']
    case['case_id'] = f'{prefix}__{model}__{suffix}'
    case['algorithm_options'] = dict(options)
    if options.get('feedback') == 'random':
        case['algorithm_options']['random_feedback_seed'] = FEEDBACK_SEED
        case['feedback_matrices'] = {
            str(g): enc(np.asarray(fb.B)) for g, fb in sorted(learner._random_feedback.items())}
    return case


def cases_of(run):
    """Run ``run(algos)`` (a list of (suffix, class, options)); name the cases."""
    out = []
    for prefix, suffix, name, options in ALGOS:
        start = len(LEARNERS)
        cases = run([(suffix, name, with_keys(options))])
        assert len(cases) == 1 and len(LEARNERS) == start + 1
        case = finish(cases[0][1], prefix, suffix, options, LEARNERS[-1])
        out.append(case)
        d = case['max_abs_diff_etrace_vs_bptt']
        print(f"{case['case_id']}: max|etrace-bptt| = {max(d.values()):.3g}", file=sys.stderr)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=35001)
    a = ap.parse_args(argv)
    gen = {'schema_version': e2e.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'algos_a',
           'versions': e2e.versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    specs, _ = e2e.variants_a()
    specs = {s['model']: s for s in specs}
    all_cases = []
    for model in ('gru', 'lif'):
        spec = specs[model]
        all_cases += cases_of(lambda algos: e2e.make_model_cases(spec, algos, a.seed, gen, 0.05))
    for spec in zoo.specs():
        if spec['cell'] in ('mgu', 'lstm') and spec['B'] == 2:
            all_cases += cases_of(lambda algos: zoo.make_cases(dict(spec, algos=algos), a.seed, gen))
    os.makedirs(a.out, exist_ok=True)
    written = []
    for case in all_cases:
        name = case['case_id'] + '.json'
        with open(os.path.join(a.out, name), 'w') as fh:
            fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
        written.append(name)
    manifest = dict(gen, files=sorted(written))
    manifest['total_bytes'] = sum(os.path.getsize(os.path.join(a.out, f)) for f in written)
    with open(os.path.join(a.out, 'MANIFEST_algos_a.json'), 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(written)} files written', file=sys.stderr)
    return 0


if __name__ == '__main__':
    with warnings.catch_warnings():
        sys.exit(main())
