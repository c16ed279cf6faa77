package broker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// waitTimeout bounds every wait of these tests; nothing here is timed, a test only fails when an
// expected event never happens.
const waitTimeout = 15 * time.Second

// env is a broker on a real wal engine in a temporary directory, with a fake clock.
type env struct {
	t      *testing.T
	dir    string
	clock  *fakeClock
	cfg    Config
	engine *wal.Engine
	b      *Broker
	// wrap, if set, makes the engine the broker uses from the real one (a spy around it).
	wrap func(storage.Engine) storage.Engine
}

// newEnv starts an engine and a broker; mod may change the broker config.
func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	return newEnvWrapped(t, nil, mod)
}

// newEnvWrapped is newEnv with the broker on wrap(the engine) when wrap is not nil.
func newEnvWrapped(t *testing.T, wrap func(storage.Engine) storage.Engine, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), clock: newFakeClock(), wrap: wrap}
	// No poll fallback: a missing wake-up must fail a test, not be covered by polling.
	e.cfg = Config{Logger: testLogger(t), RetentionInterval: -1, PollInterval: time.Hour}
	if mod != nil {
		mod(&e.cfg)
	}
	e.open()
	t.Cleanup(e.close)
	return e
}

// open opens the engine and starts a broker on it.
func (e *env) open() {
	e.t.Helper()
	eng, err := wal.Open(e.dir, wal.Config{Clock: e.clock})
	if err != nil {
		e.t.Fatalf("wal.Open: %v", err)
	}
	e.engine = eng
	cfg := e.cfg
	cfg.Engine = eng
	if e.wrap != nil {
		cfg.Engine = e.wrap(eng)
	}
	cfg.Clock = e.clock
	b, err := New(cfg)
	if err != nil {
		e.t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(context.Background()); err != nil {
		e.t.Fatalf("broker.Start: %v", err)
	}
	e.b = b
}

// close stops the broker, then closes the engine.
func (e *env) close() {
	e.t.Helper()
	if e.b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := e.b.Stop(ctx); err != nil {
			e.t.Errorf("broker.Stop: %v", err)
		}
		e.b = nil
	}
	if e.engine != nil {
		if err := e.engine.Close(); err != nil {
			e.t.Errorf("engine.Close: %v", err)
		}
		e.engine = nil
	}
}

// restart stops the broker, closes the engine, and opens both again on the same directory.
func (e *env) restart() {
	e.t.Helper()
	e.close()
	e.open()
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SPOOL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

// tWriter sends log lines to t.Log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *env) createTopic(name string, cfg storage.TopicConfig) {
	e.t.Helper()
	if _, err := e.b.CreateTopic(e.ctx(), name, cfg); err != nil {
		e.t.Fatalf("CreateTopic(%q): %v", name, err)
	}
}

func (e *env) subscribe(p SubscribeParams) *Member {
	e.t.Helper()
	m, err := e.b.Subscribe(e.ctx(), p)
	if err != nil {
		e.t.Fatalf("Subscribe(%+v): %v", p, err)
	}
	return m
}

// publishN publishes n messages with payloads "<prefix>-<i>", one publish per message.
func (e *env) publishN(topic, prefix string, n int) []storage.MessagePosition {
	e.t.Helper()
	var out []storage.MessagePosition
	for i := range n {
		pos, err := e.b.Publish(e.ctx(), topic, []storage.AppendMessage{{
			Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "%s-%d", prefix, i),
		}})
		if err != nil {
			e.t.Fatalf("Publish(%q): %v", topic, err)
		}
		out = append(out, pos...)
	}
	return out
}

// recv receives n deliveries from m.
func recv(t *testing.T, m *Member, n int) []*storage.Delivery {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	out := make([]*storage.Delivery, 0, n)
	for len(out) < n {
		select {
		case d, ok := <-m.Deliveries():
			if !ok {
				t.Fatalf("member %s: channel closed after %d of %d deliveries", m.ID(), len(out), n)
			}
			out = append(out, d)
		case <-timer.C:
			t.Fatalf("member %s: got %d of %d deliveries within %s", m.ID(), len(out), n, waitTimeout)
		}
	}
	return out
}

