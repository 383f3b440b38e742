"""autoconfig.bounds: whole-number counts and one message form for every range."""

import pytest

from autoconfig.bounds import COUNT, SEQ_LEN, Range, check_number, check_optional
from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, InputError


@pytest.mark.parametrize("value, shown", [(0, "0"), (-2, "-2"), (2.5, "2.5"),
                                          (MAX_COUNT + 1, str(MAX_COUNT + 1)),
                                          (float("nan"), "nan")])
def test_a_count_outside_its_range_names_the_value_and_the_whole_range(value, shown):
    with pytest.raises(InputError) as info:
        check_number("--nodes", value, COUNT)
    assert str(info.value) == (f"invalid --nodes {shown}: must be a whole number in "
                               f"[1, {MAX_COUNT}]")


def test_a_count_inside_its_range_is_taken():
    assert check_number("--nodes", MAX_COUNT, COUNT) == MAX_COUNT
    assert check_optional("--seq-len", MAX_SEQ_LEN, SEQ_LEN) == MAX_SEQ_LEN
    assert check_optional("--seq-len", None, SEQ_LEN) is None


def test_the_reason_of_a_bound_is_said_after_it():
    with pytest.raises(InputError) as info:
        check_number("--tflops-per-gpu", 5000, Range(0, 989, low_open=True),
                     "the bf16 peak of h100-80gb")
    assert str(info.value) == ("invalid --tflops-per-gpu 5000: must be in (0, 989], "
                               "the bf16 peak of h100-80gb")
