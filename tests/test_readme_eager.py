"""The README's eager-mode example runs as written and says what the README says it logs."""
import logging
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_eager_example_runs(caplog, capsys):
    text = README.read_text()
    block = text[text.index("## Eager mode"):].split("```python\n", 1)[1].split("```", 1)[0]
    with caplog.at_level(logging.INFO, logger="torchquant"):
        exec(compile(block, str(README), "exec"), {})
    assert "quantized 3 of 3 modules" in caplog.text
    assert "ConvReLU2d" in capsys.readouterr().out
