# Shared by the served benchmarks (benchmarks/serve_*.sh): one server at a time on
# 127.0.0.1:$PORT, started in the background and stopped with SIGTERM (its drain).
# Source it after setting PY (the Python with httpx), PORT, READY_TIMEOUT_S and
# defining die(); READY_PATH (default /ready) is the route that answers 200 once the
# server is ready (llama.cpp's llama-server has /health). It sets SERVER_PID and an EXIT
# trap that stops the server (a script with more to clean up calls stop_server from its
# own trap instead).

SERVER_PID=""

stop_server() {
    if [[ -n $SERVER_PID ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT

require_free_port() {
    "$PY" -c "import socket, sys; sys.exit(socket.socket().connect_ex(('127.0.0.1', $PORT)) == 0)" ||
        die "port $PORT is already in use; set PORT"
}

launch_server() { # LOG COMMAND...: run COMMAND in the background, wait for READY_PATH
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    local path=${READY_PATH:-/ready}
    "$PY" - "$PORT" "$READY_TIMEOUT_S" "$SERVER_PID" "$path" <<'PY' || die "server did not start; see $log"
import os
import sys
import time

import httpx

port, timeout_s, pid, path = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
deadline = time.monotonic() + timeout_s
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the server exited before it was ready")
    try:
        if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(1)
sys.exit(f"the server was not ready after {timeout_s:g} s")
PY
}

edit_config() { # SRC DST PYTHON: DST is SRC's YAML after PYTHON ran on `config` (a dict)
    "$PY" - "$1" "$2" "$3" <<'PY'
import sys

import yaml

src, dst, code = sys.argv[1:]
with open(src) as f:
    config = yaml.safe_load(f)
exec(code, {"config": config})
with open(dst, "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
PY
}

summary_field() { # SUMMARY_JSON KEY: one figure of an `orchestrator bench` summary
    "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['summary'][sys.argv[2]])" "$@"
}
