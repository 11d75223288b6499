# make_corpus FILE [WORDS]: a deterministic English-like text (a fixed word list
# drawn by the ZX81 LCG, exact in any awk, 12 words to a sentence), a few KB for the training tests.
make_corpus() {
  awk -v n="${2:-1500}" 'BEGIN {
    nw = split("the cat sat on a mat and the dog ran to the red ball while a bird sang in the tall green tree", w, " ")
    s = 1
    for (i = 0; i < n; i++) {
      s = (s * 75 + 74) % 65537
      printf "%s%s", w[1 + int(s / 7) % nw], (i % 12 == 11) ? ".\n" : " "
    }
  }' >"$1"
}
