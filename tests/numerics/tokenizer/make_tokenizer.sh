#!/usr/bin/env bash
# The tiny SentencePiece model of the `qkv generate --prompt` tests: BPE, 64 pieces (the mistral
# fixture's vocabulary has 80 ids, so every id it yields is valid there), trained with Debian's
# spm_train (package sentencepiece) on the corpus below. Deterministic for a given spm_train
# (one thread, no sampling):
#   bash tests/numerics/tokenizer/make_tokenizer.sh
set -euo pipefail
cd "$(dirname "$0")"
corpus=corpus.txt  # a fixed name: the trainer records its input path in the model
trap 'rm -f "$corpus"' EXIT
: >"$corpus"
for i in 1 2 3 4 5 6 7 8; do
  cat >>"$corpus" <<'TEXT'
the cat sat on the mat and the dog sat on the log
a bird in the hand is worth two in the bush
attention is all you need said the paper to the model
keys and values live in the cache while the queries come one at a time
TEXT
done
spm_train --input="$corpus" --model_prefix=tokenizer --vocab_size=64 --model_type=bpe \
  --character_coverage=1.0 --normalization_rule_name=identity --num_threads=1 --bos_id=1 --eos_id=2 --unk_id=0 --pad_id=-1 \
  --minloglevel=2 >/dev/null
rm -f tokenizer.vocab
