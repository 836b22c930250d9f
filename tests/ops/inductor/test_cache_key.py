"""torchquant's lowerings and CPU decision are part of inductor's compile-cache key."""
import os

import torch

import torchquant  # noqa: F401  (registers the lowerings and the key)
from torchquant.ops.inductor import cache_key


def test_inductor_cache_key_holds_torchquant_uuid():
    from torch._inductor.codegen.common import custom_backend_passes
    entry = custom_backend_passes[cache_key._DEVICE]
    assert entry.uuid() == cache_key.uuid()
    # a key of inductor's table that no tensor's device matches: the pass never runs
    assert cache_key._DEVICE not in ("cpu", "cuda", "meta", "xpu", "mps")


def test_key_changes_with_the_forced_isa(monkeypatch):
    before = cache_key.uuid()
    # another value than the run's own (the suite is also run with TORCHQUANT_CPU_ISA=avx2)
    forced = "avx512" if os.environ.get("TORCHQUANT_CPU_ISA") == "avx2" else "avx2"
    monkeypatch.setenv("TORCHQUANT_CPU_ISA", forced)
    assert cache_key.uuid() != before


def test_compiled_graph_cache_misses_when_the_key_changes(monkeypatch, tmp_path):
    """A graph cached under one torchquant key is not served under another."""
    from torch._dynamo.utils import counters
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x = torch.randn(4, 8)

    def f(t):
        q = torch.ops.torchquant.quantize_per_tensor(t, 0.05, 3, "quint8")
        return torch.ops.torchquant.dequantize_per_tensor(q, 0.05, 3)

    def misses():
        torch._dynamo.reset()
        counters.clear()
        torch.compile(f, fullgraph=True)(x)
        return counters["inductor"]["fxgraph_cache_miss"]

    with torch._inductor.config.patch(fx_graph_cache=True):
        assert misses() == 1
        assert misses() == 0  # same key: served from the cache
        monkeypatch.setattr(cache_key, "uuid", lambda: "another torchquant")
        assert misses() == 1
