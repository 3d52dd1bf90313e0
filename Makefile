# ctxpipe — see README.md. Every target works on a fresh machine with Go and gcc.
GO       ?= go
PKGS     := ./...
BIN      := bin
FUZZTIME ?= 60s

.PHONY: run test test-scaleout build lint bench bench-readme fuzz load clean quality

## run: start the service on embedded defaults (NATS JetStream in process, ./data/ctxpipe.db, offline
## condenser) and, beside it, the OpenAI/Anthropic proxy on http://127.0.0.1:8788 as tenant acme's
## agent (docs/proxy.md); stopping one stops both
PROXY_NATS_USER     ?= acme-agent
PROXY_NATS_PASSWORD ?= acme-agent-demo-password
run:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/consumer ./cmd/consumer
	$(GO) build -o $(BIN)/proxy ./cmd/proxy
	@$(BIN)/consumer & svc=$$!; \
	NATS_URL=nats://127.0.0.1:4222 NATS_USER=$(PROXY_NATS_USER) NATS_PASSWORD=$(PROXY_NATS_PASSWORD) $(BIN)/proxy & prx=$$!; \
	trap 'kill $$svc $$prx 2>/dev/null' INT TERM EXIT; \
	while kill -0 $$svc 2>/dev/null && kill -0 $$prx 2>/dev/null; do sleep 1; done

## test: every test, with the race detector (fuzz targets run their seed corpus),
## then the allocation checks, which only mean something without it
test:
	$(GO) test -race -count=1 -timeout 14m $(PKGS)
	$(GO) test -count=1 -run 'Allocate' ./tokens/o200k/

## test-scaleout: the failover test (3 nodes, 3 instances, kills; also in `make test`),
## five times over, its figures printed; SCALEOUT_KEEP_DIR=dir keeps the logs and files of a run that failed,
## had an instance kill past 5 s or a node loss past 15 s; SCALEOUT_STORE_FILES=N runs the instances with N state files
test-scaleout:
	$(GO) test -race -count=5 -timeout 14m -run TestScaleOutFailover -v ./cmd/consumer/

## build: the service, the client and the proxy into ./bin
build:
	$(GO) build -o $(BIN)/consumer ./cmd/consumer
	$(GO) build -o $(BIN)/publisher ./cmd/publisher
	$(GO) build -o $(BIN)/proxy ./cmd/proxy

## lint: gofmt, go vet, staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@latest $(PKGS)

## bench: counting, decision and commit benchmarks, then the service's figures, each beside its
## anchor from the same run (figures, not pass/fail; the machine is shared, so read the ratios):
##   pipeline/raw (goal ≥ 0.20), stalled/unstalled p99 (≤ 2), 10k/10 per turn (≤ 1.2),
##   the service process's peak RSS beside --max-held-bytes and its memory limit, decode and
##   marshal beside encoding/json, the changelog replay rate (goal ≥ 50,000 changes/s),
##   and the service binary driven over TCP by the publisher: end-to-end turns/s beside the
##   publish rate (goal 20k), the agent workload beside full reads (goal 1,000/s, p99 < 10 ms),
##   the CPU per applied turn of 3 instances beside 1 (goals ≤ 1.5 with --standby 1, ≤ 1.2 with 0),
##   and the proxy (docs/proxy.md): its added latency per request (p50, p99) beside the same loops
##   sent straight to the upstream, and the 43 shared transcripts replayed through it as agent
##   loops: the share of upstream requests that extend the previous one byte for byte between
##   reductions (goal ≥ 99 %), and the tokens sent upstream against every turn's full history
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./tokens/... ./engine/ ./store/
	$(GO) test -run '^$$' -bench 'DecodeTranscripts|MarshalMessages' -benchmem -count=1 ./schema/
	$(GO) test -run '^$$' -bench 'PipelineVsRaw' -benchtime 3x -count=1 ./pipeline/
	$(GO) test -run '^$$' -bench 'StalledConversation' -benchtime 1x -count=1 ./pipeline/
	$(GO) test -run '^$$' -bench 'HistoryLength' -benchtime 300x -count=1 ./pipeline/
	$(GO) test -run '^$$' -bench 'ServiceRSS' -benchtime 1x -count=1 -timeout 20m ./cmd/consumer/
	$(GO) test -run '^$$' -bench 'Ingest' -benchtime 1x -count=3 ./cmd/consumer/
	$(GO) test -run '^$$' -bench 'EndToEnd' -benchtime 1x -count=1 ./cmd/publisher/
	$(GO) test -run '^$$' -bench 'InstancesCPU' -benchtime 1x -count=1 -timeout 20m ./cmd/publisher/
	$(GO) test -run '^$$' -bench 'Rebuild' -benchtime 3x -count=1 ./pipeline/
	$(GO) test -run '^$$' -bench 'ProxyLatency|ProxyReplay' -benchtime 1x -count=1 -timeout 10m ./proxy/

## bench-readme: make bench, then the README's performance table regenerated from its output
bench-readme:
	@{ $(MAKE) --no-print-directory bench 2>&1; echo $$? > bench.status; } | tee bench.out
	@status=$$(cat bench.status); rm -f bench.status; if [ "$$status" != 0 ]; then echo "make bench failed: the README is left as it is"; exit 1; fi
	$(GO) run ./cmd/benchreport --readme README.md < bench.out

## fuzz: run each fuzz target for FUZZTIME
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzEngine$$' -fuzztime $(FUZZTIME) ./engine/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeInput$$' -fuzztime $(FUZZTIME) ./schema/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./changelog/
	$(GO) test -run '^$$' -fuzz '^FuzzCount$$' -fuzztime $(FUZZTIME) ./tokens/o200k/
	$(GO) test -run '^$$' -fuzz '^FuzzStringifyJSON$$' -fuzztime $(FUZZTIME) ./tokens/

## load: end-to-end throughput and latency against a running service (make run in another shell)
load:
	$(GO) run ./cmd/publisher load --convs 50 --turns 200 --wait

## quality: replay the shared agent runs (../shared/data/transcripts) through the engine under a
## 32k-window profile, one row per strategy, and print what each reduction keeps (offline condenser
## unless CTXPIPE_LLM_* names an endpoint; QUALITY_FLAGS="--format markdown" for the README)
quality:
	$(GO) run ./cmd/quality $(QUALITY_FLAGS)

clean:
	rm -rf $(BIN) data
