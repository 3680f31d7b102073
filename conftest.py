"""The order in which `make test` hands the suite to its two pytest-xdist workers.

`make test` runs the tests (tests/) and every command of the docs (doctests/) in one session, on
two workers, under `--dist loadscope --no-loadscope-reorder`: a scope (a test file, or one doc
workspace: a test class in doctests/) runs whole on one worker, and the scopes are handed out in
collection order. This hook puts the longest scopes first, so that the two workers end together:
run as two sessions, each left one worker idle for its last minutes.
"""

from __future__ import annotations

import pytest

_DOCS = "doctests/test_doc_commands.py::TestDocs_"

# Seconds each scope took in `make test` on the 2-core CPU without AVX-512 (2026-11-27). A scope
# not named here starts after these, in collection order. A stale figure costs balance, never a result.
SCOPE_SECONDS = {
    "tests/test_autotune.py": 419, "tests/test_model_parallel.py": 376, "tests/test_distributed.py": 357,
    "tests/test_parameter_server.py": 336, _DOCS + "docs_model_parallel_md": 330, _DOCS + "docs_guide_md_memory": 250,
    _DOCS + "docs_guide_md": 200, "tests/test_task_matrix.py": 213, _DOCS + "docs_guide_md_pipeline": 201,
    _DOCS + "docs_guide_md_sweep": 180, "tests/test_user_data.py": 172, "tests/test_tune.py": 150,
    _DOCS + "docs_guide_md_ps": 128, _DOCS + "docs_autotune_md": 120, "tests/test_sharded.py": 117,
    "tests/test_memory.py": 115, "tests/test_trackers.py": 112, _DOCS + "docs_data_md": 110,
    _DOCS + "docs_integrations_md": 104, _DOCS + "docs_your_model_and_data_md": 101, "tests/test_recipes.py": 96,
    "tests/test_wheel.py": 78, "tests/test_trust.py": 70, _DOCS + "docs_guide_md_shards": 58, "tests/test_hsdp.py": 57,
    _DOCS + "docs_autotune_md_wrn": 55, _DOCS + "docs_distributed_md": 54, "tests/test_shards.py": 53,
    _DOCS + "docs_autotune_md_ttt": 50, "tests/test_job_conventions.py": 45, "tests/test_experiments.py": 44,
    _DOCS + "docs_autotune_md_grid": 43, _DOCS + "docs_guide_md_autotune": 35, _DOCS + "docs_scaling_predictor_md": 27,
    _DOCS + "docs_guide_md_tune": 26, "tests/test_tasks.py": 20,
    # Measured alone on the same machine (2026-11-27), not yet in a make test run:
    "tests/test_user_task.py": 170, _DOCS + "docs_your_task_md": 50, "tests/test_gpu_kit.py": 140,
    "tests/test_lightning.py": 105, _DOCS + "docs_lightning_md": 90,
    # Estimated (2026-11-27): the README's lines moved to docs/guide.md, and its five new ones.
    _DOCS + "README_md_five": 90, _DOCS + "README_md": 60, "tests/test_run_owner.py": 15,
    # Measured alone on the 2-core CPU with AVX-512 (2026-11-28), scaled by 1.6 for the one without.
    "tests/test_remote_shards.py": 70,
}


def scope(item: pytest.Item) -> str:
    """The scope `--dist loadscope` keeps on one worker: the test's class, else its file."""
    return item.nodeid.rsplit("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -SCOPE_SECONDS.get(scope(item), 0))   # stable: a scope keeps its order
