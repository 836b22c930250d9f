import warnings

import pytest
import torch

# torch 2.13 warns on every use of its quantized dtypes; here they are only the oracle.
warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
