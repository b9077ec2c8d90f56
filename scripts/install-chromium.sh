#!/usr/bin/env bash
# Makes sure a headless Chromium is on this machine for tests/docs/test_docs_site.py, which opens
# the built documentation site in it: Debian's `chromium` package, installed when this runs
# as root with apt-get (as CI does) and no chromium is on the PATH. Elsewhere the browser
# check is skipped with the reason (and fails under CI=true).
#
#   bash scripts/install-chromium.sh
set -uo pipefail

have_chromium() {
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null
}

if ! have_chromium; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "chromium: installing Debian's chromium package"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
      >/tmp/idempotency-install-chromium.log 2>&1 \
      || echo "chromium: apt-get install failed (see /tmp/idempotency-install-chromium.log)"
  else
    echo "chromium: missing and cannot be installed here (not root, or no apt-get); the browser check will be skipped"
  fi
fi
have_chromium && echo "chromium: available" || echo "chromium: UNAVAILABLE"
exit 0
