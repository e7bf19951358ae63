# tests/: one folder per source folder (unit tests, cmocka), plus
# tests/integration (real daemons on loopback) and tests/fuzz.
# Each tests/<folder>/module.mk registers its programs with epd_test; shell
# tests are added to ALL_TESTS directly (they must be executable).
-include $(sort $(wildcard tests/*/module.mk))
