"""Each probe reads its settings as a typed record (``config.of(Settings)``), never as loose attributes."""

from __future__ import annotations

import pytest

from probes import config, registry
from probes.framework import deep
from probes.services.ssh import SshSettings
from probes.spec import BOOL, INTEGER, NUMBER, PORT, Declared, Setting, Spec, load

# What config.parse_setting returns for each kind; a TEXT setting's own grammar gives text too.
TYPES = {BOOL: "bool", PORT: "int", INTEGER: "int", NUMBER: "float"}
DECLARED = {s.field: s for s in registry.SETTINGS}


def settings_class(spec: Spec) -> type:
    """What a probe reads its settings through: its module's ``Settings``, else the Declared class
    whose rows its SPEC lists (nvidia-smi and nvml read the hardware layer's ``Expected``)."""
    kind = getattr(load(spec.module), "Settings", None)
    classes = [] if kind is not None else list(Declared.__subclasses__())
    while kind is None and classes:
        candidate = classes.pop()
        classes += candidate.__subclasses__()
        kind = candidate if spec.settings == candidate.SETTINGS else None
    assert kind is not None, f"{spec.name}: no settings class"
    return kind


WITH_SETTINGS = [s for s in registry.PROBES if s.settings]


def expected_type(setting: Setting) -> str:
    kind = TYPES.get(setting.kind, "str")
    return kind if setting.default is not None else f"{kind} | None"


def settings_records() -> list[type[Declared]]:
    return [*dict.fromkeys(settings_class(s) for s in WITH_SETTINGS), deep.Torch]


def fields(kind: type[Declared]) -> dict[str, str]:
    """Each field of a settings class with its annotation (its bases' too)."""
    notes = {k: v for base in reversed(kind.__mro__) for k, v in vars(base).get("__annotations__", {}).items()}
    return {row.field: notes[row.field] for row in kind.SETTINGS}


@pytest.mark.parametrize("kind", settings_records(), ids=lambda k: f"{k.__module__}.{k.__name__}")
def test_every_field_of_a_settings_record_is_a_declared_setting_of_the_type_it_is_parsed_to(kind):
    for name, note in fields(kind).items():
        assert name in DECLARED, f"{kind.__name__}.{name} is no declared setting"
        assert note == expected_type(DECLARED[name]), f"{kind.__name__}.{name}"


@pytest.mark.parametrize("spec", WITH_SETTINGS, ids=lambda s: s.name)
def test_a_probe_that_declares_its_settings_once_lists_its_settings_class(spec):
    assert spec.settings == settings_class(spec).SETTINGS


def test_the_record_carries_the_defaults_and_the_parsed_environment():
    ssh, torch = SshSettings, deep.Torch
    assert config.load({}).of(ssh).ssh_port == 22
    cfg = config.load({"HEALTHCHECK_SSH_PORT": " 2222 ", "HEALTHCHECK_TORCH_TTL": "7",
                       "HEALTHCHECK_TORCH_DEVICE": "cpu"})
    assert cfg.of(ssh).ssh_port == 2222
    got = cfg.of(torch)
    assert (got.torch_device, got.torch_ttl, got.torch_min_free_mib) == ("cpu", 7.0, 1024)
    assert cfg._replace(torch_ttl=9.5).of(torch).torch_ttl == 9.5


def test_probe_settings_are_not_loose_attributes_of_the_configuration():
    cfg = config.load({})
    for field in DECLARED:
        assert not hasattr(cfg, field), field
    assert cfg.profile == "readiness" and cfg.host == "127.0.0.1"  # the run-wide fields still are


def parsed(row: Setting, raw: str) -> object:
    try:
        return config.parse_setting(row, raw)
    except config.ConfigError as exc:
        return str(exc)


@pytest.mark.parametrize("row", registry.SETTINGS, ids=lambda s: s.env)
def test_a_run_validates_each_setting_as_its_probe_declares_it_without_importing_the_probe(row):
    """A run reads a probe's rows from probes/index.py: they accept and refuse what the module's do."""
    for raw in ("x", "0", "1", "-1", "0.5", "99999999999", "/abs/path", "rel/path", "a b", "cpu", "none", "true"):
        assert parsed(registry.setting(row.env), raw) == parsed(row, raw), raw


def test_every_setting_is_declared_alike_wherever_probes_declare_it():
    """The index and the manual keep one row per variable: a second, different declaration is a bug."""
    rows: dict[str, Setting] = {}
    for probe in registry.PROBES:
        for row in probe.settings:
            assert rows.setdefault(row.env, row) == row, f"{row.env} is declared twice, differently"
