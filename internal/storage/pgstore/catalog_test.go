package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// Catalog behaviour the conformance suite cannot see: several broker instances (Engines) sharing
// one schema.

var catalogBase = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// openEngines opens n Engines on one fresh schema, concurrently (the migrations run once).
func openEngines(t *testing.T, n int) []*Engine {
	t.Helper()
	cfg := testConfig(t, storagetest.NewFakeClock(catalogBase))
	engines := make([]*Engine, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { engines[i], errs[i] = Open(context.Background(), cfg) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open engine %d: %v", i, err)
		}
		e := engines[i]
		t.Cleanup(func() { _ = e.Close() })
	}
	return engines
}

// Engines opening the same fresh schema at once migrate it once, and a later Migrate is a no-op.
func TestCatalogConcurrentOpenMigratesOnce(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 4)
	ctx := t.Context()
	var applied, versions int
	err := es[0].pool.QueryRow(ctx, es[0].sql("SELECT count(*), count(DISTINCT version) FROM spool.schema_migrations")).Scan(&applied, &versions)
	if err != nil {
		t.Fatal(err)
	}
	if applied != LatestVersion() || versions != LatestVersion() {
		t.Fatalf("schema_migrations has %d rows (%d versions), want %d", applied, versions, LatestVersion())
	}
	if err := Migrate(ctx, es[0].pool, es[0].schema, 0); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var settings string
	if err := es[0].pool.QueryRow(ctx, es[0].sql("SELECT string_agg(key, ',' ORDER BY key) FROM spool.settings")).Scan(&settings); err != nil {
		t.Fatal(err)
	}
	if settings != "bucket_seconds,sequencer_awake_until" {
		t.Fatalf("settings after a second Migrate: %s, want bucket_seconds,sequencer_awake_until once each", settings)
	}
	// Every engine works on the schema.
	for i, e := range es {
		if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: fmt.Sprintf("t%d", i)}); err != nil {
			t.Fatalf("TopicCreate on engine %d: %v", i, err)
		}
	}
}

// Two instances creating the same topic (with a binding that subscribes it): one wins, the other
// gets ErrTopicExists, and the topic has one subscription per bound group.
func TestCatalogConcurrentTopicCreateAcrossInstances(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	ctx := t.Context()
	if _, err := es[0].BindingCreate(ctx, &storage.BindingCreateParams{Group: "g", Pattern: "race.#"}); err != nil {
		t.Fatal(err)
	}
	for round := range 10 {
		name := fmt.Sprintf("race.t%d", round)
		errs := make([]error, len(es))
		var wg sync.WaitGroup
		for i, e := range es {
			wg.Go(func() {
				_, errs[i] = e.TopicCreate(ctx, &storage.TopicCreateParams{Name: name, Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 3}})
			})
		}
		wg.Wait()
		wins := 0
		for i, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, storage.ErrTopicExists):
				t.Fatalf("%s: engine %d: %v, want nil or ErrTopicExists", name, i, err)
			}
		}
		if wins != 1 {
			t.Fatalf("%s: %d winners, want 1", name, wins)
		}
		subs, err := es[1].SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: name})
		if err != nil {
			t.Fatal(err)
		}
		if len(subs) != 1 || subs[0].Group != "g" || subs[0].Pattern != "race.#" {
			t.Fatalf("%s: subscriptions %+v, want one of group g from the binding", name, subs)
		}
	}
}

// A binding created on one instance while another creates matching topics: every topic that the
// creating instance could not list right after BindingCreate returned (the broker subscribes those
// it lists itself) has the binding's subscription.
func TestCatalogBindingVersusTopicCreate(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	ctx := t.Context()
	const topics = 40
	var listed map[string]bool
	var bindErr error
	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Go(func() {
		<-start // a quarter of the topics exist
		if _, bindErr = es[0].BindingCreate(ctx, &storage.BindingCreateParams{Group: "late", Pattern: "bind.#"}); bindErr != nil {
			return
		}
		var list []*storage.Topic
		list, bindErr = es[0].TopicList(ctx)
		listed = map[string]bool{}
		for _, tp := range list {
			listed[tp.Name] = true
		}
	})
	createErrs := make([]error, topics)
	var created sync.WaitGroup
	created.Add(topics / 4)
	for w := range 4 { // four creators, each creating every fourth topic
		wg.Go(func() {
			for i := w; i < topics; i += 4 {
				_, createErrs[i] = es[1].TopicCreate(ctx, &storage.TopicCreateParams{Name: fmt.Sprintf("bind.t%d", i), Config: storage.TopicConfig{Semantics: storage.PubSub}})
				if w == 0 {
					created.Done()
				}
			}
		})
	}
	go func() {
		created.Wait()
		close(start)
	}()
	wg.Wait()
	if bindErr != nil {
		t.Fatal(bindErr)
	}
	for i, err := range createErrs {
		if err != nil {
			t.Fatalf("TopicCreate bind.t%d: %v", i, err)
		}
	}
	subscribed := 0
	for i := range topics {
		name := fmt.Sprintf("bind.t%d", i)
		_, err := es[0].SubscriptionGetByGroup(ctx, name, "late")
		switch {
		case err == nil:
			subscribed++
		case !errors.Is(err, storage.ErrSubscriptionNotFound):
			t.Fatal(err)
		case !listed[name]:
			t.Fatalf("topic %s was not visible after BindingCreate returned, yet has no subscription of the binding", name)
		}
	}
	t.Logf("%d of %d topics subscribed by the binding, %d listed right after BindingCreate", subscribed, topics, len(listed))
}

