#!/usr/bin/env bash
# Regenerates deploy/demo/prompts.jsonl: 1,100 OpenAI Batch lines whose
# prompts are the openings (first 6-10 words) of King James Version verses,
# read from the Debian package bible-kjv-text through its reader `bible`
# (package bible-kjv). See SOURCE.md for the source and licence.
#
#   apt-get install -y bible-kjv      # pulls in bible-kjv-text
#   bash deploy/demo/make_prompts.sh  # writes deploy/demo/prompts.jsonl
#
# Deterministic: same package version -> byte-identical output.
set -euo pipefail
export LC_ALL=C
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/prompts.jsonl}"
count="${COUNT:-1100}"

command -v bible >/dev/null || { echo "make_prompts.sh: needs 'bible' (apt-get install bible-kjv)" >&2; exit 1; }

# -f turns pretty-printing off: one verse per line, "Ge1:1 In the beginning ...".
# stdin from /dev/null keeps bible from entering interactive mode.
bible -f gen1:1-rev22:21 </dev/null |
awk -v count="$count" '
  # Verse NR -> its first k words (k = 6..10, cycling), trailing punctuation cut.
  NF >= 7 {
    k = 6 + (NR % 5)
    if (k > NF - 1) k = NF - 1
    p = $2
    for (i = 3; i <= k + 1; i++) p = p " " $i
    sub(/[,;:.!?]+$/, "", p)
    if (!(p in seen)) { seen[p] = 1; uniq[n++] = p }
  }
  END {
    if (n < count) { print "make_prompts.sh: only " n " unique openings" > "/dev/stderr"; exit 1 }
    step = n / count
    for (j = 0; j < count; j++) {
      p = uniq[int(j * step)]
      gsub(/\\/, "\\\\", p); gsub(/"/, "\\\"", p)
      # Every 10th line greedy; the rest sampled at 0.8 with a per-line seed.
      temp = (j % 10 == 9) ? "0.0" : "0.8"
      printf "{\"custom_id\": \"demo-%04d\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"stories260K\", \"prompt\": \"%s\", \"max_tokens\": 48, \"temperature\": %s, \"seed\": %d}}\n", j + 1, p, temp, 1000 + j
    }
  }' > "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $(wc -l < "$out") lines to $out" >&2
