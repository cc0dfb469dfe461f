"""Records (probes/record.py): the value behaviour the suite's code relies on, on real records."""

import json

import pytest

from probes.record import Record
from probes.result import Result, Status, passed
from probes.runner import Outcome
from probes.spec import Cause, Setting


class Gathered(Record):
    name: str
    count: int = 0
    seen: tuple[str, ...] = ()


def test_a_record_is_built_from_its_annotations_in_order_with_the_class_bodys_defaults():
    assert Gathered._fields == ("name", "count", "seen")
    assert Gathered("gpu") == Gathered(name="gpu", count=0, seen=())
    assert Gathered("gpu", 2, seen=("a",))._asdict() == {"name": "gpu", "count": 2, "seen": ("a",)}
    for bad, needle in ((lambda: Gathered(), "'name'"), (lambda: Gathered("a", count=1, bogus=2), "'bogus'"),
                        (lambda: Gathered("a", name="b"), "'name'"), (lambda: Gathered("a", 1, (), 4), "4 arguments")):
        with pytest.raises(TypeError, match=needle):
            bad()


def test_post_init_checks_the_values():
    with pytest.raises(ValueError, match="action 'pray' is not one of"):
        Cause("x", "fail", "what", "fix", "pray", "tenant")
    with pytest.raises(ValueError, match="status 'bad'"):
        Cause("x", "bad", "what", "fix", "retry", "tenant")


def test_the_config_takes_every_declared_setting_as_a_field_and_stays_immutable():
    from probes.config import Config
    from probes.hardware.common import Expected

    cfg = Config(gpu_count=3)
    assert cfg.of(Expected).gpu_count == 3 and cfg._replace(gpu_count=2).of(Expected).gpu_count == 2
    assert Config().host == "127.0.0.1" and cfg == Config(gpu_count=3) != Config()
    assert not hasattr(cfg, "gpu_count")  # read through of(), never as a loose attribute
    with pytest.raises(TypeError, match="'gpu_counts'"):
        Config(gpu_counts=1)
    with pytest.raises(AttributeError, match="immutable"):
        cfg.host = "::1"


def test_replace_derives_a_new_value_and_refuses_unknown_fields():
    r = Result("nvml", Status.FAIL, "GPU 0 lost", reason="gpu-lost", facts={"count": 1})
    later = r._replace(elapsed=0.25, time=12.0)
    assert (later.elapsed, later.time) == (0.25, 12.0)
    assert (r.elapsed, r.time) == (0.0, 0.0)  # the original is untouched
    assert later._replace(elapsed=0.0, time=0.0) == r
    with pytest.raises(TypeError, match="'elapsed_s'"):
        r._replace(elapsed_s=1.0)


def test_asdict_lists_the_fields_in_constructor_order_and_round_trips():
    r = passed("ssh", "sshd answered", observed=1, unit="servers", elapsed=0.01)
    d = r.to_dict()
    assert list(d) == ["name", "status", "message", "observed", "unit", "reason", "facts", "elapsed", "time",
                       "action", "actor"]
    assert json.loads(json.dumps(d)) == {**r._asdict(), "status": "pass", "facts": {}}


def test_equality_and_hash_are_by_type_and_fields():
    a, b = Cause("x", "fail", "what", "fix", "retry", "tenant"), Cause("x", "fail", "what", "fix", "retry", "tenant")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Cause("x", "warn", "what", "fix", "retry", "tenant")
    assert a != ("x", "fail", "what", "fix")  # a record is not a tuple
    assert Outcome("liveness", (passed("a", "ok"),)) == Outcome("liveness", (passed("a", "ok"),))


def test_repr_names_every_field():
    s = Setting("HEALTHCHECK_X", "x", "bool", True, "a switch")
    assert repr(s).startswith("Setting(env='HEALTHCHECK_X', field='x', kind='bool', default=True, ")
    assert repr(Status.FAIL) in repr(Result("n", Status.FAIL, "m"))


def test_a_status_is_one_of_four_whose_value_is_what_json_reads():
    assert [s.value for s in Status] == ["pass", "warn", "fail", "skip"]
    assert Status("fail") is Status.FAIL
    with pytest.raises(ValueError):
        Status("unknown")
