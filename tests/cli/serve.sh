# dsc serve: an HTTP server over a briefly trained gpt-tiny, on loopback.
# 64 concurrent requests of mixed lengths and kinds each get exactly their
# answer alone (the interpreter: f64, so a row's result does not depend on
# the rows beside it); a greedy completion equals dsc generate's text; the
# openai package's client reads every answer; bad requests get a 4xx with a
# JSON error; clients that leave free their slots; SIGTERM stops it cleanly.
# The first server's KV cache holds 96 positions for 8 slots of 64: the
# youngest sequences are preempted and run again, and still answer the same.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
CLIENT="$SRC/tests/cli/lib/serve_client.py"
SRV=""
trap '[ -n "$SRV" ] && kill -9 "$SRV" 2>/dev/null; rm -rf "$TMP"' EXIT

if ! python3 -c 'import openai' 2>/dev/null; then
  if [ -n "${CI:-}" ]; then echo "FAIL: CI without the openai package (scripts/install-deps.sh --venv)"; exit 1; fi
  echo "SKIP: python3 cannot import openai (scripts/install-deps.sh --venv DIR installs it)"
  exit 0
fi

expect_exit 0 "$DSC" serve --help && expect_grep '^usage: dsc serve DIR' "$TMP/out"
expect_exit 1 "$DSC" serve && expect_grep 'missing checkpoint DIR' "$TMP/err"
expect_exit 1 "$DSC" serve "$TMP/absent" --port 70000 && expect_grep 'port needs a port number' "$TMP/err"
expect_exit 1 "$DSC" serve "$TMP/absent" --host localhost && expect_grep 'host needs an IPv4 address' "$TMP/err"
expect_exit 1 "$DSC" serve "$TMP/absent" --slots 0 && expect_grep 'slots needs an integer' "$TMP/err"
expect_exit 1 "$DSC" serve "$TMP/absent" --bogus && expect_grep "unknown option '--bogus'" "$TMP/err"
expect_exit 1 "$DSC" serve "$TMP/absent" --port 0 && expect_grep 'absent: error: cannot open checkpoint' "$TMP/err"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
expect_exit 0 "$DSC" train "$SRC/examples/gpt-tiny.dsm" --data "$TMP/c" --batch 4 --seq 32 --steps 60 --lr 3e-3 --out "$TMP/run" --quiet

# start_server LOG ARGS...: dsc serve in the background; URL once it listens
start_server() {
  local log=$1
  shift
  "$DSC" serve "${SERVED:-$TMP/run}" --port 0 "$@" 2>"$log" &
  SRV=$!
  URL=""
  for _ in $(seq 600); do
    URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" 2>/dev/null) && break
    kill -0 "$SRV" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$URL" ] && pass || { fail "dsc serve did not start"; cat "$log"; }
}
stop_server() { # LOG: SIGTERM ends it with exit 0
  kill -TERM "$SRV"
  local rc=0
  wait "$SRV" || rc=$?
  SRV=""
  [ "$rc" -eq 0 ] && pass || { fail "dsc serve exited $rc after SIGTERM"; cat "$1"; }
  expect_grep 'stopping \(signal\)' "$1"
}

