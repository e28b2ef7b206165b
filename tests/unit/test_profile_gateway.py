"""The gateway profile's arithmetic: py-spy's sample counts turned into µs of CPU per delivery."""

from deploy.profile_gateway import collapsed, costs, table

RAW = """\
<module> (gateway/server/main.py:70);run (uvloop);_pump (gateway/server/connection.py:120);feed (gateway/protocol/session.py:40) 30
<module> (gateway/server/main.py:70);run (uvloop);_pump (gateway/server/connection.py:124) 10
<module> (gateway/server/main.py:70);run (uvloop);notify (gateway/server/notifying.py:50);render (gateway/protocol/frames.py:9);render (gateway/protocol/frames.py:9) 60
not a sample line
"""


def test_raw_lines_become_stacks_root_first():
    stacks = collapsed(RAW.splitlines())
    assert len(stacks) == 3  # the line without a count is not a sample
    assert stacks[0][0][-1] == "feed (gateway/protocol/session.py)" and stacks[0][1] == 30


def test_self_counts_the_leaf_and_total_counts_a_recursive_frame_once():
    own, total, samples = costs(collapsed(RAW.splitlines()))
    assert samples == 100
    assert own["_pump (gateway/server/connection.py)"] == 10  # its samples at two lines add up
    assert total["_pump (gateway/server/connection.py)"] == 40
    assert total["render (gateway/protocol/frames.py)"] == 60  # not 120: it is on those stacks twice
    assert total["run (uvloop)"] == 100


def test_the_table_is_in_microseconds_per_delivery():
    # 100 samples at 100/s = 1 s of CPU for 1,000 deliveries: 1,000 µs each; render's 60 samples: 600 µs
    text = table(collapsed(RAW.splitlines()), rate=100, deliveries=1000, top=3)
    assert "1,000 deliveries: 1000.0 µs per delivery" in text
    assert "          600.00  render (gateway/protocol/frames.py)" in text
    totals = text.split("total µs/delivery")[1]
    assert "run (uvloop)" not in totals  # the event loop is on every stack: only our functions are listed
