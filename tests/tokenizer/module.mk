# tests/tokenizer/: the byte-level BPE tokenizer (engine/epd_tokenizer*.c)
# against Hugging Face's own implementations on real vocabularies (npm
# packages pinned by package-lock.json, installed by deps.sh into
# build/tokenizer-node).  In the gcc pass only (52 s here; 71-135 s more
# under the sanitizers would push make check past its time): the
# tokenizer's memory safety under ASan/UBSan is the unit tests'
# (test_epd_engine_tokenizer, every allocation failure) and the fuzz
# corpus replay's.
# test_chat_oracle.sh: the built-in chat templates (engine/epd_chat.c)
# against jinja2 and @huggingface/jinja on the real templates, and the
# ids of the rendered prompt against the Rust crate; same pass rules
# (about a minute here, the gcc pass only).
ifeq ($(SANITIZER),)
ALL_TESTS += tests/tokenizer/test_tokenizer_oracle.sh
ALL_TESTS += tests/tokenizer/test_chat_oracle.sh
endif
