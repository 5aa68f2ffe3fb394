#!/usr/bin/env bash
# Build the documentation site strictly, then load its home page and one guide page in headless
# Chromium and check that the navigation and the search box rendered. Screenshots of both are
# left in the output folder to look at.
#
#   scripts/docs-browser-check.sh [OUT]     (OUT: a new folder; default: a private temporary one)
#
# Needs the docs extra in .venv (./dev sets it up) and Chromium (Debian: apt-get install chromium).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
BROWSER=$(command -v chromium || command -v chromium-browser || true)
[ -n "$BROWSER" ] || { echo "no chromium found: apt-get install chromium" >&2; exit 2; }

NO_MKDOCS_2_WARNING=1 PYTHONPATH=$PWD "$PY" -m mkdocs build --strict -q -d "$OUT/site"

# Served on loopback, as `mkdocs serve` does: the theme's search needs http://, not file://.
"$PY" -u -m http.server 0 --bind 127.0.0.1 --directory "$OUT/site" > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.* port \([0-9]*\) .*/\1/p' "$OUT/server.log" | head -1)
    [ -n "$port" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
[ -n "$port" ] || { echo "the local web server did not start: $(cat "$OUT/server.log")" >&2; exit 1; }

# A profile of its own, so no other Chromium's state is read or written.
profile=$(mktemp -d "$OUT/profile.XXXXXX")
chrome() {
    timeout 60 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run \
        --user-data-dir="$profile" --virtual-time-budget=5000 "$@" 2>/dev/null
}

failed=0
for page in index.html guide/runs.html; do
    name=${page//\//-}
    chrome --dump-dom "http://127.0.0.1:$port/$page" > "$OUT/${name%.html}.dom.html"
    chrome --window-size=1280,900 --screenshot="$OUT/${name%.html}.png" "http://127.0.0.1:$port/$page" >/dev/null
    dom="$OUT/${name%.html}.dom.html"
    for what in 'class="md-nav md-nav--primary"' 'class="md-search__input"' 'class="md-content"'; do
        if grep -q "$what" "$dom"; then
            echo "ok      $page: $what"
        else
            echo "MISSING $page: $what"; failed=1
        fi
    done
    echo "        screenshot: $OUT/${name%.html}.png"
done
exit $failed
