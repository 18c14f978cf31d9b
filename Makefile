# Every target bootstraps .venv on a fresh machine, so `make test` works on a clean clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv dev demo screenshots test check lint format typecheck pytest bench soak sim mutate clean

# `make venv`: what running moonrun needs (a user's venv); `make dev` adds the test and lint
# tools, which every target below that runs them pulls in.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[mysql]'
	@$(BIN)/python -m pip install --quiet -e '.[mysql-c]' > $(VENV)/mysqlclient-build.log 2>&1 \
		|| echo "make: skipped mysqlclient (MySQLStore's faster driver; PyMySQL serves instead):" \
		"it did not build, see $(VENV)/mysqlclient-build.log; apt-get install libmariadb-dev" \
		"pkg-config gcc, then make venv again"
	touch $(STAMP)

venv: $(STAMP)

DEV_STAMP := $(VENV)/.dev-installed

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(DEV_STAMP)

dev: $(DEV_STAMP)

# One platform and one Run on this machine, four jobs end to end (state in .moonrun-demo/).
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# The console's pictures in docs/img/, taken with Debian's Chromium (/usr/bin/chromium).
screenshots: $(DEV_STAMP)
	$(BIN)/python scripts/screenshots.py

lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

format: $(DEV_STAMP)
	$(BIN)/ruff format src tests bench scripts
	$(BIN)/ruff check --fix src tests bench scripts

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

# Two lanes: real-process tests serially, the rest on PYTEST_WORKERS xdist workers beside them
# (scripts/pytest_lanes.sh). Bytecode first: each xdist worker would otherwise compile it again.
PYTEST_WORKERS ?= 2
pytest: $(DEV_STAMP)
	$(BIN)/python -m compileall -q src tests
	bash scripts/pytest_lanes.sh $(BIN) $(PYTEST_WORKERS)

check: lint typecheck

test: check pytest

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

# Every figure is a ratio measured in one run (docs/benchmarks.md); the peer bench needs Redis
# at 127.0.0.1:6379 for Celery, PostgreSQL at 127.0.0.1:5432 (user postgres) for Procrastinate
# and the wake-up bench, and the MySQL figures a MariaDB/MySQL server. The fleet bench
# steps through FLEET_STEPS simulated Runs (quick by default; the issue's steps are
# `make bench FLEET_STEPS=500,1000,2000,5000,10000`, which needs an open-files hard limit of
# about three descriptors per Run).
FLEET_STEPS ?= 500,1000
bench: $(BENCH_STAMP)
	$(BIN)/python bench/service_bench.py
	$(BIN)/python bench/store_bench.py
	$(BIN)/python bench/loop_bench.py
	$(BIN)/python bench/http_bench.py
	$(BIN)/python bench/heartbeat_bench.py
	$(BIN)/python bench/create_bench.py
	$(BIN)/python bench/schedule_bench.py
	$(BIN)/python bench/peer_bench.py --keyed --proxied 1,2
	$(BIN)/python bench/wakeup_bench.py
	$(BIN)/python bench/scale_bench.py
	$(BIN)/python bench/retention_bench.py
	$(BIN)/python bench/fleet_bench.py --steps $(FLEET_STEPS)
	$(BIN)/python bench/fleet_scheduling_bench.py

# Longer runs of the property, crash (KILLS: the store's, the serving platform's and the firing
# schedules') and race tests, of the simulation, and of one Run through RUN_ATTEMPTS attempts
# (it must stay the same size), e.g.
# `make soak EXAMPLES=5000 STEPS=100 KILLS=2000 RACE_JOBS=20000 FUZZ=2000 SIM_SEEDS=20000`.
EXAMPLES ?= 2000
FUZZ ?= 1000
STEPS ?= 80
KILLS ?= 500
RACE_JOBS ?= 10000
SIM_SEEDS ?= 10000
RUN_ATTEMPTS ?= 100000
soak: $(DEV_STAMP)
	MOONRUN_STATEFUL_EXAMPLES=$(EXAMPLES) MOONRUN_STATEFUL_STEPS=$(STEPS) \
	MOONRUN_CRASH_KILLS=$(KILLS) MOONRUN_RACE_JOBS=$(RACE_JOBS) MOONRUN_FUZZ_EXAMPLES=$(FUZZ) \
	MOONRUN_SIM_SEEDS=$(SIM_SEEDS) MOONRUN_RUN_ATTEMPTS=$(RUN_ATTEMPTS) \
		$(BIN)/pytest -p no:cacheprovider -x tests/unit/service/test_stateful.py tests/process/test_crash_and_race.py \
		tests/unit/http/test_fuzz_hostile.py tests/sim/test_simulation.py \
		tests/unit/run/test_run_holds_nothing_per_attempt.py \
		tests/process/test_platform_process.py::test_sigkill_while_serving_loses_no_acknowledged_job \
		tests/process/test_schedules_crash.py tests/process/test_schedules_serve_crash.py

# The whole-system simulation alone (docs/simulation.md): the seeds `make test` runs (or
# MOONRUN_SIM_SEEDS of them), the checker's own tests, and how fast it goes.
sim: $(DEV_STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/sim
	$(BIN)/python -m tests.sim.bench --seeds 100

MUTATE_STAMP := $(VENV)/.mutate-installed

$(MUTATE_STAMP): $(DEV_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,mutate]'
	touch $(MUTATE_STAMP)

# Mutation testing (docs/testing.md), not part of `make test`: mutmut mutates the areas below
# (scheduling/, security/signing.py, the service's fencing paths, and the store's, Run's and
# the edge's hot paths) and runs the fast in-process tests that reach each mutant's function,
# niced (it is CPU heavy, about 6,000 mutants: see docs/testing.md for how long; later runs
# test only the functions that changed). Then the score per area, and exit 1 when an area
# scores below 90%. `make mutate MUTANTS='moonrun.run.journal.*'` runs one area, or fewer.
SERVICE := moonrun.service.scheduling.xǁSchedulingServiceǁ
FENCING := check_transfer claim_now _session_and_endpoint _caller _apply_passed_deadlines _apply \
	_apply_many _apply_deadline \
	sweep reconcile
SQL_PATHS := claim_jobs update_jobs replace_job _cas
SERVICE_WAITING := wait_for_claim _due_s wait_for_job
SERVICE_BATCHES := ack_many result_many _check_batch _check_messages
MUTANTS ?= 'moonrun.scheduling.*' 'moonrun.security.signing.*' \
	$(foreach f,$(FENCING),'$(SERVICE)$(f)__mutmut_*') \
	'moonrun.service.scheduling.x__deadline_decision__mutmut_*' \
	'moonrun.store.group_commit.*' 'moonrun.store.file.*' \
	$(foreach f,$(SQL_PATHS),'moonrun.store.sql.xǁSqlStoreǁ$(f)__mutmut_*') \
	'moonrun.store.sql.x__claim_order__mutmut_*' \
	'moonrun.run.journal.*' \
	'moonrun.service.waiting.*' $(foreach f,$(SERVICE_WAITING),'$(SERVICE)$(f)__mutmut_*') \
	$(foreach f,ack_batch result_batch _refusal,'moonrun.http.run_api.x_$(f)__mutmut_*') \
	$(foreach f,$(SERVICE_BATCHES),'$(SERVICE)$(f)__mutmut_*') \
	'moonrun.logs.*' 'moonrun.artifacts.*' 'moonrun.run.confinement.*' 'moonrun.http.edge.*'
mutate: $(MUTATE_STAMP)
	MOONRUN_TEST_STORES=memory nice -n 19 $(BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(BIN)/python scripts/mutation_score.py --survivors --min 90

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis mutants
