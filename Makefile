# Spool. `make help` lists the targets.
GO ?= go

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z/]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: run
run: ## run the broker on the embedded engine (data in ./spool-data)
	$(GO) run ./cmd/spool serve

.PHONY: test
test: ## run every test: vet, -race suite (with a throwaway PostgreSQL), short fuzz pass
	./scripts/test.sh

.PHONY: test/short
test/short: ## quick tests without race detector, PostgreSQL or fuzzing
	$(GO) test -count=1 ./...

.PHONY: fuzz
fuzz: ## fuzz every decoder for FUZZTIME each (default 60s)
	FUZZTIME=$${FUZZTIME:-60s} GOTESTFLAGS=-run=^$$ ./scripts/test.sh

.PHONY: bench
bench: ## run the Go benchmarks (results go to docs/benchmarks.md by hand)
	$(GO) test -run='^$$' -bench=. -benchtime=$${BENCHTIME:-3s} ./...

.PHONY: lint
lint: ## gofmt and go vet
	@test -z "$$(gofmt -l .)" || (gofmt -l .; exit 1)
	$(GO) vet ./...
