# tests/tokenizer/: the byte-level BPE tokenizer (engine/epd_tokenizer*.c)
# against Hugging Face's own implementations on real vocabularies (npm
# packages pinned by package-lock.json, installed by deps.sh into
# build/tokenizer-node).  In the gcc pass only (52 s here; 71-135 s more
# under the sanitizers would push make check past its time): the
# tokenizer's memory safety under ASan/UBSan is the unit tests'
# (test_epd_engine_tokenizer, every allocation failure) and the fuzz
# corpus replay's.
ifeq ($(SANITIZER),)
ALL_TESTS += tests/tokenizer/test_tokenizer_oracle.sh
endif
