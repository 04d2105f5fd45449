"""The collector's settings while a node serves (``openroute.runtime.collector``)."""

from __future__ import annotations

import gc

from openroute.runtime import collector


def test_serving_freezes_start_up_and_widens_the_young_generation_then_undoes_both() -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        with collector.serving():
            assert gc.get_freeze_count() > 0, "what the interpreter and the tests loaded is frozen"
            assert gc.get_threshold() == (collector.YOUNG_GENERATION, before[1], before[2])
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == before
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_untune_restores_what_tune_for_serving_replaced() -> None:
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        replaced = collector.tune_for_serving()
        assert replaced == (500, 7, 9)
        assert gc.get_threshold() == (collector.YOUNG_GENERATION, 7, 9)
        collector.untune(replaced)
        assert gc.get_threshold() == (500, 7, 9)
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
