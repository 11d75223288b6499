# dsc generate (and its alias dsc sample): generation from a briefly
# trained checkpoint through the KV-cache engine.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
# 60 steps as in train.sh: loss about 1.75, enough for the corpus' letters
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --batch 4 --seq 32 --steps 60 --lr 3e-3 --out "$TMP/run" --quiet

expect_exit 0 "$DSC" sample --help && expect_grep '^usage: dsc generate DIR --tokens N' "$TMP/out"
expect_exit 0 "$DSC" generate --help && expect_grep 'dsc sample \.\.\.   \(the same\)' "$TMP/out"
expect_exit 1 "$DSC" generate "$TMP/run" --tokens 5 --chunk 0 && expect_grep 'chunk needs an integer in 1..4096' "$TMP/err"
expect_exit 1 "$DSC" generate "$TMP/run" --tokens 5 --backend gpu && expect_grep 'backend needs one of' "$TMP/err"
expect_exit 1 "$DSC" generate "$TMP/run" --tokens 5 --context 0 && expect_grep 'context needs a positive integer' "$TMP/err"
expect_exit 1 "$DSC" generate "$TMP/run" --tokens 5 --context 65 && expect_grep 'context of 65 positions is longer than the model.s position table \(64 rows\)' "$TMP/err"
expect_exit 1 "$DSC" sample "$TMP/run" && expect_grep 'missing --tokens N' "$TMP/err"
expect_exit 1 "$DSC" sample --tokens 5 && expect_grep 'missing checkpoint DIR' "$TMP/err"
expect_exit 1 "$DSC" sample "$TMP/run" --tokens 5 --temperature -1 && expect_grep 'temperature needs a number >= 0' "$TMP/err"
expect_exit 1 "$DSC" sample "$TMP/run" --tokens 5 --top-k 0 && expect_grep 'top-k needs a positive integer' "$TMP/err"
expect_exit 1 "$DSC" sample "$TMP/absent" --tokens 5 && expect_grep 'absent: error: cannot open checkpoint' "$TMP/err"
mkdir "$TMP/empty"
expect_exit 1 "$DSC" sample "$TMP/empty" --tokens 5 && expect_grep 'empty: error: not a checkpoint' "$TMP/err"
# a model whose forward does not end in cross_entropy
expect_exit 1 "$DSC" sample "$TMP/run" --tokens 5 --model "$SRC/examples/mlp.dsm"
mkdir -p "$TMP/m/lib" && cp "$SRC/examples/lib/layers.dsm" "$TMP/m/lib/"
sed 's/return cross_entropy(logits, targets)/return mean(logits)/' "$MODEL" >"$TMP/m/nolog.dsm"
grep -q 'return mean(logits' "$TMP/m/nolog.dsm" && pass || fail "sed did not rewrite the return"
expect_exit 1 "$DSC" sample "$TMP/run" --tokens 5 --model "$TMP/m/nolog.dsm"
expect_grep "(does not end in cross_entropy|needs a token model)" "$TMP/err"

