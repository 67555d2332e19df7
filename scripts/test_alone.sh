#!/usr/bin/env bash
# The repository alone, as a user who cloned it has it: tracked and new (not ignored) files copied to
# a temporary folder with nothing beside it (no ../shared, no RLAX_SHARED_DIR), then the default test
# lane and the quickstart run there. The copy builds its own .venv (uv's cache makes that quick);
# Prism and the GCS emulator are reused from their caches under $HOME.
# Kept on failure (its path is printed) so that logs can be read; removed when both pass.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/rlax-alone.XXXXXX")
copy="$work/rlax"
mkdir -p "$copy"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$copy"
echo "test_alone: the repository copied to $copy ($(du -sh "$copy" | cut -f1)); nothing beside it: $(ls -A "$work")"
unset RLAX_SHARED_DIR
cd "$copy"
make test
make quickstart OUTPUT=runs/quickstart
test -s runs/quickstart/report.json
echo "test_alone: make test and make quickstart passed in $copy"
rm -rf "$work"
