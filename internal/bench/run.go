package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/storage"
)

// closeTimeout bounds the closing of the clients and the deletion of the topic after a run.
const closeTimeout = 30 * time.Second

// Run runs the benchmark cfg describes against a running broker and returns its figures. It
// creates the topic (unless Config.Topic names an existing one), connects the clients, runs,
// closes the clients and deletes a topic it created (unless Config.Keep). ctx cancels the run.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &runner{cfg: cfg, runID: newRunID()}
	defer r.cleanup()
	if cfg.PGURL != "" {
		// Before the topic exists: the first sample is the schema without it.
		r.pg = startPGMonitor(cfg.PGURL, cfg.PGSchema, cfg.PGSample)
		defer r.pg.finish(0)
	}
	if err := r.setupTopic(ctx); err != nil {
		return nil, err
	}
	res := &Result{Mode: cfg.Mode, Started: time.Now(), Conditions: conditionsOf(cfg, r.topic)}
	var err error
	if cfg.Mode == ModeE2E {
		err = r.runE2E(ctx, res)
	} else {
		err = r.runPublish(ctx, res)
	}
	if err != nil {
		return nil, err
	}
	if r.pg != nil {
		// Before the topic is deleted: the last sample still holds its messages.
		res.PG = r.pg.finish(res.Publish.Messages)
	}
	if r.adm != nil && cfg.MaxBacklogMessages > 0 {
		bp, err := r.adm.topicBackpressure(ctx, r.topic.Name)
		if err != nil {
			return nil, err
		}
		res.Backpressure = bp
	}
	if cerr := r.cleanup(); cerr != nil {
		return nil, cerr
	}
	res.Conditions.Topic = r.topic
	res.LoadGenerator = loadGeneratorMemory()
	return res, nil
}

// windowStart and windowEnd mark the measured window for the PostgreSQL statistics (if any).
func (r *runner) windowStart(at time.Time) {
	if r.pg != nil {
		r.pg.windowStart(at)
	}
}

func (r *runner) windowEnd() {
	if r.pg != nil {
		r.pg.windowEnd()
	}
}

// runner is the state of one run.
type runner struct {
	cfg   Config
	runID uint64
	topic TopicInfo
	adm   *adminAPI
	pg    *pgMonitor // nil without Config.PGURL

	// clients are every client the run dialled; closed by cleanup.
	mu      sync.Mutex
	clients []*client.Client
	cleaned bool
}

func newRunID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// setupTopic picks or creates the run's topic.
func (r *runner) setupTopic(ctx context.Context) error {
	cfg := r.cfg
	name := cfg.Topic
	if name == "" {
		name = fmt.Sprintf("bench.%016x", r.runID)
	}
	r.topic = TopicInfo{Name: name}
	if cfg.NoAdmin {
		return nil
	}
	r.adm = newAdmin(cfg.Admin, cfg.TLS, cfg.Token)
	spec := topicSpec{semantics: cfg.Semantics, partitions: cfg.Partitions,
		messageRetention: cfg.MessageRetention, maxRetention: cfg.MaxRetention,
		maxBacklogMessages: cfg.MaxBacklogMessages, backlogPolicy: cfg.BacklogPolicy, completion: cfg.Completion}
	exists, err := r.adm.createTopic(ctx, name, spec)
	if err != nil {
		return err
	}
	if exists {
		if cfg.Topic == "" {
			return fmt.Errorf("bench: fresh topic %q exists already", name)
		}
		// An existing topic is used as it is: its semantics decide how the consumers subscribe.
		sem, parts, err := r.adm.topicSemantics(ctx, name)
		if err != nil {
			return err
		}
		r.topic.Semantics, r.topic.Partitions = sem, parts
		switch {
		case cfg.MessageRetention > 0 || cfg.MaxRetention > 0 || cfg.Completion != "":
			return fmt.Errorf("bench: %w: topic %q exists: the retention and completion overrides apply to a topic the run creates",
				storage.ErrInvalidArgument, name)
		case cfg.Mode == ModeE2E && sem == SemanticsQueue && cfg.Groups != 1:
			return fmt.Errorf("bench: %w: topic %q is QUEUE: its consumers share one subscription, groups must be 1, got %d",
				storage.ErrInvalidArgument, name, cfg.Groups)
		}
		return nil
	}
	r.topic.Created, r.topic.Semantics, r.topic.Partitions = true, cfg.Semantics, cfg.Partitions
	r.topic.Completion = cfg.Completion
	if cfg.MessageRetention > 0 {
		r.topic.MessageRetention = cfg.MessageRetention.String()
	}
	if cfg.MaxRetention > 0 {
		r.topic.MaxRetention = cfg.MaxRetention.String()
	}
	return nil
}

