#!/usr/bin/env bash
# The nightly regression job: first the machine check (ci/machine_check.py: bnb's dequantize against
# the runtime's, bit for bit, and a torch matmul twice; a faulty GPU would otherwise be reported as
# broken kernels), then `nf4-tune regress` on the visible GPU against the tuning database, then the
# HTML report, and regress's exit code passed on (0 clean, 1 a confirmed regression or a broken
# kernel, 2 cannot run: also a machine that fails its check, with nothing judged or written).
# A report that cannot be written fails a clean night (exit 1).
#
# Usage: ci/nightly.sh [DB] [REPORT_DIR]
#   DB          database URL or SQLite path (default: $NF4TUNE_DB, else ./nf4tune.db)
#   REPORT_DIR  where index.html + plotly.min.js go (default: $NF4TUNE_REPORT_DIR, else ./nightly-report)
#
#        ci/nightly.sh --keep DB [MESSAGE]
#   Keep the SQLite file DB as nf4tune.db on the data branch: `nf4-tune db recover DB` first (a
#   stopped writer's transaction rolled back, the write-ahead log folded in, so the one file holds
#   every committed row; exit 1 without keeping anything when its integrity check fails), then one
#   commit on top of the branch's tip (a first commit when the branch does not exist yet: the
#   seed), pushed. It touches neither the work tree, the index nor the branch checked out, so it
#   runs from any folder of the repository, with DB anywhere (./nf4tune.db included).
#   NF4TUNE_DATA_BRANCH (default nightly-data), NF4TUNE_DATA_REMOTE (default origin).
# Environment:
#   NF4TUNE_CMD          how to call the CLI (default: nf4-tune; e.g. "python3 -m nf4tune.cli")
#   NF4TUNE_SKIP_REPORT  1: do not build the report here (a GPU machine without plotly: build it
#                        elsewhere from the database with `nf4-tune report`)
#   NF4TUNE_PYTHON       the Python that runs the machine check (default: python3)
set -uo pipefail
DB=${1:-${NF4TUNE_DB:-nf4tune.db}}
REPORT=${2:-${NF4TUNE_REPORT_DIR:-nightly-report}}
read -r -a NF4 <<< "${NF4TUNE_CMD:-nf4-tune}"

if [ "${1:-}" = "--keep" ]; then
  DB=${2:?usage: ci/nightly.sh --keep DB [MESSAGE]}
  MSG=${3:-"nightly $(date -u +%F)"}
  BRANCH=${NF4TUNE_DATA_BRANCH:-nightly-data}
  REMOTE=${NF4TUNE_DATA_REMOTE:-origin}
  if [ ! -f "$DB" ]; then
    echo "nightly: no database file at $DB (--keep keeps a SQLite file)" >&2
    exit 2
  fi
  if ! out=$("${NF4[@]}" db recover "$DB" 2>&1); then
    rc=$?
    echo "$out" >&2
    echo "nightly: $DB was not kept" >&2
    exit $rc
  fi
  set -e
  blob=$(git hash-object -w --no-filters -- "$DB")
  tree=$(printf '100644 blob %s\tnf4tune.db\n' "$blob" | git mktree)
  parent=()
  depth=()        # a shallow clone (CI's checkout) fetches the tip only, not every night's database
  [ "$(git rev-parse --is-shallow-repository)" = true ] && depth=(--depth=1)
  if git fetch -q "${depth[@]}" "$REMOTE" "refs/heads/$BRANCH" 2>/dev/null; then
    parent=(-p FETCH_HEAD)
  fi
  commit=$(git commit-tree "${parent[@]}" -m "$MSG" "$tree")
  git push -q "$REMOTE" "$commit:refs/heads/$BRANCH"
  echo "nightly: kept $DB as nf4tune.db on $REMOTE $BRANCH (commit ${commit:0:12})"
  exit 0
fi

echo "nightly: $(date -u +%FT%TZ) machine check"
if ! check=$("${NF4TUNE_PYTHON:-python3}" "$(dirname "$0")/machine_check.py" 2>&1); then
  echo "$check" | tail -8
  echo "nightly: this GPU machine failed its check (ci/machine_check.py): nothing judged, nothing written (exit 2)"
  exit 2
fi
echo "nightly: $(date -u +%FT%TZ) regress against $DB"
"${NF4[@]}" regress --db "$DB"
rc=$?
case $rc in
  0) echo "nightly: clean" ;;
  1) echo "nightly: a confirmed regression or a broken kernel (exit 1)" ;;
  2) echo "nightly: regress could not run (exit 2)" ;;
  *) echo "nightly: regress failed unexpectedly (exit $rc)" ;;
esac

if [ "${NF4TUNE_SKIP_REPORT:-0}" != 1 ]; then
  if ! "${NF4[@]}" report --db "$DB" -o "$REPORT"; then
    echo "nightly: the report could not be written" >&2
    [ $rc -eq 0 ] && rc=1
  fi
fi
exit $rc
