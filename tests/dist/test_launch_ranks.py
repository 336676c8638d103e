"""The `launch_ranks` fixture starts a launch once more when a rank died of the rare Megatron FSDP
crash (glibc's abort on a damaged heap, or a segfault inside Megatron FSDP), lists it in the
session's summary, and fails a launch whose second start dies too, or any other crash."""

from __future__ import annotations

import pytest

from tests.dist.relaunch import RELAUNCHED

pytestmark = pytest.mark.dist


@pytest.mark.parametrize(("entry", "listed"), [
    ("abort_once_on_damaged_heap", "rank 1: malloc(): unaligned tcache chunk detected"),
    ("segfault_once_in_megatron_fsdp",
     "rank 0: Fatal Python error: Segmentation fault in Megatron FSDP"),
])
def test_a_rank_dead_of_the_known_crash_is_started_again_and_listed(launch_ranks, tmp_path,
                                                                    entry, listed):
    before = len(RELAUNCHED)
    results = launch_ranks(2, f"tests.dist.launch_checks:{entry}",
                           {"marker": str(tmp_path / "crashed")})
    assert results == [{"rank": 0}, {"rank": 1}]
    assert len(RELAUNCHED) == before + 1
    assert listed in RELAUNCHED[-1]
    RELAUNCHED.pop()  # staged here: the session's summary lists only real crashes


def test_a_second_abort_fails_the_launch(launch_ranks):
    before = len(RELAUNCHED)
    with pytest.raises(RuntimeError, match="free\\(\\): invalid pointer"):  # RankLaunchError
        launch_ranks(2, "tests.dist.launch_checks:abort_on_damaged_heap")
    assert len(RELAUNCHED) == before + 1
    RELAUNCHED.pop()


def test_a_segfault_elsewhere_fails_the_launch_at_once(launch_ranks):
    before = len(RELAUNCHED)
    with pytest.raises(RuntimeError, match="exit codes \\[-11"):  # RankLaunchError
        launch_ranks(2, "tests.dist.launch_checks:segfault_elsewhere")
    assert len(RELAUNCHED) == before
