"""torchquant._config: one accessor per environment switch, read when called, documented in
the module's docstring."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import torchquant
from torchquant import _config

PACKAGE = Path(torchquant.__file__).parent
_NAME = re.compile(r"\bTORCHQUANT_[A-Z0-9_]+")


def test_every_switch_the_package_names_is_documented():
    """Each ``TORCHQUANT_*`` name in the package's Python sources, and each one its native
    sources read with getenv, has its line in ``_config``'s docstring."""
    named = {m for p in PACKAGE.rglob("*.py") for m in _NAME.findall(p.read_text())}
    named |= {m for p in (PACKAGE / "kernels" / "native" / "csrc").glob("*.cpp")
              for m in re.findall(r'getenv\("(TORCHQUANT_[A-Z0-9_]+)"\)', p.read_text())}
    documented = set(re.findall(r"``(TORCHQUANT_[A-Z0-9_]+)``: ", _config.__doc__))
    assert named - documented == set()
    assert "TORCHQUANT_FUSED_GATES" in named  # the native source was read


def test_defaults(monkeypatch):
    for name in (_config.QUIET, _config.KERNELS, _config.CPU_ISA, _config.NATIVE,
                 _config.ONEDNN_LIBRARY, _config.COMPILE_LOWERING, _config.ONEDNN_MIN_ROWS, _config.SMALL_M_MAX_ROWS,
                 _config.COMPILED_HOT_CALLS, _config.COMPILED_FIRST_BUILD_ESTIMATE_S,
                 _config.COMPILED_BUILD_ESTIMATE_S, _config.ONEDNN_MAX_CPU_ISA):
        monkeypatch.delenv(name, raising=False)
    assert not _config.quiet()
    assert _config.kernels_mode() == "auto"
    assert _config.cpu_isa() == "default"
    assert _config.native_enabled() and _config.compile_lowering_enabled()
    assert _config.onednn_library_enabled()
    assert (_config.onednn_min_rows(), _config.small_m_max_rows()) == (1, 16)
    assert _config.compiled_hot_calls() == _config.DEFAULT_COMPILED_HOT_CALLS == 2
    assert not _config.compiled_hot_calls_set() and not _config.compiled_build_estimate_set()
    assert _config.compiled_first_build_estimate_s() == 10.0
    assert _config.compiled_build_estimate_s() == 1.0
    assert _config.cache_key_environment() == "TORCHQUANT_CPU_ISA=;ONEDNN_MAX_CPU_ISA="


@pytest.mark.parametrize("value, quiet", [("", False), ("0", False), ("1", True),
                                          (" 0", True), ("no", True)])
def test_quiet_is_exact(monkeypatch, value, quiet):
    monkeypatch.setenv(_config.QUIET, value)
    assert _config.quiet() is quiet


def test_switches_strip_and_lower_case(monkeypatch):
    monkeypatch.setenv(_config.KERNELS, " Reference\n")
    assert _config.kernels_mode() == "reference"
    monkeypatch.setenv(_config.KERNELS, "  ")
    assert _config.kernels_mode() == "auto"
    monkeypatch.setenv(_config.KERNELS, "fast")
    with pytest.raises(ValueError, match="TORCHQUANT_KERNELS must be 'auto' or 'reference'"):
        _config.kernels_mode()
    monkeypatch.setenv(_config.CPU_ISA, " AVX2 ")
    assert _config.cpu_isa() == "avx2"
    monkeypatch.setenv(_config.CPU_ISA, "")
    assert _config.cpu_isa() == "default"
    monkeypatch.setenv(_config.CPU_ISA, "sse4")
    with pytest.raises(ValueError, match="TORCHQUANT_CPU_ISA must be one of"):
        _config.cpu_isa()
    for name, enabled in ((_config.NATIVE, _config.native_enabled),
                          (_config.ONEDNN_LIBRARY, _config.onednn_library_enabled),
                          (_config.COMPILE_LOWERING, _config.compile_lowering_enabled)):
        monkeypatch.setenv(name, " 0 ")
        assert not enabled()
        monkeypatch.setenv(name, "false")  # only 0 switches it off
        assert enabled()


def test_numbers_and_presence(monkeypatch):
    monkeypatch.setenv(_config.SMALL_M_MAX_ROWS, "8")
    monkeypatch.setenv(_config.ONEDNN_MIN_ROWS, "4")
    monkeypatch.setenv(_config.COMPILED_HOT_CALLS, "2")  # the default value, but set
    monkeypatch.setenv(_config.COMPILED_BUILD_ESTIMATE_S, "0")
    monkeypatch.setenv(_config.COMPILED_FIRST_BUILD_ESTIMATE_S, "2.5")
    assert (_config.small_m_max_rows(), _config.onednn_min_rows()) == (8, 4)
    assert _config.compiled_hot_calls() == 2 and _config.compiled_hot_calls_set()
    assert _config.compiled_build_estimate_s() == 0.0 and _config.compiled_build_estimate_set()
    assert _config.compiled_first_build_estimate_s() == 2.5
    monkeypatch.setenv(_config.CPU_ISA, " Avx2")  # the cache key holds the raw values
    monkeypatch.setenv(_config.ONEDNN_MAX_CPU_ISA, "AVX2")
    assert _config.cache_key_environment() == "TORCHQUANT_CPU_ISA= Avx2;ONEDNN_MAX_CPU_ISA=AVX2"
