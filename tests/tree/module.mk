# tests/tree: the tree's structure (one-way calls inside each daemon folder,
# file sizes), judged on the built objects; test_docs.sh: the README's
# length, LICENSE/CHANGELOG/CONTRIBUTING, every relative Markdown link.
ALL_TESTS += tests/tree/test_layers.sh
ALL_TESTS += tests/tree/test_docs.sh
