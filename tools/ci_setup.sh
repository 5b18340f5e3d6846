#!/usr/bin/env bash
# CI preparation, run by .ci/run before `make test`: make sure Debian's chromium is present so
# that `make test` runs the browser test (tools/browser_test.py) instead of skipping it.
# The playwright Python package comes from requirements.txt with the venv; its own browser
# download is not used (it fails here), it drives /usr/bin/chromium.
#
# Idempotent and quick when chromium is already installed. Never fails CI: if apt is unreachable
# or we lack the rights, it says so and `make test` prints "Browser test SKIPPED".
set -u

if command -v chromium >/dev/null 2>&1; then
    echo "ci_setup: chromium already installed ($(chromium --version 2>/dev/null | head -n1))"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ci_setup: WARNING: no apt-get here; install chromium yourself to run the browser test."
    exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "ci_setup: WARNING: not root and no passwordless sudo; cannot install chromium."
        echo "ci_setup: the browser test will be SKIPPED by 'make test'."
        exit 0
    fi
fi

LOG=$(mktemp -t ci_setup_apt.XXXXXX.log)
echo "ci_setup: installing Debian's chromium for the browser test (about a minute)..."
export DEBIAN_FRONTEND=noninteractive
# Bounded: a hanging mirror must not hold CI forever.
if timeout 300 $SUDO apt-get update -q >"$LOG" 2>&1 \
   && timeout 600 $SUDO apt-get install -y -q --no-install-recommends chromium \
        >>"$LOG" 2>&1; then
    echo "ci_setup: installed $(chromium --version 2>/dev/null | head -n1)"
else
    echo "ci_setup: WARNING: could not install chromium (apt unreachable?); last lines of the log:"
    tail -n 5 "$LOG" | sed 's/^/ci_setup:   /'
    echo "ci_setup: the browser test will be SKIPPED by 'make test'; CI continues."
fi
exit 0
