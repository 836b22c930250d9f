# `make demo` and `make test` each build .venv on first use: torch first, pinned by
# constraints.txt; then, at the same time, the native kernels under torchquant/kernels/native
# (built in place against that torch, two compiles at a time through the ninja that the first
# install puts in .venv/bin) and this package (editable) with its extras.  pip does not
# byte-compile what it installs (--no-compile): Python compiles the modules that are imported
# (about a third of them), and demo and test cache them even where the environment says not to
# (PYTHONDONTWRITEBYTECODE).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchquant-installed
PIP := $(PY) -m pip install -q --no-compile -c constraints.txt

.PHONY: demo test bench clean

$(STAMP): pyproject.toml setup.py constraints.txt $(wildcard torchquant/kernels/native/csrc/*.cpp torchquant/kernels/native/csrc/*.h torchquant/kernels/native/csrc/onednn/*.cpp torchquant/kernels/native/csrc/onednn/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0 onednn-cpu-gomp 'setuptools>=64' wheel ninja
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) setup.py -q build_ext --inplace \
	    > $(VENV)/native-build.log 2>&1 & build=$$!; \
	TORCHQUANT_BUILD_NATIVE=0 $(PIP) --no-build-isolation -e '.[test,models,onnx]'; installed=$$?; \
	wait $$build || { tail -40 $(VENV)/native-build.log; exit 1; }; test $$installed = 0
	touch $(STAMP)

demo: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PY) tools/demo.py

# Two pytest workers with two OpenMP threads each on a 2-core machine: passive waiting keeps
# an idle worker's threads from spinning on the cores the other needs (BENCHMARKS.md,
# 2026-12-05 fourth session).  Bytecode cached: the suite starts dozens of fresh interpreters.
# Work stealing: the package / AOT compiles (10-25 s each) come last in collection order, and
# handed out in advance they left one worker idle for over a minute at the end.
test: $(STAMP)
	OMP_WAIT_POLICY=passive PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 2 --dist worksteal

BENCH_STAMP := $(VENV)/.torchquant-bench-installed

$(BENCH_STAMP): $(STAMP)
	TORCHQUANT_BUILD_NATIVE=0 $(PIP) --no-build-isolation -e '.[test,models,onnx,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	for b in tensor observers fake_quantize kernels dynamic models peers rnn first_use onnx; do $(PY) bench/bench_$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info torchquant/kernels/native/_C*.so torchquant/kernels/native/_onednn*.so
