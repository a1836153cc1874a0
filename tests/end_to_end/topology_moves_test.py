"""Generated topology moves on 1, 2 and 3 replicas (`topology_moves.py`):
each run, stopped at its drawn moment and resumed from its backup on its
drawn replica count, ends as the uninterrupted one-device run ends
(float64) and logs what it logs.

Two rounds of one child per replica count, each round's at once: the runs
up to their stop, then the resumed runs (and, on one replica, the
uninterrupted ones)."""

import json

import children
import pytest
import topology_moves

SEED, MOVES = 38, 18
TOLERANCE = 1e-9  # float64: logic, not round-off
CHILD_TIMEOUT_S = 600
MOVES_DRAWN = topology_moves.draw(SEED, MOVES, replica_counts=(1, 2, 3))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Runs the two rounds, each round's children at once; returns their
    folder."""
    folder = tmp_path_factory.mktemp("moves")
    moves = folder / "moves.json"
    moves.write_text(json.dumps(MOVES_DRAWN))
    for phase in ("before", "after"):
        running = [
            children.start(
                [children.PYTHON, "topology_moves_child.py", phase, r, moves, folder]
            )
            for r in (1, 2, 3)
        ]
        try:
            finished = [children.finish(p, CHILD_TIMEOUT_S) for p in running]
        finally:
            for process in running:
                children.stop(process)
        for result in finished:
            assert result.returncode == 0, children.output(result)
    return folder


def test_the_moves_drawn_cover_every_change_of_replica_count():
    pairs = {(move["before"], move["after"]) for move in MOVES_DRAWN}
    assert {(b, a) for b in (1, 2, 3) for a in (1, 2, 3) if b != a} <= pairs
    assert {move["family"] for move in MOVES_DRAWN} == set(topology_moves.FAMILIES)
    assert {move["pipeline"] for move in MOVES_DRAWN} == set(topology_moves.PIPELINES)


@pytest.mark.parametrize(
    "move",
    MOVES_DRAWN,
    ids=[f"{m['name']}_{m['before']}to{m['after']}" for m in MOVES_DRAWN],
)
def test_a_move_ends_and_logs_as_one_device(move, resumed):
    references = json.loads((resumed / "reference.json").read_text())
    run = json.loads((resumed / f"{move['name']}.json").read_text())
    assert topology_moves.batches_trained(run) == topology_moves.batches_left(move)
    weights, logs = topology_moves.largest_differences(
        run, references[topology_moves.reference_key(move)]
    )
    assert weights <= TOLERANCE, move
    assert logs <= TOLERANCE, move
