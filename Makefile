# Set-up is two commands: `make demo` and `make test`; each creates or reuses the virtualenv .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
INSTALLED := $(VENV)/.installed-$(shell cat setup.py overrides.txt | cksum | cut -d' ' -f1)
RUN := PATH=$(BIN):$$PATH OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=

.PHONY: install demo test test-newest test-gpu clean-demo

install: $(INSTALLED)

# uv installs Composer and streaming on the PyTorch of overrides.txt (their stale torch pins overridden, nothing
# else); --no-cache: the CUDA torch wheels are ~3 GB, and caching them too doubled the disk a clean install needs.
# No --compile-bytecode: compiling all 6 GB took ~30 s of a 2-core machine's install, most of it for modules no
# process imports; the targets below write the .pyc of what they import, once, even where the environment sets
# PYTHONDONTWRITEBYTECODE (as CI's does: there every import compiled its sources again, composer's in 14 s).
$(INSTALLED): setup.py overrides.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-cache-dir --upgrade pip uv
	$(BIN)/uv pip install -q --no-cache --python $(BIN)/python --override overrides.txt -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

demo: $(INSTALLED)  ## corpus -> tokenizer -> MDS -> train 2 processes, stop, autoresume (re-run: resumes)
	$(RUN) $(BIN)/python scripts/demo.py

# Two tests at a time (pytest-xdist), handed out one by one (each worker holds two), the slow ones first
# (tests/conftest.py); the 15 slowest are listed at the end, so a test that got slower shows.
SUITE := -q -n 2 --maxschedchunk 1 --durations 15 tests

test: $(INSTALLED)  ## the CPU suite (GPU tests are skipped without a GPU)
	$(RUN) $(BIN)/python -m pytest $(SUITE)

# The same suite on the newest torch/torchvision pair the registry has (overrides-newest.txt), in a venv of its own;
# CI runs both. A new release is picked up by a fresh venv (CI's, or after rm -r .venv-newest).
NEWEST := .venv-newest
NEWEST_INSTALLED := $(NEWEST)/.installed-$(shell cat setup.py overrides-newest.txt | cksum | cut -d' ' -f1)

$(NEWEST_INSTALLED): setup.py overrides-newest.txt
	$(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q --no-cache-dir --upgrade pip uv
	$(NEWEST)/bin/uv pip install -q --no-cache --python $(NEWEST)/bin/python \
	  --override overrides-newest.txt -e '.[dev]'
	rm -f $(NEWEST)/.installed-* && touch $@

test-newest: $(NEWEST_INSTALLED)  ## the CPU suite on the newest torch (prints the versions it ran)
	$(NEWEST)/bin/python -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
	PATH=$(CURDIR)/$(NEWEST)/bin:$$PATH OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE= $(NEWEST)/bin/python -m pytest $(SUITE)

# On the GPU machines, with their own torch and the carried wheels: make test-gpu TEST_PYTHON=python3
TEST_PYTHON ?= $(BIN)/python
TESTS ?= tests
test-gpu: $(if $(filter $(BIN)/python,$(TEST_PYTHON)),$(INSTALLED))  ## the tests marked gpu, on the GPUs present
	$(RUN) $(TEST_PYTHON) -m pytest -q -s -m gpu $(TESTS)

clean-demo:
	rm -rf demo_run
