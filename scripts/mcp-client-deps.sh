#!/usr/bin/env bash
# Installs the independent MCP client of the integration tests (the
# TypeScript SDK, tests/mcp-client) exactly as package-lock.json pins it,
# with npm ci. Idempotent: it reinstalls only when the lock file changed
# (a stamp in node_modules holds the lock's digest). Needs Debian's nodejs
# and npm (scripts/deps.sh) and the npm registry, once.
set -euo pipefail
dir="$(cd "$(dirname "$0")/../tests/mcp-client" && pwd)"
if ! command -v npm >/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "vmfork deps: installing npm" >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >&2
fi
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
stamp="$dir/node_modules/.vmfork-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "vmfork deps: npm ci in tests/mcp-client" >&2
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
echo "$want" >"$stamp"
