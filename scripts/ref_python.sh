#!/usr/bin/env bash
# Print the reference venv's python (braintrace 0.2.6): $BRAINTRACE_REF_PY
# when set, else `.venv-ref/bin/python` at the repository root (made by
# scripts/ref_venv.sh); fail with a hint when there is neither.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${BRAINTRACE_REF_PY:-}" ]]; then
    echo "${BRAINTRACE_REF_PY}"
elif [[ -x "${root}/.venv-ref/bin/python" ]]; then
    echo "${root}/.venv-ref/bin/python"
else
    echo "no reference venv: run scripts/ref_venv.sh, or set BRAINTRACE_REF_PY to a python with braintrace 0.2.6" >&2
    exit 1
fi
