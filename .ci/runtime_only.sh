#!/usr/bin/env bash
# The package as a user installs it: the wheel built from this checkout, in a new venv
# holding only the pinned CPU PyTorch and ledgerlm's runtime dependencies (no dev
# extras to hide a missing one). Every command a user meets first must work there, and
# every command that needs an extra must say so in one line, without a traceback.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT

"$PYTHON" -m venv "$ROOT/venv"
BIN="$ROOT/venv/bin"
"$BIN/pip" install --quiet "$TORCH"
"$BIN/pip" wheel --quiet --no-deps --wheel-dir "$ROOT/dist" .
"$BIN/pip" install --quiet "$ROOT"/dist/ledgerlm-*.whl
"$BIN/pip" check

# Run away from the checkout, so nothing is imported or read from the source tree.
cd "$ROOT"
export LEDGERLM_WORKSPACE="$ROOT/work" LEDGERLM_PROGRESS_SECONDS=0
RECIPE=$("$BIN/python" -c "from ledgerlm.cli.recipes import shipped_recipe; print(shipped_recipe('tiny'))")
case "$RECIPE" in "$ROOT"/venv/*) ;; *) echo "FAIL: tiny recipe read from $RECIPE, not the wheel"; exit 1 ;; esac

step() { echo "== $*"; "$@"; }
step "$BIN/ledgerlm" --help >/dev/null
step "$BIN/ledgerlm" --version
step "$BIN/ledgerlm" run "$RECIPE"
step "$BIN/ledgerlm" ledger show latest >/dev/null
step "$BIN/ledgerlm" lessons
step "$BIN/ledgerlm" report latest -o "$ROOT/report.html"
test -s "$ROOT/report.html"
# scoring a run after the fact in process needs no extra
printf '{"context": "def f(x):", "choices": [" return x", " import"], "gold": 0}\n' >"$ROOT/choice.jsonl"
printf '[[tasks]]\nname = "choice"\npath = "%s"\nkind = "choice"\n' "$ROOT/choice.jsonl" >"$ROOT/tasks.toml"
step "$BIN/ledgerlm" eval latest --tasks "$ROOT/tasks.toml" >/dev/null

runs() {
    "$BIN/python" -c 'import sqlite3, sys
print(sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM runs").fetchone()[0])' \
        "$LEDGERLM_WORKSPACE/ledger.db"
}

# expect_extra EXTRA COMMAND...: exit 2, one line on stderr naming `ledgerlm[EXTRA]`,
# no traceback anywhere, and nothing new in the workspace's ledger.
expect_extra() {
    local extra=$1
    shift
    echo "== (needs ledgerlm[$extra]) $*"
    local runs_before rc=0
    runs_before=$(runs)
    "$@" >"$ROOT/out" 2>"$ROOT/err" || rc=$?
    cat "$ROOT/err"
    if [ "$rc" != 2 ]; then echo "FAIL: exit code $rc, not 2"; cat "$ROOT/out"; exit 1; fi
    if grep -q Traceback "$ROOT/out" "$ROOT/err"; then echo "FAIL: a traceback"; exit 1; fi
    if [ "$(wc -l <"$ROOT/err")" != 1 ]; then echo "FAIL: not one line"; exit 1; fi
    if ! grep -qF "ledgerlm[$extra]" "$ROOT/err"; then echo "FAIL: extra not named"; exit 1; fi
    if [ "$(runs)" != "$runs_before" ]; then
        echo "FAIL: a run was created"
        exit 1
    fi
}
expect_extra hf "$BIN/ledgerlm" export hf latest "$ROOT/hf"
test ! -e "$ROOT/hf"
expect_extra mllog "$BIN/ledgerlm" ledger export-mllog latest -o "$ROOT/mllog.txt"
test ! -e "$ROOT/mllog.txt"
expect_extra ray "$BIN/ledgerlm" data prepare "$RECIPE" --executor ray
expect_extra ray "$BIN/ledgerlm" run "$RECIPE" --set 'data.executor="ray"'
for sink in tensorboard mlflow wandb; do
    expect_extra "$sink" "$BIN/ledgerlm" run "$RECIPE" --set "log.sinks=[\"$sink\"]"
done
expect_extra tensorboard "$BIN/ledgerlm" ledger export latest --to tensorboard "$ROOT/tb"
test ! -e "$ROOT/tb"
evaluations() {
    "$BIN/python" -c 'import sqlite3, sys
print(sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM evaluations").fetchone()[0])' \
        "$LEDGERLM_WORKSPACE/ledger.db"
}
evaluations_before=$(evaluations)
expect_extra lmeval "$BIN/ledgerlm" eval latest --harness
if [ "$(evaluations)" != "$evaluations_before" ]; then echo "FAIL: an evaluation was written"; exit 1; fi
expect_extra tune "$BIN/ledgerlm" tune "$RECIPE" --param 'train.lr=log:1e-4:3e-2' --trials 2
test ! -e "$LEDGERLM_WORKSPACE/tune"
echo "runtime-only install: every check passed"
