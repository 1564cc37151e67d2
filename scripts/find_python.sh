#!/usr/bin/env bash
# Print the path (3.12 preferred: the version dvla is tested on) of a Python >= 3.12 interpreter (lerobot 0.6 needs it), or fail with advice.
set -euo pipefail

is_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; }

for name in python3.12 python3.13 python3; do
  if path=$(command -v "$name" 2>/dev/null) && is_ok "$path"; then echo "$path"; exit 0; fi
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for path in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V); do
  if is_ok "$path"; then echo "$path"; exit 0; fi
done
echo "error: no Python >= 3.12 found (lerobot 0.6 requires it)." >&2
echo "Install one (e.g. 'pyenv install 3.12' or your OS package python3.12) and rerun." >&2
exit 1
