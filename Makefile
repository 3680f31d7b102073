# The two commands of the README. Both set up ./.venv first (scripts/setup.sh).
.PHONY: train test doc-test setup

setup:
	bash scripts/setup.sh all

# The default recipe: the 1-D CNN on MNIST-1D to 94 % test accuracy. Installs only what it needs
# (torch and MNIST-1D's generator); `make setup` adds every extra.
train:
	bash scripts/setup.sh mnist1d
	.venv/bin/scaletrain train

# setup-system.sh: headless Chromium and PostgreSQL, which tests drive for real. One pytest process:
# two xdist workers (`-n 2 --dist loadfile`) took 17.5 min instead of 26.5, but one of two such
# runs lost a tune resume to the 300 s limit and a 2-rank worker to exit -6 (README).
test:
	bash scripts/setup.sh dev
	bash scripts/setup-system.sh
	.venv/bin/python -m pytest -q tests

# Every command in README.md and docs/, run as written (shortened as doctests/ says); CI runs it after `make test`.
doc-test:
	bash scripts/setup.sh dev
	.venv/bin/python -m pytest -q doctests
