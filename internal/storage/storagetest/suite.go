package storagetest

import (
	"flag"
	"runtime/debug"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// OpenFunc opens the engine over one store, reading time from clock. Calling it again after the
// previous engine was closed reopens the same data (a restart). Each store is private to one test.
type OpenFunc func(clock storage.Clock) (storage.Engine, error)

// NewStoreFunc makes a fresh, empty store for one test case (a t.TempDir(), or a fresh PostgreSQL
// schema) and returns how to open it. It may register cleanups with t. Run calls it from parallel
// subtests, so it must be safe for concurrent use.
type NewStoreFunc func(t *testing.T) OpenFunc

// Capabilities declares what an engine can do; cases that need a missing capability are skipped.
type Capabilities struct {
	// Restart: the data survives Close and a new OpenFunc call (a durable engine). Enables the
	// Restart cases and restarts inside the Randomized case, and lets the invariant checker reopen
	// an engine a case closed.
	Restart bool
	// AsyncAppend: the engine implements storage.AsyncAppender. The case that checks it is left
	// out of the run without it.
	AsyncAppend bool
	// Ordered: the engine builds ordered subscriptions (storage.ModeOrdered). Enables the
	// Ordered cases.
	Ordered bool
	// SegmentBytes is, for an engine whose retention removes whole segments, the largest
	// segment it removes (0: it removes message by message). The size-bound cases allow a run
	// to remove up to that much more than the bound requires.
	SegmentBytes int64
	// MaxProducerIDs is the bound on the producer ids the engine remembers, all topics together,
	// that newStore opens it with (wal.Config.MaxProducerIDs, pgstore.Config.MaxProducerIDs); the
	// Dedup/bounded case fills it. Keep it small and above the few ids any other case uses (32
	// does); 0: the case is skipped.
	MaxProducerIDs int
}

// seedFlag fixes the seed of the randomized case; SPOOL_TEST_SEED does the same.
var seedFlag = flag.Int64("spool.seed", 0, "seed of the storagetest randomized case (0: random, or SPOOL_TEST_SEED)")

// testCase is one conformance case; it gets a fresh store and engine.
type testCase struct {
	name string
	// restart marks cases that need Capabilities.Restart.
	restart bool
	// async marks cases that need Capabilities.AsyncAppend.
	async bool
	// ordered marks cases that need Capabilities.Ordered.
	ordered bool
	fn      func(t *testing.T, x *env)
}

type group struct {
	name  string
	cases []testCase
}

func groups() []group {
	return []group{
		{"Topics", topicCases()},
		{"Publish", publishCases()},
		{"Dedup", dedupCases()},
		{"Subscriptions", subscriptionCases()},
		{"Lifecycle", lifecycleCases()},
		{"Backfill", backfillCases()},
		{"Bindings", bindingCases()},
		{"Claim", claimCases()},
		{"Ack", ackCases()},
		{"Nack", nackCases()},
		{"Extend", extendCases()},
		{"Expiry", expiryCases()},
		{"DLQ", dlqCases()},
		{"Poison", poisonCases()},
		{"Stats", statsCases()},
		{"Notify", notifyCases()},
		{"Retention", retentionCases()},
		{"Restart", restartCases()},
		{"Close", closeCases()},
		{"Params", paramsCases()},
		{"Concurrency", concurrencyCases()},
		{"Randomized", randomizedCases()},
		{"Ordered", orderedCases()},
		{"Batches", batchCases()},
		{"Admin", adminCases()},
		{"Refcount", refcountCases()},
	}
}

// Run runs the conformance suite against the engine that newStore opens. Every case is a subtest
// (Group/case) with its own store; all of them run in parallel. After each case the invariants
// listed in the package documentation are checked on the engine's final state.
func Run(t *testing.T, caps Capabilities, newStore NewStoreFunc) {
	t.Helper()
	s := &suite{caps: caps, newStore: newStore}
	for _, g := range groups() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.cases {
				if c.async && !caps.AsyncAppend {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					if c.restart && !caps.Restart {
						t.Skip("engine does not declare Capabilities.Restart")
					}
					if c.ordered && !caps.Ordered {
						t.Skip("engine does not declare Capabilities.Ordered")
					}
					x := s.setup(t)
					// A panic (in the engine or in the case) fails this case, not the whole binary.
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("panic: %v\n%s", r, debug.Stack())
						}
					}()
					c.fn(t, x)
				})
			}
		})
	}
}

type suite struct {
	caps     Capabilities
	newStore NewStoreFunc
}
