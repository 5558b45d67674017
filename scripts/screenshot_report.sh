#!/usr/bin/env bash
# Render a kvbound report page in headless Chromium and save a PNG, to judge it by eye.
#   scripts/screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# Needs Debian's chromium (apt-get install -y chromium). The page must need no network:
# networking features are off, so a page that fetched anything would render broken.
set -euo pipefail
html=${1:?usage: screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]}
png=${2:?usage: screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]}
size=${3:-1400x3000}
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$browser" ]; then
  echo "screenshot_report.sh: no chromium on PATH (Debian: apt-get install -y chromium; or set CHROMIUM=)" >&2
  exit 2
fi
[ -f "$html" ] || { echo "screenshot_report.sh: $html: no such file" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
url="file://$(cd "$(dirname "$html")" && pwd)/$(basename "$html")"
mkdir -p "$(dirname "$png")"
rm -f "$png"
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars \
  --window-size="${size/x/,}" --screenshot="$(cd "$(dirname "$png")" && pwd)/$(basename "$png")" "$url" \
  >"$profile/chromium.log" 2>&1 || { cat "$profile/chromium.log" >&2; exit 1; }
[ -s "$png" ] || { echo "screenshot_report.sh: chromium wrote no $png" >&2; cat "$profile/chromium.log" >&2; exit 1; }
echo "$png"
