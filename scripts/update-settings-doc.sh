#!/usr/bin/env bash
# Rewrites docs/settings.md's table from the code's settings table
# (`nccl-net-fabric settings --markdown`); tests/loading.rs checks the two agree.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bin nccl-net-fabric
table=$(target/debug/nccl-net-fabric settings --markdown)
python3 - "$table" <<'PY'
import sys
table = sys.argv[1] + "\n"
text = open("docs/settings.md").read()
start = text.index("| variable | values | default | meaning |")
end = text.find("\n\n", start)
end = len(text) if end < 0 else end + 1
open("docs/settings.md", "w").write(text[:start] + table + text[end:])
PY