# the same seed gives the same text; the output is exactly N bytes
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 48 --seed 7 && cp "$TMP/out" "$TMP/s7a"
expect_exit 0 "$DSC" sample "$TMP/run/latest" --tokens 48 --seed 7 && cp "$TMP/out" "$TMP/s7b"
cmp "$TMP/s7a" "$TMP/s7b" && pass || fail "same seed, different text"
[ "$(wc -c <"$TMP/s7a")" -eq 48 ] && pass || fail "48 tokens gave $(wc -c <"$TMP/s7a") bytes"
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 48 --seed 8 && cp "$TMP/out" "$TMP/s8"
cmp -s "$TMP/s7a" "$TMP/s8" && fail "seeds 7 and 8 gave the same 48 bytes" || pass
# greedy: temperature 0 twice, and top-k 1 (any seed, any temperature) agree
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 48 --temperature 0 --prompt "the cat " && cp "$TMP/out" "$TMP/g1"
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 48 --temperature 0 --seed 3 --prompt "the cat " && cp "$TMP/out" "$TMP/g2"
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 48 --top-k 1 --temperature 1.5 --seed 9 --prompt "the cat " && cp "$TMP/out" "$TMP/g3"
cmp "$TMP/g1" "$TMP/g2" && cmp "$TMP/g1" "$TMP/g3" && pass || fail "greedy outputs differ"
expect_grep '^the cat ' "$TMP/g1" # the prompt comes first
# the trained weights are in use: greedy text uses only the corpus' characters
# (random weights would give arbitrary bytes)
LC_ALL=C grep -qv '^[a-z .]*$' "$TMP/g1" && fail "greedy text has bytes outside the corpus: $(od -c "$TMP/g1" | head -3)" || pass
# top-k 3 at a high temperature still stays within the 3 likeliest: with the
# corpus' letters far more likely than any other byte, no odd bytes appear
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 64 --top-k 3 --temperature 2 --seed 1
LC_ALL=C grep -qv '^[a-z .]*$' "$TMP/out" && fail "top-k 3 sampled an unlikely byte: $(od -c "$TMP/out" | head -3)" || pass
# the cache changes nothing: greedy text is the same on the interpreter
# (doubles), compiled, one prompt token a step or 16, and past the context
# (64 positions: the text wraps twice, re-running its newer half)
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --backend interp && cp "$TMP/out" "$TMP/gi"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --backend cpu --chunk 1 && cp "$TMP/out" "$TMP/gc1"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --backend cpu --chunk 16 --stats && cp "$TMP/out" "$TMP/gc16"
cmp "$TMP/gi" "$TMP/gc1" && cmp "$TMP/gi" "$TMP/gc16" && pass || fail "greedy text differs between backends or chunks"
head -c 48 "$TMP/g1" | cmp - <(head -c 48 "$TMP/gi") && pass || fail "generate and sample differ"
expect_grep '^generate: 1 prompt steps in [0-9.]+ s, 39 one-token steps in [0-9.]+ s \([0-9.]+ tokens/s\)' "$TMP/err"
# --profile: the one-token graph's instructions, timed, the same text
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --backend cpu --profile
cmp "$TMP/out" "$TMP/gi" && pass || fail "--profile changed the text"
expect_grep '^profile of decode: [0-9.]+ ms per run over 39 runs' "$TMP/err"
expect_grep '^  gemm +[0-9]+ +[0-9.]+ ms' "$TMP/err"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 4 --temperature 0 --backend interp --profile
expect_grep 'profile: this backend times no instructions' "$TMP/err"
# a model whose positions the cache cannot offset (iota read by a reshape)
# runs its whole window each token, with a warning, to the same greedy text
sed 's/embedding(wpe, iota(T))/embedding(wpe, reshape(iota(T), [T]))/' "$MODEL" >"$TMP/m/window.dsm"
grep -q 'reshape(iota(T)' "$TMP/m/window.dsm" && pass || fail "sed did not rewrite the positions"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --model "$TMP/m/window.dsm"
expect_grep 'window.dsm:[0-9]+:[0-9]+: warning: iota\([0-9]+\) is read by reshape.*generating without a KV cache' "$TMP/err"
cmp "$TMP/out" "$TMP/gi" && pass || fail "the window's greedy text differs from the cache's"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 4 --temperature 0 --model "$TMP/m/window.dsm" --profile
expect_grep '^profile of forward: [0-9.]+ ms per run' "$TMP/err"
# a smaller cache wraps sooner, to the same text as the window of that size
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --context 24 --stats && cp "$TMP/out" "$TMP/c24"
expect_grep '^generate: 3 prompt steps' "$TMP/err"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 40 --temperature 0 --prompt "the cat " --context 24 --model "$TMP/m/window.dsm"
cmp "$TMP/out" "$TMP/c24" && pass || fail "context 24: the cache's text differs from the window's"
# a cache of one position: each token alone (its window wraps at every token)
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 5 --temperature 0 --context 1
[ "$(wc -c <"$TMP/out")" -eq 5 ] && pass || fail "context 1: 5 tokens gave $(wc -c <"$TMP/out") bytes"
expect_exit 0 "$DSC" generate "$TMP/run" --tokens 150 --temperature 0 --prompt "the cat " --stats
[ "$(wc -c <"$TMP/out")" -eq 158 ] && pass || fail "150 tokens and the prompt gave $(wc -c <"$TMP/out") bytes"
# the prompt, then 3 wraps (at the 65th, 97th and 129th of 158 tokens) of 32 tokens in 2 chunks each
expect_grep '^generate: 7 prompt steps' "$TMP/err"
finish