// queue reports whether the consumers share the topic's one subscription: the topic is QUEUE
// (known from the admin API), or the run was told so (--semantics QUEUE without the admin API).
func (r *runner) queue() bool {
	if r.topic.Semantics != "" {
		return r.topic.Semantics == SemanticsQueue
	}
	return r.cfg.Semantics == SemanticsQueue
}

// dial connects one client of the run.
func (r *runner) dial(ctx context.Context, name string, opts ...client.Opt) (*client.Client, error) {
	opts = append([]client.Opt{client.ClientName(name), client.Logger(r.cfg.Logger)}, opts...)
	if r.cfg.TLS != nil {
		opts = append(opts, client.TLSConfig(r.cfg.TLS))
	}
	if r.cfg.Token != "" {
		opts = append(opts, client.Token(r.cfg.Token))
	}
	c, err := client.Dial(ctx, r.cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to %s: %w", r.cfg.Addr, err)
	}
	r.mu.Lock()
	r.clients = append(r.clients, c)
	r.mu.Unlock()
	return c, nil
}

// dialPublishers connects the publisher clients.
func (r *runner) dialPublishers(ctx context.Context) ([]*client.Client, error) {
	cs := make([]*client.Client, r.cfg.Clients)
	for i := range cs {
		c, err := r.dial(ctx, fmt.Sprintf("bench-publisher-%d", i), client.MaxAsyncInFlight(r.cfg.Window))
		if err != nil {
			return nil, err
		}
		cs[i] = c
	}
	return cs, nil
}

// cleanup closes the clients and deletes the topic the run created (once).
func (r *runner) cleanup() error {
	r.mu.Lock()
	if r.cleaned {
		r.mu.Unlock()
		return nil
	}
	r.cleaned = true
	cs := r.clients
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, c := range cs {
		wg.Go(func() {
			if err := c.Close(ctx); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		})
	}
	wg.Wait()
	if r.topic.Created && !r.cfg.Keep && r.adm != nil {
		if err := r.adm.deleteTopic(ctx, r.topic.Name); err != nil {
			errs = append(errs, err)
		} else {
			r.topic.Deleted = true
		}
	}
	return errors.Join(errs...)
}

// errorLog keeps the count and the first of a run's errors; safe for concurrent use.
type errorLog struct {
	mu    sync.Mutex
	n     int64
	first error
}

func (e *errorLog) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if e.first == nil {
		e.first = err
	}
}

func (e *errorLog) get() (int64, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first == nil {
		return e.n, ""
	}
	return e.n, e.first.Error()
}

// lockedHistogram is a Histogram shared by goroutines.
type lockedHistogram struct {
	mu sync.Mutex
	h  *Histogram
}

func newLockedHistogram() *lockedHistogram { return &lockedHistogram{h: NewHistogram()} }

func (l *lockedHistogram) record(d time.Duration) {
	l.mu.Lock()
	l.h.RecordDuration(d)
	l.mu.Unlock()
}

// snapshot returns a copy.
func (l *lockedHistogram) snapshot() *Histogram {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := NewHistogram()
	h.Merge(l.h)
	return h
}
