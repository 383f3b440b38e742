"""Which plans get profiled: the predicted best plus diverse layouts."""

import itertools

import pytest

from autoconfig.errors import InputError
from autoconfig.core.plan import Plan
from autoconfig.profiling.select import select_plans


def _grid():
    """Plans of 4 GPUs, ranked so that the top is all TP1/PP1/no-SP/no-recompute."""
    plans = []
    for tp, pp, sp, rc, mbs in itertools.product((1, 2), (1, 2), (False, True),
                                                 ("none", "selective", "full"), (1, 2)):
        if sp and tp == 1:
            continue
        plans.append(Plan(tp=tp, pp=pp, dp=4 // (tp * pp), sp=sp, recompute=rc, mbs=mbs))
    # predicted order: the simplest plans first (what a model might prefer)
    return sorted(plans, key=lambda p: (p.tp, p.pp, p.sp, ("none", "selective", "full").index(p.recompute), p.mbs))


def test_first_pick_is_the_predicted_best():
    ranked = _grid()
    assert select_plans(ranked, 1) == [ranked[0]]


def test_four_picks_cover_tp_pp_sp_and_every_recompute():
    picked = select_plans(_grid(), 4)
    assert len(picked) == 4 and len(set(picked)) == 4
    assert {p.tp for p in picked} == {1, 2}
    assert {p.pp for p in picked} == {1, 2}
    assert {p.sp for p in picked} == {False, True}
    assert {p.recompute for p in picked} == {"none", "selective", "full"}


def test_ties_follow_predicted_rank_once_covered():
    ranked = _grid()
    picked = select_plans(ranked, 8)
    covered_after = picked[4:]
    # every value is covered by then except maybe mbs; later picks keep rank order
    ranks = [ranked.index(p) for p in covered_after]
    assert ranks == sorted(ranks)


def test_k_larger_than_candidates_returns_all_once():
    ranked = _grid()[:3]
    assert sorted(select_plans(ranked + ranked, 10), key=ranked.index) == ranked


def test_only_the_axes_present_are_required():
    ranked = [Plan(tp=1, pp=1, dp=2, mbs=m) for m in (1, 2, 4)]
    assert select_plans(ranked, 2) == [ranked[0], ranked[1]]


def test_invalid_k():
    with pytest.raises(InputError, match="top-k"):
        select_plans(_grid(), 0)