expect_exit 1 "$DSC" serve "$TMP/absent" --block-size 0 && expect_grep 'block-size needs an integer' "$TMP/err"
start_server "$TMP/serve.log" --backend interp --slots 8 --chunk 4 --name tiny --cache-tokens 96 --block-size 8
expect_grep "model 'tiny', 8 slots, context 64, chunk 4, cache 96 positions in blocks of 8" "$TMP/serve.log"
expect_grep 'warmed up 8 graphs' "$TMP/serve.log" # prefill and decode at 8, 4, 2 and 1 rows
HOSTPORT=${URL#http://}
# a second server on the same port is refused with a message
expect_exit 1 "$DSC" serve "$TMP/run" --port "${HOSTPORT#*:}" --backend interp && expect_grep 'cannot listen on 127.0.0.1' "$TMP/err"

timeout 600 python3 "$CLIENT" "$URL" concurrent 64 >"$TMP/conc" 2>&1 && pass || fail "concurrent requests"
cat "$TMP/conc"
timeout 300 python3 "$CLIENT" "$URL" openai tiny >"$TMP/oai" 2>&1 && pass || fail "the openai client"
cat "$TMP/oai"
timeout 300 python3 "$CLIENT" "$URL" errors >"$TMP/errs" 2>&1 && pass || fail "bad requests"
cat "$TMP/errs"

# a greedy completion is the text dsc generate writes after the prompt
timeout 60 python3 "$CLIENT" "$URL" complete "the cat " 30 >"$TMP/served" && pass || fail "complete"
expect_exit 0 "$DSC" generate "$TMP/run" --backend interp --temperature 0 --prompt "the cat " --tokens 30
printf 'the cat ' | cat - "$TMP/served" | cmp -s - "$TMP/out" && pass ||
  fail "served '$(cat "$TMP/served")', generate '$(cat "$TMP/out")'"
# the README's curl
expect_exit 0 curl -sS "$URL/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "the cat ", "max_tokens": 30, "temperature": 0}'
expect_grep '"text":"'"$(sed 's/[][\.*^$]/\\&/g' "$TMP/served")"'"' "$TMP/out"
expect_exit 0 curl -sS "$URL/metrics"
expect_grep '^dsc_cache_positions\{state="total"\} 96$' "$TMP/out"
expect_grep '^dsc_cache_blocks\{state="total"\} 12$' "$TMP/out"
expect_grep '^dsc_cache_blocks\{state="used"\} 0$' "$TMP/out"
expect_grep '^dsc_preemptions_total [1-9]' "$TMP/out"
expect_grep '^dsc_requests_total\{endpoint="chat_completions"\} [1-9]' "$TMP/out"
stop_server "$TMP/serve.log"

# a chat template (--chat-template: a Jinja file): a greedy chat answer is the
# completion of the rendered prompt; the template's raise_exception is a 400
# naming it; a template outside the subset stops the server at start-up
cat >"$TMP/chatml.jinja" <<'JINJA'
{%- for m in messages %}
{%- if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m.role) }}{% endif %}
{{- '<|' + m.role + '|>' + m.content | trim + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}
JINJA
printf '{%% macro x() %%}{%% endmacro %%}' >"$TMP/bad.jinja"
expect_exit 1 "$DSC" serve "$TMP/run" --port 0 --backend interp --chat-template "$TMP/bad.jinja"
expect_grep "chat template: line 1: the statement 'macro' is not supported" "$TMP/err"
start_server "$TMP/chat.log" --backend interp --slots 2 --chat-template "$TMP/chatml.jinja"
expect_grep "chat: the chat template of $TMP/chatml.jinja" "$TMP/chat.log"
expect_exit 0 curl -sS "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "system", "content": "be nice "}, {"role": "user", "content": " the cat"}], "max_tokens": 12, "temperature": 0}'
cp "$TMP/out" "$TMP/chat.json"
expect_exit 0 curl -sS "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "<|system|>be nice\n<|user|>the cat\n<|assistant|>", "max_tokens": 12, "temperature": 0}'
python3 - "$TMP/chat.json" "$TMP/out" <<'PY' && pass || fail "the chat answer is not the completion of the rendered prompt"
import json, sys
chat, comp = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
a, b = chat["choices"][0]["message"]["content"], comp["choices"][0]["text"]
assert a == b and chat["usage"]["prompt_tokens"] == comp["usage"]["prompt_tokens"] == 47, (a, b, chat["usage"])
PY
expect_exit 0 curl -sS -w '%{http_code}' "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "robot", "content": "x"}], "max_tokens": 2}'
expect_grep 'unknown role robot' "$TMP/out"
expect_grep '400$' "$TMP/out"
stop_server "$TMP/chat.log"

# clients that leave free their slots: llama-tiny (rope) with a long context,
# so that a sequence runs far longer than noticing its client left takes
expect_exit 0 "$DSC" train "$SRC/examples/llama-tiny.dsm" --data "$TMP/c" --batch 2 --seq 32 --steps 3 --out "$TMP/llama" --quiet
SERVED="$TMP/llama" start_server "$TMP/llama.log" --backend interp --slots 2 --context 2048
timeout 300 python3 "$CLIENT" "$URL" disconnect 2000 >"$TMP/disc" 2>&1 && pass || fail "disconnects"
cat "$TMP/disc"
stop_server "$TMP/llama.log"

# the compiled CPU backend serves too (the unit tests compare its batching)
if "$DSC" run "$SRC/examples/mlp.dsm" --backend cpu >/dev/null 2>&1; then
  start_server "$TMP/cpu.log" --slots 4
  timeout 60 python3 "$CLIENT" "$URL" complete "the cat " 20 >"$TMP/cpu" && pass || fail "cpu complete"
  [ "$(wc -c <"$TMP/cpu")" -eq 20 ] && pass || fail "cpu: 20 tokens gave '$(cat "$TMP/cpu")'"
  stop_server "$TMP/cpu.log"
fi
finish
