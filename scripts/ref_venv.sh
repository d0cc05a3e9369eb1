#!/usr/bin/env bash
# Create the reference venv: braintrace 0.2.6 and the JAX stack it was
# compared against, in `.venv-ref/` at the repository root (ignored by git).
# The benchmark and golden-vector scripts find it there; to use a venv
# elsewhere, set BRAINTRACE_REF_PY to its python instead.
#
#   scripts/ref_venv.sh            (PYTHON=python3.11 to choose the interpreter)
#
# Needs Python 3.10+ and network access to PyPI (about 1 GB installed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv-ref
if [[ ! -x "${VENV}/bin/python" ]]; then
    "${PYTHON}" -m venv "${VENV}"
fi
"${VENV}/bin/pip" install --upgrade pip
"${VENV}/bin/pip" install \
    braintrace==0.2.6 brainstate==0.5.4 brainevent==0.2.1 brainunit==0.5.2 \
    jax==0.10.2 jaxlib==0.10.2 numpy safetensors
"${VENV}/bin/python" -c "import braintrace; print('braintrace', braintrace.__version__, 'in', '${VENV}')"
