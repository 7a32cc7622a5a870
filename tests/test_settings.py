"""Every documented setting is read by the code it describes, and bad values are typed errors."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from mugraph import api, cli
from mugraph.ir.errors import InvalidInput
from mugraph.ir.settings import KNOBS, settings
from mugraph.search import SearchConfig

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("ir", "verify", "search", "codegen", "mugraph") for p in (ROOT / d).rglob("*.py")
           if p.name != "settings.py"]


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_every_knob_is_read_outside_the_settings_module(name):
    pattern = re.compile(rf"\bsettings\.{name}\b")
    readers = [p.name for p in SOURCES if pattern.search(p.read_text())]
    assert readers, f"{KNOBS[name].env} is documented but nothing reads settings.{name}"


def test_the_api_defaults_read_the_budget_and_target(monkeypatch):
    monkeypatch.setenv("MUGRAPH_SEARCH_SECONDS", "7.5")
    monkeypatch.setenv("MUGRAPH_TARGET", "A100")
    config = api.make_config(None)
    assert (config.budget_seconds, config.target) == (7.5, "a100")
    assert api.make_config(None, target="h200").target == "h200"   # an explicit target wins
    given = SearchConfig(budget_seconds=3.0, target="h100")
    assert api.make_config(given) is given                        # so does an explicit config


def _search_args(**kw):
    base = dict(budget=None, target_gpu=None, workers=1, seed=0, max_kernel_ops=3)
    return argparse.Namespace(**(base | kw))


def test_the_cli_defaults_read_the_budget_and_target(monkeypatch):
    monkeypatch.setenv("MUGRAPH_SEARCH_SECONDS", "12")
    monkeypatch.setenv("MUGRAPH_TARGET", "h200")
    config = cli._search_config(_search_args())
    assert (config.budget_seconds, config.target) == (12.0, "h200")
    config = cli._search_config(_search_args(budget=2.0, target_gpu="a100"))
    assert (config.budget_seconds, config.target) == (2.0, "a100")
    monkeypatch.delenv("MUGRAPH_SEARCH_SECONDS")
    monkeypatch.delenv("MUGRAPH_TARGET")
    assert cli._search_config(_search_args()).budget_seconds == KNOBS["search_seconds"].default


@pytest.mark.parametrize("env, value", [("MUGRAPH_TARGET", "v100"), ("MUGRAPH_SEARCH_SECONDS", "-1"),
                                        ("MUGRAPH_SEARCH_SECONDS", "soon"), ("MUGRAPH_CPU_WORKERS", "-2")])
def test_bad_values_name_the_variable(monkeypatch, env, value):
    monkeypatch.setenv(env, value)
    name = next(n for n, k in KNOBS.items() if k.env == env)
    with pytest.raises(InvalidInput, match=env):
        getattr(settings, name)


def test_the_cpu_harness_reads_its_worker_count(monkeypatch):
    from mugraph.codegen import cpu
    monkeypatch.delenv("MG_SHIM_WORKERS", raising=False)
    monkeypatch.setenv("MUGRAPH_CPU_WORKERS", "3")
    assert cpu._workers(None) == 3
    monkeypatch.setenv("MG_SHIM_WORKERS", "2")
    assert cpu._workers(None) == 2
