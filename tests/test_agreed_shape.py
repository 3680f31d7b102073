"""distributed/shapes.py in one process: the encoding round-trips every rank it accepts, a process
holding nothing contributes nothing, and a shape past the encoding is refused before any
collective starts (the processes tests run it between real ranks: ensemble, replica predict)."""

import pytest

from scaletrain.distributed.shapes import MAX_DIMS, agreed_shape
from scaletrain.distributed.strategies.base import Strategy


def one_process_max(tensor):
    return Strategy.all_reduce_max_(None, tensor)   # the one-process strategy's reduce: the tensor as it is


@pytest.mark.parametrize("shape", [(), (10,), (3, 7), tuple(range(1, MAX_DIMS + 1))])
def test_a_shape_round_trips(shape):
    assert agreed_shape(shape, one_process_max, "cpu") == shape


def test_a_process_holding_nothing_agrees_on_no_dimensions():
    assert agreed_shape(None, one_process_max, "cpu") == ()


def test_a_shape_past_the_encoding_is_refused_before_the_reduce():
    called = []
    with pytest.raises(ValueError, match=f"at most {MAX_DIMS}"):
        agreed_shape((1,) * (MAX_DIMS + 1), called.append, "cpu")
    assert called == []
