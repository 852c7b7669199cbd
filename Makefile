# Two commands on a fresh machine:
#   make demo   set up .venv, index the bundled data/demo collection, run sample searches
#   make test   set up .venv, run the test suite (what .ci/run calls)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.clipsearch-installed
# A model to index the demo with: a hub id or a local checkpoint directory. Empty means a tiny
# randomly initialised CLIP written to models/ (works offline; its rankings are meaningless).
DEMO_MODEL ?=
DEMO_INDEX ?= demo.idx
RANDOM_MODEL := models/tiny-random-clip

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

$(RANDOM_MODEL)/config.json: | $(STAMP)
	$(BIN)/python -m retrieval.random_model $(RANDOM_MODEL) --preset tiny --seed 0

ifeq ($(DEMO_MODEL),)
demo: $(RANDOM_MODEL)/config.json
demo: MODEL := $(RANDOM_MODEL)
else
demo: MODEL := $(DEMO_MODEL)
endif
demo: $(STAMP)
	$(BIN)/clipsearch index data/demo $(DEMO_INDEX) --model $(MODEL)
	$(BIN)/clipsearch info $(DEMO_INDEX)
	$(BIN)/clipsearch search $(DEMO_INDEX) "a banana" -k 5
	$(BIN)/clipsearch search $(DEMO_INDEX) "a black cat" -k 5 --json
	$(BIN)/clipsearch search $(DEMO_INDEX) --image data/demo/images/food/fruit/banana.png -k 5

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(DEMO_INDEX) $(RANDOM_MODEL)
