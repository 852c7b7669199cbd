# Two commands on a fresh machine:
#   make demo   set up .venv (base dependencies only), index the bundled data/demo collection, run
#               sample searches
#   make test   set up .venv (every extra), get a Chromium for the browser tests if none is
#               installed, run the test suite (what .ci/run calls)
# and one to refresh the pinned versions both install with:
#   make lock   rewrite requirements/constraints.txt from a fresh venv (docs/development.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.clipsearch-installed
# The demo's lighter install (base dependencies, no extra); the full install touches it too.
BASE_STAMP := $(VENV)/.clipsearch-base-installed
# Every package of the full environment pinned (name==version), written by `make lock` from a fresh
# venv with requirements/seed.txt's boto3/botocore pins as the only hand-written ones. Installing
# with -c gives pip's resolver nothing to search: unpinned, it backtracked ~18 minutes through
# boto3 releases (s3fs's aiobotocore caps botocore below what the newest boto3 needs; issue 57).
CONSTRAINTS := requirements/constraints.txt
# The extras of the full install (make test, lint, docs, serve; .ci/run). peers adds nothing to them.
EXTRAS := test,server,ray,cluster,docs,heic,raw,ocr,faces,shards,onnx,openvino,video
# clip-retrieval's ClipClient and clip-front's built page, for the clip-back API tests: its own
# dependencies (torch pins, faiss, img2dataset...) are not needed for the client, so --no-deps.
# Its package __init__ imports them all (flask-restful, wandb, all_clip...), so the client module is
# loaded by its file, in the tests and in docs/server.md's example, not from clip_retrieval.
CLIP_RETRIEVAL := clip-retrieval==2.45.0
# A model to index the demo with: a hub id or a local checkpoint directory. Empty means the tiny
# CLIP trained on the demo's 627 training images, committed in data/models/demo-clip (offline).
DEMO_MODEL ?=
DEMO_INDEX ?= demo.idx
DEMO_CLIP := data/models/demo-clip
# A randomly initialised CLIP (meaningless rankings) for pipeline checks, e.g. in benchmarks/.
RANDOM_MODEL := models/tiny-random-clip

.PHONY: demo serve test lint docs install clean random-model lock

install: $(STAMP)

# The full environment. After a demo's base install it adds the extras to the same .venv.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip -c $(CONSTRAINTS)
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]' -c $(CONSTRAINTS)
	$(BIN)/pip install --quiet --no-deps '$(CLIP_RETRIEVAL)' -c $(CONSTRAINTS)
	touch $(BASE_STAMP) $(STAMP)

# What the demo needs: index and search with the committed model run on the base dependencies
# (without the openvino extra the int8 image tower runs on torch instead of OpenVINO: measured, the
# same results in the same order for every sample query, scores within 0.003).
$(BASE_STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip -c $(CONSTRAINTS)
	$(BIN)/pip install --quiet -e . -c $(CONSTRAINTS)
	touch $(BASE_STAMP)

# Rewrite $(CONSTRAINTS) (2-3 minutes, in a temporary venv; .venv is left alone), then review the
# changes it prints and commit them; the next make install or make demo installs them.
lock:
	$(PYTHON) scripts/lock.py --no-deps '$(CLIP_RETRIEVAL)'

random-model: $(RANDOM_MODEL)/config.json

$(RANDOM_MODEL)/config.json: | $(STAMP)
	$(BIN)/python -m retrieval.tools.random_model $(RANDOM_MODEL) --preset tiny --seed 0

ifeq ($(DEMO_MODEL),)
demo: MODEL := $(DEMO_CLIP)
else
demo: MODEL := $(DEMO_MODEL)
endif
# --rebuild: an index left by an earlier demo with another model is re-embedded, not refused.
# Sample queries whose answers can be checked by eye (file names say what the stamps show).
demo: $(BASE_STAMP)
	$(BIN)/clipsearch index data/demo $(DEMO_INDEX) --model $(MODEL) --rebuild
	$(BIN)/clipsearch info $(DEMO_INDEX)
	$(BIN)/clipsearch search $(DEMO_INDEX) "a banana" -k 5
	$(BIN)/clipsearch search $(DEMO_INDEX) "a black cat" -k 5
	$(BIN)/clipsearch search $(DEMO_INDEX) "a race car" -k 5
	$(BIN)/clipsearch search $(DEMO_INDEX) "an airplane" -k 5 --json
	$(BIN)/clipsearch search $(DEMO_INDEX) --image data/demo/images/food/fruit/banana.png -k 5

# Serve the demo index (built by `make demo`) at http://127.0.0.1:8000/: the web UI and the HTTP API.
serve: $(STAMP)
	$(BIN)/clipsearch serve $(DEMO_INDEX)

# scripts/ensure-chromium finds a Chromium or gets one (Debian's package, else Playwright's installer)
# and says which on stderr; with none, the browser tests fail unless CLIPSEARCH_SKIP_BROWSER=1.
# Two pytest-xdist workers, each test file on one worker (its module fixtures built once): much of
# the suite waits on subprocesses, servers and disk, so two workers on two cores halve its time.
# --no-loadscope-reorder: files start in collection order, the slowest first (tests/conftest.py's
# SLOW_FILES), not xdist's most-tests-first, which left a long file of few tests to run alone at the end.
# TEST_WORKERS=0 runs it in one process (e.g. to debug with -x -s).
TEST_WORKERS ?= 2
test: $(STAMP)
	@chromium=$$(PYTHON=$(BIN)/python scripts/ensure-chromium) && \
	  CLIPSEARCH_CHROMIUM="$$chromium" $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The manual under docs/, built by MkDocs; --strict turns a broken link, a bad anchor or a page left
# out of the navigation into a failure (.ci/run runs it).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Lint and import order (ruff), types (mypy): both configured in pyproject.toml; .ci/run runs this first.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(DEMO_INDEX) $(RANDOM_MODEL) site
