import io
import warnings

import pytest
import torch

# torch 2.13 warns on every use of its quantized dtypes; here they are only the oracle.
warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def weights_only_roundtrip():
    """``state -> torch.save -> torch.load(weights_only=True)``."""
    def roundtrip(state):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)
    return roundtrip
