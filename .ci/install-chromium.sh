#!/usr/bin/env bash
# CI: install Debian's chromium for the report's browser test (tests/test_observe_report.py).
# Tolerant of failure: without chromium that one test skips with a clear reason, and the
# rest of CI must not fail because a mirror is down or the image is not Debian.
set -u
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
fi
if command -v apt-get >/dev/null 2>&1 \
    && $SUDO apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium; then
    echo "chromium installed: $(/usr/bin/chromium --version 2>/dev/null)"
else
    echo "warning: could not install chromium; the headless-browser report test will be skipped" >&2
fi
exit 0
