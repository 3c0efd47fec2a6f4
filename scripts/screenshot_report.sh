#!/usr/bin/env bash
# Render a recovery report in headless Chromium and save a screenshot, to look at it as a person
# would. Usage: scripts/screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# Installs Debian's chromium when it is missing (as root, or through sudo -n).
set -euo pipefail
html=${1:?usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]}
png=${2:?usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]}
size=${3:-1100x2600}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    if [ "$(id -u)" = 0 ]; then apt=(apt-get); else apt=(sudo -n apt-get); fi
    "${apt[@]}" install -y chromium >/dev/null 2>&1 || {
        "${apt[@]}" update >/dev/null && "${apt[@]}" install -y chromium >/dev/null
    }
    browser=$(command -v chromium)
fi
abs_html=$(readlink -f "$html")
abs_png=$(readlink -f "$(dirname "$png")")/$(basename "$png")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# --no-sandbox: root in a container has no user namespace for the sandbox; the page is our own
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
    --window-size="${size/x/,}" --screenshot="$abs_png" "file://$abs_html" >/dev/null 2>&1
test -s "$abs_png"
echo "screenshot: $abs_png ($size)"
