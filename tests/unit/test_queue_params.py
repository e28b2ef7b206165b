"""Per-topic queue parameters: inheritance up to the root, validation at start-up."""

import pytest

from schemas.config import load_config
from schemas.queue_params import QueueParameters, TopicSettings


def test_a_topic_inherits_each_parameter_from_its_nearest_ancestor():
    settings = TopicSettings({"/": {"max_retries": 2}, "/jobs": {"delivery": "one", "max_in_flight": 3},
                              "/jobs/urgent": {"max_in_flight": 1, "timeout": "00:00:00:05"}})
    urgent = settings.resolve("/Jobs/Urgent/Today")
    assert (urgent.delivery, urgent.max_in_flight, urgent.max_retries, urgent.timeout) == ("one", 1, 2, "00:00:00:05")
    assert settings.resolve("/news") == QueueParameters(max_retries=2)


def test_no_entry_gives_the_built_in_defaults():
    assert TopicSettings({}).resolve("/a/b") == QueueParameters()


@pytest.mark.parametrize("entry", [{"delivery": "some"}, {"timeout": "soon"}, {"max_in_flight": 0},
                                   {"retries": 3}])
def test_a_bad_entry_fails_at_load_naming_it(entry):
    with pytest.raises(ValueError):
        load_config(env={}, topics={"/jobs": entry})


def test_the_configuration_resolves_topics_from_its_file(tmp_path):
    path = tmp_path / "smqp.toml"
    path.write_text('[topics."/jobs"]\ndelivery = "one"\nretry_timeout_s = 2.5\n')
    resolve = TopicSettings(load_config(path, env={}).topics).resolve
    assert resolve("/jobs/a").delivery == "one"
    assert resolve("/jobs/a").retry_timeout_s == 2.5
    assert resolve("/other").delivery is None
