#!/usr/bin/env bash
# Shrink .devsite/ (built by ../shared/device/make-site.sh) so that it and the tracked files fit the device's
# 64 MiB working-tree limit. What goes is not used there: SQLAlchemy's optional Cython speed-ups (it runs as pure
# Python without them), greenlet's C sources and tests, SQLAlchemy's test suite. Run from the project root.
set -euo pipefail
site=.devsite
[ -d "$site" ] || { echo "no $site/: run bash ../shared/device/make-site.sh first" >&2; exit 1; }
find "$site/sqlalchemy" -name '*_cy.cpython-*.so' -delete
find "$site/greenlet" \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) -delete
rm -rf "$site/greenlet/tests" "$site/sqlalchemy/testing/suite"
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
site_bytes=$(du -sb "$site" | cut -f1)
total=$(( tracked + site_bytes ))
printf '%s: %.1f MiB; tracked files %.1f MiB; together %.1f MiB of 64\n' "$site" \
  "$(echo "$site_bytes/1048576" | bc -l)" "$(echo "$tracked/1048576" | bc -l)" "$(echo "$total/1048576" | bc -l)"
[ "$total" -le $(( 64 * 1048576 )) ] || { echo "still over 64 MiB" >&2; exit 1; }
