"""The adversarial run's frames (deploy/frame_strategies.py): the same seed gives the same million."""

from deploy.frame_strategies import Mutator, frame_pool


def test_the_pool_is_drawn_again_alike_for_a_seed_and_differs_for_another():
    assert frame_pool(300, 7) == frame_pool(300, 7)
    assert frame_pool(300, 7) != frame_pool(300, 8)


def test_the_mutator_repeats_itself_per_seed_and_always_yields_bytes():
    pool = frame_pool(200, 1)
    first, again, other = Mutator(pool, 5), Mutator(pool, 5), Mutator(pool, 6)
    frames = [first.frame() for _ in range(5000)]
    assert frames == [again.frame() for _ in range(5000)]
    assert frames != [other.frame() for _ in range(5000)]
    assert all(isinstance(frame, bytes) for frame in frames)
    assert len(set(frames) - set(pool)) > 1000, "most frames are mutations, not pool frames"


def test_the_mutator_works_from_a_pool_of_empty_frames():
    assert all(isinstance(Mutator([b""], 0).frame(), bytes) for _ in range(100))