// TopicDelete (without Force) on one instance racing SubscriptionCreate on another: either the
// subscription exists and blocks the delete, or the delete wins and the create finds no topic.
func TestCatalogTopicDeleteVersusSubscriptionCreate(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	ctx := t.Context()
	outcomes := map[string]int{}
	for round := range 15 {
		name := fmt.Sprintf("del.t%d", round)
		if _, err := es[0].TopicCreate(ctx, &storage.TopicCreateParams{Name: name, Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}}); err != nil {
			t.Fatal(err)
		}
		var delErr, subErr error
		var wg sync.WaitGroup
		wg.Go(func() { delErr = es[0].TopicDelete(ctx, &storage.TopicDeleteParams{Name: name}) })
		wg.Go(func() {
			_, subErr = es[1].SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: name, Group: "g", Start: storage.StartPosition{Kind: storage.FromBeginning}})
		})
		wg.Wait()
		switch {
		case delErr == nil && errors.Is(subErr, storage.ErrTopicNotFound):
			outcomes["delete first"]++
		case subErr == nil && errors.Is(delErr, storage.ErrTopicHasSubscriptions):
			outcomes["subscribe first"]++
			if _, err := es[1].SubscriptionGetByGroup(ctx, name, "g"); err != nil {
				t.Fatalf("%s: the subscription that blocked the delete: %v", name, err)
			}
		default:
			t.Fatalf("%s: TopicDelete: %v, SubscriptionCreate: %v: want exactly one to win", name, delErr, subErr)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// Ephemeral subscriptions belong to the instance that created them: its Close removes them, and
// those of other instances stay.
func TestCatalogEphemeralOwnedByInstance(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	ctx := t.Context()
	if _, err := es[0].TopicCreate(ctx, &storage.TopicCreateParams{Name: "eph", Config: storage.TopicConfig{Semantics: storage.PubSub}}); err != nil {
		t.Fatal(err)
	}
	a, err := es[0].SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "eph", Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("$ephemeral-%d", a.ID); a.Group != want {
		t.Fatalf("group of an ephemeral subscription created without one: %q, want %q", a.Group, want)
	}
	b, err := es[1].SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "eph", Group: "eph-b", Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := es[0].Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := es[1].SubscriptionGet(ctx, a.ID); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Fatalf("ephemeral subscription of the closed instance: %v, want ErrSubscriptionNotFound", err)
	}
	got, err := es[1].SubscriptionGet(ctx, b.ID)
	if err != nil || !got.Ephemeral {
		t.Fatalf("ephemeral subscription of the live instance: %+v, %v", got, err)
	}
}

// TestMigrateRefusesOtherMigrationOfSameVersion: a schema that applied, under a version this
// build knows, a migration of another name (another build's 0011) is refused by Migrate and by
// Open without migrating, with an error naming both, instead of silently skipping this build's.
func TestMigrateRefusesOtherMigrationOfSameVersion(t *testing.T) {
	t.Parallel()
	e := logOpen(t, testConfig(t, nil))
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, e.sql(`UPDATE spool.schema_migrations SET name = '0002_elsewhere.sql' WHERE version = 2`)); err != nil {
		t.Fatal(err)
	}
	err := Migrate(ctx, e.pool, e.schema, 0)
	if err == nil || !strings.Contains(err.Error(), `"0002_elsewhere.sql"`) {
		t.Fatalf("Migrate: %v, want the mismatch of migration 2", err)
	}
	cfg := testConfig(t, nil)
	cfg.Schema, cfg.Migrate = e.schema, false
	if e2, err := Open(ctx, cfg); err == nil {
		e2.Close()
		t.Fatal("Open without migrating accepted the mismatched migration 2")
	}
}

func TestServerVersionGuard(t *testing.T) {
	t.Parallel()
	if err := serverSupported(120017, "12.17"); !errors.Is(err, storage.ErrInvalidArgument) || !strings.Contains(err.Error(), "12.17 is too old") {
		t.Fatalf("PostgreSQL 12: %v, want INVALID_ARGUMENT naming the version", err)
	}
	if err := serverSupported(MinServerVersion, "13.0"); err != nil {
		t.Fatalf("PostgreSQL 13: %v", err)
	}
	// The server the tests run on passes the check Open and Migrate make.
	e := logOpen(t, testConfig(t, nil))
	if err := checkServer(t.Context(), e.pool); err != nil {
		t.Fatal(err)
	}
}
