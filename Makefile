# The two commands of the README. Both set up ./.venv first (scripts/setup.sh).
.PHONY: train test doc-test setup check test-xla test-xla-ci

setup:
	bash scripts/setup.sh all

# The default recipe: the 1-D CNN on MNIST-1D to 94 % test accuracy. Installs only what it needs
# (torch and MNIST-1D's generator); `make setup` adds every extra.
train:
	bash scripts/setup.sh mnist1d
	.venv/bin/scaletrain train

# The inner loop, for every change: the linter (pyproject.toml's [tool.ruff]), then every test that
# starts no process and trains to no target (those that start one take the `processes` fixture,
# conftest.py; one that starts one without it fails), on two workers. `make test` (CI) still runs everything.
check:
	bash scripts/setup.sh dev
	bash scripts/timed.sh "make check" .venv/bin/ruff check . -- \
	  .venv/bin/python -m pytest -q -n 2 -m "not processes and not slow" tests

# setup-system.sh: headless Chromium and PostgreSQL, which tests drive for real. Then every test
# and every command of README.md and docs/ (doctests/) in one session on two pytest-xdist workers: a
# test file, or a doc workspace's lines in order, on one of them (module fixtures are built once),
# the longest first (conftest.py: as long as the last `make test` here measured, kept in
# .pytest_cache/, else the committed tests/scope_seconds.json), so the two workers end together.
# No test claims how fast the machine is (tests/test_architecture.py: a benchmark's claim), so
# nothing needs the machine to itself. Each target says how long it took (README, "Tests").
# torch.compile's kernels (inductor's cache) for the tests: in the checkout, not the machine's
# /tmp/torchinductor_$$USER, so a fresh clone (CI) compiles everything and its time is a cold run's
# whatever ran on the machine before, and a second run here reuses them (timed.sh says which).
check test doc-test: export TORCHINDUCTOR_CACHE_DIR = $(CURDIR)/.cache/torchinductor

test:
	bash scripts/setup.sh dev
	bash scripts/setup-system.sh
	bash scripts/timed.sh "make test" \
	  env SCALETRAIN_SCOPE_SECONDS=.pytest_cache/scope_seconds.json \
	  .venv/bin/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder tests doctests

# Only the commands of README.md and docs/, run as written (shortened as doctests/ says), each doc
# workspace's lines in order on one of two workers (`make test` runs them too).
doc-test:
	bash scripts/setup.sh dev
	bash scripts/timed.sh "make doc-test" .venv/bin/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder doctests

# XLA devices (TPUs) through torch_xla, run for real on XLA on a CPU (PJRT_DEVICE=CPU): its tests in
# .venv-xla (torch 2.9.0 + torch_xla 2.9.0, scripts/setup-xla.sh). `make test-xla` runs them all;
# CI (.ci/run) runs `make test-xla-ci` after `make test`: one device, the refusals, SPMD over four
# and a resume, the subset that fits CI's time on the slower CPU (docs/testing.md, "XLA").
XLA_CI = -k "mlp or cannot_run or spmd or resumed"
test-xla:
	bash scripts/setup.sh xla
	bash scripts/timed.sh "make test-xla" .venv-xla/bin/python -m pytest -q -p no:cacheprovider tests/xla

test-xla-ci:
	bash scripts/setup.sh xla
	bash scripts/timed.sh "make test-xla-ci" .venv-xla/bin/python -m pytest -q -p no:cacheprovider $(XLA_CI) tests/xla
