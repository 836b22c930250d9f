"""Amortised builds of cpu_compiled's kernels (issue #15): a signature is built only once its
eager runs have cost what a build is expected to cost, never for a one-off shape.  The eager
times are fed by hand (no wall-clock assertions) and the build is a stub where the rule is
tested; one test builds a real kernel and checks it against the eager formula."""
import pytest
import torch

from torchquant import affine
from torchquant import kernels
from torchquant.kernels import cpu_compiled


@pytest.fixture
def amortised(monkeypatch):
    """Fresh bookkeeping, the default (amortised) rule, and builds that cost nothing."""
    monkeypatch.delenv("TORCHQUANT_COMPILED_HOT_CALLS", raising=False)
    for name, value in (("_kernels", {}), ("_calls", {}), ("_first_seen_in", {}),
                        ("_eager_s", {}), ("_build_s", []), ("_broken", set()),
                        ("_model_calls", 0), ("HOT_CALLS", cpu_compiled._DEFAULT_HOT_CALLS),
                        ("BUILD_ESTIMATE_S", 1.0), ("FIRST_BUILD_ESTIMATE_S", 1.0)):
        monkeypatch.setattr(cpu_compiled, name, value)
    built = []

    def fake_build(source, args):
        built.append(args)
        return lambda inputs: (source(*args),)
    monkeypatch.setattr(cpu_compiled, "_build", fake_build)
    return built


def _formula(x):
    return x + 1


def test_builds_once_the_eager_runs_paid_for_it(amortised):
    x = torch.zeros(8)
    got = []
    for call in range(1, 7):
        kernel = cpu_compiled.hot_kernel("plus_one", _formula, (x,), amortise=True)
        got.append(kernel is not None)
        if kernel is None:
            cpu_compiled.note_eager_seconds(0.3)  # this call ran eager for 0.3 s
    # 0.3, 0.6, 0.9 s spent after calls 1-3; call 4 sees 0.9 < 1.0; call 5 sees 1.2: built
    assert got == [False, False, False, False, True, True]
    assert len(amortised) == 1 and cpu_compiled.stats()["built"] == 1


def test_measured_builds_replace_the_estimate(amortised, monkeypatch):
    monkeypatch.setattr(cpu_compiled, "FIRST_BUILD_ESTIMATE_S", 10.0)
    assert cpu_compiled.expected_build_s() == 10.0  # the first also starts the toolchain
    cpu_compiled._build_s.append(30.0)
    assert cpu_compiled.expected_build_s() == 1.0  # the first's cost says little of the next
    cpu_compiled._build_s.extend([3.0, 5.0])
    assert cpu_compiled.expected_build_s() == 4.0
    x = torch.zeros(8)
    for _ in range(10):
        assert cpu_compiled.hot_kernel("plus_one", _formula, (x,), amortise=True) is None
        cpu_compiled.note_eager_seconds(0.3)  # 3.0 s in all: not yet 4.0
    assert amortised == []


def test_a_one_off_shape_never_builds(amortised):
    for n in range(1, 20):
        x = torch.zeros(n)
        assert cpu_compiled.hot_kernel("plus_one", _formula, (x,), amortise=True) is None
        cpu_compiled.note_eager_seconds(10.0)
    assert amortised == []


@pytest.mark.parametrize("hot_calls_env", [False, True])
def test_an_explicit_call_count_is_a_plain_count(amortised, monkeypatch, hot_calls_env):
    if hot_calls_env:
        monkeypatch.setenv("TORCHQUANT_COMPILED_HOT_CALLS", "2")
    else:
        monkeypatch.setattr(cpu_compiled, "HOT_CALLS", 1)
    x = torch.zeros(8)
    results = [cpu_compiled.hot_kernel("plus_one", _formula, (x,), amortise=True) is not None
               for _ in range(2)]
    assert results == ([False, True] if hot_calls_env else [True, True])
    # a caller's own hot_calls is a count too
    y = torch.zeros(9)
    assert cpu_compiled.hot_kernel("plus_one", _formula, (y,), hot_calls=1,
                                   amortise=True) is not None


def test_registry_ops_time_their_eager_runs_and_stay_exact(monkeypatch):
    """The registered compiled quantize counts its eager time per signature; with the estimate
    set to zero it builds a real kernel, whose integers equal the eager formula's."""
    monkeypatch.delenv("TORCHQUANT_COMPILED_HOT_CALLS", raising=False)
    for name, value in (("_kernels", {}), ("_calls", {}), ("_first_seen_in", {}),
                        ("_eager_s", {}), ("_build_s", []), ("_model_calls", 0),
                        ("HOT_CALLS", cpu_compiled._DEFAULT_HOT_CALLS)):
        monkeypatch.setattr(cpu_compiled, name, value)
    monkeypatch.setenv("TORCHQUANT_COMPILED_BUILD_ESTIMATE_S", "1")  # one estimate for all
    fn = kernels.implementations("quantize")["cpu_compiled"].fn
    x = torch.randn(40000, generator=torch.Generator().manual_seed(3)) * 3
    args = (x, torch.tensor(50.0), torch.tensor(7.0), -128, 127, torch.int8, affine.FMA)
    key = cpu_compiled._signature("quantize", args)
    monkeypatch.setattr(cpu_compiled, "BUILD_ESTIMATE_S", 1e9)
    eager = [fn(*args) for _ in range(3)]
    assert key not in cpu_compiled._kernels and cpu_compiled._eager_s[key] > 0
    monkeypatch.setattr(cpu_compiled, "BUILD_ESTIMATE_S", 0.0)
    compiled = fn(*args)
    assert key in cpu_compiled._kernels
    for out in eager:
        assert torch.equal(out, compiled)


def test_a_build_expected_to_be_slow_is_said_before_it_starts(amortised, monkeypatch, caplog):
    import logging
    monkeypatch.setattr(cpu_compiled, "FIRST_BUILD_ESTIMATE_S", 5.0)
    said = []
    monkeypatch.setattr(cpu_compiled, "emit_once",
                        lambda level, text, key: said.append((level, key, list(amortised))))
    x = torch.zeros(8)
    cpu_compiled.hot_kernel("plus_one", _formula, (x,), amortise=True)
    cpu_compiled.note_eager_seconds(6.0)
    assert cpu_compiled.hot_kernel("plus_one", _formula, (x,), amortise=True) is not None
    # the warning came before the build (nothing built yet when it was said)
    assert said == [(logging.WARNING, "build-start", [])]
