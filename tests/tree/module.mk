# tests/tree: the tree's structure (one-way calls inside each daemon folder,
# file sizes), judged on the built objects.
ALL_TESTS += tests/tree/test_layers.sh