func ack(t *testing.T, m *Member, ds ...*storage.Delivery) {
	t.Helper()
	for _, d := range ds {
		if err := m.Ack(context.Background(), d.SubscriptionID, d.Ref()); err != nil {
			t.Fatalf("member %s: ack %s/%d:%d: %v", m.ID(), d.Topic, d.Partition, d.Offset, err)
		}
	}
}

// got is a delivery seen by a consumer goroutine.
type got struct {
	member string
	d      *storage.Delivery
}

// consumeAll runs one goroutine per member that acks every delivery, and returns what they got
// once total deliveries arrived. The goroutines end with the test.
func consumeAll(t *testing.T, total int, members ...*Member) []got {
	t.Helper()
	out := make(chan got, total+64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				case d, ok := <-m.Deliveries():
					if !ok {
						return
					}
					if err := m.Ack(context.Background(), d.SubscriptionID, d.Ref()); err != nil {
						t.Errorf("member %s: ack: %v", m.ID(), err)
					}
					out <- got{member: m.ID(), d: d}
				}
			}
		}()
	}
	defer func() {
		close(done)
		wg.Wait()
	}()
	var res []got
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for len(res) < total {
		select {
		case g := <-out:
			res = append(res, g)
		case <-timer.C:
			var states []string
			for _, m := range members {
				states = append(states, memberState(m))
			}
			t.Fatalf("got %d of %d deliveries within %s; members %v", len(res), total, waitTimeout, states)
		}
	}
	return res
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, what, f)
}

// groupStats returns the stats of group on topic.
func (e *env) groupStats(topic, group string) *storage.SubscriptionStats {
	e.t.Helper()
	info, err := e.b.Group(e.ctx(), topic, group)
	if err != nil {
		e.t.Fatalf("Group(%q, %q): %v", topic, group, err)
	}
	return info.Stats
}

// payloads returns the sorted payloads of deliveries.
func payloads(gs []got) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = string(g.d.Payload)
	}
	slices.Sort(out)
	return out
}

// expectPayloads checks that gs holds exactly the payloads "<prefix>-0".."<prefix>-(n-1)" once each.
func expectPayloads(t *testing.T, what string, gs []got, prefix string, n int) {
	t.Helper()
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	slices.Sort(want)
	if have := payloads(gs); !slices.Equal(have, want) {
		t.Fatalf("%s: payloads\n have %v\n want %v", what, have, want)
	}
}

// byMember counts deliveries per member.
func byMember(gs []got) map[string]int {
	out := make(map[string]int)
	for _, g := range gs {
		out[g.member]++
	}
	return out
}

// waitIdle waits until every dispatcher of the broker waits with no wake-up pending, so that the
// next action's own wake-up is the only one that can make it dispatch.
func (e *env) waitIdle() {
	e.t.Helper()
	eventually(e.t, "dispatchers idle", func() error {
		e.b.mu.RLock()
		defer e.b.mu.RUnlock()
		for id, s := range e.b.subs {
			if !s.idle.Load() || s.handled.Load() != s.wakes.Load() {
				return fmt.Errorf("dispatcher of subscription %d busy", id)
			}
		}
		return nil
	})
}

// memberState describes a member's accounting for failure messages.
func memberState(m *Member) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]string, 0, len(m.inflight))
	for k, d := range m.inflight {
		keys = append(keys, fmt.Sprintf("%d/%d:%d@%s", k.sub, k.partition, k.offset, d.Format(time.TimeOnly)))
	}
	slices.Sort(keys)
	return fmt.Sprintf("%s{closed %v reserved %d chan %d inflight %v minDeadline %s}", m.id, m.closed, m.reserved, len(m.ch), keys,
		m.minDeadline.Format(time.TimeOnly))
}
